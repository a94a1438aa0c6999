// Bulk codec kernels: FP8 (from float or BF16, to float or BF16), BF16, NVFP4 and the
// Walsh-Hadamard rotation. Compiled for every Highway target and dispatched at run time;
// the scalar references in scalar.cpp (and encode_nvfp4_reference below) define the
// results, and tests/numerics compare every path against them bit for bit.
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "numerics/kernels.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "numerics/fp8-inl.h"
#include "numerics/numerics.h"

HWY_BEFORE_NAMESPACE();
namespace kvaudit::numerics::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET != HWY_SCALAR
// Packs four vectors of codes (int32 lanes holding 0..255) into one whole byte vector, in
// order. AVX2 does it in four instructions; the generic form demotes and combines halves.
template <class D>
HWY_INLINE hn::Vec<hn::Repartition<uint8_t, D>> PackCodes(D d, hn::Vec<D> c0, hn::Vec<D> c1,
                                                          hn::Vec<D> c2, hn::Vec<D> c3) {
  const hn::Repartition<uint8_t, D> d8_full;
#if HWY_TARGET == HWY_AVX2
  (void)d;
  const __m256i low = _mm256_packs_epi32(c0.raw, c1.raw);   // c0[0..3] c1[0..3] | c0[4..7] c1[4..7]
  const __m256i high = _mm256_packs_epi32(c2.raw, c3.raw);  // likewise for c2, c3
  const __m256i bytes = _mm256_packus_epi16(low, high);     // 4-byte groups, lane-interleaved
  return hn::Vec<decltype(d8_full)>{
      _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))};
#else
  const hn::Half<decltype(d8_full)> d8_half;
  const hn::Rebind<uint8_t, D> d8;
  const auto low = hn::Combine(d8_half, hn::DemoteTo(d8, c1), hn::DemoteTo(d8, c0));
  const auto high = hn::Combine(d8_half, hn::DemoteTo(d8, c3), hn::DemoteTo(d8, c2));
  return hn::Combine(d8_full, high, low);
#endif
}

// Packs two vectors of BF16 bits (int32 lanes holding 0..0xFFFF) into one whole vector.
template <class D>
HWY_INLINE hn::Vec<hn::Repartition<uint16_t, D>> PackBf16(D d, hn::Vec<D> b0, hn::Vec<D> b1) {
  const hn::Repartition<uint16_t, D> d16_full;
#if HWY_TARGET == HWY_AVX2
  (void)d;
  const __m256i words = _mm256_packus_epi32(b0.raw, b1.raw);  // b0[0..3] b1[0..3] | b0[4..7] ..
  return hn::Vec<decltype(d16_full)>{_mm256_permute4x64_epi64(words, 0xD8)};
#else
  const hn::Rebind<uint16_t, D> d16;
  return hn::Combine(d16_full, hn::DemoteTo(d16, b1), hn::DemoteTo(d16, b0));
#endif
}

// Packs two vectors of 16-bit lanes holding 0..255 into one whole byte vector, in order.
template <class D>
HWY_INLINE hn::Vec<hn::Repartition<uint8_t, D>> PackWords(D d, hn::Vec<D> w0, hn::Vec<D> w1) {
  const hn::Repartition<uint8_t, D> d8_full;
#if HWY_TARGET == HWY_AVX2
  (void)d;
  const __m256i bytes = _mm256_packus_epi16(w0.raw, w1.raw);  // w0[0..7] w1[0..7] | w0[8..] ..
  return hn::Vec<decltype(d8_full)>{_mm256_permute4x64_epi64(bytes, 0xD8)};
#else
  // (Lanes hold 0..255, so the signed demotion saturates nothing.)
  const hn::Half<hn::RebindToSigned<D>> di_half;
  const hn::Rebind<uint8_t, decltype(di_half)> d8_half;
  const hn::Half<decltype(d8_full)> d8_half_full;
  const hn::RebindToSigned<D> di;
  const auto demote = [&](hn::Vec<D> w) {
    const auto signed_w = hn::BitCast(di, w);
    return hn::Combine(d8_half_full, hn::DemoteTo(d8_half, hn::UpperHalf(di_half, signed_w)),
                       hn::DemoteTo(d8_half, hn::LowerHalf(di_half, signed_w)));
  };
  const auto low = demote(w0);
  const auto high = demote(w1);
  return hn::Combine(d8_full, high, low);
#endif
}

// Stores one whole vector: streaming (p aligned) past the cache, or a plain store.
template <class D>
HWY_INLINE void StoreWhole(hn::Vec<D> v, D d, hn::TFromD<D>* p, bool stream) {
  if (stream) {
    hn::Stream(v, d, p);
  } else {
    hn::StoreU(v, d, p);
  }
}

#endif  // HWY_TARGET != HWY_SCALAR

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

// Outputs at least this large bypass the cache (streaming stores), as memcpy does for
// large copies: they would only evict the input, and nothing reads them back soon.
constexpr size_t kStreamMinBytes = size_t(4) << 20;
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

// ------------------------------------------------------------------ NVFP4
// E4M3 block-scale values by code, from the scalar decoder once: the per-block scale
// lookups of the NVFP4 kernels (the scalar decoder per block was a visible cost).
HWY_INLINE const float* E4m3Values() {
  static const std::array<float, 256> values = [] {
    std::array<float, 256> table{};
    for (int code = 0; code < 256; ++code) table[size_t(code)] = fp8_e4m3_to_float(uint8_t(code));
    return table;
  }();
  return values.data();
}

// At most 8 lanes, so one LoadInterleaved2 covers exactly one 16-element block (or half of
// one on 4-lane targets).
using Nvfp4Tag = hn::CappedTag<float, 8>;

