// Blocked SIMD kernels for attention-error analysis: scores = Q K^T, out += P V, and a
// vectorised exp-and-sum. Register tiles of 4 queries x 2 vectors keep the FMA units busy
// (8 accumulators, 6 loads per 8 FMAs); K is transposed per block so both GEMMs stream
// contiguous rows. Results are deterministic: the reduction order over the head dimension
// and over keys is fixed and independent of the thread count.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "numerics/attention_kernels.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"
#include "numerics/numerics.h"

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

// scores[q * nk + j] = scale * sum_d queries[q * d_stride + d] * keys[j * key_stride + d]
void ScoreBlock(const float* queries, size_t nq, size_t q_stride, const float* keys, size_t nk,
                size_t key_stride, size_t dim, float scale, float* scores) {
  const hn::ScalableTag<float> d;
  const size_t lanes = hn::Lanes(d);
  const size_t key_tile = 2 * lanes;
  const size_t nk_tiled = nk / key_tile * key_tile;
  // keys^T for the tiled part: [dim][ld], transposed in 8 x 8 tiles. The row pitch ld is
  // padded off a power of two so columns do not all land in one L1 set.
  const size_t ld = nk_tiled + 8;
  thread_local std::vector<float> transposed;
  transposed.resize(dim * ld);
  for (size_t j0 = 0; j0 < nk_tiled; j0 += 8) {
    for (size_t k0 = 0; k0 < dim; k0 += 8) {
      const size_t k_end = std::min(dim, k0 + 8);
      if (k_end - k0 == 8 && j0 + 8 <= nk_tiled &&
          Transpose8x8(keys + j0 * key_stride + k0, key_stride, transposed.data() + k0 * ld + j0,
                       ld)) {
        continue;
      }
      for (size_t j = j0; j < j0 + 8 && j < nk_tiled; ++j) {
        const float* row = keys + j * key_stride;
        for (size_t k = k0; k < k_end; ++k) transposed[k * ld + j] = row[k];
      }
    }
  }
  const auto scale_v = hn::Set(d, scale);
  size_t q = 0;
  for (; q + 4 <= nq; q += 4) {
    const float* q0 = queries + (q + 0) * q_stride;
    const float* q1 = queries + (q + 1) * q_stride;
    const float* q2 = queries + (q + 2) * q_stride;
    const float* q3 = queries + (q + 3) * q_stride;
    for (size_t j = 0; j < nk_tiled; j += key_tile) {
      auto a00 = hn::Zero(d), a01 = hn::Zero(d), a10 = hn::Zero(d), a11 = hn::Zero(d);
      auto a20 = hn::Zero(d), a21 = hn::Zero(d), a30 = hn::Zero(d), a31 = hn::Zero(d);
      const float* kt = transposed.data() + j;
      for (size_t k = 0; k < dim; ++k) {
        const auto k0 = hn::LoadU(d, kt + k * ld);
        const auto k1 = hn::LoadU(d, kt + k * ld + lanes);
        const auto b0 = hn::Set(d, q0[k]), b1 = hn::Set(d, q1[k]);
        const auto b2 = hn::Set(d, q2[k]), b3 = hn::Set(d, q3[k]);
        a00 = hn::MulAdd(b0, k0, a00);
        a01 = hn::MulAdd(b0, k1, a01);
        a10 = hn::MulAdd(b1, k0, a10);
        a11 = hn::MulAdd(b1, k1, a11);
        a20 = hn::MulAdd(b2, k0, a20);
        a21 = hn::MulAdd(b2, k1, a21);
        a30 = hn::MulAdd(b3, k0, a30);
        a31 = hn::MulAdd(b3, k1, a31);
      }
      float* s = scores + q * nk + j;
      hn::StoreU(hn::Mul(a00, scale_v), d, s);
      hn::StoreU(hn::Mul(a01, scale_v), d, s + lanes);
      hn::StoreU(hn::Mul(a10, scale_v), d, s + nk);
      hn::StoreU(hn::Mul(a11, scale_v), d, s + nk + lanes);
      hn::StoreU(hn::Mul(a20, scale_v), d, s + 2 * nk);
      hn::StoreU(hn::Mul(a21, scale_v), d, s + 2 * nk + lanes);
      hn::StoreU(hn::Mul(a30, scale_v), d, s + 3 * nk);
      hn::StoreU(hn::Mul(a31, scale_v), d, s + 3 * nk + lanes);
    }
  }
  // Leftover queries (tiled keys) and leftover keys (all queries): plain dot products in
  // the same k order as the tiles.
  auto dot = [&](size_t qi, size_t j) {
    float sum = 0.0f;
    for (size_t k = 0; k < dim; ++k)
      sum = ScalarMulAdd(queries[qi * q_stride + k], keys[j * key_stride + k], sum);
    return sum * scale;
  };
  for (size_t qi = q; qi < nq; ++qi) {
    for (size_t j = 0; j < nk_tiled; ++j) scores[qi * nk + j] = dot(qi, j);
  }
  for (size_t qi = 0; qi < nq; ++qi) {
    for (size_t j = nk_tiled; j < nk; ++j) scores[qi * nk + j] = dot(qi, j);
  }
}

