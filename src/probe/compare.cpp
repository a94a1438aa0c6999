// A/B comparison of two deployments on the identical probes, against a control arm: per
// probe the first diverging greedy token, KL estimated from top-k log-probs (teacher-forced
// where every arm scored the same tokens, else over each pair's greedy prefix), log-prob per
// token and task accuracy; per metric the effect and the control's floor with bootstrap
// intervals, a sign-flip test of B's excess over the control, Holm across metrics, the
// probes a verdict would need, the verdict, and the acceptance gates judged on the metrics.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "probe/internal.h"
#include "util/util.h"

namespace kvaudit::probe {

size_t first_divergence(const ProbeRecord& left, const ProbeRecord& right) {
  const size_t shared = std::min(left.generated.size(), right.generated.size());
  for (size_t i = 0; i < shared; ++i)
    if (left.generated[i].token != right.generated[i].token) return i;
  return shared;
}

namespace {

// The coarsened distribution over `support` (+ one "rest" bucket at the end).
std::vector<double> coarsen(const std::vector<TopEntry>& listed,
                            const std::vector<std::string>& support) {
  std::map<std::string, double> probability;
  double listed_mass = 0.0, smallest = 1.0;
  for (const auto& entry : listed) {
    double p = std::exp(entry.logprob);
    if (probability.emplace(entry.token, p).second) {
      listed_mass += p;
      smallest = std::min(smallest, p);
    }
  }
  const double unlisted = std::max(0.0, 1.0 - listed_mass);
  size_t missing = 0;
  for (const auto& token : support)
    if (!probability.count(token)) ++missing;
  const double share =
      missing == 0 ? 0.0 : std::min(smallest, unlisted / static_cast<double>(missing + 1));
  std::vector<double> out;
  out.reserve(support.size() + 1);
  for (const auto& token : support) {
    auto it = probability.find(token);
    out.push_back(it != probability.end() ? it->second : share);
  }
  out.push_back(std::max(0.0, unlisted - share * static_cast<double>(missing)));
  return out;
}

// Mean KL over aligned positions [0, count).
std::optional<double> mean_kl(const std::vector<Position>& a, const std::vector<Position>& b,
                              size_t count, int64_t& used) {
  double sum = 0.0;
  used = 0;
  for (size_t i = 0; i < count && i < a.size() && i < b.size(); ++i) {
    if (a[i].top.empty() || b[i].top.empty()) continue;
    sum += kl_from_top(a[i].top, b[i].top);
    ++used;
  }
  if (used == 0) return std::nullopt;
  return sum / static_cast<double>(used);
}

bool same_tokens(const std::vector<Position>& a, const std::vector<Position>& b) {
  if (a.size() != b.size() || a.empty()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].token != b[i].token) return false;
  return true;
}

}  // namespace

double kl_from_top(const std::vector<TopEntry>& p, const std::vector<TopEntry>& q) {
  std::vector<std::string> support;
  std::set<std::string> seen;
  for (const auto* list : {&p, &q})
    for (const auto& entry : *list)
      if (seen.insert(entry.token).second) support.push_back(entry.token);
  std::vector<double> pp = coarsen(p, support), qq = coarsen(q, support);
  constexpr double kFloor = 1e-12;  // a bucket one side left empty
  double kl = 0.0;
  for (size_t i = 0; i < pp.size(); ++i)
    if (pp[i] > 0) kl += pp[i] * std::log(pp[i] / std::max(qq[i], kFloor));
  return std::max(0.0, kl);
}

namespace {

// What a probe contributes to each metric, on one arm.
struct ArmValues {
  std::optional<double> logprob;   // per scored token
  std::optional<double> accuracy;  // fraction of rounds / pass
};

ArmValues arm_values(const ProbeRecord& record) {
  ArmValues v;
  if (record.expected_logprob && record.expected_tokens > 0)
    v.logprob = *record.expected_logprob / double(record.expected_tokens);
  if (record.kind == "mrcr" || record.kind == "toolcall") {
    if (record.rounds > 0) v.accuracy = double(record.rounds_passed) / double(record.rounds);
  } else if (record.kind == "recall" || record.kind == "smoke") {
    v.accuracy = record.passed ? 1.0 : 0.0;
  }
  return v;
}

bool usable(const ProbeRecord& record) {
  return record.error.empty() || !record.generated.empty() || !record.forced.empty();
}

}  // namespace