// FP4 E2M1 codes of float lanes (already divided by the block scale), by the same integer
// round-to-nearest-even as the FP8 encoder (1 mantissa bit, bias 1): magnitudes from 1.0
// round on their float bits, smaller ones on the float adder against 2^22 (grid 0.5).
// Saturates at 6 (code 7); NaN gives 0 with no sign, as the reference does.
template <class D>
HWY_INLINE hn::Vec<hn::RebindToSigned<D>> EncodeFp4Lanes(D d, hn::Vec<D> y) {
  const hn::RebindToSigned<D> di;
  const auto bits = hn::BitCast(di, y);
  const auto magnitude_bits = hn::And(bits, hn::Set(di, 0x7FFFFFFF));
  constexpr int32_t kNormalAdd = int32_t(uint32_t(1 - 127) << 23) + (1 << 21) - 1;
  const auto odd = hn::And(hn::ShiftRight<22>(magnitude_bits), hn::Set(di, 1));
  const auto normal =
      hn::ShiftRight<22>(hn::Add(hn::Add(magnitude_bits, hn::Set(di, kNormalAdd)), odd));
  constexpr int32_t kMagicBits = (22 + 127) << 23;  // 2^22
  const auto magic = hn::BitCast(d, hn::Set(di, kMagicBits));
  const auto subnormal = hn::Sub(hn::BitCast(di, hn::Add(hn::BitCast(d, magnitude_bits), magic)),
                                 hn::Set(di, kMagicBits));
  const auto is_subnormal = hn::RebindMask(di, hn::BitCast(d, magnitude_bits) < hn::Set(d, 1.0f));
  auto code = hn::Min(hn::IfThenElse(is_subnormal, subnormal, normal), hn::Set(di, 7));
  code = hn::Or(code, hn::And(hn::ShiftRight<28>(bits), hn::Set(di, 8)));
  return hn::IfThenZeroElse(magnitude_bits > hn::Set(di, 0x7F800000), code);
}

template <class D>
HWY_INLINE hn::Vec<D> DecodeFp4Lanes(D d, hn::Vec<hn::RebindToSigned<D>> nibble) {
  const hn::RebindToSigned<D> di;
  const auto magnitude = hn::And(nibble, hn::Set(di, 7));
  const auto small = hn::Mul(hn::ConvertTo(d, magnitude), hn::Set(d, 0.5f));
  const auto exponent = hn::Add(hn::ShiftRight<1>(magnitude), hn::Set(di, 126));
  const auto large_bits =
      hn::Or(hn::ShiftLeft<23>(exponent), hn::ShiftLeft<22>(hn::And(magnitude, hn::Set(di, 1))));
  auto value = hn::IfThenElse(hn::RebindMask(d, magnitude < hn::Set(di, 2)), small,
                              hn::BitCast(d, large_bits));
  const auto sign = hn::ShiftLeft<28>(hn::And(nibble, hn::Set(di, 8)));
  return hn::BitCast(d, hn::Or(hn::BitCast(di, value), sign));
}

// Packs 16 elements (already known to have a usable block scale) into 8 bytes.
HWY_INLINE void EncodeNvfp4Block(Nvfp4Tag d, const float* x, float effective, uint8_t* out) {
  const hn::Rebind<uint8_t, decltype(d)> d8;
  const size_t lanes = hn::Lanes(d);
  const auto scale_v = hn::Set(d, effective);
  for (size_t j = 0; j < 16; j += 2 * lanes) {
    hn::Vec<decltype(d)> even, odd;
    hn::LoadInterleaved2(d, x + j, even, odd);
    const auto low = EncodeFp4Lanes(d, hn::Div(even, scale_v));
    const auto high = EncodeFp4Lanes(d, hn::Div(odd, scale_v));
    hn::StoreU(hn::DemoteTo(d8, hn::Or(low, hn::ShiftLeft<4>(high))), d8, out + j / 2);
  }
}

// Largest |x| of a 16-element block; NaN lanes are left out, as std::max in the reference
// leaves them out.
HWY_INLINE float Nvfp4BlockAmax(Nvfp4Tag d, const float* x) {
  const size_t lanes = hn::Lanes(d);
  auto amax_v = hn::Zero(d);
  for (size_t j = 0; j < 16; j += lanes) {
    const auto v = hn::LoadU(d, x + j);
    amax_v = hn::Max(amax_v, hn::IfThenZeroElse(hn::IsNaN(v), hn::Abs(v)));
  }
  return hn::GetLane(hn::MaxOfLanes(d, amax_v));
}

#if HWY_TARGET != HWY_SCALAR
// Lane b of the result is the largest lane of v[b] (int32 lanes, 8 of them).
template <class D>
HWY_INLINE hn::Vec<D> MaxOfEachVector8(D d, const hn::Vec<D>* v) {
  const hn::Repartition<uint64_t, D> d64;
  const auto pairs = [&](hn::Vec<D> a, hn::Vec<D> b) {  // a0 b0 a1 b1 maxima per block
    return hn::Max(hn::InterleaveLower(d, a, b), hn::InterleaveUpper(d, a, b));
  };
  const auto quads = [&](hn::Vec<D> ab, hn::Vec<D> cd) {  // a b c d maxima per block
    const auto ab64 = hn::BitCast(d64, ab), cd64 = hn::BitCast(d64, cd);
    return hn::Max(hn::BitCast(d, hn::InterleaveLower(d64, ab64, cd64)),
                   hn::BitCast(d, hn::InterleaveUpper(d64, ab64, cd64)));
  };
  const auto low = quads(pairs(v[0], v[1]), pairs(v[2], v[3]));
  const auto high = quads(pairs(v[4], v[5]), pairs(v[6], v[7]));
  return hn::Max(hn::ConcatLowerLower(d, high, low), hn::ConcatUpperUpper(d, high, low));
}

