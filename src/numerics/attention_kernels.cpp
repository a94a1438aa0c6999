// Blocked SIMD kernels for attention-error analysis: scores = Q K^T, out += P V, and a
// vectorised exp-and-sum. Register tiles of 4 queries x 3 vectors keep the FMA units busy
// (12 accumulators, 7 loads per 12 FMAs); K is transposed per block so both GEMMs stream
// contiguous rows. Results are deterministic: the reduction order over the head dimension
// and over keys is fixed and independent of the thread count.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "numerics/attention_kernels.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "hwy/cache_control.h"
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"
#include "numerics/numerics.h"

// Fully unrolled loops over register tiles; without it GCC keeps the accumulator arrays in
// memory (a store per accumulator per step).
#ifndef KV_UNROLL
#define KV_UNROLL _Pragma("GCC unroll 16")
#endif

HWY_BEFORE_NAMESPACE();
namespace kvaudit::numerics::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// a * b + c rounded exactly as hn::MulAdd rounds it on this target (one rounding where the
// target has FMA), so the scalar leftovers of a tiled loop give the bits its vector lanes
// would: which queries/keys are leftovers depends on the block sizes a caller picks, and
// results must not.
HWY_INLINE float ScalarMulAdd(float a, float b, float c) {
  const hn::CappedTag<float, 1> d1;
  return hn::GetLane(hn::MulAdd(hn::Set(d1, a), hn::Set(d1, b), hn::Set(d1, c)));
}

