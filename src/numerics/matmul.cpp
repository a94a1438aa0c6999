// Ops of the reference model's forward pass (model/): matmul and softmax. Activations are
// F32, weights are read in their stored type (F32/BF16/F16) and widened in registers (decode)
// or once per L2-sized block into F32 (prefill; the conversion is exact either way). Compiled
// once per SIMD target by Highway (foreach_target) and picked at run time. Each output
// element is one dot product summed in a fixed order (SIMD lanes, then the lane sum, then the
// scalar tail) by exactly one task, so results do not depend on the thread count or on how
// tokens/rows are tiled.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "numerics/matmul.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "hwy/aligned_allocator.h"
#include "hwy/cache_control.h"
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"
#include "numerics/mul_add-inl.h"
#include "numerics/numerics.h"

#ifndef KVAUDIT_NUMERICS_MATMUL_SCALAR_ONCE
#define KVAUDIT_NUMERICS_MATMUL_SCALAR_ONCE
namespace kvaudit::numerics::detail {
// Scalar widening of one stored weight element (the scalar decoders of scalar.cpp).
template <int kType>
inline float weight_scalar(const void* base, int64_t index) {
  if constexpr (kType == 0) {
    return static_cast<const float*>(base)[index];
  } else if constexpr (kType == 1) {
    return bf16_to_float(static_cast<const uint16_t*>(base)[index]);
  } else {
    return fp16_to_float(static_cast<const uint16_t*>(base)[index]);
  }
}
}  // namespace kvaudit::numerics::detail
#endif

// Multi-token matmuls over more columns than this go chunk by chunk (a multiple of every
// lane count).
#ifndef KVAUDIT_NUMERICS_MATMUL_CHUNK_COLUMNS
#define KVAUDIT_NUMERICS_MATMUL_CHUNK_COLUMNS
namespace kvaudit::numerics::detail {
constexpr int64_t kChunkColumns = 1024;
}
#endif

HWY_BEFORE_NAMESPACE();
namespace kvaudit::numerics::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <int kType, class D>
HWY_INLINE hn::Vec<D> LoadWeights(D df, const void* base, int64_t index) {
  if constexpr (kType == 0) {
    return hn::LoadU(df, static_cast<const float*>(base) + index);
  } else if constexpr (kType == 1) {
    const hn::Rebind<hwy::bfloat16_t, D> dbf;
    return hn::PromoteTo(df, hn::LoadU(dbf, static_cast<const hwy::bfloat16_t*>(base) + index));
  } else {
    const hn::Rebind<hwy::float16_t, D> dh;
    return hn::PromoteTo(df, hn::LoadU(dh, static_cast<const hwy::float16_t*>(base) + index));
  }
}