// |x| as int32 bits, which order like the values, with NaN lanes zeroed: the block amax
// leaves NaN out, as std::max in the reference does.
template <class D>
HWY_INLINE hn::Vec<D> AbsBitsNaNAsZero(D di, hn::Vec<D> bits) {
  const auto magnitude = hn::And(bits, hn::Set(di, 0x7FFFFFFF));
  return hn::IfThenZeroElse(magnitude > hn::Set(di, 0x7F800000), magnitude);
}
#endif

void EncodeNvfp4(float tensor_scale, const float* input, uint8_t* packed, uint8_t* block_scales,
                 size_t count) {
  const Nvfp4Tag d;
  const hn::Rebind<uint8_t, decltype(d)> d8;
  const size_t lanes = hn::Lanes(d);
  const size_t blocks = count / 16;
  // Block scales are computed 8 blocks at a time in vector lanes (E4M3 encode of
  // amax / 6 / tensor_scale, decoded back times the tensor scale), the same arithmetic as
  // the scalar reference, lane for lane.
  constexpr size_t kGroup = 8;
  constexpr ElementType kE4m3 = ElementType::fp8_e4m3;
  const hn::RebindToSigned<decltype(d)> di;
  const auto max_code = hn::Set(di, fp8_overflow_code(kE4m3, Overflow::saturate));
  const auto six = hn::Set(d, 6.0f), tensor_scale_v = hn::Set(d, tensor_scale);
  HWY_ALIGN float amax[kGroup];
  HWY_ALIGN float effective[kGroup];
  size_t block = 0;
  for (; block + kGroup <= blocks; block += kGroup) {
    const float* x = input + block * 16;
#if HWY_TARGET != HWY_SCALAR
    if (lanes == 8) {  // the eight block maxima in one transposing reduction
      hn::Vec<decltype(di)> block_max[kGroup];
      for (size_t b = 0; b < kGroup; ++b) {
        block_max[b] = hn::Max(AbsBitsNaNAsZero(di, hn::BitCast(di, hn::LoadU(d, x + b * 16))),
                               AbsBitsNaNAsZero(di, hn::BitCast(di, hn::LoadU(d, x + b * 16 + 8))));
      }
      hn::Store(hn::BitCast(d, MaxOfEachVector8(di, block_max)), d, amax);
    } else  // NOLINT(readability/braces)
#endif
      for (size_t b = 0; b < kGroup; ++b) amax[b] = Nvfp4BlockAmax(d, x + b * 16);
    for (size_t b = 0; b < kGroup; b += lanes) {
      const auto y = hn::Div(hn::Div(hn::Load(d, amax + b), six), tensor_scale_v);
      const auto code = EncodeFp8Lanes<kE4m3>(d, y, max_code);
      hn::StoreU(hn::DemoteTo(d8, code), d8, block_scales + block + b);
      hn::Store(hn::Mul(DecodeFp8Lanes<kE4m3>(d, code), tensor_scale_v), d, effective + b);
    }
    for (size_t b = 0; b < kGroup; ++b) {
      uint8_t* out = packed + (block + b) * 8;
      if (!(effective[b] > 0.0f) || !std::isfinite(effective[b])) {
        std::fill(out, out + 8, uint8_t(0));
      } else {
        EncodeNvfp4Block(d, x + b * 16, effective[b], out);
      }
    }
  }
  for (; block < blocks; ++block) {
    const float* x = input + block * 16;
    const float amax_block = Nvfp4BlockAmax(d, x);
    const uint8_t scale_code =
        float_to_fp8_e4m3(amax_block / 6.0f / tensor_scale, Overflow::saturate);
    block_scales[block] = scale_code;
    const float effective_block = fp8_e4m3_to_float(scale_code) * tensor_scale;
    uint8_t* out = packed + block * 8;
    if (!(effective_block > 0.0f) || !std::isfinite(effective_block)) {
      std::fill(out, out + 8, uint8_t(0));
    } else {
      EncodeNvfp4Block(d, x, effective_block, out);
    }
  }
}

void DecodeNvfp4(float tensor_scale, const uint8_t* packed, const uint8_t* block_scales,
                 float* output, size_t count) {
  const Nvfp4Tag d;
  const hn::RebindToSigned<decltype(d)> di;
  const hn::Rebind<uint8_t, decltype(d)> d8;
  const size_t lanes = hn::Lanes(d);
  for (size_t block = 0; block * 16 < count; ++block) {
    const float effective = E4m3Values()[block_scales[block]] * tensor_scale;
    const auto scale_v = hn::Set(d, effective);
    for (size_t j = 0; j < 16; j += 2 * lanes) {
      const auto bytes = hn::PromoteTo(di, hn::LoadU(d8, packed + block * 8 + j / 2));
      const auto low = hn::Mul(DecodeFp4Lanes(d, hn::And(bytes, hn::Set(di, 15))), scale_v);
      const auto high = hn::Mul(DecodeFp4Lanes(d, hn::ShiftRight<4>(bytes)), scale_v);
      hn::StoreInterleaved2(low, high, d, output + block * 16 + j);
    }
  }
}

// NVFP4 straight from and to BF16, bit for bit what the float kernels above give on the
// BF16 values widened to float (and their output rounded to BF16). A 32-byte load of 16
// BF16 is one block, already split: shifting each 32-bit lane left by 16 gives the even
// elements as floats, masking the low half gives the odd ones, which is the nibble order.
// Eight blocks go at a time: their amax in one transposing reduction, their E4M3 scales
// in one vector. Needs 8 float lanes; other targets widen to float and use the above.

