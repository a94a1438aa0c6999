// The forward pass, top to bottom in data-flow order (llama2.c style): embedding, then per
// layer RMSNorm -> Q/K/V projections (+bias) -> QK-norm -> RoPE -> KV cache append (encoded
// in the session's KV format) -> attention over the decoded cache -> output projection ->
// residual -> RMSNorm -> SwiGLU MLP -> residual; final RMSNorm and the LM head.
// Every token, prefill or decode, reads K/V back from the cache, so the KV format acts on
// the whole attention exactly as a cache that stores the format does (llama.cpp semantics).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "model/internal.h"
#include "model/model.h"
#include "util/util.h"

namespace kvaudit::model {

void rms_norm(const float* in, const Matrix& weight, float eps, int64_t width, float* out,
              float weight_offset) {
  double sum_squares = 0.0;
  for (int64_t i = 0; i < width; ++i) sum_squares += static_cast<double>(in[i]) * in[i];
  const float inverse = static_cast<float>(1.0 / std::sqrt(sum_squares / width + eps));
  if (weight_offset == 0.0f) {
    for (int64_t i = 0; i < width; ++i) out[i] = in[i] * inverse * weight_at(weight, i);
  } else {
    for (int64_t i = 0; i < width; ++i)
      out[i] = in[i] * inverse * (weight_at(weight, i) + weight_offset);
  }
}

void Session::for_each_token(int64_t tokens, const std::function<void(int64_t)>& body) {
  const int tasks = static_cast<int>(std::min<int64_t>(tokens, 4 * int64_t{pool_.threads()}));
  pool_.parallel_for(tokens, tasks, [&](int, int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) body(t);
  });
}

namespace {

void add_bias(float* rows, int64_t tokens, const Matrix& bias) {
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t i = 0; i < bias.cols; ++i) rows[t * bias.cols + i] += weight_at(bias, i);
}

// Rotates the first rotary_dim dimensions of one head in place: pairs (i, i + rotary_dim/2)
// as Hugging Face's rotate_half does, by the angle whose cos/sin the token's row of the
// rotation table holds ([rotary_dim / 2] each).
void apply_rope(float* head, const float* cos_row, const float* sin_row, size_t half) {
  for (size_t i = 0; i < half; ++i) {
    const float c = cos_row[i], s = sin_row[i];
    float a = head[i], b = head[i + half];
    head[i] = a * c - b * s;
    head[i + half] = b * c + a * s;
  }
}

void channel_amax(const float* rows, int64_t tokens, int64_t width, std::vector<float>& amax) {
  if (amax.empty()) amax.assign(width, 0.0f);
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t i = 0; i < width; ++i) {
      float a = std::fabs(rows[t * width + i]);
      if (a > amax[i]) amax[i] = a;  // NaN never compares greater: ignored
    }
}

}  // namespace

Session::Session(const Model& model, const numerics::KvFormat& kv_format, ThreadPool& pool,
                 std::vector<std::array<numerics::StaticAmax, 2>> calibration, StateFormat state)
    : model_(model),
      kv_format_(kv_format),
      pool_(pool),
      scratch_(std::make_unique<Scratch>()),
      state_format_(std::move(state)) {
  const ModelConfig& c = model.config();
  if (!calibration.empty() && static_cast<int>(calibration.size()) != c.num_layers)
    throw InputError("calibration",
                     fmt::format("has {} layers, the model {}", calibration.size(), c.num_layers));
  numerics::KvLayout layout{c.num_kv_heads, c.head_dim};
  conv_state_.resize(c.num_layers);
  recurrent_state_.resize(c.num_layers);
  for (int layer = 0; layer < c.num_layers; ++layer) {
    if (c.mixers[layer] == Mixer::gated_delta_net) {
      conv_state_[layer].assign((c.delta_net.conv_kernel - 1) * c.delta_net.conv_width(), 0.0f);
      recurrent_state_[layer].assign(c.delta_net.state_floats(), 0.0f);
    }
    numerics::StaticAmax k_amax, v_amax;
    if (!calibration.empty()) {
      k_amax = calibration[layer][0];
      v_amax = calibration[layer][1];
    }
    k_streams_.emplace_back(kv_format, layout, numerics::KvRole::key, k_amax);
    v_streams_.emplace_back(kv_format, layout, numerics::KvRole::value, v_amax);
  }
  inverse_frequencies_ = rope_inverse_frequencies(c.rope);
  amax_.resize(c.num_layers);
  layer_counts_.resize(c.num_layers);
}