// kT tokens x kR weight rows of dot products over n columns, kept in kT*kR accumulators so
// each widened weight vector is reused kT times and each activation vector kR times. Token t
// reads x[t * x_stride + k], row r reads w[(row0 + r) * w_stride + k], k in [0, n). A dot
// product split into column chunks carries its accumulators in `carry` (kT*kR vectors) from
// one chunk to the next (`first`: start from zero; only the last chunk may have n that is not
// a multiple of the lane count), so every lane still sums its columns in order and the result
// is bit-identical to one pass over all columns. The last chunk sums the lanes, adds the
// scalar tail and writes out[t * out_stride + r].
// `prefetch` (may be null): the next kR rows, which the tile pulls into the cache one line
// per step in address order while it works, so DRAM sees one sequential stream instead of
// kR short interleaved ones (which the hardware prefetcher follows badly: 5 vs 9 GB/s on
// one core).
template <int kType, int kT, int kR>
HWY_INLINE void Tile(const float* HWY_RESTRICT x, int64_t x_stride, const void* w, int64_t w_stride,
                     int64_t row0, int64_t n, bool first, bool last, float* HWY_RESTRICT carry,
                     float* HWY_RESTRICT out, int64_t out_stride,
                     const uint8_t* prefetch = nullptr) {
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  using V = hn::Vec<decltype(df)>;
  constexpr int64_t kWeightBytes = kType == 0 ? 4 : 2;
  // Bytes of the next rows to prefetch per step: the kR rows hold that many per step.
  const int64_t prefetch_step = kR * lanes * kWeightBytes;
  V acc[kT][kR];
  if (first) {
    KV_UNROLL for (int t = 0; t < kT; ++t) KV_UNROLL for (int r = 0; r < kR; ++r) acc[t][r] =
        hn::Zero(df);
  } else {
    KV_UNROLL for (int t = 0; t < kT; ++t) KV_UNROLL for (int r = 0; r < kR; ++r) acc[t][r] =
        hn::LoadU(df, carry + (t * kR + r) * lanes);
  }
  int64_t k = 0;
  for (; k + lanes <= n; k += lanes) {
    if (prefetch != nullptr) {
      for (int64_t line = 0; line < prefetch_step; line += 64) hwy::Prefetch(prefetch + line);
      prefetch += prefetch_step;
    }
    V wv[kR];
    KV_UNROLL for (int r = 0; r < kR; ++r) wv[r] =
        LoadWeights<kType>(df, w, (row0 + r) * w_stride + k);
    KV_UNROLL for (int t = 0; t < kT; ++t) {
      const V xv = hn::LoadU(df, x + t * x_stride + k);
      KV_UNROLL for (int r = 0; r < kR; ++r) acc[t][r] = hn::MulAdd(xv, wv[r], acc[t][r]);
    }
  }
  if (!last) {
    KV_UNROLL for (int t = 0; t < kT; ++t) KV_UNROLL for (int r = 0; r < kR; ++r)
        hn::StoreU(acc[t][r], df, carry + (t * kR + r) * lanes);
    return;
  }
  float sums[kT][kR];
  KV_UNROLL for (int t = 0; t < kT; ++t) KV_UNROLL for (int r = 0; r < kR; ++r) sums[t][r] =
      hn::GetLane(hn::SumOfLanes(df, acc[t][r]));
  for (int t = 0; t < kT; ++t) {
    for (int r = 0; r < kR; ++r) {
      float sum = sums[t][r];
      for (int64_t kk = k; kk < n; ++kk)
        sum = ScalarMulAdd(x[t * x_stride + kk],
                           detail::weight_scalar<kType>(w, (row0 + r) * w_stride + kk), sum);
      out[t * out_stride + r] = sum;
    }
  }
}

