// model/ internal: the forward pass's scratch buffers and the helpers forward.cpp and
// delta_net.cpp share. Not a public header.
#pragma once

#include <vector>

#include "model/model.h"

namespace kvaudit::model {

struct Session::Scratch {
  std::vector<float> x;             // [n, hidden] residual stream
  std::vector<float> xb;            // [n, hidden] normalised input of a sub-block
  std::vector<float> q;             // [n, heads * head_dim]
  std::vector<float> q_gate;        // [n, heads * 2 * head_dim] q_proj with the output gate
  std::vector<float> att_gate;      // [n, heads * head_dim]
  std::vector<float> k, v;          // [n, kv_heads * head_dim]
  std::vector<float> att;           // [n, heads * head_dim] attention output
  std::vector<float> gate, up;      // [n, intermediate]
  std::vector<float> proj;          // [n, hidden] output of o_proj / down_proj
  std::vector<float> keys, values;  // [cache tokens, kv_heads * head_dim] decoded cache
  std::vector<float> norm_weight;   // [max(hidden, head_dim)] widened norm weights
  // Gated DeltaNet
  std::vector<float> mixed;        // [n, conv_width] in_proj_qkv, then convolved [q | k | v]
  std::vector<float> z;            // [n, value_width] output gate
  std::vector<float> beta, decay;  // [n, value_heads] write strength, state decay factor
  std::vector<float> core;         // [n, value_width] delta-rule output
};

// out = in / rms(in) * (weight + weight_offset), the sum of squares in double.
void rms_norm(const float* in, const Matrix& weight, float eps, int64_t width, float* out,
              float weight_offset);

}  // namespace kvaudit::model
