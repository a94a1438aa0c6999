// Matrix kernels of the forward pass: activations are F32, weights are read in their stored
// type (F32/BF16/F16) and widened in registers. Compiled once per SIMD target by Highway
// (foreach_target) and picked at run time. Each output element is one dot product summed in
// a fixed order (SIMD lanes, then the lane sum, then the scalar tail) by exactly one task, so
// results do not depend on the thread count or on how tokens/rows are tiled.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "model/kernels.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <cstring>

#include "model/model.h"

#ifndef KVAUDIT_MODEL_KERNELS_SCALAR_ONCE
#define KVAUDIT_MODEL_KERNELS_SCALAR_ONCE
namespace kvaudit::model::detail {
// Scalar widening of one stored weight element.
inline float bf16_bits_to_float(uint16_t bits) {
  uint32_t word = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &word, sizeof(value));
  return value;
}
inline float f16_bits_to_float(uint16_t bits) {
  uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  uint32_t exponent = (bits >> 10) & 0x1Fu;
  uint32_t mantissa = bits & 0x3FFu;
  uint32_t word;
  if (exponent == 0) {
    if (mantissa == 0) {
      word = sign;
    } else {  // subnormal: renormalise
      int shift = 0;
      while ((mantissa & 0x400u) == 0) {
        mantissa <<= 1;
        ++shift;
      }
      mantissa &= 0x3FFu;
      word = sign | static_cast<uint32_t>(127 - 15 - shift + 1) << 23 | mantissa << 13;
    }
  } else if (exponent == 0x1F) {
    word = sign | 0x7F800000u | mantissa << 13;
  } else {
    word = sign | (exponent + 127 - 15) << 23 | mantissa << 13;
  }
  float value;
  std::memcpy(&value, &word, sizeof(value));
  return value;
}
template <int kType>
inline float weight_scalar(const void* base, int64_t index) {
  if constexpr (kType == 0) {
    return static_cast<const float*>(base)[index];
  } else if constexpr (kType == 1) {
    return bf16_bits_to_float(static_cast<const uint16_t*>(base)[index]);
  } else {
    return f16_bits_to_float(static_cast<const uint16_t*>(base)[index]);
  }
}
}  // namespace kvaudit::model::detail
#endif

