// FP8 SIMD kernels: the per-lane encode and decode, and the bulk FP8 <-> float / BF16
// loops (the BF16 table decode too), compiled once per target by Highway's foreach_target
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

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "numerics/bf16-inl.h"
#include "numerics/numerics.h"
#include "numerics/pack-inl.h"

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

void EncodeFp8Float(ElementType type, Overflow overflow, float scale, const float* input,
                    uint8_t* codes, size_t count) {
  WithFp8Type(type, [&](auto flavour) {
    constexpr ElementType kType = decltype(flavour)::value;
    const hn::ScalableTag<float> d;
    const hn::RebindToSigned<decltype(d)> di;
    const hn::Rebind<uint8_t, decltype(d)> d8;
    const size_t lanes = hn::Lanes(d);
    const auto overflow_code = hn::Set(di, fp8_overflow_code(kType, overflow));
    const auto scale_v = hn::Set(d, scale);
    size_t i = 0;
    for (; i + lanes <= count; i += lanes) {
      const auto y = hn::Div(hn::LoadU(d, input + i), scale_v);
      hn::StoreU(hn::DemoteTo(d8, EncodeFp8Lanes<kType>(d, y, overflow_code)), d8, codes + i);
    }
    for (; i < count; ++i) codes[i] = uint8_t(encode_element(type, input[i] / scale, overflow));
  });
}

// Bulk FP8 -> BF16 calls at least this long use the table path below.
constexpr size_t kLookupMinCodes = 4096;

void EncodeFp8Bf16(ElementType type, Overflow overflow, float scale, const uint16_t* input,
                   uint8_t* codes, size_t count) {
  WithFp8Type(type, [&](auto flavour) {
    constexpr ElementType kType = decltype(flavour)::value;
    const hn::ScalableTag<float> d;
    const hn::RebindToSigned<decltype(d)> di;
    const hn::RebindToUnsigned<decltype(d)> du;
    const hn::Rebind<uint16_t, decltype(d)> d16;
    const hn::Rebind<uint8_t, decltype(d)> d8;
    const size_t lanes = hn::Lanes(d);
    const auto overflow_code = hn::Set(di, fp8_overflow_code(kType, overflow));
    const auto scale_v = hn::Set(d, scale);
    const auto encode = [&](size_t at) {
      const auto x =
          hn::BitCast(d, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(d16, input + at))));
      return EncodeFp8Lanes<kType>(d, hn::Div(x, scale_v), overflow_code);
    };
    const auto encode_one = [&](size_t at) {
      codes[at] = uint8_t(encode_element(type, bf16_to_float(input[at]) / scale, overflow));
    };
    size_t i = 0;
#if HWY_TARGET != HWY_SCALAR
    // Four vectors of codes fill one whole byte vector: stored whole, and streaming
    // (aligned) when the output is large.
    const hn::Repartition<uint8_t, decltype(di)> d8_full;
    const hn::Repartition<uint16_t, decltype(di)> d16_full;
    const size_t full = hn::Lanes(d8_full);
    const bool stream = count >= kStreamMinBytes;
    if (stream) {
      for (; i < count && reinterpret_cast<uintptr_t>(codes + i) % full != 0; ++i) encode_one(i);
    }
    // With a positive finite scale the quotient has the input's sign (NaN and inf
    // included), so E4M3 and E5M2 encode magnitudes and take the sign bits straight from
    // the BF16 high bytes, a whole vector at once. (FNUZ zeros and NaN carry no sign.)
    constexpr bool kSignFromInput = !fp8_constants(kType).fnuz;
    if (kSignFromInput && scale > 0.0f && scale < std::numeric_limits<float>::infinity()) {
      const auto magnitude = [&](size_t at) {
        const auto x =
            hn::BitCast(d, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(d16, input + at))));
        const auto y = hn::BitCast(di, hn::Div(x, scale_v));
        return EncodeFp8MagnitudeLanes<kType>(d, hn::And(y, hn::Set(di, int32_t{0x7FFFFFFF})),
                                              overflow_code);
      };
      for (; i + full <= count; i += full) {
        const auto high_bytes =
            PackWords(d16_full, hn::ShiftRight<8>(hn::LoadU(d16_full, input + i)),
                      hn::ShiftRight<8>(hn::LoadU(d16_full, input + i + full / 2)));
        const auto signs = hn::And(high_bytes, hn::Set(d8_full, uint8_t{0x80}));
        const auto magnitudes = PackCodes(di, magnitude(i), magnitude(i + lanes),
                                          magnitude(i + 2 * lanes), magnitude(i + 3 * lanes));
        StoreWhole(hn::Or(magnitudes, signs), d8_full, codes + i, stream);
      }
    }
    for (; i + full <= count; i += full) {
      StoreWhole(
          PackCodes(di, encode(i), encode(i + lanes), encode(i + 2 * lanes), encode(i + 3 * lanes)),
          d8_full, codes + i, stream);
    }
    if (stream) hwy::FlushStream();