// dst[c * dst_stride + r] = src[r * src_stride + c] for an 8 x 8 block; false where this
// target has no fast form (the caller then copies element by element). The scalar copy was
// a quarter of a sweep's scoring time.
HWY_INLINE bool Transpose8x8(const float* HWY_RESTRICT src, size_t src_stride,
                             float* HWY_RESTRICT dst, size_t dst_stride) {
#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * src_stride);
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    r[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  // r[0..3] hold columns 0..3 of rows 0-3 (low half) and 4-7 of them (high half); r[4..7]
  // the same for rows 4-7. Columns c and c + 4 come from swapping 128-bit halves.
  for (int c = 0; c < 4; ++c) {
    _mm256_storeu_ps(dst + c * dst_stride, _mm256_permute2f128_ps(r[c], r[c + 4], 0x20));
    _mm256_storeu_ps(dst + (c + 4) * dst_stride, _mm256_permute2f128_ps(r[c], r[c + 4], 0x31));
  }
  return true;
#else
  (void)src;
  (void)src_stride;
  (void)dst;
  (void)dst_stride;
  return false;
#endif
}

// Register tiles: kQ query rows x kV vectors, the accumulators held in registers for the
// whole reduction (4 x 3 on AVX2: 12 accumulators, enough to cover FMA latency, plus 3
// loaded vectors and a broadcast in the 16 registers). Every output element is summed over
// the same index in the same order whatever tile computes it, so tile shapes and leftovers
// give identical bits.
// acc[i][v] += sum over k ascending of a[i * a_stride + k] * b[k * b_stride + v * lanes]:
// the one inner loop of both attention products.
template <int kQ, int kV, class D>
HWY_INLINE void MulAddTile(D d, const float* a, size_t a_stride, const float* b, size_t b_stride,
                           size_t steps, hn::Vec<D> (&acc)[kQ][kV]) {
  using V = hn::Vec<D>;
  const size_t lanes = hn::Lanes(d);
  for (size_t k = 0; k < steps; ++k) {
    V row[kV];
    KV_UNROLL for (int v = 0; v < kV; ++v) row[v] = hn::LoadU(d, b + k * b_stride + v * lanes);
    KV_UNROLL for (int i = 0; i < kQ; ++i) {
      const V broadcast = hn::Set(d, a[i * a_stride + k]);
      KV_UNROLL for (int v = 0; v < kV; ++v) acc[i][v] = hn::MulAdd(broadcast, row[v], acc[i][v]);
    }
  }
}

// Calls tile(count, at) for tiles of 3, then 2, then 1 vectors covering [0, end) (end a
// multiple of the vector length); count is a std::integral_constant.
template <class D, class Tile>
HWY_INLINE void ForVectorTiles(D d, size_t end, const Tile& tile) {
  const size_t lanes = hn::Lanes(d);
  size_t at = 0;
  for (; at + 3 * lanes <= end; at += 3 * lanes) tile(std::integral_constant<int, 3>(), at);
  for (; at + 2 * lanes <= end; at += 2 * lanes) tile(std::integral_constant<int, 2>(), at);
  for (; at + lanes <= end; at += lanes) tile(std::integral_constant<int, 1>(), at);
}

// Scores of kQ query rows against kV vectors of transposed keys starting at key j.
template <int kQ, int kV, class D>
HWY_INLINE void ScoreTile(D d, const float* queries, size_t q_stride, const float* kt, size_t ld,
                          size_t dim, hn::Vec<D> scale_v, float* scores, size_t nk, size_t j) {
  const size_t lanes = hn::Lanes(d);
  hn::Vec<D> acc[kQ][kV];
  KV_UNROLL for (int i = 0; i < kQ; ++i) KV_UNROLL for (int v = 0; v < kV; ++v) acc[i][v] =
      hn::Zero(d);
  MulAddTile<kQ, kV>(d, queries, q_stride, kt + j, ld, dim, acc);
  KV_UNROLL for (int i = 0; i < kQ; ++i) KV_UNROLL for (int v = 0; v < kV; ++v)
      hn::StoreU(hn::Mul(acc[i][v], scale_v), d, scores + i * nk + j + v * lanes);
}

// scores[q * nk + j] = scale * sum_d queries[q * d_stride + d] * keys[j * key_stride + d]
void ScoreBlock(const float* queries, size_t nq, size_t q_stride, const float* keys, size_t nk,
                size_t key_stride, size_t dim, float scale, float* scores) {
  const hn::ScalableTag<float> d;
  const size_t lanes = hn::Lanes(d);
  // Keys covered by whole vectors (and by whole 8 x 8 transposes, lanes dividing 8 or 8
  // dividing lanes); the rest are scalar dot products.
  const size_t nk_vector = nk / std::max<size_t>(lanes, 8) * std::max<size_t>(lanes, 8);
  // keys^T for the vector part: [dim][ld], transposed in 8 x 8 tiles. The row pitch ld is
  // padded off a power of two so columns do not all land in one L1 set.
  const size_t ld = nk_vector + 8;
  thread_local std::vector<float> transposed;
  transposed.resize(dim * ld);
  for (size_t j0 = 0; j0 < nk_vector; j0 += 8) {
    // The next 8 key rows (a page apart each), ahead of their transposes.
    if (j0 + 16 <= nk_vector) {
      for (size_t j = j0 + 8; j < j0 + 16; ++j) {
        for (size_t k = 0; k < dim; k += 16) hwy::Prefetch(keys + j * key_stride + k);
      }
    }
    for (size_t k0 = 0; k0 < dim; k0 += 8) {
      const size_t k_end = std::min(dim, k0 + 8);
      if (k_end - k0 == 8 && j0 + 8 <= nk_vector &&
          Transpose8x8(keys + j0 * key_stride + k0, key_stride, transposed.data() + k0 * ld + j0,
                       ld)) {
        continue;
      }
      for (size_t j = j0; j < j0 + 8 && j < nk_vector; ++j) {
        const float* row = keys + j * key_stride;
        for (size_t k = k0; k < k_end; ++k) transposed[k * ld + j] = row[k];
      }
    }
  }
  // Key tiles outer, query rows inner: a tile's transposed keys (dim x 3 vectors) stay in
  // L1 while every query passes over them; the queries stream in order.
  const auto scale_v = hn::Set(d, scale);
  ForVectorTiles(d, nk_vector, [&](auto count, size_t j) {
    constexpr int kV = decltype(count)::value;
    size_t q = 0;
    for (; q + 4 <= nq; q += 4) {
      ScoreTile<4, kV>(d, queries + q * q_stride, q_stride, transposed.data(), ld, dim, scale_v,
                       scores + q * nk, nk, j);
    }
    for (; q < nq; ++q) {
      ScoreTile<1, kV>(d, queries + q * q_stride, q_stride, transposed.data(), ld, dim, scale_v,
                       scores + q * nk, nk, j);
    }
  });
  // Leftover keys: plain dot products in the same k order as the tiles.
  for (size_t qi = 0; qi < nq; ++qi) {
    for (size_t j = nk_vector; j < nk; ++j) {
      float sum = 0.0f;
      for (size_t k = 0; k < dim; ++k)
        sum = ScalarMulAdd(queries[qi * q_stride + k], keys[j * key_stride + k], sum);
      scores[qi * nk + j] = sum * scale;
    }
  }
}

// Adds kQ query rows of weights times kV vectors of packed value columns starting at c.
template <int kQ, int kV, class D>
HWY_INLINE void AccumulateTile(D d, const float* weights, size_t nk, const float* packed,
                               size_t pitch, float* out, size_t out_stride, size_t c) {
  const size_t lanes = hn::Lanes(d);
  hn::Vec<D> acc[kQ][kV];
  KV_UNROLL for (int i = 0; i < kQ; ++i) KV_UNROLL for (int v = 0; v < kV; ++v) acc[i][v] =
      hn::LoadU(d, out + i * out_stride + c + v * lanes);
  MulAddTile<kQ, kV>(d, weights, nk, packed + c, pitch, nk, acc);
  KV_UNROLL for (int i = 0; i < kQ; ++i) KV_UNROLL for (int v = 0; v < kV; ++v)
      hn::StoreU(acc[i][v], d, out + i * out_stride + c + v * lanes);
}

// out[q * out_stride + c] += sum_j weights[q * nk + j] * values[j * value_stride + c]
void AccumulateWeighted(const float* weights, size_t nq, size_t nk, const float* values,
                        size_t value_stride, size_t dim, float* out, size_t out_stride) {
  const hn::ScalableTag<float> d;
  const size_t lanes = hn::Lanes(d);
  const size_t dim_vector = dim / lanes * lanes;
  // Pack the value rows contiguously with a padded pitch: the head slices of a KV row are
  // a power-of-two apart, which would put every row of a column tile in one L1 set.
  const size_t pitch = dim_vector + 8;
  thread_local std::vector<float> packed;
  packed.resize(nk * pitch);
  // The rows are a page apart: prefetching a few rows ahead hides the page walks and the
  // prefetcher's restart on every row.
  constexpr size_t kAhead = 6;
  for (size_t j = 0; j < nk; ++j) {
    if (j + kAhead < nk) {
      const float* ahead = values + (j + kAhead) * value_stride;
      for (size_t c = 0; c < dim_vector; c += 16) hwy::Prefetch(ahead + c);
    }
    std::copy_n(values + j * value_stride, dim_vector, packed.data() + j * pitch);
  }
  // Column tiles outer, query rows inner: a tile's packed values (keys x 3 vectors) stay
  // in L1 while every query's weights pass over them.
  ForVectorTiles(d, dim_vector, [&](auto count, size_t c) {
    constexpr int kV = decltype(count)::value;
    size_t q = 0;
    for (; q + 4 <= nq; q += 4) {
      AccumulateTile<4, kV>(d, weights + q * nk, nk, packed.data(), pitch, out + q * out_stride,
                            out_stride, c);
    }
    for (; q < nq; ++q) {
      AccumulateTile<1, kV>(d, weights + q * nk, nk, packed.data(), pitch, out + q * out_stride,
                            out_stride, c);
    }
  });
  // Leftover columns: the same j order as the tiles.
  for (size_t qi = 0; qi < nq; ++qi) {
    for (size_t c = dim_vector; c < dim; ++c) {
      float sum = out[qi * out_stride + c];
      for (size_t j = 0; j < nk; ++j)
        sum = ScalarMulAdd(weights[qi * nk + j], values[j * value_stride + c], sum);
      out[qi * out_stride + c] = sum;
    }
  }
}

// out[i] = exp(x[i] - shift) (out may be x); returns the sum (in a fixed lane-then-tail
// order).
float ExpAndSum(const float* x, float* out, size_t n, float shift) {
  const hn::ScalableTag<float> d;
  const size_t lanes = hn::Lanes(d);
  const auto shift_v = hn::Set(d, shift);
  auto sum_v = hn::Zero(d);
  // Highway's Exp converts x / ln 2 to int32 before its range check (below -104 it returns
  // 0): NaN, -inf or huge inputs are undefined behaviour on its emulated targets. Such lanes
  // are kept out of Exp and given the 0 it would return; lanes in range are unchanged.
  const auto lower = hn::Set(d, -104.0f), upper = hn::Set(d, 100.0f);
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto v = hn::Sub(hn::LoadU(d, x + i), shift_v);
    const auto in_range = hn::Ge(v, lower);  // false for NaN
    const auto e = hn::IfThenElseZero(
        in_range, hn::Exp(d, hn::IfThenElse(in_range, hn::Min(v, upper), lower)));
    hn::StoreU(e, d, out + i);
    sum_v = hn::Add(sum_v, e);
  }
  float sum = hn::GetLane(hn::SumOfLanes(d, sum_v));
  for (; i < n; ++i) {
    out[i] = std::exp(x[i] - shift);
    sum += out[i];
  }
  return sum;
}