PairKl pair_kl(const ProbeRecord& left, const ProbeRecord& right, bool forced_ok) {
  PairKl out;
  if (forced_ok) {
    out.kl = mean_kl(left.forced, right.forced, left.forced.size(), out.positions);
    if (out.kl) out.basis = "teacher-forced";
    return out;
  }
  const size_t shared = std::min(left.generated.size(), right.generated.size());
  const size_t diverge = first_divergence(left, right);
  out.kl = mean_kl(left.generated, right.generated, std::min(shared, diverge + 1), out.positions);
  if (out.kl) out.basis = "greedy prefix";
  return out;
}

namespace {

struct MetricSpec {
  const char* metric;
  const char* label;
  const char* unit;
  stats::Alternative alternative;
  double default_detectable;
  const char* gate;  // the gate metric that sizes it
};

MetricTest test_metric(const MetricSpec& spec, const std::vector<double>& effect,
                       const std::vector<double>& floor, const CompareOptions& options,
                       uint64_t seed) {
  MetricTest m;
  m.metric = spec.metric;
  m.label = spec.label;
  m.unit = spec.unit;
  m.probes = static_cast<int64_t>(effect.size());
  std::vector<double> excess(effect.size());
  for (size_t i = 0; i < effect.size(); ++i) excess[i] = effect[i] - floor[i];
  m.effect = stats::mean(effect);
  m.floor = stats::mean(floor);
  m.excess = stats::mean(excess);
  const double confidence = 1.0 - options.alpha;
  m.effect_interval = stats::bootstrap_mean_interval(effect, confidence, 4000, seed);
  m.floor_interval = stats::bootstrap_mean_interval(floor, confidence, 4000, seed + 1);
  m.excess_interval = stats::bootstrap_mean_interval(excess, confidence, 4000, seed + 2);
  m.test = stats::sign_flip_test(excess, spec.alternative, 20, 20000, seed + 3);
  m.detectable = spec.default_detectable;
  for (const Gate& gate : options.gates)
    if (gate.metric == spec.gate && gate.limit > 0) m.detectable = gate.limit;
  m.probes_needed = stats::samples_to_detect(stats::sample_sd(excess), m.detectable, options.alpha,
                                             options.power, spec.alternative);
  return m;
}

std::string format_value(const MetricTest& m, double value) {
  if (m.unit == "points") return fmt::format("{:+.1f} points", 100.0 * value);
  return fmt::format("{:.4g} {}", value, m.unit);
}

// Per metric: (effect, floor) per paired probe.
using MetricSamples = std::map<std::string, std::pair<std::vector<double>, std::vector<double>>>;

// Sums over the paired probes for the summary's means.
struct PairTotals {
  double kl_sum = 0.0;
  int64_t kl_count = 0, exact_a = 0, exact_b = 0;
  double logprob_sum_a = 0.0, logprob_sum_b = 0.0;
  int64_t logprob_tokens_a = 0, logprob_tokens_b = 0;
};

// The first greedy token where A and B part (or where one output ends, or differs in text).
void mark_divergence(const ProbeRecord& left, const ProbeRecord& right, ProbeComparison& c,
                     CompareSummary& summary) {
  const size_t shared = std::min(left.generated.size(), right.generated.size());
  const size_t diverge = first_divergence(left, right);
  if (diverge < shared || left.generated.size() != right.generated.size() ||
      left.output != right.output) {
    c.first_divergence = static_cast<int64_t>(diverge);
    c.token_a = diverge < left.generated.size() ? left.generated[diverge].token : "(end)";
    c.token_b = diverge < right.generated.size() ? right.generated[diverge].token : "(end)";
    summary.diverged++;
  }
}

// KL of A against B and against the control on the basis all arms share, into the KL sample
// when the control (if any) has one too.
void compare_kl(const ProbeRecord& left, const ProbeRecord& right, const ProbeRecord* ctrl,
                ProbeComparison& c, CompareSummary& summary, MetricSamples& samples,
                PairTotals& totals) {
  const bool forced_ok =
      same_tokens(left.forced, right.forced) && (!ctrl || same_tokens(left.forced, ctrl->forced));
  PairKl ab = pair_kl(left, right, forced_ok);
  c.kl = ab.kl;
  c.kl_positions = ab.positions;
  c.kl_basis = ab.basis;
  if (ctrl) c.kl_control = pair_kl(left, *ctrl, forced_ok).kl;
  if (c.kl) {
    totals.kl_sum += *c.kl;
    ++totals.kl_count;
    summary.max_kl = std::max(summary.max_kl.value_or(0.0), *c.kl);
    if (!ctrl || c.kl_control) {
      samples["kl"].first.push_back(*c.kl);
      samples["kl"].second.push_back(c.kl_control.value_or(0.0));
    }
  }
}

// Log-prob per token and accuracy on each arm; B's and the control's differences from A into
// the samples (without a control, A stands in for it: a floor of 0).
void compare_values(const ProbeRecord& left, const ProbeRecord& right, const ProbeRecord* ctrl,
                    ProbeComparison& c, MetricSamples& samples) {
  const ArmValues va = arm_values(left), vb = arm_values(right);
  const ArmValues vc = ctrl ? arm_values(*ctrl) : va;
  c.logprob_a = va.logprob;
  c.logprob_b = vb.logprob;
  c.logprob_control = ctrl ? vc.logprob : std::nullopt;
  c.accuracy_a = va.accuracy;
  c.accuracy_b = vb.accuracy;
  c.accuracy_control = ctrl ? vc.accuracy : std::nullopt;
  if (va.logprob && vb.logprob && vc.logprob) {
    samples["logprob"].first.push_back(*vb.logprob - *va.logprob);
    samples["logprob"].second.push_back(*vc.logprob - *va.logprob);
  }
  if (va.accuracy && vb.accuracy && vc.accuracy) {
    samples[left.kind].first.push_back(*vb.accuracy - *va.accuracy);
    samples[left.kind].second.push_back(*vc.accuracy - *va.accuracy);
  }
}

// A recall probe's exact matches and expected-text log-probs on A and B.
void count_recall(const ProbeRecord& left, const ProbeRecord& right, CompareSummary& summary,
                  PairTotals& totals) {
  summary.recall_probes++;
  totals.exact_a += left.passed;
  totals.exact_b += right.passed;
  if (left.expected_logprob) {
    totals.logprob_sum_a += *left.expected_logprob;
    totals.logprob_tokens_a += left.expected_tokens;
  }
  if (right.expected_logprob) {
    totals.logprob_sum_b += *right.expected_logprob;
    totals.logprob_tokens_b += right.expected_tokens;
  }
}

// Pairs A's probes with B's and the control's by id (probes missing or unusable on an arm are
// not compared): a comparison per pair, the metrics' samples and the totals.
void pair_probes(const std::vector<ProbeRecord>& a, const std::vector<ProbeRecord>& b,
                 const std::vector<ProbeRecord>& control, CompareSummary& summary,
                 MetricSamples& samples, PairTotals& totals) {
  std::map<std::string, const ProbeRecord*> b_by_id, c_by_id;
  for (const auto& record : b) b_by_id[record.id] = &record;
  for (const auto& record : control) c_by_id[record.id] = &record;
  for (const auto& left : a) {
    auto it = b_by_id.find(left.id);
    if (it == b_by_id.end()) continue;
    const ProbeRecord& right = *it->second;
    if (!usable(left) || !usable(right)) continue;
    const ProbeRecord* ctrl = nullptr;
    if (summary.control) {
      auto c = c_by_id.find(left.id);
      if (c == c_by_id.end() || !usable(*c->second)) continue;  // unpaired: not compared
      ctrl = c->second;
    }
    ProbeComparison c;
    c.id = left.id;
    c.kind = left.kind;
    c.passed_a = left.passed;
    c.passed_b = right.passed;
    c.passed_control = ctrl && ctrl->passed;
    mark_divergence(left, right, c, summary);
    compare_kl(left, right, ctrl, c, summary, samples, totals);
    compare_values(left, right, ctrl, c, samples);
    if (left.kind == "recall") count_recall(left, right, summary, totals);
    summary.probes.push_back(std::move(c));
  }
}

// The summary's means over the paired probes.
void add_means(const PairTotals& totals, CompareSummary& summary) {
  if (totals.kl_count > 0) summary.mean_kl = totals.kl_sum / static_cast<double>(totals.kl_count);
  if (summary.recall_probes > 0) {
    summary.recall_exact_a = double(totals.exact_a) / double(summary.recall_probes);
    summary.recall_exact_b = double(totals.exact_b) / double(summary.recall_probes);
  }
  if (totals.logprob_tokens_a > 0)
    summary.recall_logprob_a = totals.logprob_sum_a / double(totals.logprob_tokens_a);
  if (totals.logprob_tokens_b > 0)
    summary.recall_logprob_b = totals.logprob_sum_b / double(totals.logprob_tokens_b);
}

// A test per metric that has samples, in a fixed order, each with its own seed.
void run_metric_tests(const MetricSamples& samples, const CompareOptions& options,
                      CompareSummary& summary) {
  static const MetricSpec kSpecs[] = {
      {"kl", "mean KL(A || B) per position", "nats", stats::Alternative::greater, kDifferentKl,
       "kl"},
      {"logprob", "log-prob per token, B - A", "nats/token", stats::Alternative::two_sided,
       kDetectableLogprob, "logprob_drop"},
      {"recall", "recall exact match, B - A", "points", stats::Alternative::two_sided,
       kDetectableAccuracy, "recall_drop"},
      {"mrcr", "MRCR rounds right, B - A", "points", stats::Alternative::two_sided,
       kDetectableAccuracy, "mrcr_drop"},
      {"toolcall", "tool calls right, B - A", "points", stats::Alternative::two_sided,
       kDetectableAccuracy, "toolcall_drop"},
      {"smoke", "smoke checks passed, B - A", "points", stats::Alternative::two_sided,
       kDetectableAccuracy, "smoke_drop"}};
  uint64_t seed = 1;
  for (const MetricSpec& spec : kSpecs) {
    auto it = samples.find(spec.metric);
    if (it == samples.end() || it->second.first.empty()) continue;
    summary.metrics.push_back(
        test_metric(spec, it->second.first, it->second.second, options, seed));
    seed += 17;
  }
}

// One metric's verdict at options.alpha (given its Holm-adjusted p) and the sentence that
// says it, with the effect, the control's floor and the excess's interval.
void judge_metric(MetricTest& m, bool control, const CompareOptions& options) {
  const std::string interval = fmt::format("[{}, {}]", format_value(m, m.excess_interval.low),
                                           format_value(m, m.excess_interval.high));
  const std::string floor_text =
      control ? fmt::format(", control {}", format_value(m, m.floor)) : "";
  const stats::Alternative alternative =
      m.metric == "kl" ? stats::Alternative::greater : stats::Alternative::two_sided;
  // Too few paired probes: even all of them on one side could not reach alpha. (Probes whose
  // difference is 0 count: with enough of them, none differing is evidence too.)
  if (m.probes < stats::min_samples_for(options.alpha, alternative)) {
    m.verdict = "inconclusive";
    m.sentence = fmt::format(
        "{}: inconclusive: {} paired {} cannot reach p < {} (at least {} needed); effect {}{}",
        m.label, m.probes, m.probes == 1 ? "probe" : "probes", options.alpha,
        stats::min_samples_for(options.alpha, alternative), format_value(m, m.effect), floor_text);
  } else if (m.p_adjusted < options.alpha) {
    m.verdict = "different";
    m.sentence = fmt::format(
        "{}: different at p < {} (p = {:.2g}, Holm-adjusted {:.2g}): effect "
        "{}{}, excess {} {}",
        m.label, options.alpha, m.test.p_value, m.p_adjusted, format_value(m, m.effect), floor_text,
        format_value(m, m.excess), interval);
  } else {
    m.verdict = "no difference detectable";
    const int64_t more = std::max<int64_t>(0, m.probes_needed - m.probes);
    const std::string detectable = m.unit == "points"
                                       ? fmt::format("{:.1f} points", 100 * m.detectable)
                                       : fmt::format("{:.3g} {}", m.detectable, m.unit);
    m.sentence = fmt::format(
        "{}: no difference detectable at this sample size (p = {:.2g}; excess {} {}{}); {}",
        m.label, m.test.p_value, format_value(m, m.excess), interval, floor_text,
        more > 0 ? fmt::format("{} more probes would detect {}", more, detectable)
                 : fmt::format("these {} probes would have detected {} with power {:.0f}%",
                               m.probes, detectable, 100 * options.power));
  }
}

// Holm over the metrics' p-values, then each metric judged; the sentences, in metric order.
std::vector<std::string> judge_metrics(const CompareOptions& options, CompareSummary& summary) {
  std::vector<double> p_values;
  for (const auto& m : summary.metrics) p_values.push_back(m.test.p_value);
  const std::vector<double> adjusted = stats::holm_adjust(p_values);
  std::vector<std::string> parts;
  for (size_t i = 0; i < summary.metrics.size(); ++i) {
    MetricTest& m = summary.metrics[i];
    m.p_adjusted = adjusted[i];
    judge_metric(m, summary.control, options);
    parts.push_back(m.sentence);
  }
  return parts;
}

// The comparison's verdict from its metrics' (`parts`: their sentences), and why.
void set_compare_verdict(const std::vector<std::string>& parts, CompareSummary& summary) {
  bool any_different = false, any_testable = false;
  for (const auto& m : summary.metrics) {
    any_different |= m.verdict == "different";
    any_testable |= m.verdict == "different" || m.verdict == "no difference detectable";
  }
  if (summary.probes.empty()) {
    summary.verdict = "not compared";
    summary.reason = summary.control ? "no probe finished on A, B and the control"
                                     : "no probe finished on both servers";
  } else if (summary.metrics.empty()) {
    summary.verdict = "inconclusive";
    summary.reason = "no probe gave a comparable measurement (no log-probs, no task scores)";
  } else {
    summary.verdict = any_different  ? "different"
                      : any_testable ? "no difference detectable"
                                     : "inconclusive";
    summary.reason = fmt::format("{}", fmt::join(parts, "; "));
  }
  if (!summary.control && summary.verdict != "not compared")
    summary.reason += "; no control arm: the noise floor was taken as 0";
  if (!summary.mean_kl && summary.verdict != "not compared")
    summary.reason += "; no KL estimate (the servers returned no top-k log-probs)";
}

// Which side does better (summary.better "a", "b" or "" for a tie).
void pick_better(CompareSummary& summary) {
  // Which side does better: accuracy metrics first, then log-prob.
  for (const char* metric : {"recall", "mrcr", "toolcall", "logprob"})
    for (const auto& m : summary.metrics)
      if (summary.better.empty() && m.metric == metric && m.verdict == "different")
        summary.better.assign(1, m.excess > 0 ? 'b' : 'a');
  // Different (by KL, say) without a significant task or log-prob metric: the side ahead on
  // them, if one is.
  for (const char* metric : {"recall", "mrcr", "toolcall", "logprob"})
    for (const auto& m : summary.metrics)
      if (summary.better.empty() && summary.verdict == "different" && m.metric == metric &&
          m.excess != 0.0)
        summary.better.assign(1, m.excess > 0 ? 'b' : 'a');
  if (summary.better.empty() && summary.recall_probes > 0) {
    const double gap = summary.recall_exact_b - summary.recall_exact_a;
    if (gap != 0) summary.better.assign(1, gap > 0 ? 'b' : 'a');
  }
}

}  // namespace

CompareSummary compare_records(const std::vector<ProbeRecord>& a, const std::vector<ProbeRecord>& b,
                               const std::vector<ProbeRecord>& control,
                               const CompareOptions& options) {
  CompareSummary summary;
  summary.alpha = options.alpha;
  summary.control = !control.empty();
  summary.control_label = options.control_label;
  MetricSamples samples;
  PairTotals totals;
  pair_probes(a, b, control, summary, samples, totals);
  add_means(totals, summary);
  run_metric_tests(samples, options, summary);
  const std::vector<std::string> parts = judge_metrics(options, summary);
  set_compare_verdict(parts, summary);
  pick_better(summary);
  // Gates: each metric's excess over the control against its limit (drops are -excess).
  for (const Gate& gate : options.gates)
    summary.gates.push_back(evaluate_gate(gate, summary.metrics));
  return summary;
}

}  // namespace kvaudit::probe
