// Bulk codec kernels: FP8 (from float or BF16, to float or BF16), BF16, NVFP4 and the
// Walsh-Hadamard rotation. Compiled for every Highway target and dispatched at run time;
// the scalar references in scalar.cpp (and encode_nvfp4_reference below) define the
// results, and tests/numerics compare every path against them bit for bit.
#include <algorithm>
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
  const hn::ScalableTag<float> d;
  const hn::Rebind<uint8_t, decltype(d)> d8;
  const size_t lanes = hn::Lanes(d);
  const Fp8Constants k = fp8_constants(type, overflow);
  const auto scale_v = hn::Set(d, scale);
  size_t i = 0;
  for (; i + lanes <= count; i += lanes) {
    const auto y = hn::Div(hn::LoadU(d, input + i), scale_v);
    hn::StoreU(hn::DemoteTo(d8, EncodeFp8Lanes(d, y, k)), d8, codes + i);
  }
  for (; i < count; ++i) codes[i] = uint8_t(encode_element(type, input[i] / scale, overflow));
}

// Outputs at least this large bypass the cache (streaming stores), as memcpy does for
// large copies: they would only evict the input, and nothing reads them back soon.
constexpr size_t kStreamMinBytes = size_t(4) << 20;

void EncodeFp8Bf16(ElementType type, Overflow overflow, float scale, const uint16_t* input,
                   uint8_t* codes, size_t count) {
  const hn::ScalableTag<float> d;
  [[maybe_unused]] const hn::RebindToSigned<decltype(d)> di;
  const hn::RebindToUnsigned<decltype(d)> du;
  const hn::Rebind<uint16_t, decltype(d)> d16;
  const hn::Rebind<uint8_t, decltype(d)> d8;
  const size_t lanes = hn::Lanes(d);
  const Fp8Constants k = fp8_constants(type, overflow);
  const auto scale_v = hn::Set(d, scale);
  const auto encode = [&](size_t at) {
    const auto x = hn::BitCast(d, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(d16, input + at))));
    return EncodeFp8Lanes(d, hn::Div(x, scale_v), k);
  };
  const auto encode_one = [&](size_t at) {
    codes[at] = uint8_t(encode_element(type, bf16_to_float(input[at]) / scale, overflow));
  };
  size_t i = 0;
#if HWY_TARGET != HWY_SCALAR
  // Four vectors of codes fill one whole byte vector: stored whole, and streaming (aligned)
  // when the output is large.
  const hn::Repartition<uint8_t, decltype(di)> d8_full;
  const size_t full = hn::Lanes(d8_full);
  const bool stream = count >= kStreamMinBytes;
  if (stream) {
    for (; i < count && reinterpret_cast<uintptr_t>(codes + i) % full != 0; ++i) encode_one(i);
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
}

void DecodeFp8Float(ElementType type, float scale, const uint8_t* codes, float* output,
                    size_t count) {
  const hn::ScalableTag<float> d;
  const hn::RebindToSigned<decltype(d)> di;
  const hn::Rebind<uint8_t, decltype(d)> d8;
  const size_t lanes = hn::Lanes(d);
  const Fp8Constants k = fp8_constants(type, Overflow::saturate);
  const auto scale_v = hn::Set(d, scale);
  size_t i = 0;
  for (; i + lanes <= count; i += lanes) {
    const auto code = hn::PromoteTo(di, hn::LoadU(d8, codes + i));
    hn::StoreU(hn::Mul(DecodeFp8Lanes(d, code, k), scale_v), d, output + i);
  }
  for (; i < count; ++i) output[i] = decode_element(type, codes[i]) * scale;
}