void EncodeNvfp4Bf16(float tensor_scale, const uint16_t* input, uint8_t* packed,
                     uint8_t* block_scales, size_t count) {
  [[maybe_unused]] const Nvfp4Tag d;
  const size_t blocks = count / 16;
  size_t block = 0;
#if HWY_TARGET != HWY_SCALAR
  if (hn::Lanes(d) == 8) {
    const hn::RebindToSigned<decltype(d)> di;
    const hn::Repartition<uint16_t, decltype(d)> d16;
    const hn::Rebind<uint8_t, decltype(d)> d8;
    constexpr ElementType kE4m3 = ElementType::fp8_e4m3;
    const auto max_code = hn::Set(di, fp8_overflow_code(kE4m3, Overflow::saturate));
    const auto six = hn::Set(d, 6.0f), tensor_scale_v = hn::Set(d, tensor_scale);
    const auto high_half = hn::Set(di, int32_t(0xFFFF0000u));
    const auto split = [&](const uint16_t* at, hn::Vec<decltype(di)>& even,
                           hn::Vec<decltype(di)>& odd) {
      const auto v = hn::BitCast(di, hn::LoadU(d16, at));
      even = hn::ShiftLeft<16>(v);
      odd = hn::And(v, high_half);
    };
    HWY_ALIGN float effective[8];
    for (; block + 8 <= blocks; block += 8) {
      const uint16_t* x = input + block * 16;
      hn::Vec<decltype(di)> amax_bits[8];
      for (size_t b = 0; b < 8; ++b) {
        hn::Vec<decltype(di)> even, odd;
        split(x + b * 16, even, odd);
        amax_bits[b] = hn::Max(AbsBitsNaNAsZero(di, even), AbsBitsNaNAsZero(di, odd));
      }
      const auto amax = hn::BitCast(d, MaxOfEachVector8(di, amax_bits));
      const auto scale_code =
          EncodeFp8Lanes<kE4m3>(d, hn::Div(hn::Div(amax, six), tensor_scale_v), max_code);
      hn::StoreU(hn::DemoteTo(d8, scale_code), d8, block_scales + block);
      hn::Store(hn::Mul(DecodeFp8Lanes<kE4m3>(d, scale_code), tensor_scale_v), d, effective);
      hn::Vec<decltype(di)> codes[4];
      for (size_t half = 0; half < 8; half += 4) {
        for (size_t b = half; b < half + 4; ++b) {
          const float e = effective[b];
          if (!(e > 0.0f) || !std::isfinite(e)) {
            codes[b - half] = hn::Zero(di);
            continue;
          }
          hn::Vec<decltype(di)> even, odd;
          split(x + b * 16, even, odd);
          const auto e_v = hn::Set(d, e);
          const auto low = EncodeFp4Lanes(d, hn::Div(hn::BitCast(d, even), e_v));
          const auto high = EncodeFp4Lanes(d, hn::Div(hn::BitCast(d, odd), e_v));
          codes[b - half] = hn::Or(low, hn::ShiftLeft<4>(high));
        }
        hn::StoreU(PackCodes(di, codes[0], codes[1], codes[2], codes[3]),
                   hn::Repartition<uint8_t, decltype(di)>(), packed + (block + half) * 8);
      }
    }
  }
#endif
  // Leftover blocks (and narrow targets): widen to float, then the float kernel.
  HWY_ALIGN float chunk[128];
  while (block < blocks) {
    const size_t take = std::min<size_t>(8, blocks - block);
    Bf16ToFloat(input + block * 16, chunk, take * 16);
    EncodeNvfp4(tensor_scale, chunk, packed + block * 8, block_scales + block, take * 16);
    block += take;
  }
}

void DecodeNvfp4Bf16(float tensor_scale, const uint8_t* packed, const uint8_t* block_scales,
                     uint16_t* output, size_t count) {
  [[maybe_unused]] const Nvfp4Tag d;
  const size_t blocks = count / 16;
  size_t block = 0;
#if HWY_TARGET != HWY_SCALAR
  if (hn::Lanes(d) == 8) {
    const hn::RebindToSigned<decltype(d)> di;
    const hn::RebindToUnsigned<decltype(d)> du;
    const hn::Rebind<uint8_t, decltype(d)> d8;
    const hn::Repartition<uint16_t, decltype(d)> d16;
    const hn::Half<decltype(d16)> d16_half;
    constexpr ElementType kE4m3 = ElementType::fp8_e4m3;
    const auto tensor_scale_v = hn::Set(d, tensor_scale);
    // The eight FP4 magnitudes; a block's BF16 outputs are these times its scale, rounded.
    HWY_ALIGN static constexpr float kFp4Magnitudes[8] = {0.0f, 0.5f, 1.0f, 1.5f,
                                                          2.0f, 3.0f, 4.0f, 6.0f};
    const auto magnitudes = hn::Load(d, kFp4Magnitudes);
    // Streaming stores past the cache for large outputs, as memcpy does (16-byte halves:
    // the output is only as aligned as a BF16 array has to be).
    const bool stream = count * sizeof(uint16_t) >= kStreamMinBytes &&
                        reinterpret_cast<uintptr_t>(output) % 16 == 0;
    HWY_ALIGN float effective[8];
    for (; block + 8 <= blocks; block += 8) {
      const auto scale_code = hn::PromoteTo(di, hn::LoadU(d8, block_scales + block));
      hn::Store(hn::Mul(DecodeFp8Lanes<kE4m3>(d, scale_code), tensor_scale_v), d, effective);
      for (size_t b = 0; b < 8; ++b) {
        const float e = effective[b];
        const size_t at = (block + b) * 16;
        // The table needs a finite scale with no sign bit (then a code's sign is the
        // output's sign bit); other scales take the float kernel, below.
        if (!(std::bit_cast<uint32_t>(e) < 0x7F800000u)) {
          HWY_ALIGN float values[16];
          DecodeNvfp4(tensor_scale, packed + at / 2, block_scales + block + b, values, 16);
          FloatToBf16(values, output + at, 16);
          continue;
        }
        const auto products = hn::BitCast(du, hn::Mul(magnitudes, hn::Set(d, e)));
        const auto rounding =
            hn::Add(hn::Set(du, 0x7FFFu), hn::And(hn::ShiftRight<16>(products), hn::Set(du, 1u)));
        const auto table = hn::BitCast(di, hn::ShiftRight<16>(hn::Add(products, rounding)));
        const auto bytes = hn::PromoteTo(di, hn::LoadU(d8, packed + at / 2));
        const auto lookup = [&](hn::Vec<decltype(di)> nibble_magnitude) {
          return hn::TableLookupLanes(table, hn::IndicesFromVec(di, nibble_magnitude));
        };
        const auto even = hn::Or(lookup(hn::And(bytes, hn::Set(di, 7))),
                                 hn::ShiftLeft<12>(hn::And(bytes, hn::Set(di, 8))));
        const auto odd = hn::Or(lookup(hn::And(hn::ShiftRight<4>(bytes), hn::Set(di, 7))),
                                hn::ShiftLeft<8>(hn::And(bytes, hn::Set(di, 0x80))));
        const auto words = hn::BitCast(d16, hn::Or(even, hn::ShiftLeft<16>(odd)));
        if (stream) {
          hn::Stream(hn::LowerHalf(d16_half, words), d16_half, output + at);
          hn::Stream(hn::UpperHalf(d16_half, words), d16_half, output + at + 8);
        } else {
          hn::StoreU(words, d16, output + at);
        }
      }
    }
    if (stream) hwy::FlushStream();
  }
#endif
  HWY_ALIGN float chunk[128];
  while (block < blocks) {
    const size_t take = std::min<size_t>(8, blocks - block);
    DecodeNvfp4(tensor_scale, packed + block * 8, block_scales + block, chunk, take * 16);
    FloatToBf16(chunk, output + block * 16, take * 16);
    block += take;
  }
}