// Rows [row_begin, row_end) of the weights against every token.
// One token (decode) is bound by reading weights: 4 rows at a time keep 4 independent
// accumulation chains in flight, and the tile prefetches the next 4 rows.
// Several tokens (prefill) go block by block (`block_rows` rows) and, for inputs wider than
// kChunkColumns (the MLP's down projection), chunk by chunk of columns:
//  - the block's chunk of 16-bit weights is widened once into F32 (`packed`, sized by the
//    caller to stay in L2), not once per token group: the tiles then only load and multiply,
//    and F16 subnormals (whose conversion takes a microcode assist on some cores) cost once
//    instead of once per 4 tokens;
//  - token groups of 6 (4 on 16-register targets) pass over it in 6-token x 4-row tiles (4 x 3
//    there), so a group's chunk of activations (at most 6 x 1024 floats) stays in L1 while
//    the weights pass by.
template <int kType>
void MatmulRowsT(const float* x, int64_t tokens, int64_t cols, const void* w, int64_t row_begin,
                 int64_t row_end, int64_t block_rows, float* out, int64_t out_stride) {
  if (tokens == 1) {
    const uint8_t* weights = static_cast<const uint8_t*>(w);
    const int64_t row_bytes = cols * (kType == 0 ? 4 : 2);
    int64_t r = row_begin;
    for (; r + 4 <= row_end; r += 4) {
      const uint8_t* next = r + 8 <= row_end ? weights + (r + 4) * row_bytes : nullptr;
      Tile<kType, 1, 4>(x, cols, w, cols, r, cols, true, true, nullptr, out + r, out_stride, next);
    }
    for (; r < row_end; ++r)
      Tile<kType, 1, 1>(x, cols, w, cols, r, cols, true, true, nullptr, out + r, out_stride);
    return;
  }
  const hn::ScalableTag<float> df;
  // 24 accumulators + 4 weight vectors + 1 activation fit AVX-512's 32 registers (measured on
  // a Zen 5 core: 4 x 6 prefills 1.8x faster than 3 x 4 once the operands are 64-byte
  // aligned); 16-register targets keep 3 x 4 (12 + 3 + 1). The tile shape does not change a
  // result: each output is still one dot product summed lane by lane in column order.
  constexpr int kTileRows = HWY_MAX_BYTES >= 64 ? 4 : 3;
  constexpr int kTileTokens = HWY_MAX_BYTES >= 64 ? 6 : 4;
  const int64_t chunk_columns = std::min(cols, detail::kChunkColumns);
  const bool chunked = cols > detail::kChunkColumns;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  // Carried accumulators: one slot of kTileTokens x kTileRows vectors per (token group, row
  // tile of the block); the (at most kTileRows - 1) single rows after the block's last tile share
  // one slot, and so do single tokens after the last full group (one group each).
  const int64_t slot = int64_t{kTileTokens} * kTileRows * lanes;
  const int64_t tiles_per_block = (block_rows + kTileRows - 1) / kTileRows;
  const int64_t token_groups = tokens / kTileTokens + tokens % kTileTokens;
  std::vector<float> carries;
  if (chunked) carries.resize(static_cast<size_t>(token_groups * tiles_per_block * slot));
  // 64-byte aligned so no vector load of the widened weights splits a cache line.
  hwy::AlignedFreeUniquePtr<float[]> packed;
  if (kType != 0)
    packed = hwy::AllocateAligned<float>(
        static_cast<size_t>(std::min(block_rows, row_end - row_begin) * chunk_columns));
  for (int64_t block = row_begin; block < row_end; block += block_rows) {
    const int64_t block_end = std::min(row_end, block + block_rows);
    for (int64_t k = 0; k < cols; k += chunk_columns) {
      const int64_t n = std::min(chunk_columns, cols - k);
      const bool first = k == 0, last = k + n == cols;
      // The block's chunk of weights as F32 rows: row i of the block at weights + i * stride.
      const float* weights;
      int64_t stride;
      if constexpr (kType == 0) {
        weights = static_cast<const float*>(w) + block * cols + k;
        stride = cols;
      } else {
        for (int64_t row = block; row < block_end; ++row) {
          float* dst = packed.get() + (row - block) * n;
          const int64_t src = row * cols + k;
          int64_t i = 0;
          for (; i + lanes <= n; i += lanes)
            hn::StoreU(LoadWeights<kType>(df, w, src + i), df, dst + i);
          for (; i < n; ++i) dst[i] = detail::weight_scalar<kType>(w, src + i);
        }
        weights = packed.get();
        stride = n;
      }
      auto carry_of = [&](int64_t group, int64_t row) -> float* {
        if (!chunked) return nullptr;
        const int64_t offset = row - block;
        return carries.data() + (group * tiles_per_block + offset / kTileRows) * slot +
               offset % kTileRows * kTileTokens * lanes;
      };
      auto rows_for = [&](auto tokens_tag, int64_t t, int64_t group) {
        constexpr int kT = decltype(tokens_tag)::value;
        const float* xt = x + t * cols + k;
        float* ot = out + t * out_stride;
        int64_t r = block;
        for (; r + kTileRows <= block_end; r += kTileRows)
          Tile<0, kT, kTileRows>(xt, cols, weights, stride, r - block, n, first, last,
                                 carry_of(group, r), ot + r, out_stride);
        for (; r < block_end; ++r)
          Tile<0, kT, 1>(xt, cols, weights, stride, r - block, n, first, last, carry_of(group, r),
                         ot + r, out_stride);
      };
      int64_t t = 0, group = 0;
      for (; t + kTileTokens <= tokens; t += kTileTokens, ++group)
        rows_for(std::integral_constant<int, kTileTokens>(), t, group);
      for (; t < tokens; ++t, ++group) rows_for(std::integral_constant<int, 1>(), t, group);
    }
  }
}

