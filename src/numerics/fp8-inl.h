// SIMD kernels for the KV codecs, compiled once per target by Highway's foreach_target
// (see kernels.cpp). Each kernel is bit-identical to the scalar reference in scalar.cpp:
// FP8 rounding uses the same integer round-to-nearest-even PyTorch's c10 casts use
// (add half-ulp-minus-one plus the odd bit, shift), and the float add against a magic
// constant for subnormals. Tails shorter than one vector go through the scalar reference.
#if defined(KVAUDIT_NUMERICS_FP8_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVAUDIT_NUMERICS_FP8_INL_H_
#undef KVAUDIT_NUMERICS_FP8_INL_H_
#else
#define KVAUDIT_NUMERICS_FP8_INL_H_
#endif

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "hwy/highway.h"
#include "numerics/numerics.h"

HWY_BEFORE_NAMESPACE();
namespace kvaudit::numerics::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Constants describing one FP8 flavour, as 32-bit lane values. constexpr: every kernel is
// compiled per flavour (WithFp8Type), so shifts are immediates and the flavour branches
// below disappear from the vector loops instead of being tested per vector.
struct Fp8Constants {
  int mantissa_bits;            // 3 or 2
  int32_t normal_add;           // ((bias - 127) << 23) + (1 << (22 - M)) - 1
  int32_t min_normal_bits;      // float bits of the smallest normal
  int32_t denormal_magic_bits;  // 2^(emin - M + 23): adding it rounds to the subnormal grid
  int32_t max_code;             // largest finite magnitude code (0x7E, 0x7B, 0x7F)
  int32_t nan_code;             // magnitude code given to NaN input
  bool fnuz;                    // no -0; 0x80 is NaN and carries no sign
  // Decode side.
  int32_t exponent_rebias_bits;  // (127 - bias) << 23
  int32_t subnormal_step_bits;   // 2^(1 - bias - M)
  int32_t special_from;          // magnitude codes >= this are NaN / inf (0x7F / 0x7C), else 256
  bool ieee_specials;            // E5M2: 0x7C inf, 0x7D..0x7F NaN
};

constexpr Fp8Constants fp8_constants(ElementType type) {
  Fp8Constants k{};
  int bias = 7;
  if (type == ElementType::fp8_e5m2) bias = 15;
  if (type == ElementType::fp8_e4m3fnuz) bias = 8;
  const int m = type == ElementType::fp8_e5m2 ? 2 : 3;
  k.mantissa_bits = m;
  k.normal_add = int32_t(uint32_t(bias - 127) << 23) + (1 << (22 - m)) - 1;
  k.min_normal_bits = (1 - bias + 127) << 23;
  k.denormal_magic_bits = (1 - bias - m + 23 + 127) << 23;
  k.exponent_rebias_bits = (127 - bias) << 23;
  k.subnormal_step_bits = (1 - bias - m + 127) << 23;
  switch (type) {
    case ElementType::fp8_e5m2:
      k.max_code = 0x7B;
      k.nan_code = 0x7F;
      k.special_from = 0x7C;
      k.ieee_specials = true;
      break;
    case ElementType::fp8_e4m3fnuz:
      k.max_code = 0x7F;
      k.nan_code = 0x80;
      k.special_from = 256;
      k.fnuz = true;
      break;
    default:
      k.max_code = 0x7E;
      k.nan_code = 0x7F;
      k.special_from = 0x7F;
      break;
  }
  return k;
}

// Magnitude code given to overflows: the largest finite code (saturate), or the one right
// above it (NaN or inf, as torch's cast gives).
constexpr int32_t fp8_overflow_code(ElementType type, Overflow overflow) {
  const int32_t max_code = fp8_constants(type).max_code;
  return overflow == Overflow::saturate ? max_code : max_code + 1;
}

// Calls body(std::integral_constant<ElementType, T>) for the FP8 flavour `type`, so the
// body is compiled once per flavour with its constants known.
template <class Body>
HWY_INLINE void WithFp8Type(ElementType type, const Body& body) {
  switch (type) {
    case ElementType::fp8_e5m2:
      return body(std::integral_constant<ElementType, ElementType::fp8_e5m2>());
    case ElementType::fp8_e4m3fnuz:
      return body(std::integral_constant<ElementType, ElementType::fp8_e4m3fnuz>());
    default:
      return body(std::integral_constant<ElementType, ElementType::fp8_e4m3>());
  }
}