Session::~Session() = default;

numerics::EncodeCounts Session::encode_counts() const {
  numerics::EncodeCounts total;
  for (const auto& layer : layer_counts_) {
    total.merge(layer[0]);
    total.merge(layer[1]);
  }
  return total;
}

void Session::reset() {
  truncate(0);
}

void Session::truncate(int64_t tokens) {
  if (tokens < 0 || tokens > position_)
    throw InputError("session", fmt::format("cannot truncate {} tokens to {}", position_, tokens));
  if (model_.config().hybrid() && tokens != 0 && tokens != position_)
    throw InputError("session", fmt::format("cannot truncate {} tokens to {}: a recurrent state "
                                            "cannot be rewound",
                                            position_, tokens));
  for (auto& s : k_streams_) s.truncate(tokens);
  for (auto& s : v_streams_) s.truncate(tokens);
  if (tokens == 0) {
    for (auto& state : conv_state_) std::fill(state.begin(), state.end(), 0.0f);
    for (auto& state : recurrent_state_) std::fill(state.begin(), state.end(), 0.0f);
  }
  position_ = tokens;
}

int64_t KvSnapshot::stored_bytes() const {
  int64_t bytes = 0;
  for (const auto& s : k) bytes += s.stored_bytes();
  for (const auto& s : v) bytes += s.stored_bytes();
  return bytes;
}

KvSnapshot KvSnapshot::Copy() const {
  KvSnapshot copy;
  copy.tokens = tokens;
  copy.k.reserve(k.size());
  copy.v.reserve(v.size());
  for (const auto& s : k) copy.k.push_back(s.Copy());
  for (const auto& s : v) copy.v.push_back(s.Copy());
  return copy;
}

KvSnapshot Session::snapshot() const {
  if (model_.config().hybrid())
    throw InputError("session", "a hybrid model's recurrent state is not part of a KV snapshot");
  KvSnapshot snapshot;
  snapshot.tokens = position_;
  snapshot.k.reserve(k_streams_.size());
  snapshot.v.reserve(v_streams_.size());
  for (const auto& s : k_streams_) snapshot.k.push_back(s.Copy());
  for (const auto& s : v_streams_) snapshot.v.push_back(s.Copy());
  return snapshot;
}

void Session::restore(const KvSnapshot& snapshot) {
  if (model_.config().hybrid())
    throw InputError("session", "a hybrid model's recurrent state is not part of a KV snapshot");
  if (snapshot.k.size() != k_streams_.size() || snapshot.v.size() != v_streams_.size())
    throw InputError("session", fmt::format("a snapshot of {} layers cannot fill a cache of {}",
                                            snapshot.k.size(), k_streams_.size()));
  for (size_t layer = 0; layer < k_streams_.size(); ++layer) {
    const auto& k = snapshot.k[layer];
    const auto& v = snapshot.v[layer];
    if (k.tokens() != snapshot.tokens || v.tokens() != snapshot.tokens ||
        k.format().spec != kv_format_.spec || v.format().spec != kv_format_.spec)
      throw InputError("session", fmt::format("layer {} of the snapshot does not match the cache "
                                              "({} tokens of {}, the cache stores {})",
                                              layer, k.tokens(), k.format().spec, kv_format_.spec));
  }
  for (size_t layer = 0; layer < k_streams_.size(); ++layer) {
    k_streams_[layer] = snapshot.k[layer].Copy();
    v_streams_[layer] = snapshot.v[layer].Copy();
  }
  position_ = snapshot.tokens;
}

int64_t Session::kv_bytes() const {
  int64_t bytes = 0;
  for (const auto& s : k_streams_) bytes += s.stored_bytes();
  for (const auto& s : v_streams_) bytes += s.stored_bytes();
  return bytes;
}

void Session::capture_amax(bool enabled) {
  capture_ = enabled;
}

void Session::decode(int32_t token, std::vector<float>& logits) {
  forward(std::span<const int32_t>(&token, 1), 0, logits);
}

