// Reduction and transform SIMD kernels: finite abs-max, the Walsh-Hadamard rotation and
// the ErrorStats block sums; per target via kernels.cpp.
#if defined(KVAUDIT_NUMERICS_REDUCE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVAUDIT_NUMERICS_REDUCE_INL_H_
#undef KVAUDIT_NUMERICS_REDUCE_INL_H_
#else
#define KVAUDIT_NUMERICS_REDUCE_INL_H_
#endif

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace kvaudit::numerics::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// ------------------------------------------------------------------ amax
// Largest |x| over the finite elements (0 if none): on the |x| bits, which order like the
// values, with non-finite lanes zeroed.
float FiniteAbsMax(const float* x, size_t count) {
  const hn::ScalableTag<float> d;
  const hn::RebindToSigned<decltype(d)> di;
  const size_t lanes = hn::Lanes(d);
  const auto abs_mask = hn::Set(di, 0x7FFFFFFF), inf_bits = hn::Set(di, 0x7F800000);
  auto amax0 = hn::Zero(di), amax1 = hn::Zero(di);
  const auto finite_bits = [&](size_t at) {
    const auto bits = hn::And(hn::BitCast(di, hn::LoadU(d, x + at)), abs_mask);
    return hn::IfThenElseZero(bits < inf_bits, bits);
  };
  size_t i = 0;
  for (; i + 2 * lanes <= count; i += 2 * lanes) {
    amax0 = hn::Max(amax0, finite_bits(i));
    amax1 = hn::Max(amax1, finite_bits(i + lanes));
  }
  for (; i + lanes <= count; i += lanes) amax0 = hn::Max(amax0, finite_bits(i));
  float amax = std::bit_cast<float>(hn::GetLane(hn::MaxOfLanes(di, hn::Max(amax0, amax1))));
  for (; i < count; ++i) {
    if (std::isfinite(x[i])) amax = std::max(amax, std::fabs(x[i]));
  }
  return amax;
}

// amax[i] = max(amax[i], |x[i]|) over the finite x[i].
void FiniteAbsMaxInto(const float* x, float* amax, size_t count) {
  const hn::ScalableTag<float> d;
  const hn::RebindToSigned<decltype(d)> di;
  const size_t lanes = hn::Lanes(d);
  const auto abs_mask = hn::Set(di, 0x7FFFFFFF), inf_bits = hn::Set(di, 0x7F800000);
  size_t i = 0;
  for (; i + lanes <= count; i += lanes) {
    const auto bits = hn::And(hn::BitCast(di, hn::LoadU(d, x + i)), abs_mask);
    const auto current = hn::BitCast(di, hn::LoadU(d, amax + i));
    hn::StoreU(hn::BitCast(d, hn::Max(current, hn::IfThenElseZero(bits < inf_bits, bits))), d,
               amax + i);
  }
  for (; i < count; ++i) {
    if (std::isfinite(x[i])) amax[i] = std::max(amax[i], std::fabs(x[i]));
  }
}

// ------------------------------------------------------------------ Hadamard
void HadamardRows(float* data, size_t count, size_t width) {
  const hn::ScalableTag<float> d;
  const size_t lanes = hn::Lanes(d);
  const float normaliser = float(1.0 / std::sqrt(double(width)));
  for (size_t base = 0; base + width <= count; base += width) {
    float* x = data + base;
    for (size_t half = 1; half < width; half *= 2) {
      for (size_t i = 0; i < width; i += 2 * half) {
        size_t j = i;
        if (half >= lanes) {
          for (; j + lanes <= i + half; j += lanes) {
            const auto a = hn::LoadU(d, x + j), b = hn::LoadU(d, x + j + half);
            hn::StoreU(hn::Add(a, b), d, x + j);
            hn::StoreU(hn::Sub(a, b), d, x + j + half);
          }
        }
        for (; j < i + half; ++j) {
          const float a = x[j], b = x[j + half];
          x[j] = a + b;
          x[j + half] = a - b;
        }
      }
    }
    size_t j = 0;
    for (; j + lanes <= width; j += lanes) {
      hn::StoreU(hn::Mul(hn::LoadU(d, x + j), hn::Set(d, normaliser)), d, x + j);
    }
    for (; j < width; ++j) x[j] *= normaliser;
  }
}

// ------------------------------------------------------------------ error sums
// One block of ErrorStats::add: over the pairs where both sides are finite, the sums of
// squared error and squared reference (double lanes, the float pairs promoted), their
// count and the largest |error|. sums = {error^2, reference^2, count, max |error|}.
void ErrorBlockSums(const float* reference, const float* decoded, size_t count, double* sums) {
  const hn::ScalableTag<double> d;
  const hn::Rebind<float, decltype(d)> df;
  const size_t lanes = hn::Lanes(d);
  auto error_sq = hn::Zero(d), reference_sq = hn::Zero(d), finite = hn::Zero(d),
       max_error = hn::Zero(d);
  const auto one = hn::Set(d, 1.0), inf = hn::Set(d, std::numeric_limits<double>::infinity());
  size_t i = 0;
  for (; i + lanes <= count; i += lanes) {
    const auto r = hn::PromoteTo(d, hn::LoadU(df, reference + i));
    const auto e = hn::Sub(hn::PromoteTo(d, hn::LoadU(df, decoded + i)), r);
    // The difference of two floats in double is finite exactly when both are: one test.
    const auto abs_e = hn::Abs(e);
    const auto ok = hn::Lt(abs_e, inf);  // false for NaN
    const auto e_ok = hn::IfThenElseZero(ok, e);
    const auto r_ok = hn::IfThenElseZero(ok, r);
    error_sq = hn::MulAdd(e_ok, e_ok, error_sq);
    reference_sq = hn::MulAdd(r_ok, r_ok, reference_sq);
    max_error = hn::Max(max_error, hn::IfThenElseZero(ok, abs_e));
    finite = hn::Add(finite, hn::IfThenElseZero(ok, one));
  }
  sums[0] = hn::GetLane(hn::SumOfLanes(d, error_sq));
  sums[1] = hn::GetLane(hn::SumOfLanes(d, reference_sq));
  sums[2] = hn::GetLane(hn::SumOfLanes(d, finite));
  sums[3] = hn::GetLane(hn::MaxOfLanes(d, max_error));
  for (; i < count; ++i) {
    const double r = reference[i], x = decoded[i];
    if (!std::isfinite(r) || !std::isfinite(x)) continue;
    sums[0] += (x - r) * (x - r);
    sums[1] += r * r;
    sums[2] += 1.0;
    sums[3] = std::max(sums[3], std::fabs(x - r));
  }
}

}  // namespace kvaudit::numerics::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard toggle
