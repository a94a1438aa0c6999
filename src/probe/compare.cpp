// A/B comparison of two deployments on the identical probes, against a control arm: per
// probe the first diverging greedy token, KL estimated from top-k log-probs (teacher-forced
// where every arm scored the same tokens, else over each pair's greedy prefix), log-prob per
// token and task accuracy; per metric the effect and the control's floor with bootstrap
// intervals, a sign-flip test of B's excess over the control, Holm across metrics, the
// probes a verdict would need, and the acceptance gates.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>

#include "probe/probe.h"
#include "util/util.h"

namespace kvaudit::probe {

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

std::vector<Gate> parse_gates(const std::string& text) {
  static const std::map<std::string, bool> kMetrics = {
      // metric -> limit in points
      {"kl", false},       {"logprob_drop", false}, {"recall_drop", true},
      {"mrcr_drop", true}, {"toolcall_drop", true}, {"smoke_drop", true}};
  std::vector<Gate> gates;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    std::string part =
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    start = comma == std::string::npos ? text.size() + 1 : comma + 1;
    part.erase(0, part.find_first_not_of(" \t"));
    part.erase(part.find_last_not_of(" \t") + 1);
    if (part.empty()) continue;
    const size_t op = part.find("<=");
    if (op == std::string::npos)
      throw InputError("--gate", fmt::format("'{}': expected METRIC<=LIMIT, e.g. kl<=0.01 or "
                                             "mrcr_drop<=2pt",
                                             part));
    Gate gate;
    gate.text = part;
    gate.metric = part.substr(0, op);
    auto known = kMetrics.find(gate.metric);
    if (known == kMetrics.end())
      throw InputError("--gate", fmt::format("'{}': unknown metric '{}' (kl, logprob_drop, "
                                             "recall_drop, mrcr_drop, toolcall_drop, smoke_drop)",
                                             part, gate.metric));
    std::string number = part.substr(op + 2);
    bool points = false;
    for (const char* suffix : {"pt", "%"})
      if (number.size() > std::strlen(suffix) &&
          number.compare(number.size() - std::strlen(suffix), std::string::npos, suffix) == 0) {
        number.resize(number.size() - std::strlen(suffix));
        points = true;
      }
    if (points != known->second)
      throw InputError("--gate",
                       fmt::format("'{}': {} limits are {}", part, gate.metric,
                                   known->second ? "in points, e.g. 2pt" : "in nats, e.g. 0.01"));
    size_t used = 0;
    try {
      gate.limit = std::stod(number, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != number.size() || number.empty() || !std::isfinite(gate.limit) || gate.limit < 0)
      throw InputError("--gate", fmt::format("'{}': the limit must be a number >= 0", part));
    if (points) gate.limit /= 100.0;
    gates.push_back(gate);
  }
  if (gates.empty()) throw InputError("--gate", "no gate given");
  return gates;
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

// KL of one probe pair on a basis both pairs share: teacher-forced when all three arms
// scored the same tokens, else each pair's greedy prefix up to its first divergence.
struct PairKl {
  std::optional<double> kl;
  int64_t positions = 0;
  std::string basis;
};
PairKl pair_kl(const ProbeRecord& left, const ProbeRecord& right, bool forced_ok) {
  PairKl out;
  if (forced_ok) {
    out.kl = mean_kl(left.forced, right.forced, left.forced.size(), out.positions);
    if (out.kl) out.basis = "teacher-forced";
    return out;
  }
  const size_t shared = std::min(left.generated.size(), right.generated.size());
  size_t diverge = shared;
  for (size_t i = 0; i < shared; ++i)
    if (left.generated[i].token != right.generated[i].token) {
      diverge = i;
      break;
    }
  out.kl = mean_kl(left.generated, right.generated, std::min(shared, diverge + 1), out.positions);
  if (out.kl) out.basis = "greedy prefix";
  return out;
}

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

}  // namespace

CompareSummary compare_records(const std::vector<ProbeRecord>& a, const std::vector<ProbeRecord>& b,
                               const std::vector<ProbeRecord>& control,
                               const CompareOptions& options) {
  CompareSummary summary;
  summary.alpha = options.alpha;
  summary.control = !control.empty();
  summary.control_label = options.control_label;
  std::map<std::string, const ProbeRecord*> b_by_id, c_by_id;
  for (const auto& record : b) b_by_id[record.id] = &record;
  for (const auto& record : control) c_by_id[record.id] = &record;

  // Per metric: (effect, floor) per paired probe.
  std::map<std::string, std::pair<std::vector<double>, std::vector<double>>> samples;
  double kl_sum = 0.0;
  int64_t kl_count = 0, exact_a = 0, exact_b = 0;
  double logprob_sum_a = 0.0, logprob_sum_b = 0.0;
  int64_t logprob_tokens_a = 0, logprob_tokens_b = 0;
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
    const size_t shared = std::min(left.generated.size(), right.generated.size());
    size_t diverge = shared;
    for (size_t i = 0; i < shared; ++i)
      if (left.generated[i].token != right.generated[i].token) {
        diverge = i;
        break;
      }
    if (diverge < shared || left.generated.size() != right.generated.size() ||
        left.output != right.output) {
      c.first_divergence = static_cast<int64_t>(diverge);
      c.token_a = diverge < left.generated.size() ? left.generated[diverge].token : "(end)";
      c.token_b = diverge < right.generated.size() ? right.generated[diverge].token : "(end)";
      summary.diverged++;
    }
    const bool forced_ok =
        same_tokens(left.forced, right.forced) && (!ctrl || same_tokens(left.forced, ctrl->forced));
    PairKl ab = pair_kl(left, right, forced_ok);
    c.kl = ab.kl;
    c.kl_positions = ab.positions;
    c.kl_basis = ab.basis;
    if (ctrl) c.kl_control = pair_kl(left, *ctrl, forced_ok).kl;
    if (c.kl) {
      kl_sum += *c.kl;
      ++kl_count;
      summary.max_kl = std::max(summary.max_kl.value_or(0.0), *c.kl);
      if (!ctrl || c.kl_control) {
        samples["kl"].first.push_back(*c.kl);
        samples["kl"].second.push_back(c.kl_control.value_or(0.0));
      }
    }
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
    if (left.kind == "recall") {
      summary.recall_probes++;
      exact_a += left.passed;
      exact_b += right.passed;
      if (left.expected_logprob) {
        logprob_sum_a += *left.expected_logprob;
        logprob_tokens_a += left.expected_tokens;
      }
      if (right.expected_logprob) {
        logprob_sum_b += *right.expected_logprob;
        logprob_tokens_b += right.expected_tokens;
      }
    }
    summary.probes.push_back(std::move(c));
  }
  if (kl_count > 0) summary.mean_kl = kl_sum / static_cast<double>(kl_count);
  if (summary.recall_probes > 0) {
    summary.recall_exact_a = double(exact_a) / double(summary.recall_probes);
    summary.recall_exact_b = double(exact_b) / double(summary.recall_probes);
  }
  if (logprob_tokens_a > 0) summary.recall_logprob_a = logprob_sum_a / double(logprob_tokens_a);
  if (logprob_tokens_b > 0) summary.recall_logprob_b = logprob_sum_b / double(logprob_tokens_b);

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
  std::vector<double> p_values;
  for (const auto& m : summary.metrics) p_values.push_back(m.test.p_value);
  const std::vector<double> adjusted = stats::holm_adjust(p_values);
  bool any_different = false, any_testable = false;
  std::vector<std::string> parts;
  for (size_t i = 0; i < summary.metrics.size(); ++i) {
    MetricTest& m = summary.metrics[i];
    m.p_adjusted = adjusted[i];
    const std::string interval = fmt::format("[{}, {}]", format_value(m, m.excess_interval.low),
                                             format_value(m, m.excess_interval.high));
    const std::string floor_text =
        summary.control ? fmt::format(", control {}", format_value(m, m.floor)) : "";
    const stats::Alternative alternative =
        m.metric == "kl" ? stats::Alternative::greater : stats::Alternative::two_sided;
    // Too few paired probes: even all of them on one side could not reach alpha. (Probes whose
    // difference is 0 count: with enough of them, none differing is evidence too.)
    if (m.probes < stats::min_samples_for(options.alpha, alternative)) {
      m.verdict = "inconclusive";
      m.sentence = fmt::format(
          "{}: inconclusive: {} paired {} cannot reach p < {} (at least {} needed); effect {}{}",
          m.label, m.probes, m.probes == 1 ? "probe" : "probes", options.alpha,
          stats::min_samples_for(options.alpha, alternative), format_value(m, m.effect),
          floor_text);
    } else if (m.p_adjusted < options.alpha) {
      m.verdict = "different";
      any_testable = any_different = true;
      m.sentence = fmt::format(
          "{}: different at p < {} (p = {:.2g}, Holm-adjusted {:.2g}): effect "
          "{}{}, excess {} {}",
          m.label, options.alpha, m.test.p_value, m.p_adjusted, format_value(m, m.effect),
          floor_text, format_value(m, m.excess), interval);
    } else {
      m.verdict = "no difference detectable";
      any_testable = true;
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
    parts.push_back(m.sentence);
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

  // Gates: each metric's excess over the control against its limit (drops are -excess).
  for (const Gate& gate : options.gates) {
    GateResult g;
    g.gate = gate;
    const std::string metric = gate.metric == "kl" ? "kl"
                               : gate.metric == "logprob_drop"
                                   ? "logprob"
                                   : gate.metric.substr(0, gate.metric.find("_drop"));
    const MetricTest* m = nullptr;
    for (const auto& candidate : summary.metrics)
      if (candidate.metric == metric) m = &candidate;
    if (m == nullptr) {
      g.status = "failed";
      g.message = fmt::format("{}: no data (no probe measured {}); run the probes it needs",
                              gate.text, metric);
      summary.gates.push_back(g);
      continue;
    }
    const bool drop = gate.metric != "kl";
    g.value = drop ? -m->excess : m->excess;
    g.interval = drop ? stats::Interval{-m->excess_interval.high, -m->excess_interval.low}
                      : m->excess_interval;
    const bool within = *g.value <= gate.limit;
    g.status = within ? "passed" : "failed";
    g.settled = within ? g.interval.high <= gate.limit : g.interval.low > gate.limit;
    const double scale = m->unit == "points" ? 100.0 : 1.0;
    const char* unit = m->unit == "points" ? " points"
                       : m->unit == "nats" ? " nats"
                                           : " nats/token";
    g.message =
        fmt::format("{}: {:.4g}{} (interval [{:.4g}, {:.4g}]) {} the limit {:.4g}{}{}", gate.text,
                    scale * *g.value, unit, scale * g.interval.low, scale * g.interval.high,
                    within ? "within" : "exceeds", scale * gate.limit, unit,
                    g.settled ? ""
                              : fmt::format("; the interval straddles the limit: {} "
                                            "paired probes would settle it",
                                            m->probes_needed));
    summary.gates.push_back(g);
  }
  return summary;
}

}  // namespace kvaudit::probe
