// The scalar multiply-add of the tiled GEMM kernels (attention_kernels.cpp, matmul.cpp),
// compiled per target by the file that includes it, and the unroll their tiles need.

// The tile loops over accumulators must be unrolled fully: GCC otherwise keeps the
// accumulator arrays in memory and stores all of them on every step (half the speed).
#ifndef KV_UNROLL
#define KV_UNROLL _Pragma("GCC unroll 16")
#endif
#if defined(KVAUDIT_NUMERICS_MUL_ADD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVAUDIT_NUMERICS_MUL_ADD_INL_H_
#undef KVAUDIT_NUMERICS_MUL_ADD_INL_H_
#else
#define KVAUDIT_NUMERICS_MUL_ADD_INL_H_
#endif

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace kvaudit::numerics::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// a * b + c rounded exactly as hn::MulAdd rounds it on this target (one rounding where the
// target has FMA), so the scalar leftovers of a tiled loop give the bits its vector lanes
// would: which queries/keys/columns are leftovers depends on the block sizes a caller picks
// (and a 1-token and a 4-token tile must agree), and results must not. Written out as
// a * b + c, the compiler may or may not contract it per instantiation.
HWY_INLINE float ScalarMulAdd(float a, float b, float c) {
  const hn::CappedTag<float, 1> d1;
  return hn::GetLane(hn::MulAdd(hn::Set(d1, a), hn::Set(d1, b), hn::Set(d1, c)));
}

}  // namespace kvaudit::numerics::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard toggle
