// watch's drift checks on a live server: speculative acceptance over time against the
// launch's own baseline, and the round trip through the KV tiers at an interval.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "watch/watch.h"

namespace kvaudit::watch {

namespace {

// One-sided two-proportion z-test that `recent` accepts less than `baseline`. It treats each
// drafted token as independent, which overstates the evidence (a draft's tokens are accepted
// in a run); the `drop` a drift must also show keeps that from flagging small changes.
double acceptance_p_value(double base_accepted, double base_drafted, double recent_accepted,
                          double recent_drafted) {
  const double p1 = base_accepted / base_drafted, p2 = recent_accepted / recent_drafted;
  const double pooled = (base_accepted + recent_accepted) / (base_drafted + recent_drafted);
  const double se = std::sqrt(pooled * (1 - pooled) * (1 / base_drafted + 1 / recent_drafted));
  if (!(se > 0)) return p1 > p2 ? 0.0 : 1.0;
  return 0.5 * std::erfc(((p1 - p2) / se) / std::sqrt(2.0));
}

void judge_counts(const AcceptanceOptions& options, AcceptanceState& state) {
  double drafted = 0, accepted = 0;
  for (const auto& [d, a] : state.window) drafted += d, accepted += a;
  if (state.baseline_drafted > 0)
    state.rate_baseline = state.baseline_accepted / state.baseline_drafted;
  if (drafted >= options.window_drafted && state.baseline_drafted >= options.baseline_drafted) {
    state.rate_recent = accepted / drafted;
    state.p_value =
        acceptance_p_value(state.baseline_accepted, state.baseline_drafted, accepted, drafted);
  }
}

void judge_gauges(const AcceptanceOptions& options, AcceptanceState& state) {
  auto mean = [](const std::vector<double>& v) {
    return std::accumulate(v.begin(), v.end(), 0.0) / double(v.size());
  };
  if (!state.baseline_gauge.empty()) state.rate_baseline = mean(state.baseline_gauge);
  if (state.baseline_gauge.size() < options.gauge_samples ||
      state.window_gauge.size() < options.gauge_samples)
    return;
  state.rate_recent = mean(state.window_gauge);
  // Every recent interval below every baseline interval: with n samples each, (n!)^2/(2n)!
  // of orderings do that by chance (8 each: 7.8e-5).
  const bool separated =
      *std::max_element(state.window_gauge.begin(), state.window_gauge.end()) <
      *std::min_element(state.baseline_gauge.begin(), state.baseline_gauge.end());
  double p = 1.0;
  const double n = double(options.gauge_samples);
  for (double i = 1; i <= n; ++i) p *= i / (n + i);
  state.p_value = separated ? p : 1.0;
}

}  // namespace

void add_acceptance_sample(const probe::ServerCounters& counters, bool new_launch,
                           const AcceptanceOptions& options, AcceptanceState& state) {
  const int64_t drifts = state.drifts;
  if (new_launch) state = AcceptanceState{}, state.drifts = drifts;
  const bool was_drift = state.drift;
  if (counters.seen) {
    state.source = "counters";
    // A counter that went down: the server restarted under the same name. Start again.
    if (state.last_drafted >= 0 &&
        (counters.draft < state.last_drafted || counters.accepted < state.last_accepted))
      state = AcceptanceState{}, state.drifts = drifts, state.source = "counters";
    if (state.last_drafted >= 0) {
      const double drafted = counters.draft - state.last_drafted;
      const double accepted = std::min(drafted, counters.accepted - state.last_accepted);
      if (drafted > 0) {
        if (state.baseline_drafted < options.baseline_drafted) {
          state.baseline_drafted += drafted;
          state.baseline_accepted += accepted;
        } else {
          state.window.emplace_back(drafted, accepted);
          // Keep the newest intervals that still hold window_drafted tokens.
          double held = 0;
          for (const auto& w : state.window) held += w.first;
          while (state.window.size() > 1 &&
                 held - state.window.front().first >= options.window_drafted) {
            held -= state.window.front().first;
            state.window.erase(state.window.begin());
          }
        }
      }
    }
    state.last_drafted = counters.draft;
    state.last_accepted = counters.accepted;
    judge_counts(options, state);
  } else if (counters.accept_rate >= 0) {
    state.source = "gauge";
    auto& into = state.baseline_gauge.size() < options.gauge_samples ? state.baseline_gauge
                                                                     : state.window_gauge;
    into.push_back(counters.accept_rate);
    if (state.window_gauge.size() > options.gauge_samples)
      state.window_gauge.erase(state.window_gauge.begin());
    judge_gauges(options, state);
  } else {
    return;
  }
  state.drift = state.rate_baseline && state.rate_recent &&
                *state.rate_baseline - *state.rate_recent >= options.drop &&
                state.p_value <= options.alpha;
  if (state.drift && !was_drift) ++state.drifts;
  if (!state.rate_recent) {
    state.sentence =
        fmt::format("speculative acceptance: building the baseline ({})", state.source);
    return;
  }
  state.sentence = fmt::format(
      "speculative acceptance {:.1f}% now against {:.1f}% after the launch (p = {:.2g}, {}){}",
      100 * *state.rate_recent, 100 * *state.rate_baseline, state.p_value, state.source,
      state.drift ? fmt::format(": DRIFT, down {:.1f} points",
                                100 * (*state.rate_baseline - *state.rate_recent))
                  : "");
}

}  // namespace kvaudit::watch
