// Gated DeltaNet, Qwen3.5's linear-attention layer, top to bottom (as transformers'
// modeling_qwen3_5.py Qwen3_5GatedDeltaNet defines it):
//   in_proj_qkv -> causal depthwise conv (conv_kernel taps, state = the last taps - 1
//   inputs) -> SiLU -> split [q | k | v] -> L2-normalise q and k per head, q / sqrt(d_k)
//   beta = sigmoid(in_proj_b), decay = exp(-exp(A_log) * softplus(in_proj_a + dt_bias))
//   per value head h (its key head h / (value_heads / key_heads)), per token:
//     S *= decay;  delta = beta * (v - S^T k);  S += k delta^T;  o = S^T q
//   gated RMSNorm: o / rms(o) * norm.weight * SiLU(in_proj_z) -> out_proj.
// The state S [key_head_dim, value_head_dim] is updated in F32 and rounded to the
// session's StateFormat where an engine stores it (model.h).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "model/internal.h"
#include "model/model.h"
#include "util/util.h"

namespace kvaudit::model {

StateFormat parse_state_format(std::string_view text, int64_t store_every_tokens) {
  StateFormat format;
  const std::string whole(text);
  int64_t kernel_chunk_tokens = 0;
  if (const size_t colon = text.find(':'); colon != std::string_view::npos) {
    const std::string_view suffix = text.substr(colon + 1);
    std::optional<int64_t> chunk = 64;
    if (suffix.rfind("fla", 0) == 0 && suffix.size() > 3)
      chunk = parse_token_count(suffix.substr(3));
    if (suffix.rfind("fla", 0) != 0 || !chunk || *chunk < 1 || *chunk > (1 << 20))
      throw InputError("--state-dtype",
                       fmt::format("\"{}\": after the precision only \":fla\" or \":flaN\" "
                                   "(FLA's chunked prefill, N-token chunks) may follow",
                                   whole));
    kernel_chunk_tokens = *chunk;
    text = text.substr(0, colon);
  }
  if (text == "fp32" || text == "float32" || text == "f32") {
    format.dtype = StateDtype::f32;
    format.spec = "fp32";
  } else if (text == "bf16" || text == "bfloat16") {
    format.dtype = StateDtype::bf16;
    format.spec = "bf16";
  } else if (text == "fp16" || text == "float16" || text == "f16") {
    format.dtype = StateDtype::f16;
    format.spec = "fp16";
  } else if (text == "int8") {
    format.dtype = StateDtype::int8;
    format.spec = "int8";
  } else {
    throw InputError("--state-dtype",
                     fmt::format("\"{}\" is not a state precision (fp32, bf16, fp16, int8)", text));
  }
  if (store_every_tokens < 0)
    throw InputError("--state-chunk", "must be 0 (end of each call) or a positive token count");
  format.store_every_tokens = store_every_tokens;
  format.kernel_chunk_tokens = kernel_chunk_tokens;
  if (kernel_chunk_tokens > 0) format.spec += fmt::format(":fla{}", kernel_chunk_tokens);
  return format;
}

void round_state(const StateFormat& format, std::span<float> state, int64_t row_width) {
  switch (format.dtype) {
    case StateDtype::f32:
      return;
    case StateDtype::bf16:
      for (float& x : state) x = numerics::bf16_to_float(numerics::float_to_bf16(x));
      return;
    case StateDtype::f16:
      for (float& x : state) x = numerics::fp16_to_float(numerics::float_to_fp16(x));
      return;
    case StateDtype::int8:
      for (size_t begin = 0; begin < state.size(); begin += static_cast<size_t>(row_width)) {
        std::span<float> row = state.subspan(begin, static_cast<size_t>(row_width));
        float amax = 0.0f;
        for (float x : row)
          if (!(std::fabs(x) <= amax)) amax = std::fabs(x);  // a NaN sticks
        if (amax == 0.0f || !std::isfinite(amax)) {
          if (!std::isfinite(amax))
            std::fill(row.begin(), row.end(), std::numeric_limits<float>::quiet_NaN());
          continue;
        }
        const float scale = amax / 127.0f;
        for (float& x : row) x = std::clamp(std::nearbyint(x / scale), -127.0f, 127.0f) * scale;
      }
      return;
  }
}

int64_t Session::state_bytes() const {
  const int64_t per_element = state_format_.dtype == StateDtype::f32    ? 4
                              : state_format_.dtype == StateDtype::int8 ? 1
                                                                        : 2;
  const DeltaNetConfig& d = model_.config().delta_net;
  int64_t bytes = 0;
  for (size_t layer = 0; layer < recurrent_state_.size(); ++layer) {
    if (recurrent_state_[layer].empty()) continue;
    bytes += static_cast<int64_t>(recurrent_state_[layer].size()) * per_element;
    if (state_format_.dtype == StateDtype::int8)  // one F32 scale per value head and key row
      bytes += int64_t{d.value_heads} * d.key_head_dim * 4;
    bytes += static_cast<int64_t>(conv_state_[layer].size()) * 4;  // kept in F32 here
  }
  return bytes;
}

namespace {

// torch.nn.functional.softplus (beta 1, threshold 20).
float softplus(float x) {
  return x > 20.0f ? x : std::log1p(std::exp(x));
}

// x * 1 / sqrt(sum x^2 + 1e-6), as transformers' l2norm (and FLA) compute it.
void l2_normalise(float* x, int64_t width, float extra_scale) {
  double sum_squares = 0.0;
  for (int64_t i = 0; i < width; ++i) sum_squares += static_cast<double>(x[i]) * x[i];
  const float inverse = static_cast<float>(1.0 / std::sqrt(sum_squares + 1e-6)) * extra_scale;
  for (int64_t i = 0; i < width; ++i) x[i] *= inverse;
}

}  // namespace

void Session::delta_net_block(int layer, int64_t n, bool store_state_at_end) {
  const ModelConfig& c = model_.config();
  const DeltaNetConfig& d = c.delta_net;
  const LayerWeights& w = model_.layers()[layer];
  Scratch& s = *scratch_;
  const int64_t conv_width = d.conv_width(), value_width = d.value_width();
  const int64_t taps = d.conv_kernel;
  s.mixed.resize(n * conv_width);
  s.z.resize(n * value_width);
  s.beta.resize(n * d.value_heads);
  s.decay.resize(n * d.value_heads);
  s.core.resize(n * value_width);
  matmul(s.xb.data(), n, w.in_qkv, s.mixed.data(), pool_);
  matmul(s.xb.data(), n, w.in_z, s.z.data(), pool_);
  matmul(s.xb.data(), n, w.in_b, s.beta.data(), pool_);
  matmul(s.xb.data(), n, w.in_a, s.decay.data(), pool_);

  // Causal depthwise convolution, in place per channel from the last token back (token t
  // reads inputs t - taps + 1 .. t, earlier ones from the conv state), then SiLU; the conv
  // state keeps the last taps - 1 inputs for the next call.
  std::vector<float>& history = conv_state_[layer];  // [taps - 1, conv_width]
  constexpr int64_t kChannelBlock = 64;
  const int64_t blocks = (conv_width + kChannelBlock - 1) / kChannelBlock;
  pool_.parallel_for(blocks, static_cast<int>(blocks), [&](int, int64_t begin, int64_t end) {
    std::vector<float> tail(static_cast<size_t>((taps - 1) * kChannelBlock));
    std::vector<float> weights(static_cast<size_t>(taps * kChannelBlock));
    for (int64_t block = begin; block < end; ++block) {
      const int64_t c0 = block * kChannelBlock, c1 = std::min(conv_width, c0 + kChannelBlock);
      // The block's taps widened once (exact), not once per token.
      for (int64_t ch = c0; ch < c1; ++ch)
        for (int64_t j = 0; j < taps; ++j)
          weights[(ch - c0) * taps + j] = weight_at(w.conv, ch * taps + j);
      // Input at token index t (negative: from the history).
      auto input = [&](int64_t t, int64_t ch) {
        return t >= 0 ? s.mixed[t * conv_width + ch] : history[(taps - 1 + t) * conv_width + ch];
      };
      // The next history: inputs at tokens n - taps + 1 .. n - 1 (read before overwriting).
      for (int64_t j = 0; j < taps - 1; ++j)
        for (int64_t ch = c0; ch < c1; ++ch)
          tail[j * kChannelBlock + (ch - c0)] = input(n - (taps - 1) + j, ch);
      for (int64_t t = n - 1; t >= 0; --t)
        for (int64_t ch = c0; ch < c1; ++ch) {
          float sum = 0.0f;
          for (int64_t j = 0; j < taps; ++j)
            sum += weights[(ch - c0) * taps + j] * input(t - (taps - 1) + j, ch);
          s.mixed[t * conv_width + ch] = sum;  // SiLU below, by rows
        }
      for (int64_t j = 0; j < taps - 1; ++j)
        for (int64_t ch = c0; ch < c1; ++ch)
          history[j * conv_width + ch] = tail[j * kChannelBlock + (ch - c0)];
    }
  });

  const float query_scale = 1.0f / std::sqrt(static_cast<float>(d.key_head_dim));
  for_each_token(n, [&](int64_t t) {
    float* row = &s.mixed[t * conv_width];
    numerics::silu(row, conv_width);
    for (int h = 0; h < d.key_heads; ++h) {
      l2_normalise(row + int64_t(h) * d.key_head_dim, d.key_head_dim, query_scale);
      l2_normalise(row + d.key_width() + int64_t(h) * d.key_head_dim, d.key_head_dim, 1.0f);
    }
    for (int h = 0; h < d.value_heads; ++h) {
      float& beta = s.beta[t * d.value_heads + h];
      beta = 1.0f / (1.0f + std::exp(-beta));
      float& decay = s.decay[t * d.value_heads + h];
      const float g = -std::exp(weight_at(w.a_log, h)) * softplus(decay + weight_at(w.dt_bias, h));
      decay = std::exp(g);
    }
  });

  delta_rule(layer, n, store_state_at_end);

  // Gated RMSNorm per value head (its weight is used as stored: Qwen3_5RMSNormGated is not
  // zero-centred), times SiLU(z) written into z, then the output projection from z.
  const int64_t dv = d.value_head_dim;
  for_each_token(n, [&](int64_t t) {
    for (int h = 0; h < d.value_heads; ++h) {
      float* head = &s.core[t * value_width + h * dv];
      rms_norm(head, w.delta_norm, c.rms_norm_eps, dv, head, 0.0f);
    }
    numerics::silu_times(&s.z[t * value_width], &s.core[t * value_width], value_width);
  });
  matmul(s.z.data(), n, w.delta_out, s.proj.data(), pool_);
}

// The delta rule over the batch, one task per value head; each head's tokens run in order,
// one numerics::delta_rule_step (SIMD over value_head_dim) per token.
void Session::delta_rule(int layer, int64_t n, bool store_state_at_end) {
  const DeltaNetConfig& d = model_.config().delta_net;
  Scratch& s = *scratch_;
  const int64_t dk = d.key_head_dim, dv = d.value_head_dim;
  const int64_t conv_width = d.conv_width(), value_width = d.value_width();
  const int group = d.value_heads / d.key_heads;
  std::vector<float>& state = recurrent_state_[layer];
  const int64_t every = state_format_.store_every_tokens;
  const bool rounds = state_format_.dtype != StateDtype::f32;
  const int64_t chunk = call_tokens_ > 1 ? state_format_.kernel_chunk_tokens : 0;
  if (chunk > 0) {
    chunk_carry_.resize(recurrent_state_.size());
    chunk_carry_decay_.resize(recurrent_state_.size());
    chunk_carry_[layer].resize(state.size());
    chunk_carry_decay_[layer].resize(static_cast<size_t>(d.value_heads));
  }
  StateFormat chunk_format;
  chunk_format.dtype = state_format_.kernel_chunk_dtype;
  pool_.parallel_for(d.value_heads, d.value_heads, [&](int, int64_t begin, int64_t end) {
    for (int64_t h = begin; h < end; ++h) {
      float* head_state = &state[h * dk * dv];
      const std::span<float> head_span(head_state, static_cast<size_t>(dk * dv));
      const int64_t key_head = h / group;
      for (int64_t t = 0; t < n; ++t) {
        const int64_t position = position_ + t;
        const int64_t in_call = position - call_start_;
        float* carry = chunk > 0 ? &chunk_carry_[layer][h * dk * dv] : nullptr;
        float* carry_decay = chunk > 0 ? &chunk_carry_decay_[layer][h] : nullptr;
        if (chunk > 0 && in_call % chunk == 0) {
          // The chunk reads the state in the kernel's dtype; the rest waits in F32.
          std::copy(head_span.begin(), head_span.end(), carry);
          round_state(chunk_format, head_span, dv);
          for (int64_t i = 0; i < dk * dv; ++i) carry[i] -= head_state[i];
          *carry_decay = 1.0f;
        }
        const float* row = &s.mixed[t * conv_width];
        const float* q = row + key_head * dk;
        const float* k = row + d.key_width() + key_head * dk;
        const float* v = row + 2 * d.key_width() + h * dv;
        const float decay = s.decay[t * d.value_heads + h];
        const float beta = s.beta[t * d.value_heads + h];
        numerics::delta_rule_step(head_state, dk, dv, q, k, v, decay, beta,
                                  &s.core[t * value_width + h * dv]);
        if (chunk > 0) {
          *carry_decay *= decay;
          if ((in_call + 1) % chunk == 0 || in_call + 1 == call_tokens_)
            for (int64_t i = 0; i < dk * dv; ++i) head_state[i] += *carry_decay * carry[i];
        }
        const bool store =
            (every > 0 && (position + 1) % every == 0) || (store_state_at_end && t == n - 1);
        if (rounds && store) round_state(state_format_, head_span, dv);
      }
    }
  });
}

}  // namespace kvaudit::model