// ------------------------------------------------------------------ encode tallies
// What an encode did to each element, from its input and its code, as the analysis
// counts it: over finite inputs, codes of class NaN / inf / subnormal, zero codes of
// non-zero inputs, and the largest finite code for inputs past `limit`; plus the
// non-finite inputs. tallies = {saturated, became_nan, became_inf, flushed_to_zero,
// subnormal, nonfinite_input}. FP8 classes by magnitude code: 0 zero, 1 .. 2^M - 1
// subnormal, the largest finite code, then E5M2's inf (0x7C) and NaNs, E4M3's NaN (0x7F),
// FNUZ's NaN (0x80, whose magnitude bits are 0).
// Per-lane counters of the six tallies (int32 lanes).
template <class D>
struct TallyLanes {
  hn::Vec<D> saturated, nan, inf, flushed, subnormal, nonfinite;
  explicit TallyLanes(D di)
      : saturated(hn::Zero(di)),
        nan(hn::Zero(di)),
        inf(hn::Zero(di)),
        flushed(hn::Zero(di)),
        subnormal(hn::Zero(di)),
        nonfinite(hn::Zero(di)) {}
  template <class M>
  static hn::Vec<D> Count(D di, hn::Vec<D> acc, M mask) {
    return hn::Sub(acc, hn::VecFromMask(di, mask));  // a true lane is -1
  }
  void AddTo(D di, int64_t* tallies) const {
    const hn::Vec<D> all[6] = {saturated, nan, inf, flushed, subnormal, nonfinite};
    for (int i = 0; i < 6; ++i) tallies[i] += hn::GetLane(hn::SumOfLanes(di, all[i]));
  }
};

// Adds one vector of (input, code) pairs to the FP8 tallies (codes in int32 lanes).
template <ElementType kType, class D, class Lanes>
HWY_INLINE void TallyFp8Vector(D d, Lanes& acc, hn::Vec<D> v, hn::Vec<hn::RebindToSigned<D>> code,
                               hn::Vec<D> limit_v) {
  constexpr Fp8Constants k = fp8_constants(kType);
  const hn::RebindToSigned<D> di;
  const auto magnitude = hn::And(code, hn::Set(di, 0x7F));
  const auto finite = hn::RebindMask(di, hn::IsFinite(v));
  acc.nonfinite = Lanes::Count(di, acc.nonfinite, hn::Not(finite));
  auto nan = magnitude > hn::Set(di, k.max_code);
  auto zero = magnitude == hn::Zero(di);
  if constexpr (k.fnuz) {
    nan = code == hn::Set(di, 0x80);
    zero = code == hn::Zero(di);
  } else if constexpr (k.ieee_specials) {
    nan = magnitude > hn::Set(di, k.special_from);
    const auto inf = magnitude == hn::Set(di, k.special_from);
    acc.inf = Lanes::Count(di, acc.inf, hn::And(finite, inf));
  }
  acc.nan = Lanes::Count(di, acc.nan, hn::And(finite, nan));
  const auto nonzero_input = hn::RebindMask(di, hn::Ne(v, hn::Zero(d)));
  acc.flushed = Lanes::Count(di, acc.flushed, hn::And(finite, hn::And(zero, nonzero_input)));
  const auto subnormal =
      hn::And(magnitude > hn::Zero(di), magnitude < hn::Set(di, 1 << k.mantissa_bits));
  acc.subnormal = Lanes::Count(di, acc.subnormal, hn::And(finite, subnormal));
  const auto past_limit = hn::RebindMask(di, hn::Abs(v) > limit_v);
  acc.saturated =
      Lanes::Count(di, acc.saturated,
                   hn::And(finite, hn::And(magnitude == hn::Set(di, k.max_code), past_limit)));
}

// The scalar form of one (input, code) pair, for tails.
template <ElementType kType>
void TallyFp8Scalar(float v, int32_t code, float limit, int64_t* tallies) {
  constexpr Fp8Constants k = fp8_constants(kType);
  if (!std::isfinite(v)) {
    ++tallies[5];
    return;
  }
  const int32_t magnitude = code & 0x7F;
  const bool nan = k.fnuz ? code == 0x80
                          : (k.ieee_specials ? magnitude > k.special_from : magnitude > k.max_code);
  const bool zero = k.fnuz ? code == 0 : magnitude == 0;
  tallies[0] += magnitude == k.max_code && std::fabs(v) > limit;
  tallies[1] += nan;
  tallies[2] += k.ieee_specials && magnitude == k.special_from;
  tallies[3] += zero && v != 0.0f;
  tallies[4] += magnitude > 0 && magnitude < (1 << k.mantissa_bits);
}