void Session::forward(std::span<const int32_t> tokens, int64_t logits_from,
                      std::vector<float>& logits) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t vocab = model_.config().vocab_size;
  for (int32_t token : tokens)
    if (token < 0 || token >= vocab)
      throw InputError("tokens",
                       fmt::format("token id {} is outside the vocabulary [0, {})", token, vocab));
  logits_from = std::clamp<int64_t>(logits_from, 0, n);
  logits.assign(static_cast<size_t>((n - logits_from) * vocab), 0.0f);
  call_start_ = position_;
  call_tokens_ = n;
  const int64_t batch = std::max<int64_t>(1, max_batch_tokens);
  for (int64_t begin = 0; begin < n; begin += batch) {
    const int64_t count = std::min(batch, n - begin);
    const int64_t local_from = std::clamp<int64_t>(logits_from - begin, 0, count);
    float* out =
        local_from < count ? logits.data() + (begin + local_from - logits_from) * vocab : nullptr;
    forward_batch(tokens.subspan(begin, count), local_from, out, begin + count == n);
  }
}

void Session::forward_batch(std::span<const int32_t> tokens, int64_t logits_from, float* logits,
                            bool store_state_at_end) {
  const ModelConfig& c = model_.config();
  Scratch& s = *scratch_;
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t hidden = c.hidden_size;
  s.x.resize(n * hidden);
  s.xb.resize(n * hidden);
  s.gate.resize(n * c.intermediate_size);
  s.up.resize(n * c.intermediate_size);
  s.proj.resize(n * hidden);
  const float offset = c.norm_weight_offset;

  // The element-wise steps between the matmuls are split over tokens (for_each_token):
  // each token's values are computed by one task, so results do not depend on the thread
  // count, and on a prefill they do not leave the other threads idle.
  for_each_token(n,
                 [&](int64_t t) { weight_row(model_.embedding(), tokens[t], &s.x[t * hidden]); });
  // The rotation of each of the batch's positions, once for every layer and head (the same
  // float values a per-head computation gives: cos/sin of position x inverse frequency).
  const size_t half = inverse_frequencies_.size();
  s.rope_cos.resize(n * half);
  s.rope_sin.resize(n * half);
  for_each_token(n, [&](int64_t t) {
    const double position = static_cast<double>(position_ + t);
    for (size_t i = 0; i < half; ++i) {
      const double angle = position * inverse_frequencies_[i];
      s.rope_cos[t * half + i] = static_cast<float>(std::cos(angle) * c.rope.attention_factor);
      s.rope_sin[t * half + i] = static_cast<float>(std::sin(angle) * c.rope.attention_factor);
    }
  });

  for (int layer = 0; layer < c.num_layers; ++layer) {
    const LayerWeights& w = model_.layers()[layer];
    for_each_token(n, [&](int64_t t) {
      rms_norm(&s.x[t * hidden], w.attn_norm, c.rms_norm_eps, hidden, &s.xb[t * hidden], offset);
    });
    // The token mixer writes its output projection to s.proj.
    if (c.mixers[layer] == Mixer::gated_delta_net) {
      delta_net_block(layer, n, store_state_at_end);
    } else {
      attention_block(layer, n);
    }
    for_each_token(n, [&](int64_t t) {
      for (int64_t i = t * hidden; i < (t + 1) * hidden; ++i) s.x[i] += s.proj[i];
      rms_norm(&s.x[t * hidden], w.mlp_norm, c.rms_norm_eps, hidden, &s.xb[t * hidden], offset);
    });
    matmul(s.xb.data(), n, w.gate, s.gate.data(), pool_);
    matmul(s.xb.data(), n, w.up, s.up.data(), pool_);
    const int64_t inter = c.intermediate_size;
    for_each_token(n, [&](int64_t t) {
      numerics::silu_times(&s.gate[t * inter], &s.up[t * inter], inter);  // SiLU(gate) * up
    });
    matmul(s.gate.data(), n, w.down, s.proj.data(), pool_);
    for_each_token(n, [&](int64_t t) {
      for (int64_t i = t * hidden; i < (t + 1) * hidden; ++i) s.x[i] += s.proj[i];
    });
  }
  position_ += n;

  if (logits == nullptr || logits_from >= n) return;
  const int64_t scored = n - logits_from;
  for (int64_t t = logits_from; t < n; ++t)
    rms_norm(&s.x[t * hidden], model_.final_norm(), c.rms_norm_eps, hidden,
             &s.xb[(t - logits_from) * hidden], offset);
  matmul(s.xb.data(), scored, model_.lm_head(), logits, pool_);
}