#endif
    for (; i + lanes <= count; i += lanes) hn::StoreU(hn::DemoteTo(d8, encode(i)), d8, codes + i);
    for (; i < count; ++i) encode_one(i);
  });
}

void DecodeFp8Float(ElementType type, float scale, const uint8_t* codes, float* output,
                    size_t count) {
  WithFp8Type(type, [&](auto flavour) {
    constexpr ElementType kType = decltype(flavour)::value;
    const hn::ScalableTag<float> d;
    const hn::RebindToSigned<decltype(d)> di;
    const hn::Rebind<uint8_t, decltype(d)> d8;
    const size_t lanes = hn::Lanes(d);
    const auto scale_v = hn::Set(d, scale);
    size_t i = 0;
    for (; i + lanes <= count; i += lanes) {
      const auto code = hn::PromoteTo(di, hn::LoadU(d8, codes + i));
      hn::StoreU(hn::Mul(DecodeFp8Lanes<kType>(d, code), scale_v), d, output + i);
    }
    for (; i < count; ++i) output[i] = decode_element(type, codes[i]) * scale;
  });
}

#if HWY_TARGET != HWY_SCALAR
// FP8 -> BF16 in 16-bit lanes, a whole vector of codes at a time. For a normal code with
// exponent field e and mantissa m, bf16(decode(c) * s) = bf16(decode(e=1, m) * s) +
// ((e - 1) << 7) whenever the products are normal BF16 numbers: scaling by a power of two
// moves neither rounding. So 2^M entries for the subnormal codes and 2^M for the e = 1
// codes (stored minus 1 << 7), looked up with byte shuffles, plus an add of e << 7, give
// every code; NaN and inf codes are patched. Whether the identity holds for a scale is
// settled by decoding all 256 codes this way and comparing with the reference
// (Fp8Bf16LookupFor); tiny or huge scales fail it and take the float path.
struct Fp8Bf16Lookup {
  HWY_ALIGN uint8_t low[16];   // low bytes of the 16 table entries
  HWY_ALIGN uint8_t high[16];  // high bytes
};

// Decodes whole vectors of codes; returns how many codes it decoded.
template <ElementType kType>
size_t DecodeFp8Bf16Lookup(const Fp8Bf16Lookup& lookup, const uint8_t* codes, uint16_t* output,
                           size_t count, bool stream) {
  constexpr Fp8Constants k = fp8_constants(kType);
  constexpr int kSubnormalCodes = 1 << k.mantissa_bits;
  const hn::ScalableTag<uint16_t> d16;
  const hn::Rebind<uint8_t, decltype(d16)> d8;
  const hn::Repartition<uint8_t, decltype(d16)> d8_full;
  const size_t lanes = hn::Lanes(d16);
  const auto low_table = hn::LoadDup128(d8_full, lookup.low);
  const auto high_table = hn::LoadDup128(d8_full, lookup.high);
  const auto low_byte = hn::Set(d16, uint16_t{0xFF});
  const auto nan_bits = hn::Set(d16, uint16_t{0x7FC0});
  size_t i = 0;
  for (; i + lanes <= count; i += lanes) {
    const auto code = hn::PromoteTo(d16, hn::LoadU(d8, codes + i));
    const auto magnitude = hn::And(code, hn::Set(d16, uint16_t{0x7F}));
    // Subnormal codes index themselves; normal ones index 2^M + m: the smaller of the two.
    const auto index =
        hn::Min(magnitude, hn::Or(hn::And(magnitude, hn::Set(d16, uint16_t(kSubnormalCodes - 1))),
                                  hn::Set(d16, uint16_t(kSubnormalCodes))));
    const auto index_bytes = hn::BitCast(d8_full, index);
    const auto low =
        hn::And(hn::BitCast(d16, hn::TableLookupBytes(low_table, index_bytes)), low_byte);
    const auto high =
        hn::ShiftLeft<8>(hn::BitCast(d16, hn::TableLookupBytes(high_table, index_bytes)));
    const auto exponent = hn::ShiftLeft<7 - k.mantissa_bits>(
        hn::And(magnitude, hn::Set(d16, uint16_t(0x7F & ~(kSubnormalCodes - 1)))));
    const auto sign = hn::ShiftLeft<8>(hn::And(code, hn::Set(d16, uint16_t{0x80})));
    auto bits = hn::Or(hn::Add(hn::Or(low, high), exponent), sign);
    if constexpr (k.ieee_specials) {
      const auto special = hn::IfThenElse(magnitude == hn::Set(d16, uint16_t(k.special_from)),
                                          hn::Or(hn::Set(d16, uint16_t{0x7F80}), sign), nan_bits);
      bits = hn::IfThenElse(magnitude > hn::Set(d16, uint16_t(k.special_from - 1)), special, bits);
    } else if constexpr (k.fnuz) {
      bits = hn::IfThenElse(code == hn::Set(d16, uint16_t{0x80}), nan_bits, bits);
    } else {
      bits = hn::IfThenElse(magnitude == hn::Set(d16, uint16_t{0x7F}), nan_bits, bits);
    }
    StoreWhole(bits, d16, output + i, stream);
  }
  return i;
}

