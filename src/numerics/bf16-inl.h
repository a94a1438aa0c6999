// BF16 <-> float SIMD kernels: the per-lane rounding FloatToBf16Lanes (shared by the FP8
// and NVFP4 BF16 paths) and the bulk conversions, compiled per target via kernels.cpp.
#if defined(KVAUDIT_NUMERICS_BF16_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVAUDIT_NUMERICS_BF16_INL_H_
#undef KVAUDIT_NUMERICS_BF16_INL_H_
#else
#define KVAUDIT_NUMERICS_BF16_INL_H_
#endif

#include <cstddef>
#include <cstdint>

#include "hwy/highway.h"
#include "numerics/numerics.h"

HWY_BEFORE_NAMESPACE();
namespace kvaudit::numerics::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// float bits -> bf16 bits (round to nearest even, NaN -> 0x7FC0) in int32 lanes.
template <class D>
HWY_INLINE hn::Vec<hn::RebindToSigned<D>> FloatToBf16Lanes(D /*d*/, hn::Vec<D> value) {
  const hn::RebindToSigned<D> di;
  const hn::RebindToUnsigned<D> du;
  const auto bits = hn::BitCast(du, value);
  const auto rounding =
      hn::Add(hn::Set(du, 0x7FFFu), hn::And(hn::ShiftRight<16>(bits), hn::Set(du, 1u)));
  const auto rounded = hn::BitCast(di, hn::ShiftRight<16>(hn::Add(bits, rounding)));
  return hn::IfThenElse(hn::RebindMask(di, hn::IsNaN(value)), hn::Set(di, 0x7FC0), rounded);
}

void Bf16ToFloat(const uint16_t* input, float* output, size_t count) {
  const hn::ScalableTag<float> d;
  const hn::RebindToUnsigned<decltype(d)> du;
  const hn::Rebind<uint16_t, decltype(d)> d16;
  const size_t lanes = hn::Lanes(d);
  size_t i = 0;
  for (; i + lanes <= count; i += lanes) {
    const auto bits = hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(d16, input + i)));
    hn::StoreU(hn::BitCast(d, bits), d, output + i);
  }
  for (; i < count; ++i) output[i] = bf16_to_float(input[i]);
}

void FloatToBf16(const float* input, uint16_t* output, size_t count) {
  const hn::ScalableTag<float> d;
  const hn::Rebind<uint16_t, decltype(d)> d16;
  const size_t lanes = hn::Lanes(d);
  size_t i = 0;
  for (; i + lanes <= count; i += lanes) {
    hn::StoreU(hn::DemoteTo(d16, FloatToBf16Lanes(d, hn::LoadU(d, input + i))), d16, output + i);
  }
  for (; i < count; ++i) output[i] = float_to_bf16(input[i]);
}

}  // namespace kvaudit::numerics::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard toggle