// Q/K/V projections (+bias, + the output gate) -> QK-norm -> RoPE -> KV cache append
// (encoded in the session's KV format) -> attention over the decoded cache -> (gate) ->
// output projection into s.proj.
void Session::attention_block(int layer, int64_t n) {
  const ModelConfig& c = model_.config();
  const LayerWeights& w = model_.layers()[layer];
  Scratch& s = *scratch_;
  const int64_t hd = c.head_dim;
  const int64_t q_width = c.num_heads * hd, kv_width = c.num_kv_heads * hd;
  s.q.resize(n * q_width);
  s.k.resize(n * kv_width);
  s.v.resize(n * kv_width);
  s.att.resize(n * q_width);
  if (c.attention_output_gate) {
    // q_proj rows are [q | gate] per head (transformers: view(..., -1, 2 * head_dim), chunk).
    s.q_gate.resize(n * 2 * q_width);
    s.att_gate.resize(n * q_width);
    matmul(s.xb.data(), n, w.q, s.q_gate.data(), pool_);
    if (c.attention_bias) add_bias(s.q_gate.data(), n, w.q_bias);
    for_each_token(n, [&](int64_t t) {
      for (int h = 0; h < c.num_heads; ++h) {
        const float* row = &s.q_gate[(t * c.num_heads + h) * 2 * hd];
        std::copy_n(row, hd, &s.q[t * q_width + h * hd]);
        std::copy_n(row + hd, hd, &s.att_gate[t * q_width + h * hd]);
      }
    });
  } else {
    matmul(s.xb.data(), n, w.q, s.q.data(), pool_);
    if (c.attention_bias) add_bias(s.q.data(), n, w.q_bias);
  }
  matmul(s.xb.data(), n, w.k, s.k.data(), pool_);
  matmul(s.xb.data(), n, w.v, s.v.data(), pool_);
  if (c.attention_bias) {
    add_bias(s.k.data(), n, w.k_bias);
    add_bias(s.v.data(), n, w.v_bias);
  }
  const float offset = c.norm_weight_offset;
  for_each_token(n, [&](int64_t t) {
    const size_t half = inverse_frequencies_.size();
    const float* cos_row = &s.rope_cos[t * half];
    const float* sin_row = &s.rope_sin[t * half];
    for (int h = 0; h < c.num_heads; ++h) {
      float* head = &s.q[t * q_width + h * hd];
      if (c.qk_norm) rms_norm(head, w.q_norm, c.rms_norm_eps, hd, head, offset);
      apply_rope(head, cos_row, sin_row, half);
    }
    for (int h = 0; h < c.num_kv_heads; ++h) {
      float* head = &s.k[t * kv_width + h * hd];
      if (c.qk_norm) rms_norm(head, w.k_norm, c.rms_norm_eps, hd, head, offset);
      apply_rope(head, cos_row, sin_row, half);
    }
  });
  if (capture_) record_amax(layer, n);
  for (int64_t t = 0; t < n; ++t) {
    k_streams_[layer].append(std::span<const float>(&s.k[t * kv_width], kv_width),
                             &layer_counts_[layer][0]);
    v_streams_[layer].append(std::span<const float>(&s.v[t * kv_width], kv_width),
                             &layer_counts_[layer][1]);
  }
  attention(layer, n, position_);
  if (c.attention_output_gate) {
    for_each_token(n, [&](int64_t t) {
      for (int64_t i = t * q_width; i < (t + 1) * q_width; ++i)
        s.att[i] *= 1.0f / (1.0f + std::exp(-s.att_gate[i]));  // sigmoid(gate)
    });
  }
  matmul(s.att.data(), n, w.o, s.proj.data(), pool_);
}