void MatmulRows(const float* x, int64_t tokens, int64_t cols, const void* w, int type,
                int64_t row_begin, int64_t row_end, int64_t block_rows, float* out,
                int64_t out_stride) {
  if (type == 0)
    MatmulRowsT<0>(x, tokens, cols, w, row_begin, row_end, block_rows, out, out_stride);
  if (type == 1)
    MatmulRowsT<1>(x, tokens, cols, w, row_begin, row_end, block_rows, out, out_stride);
  if (type == 2)
    MatmulRowsT<2>(x, tokens, cols, w, row_begin, row_end, block_rows, out, out_stride);
}

// One token of the gated delta rule on one value head's state S [dk, dv] (row-major):
//   S *= decay;  m = S^T k;  S += k (beta (v - m))^T;  out = S^T q.
// Every quantity is per column j of S, so the columns go one vector at a time and both
// passes over that column block run while it sits in L1; a column's sums over the rows are
// in row order with one multiply-add per step, its tail columns by ScalarMulAdd (the same
// rounding), so no value depends on how the vector width splits the columns.
void DeltaRuleStep(float* HWY_RESTRICT state, int64_t dk, int64_t dv, const float* HWY_RESTRICT q,
                   const float* HWY_RESTRICT k, const float* HWY_RESTRICT v, float decay,
                   float beta, float* HWY_RESTRICT out) {
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const auto decay_v = hn::Set(df, decay);
  const auto beta_v = hn::Set(df, beta);
  int64_t j = 0;
  for (; j + lanes <= dv; j += lanes) {
    auto memory = hn::Zero(df);
    for (int64_t i = 0; i < dk; ++i) {
      float* cell = state + i * dv + j;
      const auto decayed = hn::Mul(hn::LoadU(df, cell), decay_v);
      hn::StoreU(decayed, df, cell);
      memory = hn::MulAdd(decayed, hn::Set(df, k[i]), memory);
    }
    const auto delta = hn::Mul(hn::Sub(hn::LoadU(df, v + j), memory), beta_v);
    auto output = hn::Zero(df);
    for (int64_t i = 0; i < dk; ++i) {
      float* cell = state + i * dv + j;
      const auto updated = hn::MulAdd(hn::Set(df, k[i]), delta, hn::LoadU(df, cell));
      hn::StoreU(updated, df, cell);
      output = hn::MulAdd(updated, hn::Set(df, q[i]), output);
    }
    hn::StoreU(output, df, out + j);
  }
  for (; j < dv; ++j) {
    float memory = 0.0f;
    for (int64_t i = 0; i < dk; ++i) {
      float& cell = state[i * dv + j];
      cell *= decay;
      memory = ScalarMulAdd(cell, k[i], memory);
    }
    const float delta = (v[j] - memory) * beta;
    float output = 0.0f;
    for (int64_t i = 0; i < dk; ++i) {
      float& cell = state[i * dv + j];
      cell = ScalarMulAdd(k[i], delta, cell);
      output = ScalarMulAdd(cell, q[i], output);
    }
    out[j] = output;
  }
}