// Largest value, NaN lanes ignored (as std::max(m, x) does); -inf for an empty range.
float MaxIgnoringNan(const float* x, size_t n) {
  const hn::ScalableTag<float> d;
  const size_t lanes = hn::Lanes(d);
  const auto lowest = hn::Set(d, -std::numeric_limits<float>::infinity());
  auto m = lowest;
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto v = hn::LoadU(d, x + i);
    m = hn::Max(m, hn::IfThenElse(hn::IsNaN(v), lowest, v));
  }
  float result = hn::GetLane(hn::MaxOfLanes(d, m));
  for (; i < n; ++i) result = std::max(result, x[i]);
  return result;
}

// sum p (s - t) (NaN propagates), and over finite s - t: sum (s - t)^2 and sum s^2.
void ScoreDivergence(const float* s, const float* t, const float* p, size_t n,
                     double* weighted_difference, double* error_squared,
                     double* reference_squared) {
  const hn::ScalableTag<float> d;
  const size_t lanes = hn::Lanes(d);
  auto kl = hn::Zero(d), err = hn::Zero(d), ref = hn::Zero(d);
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto sv = hn::LoadU(d, s + i);
    const auto diff = hn::Sub(sv, hn::LoadU(d, t + i));
    kl = hn::MulAdd(hn::LoadU(d, p + i), diff, kl);
    const auto finite = hn::IsFinite(diff);
    err = hn::MulAdd(hn::IfThenElseZero(finite, diff), hn::IfThenElseZero(finite, diff), err);
    ref = hn::MulAdd(hn::IfThenElseZero(finite, sv), hn::IfThenElseZero(finite, sv), ref);
  }
  double kl_sum = hn::GetLane(hn::SumOfLanes(d, kl));
  double err_sum = hn::GetLane(hn::SumOfLanes(d, err));
  double ref_sum = hn::GetLane(hn::SumOfLanes(d, ref));
  for (; i < n; ++i) {
    const double diff = double(s[i]) - double(t[i]);
    kl_sum += double(p[i]) * diff;
    if (std::isfinite(diff)) {
      err_sum += diff * diff;
      ref_sum += double(s[i]) * s[i];
    }
  }
  *weighted_difference += kl_sum;
  *error_squared += err_sum;
  *reference_squared += ref_sum;
}