// int32 lane counters are flushed to the totals at least this often (they cannot overflow).
constexpr size_t kTallyFlushElements = size_t(1) << 30;

void TallyFp8(ElementType type, float limit, const float* values, const uint8_t* codes,
              size_t count, int64_t* tallies) {
  WithFp8Type(type, [&](auto flavour) {
    constexpr ElementType kType = decltype(flavour)::value;
    const hn::ScalableTag<float> d;
    const hn::RebindToSigned<decltype(d)> di;
    const hn::Rebind<uint8_t, decltype(d)> d8;
    const size_t lanes = hn::Lanes(d);
    using Lanes = TallyLanes<decltype(di)>;
    const auto limit_v = hn::Set(d, limit);
    size_t i = 0;
    while (i + lanes <= count) {
      Lanes acc(di);
      const size_t end = std::min(count, i + kTallyFlushElements);
      for (; i + lanes <= end; i += lanes) {
        TallyFp8Vector<kType>(d, acc, hn::LoadU(d, values + i),
                              hn::PromoteTo(di, hn::LoadU(d8, codes + i)), limit_v);
      }
      acc.AddTo(di, tallies);
    }
    for (; i < count; ++i) TallyFp8Scalar<kType>(values[i], codes[i], limit, tallies);
  });
}

// EncodeFp8Float, TallyFp8 and DecodeFp8Float in one pass, the codes never leaving the
// registers: output[i] = decode(encode(input[i] / scale)) * scale, tallies as TallyFp8's.
void RoundTripFp8Float(ElementType type, Overflow overflow, float scale, const float* input,
                       float* output, size_t count, int64_t* tallies) {
  WithFp8Type(type, [&](auto flavour) {
    constexpr ElementType kType = decltype(flavour)::value;
    const hn::ScalableTag<float> d;
    const hn::RebindToSigned<decltype(d)> di;
    const size_t lanes = hn::Lanes(d);
    using Lanes = TallyLanes<decltype(di)>;
    const float limit = float(element_traits(kType).max_finite) * scale;
    const auto limit_v = hn::Set(d, limit), scale_v = hn::Set(d, scale);
    const auto overflow_code = hn::Set(di, fp8_overflow_code(kType, overflow));
    size_t i = 0;
    while (i + lanes <= count) {
      Lanes acc(di);
      const size_t end = std::min(count, i + kTallyFlushElements);
      for (; i + lanes <= end; i += lanes) {
        const auto v = hn::LoadU(d, input + i);
        // (EncodeFp8Lanes gives each lane its code byte, 0..255: what encode stores.)
        const auto code = EncodeFp8Lanes<kType>(d, hn::Div(v, scale_v), overflow_code);
        TallyFp8Vector<kType>(d, acc, v, code, limit_v);
        hn::StoreU(hn::Mul(DecodeFp8Lanes<kType>(d, code), scale_v), d, output + i);
      }
      acc.AddTo(di, tallies);
    }
    for (; i < count; ++i) {
      const uint32_t code = encode_element(type, input[i] / scale, overflow);
      TallyFp8Scalar<kType>(input[i], int32_t(code), limit, tallies);
      output[i] = decode_element(type, code) * scale;
    }
  });
}

// NVFP4: per block, the limit is 6 times the block's effective scale; FP4 magnitude
// codes 0 zero, 1 (0.5) subnormal, 7 (6.0) the largest.
void TallyNvfp4(float tensor_scale, const float* values, const uint8_t* packed,
                const uint8_t* block_scales, size_t count, int64_t* tallies) {
  const Nvfp4Tag d;
  const hn::RebindToSigned<decltype(d)> di;
  const hn::Rebind<uint8_t, decltype(d)> d8;
  const size_t lanes = hn::Lanes(d);
  using Lanes = TallyLanes<decltype(di)>;
  Lanes acc(di);
  const auto count_nibbles = [&](hn::Vec<decltype(d)> v, hn::Vec<decltype(di)> magnitude,
                                 hn::Vec<decltype(d)> limit) {
    const auto finite = hn::RebindMask(di, hn::IsFinite(v));
    acc.nonfinite = Lanes::Count(di, acc.nonfinite, hn::Not(finite));
    const auto nonzero_input = hn::RebindMask(di, hn::Ne(v, hn::Zero(d)));
    acc.flushed = Lanes::Count(di, acc.flushed,
                               hn::And(finite, hn::And(magnitude == hn::Zero(di), nonzero_input)));
    acc.subnormal = Lanes::Count(di, acc.subnormal, hn::And(finite, magnitude == hn::Set(di, 1)));
    const auto past_limit = hn::RebindMask(di, hn::Abs(v) > limit);
    acc.saturated = Lanes::Count(di, acc.saturated,
                                 hn::And(finite, hn::And(magnitude == hn::Set(di, 7), past_limit)));
  };
  for (size_t block = 0; block * 16 < count; ++block) {
    const float effective = E4m3Values()[block_scales[block]] * tensor_scale;
    const auto limit = hn::Set(d, 6.0f * effective);
    for (size_t j = 0; j < 16; j += 2 * lanes) {
      hn::Vec<decltype(d)> even, odd;
      hn::LoadInterleaved2(d, values + block * 16 + j, even, odd);
      const auto bytes = hn::PromoteTo(di, hn::LoadU(d8, packed + block * 8 + j / 2));
      count_nibbles(even, hn::And(bytes, hn::Set(di, 7)), limit);
      count_nibbles(odd, hn::And(hn::ShiftRight<4>(bytes), hn::Set(di, 7)), limit);
    }
  }
  acc.AddTo(di, tallies);  // 16 per block in 8+ lanes: far from overflowing per row call
}

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

