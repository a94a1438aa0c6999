// The paired statistics against values computed by hand or by standard references (R's
// prop.test(correct = FALSE) / binom for Wilson, the normal table), and the tests' error rate
// under the null hypothesis over many seeds.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "stats/stats.h"

namespace kvaudit::stats {
namespace {

TEST(Stats, NormalQuantileMatchesTheTable) {
  EXPECT_NEAR(normal_quantile(0.975), 1.959964, 1e-6);
  EXPECT_NEAR(normal_quantile(0.99), 2.326348, 1e-6);
  EXPECT_NEAR(normal_quantile(0.8), 0.841621, 1e-6);
  EXPECT_NEAR(normal_quantile(0.5), 0.0, 1e-12);
}

TEST(Stats, WilsonIntervalMatchesTheTextbookValue) {
  // 8 of 10 at 95%: [0.4902, 0.9433] (Wilson 1927; R prop.test(8, 10, correct = FALSE)).
  Interval ci = wilson_interval(8, 10, 0.95);
  EXPECT_NEAR(ci.low, 0.4902, 1e-4);
  EXPECT_NEAR(ci.high, 0.9433, 1e-4);
  // All successes still leave room below 1; none gives [0, 1].
  EXPECT_LT(wilson_interval(20, 20, 0.95).low, 1.0);
  EXPECT_DOUBLE_EQ(wilson_interval(20, 20, 0.95).high, 1.0);
  EXPECT_DOUBLE_EQ(wilson_interval(0, 0, 0.95).low, 0.0);
  EXPECT_DOUBLE_EQ(wilson_interval(0, 0, 0.95).high, 1.0);
}

TEST(Stats, SignFlipEnumeratesEveryAssignment) {
  std::vector<double> d = {1, 2, 3};
  // Only all-positive reaches a sum of 6: 1 of 8; two-sided also all-negative: 2 of 8.
  EXPECT_DOUBLE_EQ(sign_flip_test(d, Alternative::greater).p_value, 1.0 / 8);
  EXPECT_DOUBLE_EQ(sign_flip_test(d, Alternative::two_sided).p_value, 2.0 / 8);
  // Zeros carry no sign: they change neither the p-value nor the attainable minimum.
  std::vector<double> with_zeros = {0, 1, 0, 2, 3};
  TestResult t = sign_flip_test(with_zeros, Alternative::greater);
  EXPECT_DOUBLE_EQ(t.p_value, 1.0 / 8);
  EXPECT_EQ(t.nonzero, 3);
  EXPECT_DOUBLE_EQ(t.min_attainable_p, 1.0 / 8);
  EXPECT_TRUE(t.exact);
  // All zeros: nothing to test.
  std::vector<double> zeros(10, 0.0);
  EXPECT_DOUBLE_EQ(sign_flip_test(zeros, Alternative::two_sided).p_value, 1.0);
}

TEST(Stats, SignFlipOnZeroOneDifferencesIsMcNemarsExactTest) {
  // 9 discordant pairs all favouring B: McNemar's exact two-sided p = 2 * 0.5^9.
  std::vector<double> d(9, 1.0);
  d.insert(d.end(), 11, 0.0);  // concordant pairs
  EXPECT_NEAR(sign_flip_test(d, Alternative::two_sided).p_value, 2.0 / 512, 1e-15);
  // 8 for B, 2 for A: binomial two-sided p = 2 * P(X <= 2 | n = 10, 1/2) = 112 / 1024.
  std::vector<double> mixed(8, 1.0);
  mixed.push_back(-1.0);
  mixed.push_back(-1.0);
  EXPECT_NEAR(sign_flip_test(mixed, Alternative::two_sided).p_value, 112.0 / 1024, 1e-15);
}

TEST(Stats, SignFlipKeepsItsErrorRateUnderTheNullOverManySeeds) {
  // Differences symmetric about 0 (the null): p < alpha in at most about alpha of runs, both
  // exactly enumerated (n = 12) and by Monte Carlo (n = 40).
  for (int n : {12, 40}) {
    std::mt19937_64 rng(7);
    std::normal_distribution<double> noise(0.0, 1.0);
    int rejections = 0;
    const int runs = 1000;
    for (int run = 0; run < runs; ++run) {
      std::vector<double> d(static_cast<size_t>(n));
      for (double& v : d) v = noise(rng);
      rejections +=
          sign_flip_test(d, Alternative::two_sided, 20, 2000, uint64_t(run)).p_value < 0.05;
    }
    // Binomial(1000, 0.05): mean 50, sd 6.9; 75 is 3.6 sd above.
    EXPECT_LE(rejections, 75) << "n = " << n;
    EXPECT_GE(rejections, 25) << "n = " << n << " (a test that never rejects detects nothing)";
  }
}

TEST(Stats, SignFlipDetectsAShiftedMean) {
  std::mt19937_64 rng(3);
  std::normal_distribution<double> noise(1.0, 1.0);  // effect 1 sd
  std::vector<double> d(30);
  for (double& v : d) v = noise(rng);
  EXPECT_LT(sign_flip_test(d, Alternative::greater).p_value, 1e-3);
}

TEST(Stats, HolmAdjustsStepDown) {
  std::vector<double> p = {0.01, 0.04, 0.03};
  std::vector<double> adjusted = holm_adjust(p);
  EXPECT_DOUBLE_EQ(adjusted[0], 0.03);
  EXPECT_DOUBLE_EQ(adjusted[1], 0.06);
  EXPECT_DOUBLE_EQ(adjusted[2], 0.06);
}

TEST(Stats, SamplesToDetectFollowsTheNormalApproximation) {
  // sd 1, effect 0.5, two-sided 0.05, power 0.8: (1.95996 + 0.84162)^2 / 0.25 = 31.4 -> 32.
  EXPECT_EQ(samples_to_detect(1.0, 0.5, 0.05, 0.8, Alternative::two_sided), 32);
  // One-sided needs fewer: (1.64485 + 0.84162)^2 / 0.25 = 24.7 -> 25.
  EXPECT_EQ(samples_to_detect(1.0, 0.5, 0.05, 0.8, Alternative::greater), 25);
  // No spread: only the test's own minimum (2^-7 < 0.01 one-sided; 2^(1-8) two-sided).
  EXPECT_EQ(samples_to_detect(0.0, 0.5, 0.01, 0.8, Alternative::greater), 7);
  EXPECT_EQ(min_samples_for(0.01, Alternative::two_sided), 8);
}

TEST(Stats, BootstrapIntervalCoversTheMeanAndShrinksWithN) {
  std::mt19937_64 rng(11);
  std::normal_distribution<double> noise(2.0, 1.0);
  std::vector<double> small(10), large(400);
  for (double& v : small) v = noise(rng);
  for (double& v : large) v = noise(rng);
  Interval a = bootstrap_mean_interval(small, 0.95), b = bootstrap_mean_interval(large, 0.95);
  EXPECT_LT(a.low, mean(small));
  EXPECT_GT(a.high, mean(small));
  EXPECT_LT(b.high - b.low, (a.high - a.low) / 3);
  // Deterministic for a seed.
  Interval again = bootstrap_mean_interval(small, 0.95);
  EXPECT_DOUBLE_EQ(a.low, again.low);
  EXPECT_NEAR(b.high - b.low, 2 * 1.96 / std::sqrt(400.0), 0.03);
}

}  // namespace
}  // namespace kvaudit::stats
