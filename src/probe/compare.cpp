// A/B comparison of two deployments on the identical probes: first diverging greedy
// token, KL estimated from top-k log-probs (teacher-forced where both servers echoed the
// same tokens, else over the shared greedy prefix), recall on each side, and a verdict.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "probe/probe.h"

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

CompareSummary compare_records(const std::vector<ProbeRecord>& a,
                               const std::vector<ProbeRecord>& b) {
  CompareSummary summary;
  std::map<std::string, const ProbeRecord*> by_id;
  for (const auto& record : b) by_id[record.id] = &record;
  double kl_sum = 0.0;
  int64_t kl_count = 0, exact_a = 0, exact_b = 0;
  double logprob_sum_a = 0.0, logprob_sum_b = 0.0;
  int64_t logprob_tokens_a = 0, logprob_tokens_b = 0;
  for (const auto& left : a) {
    auto it = by_id.find(left.id);
    if (it == by_id.end()) continue;
    const ProbeRecord& right = *it->second;
    if (!left.error.empty() && left.generated.empty()) continue;
    if (!right.error.empty() && right.generated.empty()) continue;
    ProbeComparison c;
    c.id = left.id;
    c.passed_a = left.passed;
    c.passed_b = right.passed;
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
    // Teacher-forced positions see the same context on both sides; greedy positions only
    // up to and including the first divergence.
    if (same_tokens(left.forced, right.forced)) {
      c.kl = mean_kl(left.forced, right.forced, left.forced.size(), c.kl_positions);
      if (c.kl) c.kl_basis = "teacher-forced";
    }
    if (!c.kl) {
      c.kl =
          mean_kl(left.generated, right.generated, std::min(shared, diverge + 1), c.kl_positions);
      if (c.kl) c.kl_basis = "greedy prefix";
    }
    if (c.kl) {
      kl_sum += *c.kl;
      ++kl_count;
      summary.max_kl = std::max(summary.max_kl.value_or(0.0), *c.kl);
    }
    if (left.expected_logprob && left.expected_tokens > 0)
      c.logprob_a = *left.expected_logprob / static_cast<double>(left.expected_tokens);
    if (right.expected_logprob && right.expected_tokens > 0)
      c.logprob_b = *right.expected_logprob / static_cast<double>(right.expected_tokens);
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

  const double exact_gap = summary.recall_exact_b - summary.recall_exact_a;
  const double kl = summary.mean_kl.value_or(0.0);
  const int64_t compared = static_cast<int64_t>(summary.probes.size());
  if (compared == 0) {
    summary.verdict = "not compared";
    summary.reason = "no probe finished on both servers";
  } else if (kl >= kDifferentKl || std::abs(exact_gap) >= 0.2) {
    summary.verdict = "different";
    summary.reason = fmt::format(
        "mean KL {:.4g} nats per position (threshold {}), recall exact match {:.0f}% vs {:.0f}%, "
        "{} of {} probes diverge",
        kl, kDifferentKl, 100 * summary.recall_exact_a, 100 * summary.recall_exact_b,
        summary.diverged, compared);
  } else if (kl >= kSameKl || summary.diverged > 0 || exact_gap != 0.0) {
    summary.verdict = "measurably different";
    summary.reason = fmt::format(
        "mean KL {:.4g} nats per position (same below {}, different from {}), {} of {} probes "
        "diverge",
        kl, kSameKl, kDifferentKl, summary.diverged, compared);
  } else {
    summary.verdict = "same";
    summary.reason =
        fmt::format("no greedy output differs in {} probes and the mean KL {:.2g} is below {}",
                    compared, kl, kSameKl);
  }
  if (!summary.mean_kl && summary.verdict != "not compared")
    summary.reason += "; no KL estimate (the servers returned no top-k log-probs)";
  // Which side recalls better: exact match, then the expected text's log-prob.
  if (summary.recall_probes > 0) {
    if (exact_gap > 0)
      summary.better.assign(1, 'b');
    else if (exact_gap < 0)
      summary.better.assign(1, 'a');
    else if (summary.recall_logprob_a && summary.recall_logprob_b &&
             std::abs(*summary.recall_logprob_a - *summary.recall_logprob_b) > 1e-3)
      summary.better.assign(1, *summary.recall_logprob_a > *summary.recall_logprob_b ? 'a' : 'b');
  }
  return summary;
}

}  // namespace kvaudit::probe