// Causal (optionally sliding-window) attention of the batch's queries over the cache, which
// already holds the batch's own K/V. The cache is decoded once per layer and batch.
// Work items are (KV head, block of kQueryBlock tokens): the block's queries of every head
// sharing that KV head form one matrix, scored against the keys the block can see with the
// blocked kernels of numerics (scores [queries x keys], outputs [queries x head_dim]).
// Each query's softmax and weighted sum run over exactly its own visible keys, in ascending
// key order, so its result does not depend on the block it falls in (batching) or on the
// thread count, and a NaN/inf in a key or value it cannot see never reaches it.
void Session::attention(int layer, int64_t tokens, int64_t first_position) {
  const ModelConfig& c = model_.config();
  Scratch& s = *scratch_;
  const int64_t hd = c.head_dim;
  const int64_t q_width = c.num_heads * hd, kv_width = c.num_kv_heads * hd;
  const int64_t cached = first_position + tokens;
  const int window = c.sliding_window[layer];
  // Keys visible to the query at `position`: [lowest(position), position].
  auto lowest = [&](int64_t position) {
    return window > 0 ? std::max<int64_t>(0, position - window + 1) : int64_t{0};
  };
  // Only positions some query of this batch can see need decoding.
  const int64_t first_visible = lowest(first_position);
  const int64_t visible = cached - first_visible;
  s.keys.resize(visible * kv_width);
  s.values.resize(visible * kv_width);
  k_streams_[layer].decode(first_visible, visible, s.keys);
  v_streams_[layer].decode(first_visible, visible, s.values);

  constexpr int64_t kQueryBlock = 16;
  const int group = c.num_heads / c.num_kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t blocks = (tokens + kQueryBlock - 1) / kQueryBlock;
  const int64_t items = blocks * c.num_kv_heads;
  pool_.parallel_for(items, static_cast<int>(items), [&](int, int64_t begin, int64_t end) {
    thread_local std::vector<float> queries, scores, weights, outputs;
    for (int64_t item = begin; item < end; ++item) {
      const int kv_head = static_cast<int>(item % c.num_kv_heads);
      const int64_t t_begin = item / c.num_kv_heads * kQueryBlock;
      const int64_t t_end = std::min(tokens, t_begin + kQueryBlock);
      const int64_t rows = (t_end - t_begin) * group;
      // Keys [key_begin, key_end) cover every query of the block.
      const int64_t key_begin = lowest(first_position + t_begin);
      const int64_t key_end = first_position + t_end;
      const int64_t key_count = key_end - key_begin;
      const float* keys = &s.keys[(key_begin - first_visible) * kv_width + kv_head * hd];
      const float* values = &s.values[(key_begin - first_visible) * kv_width + kv_head * hd];
      queries.resize(static_cast<size_t>(rows * hd));
      for (int64_t t = t_begin; t < t_end; ++t)
        for (int g = 0; g < group; ++g)
          std::copy_n(&s.q[t * q_width + (int64_t{kv_head} * group + g) * hd], hd,
                      &queries[static_cast<size_t>(((t - t_begin) * group + g) * hd)]);
      scores.resize(static_cast<size_t>(rows * key_count));
      numerics::score_block(queries.data(), rows, hd, keys, key_count, kv_width, hd, scale,
                            scores.data());
      // Softmax of each query over its own keys [first, last] (relative to key_begin).
      auto first_key = [&](int64_t t) { return lowest(first_position + t) - key_begin; };
      auto last_key = [&](int64_t t) { return first_position + t - key_begin; };
      for (int64_t t = t_begin; t < t_end; ++t)
        for (int g = 0; g < group; ++g) {
          float* row = &scores[static_cast<size_t>(((t - t_begin) * group + g) * key_count)];
          softmax(row + first_key(t), last_key(t) - first_key(t) + 1);
        }
      // Weighted values, key segment by key segment in ascending order. Both ends of the
      // visible range only grow with t, so the queries that see all of a segment are the
      // rows of a contiguous range of tokens; accumulate_weighted adds each key in turn, so
      // splitting the keys into segments leaves every query's sum unchanged.
      outputs.assign(static_cast<size_t>(rows * hd), 0.0f);
      std::vector<int64_t> cuts;
      for (int64_t t = t_begin; t < t_end; ++t) {
        cuts.push_back(first_key(t));
        cuts.push_back(last_key(t) + 1);
      }
      std::sort(cuts.begin(), cuts.end());
      cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
      for (size_t cut = 0; cut + 1 < cuts.size(); ++cut) {
        const int64_t seg_begin = cuts[cut], seg_end = cuts[cut + 1];
        int64_t first_t = t_begin;
        while (first_t < t_end && last_key(first_t) < seg_end - 1) ++first_t;
        int64_t last_t = first_t;
        while (last_t < t_end && first_key(last_t) <= seg_begin) ++last_t;
        if (first_t == last_t) continue;
        const int64_t seg_rows = (last_t - first_t) * group, seg_keys = seg_end - seg_begin;
        weights.resize(static_cast<size_t>(seg_rows * seg_keys));
        for (int64_t r = 0; r < seg_rows; ++r)
          std::copy_n(&scores[static_cast<size_t>(((first_t - t_begin) * group + r) * key_count +
                                                  seg_begin)],
                      seg_keys, &weights[static_cast<size_t>(r * seg_keys)]);
        numerics::accumulate_weighted(
            weights.data(), seg_rows, seg_keys, values + seg_begin * kv_width, kv_width, hd,
            &outputs[static_cast<size_t>((first_t - t_begin) * group * hd)], hd);
      }
      for (int64_t t = t_begin; t < t_end; ++t)
        for (int g = 0; g < group; ++g)
          std::copy_n(&outputs[static_cast<size_t>(((t - t_begin) * group + g) * hd)], hd,
                      &s.att[t * q_width + (int64_t{kv_head} * group + g) * hd]);
    }
  });
}