// gate[i] = gate[i] / (1 + exp(-gate[i])) * up[i] (SiLU(gate) * up, the SwiGLU MLP), every
// element by the same vector code: the tail runs as a zero-padded vector, so a value does
// not depend on its position in the row or on the row's length.
// up == nullptr: gate[i] = SiLU(gate[i]) alone.
void SiluTimes(float* HWY_RESTRICT gate, const float* HWY_RESTRICT up, int64_t n) {
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const auto one = hn::Set(df, 1.0f);
  auto silu_times = [&](const auto g, const auto u) {
    return hn::Mul(hn::Div(g, hn::Add(one, hn::Exp(df, hn::Neg(g)))), u);
  };
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes)
    hn::StoreU(silu_times(hn::LoadU(df, gate + i), up ? hn::LoadU(df, up + i) : one), df, gate + i);
  if (i < n) {
    HWY_ALIGN float g_tail[HWY_MAX_BYTES / sizeof(float)] = {};
    HWY_ALIGN float u_tail[HWY_MAX_BYTES / sizeof(float)] = {};
    const size_t count = static_cast<size_t>(n - i);
    std::copy_n(gate + i, count, g_tail);
    if (up != nullptr) std::copy_n(up + i, count, u_tail);
    hn::Store(silu_times(hn::Load(df, g_tail), up ? hn::Load(df, u_tail) : one), df, g_tail);
    std::copy_n(g_tail, count, gate + i);
  }
}

// x[i] = exp(x[i] - max) / sum_j exp(x[j] - max), as torch.softmax: a NaN or +inf anywhere
// makes the whole row NaN (x - max is then NaN for some element and the sum is NaN).
void Softmax(float* HWY_RESTRICT x, int64_t n) {
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  if (n <= 0) return;
  auto max_v = hn::Set(df, -std::numeric_limits<float>::infinity());
  auto nan_seen = hn::Zero(df);  // all-ones lanes where a NaN was seen
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto v = hn::LoadU(df, x + i);
    nan_seen = hn::Or(nan_seen, hn::VecFromMask(df, hn::IsNaN(v)));
    max_v = hn::Max(max_v, v);
  }
  float max_score = hn::GetLane(hn::MaxOfLanes(df, max_v));
  bool poisoned = !hn::AllFalse(df, hn::MaskFromVec(nan_seen));
  for (int64_t j = i; j < n; ++j) {
    poisoned = poisoned || std::isnan(x[j]);
    max_score = std::max(max_score, x[j]);
  }
  if (poisoned || std::isinf(max_score)) {
    std::fill(x, x + n, std::numeric_limits<float>::quiet_NaN());
    return;
  }
  // Every x - max is <= 0 here (-inf included); below -104 the result is 0 (as exp rounds
  // it), and Exp only ever sees arguments inside its range.
  const auto shift = hn::Set(df, max_score), lower = hn::Set(df, -104.0f);
  auto sum_v = hn::Zero(df);
  for (i = 0; i + lanes <= n; i += lanes) {
    const auto v = hn::Sub(hn::LoadU(df, x + i), shift);
    const auto e = hn::IfThenZeroElse(hn::Lt(v, lower), hn::Exp(df, hn::Max(v, lower)));
    hn::StoreU(e, df, x + i);
    sum_v = hn::Add(sum_v, e);
  }
  float sum = hn::GetLane(hn::SumOfLanes(df, sum_v));
  for (int64_t j = i; j < n; ++j) {
    x[j] = std::exp(x[j] - max_score);
    sum += x[j];
  }
  const auto inverse = hn::Set(df, 1.0f / sum);
  for (i = 0; i + lanes <= n; i += lanes)
    hn::StoreU(hn::Mul(hn::LoadU(df, x + i), inverse), df, x + i);
  for (int64_t j = i; j < n; ++j) x[j] *= 1.0f / sum;
}

}  // namespace kvaudit::numerics::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvaudit::numerics {

HWY_EXPORT(MatmulRows);
HWY_EXPORT(Softmax);
HWY_EXPORT(SiluTimes);
HWY_EXPORT(DeltaRuleStep);

