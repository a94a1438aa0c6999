// The llama.cpp statistics on hand-computed cases.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "eval/eval.h"

namespace kvaudit::eval {
namespace {

TEST(Stats, LogSoftmaxOfUniformAndShifted) {
  std::vector<float> logits = {1.0f, 1.0f, 1.0f, 1.0f}, out(4);
  log_softmax(logits, out);
  for (float v : out) EXPECT_NEAR(v, -std::log(4.0), 1e-7);
  std::vector<float> big = {1000.0f, 1000.0f + std::log(3.0f)};  // no overflow
  std::vector<float> out2(2);
  log_softmax(big, out2);
  EXPECT_NEAR(out2[0], std::log(0.25), 1e-4);  // inputs carry float rounding (ulp 6e-5)
  EXPECT_NEAR(out2[1], std::log(0.75), 1e-4);
}

TEST(Stats, LogSoftmaxOfNonFiniteLogits) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> out(3);
  std::vector<float> masked = {0.0f, -inf, 0.0f};  // a masked token: probability 0
  log_softmax(masked, out);
  EXPECT_NEAR(out[0], std::log(0.5), 1e-7);
  EXPECT_EQ(out[1], -inf);
  EXPECT_NEAR(out[2], std::log(0.5), 1e-7);
  for (float poison : {std::numeric_limits<float>::quiet_NaN(), inf}) {
    std::vector<float> poisoned = {0.0f, poison, 1.0f};  // undefined: every entry NaN
    log_softmax(poisoned, out);
    for (float v : out) EXPECT_TRUE(std::isnan(v));
  }
  std::vector<float> nothing = {-inf, -inf, -inf};
  log_softmax(nothing, out);
  for (float v : out) EXPECT_TRUE(std::isnan(v));
}

TEST(Stats, CompareLogitsByHand) {
  // base p = (0.5, 0.25, 0.25); test p = (0.25, 0.5, 0.25); correct token 1.
  std::vector<float> base = {static_cast<float>(std::log(0.5)), static_cast<float>(std::log(0.25)),
                             static_cast<float>(std::log(0.25))};
  std::vector<float> test_logits = {0.0f, static_cast<float>(std::log(2.0)), 0.0f};
  TokenComparison c = compare_logits(base, test_logits, 1, 7);
  EXPECT_EQ(c.position, 7);
  EXPECT_NEAR(c.nll_base, std::log(4.0), 1e-6);
  EXPECT_NEAR(c.nll_test, std::log(2.0), 1e-6);
  // KL = 0.5 ln(0.5/0.25) + 0.25 ln(0.25/0.5) + 0 = 0.25 ln 2
  EXPECT_NEAR(c.kld, 0.25 * std::log(2.0), 1e-6);
  EXPECT_NEAR(c.delta_p, 0.25, 1e-6);
  EXPECT_FALSE(c.same_top);
  TokenComparison same = compare_logits(base, std::vector<float>{2.0f, 1.0f, 1.0f}, 0, 0);
  EXPECT_TRUE(same.same_top);
  TokenComparison broken = compare_logits(
      base, std::vector<float>{std::numeric_limits<float>::quiet_NaN(), 0.0f, 0.0f}, 0, 0);
  EXPECT_FALSE(broken.finite);
}

TEST(Stats, PercentilesInterpolateLikeLlamaCpp) {
  std::vector<double> v = {0.0, 1.0, 2.0, 3.0, 4.0};
  EXPECT_DOUBLE_EQ(percentile_sorted(v, 0.0), 0.0);
  EXPECT_DOUBLE_EQ(percentile_sorted(v, 1.0), 4.0);
  EXPECT_DOUBLE_EQ(percentile_sorted(v, 0.5), 2.0);
  EXPECT_DOUBLE_EQ(percentile_sorted(v, 0.9), 3.6);  // 0.9 * 4 = 3.6
  EXPECT_DOUBLE_EQ(percentile_sorted(v, 0.99), 3.96);
  EXPECT_DOUBLE_EQ(percentile_sorted({}, 0.5), 0.0);
}

TEST(Stats, SummaryByHand) {
  std::vector<TokenComparison> samples;
  // Four positions: KLD 0, 0.1, 0.2, 0.3; delta p 0.1, -0.1, 0.1, -0.1; top agrees 3 of 4.
  for (int i = 0; i < 4; ++i) {
    TokenComparison c;
    c.position = i;
    c.kld = 0.1 * i;
    c.delta_p = i % 2 ? -0.1 : 0.1;
    c.nll_base = 1.0;
    c.nll_test = 1.0 + 0.1 * i;
    c.same_top = i != 3;
    samples.push_back(c);
  }
  TokenComparison nan;
  nan.finite = false;
  samples.push_back(nan);
  KldSummary s = summarize(samples);
  EXPECT_EQ(s.count, 4);
  EXPECT_EQ(s.nonfinite, 1);
  EXPECT_NEAR(s.kld_mean, 0.15, 1e-12);
  // var = mean(x^2) - mean^2 = 0.035 - 0.0225 = 0.0125; error = sqrt(0.0125 / 3)
  EXPECT_NEAR(s.kld_mean_error, std::sqrt(0.0125 / 3.0), 1e-12);
  EXPECT_NEAR(s.kld_median, 0.15, 1e-12);
  EXPECT_NEAR(s.ppl_ratio, std::exp(0.15), 1e-12);
  EXPECT_NEAR(s.ppl_base, std::exp(1.0), 1e-12);
  EXPECT_NEAR(s.delta_p_rms, 0.1, 1e-12);
  EXPECT_NEAR(s.delta_p_mean, 0.0, 1e-12);
  EXPECT_NEAR(s.same_top, 0.75, 1e-12);
  EXPECT_NEAR(s.same_top_error, std::sqrt(0.75 * 0.25 / 3.0), 1e-12);
  ASSERT_EQ(s.kld_percentiles.front().fraction, 1.0);
  EXPECT_NEAR(s.kld_percentiles.front().value, 0.3, 1e-12);
  EXPECT_NEAR(s.kld_percentiles.back().value, 0.0, 1e-12);
}

TEST(Stats, EmptySummaryIsZero) {
  KldSummary s = summarize({});
  EXPECT_EQ(s.count, 0);
  EXPECT_EQ(s.kld_mean, 0.0);
}

}  // namespace
}  // namespace kvaudit::eval