// The lookup for (kType, scale), or null when the identity above fails for some code.
// Cached per thread: the check decodes 256 codes, which bulk calls amortise.
template <ElementType kType>
const Fp8Bf16Lookup* Fp8Bf16LookupFor(float scale) {
  struct Cached {
    uint32_t scale_bits = 0;
    bool filled = false, usable = false;
    Fp8Bf16Lookup lookup;
  };
  thread_local Cached cached;
  const uint32_t scale_bits = std::bit_cast<uint32_t>(scale);
  if (cached.filled && cached.scale_bits == scale_bits)
    return cached.usable ? &cached.lookup : nullptr;
  constexpr int kSubnormalCodes = 1 << fp8_constants(kType).mantissa_bits;
  for (int index = 0; index < 16; ++index) {
    uint16_t bits = 0;
    if (index < 2 * kSubnormalCodes) {
      bits = float_to_bf16(decode_element(kType, uint32_t(index)) * scale);
      if (index >= kSubnormalCodes) bits = uint16_t(bits - (1 << 7));
    }
    cached.lookup.low[index] = uint8_t(bits & 0xFF);
    cached.lookup.high[index] = uint8_t(bits >> 8);
  }
  HWY_ALIGN uint8_t every_code[256];
  HWY_ALIGN uint16_t decoded[256];
  for (int c = 0; c < 256; ++c) every_code[c] = uint8_t(c);
  const size_t done = DecodeFp8Bf16Lookup<kType>(cached.lookup, every_code, decoded, 256, false);
  bool usable = done == 256;
  for (int c = 0; c < 256 && usable; ++c) {
    usable = decoded[c] == float_to_bf16(decode_element(kType, uint32_t(c)) * scale);
  }
  cached.scale_bits = scale_bits;
  cached.filled = true;
  cached.usable = usable;
  return usable ? &cached.lookup : nullptr;
}
#endif  // HWY_TARGET != HWY_SCALAR

void DecodeFp8Bf16(ElementType type, float scale, const uint8_t* codes, uint16_t* output,
                   size_t count) {
  WithFp8Type(type, [&](auto flavour) {
    constexpr ElementType kType = decltype(flavour)::value;
    const hn::ScalableTag<float> d;
    const hn::RebindToSigned<decltype(d)> di;
    const hn::Rebind<uint8_t, decltype(d)> d8;
    const hn::Rebind<uint16_t, decltype(d)> d16;
    const size_t lanes = hn::Lanes(d);
    const auto scale_v = hn::Set(d, scale);
    const auto decode = [&](size_t at) {
      const auto code = hn::PromoteTo(di, hn::LoadU(d8, codes + at));
      return FloatToBf16Lanes(d, hn::Mul(DecodeFp8Lanes<kType>(d, code), scale_v));
    };
    const auto decode_one = [&](size_t at) {
      output[at] = float_to_bf16(decode_element(type, codes[at]) * scale);
    };
    size_t i = 0;
#if HWY_TARGET != HWY_SCALAR
    // Whole vectors of BF16, streaming (aligned) when the output is large.
    const hn::Repartition<uint16_t, decltype(di)> d16_full;
    const size_t full = hn::Lanes(d16_full);
    const bool stream = count * sizeof(uint16_t) >= kStreamMinBytes;
    if (stream) {
      for (; i < count && reinterpret_cast<uintptr_t>(output + i) % (full * 2) != 0; ++i) {
        decode_one(i);
      }
    }
    // The table path pays a 256-code check per new scale: only for bulk calls.
    const Fp8Bf16Lookup* lookup =
        count - i >= kLookupMinCodes ? Fp8Bf16LookupFor<kType>(scale) : nullptr;
    if (lookup) {
      i += DecodeFp8Bf16Lookup<kType>(*lookup, codes + i, output + i, count - i, stream);
    } else {
      for (; i + full <= count; i += full) {
        StoreWhole(PackBf16(di, decode(i), decode(i + lanes)), d16_full, output + i, stream);
      }
    }
    if (stream) hwy::FlushStream();
#endif
    for (; i + lanes <= count; i += lanes) {
      hn::StoreU(hn::DemoteTo(d16, decode(i)), d16, output + i);
    }
    for (; i < count; ++i) decode_one(i);
  });
}

}  // namespace kvaudit::numerics::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard toggle