// out[q * out_stride + c] += sum_j weights[q * nk + j] * values[j * value_stride + c]
void AccumulateWeighted(const float* weights, size_t nq, size_t nk, const float* values,
                        size_t value_stride, size_t dim, float* out, size_t out_stride) {
  const hn::ScalableTag<float> d;
  const size_t lanes = hn::Lanes(d);
  const size_t tile = 2 * lanes;
  const size_t dim_tiled = dim / tile * tile;
  // Pack the value rows contiguously with a padded pitch: the head slices of a KV row are
  // a power-of-two apart, which would put every row of a column tile in one L1 set.
  const size_t pitch = dim_tiled + 8;
  thread_local std::vector<float> packed;
  packed.resize(nk * pitch);
  for (size_t j = 0; j < nk; ++j) {
    std::copy_n(values + j * value_stride, dim_tiled, packed.data() + j * pitch);
  }
  size_t q = 0;
  for (; q + 4 <= nq; q += 4) {
    const float* w0 = weights + (q + 0) * nk;
    const float* w1 = weights + (q + 1) * nk;
    const float* w2 = weights + (q + 2) * nk;
    const float* w3 = weights + (q + 3) * nk;
    for (size_t c = 0; c < dim_tiled; c += tile) {
      float* o0 = out + (q + 0) * out_stride + c;
      float* o1 = out + (q + 1) * out_stride + c;
      float* o2 = out + (q + 2) * out_stride + c;
      float* o3 = out + (q + 3) * out_stride + c;
      auto a00 = hn::LoadU(d, o0), a01 = hn::LoadU(d, o0 + lanes);
      auto a10 = hn::LoadU(d, o1), a11 = hn::LoadU(d, o1 + lanes);
      auto a20 = hn::LoadU(d, o2), a21 = hn::LoadU(d, o2 + lanes);
      auto a30 = hn::LoadU(d, o3), a31 = hn::LoadU(d, o3 + lanes);
      for (size_t j = 0; j < nk; ++j) {
        const float* v = packed.data() + j * pitch + c;
        const auto v0 = hn::LoadU(d, v), v1 = hn::LoadU(d, v + lanes);
        const auto b0 = hn::Set(d, w0[j]), b1 = hn::Set(d, w1[j]);
        const auto b2 = hn::Set(d, w2[j]), b3 = hn::Set(d, w3[j]);
        a00 = hn::MulAdd(b0, v0, a00);
        a01 = hn::MulAdd(b0, v1, a01);
        a10 = hn::MulAdd(b1, v0, a10);
        a11 = hn::MulAdd(b1, v1, a11);
        a20 = hn::MulAdd(b2, v0, a20);
        a21 = hn::MulAdd(b2, v1, a21);
        a30 = hn::MulAdd(b3, v0, a30);
        a31 = hn::MulAdd(b3, v1, a31);
      }
      hn::StoreU(a00, d, o0);
      hn::StoreU(a01, d, o0 + lanes);
      hn::StoreU(a10, d, o1);
      hn::StoreU(a11, d, o1 + lanes);
      hn::StoreU(a20, d, o2);
      hn::StoreU(a21, d, o2 + lanes);
      hn::StoreU(a30, d, o3);
      hn::StoreU(a31, d, o3 + lanes);
    }
  }
  for (size_t qi = 0; qi < nq; ++qi) {
    const size_t c_begin = qi < q ? dim_tiled : 0;
    for (size_t c = c_begin; c < dim; ++c) {
      float sum = out[qi * out_stride + c];
      for (size_t j = 0; j < nk; ++j)
        sum = ScalarMulAdd(weights[qi * nk + j], values[j * value_stride + c], sum);
      out[qi * out_stride + c] = sum;
    }
  }
}

// x[i] = exp(x[i] - shift); returns the sum (in a fixed lane-then-tail order).
float ExpAndSum(float* x, size_t n, float shift) {
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
    hn::StoreU(e, d, x + i);
    sum_v = hn::Add(sum_v, e);
  }
  float sum = hn::GetLane(hn::SumOfLanes(d, sum_v));
  for (; i < n; ++i) {
    x[i] = std::exp(x[i] - shift);
    sum += x[i];
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

float exp_and_sum(std::span<float> values, float shift) {
  return HWY_DYNAMIC_DISPATCH(ExpAndSum)(values.data(), values.size(), shift);
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
