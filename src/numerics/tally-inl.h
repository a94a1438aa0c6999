// Encode-tally SIMD kernels: what an FP8 or NVFP4 encode did to each element (saturated,
// NaN, inf, flushed, subnormal), counted in vector lanes; per target via kernels.cpp.
#if defined(KVAUDIT_NUMERICS_TALLY_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVAUDIT_NUMERICS_TALLY_INL_H_
#undef KVAUDIT_NUMERICS_TALLY_INL_H_
#else
#define KVAUDIT_NUMERICS_TALLY_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "hwy/highway.h"
#include "numerics/fp8-inl.h"
#include "numerics/numerics.h"
#include "numerics/nvfp4-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvaudit::numerics::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

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

}  // namespace kvaudit::numerics::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard toggle
