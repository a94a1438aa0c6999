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

// ErrorStats::add is in kernels.cpp, beside its SIMD block kernel.

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
