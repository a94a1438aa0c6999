// NVFP4 SIMD kernels: FP4 E2M1 lane encode / decode, the block amax and scales, and the
// float and BF16 encode / decode loops; per target via kernels.cpp, bit-identical to scalar.cpp.
#if defined(KVAUDIT_NUMERICS_NVFP4_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVAUDIT_NUMERICS_NVFP4_INL_H_
#undef KVAUDIT_NUMERICS_NVFP4_INL_H_
#else
#define KVAUDIT_NUMERICS_NVFP4_INL_H_
#endif

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "numerics/bf16-inl.h"
#include "numerics/fp8-inl.h"
#include "numerics/numerics.h"
#include "numerics/pack-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvaudit::numerics::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

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

}  // namespace kvaudit::numerics::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard toggle
