// The llama.cpp `perplexity --kl-divergence` statistics: per-position comparison of a format's
// logits with the baseline's, and the summary (PPL ratio, KLD mean/median/percentiles,
// Delta-p, same top p) with the error estimates llama.cpp prints.
#include <algorithm>
#include <cmath>
#include <limits>

#include "eval/eval.h"

namespace kvaudit::eval {

TokenComparison compare_logits(std::span<const float> base_log_probs,
                               std::span<const float> test_logits, int32_t correct,
                               int64_t position) {
  TokenComparison c;
  c.position = position;
  std::vector<float> test(test_logits.size());
  log_softmax(test_logits, test);
  c.nll_base = -static_cast<double>(base_log_probs[correct]);
  if (!std::isfinite(test[correct])) {
    c.finite = false;
    return c;
  }
  c.nll_test = -static_cast<double>(test[correct]);
  double kld = 0.0;
  size_t base_top = 0, test_top = 0;
  for (size_t v = 0; v < test.size(); ++v) {
    const double lb = base_log_probs[v];
    kld += std::exp(lb) * (lb - static_cast<double>(test[v]));
    if (base_log_probs[v] > base_log_probs[base_top]) base_top = v;
    if (test[v] > test[test_top]) test_top = v;
  }
  c.kld = std::max(0.0, kld);  // rounding can leave a tiny negative sum for identical rows
  c.delta_p = std::exp(-c.nll_test) - std::exp(-c.nll_base);
  c.same_top = base_top == test_top;
  return c;
}

double percentile_sorted(const std::vector<double>& sorted, double fraction) {
  if (sorted.empty()) return 0.0;
  if (fraction <= 0.0) return sorted.front();
  if (fraction >= 1.0) return sorted.back();
  double p = fraction * static_cast<double>(sorted.size() - 1);
  size_t index = static_cast<size_t>(p);
  p -= static_cast<double>(index);
  return (1.0 - p) * sorted[index] + p * sorted[std::min(index + 1, sorted.size() - 1)];
}

namespace {

// Mean and the standard error of the mean, sqrt(var / (N - 1)) as llama.cpp reports it.
std::pair<double, double> mean_and_error(const std::vector<double>& values) {
  const double n = static_cast<double>(values.size());
  if (values.empty()) return {0.0, 0.0};
  double sum = 0.0, sum_squares = 0.0;
  for (double v : values) {
    sum += v;
    sum_squares += v * v;
  }
  const double mean = sum / n;
  if (values.size() < 2) return {mean, 0.0};
  const double variance = std::max(0.0, sum_squares / n - mean * mean);
  return {mean, std::sqrt(variance / (n - 1.0))};
}

}  // namespace

KldSummary summarize(const std::vector<TokenComparison>& samples) {
  KldSummary s;
  std::vector<double> kld, delta_p, delta_p_squared, log_ratio, nll_base, nll_test;
  int64_t same = 0;
  for (const TokenComparison& c : samples) {
    if (!c.finite) {
      ++s.nonfinite;
      continue;
    }
    kld.push_back(c.kld);
    delta_p.push_back(c.delta_p);
    delta_p_squared.push_back(c.delta_p * c.delta_p);
    log_ratio.push_back(c.nll_test - c.nll_base);
    nll_base.push_back(c.nll_base);
    nll_test.push_back(c.nll_test);
    if (c.same_top) ++same;
  }
  s.count = static_cast<int64_t>(kld.size());
  if (s.count == 0) return s;
  const double n = static_cast<double>(s.count);
  s.ppl_base = std::exp(mean_and_error(nll_base).first);
  s.ppl_test = std::exp(mean_and_error(nll_test).first);
  auto [mean_log_ratio, log_ratio_error] = mean_and_error(log_ratio);
  s.ppl_ratio = std::exp(mean_log_ratio);
  s.ppl_ratio_error = s.ppl_ratio * log_ratio_error;
  std::tie(s.kld_mean, s.kld_mean_error) = mean_and_error(kld);
  auto [mean_squared, squared_error] = mean_and_error(delta_p_squared);
  s.delta_p_rms = std::sqrt(mean_squared);
  // d sqrt(x) = dx / (2 sqrt(x))
  s.delta_p_rms_error = s.delta_p_rms > 0.0 ? squared_error / (2.0 * s.delta_p_rms) : 0.0;
  s.delta_p_mean = mean_and_error(delta_p).first;
  s.same_top = static_cast<double>(same) / n;
  s.same_top_error = s.count > 1 ? std::sqrt(s.same_top * (1.0 - s.same_top) / (n - 1.0)) : 0.0;

  std::sort(kld.begin(), kld.end());
  std::sort(delta_p.begin(), delta_p.end());
  s.kld_median = percentile_sorted(kld, 0.5);
  for (double f : {1.0, 0.999, 0.99, 0.95, 0.9, 0.1, 0.05, 0.01, 0.001, 0.0})
    s.kld_percentiles.push_back({f, percentile_sorted(kld, f)});
  for (double f : {1.0, 0.999, 0.99, 0.95, 0.9, 0.75, 0.5, 0.25, 0.1, 0.05, 0.01, 0.001, 0.0})
    s.delta_p_percentiles.push_back({f, percentile_sorted(delta_p, f)});
  return s;
}

}  // namespace kvaudit::eval