// Encodes the magnitude bits of float lanes (already divided by the scale; sign bit clear)
// into FP8 magnitude codes held in int32 lanes: 0 .. max code, the overflow code, or the
// NaN code. overflow_code: fp8_overflow_code(kType, overflow) in every lane.
template <ElementType kType, class D>
HWY_INLINE hn::Vec<hn::RebindToSigned<D>> EncodeFp8MagnitudeLanes(
    D d, hn::Vec<hn::RebindToSigned<D>> magnitude_bits,
    hn::Vec<hn::RebindToSigned<D>> overflow_code) {
  constexpr Fp8Constants k = fp8_constants(kType);
  constexpr int kShift = 23 - k.mantissa_bits;
  const hn::RebindToSigned<D> di;
  // Normal range: integer round to nearest even on the float bits.
  const auto odd = hn::And(hn::ShiftRight<kShift>(magnitude_bits), hn::Set(di, 1));
  const auto normal =
      hn::ShiftRight<kShift>(hn::Add(hn::Add(magnitude_bits, hn::Set(di, k.normal_add)), odd));
  // Subnormal range: the float adder rounds onto the subnormal grid for us. Computed for
  // every vector: a branch on "any subnormal lane" mispredicts on real K/V, where a few
  // percent of elements are that small. (A float compare: one instruction, where the
  // integer one takes two on AVX2.)
  const auto is_subnormal = hn::RebindMask(
      di, hn::BitCast(d, magnitude_bits) < hn::BitCast(d, hn::Set(di, k.min_normal_bits)));
  const auto magic = hn::BitCast(d, hn::Set(di, k.denormal_magic_bits));
  const auto shifted = hn::Add(hn::BitCast(d, magnitude_bits), magic);
  const auto subnormal = hn::Sub(hn::BitCast(di, shifted), hn::Set(di, k.denormal_magic_bits));
  auto code = hn::IfThenElse(is_subnormal, subnormal, normal);
  // Overflow: the overflow code sits right at or above the largest finite code, so a
  // minimum does it.
  code = hn::Min(code, overflow_code);
  const auto is_nan = magnitude_bits > hn::Set(di, 0x7F800000);
  return hn::IfThenElse(is_nan, hn::Set(di, k.nan_code), code);
}

// Encodes float lanes (already divided by the scale) into FP8 codes held in int32 lanes.
template <ElementType kType, class D>
HWY_INLINE hn::Vec<hn::RebindToSigned<D>> EncodeFp8Lanes(
    D d, hn::Vec<D> y, hn::Vec<hn::RebindToSigned<D>> overflow_code) {
  constexpr Fp8Constants k = fp8_constants(kType);
  const hn::RebindToSigned<D> di;
  const auto bits = hn::BitCast(di, y);
  const auto sign_bit = hn::And(bits, hn::Set(di, int32_t(0x80000000u)));
  const auto code = EncodeFp8MagnitudeLanes<kType>(d, hn::Xor(bits, sign_bit), overflow_code);
  const auto sign = hn::ShiftRight<24>(hn::BitCast(hn::RebindToUnsigned<D>(), sign_bit));
  auto with_sign = hn::Or(code, hn::BitCast(di, sign));
  if constexpr (k.fnuz) {
    // FNUZ: zero has no sign, and 0x80 (NaN) already is the whole code.
    const auto unsigned_code = hn::Or(code == hn::Zero(di), code == hn::Set(di, 0x80));
    with_sign = hn::IfThenElse(unsigned_code, code, with_sign);
  }
  return with_sign;
}

// Decodes FP8 codes held in int32 lanes to floats (unscaled). Normal codes get their
// exponent rebiased in the integer domain; subnormal codes are converted as integers times
// the subnormal step. (Placing a subnormal code's bits into a float subnormal and
// rescaling with one multiply is fewer instructions, but float subnormal operands cost
// this kind of CPU a microcode assist: twice as slow on real K/V.)
template <ElementType kType, class D>
HWY_INLINE hn::Vec<D> DecodeFp8Lanes(D d, hn::Vec<hn::RebindToSigned<D>> code) {
  constexpr Fp8Constants k = fp8_constants(kType);
  const hn::RebindToSigned<D> di;
  const auto magnitude = hn::And(code, hn::Set(di, 0x7F));
  const auto sign = hn::ShiftLeft<24>(hn::And(code, hn::Set(di, 0x80)));
  const auto normal = hn::BitCast(d, hn::Add(hn::ShiftLeft<23 - k.mantissa_bits>(magnitude),
                                             hn::Set(di, k.exponent_rebias_bits)));
  const auto subnormal =
      hn::Mul(hn::ConvertTo(d, magnitude), hn::BitCast(d, hn::Set(di, k.subnormal_step_bits)));
  auto value = hn::IfThenElse(hn::RebindMask(d, magnitude < hn::Set(di, 1 << k.mantissa_bits)),
                              subnormal, normal);
  value = hn::BitCast(d, hn::Or(hn::BitCast(di, value), sign));
  const auto nan = hn::Set(d, std::numeric_limits<float>::quiet_NaN());
  if constexpr (k.ieee_specials) {
    const auto special_bits =
        hn::Or(hn::BitCast(di, hn::Set(d, std::numeric_limits<float>::infinity())),
               hn::Or(sign, hn::ShiftLeft<21>(hn::And(magnitude, hn::Set(di, 3)))));
    value = hn::IfThenElse(hn::RebindMask(d, magnitude > hn::Set(di, k.special_from - 1)),
                           hn::BitCast(d, special_bits), value);
  } else if constexpr (k.fnuz) {
    value = hn::IfThenElse(hn::RebindMask(d, code == hn::Set(di, 0x80)), nan, value);
  } else {
    value = hn::IfThenElse(hn::RebindMask(d, magnitude == hn::Set(di, 0x7F)), nan, value);
  }
  return value;
}

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

}  // namespace kvaudit::numerics::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard toggle
