#include "stats/stats.h"

#include <fmt/format.h>

#include <algorithm>
#include <boost/math/distributions/normal.hpp>
#include <cmath>
#include <numeric>

#include "util/util.h"

namespace kvaudit::stats {

namespace {

using Random = SplitMix64;

// Is `candidate` at least as extreme as `observed`? Sums are compared with a tolerance so
// that an assignment equal to the observed one in exact arithmetic counts as extreme
// (floating-point sums of the same terms in another order differ in the last bits).
bool as_extreme(double candidate, double observed, double scale, Alternative alternative) {
  const double tolerance = 1e-9 * scale;
  if (alternative == Alternative::greater) return candidate >= observed - tolerance;
  return std::abs(candidate) >= std::abs(observed) - tolerance;
}

}  // namespace

double mean(std::span<const double> values) {
  if (values.empty()) return 0.0;
  return std::accumulate(values.begin(), values.end(), 0.0) / double(values.size());
}

double sample_sd(std::span<const double> values) {
  if (values.size() < 2) return 0.0;
  const double m = mean(values);
  double sum = 0.0;
  for (double v : values) sum += (v - m) * (v - m);
  return std::sqrt(sum / double(values.size() - 1));
}

Interval bootstrap_mean_interval(std::span<const double> values, double confidence, int resamples,
                                 uint64_t seed) {
  if (values.empty()) return {};
  if (values.size() == 1) return {values[0], values[0]};
  Random rng{seed * 0x2545F4914F6CDD1Dull + 3};
  std::vector<double> means(static_cast<size_t>(std::max(1, resamples)));
  for (double& m : means) {
    double sum = 0.0;
    for (size_t i = 0; i < values.size(); ++i) sum += values[rng.below(values.size())];
    m = sum / double(values.size());
  }
  std::sort(means.begin(), means.end());
  const double tail = (1.0 - confidence) / 2.0;
  auto at = [&](double fraction) {
    const double index = fraction * double(means.size() - 1);
    const size_t below = static_cast<size_t>(std::floor(index));
    const size_t above = std::min(below + 1, means.size() - 1);
    return means[below] + (index - double(below)) * (means[above] - means[below]);
  };
  return {at(tail), at(1.0 - tail)};
}

Interval wilson_interval(int64_t successes, int64_t n, double confidence) {
  if (n <= 0) return {0.0, 1.0};
  const double z = normal_quantile(1.0 - (1.0 - confidence) / 2.0);
  const double p = double(successes) / double(n), nn = double(n);
  const double centre = (p + z * z / (2 * nn)) / (1 + z * z / nn);
  const double half = z / (1 + z * z / nn) * std::sqrt(p * (1 - p) / nn + z * z / (4 * nn * nn));
  return {std::max(0.0, centre - half), std::min(1.0, centre + half)};
}

TestResult sign_flip_test(std::span<const double> differences, Alternative alternative,
                          int max_exact, int resamples, uint64_t seed) {
  std::vector<double> nonzero;
  double scale = 0.0;
  for (double d : differences)
    if (d != 0.0 && std::isfinite(d)) {
      nonzero.push_back(d);
      scale += std::abs(d);
    }
  TestResult result;
  result.nonzero = static_cast<int64_t>(nonzero.size());
  const int64_t m = result.nonzero;
  result.min_attainable_p =
      m == 0 ? 1.0
             : std::min(1.0, std::ldexp(alternative == Alternative::greater ? 1.0 : 2.0,
                                        -int(std::min<int64_t>(m, 1000))));
  if (m == 0) {
    result.method = "sign-flip permutation test: every paired difference is 0";
    return result;
  }
  const double observed = std::accumulate(nonzero.begin(), nonzero.end(), 0.0);
  if (m <= max_exact) {
    // Every assignment of signs; the sum for a mask flips the chosen differences.
    const uint64_t assignments = uint64_t{1} << m;
    uint64_t extreme = 0;
    for (uint64_t mask = 0; mask < assignments; ++mask) {
      double sum = 0.0;
      for (int64_t i = 0; i < m; ++i) sum += (mask >> i) & 1 ? -nonzero[i] : nonzero[i];
      extreme += as_extreme(sum, observed, scale, alternative);
    }
    result.p_value = double(extreme) / double(assignments);
    result.exact = true;
    result.method = fmt::format("sign-flip permutation test, exact over 2^{} sign assignments", m);
    return result;
  }
  Random rng{seed * 0x9E3779B97F4A7C15ull + 11};
  int64_t extreme = 0;
  for (int r = 0; r < resamples; ++r) {
    double sum = 0.0;
    for (double d : nonzero) sum += rng.next() & 1 ? -d : d;
    extreme += as_extreme(sum, observed, scale, alternative);
  }
  result.p_value = double(extreme + 1) / double(resamples + 1);
  result.exact = false;
  result.method = fmt::format(
      "sign-flip permutation test, {} random sign assignments ((k+1)/(B+1))", resamples);
  return result;
}

std::vector<double> holm_adjust(std::span<const double> p_values) {
  const size_t n = p_values.size();
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return p_values[a] < p_values[b]; });
  std::vector<double> adjusted(n);
  double running = 0.0;
  for (size_t rank = 0; rank < n; ++rank) {
    const double value = std::min(1.0, double(n - rank) * p_values[order[rank]]);
    running = std::max(running, value);  // step-down: adjusted p-values never decrease
    adjusted[order[rank]] = running;
  }
  return adjusted;
}

double normal_quantile(double p) {
  static const boost::math::normal standard;
  return boost::math::quantile(standard, std::clamp(p, 1e-300, 1.0 - 1e-16));
}

int64_t min_samples_for(double alpha, Alternative alternative) {
  // min p = 2^-m (one-sided) or 2^(1-m) (two-sided).
  const double needed = std::log2((alternative == Alternative::greater ? 1.0 : 2.0) / alpha);
  return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(needed - 1e-12)));
}

int64_t samples_to_detect(double sd, double effect, double alpha, double power,
                          Alternative alternative) {
  const int64_t floor_n = min_samples_for(alpha, alternative);
  if (!(effect > 0.0) || !std::isfinite(sd)) return floor_n;
  if (sd <= 0.0) return floor_n;
  const double z_alpha =
      normal_quantile(1.0 - (alternative == Alternative::greater ? alpha : alpha / 2.0));
  const double z_power = normal_quantile(power);
  const double n = std::pow((z_alpha + z_power) * sd / effect, 2.0);
  if (n > 1e9) return 1'000'000'000;
  return std::max(floor_n, static_cast<int64_t>(std::ceil(n)));
}

}  // namespace kvaudit::stats
