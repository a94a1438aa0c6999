// Error accounting: compensated sums and mergeable accumulators. Each metric is defined in
// numerics.h exactly; the merge operations make per-thread partial results combine into
// the same value whatever the split (up to the compensated sum's rounding).
#include <algorithm>
#include <cmath>
#include <limits>

#include "numerics/numerics.h"

namespace kvaudit::numerics {

void EncodeCounts::merge(const EncodeCounts& other) {
  elements += other.elements;
  saturated += other.saturated;
  became_nan += other.became_nan;
  became_inf += other.became_inf;
  flushed_to_zero += other.flushed_to_zero;
  subnormal += other.subnormal;
  nonfinite_input += other.nonfinite_input;
}

void CompensatedSum::add(double value) {
  // Neumaier's variant of Kahan summation: also correct when |value| > |sum|.
  double total = sum + value;
  if (std::fabs(sum) >= std::fabs(value)) {
    compensation += (sum - total) + value;
  } else {
    compensation += (value - total) + sum;
  }
  sum = total;
}

void CompensatedSum::merge(const CompensatedSum& other) {
  add(other.sum);
  add(other.compensation);
}

void ErrorStats::add(std::span<const float> reference, std::span<const float> decoded) {
  const size_t n = std::min(reference.size(), decoded.size());
  // Partial sums in blocks keep the compensated adds off the per-element path.
  constexpr size_t kBlock = 256;
  for (size_t begin = 0; begin < n; begin += kBlock) {
    const size_t end = std::min(n, begin + kBlock);
    double block_error = 0.0, block_reference = 0.0, block_max = 0.0;
    int64_t block_count = 0, block_nonfinite = 0;
    for (size_t i = begin; i < end; ++i) {
      const double r = reference[i], d = decoded[i];
      if (!std::isfinite(r) || !std::isfinite(d)) {
        ++block_nonfinite;
        continue;
      }
      const double e = d - r;
      block_error += e * e;
      block_reference += r * r;
      block_max = std::max(block_max, std::fabs(e));
      ++block_count;
    }
    sum_squared_error.add(block_error);
    sum_squared_reference.add(block_reference);
    max_abs_error = std::max(max_abs_error, block_max);
    count += block_count;
    nonfinite += block_nonfinite;
  }
}

void ErrorStats::merge(const ErrorStats& other) {
  count += other.count;
  nonfinite += other.nonfinite;
  sum_squared_error.merge(other.sum_squared_error);
  sum_squared_reference.merge(other.sum_squared_reference);
  max_abs_error = std::max(max_abs_error, other.max_abs_error);
}

double ErrorStats::rmse() const {
  if (count == 0) return 0.0;
  return std::sqrt(sum_squared_error.value() / double(count));
}

double ErrorStats::relative_rmse() const {
  const double error = sum_squared_error.value(), reference = sum_squared_reference.value();
  if (error == 0.0) return 0.0;
  if (reference == 0.0) return std::numeric_limits<double>::infinity();
  return std::sqrt(error / reference);
}

double ErrorStats::snr_db() const {
  const double error = sum_squared_error.value(), reference = sum_squared_reference.value();
  if (error == 0.0) return std::numeric_limits<double>::infinity();
  if (reference == 0.0) return -std::numeric_limits<double>::infinity();
  return 10.0 * std::log10(reference / error);
}

}  // namespace kvaudit::numerics
