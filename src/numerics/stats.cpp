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
  // Partial sums in blocks keep the compensated adds off the per-element path. Inside a
  // block, four interleaved accumulators (element i goes to i % 4, combined in a fixed
  // order) and a branch-free finiteness test: one chain of dependent double adds per sum
  // made this the slowest step of a quant sweep.
  constexpr size_t kBlock = 256, kLanes = 4;
  for (size_t begin = 0; begin < n; begin += kBlock) {
    const size_t end = std::min(n, begin + kBlock);
    double error[kLanes] = {}, squares[kLanes] = {}, largest[kLanes] = {};
    int64_t finite_pairs = 0;
    for (size_t i = begin; i < end; i += kLanes) {
      for (size_t lane = 0; lane < kLanes && i + lane < end; ++lane) {
        const double r = reference[i + lane], d = decoded[i + lane];
        const bool finite = std::isfinite(r) && std::isfinite(d);
        const double e = finite ? d - r : 0.0, kept = finite ? r : 0.0;
        error[lane] += e * e;
        squares[lane] += kept * kept;
        largest[lane] = std::max(largest[lane], std::fabs(e));
        finite_pairs += finite ? 1 : 0;
      }
    }
    sum_squared_error.add((error[0] + error[1]) + (error[2] + error[3]));
    sum_squared_reference.add((squares[0] + squares[1]) + (squares[2] + squares[3]));
    max_abs_error = std::max({max_abs_error, largest[0], largest[1], largest[2], largest[3]});
    count += finite_pairs;
    nonfinite += static_cast<int64_t>(end - begin) - finite_pairs;
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