const char* TargetName() {
  return hwy::TargetName(HWY_TARGET);
}

}  // namespace kvaudit::numerics::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "util/util.h"

namespace kvaudit::numerics {

HWY_EXPORT(EncodeFp8Float);
HWY_EXPORT(EncodeFp8Bf16);
HWY_EXPORT(DecodeFp8Float);
HWY_EXPORT(DecodeFp8Bf16);
HWY_EXPORT(Bf16ToFloat);
HWY_EXPORT(FloatToBf16);
HWY_EXPORT(EncodeNvfp4);
HWY_EXPORT(DecodeNvfp4);
HWY_EXPORT(EncodeNvfp4Bf16);
HWY_EXPORT(DecodeNvfp4Bf16);
HWY_EXPORT(TallyFp8);
HWY_EXPORT(RoundTripFp8Float);
HWY_EXPORT(TallyNvfp4);
HWY_EXPORT(FiniteAbsMax);
HWY_EXPORT(FiniteAbsMaxInto);
HWY_EXPORT(HadamardRows);
HWY_EXPORT(ErrorBlockSums);
HWY_EXPORT(TargetName);

namespace {
void require(bool condition, const char* what) {
  if (!condition) throw std::invalid_argument(std::string("numerics: ") + what);
}
// NVFP4 spans: n elements a multiple of 16, n / 2 packed bytes, n / 16 block scales.
void require_nvfp4_sizes(size_t n, size_t packed_bytes, size_t block_scales, const char* what) {
  if (n % 16 != 0 || packed_bytes < n / 2 || block_scales < n / 16) {
    throw std::invalid_argument(std::string("numerics: ") + what +
                                ": n must be a multiple of 16, with n / 2 packed bytes and "
                                "n / 16 block scales");
  }
}
}  // namespace

std::string simd_target_name() {
  return HWY_DYNAMIC_DISPATCH(TargetName)();
}

void encode_fp8(ElementType type, Overflow overflow, float scale, std::span<const float> input,
                std::span<uint8_t> codes) {
  require(is_fp8(type) && codes.size() >= input.size(), "encode_fp8: bad type or size");
  HWY_DYNAMIC_DISPATCH(EncodeFp8Float)
  (type, overflow, scale, input.data(), codes.data(), input.size());
}
void encode_fp8_from_bf16(ElementType type, Overflow overflow, float scale,
                          std::span<const uint16_t> input, std::span<uint8_t> codes) {
  require(is_fp8(type) && codes.size() >= input.size(), "encode_fp8_from_bf16: bad type or size");
  HWY_DYNAMIC_DISPATCH(EncodeFp8Bf16)
  (type, overflow, scale, input.data(), codes.data(), input.size());
}
void decode_fp8(ElementType type, float scale, std::span<const uint8_t> codes,
                std::span<float> output) {
  require(is_fp8(type) && output.size() >= codes.size(), "decode_fp8: bad type or size");
  HWY_DYNAMIC_DISPATCH(DecodeFp8Float)(type, scale, codes.data(), output.data(), codes.size());
}
void decode_fp8_to_bf16(ElementType type, float scale, std::span<const uint8_t> codes,
                        std::span<uint16_t> output) {
  require(is_fp8(type) && output.size() >= codes.size(), "decode_fp8_to_bf16: bad type or size");
  HWY_DYNAMIC_DISPATCH(DecodeFp8Bf16)(type, scale, codes.data(), output.data(), codes.size());
}
void bf16_to_float_bulk(std::span<const uint16_t> input, std::span<float> output) {
  require(output.size() >= input.size(), "bf16_to_float_bulk: output too small");
  HWY_DYNAMIC_DISPATCH(Bf16ToFloat)(input.data(), output.data(), input.size());
}
void float_to_bf16_bulk(std::span<const float> input, std::span<uint16_t> output) {
  require(output.size() >= input.size(), "float_to_bf16_bulk: output too small");
  HWY_DYNAMIC_DISPATCH(FloatToBf16)(input.data(), output.data(), input.size());
}

void encode_nvfp4(float tensor_scale, std::span<const float> input, std::span<uint8_t> packed,
                  std::span<uint8_t> block_scales) {
  const size_t n = input.size();
  require_nvfp4_sizes(n, packed.size(), block_scales.size(), "encode_nvfp4");
  HWY_DYNAMIC_DISPATCH(EncodeNvfp4)
  (tensor_scale, input.data(), packed.data(), block_scales.data(), n);
}
void decode_nvfp4(float tensor_scale, std::span<const uint8_t> packed,
                  std::span<const uint8_t> block_scales, std::span<float> output) {
  const size_t n = output.size();
  require_nvfp4_sizes(n, packed.size(), block_scales.size(), "decode_nvfp4");
  HWY_DYNAMIC_DISPATCH(DecodeNvfp4)
  (tensor_scale, packed.data(), block_scales.data(), output.data(), n);
}

void encode_nvfp4_from_bf16(float tensor_scale, std::span<const uint16_t> input,
                            std::span<uint8_t> packed, std::span<uint8_t> block_scales) {
  const size_t n = input.size();
  require_nvfp4_sizes(n, packed.size(), block_scales.size(), "encode_nvfp4_from_bf16");
  HWY_DYNAMIC_DISPATCH(EncodeNvfp4Bf16)
  (tensor_scale, input.data(), packed.data(), block_scales.data(), n);
}
void decode_nvfp4_to_bf16(float tensor_scale, std::span<const uint8_t> packed,
                          std::span<const uint8_t> block_scales, std::span<uint16_t> output) {
  const size_t n = output.size();
  require_nvfp4_sizes(n, packed.size(), block_scales.size(), "decode_nvfp4_to_bf16");
  HWY_DYNAMIC_DISPATCH(DecodeNvfp4Bf16)
  (tensor_scale, packed.data(), block_scales.data(), output.data(), n);
}

namespace {
void add_tallies(const int64_t* tallies, int64_t elements, EncodeCounts& counts) {
  counts.elements += elements;
  counts.saturated += tallies[0];
  counts.became_nan += tallies[1];
  counts.became_inf += tallies[2];
  counts.flushed_to_zero += tallies[3];
  counts.subnormal += tallies[4];
  counts.nonfinite_input += tallies[5];
}
}  // namespace

void tally_fp8(ElementType type, float scale, std::span<const float> values,
               std::span<const uint8_t> codes, EncodeCounts& counts) {
  require(is_fp8(type) && codes.size() >= values.size(), "tally_fp8: bad type or size");
  const float limit = float(element_traits(type).max_finite) * scale;
  int64_t tallies[6] = {};
  HWY_DYNAMIC_DISPATCH(TallyFp8)(type, limit, values.data(), codes.data(), values.size(), tallies);
  add_tallies(tallies, int64_t(values.size()), counts);
}

void round_trip_fp8(ElementType type, Overflow overflow, float scale, std::span<const float> input,
                    std::span<float> output, EncodeCounts& counts) {
  require(is_fp8(type) && output.size() >= input.size(), "round_trip_fp8: bad type or size");
  int64_t tallies[6] = {};
  HWY_DYNAMIC_DISPATCH(RoundTripFp8Float)
  (type, overflow, scale, input.data(), output.data(), input.size(), tallies);
  add_tallies(tallies, int64_t(input.size()), counts);
}

void tally_nvfp4(float tensor_scale, std::span<const float> values, std::span<const uint8_t> packed,
                 std::span<const uint8_t> block_scales, EncodeCounts& counts) {
  const size_t n = values.size();
  require_nvfp4_sizes(n, packed.size(), block_scales.size(), "tally_nvfp4");
  int64_t tallies[6] = {};
  HWY_DYNAMIC_DISPATCH(TallyNvfp4)
  (tensor_scale, values.data(), packed.data(), block_scales.data(), n, tallies);
  add_tallies(tallies, int64_t(n), counts);
}

float finite_abs_max(std::span<const float> values) {
  return HWY_DYNAMIC_DISPATCH(FiniteAbsMax)(values.data(), values.size());
}
void finite_abs_max_into(std::span<const float> values, std::span<float> amax) {
  require(amax.size() >= values.size(), "finite_abs_max_into: amax too small");
  HWY_DYNAMIC_DISPATCH(FiniteAbsMaxInto)(values.data(), amax.data(), values.size());
}

void encode_nvfp4_reference(float tensor_scale, std::span<const float> input,
                            std::span<uint8_t> packed, std::span<uint8_t> block_scales) {
  const size_t n = input.size();
  require_nvfp4_sizes(n, packed.size(), block_scales.size(), "encode_nvfp4_reference");
  for (size_t block = 0; block < n / 16; ++block) {
    float amax = 0.0f;
    for (size_t j = 0; j < 16; ++j) amax = std::max(amax, std::fabs(input[block * 16 + j]));
    // Block scale: the block's amax maps onto FP4's largest magnitude (6), stored as E4M3
    // relative to the FP32 tensor scale (NVIDIA's two-level NVFP4 recipe).
    const uint8_t scale_code = float_to_fp8_e4m3(amax / 6.0f / tensor_scale, Overflow::saturate);
    block_scales[block] = scale_code;
    const float effective = fp8_e4m3_to_float(scale_code) * tensor_scale;
    for (size_t j = 0; j < 16; j += 2) {
      uint8_t low = 0, high = 0;
      if (effective > 0.0f && std::isfinite(effective)) {
        low = float_to_fp4_e2m1(input[block * 16 + j] / effective);
        high = float_to_fp4_e2m1(input[block * 16 + j + 1] / effective);
      }
      packed[(block * 16 + j) / 2] = uint8_t(low | (high << 4));
    }
  }
}

void decode_nvfp4_reference(float tensor_scale, std::span<const uint8_t> packed,
                            std::span<const uint8_t> block_scales, std::span<float> output) {
  const size_t n = output.size();
  require_nvfp4_sizes(n, packed.size(), block_scales.size(), "decode_nvfp4_reference");
  for (size_t i = 0; i < n; ++i) {
    const float effective = fp8_e4m3_to_float(block_scales[i / 16]) * tensor_scale;
    const uint8_t byte = packed[i / 2];
    output[i] = fp4_e2m1_to_float(i % 2 == 0 ? byte & 0xF : byte >> 4) * effective;
  }
}

void hadamard_rows(std::span<float> data, int width) {
  require(width > 0 && (width & (width - 1)) == 0, "hadamard_rows: width must be a power of two");
  HWY_DYNAMIC_DISPATCH(HadamardRows)(data.data(), data.size(), size_t(width));
}

void ErrorStats::add(std::span<const float> reference, std::span<const float> decoded) {
  const size_t n = std::min(reference.size(), decoded.size());
  // Plain sums within a block of 256, compensated sums across blocks.
  constexpr size_t kBlock = 256;
  for (size_t begin = 0; begin < n; begin += kBlock) {
    const size_t size = std::min(n - begin, kBlock);
    double sums[4];
    HWY_DYNAMIC_DISPATCH(ErrorBlockSums)
    (reference.data() + begin, decoded.data() + begin, size, sums);
    const auto finite = int64_t(sums[2]);
    sum_squared_error.add(sums[0]);
    sum_squared_reference.add(sums[1]);
    max_abs_error = std::max(max_abs_error, sums[3]);
    count += finite;
    nonfinite += int64_t(size) - finite;
  }
}

}  // namespace kvaudit::numerics
#endif  // HWY_ONCE
