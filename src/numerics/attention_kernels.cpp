// Blocked SIMD kernels for attention: scores = Q K^T and out += P V, in two layouts. The
// row form (score_block, accumulate_weighted: the reference model's attention) transposes K
// per block; the transposed form (the quant analysis's many queries per key block) keeps
// scores as [key][query] with the queries in the vector lanes, reads K in place and does
// the softmax bookkeeping down whole columns. Register tiles of 4 rows x 3 vectors keep the
// FMA units busy (12 accumulators, 7 loads per 12 FMAs). Results are deterministic: the
// reduction order over the head dimension and over keys is fixed, the same in both forms,
// and independent of the thread count.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "numerics/attention_kernels.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "hwy/cache_control.h"
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"
#include "numerics/mul_add-inl.h"
#include "numerics/numerics.h"

HWY_BEFORE_NAMESPACE();
namespace kvaudit::numerics::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

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
// (a_step: the distance between consecutive k in a; 1 unless a is stored transposed.)
template <int kQ, int kV, class D>
HWY_INLINE void MulAddTile(D d, const float* a, size_t a_stride, const float* b, size_t b_stride,
                           size_t steps, hn::Vec<D> (&acc)[kQ][kV], size_t a_step = 1) {
  using V = hn::Vec<D>;
  const size_t lanes = hn::Lanes(d);
  for (size_t k = 0; k < steps; ++k) {
    V row[kV];
    KV_UNROLL for (int v = 0; v < kV; ++v) row[v] = hn::LoadU(d, b + k * b_stride + v * lanes);
    KV_UNROLL for (int i = 0; i < kQ; ++i) {
      const V broadcast = hn::Set(d, a[i * a_stride + k * a_step]);
      KV_UNROLL for (int v = 0; v < kV; ++v) acc[i][v] = hn::MulAdd(broadcast, row[v], acc[i][v]);
    }
  }
}