// Peak FMA throughput probe: 12 independent accumulator chains, `iterations` rounds.
// Returns a value that depends on every lane so the work cannot be optimised away.
float FmaProbe(size_t iterations) {
  const hn::ScalableTag<float> d;
  auto a0 = hn::Set(d, 1.0f), a1 = hn::Set(d, 1.1f), a2 = hn::Set(d, 1.2f), a3 = hn::Set(d, 1.3f);
  auto a4 = hn::Set(d, 1.4f), a5 = hn::Set(d, 1.5f), a6 = hn::Set(d, 1.6f), a7 = hn::Set(d, 1.7f);
  auto a8 = hn::Set(d, 1.8f), a9 = hn::Set(d, 1.9f), a10 = hn::Set(d, 2.0f), a11 = hn::Set(d, 2.1f);
  const auto m = hn::Set(d, 0.999999f), c = hn::Set(d, 1e-7f);
  for (size_t i = 0; i < iterations; ++i) {
    a0 = hn::MulAdd(a0, m, c);
    a1 = hn::MulAdd(a1, m, c);
    a2 = hn::MulAdd(a2, m, c);
    a3 = hn::MulAdd(a3, m, c);
    a4 = hn::MulAdd(a4, m, c);
    a5 = hn::MulAdd(a5, m, c);
    a6 = hn::MulAdd(a6, m, c);
    a7 = hn::MulAdd(a7, m, c);
    a8 = hn::MulAdd(a8, m, c);
    a9 = hn::MulAdd(a9, m, c);
    a10 = hn::MulAdd(a10, m, c);
    a11 = hn::MulAdd(a11, m, c);
  }
  auto sum =
      hn::Add(hn::Add(hn::Add(a0, a1), hn::Add(a2, a3)), hn::Add(hn::Add(a4, a5), hn::Add(a6, a7)));
  sum = hn::Add(sum, hn::Add(hn::Add(a8, a9), hn::Add(a10, a11)));
  return hn::GetLane(hn::SumOfLanes(d, sum));
}