void Session::record_amax(int layer, int64_t tokens) {
  const ModelConfig& c = model_.config();
  const int64_t width = static_cast<int64_t>(c.num_kv_heads) * c.head_dim;
  KvLayerAmax& stats = amax_[layer];
  channel_amax(scratch_->k.data(), tokens, width, stats.k_channel_amax);
  channel_amax(scratch_->v.data(), tokens, width, stats.v_channel_amax);
  for (int64_t t = 0; t < tokens; ++t)
    for (int head = 0; head < c.num_kv_heads; ++head) {
      const int64_t first = t * width + int64_t{head} * c.head_dim;
      float k_max = 0.0f, v_max = 0.0f;
      for (int64_t i = first; i < first + c.head_dim; ++i) {
        k_max = std::max(k_max, std::fabs(scratch_->k[i]));  // NaN ignored, as above
        v_max = std::max(v_max, std::fabs(scratch_->v[i]));
      }
      stats.k_token_head_amax.push_back(k_max);
      stats.v_token_head_amax.push_back(v_max);
    }
  stats.tokens += tokens;
  if ((c.head_dim & (c.head_dim - 1)) != 0) return;  // Hadamard needs a power-of-two width
  std::vector<float> rotated(scratch_->k.begin(), scratch_->k.begin() + tokens * width);
  numerics::hadamard_rows(rotated, c.head_dim);
  channel_amax(rotated.data(), tokens, width, stats.k_rotated_amax);
  rotated.assign(scratch_->v.begin(), scratch_->v.begin() + tokens * width);
  numerics::hadamard_rows(rotated, c.head_dim);
  channel_amax(rotated.data(), tokens, width, stats.v_rotated_amax);
}

numerics::StaticAmax static_amax_for(const numerics::KvFormat& format, const KvLayerAmax& stats,
                                     numerics::KvRole role, int kv_heads) {
  const bool key = role == numerics::KvRole::key;
  const std::vector<float>& channels = format.hadamard
                                           ? (key ? stats.k_rotated_amax : stats.v_rotated_amax)
                                           : (key ? stats.k_channel_amax : stats.v_channel_amax);
  numerics::StaticAmax result;
  if (channels.empty()) return result;
  const size_t per_head = channels.size() / static_cast<size_t>(kv_heads);
  using numerics::ScaleStrategy;
  if (format.strategy == ScaleStrategy::tensor || format.kind == numerics::KvFormatKind::nvfp4) {
    result.amax.push_back(*std::max_element(channels.begin(), channels.end()));
  } else if (format.strategy == ScaleStrategy::head) {
    for (int h = 0; h < kv_heads; ++h)
      result.amax.push_back(*std::max_element(channels.begin() + h * per_head,
                                              channels.begin() + (h + 1) * per_head));
  } else if (format.strategy == ScaleStrategy::channel) {
    result.amax = channels;
  }
  return result;
}

}  // namespace kvaudit::model