// Calls tile(count, at) for tiles of 3, then 2, then 1 vectors covering [0, end) (end a
// multiple of the vector length); count is a std::integral_constant. A lone 1-vector tile
// (4 FMAs per 5 loads) is avoided where a 3 can become two 2s: 16 vectors (a head of 128
// on AVX2) go as 3, 3, 3, 3, 2, 2.
template <class D, class Tile>
HWY_INLINE void ForVectorTiles(D d, size_t end, const Tile& tile) {
  const size_t lanes = hn::Lanes(d);
  const size_t vectors = end / lanes;
  const size_t threes = vectors % 3 == 1 && vectors >= 4 ? vectors / 3 - 1 : vectors / 3;
  size_t at = 0;
  for (size_t i = 0; i < threes; ++i, at += 3 * lanes) tile(std::integral_constant<int, 3>(), at);
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

// dst[j * dst_pitch + c] = src[j * src_stride + c] for c < width, with the rows a few
// ahead prefetched: rows a page apart defeat the hardware prefetcher, and rows a power of
// two apart would put a column of them in one L1 set, so they are packed before a GEMM
// walks down their columns.
void PackRows(const float* src, size_t rows, size_t src_stride, size_t width, float* dst,
              size_t dst_pitch) {
  constexpr size_t kAhead = 6;
  for (size_t j = 0; j < rows; ++j) {
    if (j + kAhead < rows) {
      const float* ahead = src + (j + kAhead) * src_stride;
      for (size_t c = 0; c < width; c += 16) hwy::Prefetch(ahead + c);
    }
    std::copy_n(src + j * src_stride, width, dst + j * dst_pitch);
  }
}

// out[q * out_stride + c] += sum_j weights[q * nk + j] * values[j * value_stride + c]
void AccumulateWeighted(const float* weights, size_t nq, size_t nk, const float* values,
                        size_t value_stride, size_t dim, float* out, size_t out_stride) {
  const hn::ScalableTag<float> d;
  const size_t lanes = hn::Lanes(d);
  const size_t dim_vector = dim / lanes * lanes;
  // The head slices of a KV row are a page apart: packed with a padded pitch first.
  const size_t pitch = dim_vector + 8;
  thread_local std::vector<float> packed;
  packed.resize(nk * pitch);
  PackRows(values, nk, value_stride, dim_vector, packed.data(), pitch);
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

// ---- Transposed forms: scores as [key][query], queries along the vector lanes. Keys are
// read in place (no transpose), and the softmax bookkeeping works on whole columns.

// Scores of kK keys starting at key j against kV vectors of queries starting at q.
template <int kK, int kV, class D>
HWY_INLINE void ScoreTileTransposed(D d, const float* queries_t, size_t queries_pitch, size_t pitch,
                                    size_t dim, const float* keys, size_t key_stride,
                                    hn::Vec<D> scale_v, float* scores_t, size_t j, size_t q) {
  const size_t lanes = hn::Lanes(d);
  hn::Vec<D> acc[kK][kV];
  KV_UNROLL for (int i = 0; i < kK; ++i) KV_UNROLL for (int v = 0; v < kV; ++v) acc[i][v] =
      hn::Zero(d);
  MulAddTile<kK, kV>(d, keys + j * key_stride, key_stride, queries_t + q, queries_pitch, dim, acc);
  KV_UNROLL for (int i = 0; i < kK; ++i) KV_UNROLL for (int v = 0; v < kV; ++v)
      hn::StoreU(hn::Mul(acc[i][v], scale_v), d, scores_t + (j + i) * pitch + q + v * lanes);
}

// scores_t[j * columns + q] = scale * sum_d keys[j * key_stride + d] *
// queries_t[d * queries_pitch + q] for every q < columns (a multiple of the vector length).
// The products are summed over d ascending from zero, as ScoreBlock sums them, so the
// scores have the same bits.
void ScoreBlockTransposed(const float* queries_t, size_t queries_pitch, size_t columns, size_t dim,
                          const float* keys, size_t nk, size_t key_stride, float scale,
                          float* scores_t) {
  const hn::ScalableTag<float> d;
  const auto scale_v = hn::Set(d, scale);
  const size_t pitch = columns;
  // Query tiles outer, keys inner: a tile's queries (dim x 3 vectors) stay in L1 while
  // the keys stream past, 4 rows at a time; the rows of the next 4 keys are fetched ahead
  // (they are a page apart, the hardware prefetcher restarts on each).
  ForVectorTiles(d, pitch, [&](auto count, size_t q) {
    constexpr int kV = decltype(count)::value;
    size_t j = 0;
    for (; j + 4 <= nk; j += 4) {
      for (size_t ahead = j + 4; ahead < std::min(nk, j + 8); ++ahead) {
        for (size_t k = 0; k < dim; k += 16) hwy::Prefetch(keys + ahead * key_stride + k);
      }
      ScoreTileTransposed<4, kV>(d, queries_t, queries_pitch, pitch, dim, keys, key_stride, scale_v,
                                 scores_t, j, q);
    }
    for (; j < nk; ++j) {
      ScoreTileTransposed<1, kV>(d, queries_t, queries_pitch, pitch, dim, keys, key_stride, scale_v,
                                 scores_t, j, q);
    }
  });
}

// out[q * out_stride + c] += sum_j weights_t[j * pitch + q] * values[j * value_stride + c]
// for q < nq: AccumulateWeighted with the weights stored transposed (same sums, same bits).
// The values are read in place (see PackRows).
void AccumulateWeightedTransposed(const float* weights_t, size_t pitch, size_t nq, size_t nk,
                                  const float* values, size_t value_stride, size_t dim, float* out,
                                  size_t out_stride, const float* out_scale) {
  const hn::ScalableTag<float> d;
  const size_t lanes = hn::Lanes(d);
  const size_t dim_vector = dim / lanes * lanes;
  ForVectorTiles(d, dim_vector, [&](auto count, size_t c) {
    constexpr int kV = decltype(count)::value;
    const auto tile = [&](auto queries, size_t q) {
      constexpr int kQ = decltype(queries)::value;
      hn::Vec<decltype(d)> acc[kQ][kV];
      float* o = out + q * out_stride + c;
      KV_UNROLL for (int i = 0; i < kQ; ++i) {
        const auto scale = hn::Set(d, out_scale ? out_scale[q + i] : 1.0f);
        KV_UNROLL for (int v = 0; v < kV; ++v) acc[i][v] =
            hn::Mul(hn::LoadU(d, o + i * out_stride + v * lanes), scale);
      }
      MulAddTile<kQ, kV>(d, weights_t + q, 1, values + c, value_stride, nk, acc, pitch);
      KV_UNROLL for (int i = 0; i < kQ; ++i) KV_UNROLL for (int v = 0; v < kV; ++v)
          hn::StoreU(acc[i][v], d, o + i * out_stride + v * lanes);
    };
    size_t q = 0;
    for (; q + 4 <= nq; q += 4) tile(std::integral_constant<int, 4>(), q);
    for (; q < nq; ++q) tile(std::integral_constant<int, 1>(), q);
  });
  for (size_t qi = 0; qi < nq; ++qi) {
    for (size_t c = dim_vector; c < dim; ++c) {
      float sum = out[qi * out_stride + c] * (out_scale ? out_scale[qi] : 1.0f);
      for (size_t j = 0; j < nk; ++j)
        sum = ScalarMulAdd(weights_t[j * pitch + qi], values[j * value_stride + c], sum);
      out[qi * out_stride + c] = sum;
    }
  }
}

// exp(v) per lane. Highway's Exp converts x / ln 2 to int32 before its range check (below
// -104 it returns 0): NaN, -inf or huge inputs are undefined behaviour on its emulated
// targets. Such lanes are kept out of Exp and given the 0 it would return (NaN too); lanes
// in range are unchanged.
template <class D>
HWY_INLINE hn::Vec<D> GuardedExp(D d, hn::Vec<D> v) {
  const auto lower = hn::Set(d, -104.0f), upper = hn::Set(d, 100.0f);
  const auto in_range = hn::Ge(v, lower);  // false for NaN
  return hn::IfThenElseZero(in_range,
                            hn::Exp(d, hn::IfThenElse(in_range, hn::Min(v, upper), lower)));
}

// Column maxima of x [rows][pitch], NaN ignored (-inf for a column of NaN or no rows).
void ColumnMaxIgnoringNan(const float* x, size_t rows, size_t pitch, float* column_max) {
  const hn::ScalableTag<float> d;
  const auto lowest = hn::Set(d, -std::numeric_limits<float>::infinity());
  for (size_t q = 0; q < pitch; q += hn::Lanes(d)) {
    auto m = lowest;
    for (size_t j = 0; j < rows; ++j) {
      const auto v = hn::LoadU(d, x + j * pitch + q);
      m = hn::Max(m, hn::IfThenElse(hn::IsNaN(v), lowest, v));
    }
    hn::StoreU(m, d, column_max + q);
  }
}

// out[j][q] = exp(x[j][q] - shift[q]) (out may be x); column_sums[q] = their sum over j
// ascending, compensated (Kahan): the sums become partition functions whose logarithms are
// subtracted from each other for KL, where a plain float sum's error would show.
void ColumnExpAndSum(const float* x, size_t rows, size_t pitch, const float* shift, float* out,
                     float* column_sums) {
  const hn::ScalableTag<float> d;
  const size_t lanes = hn::Lanes(d);
  using V = hn::Vec<decltype(d)>;
  // (Once a sum overflows, the compensation would be inf - inf: it is dropped, and the sum
  // stays inf as a plain sum would.)
  const auto add = [](V& sum, V& compensation, V value) {
    const V y = hn::Sub(value, compensation);
    const V t = hn::Add(sum, y);
    const V c = hn::Sub(hn::Sub(t, sum), y);
    compensation = hn::IfThenElseZero(hn::IsFinite(c), c);
    sum = t;
  };
  // Two vectors of columns at a time: two independent Exp chains in flight.
  size_t q = 0;
  for (; q + 2 * lanes <= pitch; q += 2 * lanes) {
    const auto shift0 = hn::LoadU(d, shift + q), shift1 = hn::LoadU(d, shift + q + lanes);
    V sum0 = hn::Zero(d), sum1 = hn::Zero(d), c0 = hn::Zero(d), c1 = hn::Zero(d);
    for (size_t j = 0; j < rows; ++j) {
      const auto e0 = GuardedExp(d, hn::Sub(hn::LoadU(d, x + j * pitch + q), shift0));
      const auto e1 = GuardedExp(d, hn::Sub(hn::LoadU(d, x + j * pitch + q + lanes), shift1));
      hn::StoreU(e0, d, out + j * pitch + q);
      hn::StoreU(e1, d, out + j * pitch + q + lanes);
      add(sum0, c0, e0);
      add(sum1, c1, e1);
    }
    hn::StoreU(sum0, d, column_sums + q);
    hn::StoreU(sum1, d, column_sums + q + lanes);
  }
  for (; q < pitch; q += lanes) {
    const auto shift_v = hn::LoadU(d, shift + q);
    V sum = hn::Zero(d), c = hn::Zero(d);
    for (size_t j = 0; j < rows; ++j) {
      const auto e = GuardedExp(d, hn::Sub(hn::LoadU(d, x + j * pitch + q), shift_v));
      hn::StoreU(e, d, out + j * pitch + q);
      add(sum, c, e);
    }
    hn::StoreU(sum, d, column_sums + q);
  }
}

// Per column q of [rows][pitch]: weighted_difference[q] = sum_j w (r - o) (NaN/inf
// propagate); over the finite r - o, error_squared[q] = sum (r - o)^2 and
// reference_squared[q] = sum r^2; other_max[q] = max of o, NaN ignored. Sums run over j
// ascending.
void ColumnDivergence(const float* reference, const float* other, const float* weights, size_t rows,
                      size_t pitch, float* weighted_difference, float* error_squared,
                      float* reference_squared, float* other_max) {
  const hn::ScalableTag<float> d;
  const auto lowest = hn::Set(d, -std::numeric_limits<float>::infinity());
  for (size_t q = 0; q < pitch; q += hn::Lanes(d)) {
    auto kl = hn::Zero(d), err = hn::Zero(d), ref = hn::Zero(d), m = lowest;
    for (size_t j = 0; j < rows; ++j) {
      const size_t at = j * pitch + q;
      const auto r = hn::LoadU(d, reference + at), o = hn::LoadU(d, other + at);
      const auto diff = hn::Sub(r, o);
      kl = hn::MulAdd(hn::LoadU(d, weights + at), diff, kl);
      const auto finite = hn::IsFinite(diff);
      const auto finite_diff = hn::IfThenElseZero(finite, diff);
      const auto finite_ref = hn::IfThenElseZero(finite, r);
      err = hn::MulAdd(finite_diff, finite_diff, err);
      ref = hn::MulAdd(finite_ref, finite_ref, ref);
      m = hn::Max(m, hn::IfThenElse(hn::IsNaN(o), lowest, o));
    }
    hn::StoreU(kl, d, weighted_difference + q);
    hn::StoreU(err, d, error_squared + q);
    hn::StoreU(ref, d, reference_squared + q);
    hn::StoreU(m, d, other_max + q);
  }
}

// Appends j * pitch + q for every x[j][q] >= threshold[q] with q < columns (NaN never);
// returns how many. In row order, then column order.
size_t ColumnSelectAtLeast(const float* x, size_t rows, size_t pitch, size_t columns,
                           const float* threshold, int32_t* out) {
  const hn::ScalableTag<float> d;
  const size_t lanes = hn::Lanes(d);
  size_t found = 0;
  for (size_t j = 0; j < rows; ++j) {
    for (size_t q = 0; q < columns; q += lanes) {
      const auto hit = hn::Ge(hn::LoadU(d, x + j * pitch + q), hn::LoadU(d, threshold + q));
      if (hn::AllFalse(d, hit)) continue;  // the common case once the top k settle
      uint8_t bits[8] = {};
      hn::StoreMaskBits(d, hit, bits);
      for (size_t lane = 0; lane < lanes && q + lane < columns; ++lane) {
        if ((bits[lane / 8] >> (lane % 8)) & 1) out[found++] = int32_t(j * pitch + q + lane);
      }
    }
  }
  return found;
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
HWY_EXPORT(FmaProbe);
HWY_EXPORT(FloatLanes);
HWY_EXPORT(ScoreBlockTransposed);
HWY_EXPORT(AccumulateWeightedTransposed);
HWY_EXPORT(ColumnMaxIgnoringNan);
HWY_EXPORT(ColumnExpAndSum);
HWY_EXPORT(ColumnDivergence);
HWY_EXPORT(ColumnSelectAtLeast);
HWY_EXPORT(PackRows);

namespace {
// Column kernels work on whole vectors: the pitch must be a multiple of the lane count.
void require_pitch(int64_t pitch, const char* what) {
  if (pitch < 1 || pitch % int64_t(HWY_DYNAMIC_DISPATCH(FloatLanes)()) != 0) {
    throw std::invalid_argument(
        fmt::format("{}: pitch {} is not a multiple of the vector length "
                    "(use column_pitch)",
                    what, pitch));
  }
}
}  // namespace

int64_t column_pitch(int64_t columns) {
  const int64_t lanes = int64_t(HWY_DYNAMIC_DISPATCH(FloatLanes)());
  return std::max<int64_t>(1, (columns + lanes - 1) / lanes) * lanes;
}

void score_block_transposed(const float* queries_t, int64_t queries_pitch, int64_t columns,
                            int64_t dim, const float* keys, int64_t key_count, int64_t key_stride,
                            float scale, float* scores_t) {
  require_pitch(columns, "score_block_transposed");
  if (queries_pitch < columns) throw std::invalid_argument("score_block_transposed: pitch");
  HWY_DYNAMIC_DISPATCH(ScoreBlockTransposed)
  (queries_t, size_t(queries_pitch), size_t(columns), size_t(dim), keys, size_t(key_count),
   size_t(key_stride), scale, scores_t);
}

void pack_rows(const float* src, int64_t rows, int64_t src_stride, int64_t width, float* dst,
               int64_t dst_pitch) {
  if (rows < 0 || width < 0 || dst_pitch < width || src_stride < 0) {
    throw std::invalid_argument("pack_rows: negative size or a pitch narrower than the rows");
  }
  HWY_DYNAMIC_DISPATCH(PackRows)
  (src, size_t(rows), size_t(src_stride), size_t(width), dst, size_t(dst_pitch));
}

void accumulate_weighted_transposed(const float* weights_t, int64_t pitch, int64_t query_count,
                                    int64_t key_count, const float* values, int64_t value_stride,
                                    int64_t dim, float* out, int64_t out_stride,
                                    const float* out_scale) {
  if (query_count > pitch) throw std::invalid_argument("accumulate_weighted_transposed: pitch");
  HWY_DYNAMIC_DISPATCH(AccumulateWeightedTransposed)
  (weights_t, size_t(pitch), size_t(query_count), size_t(key_count), values, size_t(value_stride),
   size_t(dim), out, size_t(out_stride), out_scale);
}

void column_max_ignoring_nan(const float* x, int64_t rows, int64_t pitch, float* column_max) {
  require_pitch(pitch, "column_max_ignoring_nan");
  HWY_DYNAMIC_DISPATCH(ColumnMaxIgnoringNan)(x, size_t(rows), size_t(pitch), column_max);
}

void column_exp_and_sum(const float* x, int64_t rows, int64_t pitch, const float* shift, float* out,
                        float* column_sums) {
  require_pitch(pitch, "column_exp_and_sum");
  HWY_DYNAMIC_DISPATCH(ColumnExpAndSum)(x, size_t(rows), size_t(pitch), shift, out, column_sums);
}

void column_divergence(const float* reference, const float* other, const float* weights,
                       int64_t rows, int64_t pitch, float* weighted_difference,
                       float* error_squared, float* reference_squared, float* other_max) {
  require_pitch(pitch, "column_divergence");
  HWY_DYNAMIC_DISPATCH(ColumnDivergence)
  (reference, other, weights, size_t(rows), size_t(pitch), weighted_difference, error_squared,
   reference_squared, other_max);
}

int64_t column_select_at_least(const float* x, int64_t rows, int64_t pitch, int64_t columns,
                               const float* threshold, int32_t* out) {
  require_pitch(pitch, "column_select_at_least");
  if (columns > pitch || rows * pitch > std::numeric_limits<int32_t>::max()) {
    throw std::invalid_argument("column_select_at_least: columns or block too large");
  }
  return int64_t(HWY_DYNAMIC_DISPATCH(ColumnSelectAtLeast)(x, size_t(rows), size_t(pitch),
                                                           size_t(columns), threshold, out));
}

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

float fma_probe(int64_t iterations) {
  return HWY_DYNAMIC_DISPATCH(FmaProbe)(size_t(iterations));
}
int64_t fma_probe_flops(int64_t iterations) {
  return iterations * 12 * 2 * int64_t(HWY_DYNAMIC_DISPATCH(FloatLanes)());
}

}  // namespace kvaudit::numerics
#endif  // HWY_ONCE