void DecodeFp8Bf16(ElementType type, float scale, const uint8_t* codes, uint16_t* output,
                   size_t count) {
  const hn::ScalableTag<float> d;
  const hn::RebindToSigned<decltype(d)> di;
  const hn::Rebind<uint8_t, decltype(d)> d8;
  const hn::Rebind<uint16_t, decltype(d)> d16;
  const size_t lanes = hn::Lanes(d);
  const Fp8Constants k = fp8_constants(type, Overflow::saturate);
  const auto scale_v = hn::Set(d, scale);
  const auto decode = [&](size_t at) {
    const auto code = hn::PromoteTo(di, hn::LoadU(d8, codes + at));
    return FloatToBf16Lanes(d, hn::Mul(DecodeFp8Lanes(d, code, k), scale_v));
  };
  const auto decode_one = [&](size_t at) {
    output[at] = float_to_bf16(decode_element(type, codes[at]) * scale);
  };
  size_t i = 0;
#if HWY_TARGET != HWY_SCALAR
  // Two vectors of BF16 fill one whole vector: stored whole, and streaming (aligned) when
  // the output is large.
  const hn::Repartition<uint16_t, decltype(di)> d16_full;
  const size_t full = hn::Lanes(d16_full);
  const bool stream = count * sizeof(uint16_t) >= kStreamMinBytes;
  if (stream) {
    for (; i < count && reinterpret_cast<uintptr_t>(output + i) % (full * 2) != 0; ++i) {
      decode_one(i);
    }
  }
  for (; i + full <= count; i += full) {
    StoreWhole(PackBf16(di, decode(i), decode(i + lanes)), d16_full, output + i, stream);
  }
  if (stream) hwy::FlushStream();
#endif
  for (; i + lanes <= count; i += lanes) hn::StoreU(hn::DemoteTo(d16, decode(i)), d16, output + i);
  for (; i < count; ++i) decode_one(i);
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
// At most 8 lanes, so one LoadInterleaved2 covers exactly one 16-element block (or half of
// one on 4-lane targets).
using Nvfp4Tag = hn::CappedTag<float, 8>;

template <class D>
HWY_INLINE hn::Vec<hn::RebindToSigned<D>> EncodeFp4Lanes(D d, hn::Vec<D> y) {
  const hn::RebindToSigned<D> di;
  const auto magnitude = hn::Abs(y);
  auto code = hn::Zero(di);
  // Midpoints between neighbouring magnitudes {0,.5,1,1.5,2,3,4,6}; at a tie the even code
  // wins, hence > or >= per boundary. A true mask is all ones (-1): subtracting counts it.
  const auto count = [&](auto mask) {
    code = hn::Sub(code, hn::VecFromMask(di, hn::RebindMask(di, mask)));
  };
  count(magnitude > hn::Set(d, 0.25f));
  count(magnitude >= hn::Set(d, 0.75f));
  count(magnitude > hn::Set(d, 1.25f));
  count(magnitude >= hn::Set(d, 1.75f));
  count(magnitude > hn::Set(d, 2.5f));
  count(magnitude >= hn::Set(d, 3.5f));
  count(magnitude > hn::Set(d, 5.0f));
  const auto negative =
      hn::AndNot(hn::IsNaN(y), hn::RebindMask(d, hn::BitCast(di, y) < hn::Zero(di)));
  return hn::IfThenElse(hn::RebindMask(di, negative), hn::Or(code, hn::Set(di, 8)), code);
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
  const Fp8Constants e4m3 = fp8_constants(ElementType::fp8_e4m3, Overflow::saturate);
  const auto six = hn::Set(d, 6.0f), tensor_scale_v = hn::Set(d, tensor_scale);
  HWY_ALIGN float amax[kGroup];
  HWY_ALIGN float effective[kGroup];
  size_t block = 0;
  for (; block + kGroup <= blocks; block += kGroup) {
    const float* x = input + block * 16;
    for (size_t b = 0; b < kGroup; ++b) amax[b] = Nvfp4BlockAmax(d, x + b * 16);
    for (size_t b = 0; b < kGroup; b += lanes) {
      const auto y = hn::Div(hn::Div(hn::Load(d, amax + b), six), tensor_scale_v);
      const auto code = EncodeFp8Lanes(d, y, e4m3);
      hn::StoreU(hn::DemoteTo(d8, code), d8, block_scales + block + b);
      hn::Store(hn::Mul(DecodeFp8Lanes(d, code, e4m3), tensor_scale_v), d, effective + b);
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
    const float effective = fp8_e4m3_to_float(block_scales[block]) * tensor_scale;
    const auto scale_v = hn::Set(d, effective);
    for (size_t j = 0; j < 16; j += 2 * lanes) {
      const auto bytes = hn::PromoteTo(di, hn::LoadU(d8, packed + block * 8 + j / 2));
      const auto low = hn::Mul(DecodeFp4Lanes(d, hn::And(bytes, hn::Set(di, 15))), scale_v);
      const auto high = hn::Mul(DecodeFp4Lanes(d, hn::ShiftRight<4>(bytes)), scale_v);
      hn::StoreInterleaved2(low, high, d, output + block * 16 + j);
    }
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
  const auto one = hn::Set(d, 1.0);
  size_t i = 0;
  for (; i + lanes <= count; i += lanes) {
    const auto r = hn::PromoteTo(d, hn::LoadU(df, reference + i));
    const auto x = hn::PromoteTo(d, hn::LoadU(df, decoded + i));
    const auto ok = hn::And(hn::IsFinite(r), hn::IsFinite(x));
    const auto e = hn::IfThenElseZero(ok, hn::Sub(x, r));
    const auto r_ok = hn::IfThenElseZero(ok, r);
    error_sq = hn::MulAdd(e, e, error_sq);
    reference_sq = hn::MulAdd(r_ok, r_ok, reference_sq);
    max_error = hn::Max(max_error, hn::Abs(e));
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
HWY_EXPORT(HadamardRows);
HWY_EXPORT(ErrorBlockSums);
HWY_EXPORT(TargetName);

namespace {
void require(bool condition, const char* what) {
  if (!condition) throw std::invalid_argument(std::string("numerics: ") + what);
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
  require(n % 16 == 0 && packed.size() >= n / 2 && block_scales.size() >= n / 16,
          "encode_nvfp4: n must be a multiple of 16 and outputs large enough");
  HWY_DYNAMIC_DISPATCH(EncodeNvfp4)
  (tensor_scale, input.data(), packed.data(), block_scales.data(), n);
}
void decode_nvfp4(float tensor_scale, std::span<const uint8_t> packed,
                  std::span<const uint8_t> block_scales, std::span<float> output) {
  const size_t n = output.size();
  require(n % 16 == 0 && packed.size() >= n / 2 && block_scales.size() >= n / 16,
          "decode_nvfp4: n must be a multiple of 16 and inputs large enough");
  HWY_DYNAMIC_DISPATCH(DecodeNvfp4)
  (tensor_scale, packed.data(), block_scales.data(), output.data(), n);
}

void encode_nvfp4_reference(float tensor_scale, std::span<const float> input,
                            std::span<uint8_t> packed, std::span<uint8_t> block_scales) {
  const size_t n = input.size();
  require(n % 16 == 0 && packed.size() >= n / 2 && block_scales.size() >= n / 16,
          "encode_nvfp4_reference: bad sizes");
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
  require(n % 16 == 0 && packed.size() >= n / 2 && block_scales.size() >= n / 16,
          "decode_nvfp4_reference: bad sizes");
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