size_t FloatLanes() {
  return hn::Lanes(hn::ScalableTag<float>());
}

}  // namespace kvaudit::numerics::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvaudit::numerics {

HWY_EXPORT(ScoreBlock);
HWY_EXPORT(AccumulateWeighted);
HWY_EXPORT(ExpAndSum);
HWY_EXPORT(FmaProbe);
HWY_EXPORT(MaxIgnoringNan);
HWY_EXPORT(ScoreDivergence);
HWY_EXPORT(FloatLanes);

void score_block(const float* queries, int64_t query_count, int64_t query_stride, const float* keys,
                 int64_t key_count, int64_t key_stride, int64_t dim, float scale, float* scores) {
  HWY_DYNAMIC_DISPATCH(ScoreBlock)
  (queries, size_t(query_count), size_t(query_stride), keys, size_t(key_count), size_t(key_stride),
   size_t(dim), scale, scores);
}

void accumulate_weighted(const float* weights, int64_t query_count, int64_t key_count,
                         const float* values, int64_t value_stride, int64_t dim, float* out,
                         int64_t out_stride) {
  HWY_DYNAMIC_DISPATCH(AccumulateWeighted)
  (weights, size_t(query_count), size_t(key_count), values, size_t(value_stride), size_t(dim), out,
   size_t(out_stride));
}

float exp_and_sum(std::span<const float> values, float shift, std::span<float> out) {
  if (out.size() < values.size()) throw std::invalid_argument("exp_and_sum: output too small");
  return HWY_DYNAMIC_DISPATCH(ExpAndSum)(values.data(), out.data(), values.size(), shift);
}

float max_ignoring_nan(std::span<const float> values) {
  return HWY_DYNAMIC_DISPATCH(MaxIgnoringNan)(values.data(), values.size());
}
void score_divergence(const float* reference, const float* other, const float* weights,
                      int64_t count, double* weighted_difference, double* error_squared,
                      double* reference_squared) {
  HWY_DYNAMIC_DISPATCH(ScoreDivergence)
  (reference, other, weights, size_t(count), weighted_difference, error_squared, reference_squared);
}

float fma_probe(int64_t iterations) {
  return HWY_DYNAMIC_DISPATCH(FmaProbe)(size_t(iterations));
}
int64_t fma_probe_flops(int64_t iterations) {
  return iterations * 12 * 2 * int64_t(HWY_DYNAMIC_DISPATCH(FloatLanes)());
}

}  // namespace kvaudit::numerics
#endif  // HWY_ONCE