namespace {
int type_code(WeightType type) {
  switch (type) {
    case WeightType::f32:
      return 0;
    case WeightType::bf16:
      return 1;
    case WeightType::f16:
      return 2;
  }
  return 0;
}
// Weight bytes per row block of a multi-token matmul: the block stays in L2 (512 KiB per core
// on the machines we measure) while every token group passes over it.
constexpr int64_t kRowBlockBytes = int64_t{256} * 1024;
}  // namespace

void matmul(const float* x, int64_t tokens, const Matrix& w, float* out, ThreadPool& pool) {
  if (tokens <= 0 || w.rows <= 0) return;
  const int code = type_code(w.type);
  // Multi-token blocks are widened to F32 one column chunk at a time: 4 bytes per weight of
  // a chunk in L2.
  const int64_t row_bytes = std::min(w.cols, detail::kChunkColumns) * 4;
  // Decode streams every row once: 64-row tasks, several per thread, so a thread that starts
  // late does not leave the other one waiting. Prefill: L2-sized blocks, a multiple of both
  // row-tile heights (3 and 4).
  // Small matrices (the K and V projections) get at least two blocks per thread.
  const int64_t balanced_rows =
      (w.rows + int64_t{2} * pool.threads() - 1) / (int64_t{2} * pool.threads());
  const int64_t block_rows =
      tokens == 1 ? 64
                  : std::max<int64_t>(12, std::min(kRowBlockBytes / std::max<int64_t>(1, row_bytes),
                                                   balanced_rows + 11) /
                                              12 * 12);
  const int64_t blocks = (w.rows + block_rows - 1) / block_rows;
  const int tasks = static_cast<int>(std::min<int64_t>(blocks, 8 * int64_t{pool.threads()}));
  pool.parallel_for(blocks, tasks, [&](int, int64_t begin, int64_t end) {
    HWY_DYNAMIC_DISPATCH(MatmulRows)
    (x, tokens, w.cols, w.data, code, begin * block_rows, std::min(w.rows, end * block_rows),
     block_rows, out, w.rows);
  });
}

float weight_at(const Matrix& w, int64_t index) {
  switch (w.type) {
    case WeightType::f32:
      return detail::weight_scalar<0>(w.data, index);
    case WeightType::bf16:
      return detail::weight_scalar<1>(w.data, index);
    case WeightType::f16:
      return detail::weight_scalar<2>(w.data, index);
  }
  return 0.0f;
}

void weight_row(const Matrix& w, int64_t row, float* out) {
  for (int64_t c = 0; c < w.cols; ++c) out[c] = weight_at(w, row * w.cols + c);
}

void matmul_reference(const float* x, int64_t tokens, const Matrix& w, float* out) {
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t r = 0; r < w.rows; ++r) {
      double sum = 0.0;
      for (int64_t c = 0; c < w.cols; ++c)
        sum += static_cast<double>(x[t * w.cols + c]) * weight_at(w, r * w.cols + c);
      out[t * w.rows + r] = static_cast<float>(sum);
    }
  }
}

void softmax(float* x, int64_t n) {
  HWY_DYNAMIC_DISPATCH(Softmax)(x, n);
}

void silu_times(float* gate, const float* up, int64_t n) {
  HWY_DYNAMIC_DISPATCH(SiluTimes)(gate, up, n);
}

void silu(float* x, int64_t n) {
  HWY_DYNAMIC_DISPATCH(SiluTimes)(x, nullptr, n);
}

void delta_rule_step(float* state, int64_t dk, int64_t dv, const float* q, const float* k,
                     const float* v, float decay, float beta, float* out) {
  HWY_DYNAMIC_DISPATCH(DeltaRuleStep)(state, dk, dv, q, k, v, decay, beta, out);
}

}  // namespace kvaudit::numerics
#endif  // HWY_ONCE
