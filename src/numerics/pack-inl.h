// Helpers shared by the codec kernels (fp8-inl.h, nvfp4-inl.h): packing int32 / 16-bit
// lanes into whole byte or BF16 vectors, and whole-vector stores that stream past the cache.
#if defined(KVAUDIT_NUMERICS_PACK_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVAUDIT_NUMERICS_PACK_INL_H_
#undef KVAUDIT_NUMERICS_PACK_INL_H_
#else
#define KVAUDIT_NUMERICS_PACK_INL_H_
#endif

#include <cstddef>
#include <cstdint>

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace kvaudit::numerics::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET != HWY_SCALAR
// Packs four vectors of codes (int32 lanes holding 0..255) into one whole byte vector, in
// order. AVX2 does it in four instructions; the generic form demotes and combines halves.
template <class D>
HWY_INLINE hn::Vec<hn::Repartition<uint8_t, D>> PackCodes([[maybe_unused]] D d, hn::Vec<D> c0,
                                                          hn::Vec<D> c1, hn::Vec<D> c2,
                                                          hn::Vec<D> c3) {
  const hn::Repartition<uint8_t, D> d8_full;
#if HWY_TARGET == HWY_AVX2
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
HWY_INLINE hn::Vec<hn::Repartition<uint16_t, D>> PackBf16([[maybe_unused]] D d, hn::Vec<D> b0,
                                                          hn::Vec<D> b1) {
  const hn::Repartition<uint16_t, D> d16_full;
#if HWY_TARGET == HWY_AVX2
  const __m256i words = _mm256_packus_epi32(b0.raw, b1.raw);  // b0[0..3] b1[0..3] | b0[4..7] ..
  return hn::Vec<decltype(d16_full)>{_mm256_permute4x64_epi64(words, 0xD8)};
#else
  const hn::Rebind<uint16_t, D> d16;
  return hn::Combine(d16_full, hn::DemoteTo(d16, b1), hn::DemoteTo(d16, b0));
#endif
}

// Packs two vectors of 16-bit lanes holding 0..255 into one whole byte vector, in order.
template <class D>
HWY_INLINE hn::Vec<hn::Repartition<uint8_t, D>> PackWords([[maybe_unused]] D d, hn::Vec<D> w0,
                                                          hn::Vec<D> w1) {
  const hn::Repartition<uint8_t, D> d8_full;
#if HWY_TARGET == HWY_AVX2
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

// Outputs at least this large bypass the cache (streaming stores), as memcpy does for
// large copies: they would only evict the input, and nothing reads them back soon.
constexpr size_t kStreamMinBytes = size_t(4) << 20;

}  // namespace kvaudit::numerics::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard toggle
