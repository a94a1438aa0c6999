// stats: the paired statistics an A/B comparison of two deployments needs to say more than
// "above a threshold": intervals for a mean (percentile bootstrap) and for a proportion
// (Wilson), an exact paired test (sign-flip permutation: for 0/1 outcomes it is McNemar's
// exact test), Holm's adjustment across metrics, and how many paired samples would detect a
// given effect. Everything is deterministic for a seed (splitmix64, not std distributions,
// whose sequences differ between standard libraries). Quantiles of the normal distribution
// come from Boost.Math. Not here: what the samples mean (probe/ and eval/ decide that).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace kvaudit::stats {

struct Interval {
  double low = 0.0, high = 0.0;
};

double mean(std::span<const double> values);  // 0 for none
// Sample standard deviation (n - 1); 0 for fewer than two values.
double sample_sd(std::span<const double> values);

// Percentile-bootstrap interval of the mean at `confidence` (e.g. 0.95) from `resamples`
// resamples. One value gives [v, v]; none gives [0, 0].
Interval bootstrap_mean_interval(std::span<const double> values, double confidence,
                                 int resamples = 4000, uint64_t seed = 1);

// Wilson score interval of a proportion successes / n ([0, 1] when n is 0).
Interval wilson_interval(int64_t successes, int64_t n, double confidence);

enum class Alternative {
  two_sided,  // the mean difference is not 0
  greater,    // the mean difference is above 0
};

struct TestResult {
  double p_value = 1.0;
  // The smallest p-value this test could give with these many non-zero differences: a test
  // that cannot reach the error rate cannot detect anything, whatever the data.
  double min_attainable_p = 1.0;
  int64_t nonzero = 0;  // differences that are not 0 (zeros carry no sign)
  bool exact = true;    // all 2^nonzero sign assignments enumerated (else Monte Carlo)
  std::string method;   // one line, for reports
};

// Paired sign-flip permutation test of the mean of `differences` (B - control per probe).
// Under the null hypothesis each difference is symmetric about 0 (the two measurements of a
// probe are exchangeable), so every assignment of signs is equally likely: the p-value is
// the share of assignments whose mean is at least as extreme as the observed one. Exact
// enumeration up to `max_exact` non-zero differences, else `resamples` random assignments
// with the (k + 1) / (B + 1) correction, which keeps the test valid.
TestResult sign_flip_test(std::span<const double> differences, Alternative alternative,
                          int max_exact = 20, int resamples = 20000, uint64_t seed = 1);

// Holm's step-down adjustment: family-wise error at most alpha when each adjusted p-value is
// compared with alpha. Same order as the input.
std::vector<double> holm_adjust(std::span<const double> p_values);

// The standard normal quantile (Boost.Math), p in (0, 1).
double normal_quantile(double p);

// Paired samples a test at error rate `alpha` needs to detect a true mean difference of
// `effect` with probability `power`, when the differences have standard deviation `sd`
// (normal approximation), and never fewer than the sign-flip test needs to reach alpha at
// all. An sd of 0 needs only that minimum.
int64_t samples_to_detect(double sd, double effect, double alpha, double power,
                          Alternative alternative);

// The fewest non-zero differences whose sign-flip test can reach p <= alpha.
int64_t min_samples_for(double alpha, Alternative alternative);

}  // namespace kvaudit::stats