HWY_BEFORE_NAMESPACE();
namespace kvaudit::model::HWY_NAMESPACE {
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

// kT tokens x kR weight rows of dot products over `cols`, kept in kT*kR accumulators so each
// widened weight vector is reused kT times and each activation vector kR times.
template <int kType, int kT, int kR>
HWY_INLINE void Tile(const float* HWY_RESTRICT x, int64_t cols, const void* w, int64_t row0,
                     float* HWY_RESTRICT out, int64_t out_stride) {
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  using V = hn::Vec<decltype(df)>;
  V acc[kT][kR];
  for (int t = 0; t < kT; ++t)
    for (int r = 0; r < kR; ++r) acc[t][r] = hn::Zero(df);
  int64_t k = 0;
  for (; k + lanes <= cols; k += lanes) {
    V wv[kR];
    for (int r = 0; r < kR; ++r) wv[r] = LoadWeights<kType>(df, w, (row0 + r) * cols + k);
    for (int t = 0; t < kT; ++t) {
      const V xv = hn::LoadU(df, x + t * cols + k);
      for (int r = 0; r < kR; ++r) acc[t][r] = hn::MulAdd(xv, wv[r], acc[t][r]);
    }
  }
  for (int t = 0; t < kT; ++t) {
    for (int r = 0; r < kR; ++r) {
      float sum = hn::GetLane(hn::SumOfLanes(df, acc[t][r]));
      for (int64_t kk = k; kk < cols; ++kk)
        sum += x[t * cols + kk] * detail::weight_scalar<kType>(w, (row0 + r) * cols + kk);
      out[t * out_stride + r] = sum;
    }
  }
}

template <int kType, int kR>
HWY_INLINE void RowsAllTokens(const float* x, int64_t tokens, int64_t cols, const void* w,
                              int64_t row0, float* out, int64_t out_stride) {
  int64_t t = 0;
  for (; t + 4 <= tokens; t += 4)
    Tile<kType, 4, kR>(x + t * cols, cols, w, row0, out + t * out_stride + row0, out_stride);
  for (; t < tokens; ++t)
    Tile<kType, 1, kR>(x + t * cols, cols, w, row0, out + t * out_stride + row0, out_stride);
}

template <int kType>
void MatmulRowsT(const float* x, int64_t tokens, int64_t cols, const void* w, int64_t row_begin,
                 int64_t row_end, float* out, int64_t out_stride) {
  // One token (decode) is bound by reading weights: 4 rows at a time keep 4 independent
  // accumulation chains in flight. Several tokens: 4 tokens x 2 rows per tile.
  int64_t r = row_begin;
  if (tokens == 1) {
    for (; r + 4 <= row_end; r += 4) Tile<kType, 1, 4>(x, cols, w, r, out + r, out_stride);
  } else {
    for (; r + 2 <= row_end; r += 2)
      RowsAllTokens<kType, 2>(x, tokens, cols, w, r, out, out_stride);
  }
  for (; r < row_end; ++r) RowsAllTokens<kType, 1>(x, tokens, cols, w, r, out, out_stride);
}

void MatmulRows(const float* x, int64_t tokens, int64_t cols, const void* w, int type,
                int64_t row_begin, int64_t row_end, float* out, int64_t out_stride) {
  if (type == 0) MatmulRowsT<0>(x, tokens, cols, w, row_begin, row_end, out, out_stride);
  if (type == 1) MatmulRowsT<1>(x, tokens, cols, w, row_begin, row_end, out, out_stride);
  if (type == 2) MatmulRowsT<2>(x, tokens, cols, w, row_begin, row_end, out, out_stride);
}

float Dot(const float* HWY_RESTRICT a, const float* HWY_RESTRICT b, int64_t n) {
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  auto acc0 = hn::Zero(df), acc1 = hn::Zero(df);
  int64_t i = 0;
  for (; i + 2 * lanes <= n; i += 2 * lanes) {
    acc0 = hn::MulAdd(hn::LoadU(df, a + i), hn::LoadU(df, b + i), acc0);
    acc1 = hn::MulAdd(hn::LoadU(df, a + i + lanes), hn::LoadU(df, b + i + lanes), acc1);
  }
  for (; i + lanes <= n; i += lanes)
    acc0 = hn::MulAdd(hn::LoadU(df, a + i), hn::LoadU(df, b + i), acc0);
  float sum = hn::GetLane(hn::SumOfLanes(df, hn::Add(acc0, acc1)));
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

void Axpy(float alpha, const float* HWY_RESTRICT x, float* HWY_RESTRICT y, int64_t n) {
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const auto a = hn::Set(df, alpha);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes)
    hn::StoreU(hn::MulAdd(a, hn::LoadU(df, x + i), hn::LoadU(df, y + i)), df, y + i);
  for (; i < n; ++i) y[i] += alpha * x[i];
}

const char* TargetName() {
  return hwy::TargetName(HWY_TARGET);
}

}  // namespace kvaudit::model::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvaudit::model {

HWY_EXPORT(MatmulRows);
HWY_EXPORT(Dot);
HWY_EXPORT(Axpy);
HWY_EXPORT(TargetName);

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
// Rows per task block: keeps one block of weights (<= 16 rows) hot while all tokens pass.
constexpr int64_t kRowBlock = 16;
}  // namespace

void matmul(const float* x, int64_t tokens, const Matrix& w, float* out, ThreadPool& pool) {
  if (tokens <= 0 || w.rows <= 0) return;
  const int code = type_code(w.type);
  const int64_t blocks = (w.rows + kRowBlock - 1) / kRowBlock;
  const int tasks = static_cast<int>(std::min<int64_t>(blocks, pool.threads()));
  pool.parallel_for(blocks, tasks, [&](int, int64_t begin, int64_t end) {
    const int64_t row_begin = begin * kRowBlock;
    const int64_t row_end = std::min(w.rows, end * kRowBlock);
    for (int64_t r = row_begin; r < row_end; r += kRowBlock) HWY_DYNAMIC_DISPATCH(MatmulRows)
    (x, tokens, w.cols, w.data, code, r, std::min(row_end, r + kRowBlock), out, w.rows);
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

float dot(const float* a, const float* b, int64_t n) {
  return HWY_DYNAMIC_DISPATCH(Dot)(a, b, n);
}

void axpy(float a, const float* x, float* y, int64_t n) {
  HWY_DYNAMIC_DISPATCH(Axpy)(a, x, y, n);
}

std::string kernel_target_name() {
  return HWY_DYNAMIC_DISPATCH(TargetName)();
}

}  // namespace kvaudit::model
#endif  // HWY_ONCE
