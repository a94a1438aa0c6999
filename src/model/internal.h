// model/ internal: the forward pass's scratch buffers and the helpers forward.cpp and
// delta_net.cpp share. Not a public header.
#pragma once

#include <cstdlib>
#include <new>
#include <vector>

#include "model/model.h"

namespace kvaudit::model {

// 64-byte aligned storage for the matmuls' activation inputs: a vector load that splits a
// cache line costs two.
template <class T>
struct CacheLineAllocator {
  using value_type = T;
  CacheLineAllocator() = default;
  template <class U>
  CacheLineAllocator(const CacheLineAllocator<U>&) {}
  T* allocate(size_t count) {
    const size_t bytes = (count * sizeof(T) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, bytes == 0 ? 64 : bytes);
    if (p == nullptr) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t) { std::free(p); }
  template <class U>
  bool operator==(const CacheLineAllocator<U>&) const {
    return true;
  }
};
using AlignedFloats = std::vector<float, CacheLineAllocator<float>>;

struct Session::Scratch {
  std::vector<float> x;                   // [n, hidden] residual stream
  AlignedFloats xb;                       // [n, hidden] normalised input of a sub-block
  std::vector<float> q;                   // [n, heads * head_dim]
  std::vector<float> q_gate;              // [n, heads * 2 * head_dim] q_proj with the output gate
  std::vector<float> att_gate;            // [n, heads * head_dim]
  std::vector<float> k, v;                // [n, kv_heads * head_dim]
  AlignedFloats att;                      // [n, heads * head_dim] attention output
  AlignedFloats gate, up;                 // [n, intermediate]
  std::vector<float> proj;                // [n, hidden] output of o_proj / down_proj
  std::vector<float> keys, values;        // [cache tokens, kv_heads * head_dim] decoded cache
  std::vector<float> rope_cos, rope_sin;  // [n, rotary_dim / 2] of the batch's positions
  std::vector<float> norm_weight;         // [max(hidden, head_dim)] widened norm weights
  // Gated DeltaNet
  std::vector<float> mixed;        // [n, conv_width] in_proj_qkv, then convolved [q | k | v]
  AlignedFloats z;                 // [n, value_width] output gate, then SiLU(z) x the normed output
  std::vector<float> beta, decay;  // [n, value_heads] write strength, state decay factor
  AlignedFloats core;              // [n, value_width] delta-rule output
};

// out = in / rms(in) * (weight + weight_offset), the sum of squares in double.
void rms_norm(const float* in, const Matrix& weight, float eps, int64_t width, float* out,
              float weight_offset);

}  // namespace kvaudit::model
