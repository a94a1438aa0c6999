// model: the reference CPU transformer engine. Loads Hugging Face Llama, Mistral, Qwen2,
// Qwen3 and Qwen3.5 (dense hybrid: Gated DeltaNet + gated full attention) checkpoints
// (config.json + safetensors, memory-mapped; weights stay in their stored F32/BF16/F16 type
// and kernels convert on the fly) and runs batched prefill and single-token decode with a KV
// cache that holds the real encoded bytes of any numerics KV format and decodes them inside
// attention, and a recurrent state kept in a chosen precision (StateFormat). It is a measuring
// instrument for eval/ and serve/: exact and readable first, fast enough for 2 CPU cores second.
// Not here: tokenization (tokenizer/), the matmul, softmax and attention ops (numerics/),
// sampling policies and statistics (eval/), HTTP (serve/).
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "numerics/numerics.h"

namespace kvaudit::model {

// ---------------------------------------------------------------- configuration

enum class Family { llama, mistral, qwen2, qwen3, qwen3_5 };

// What mixes tokens in a layer: softmax attention over the KV cache, or Gated DeltaNet
// (linear attention with a recurrent state; Qwen3.5's "linear_attention" layers).
enum class Mixer { attention, gated_delta_net };

// Gated DeltaNet shapes (config.json's linear_* keys). Each key head serves
// value_heads / key_heads consecutive value heads.
struct DeltaNetConfig {
  int key_heads = 0;
  int value_heads = 0;
  int key_head_dim = 0;
  int value_head_dim = 0;
  int conv_kernel = 0;  // taps of the causal depthwise convolution
  int64_t key_width() const { return int64_t{key_heads} * key_head_dim; }
  int64_t value_width() const { return int64_t{value_heads} * value_head_dim; }
  int64_t conv_width() const { return 2 * key_width() + value_width(); }  // [q | k | v]
  // Floats of one layer's recurrent state: [value_heads, key_head_dim, value_head_dim].
  int64_t state_floats() const { return value_width() * key_head_dim; }
};

// Rotary position embedding as Hugging Face's rope_scaling describes it.
enum class RopeType { standard, linear, llama3, yarn };

struct RopeConfig {
  RopeType type = RopeType::standard;
  double theta = 10000.0;
  int rotary_dim = 0;                 // head_dim * partial_rotary_factor (even)
  double factor = 1.0;                // linear / llama3 / yarn
  double low_freq_factor = 1.0;       // llama3
  double high_freq_factor = 4.0;      // llama3
  int64_t original_max_position = 0;  // llama3 / yarn (tokens)
  double beta_fast = 32.0;            // yarn
  double beta_slow = 1.0;             // yarn
  double attention_factor = 1.0;      // yarn: multiplies cos and sin
};

struct ModelConfig {
  std::string architecture;  // "Qwen3ForCausalLM", ...
  Family family = Family::llama;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;  // tokens
  float rms_norm_eps = 1e-6f;
  bool tie_word_embeddings = false;
  bool qk_norm = false;             // Qwen3: RMSNorm over each q/k head before RoPE
  bool attention_bias = false;      // q/k/v projections carry biases (Qwen2)
  std::vector<int> sliding_window;  // per layer, in tokens; 0 = attends to all earlier tokens
  RopeConfig rope;
  // Qwen3.5: RMSNorm scales by (1 + weight) (weights stored zero-centred), q_proj emits a
  // per-head output gate [q | gate], and some layers are Gated DeltaNet.
  float norm_weight_offset = 0.0f;
  bool attention_output_gate = false;
  std::vector<Mixer> mixers;  // per layer
  DeltaNetConfig delta_net;   // set when a layer is gated_delta_net
  bool hybrid() const;        // some layer is gated_delta_net
  int attention_layers() const;
};

// What the forward pass needs, from checkpoint/'s reading of config.json (the one reader:
// check/plan and eval/serve see the same layers and windows). Throws InputError(label, ...)
// for unsupported architectures, rope types or inconsistent shapes.
ModelConfig model_config_from(const checkpoint::ModelFacts& facts, const std::string& label);
// The same from a config.json object (read through checkpoint::fill_architecture).
ModelConfig parse_model_config(const nlohmann::json& config, const std::string& label);

// Inverse frequencies of the rotary pairs [rotary_dim / 2] after the configured scaling.
std::vector<double> rope_inverse_frequencies(const RopeConfig& rope);

// ---------------------------------------------------------------- weights

// Weights are numerics::Matrix views of the mapped shards, in their stored WeightType.
using numerics::Matrix;
using numerics::WeightType;
std::string_view weight_type_name(WeightType type);

struct LayerWeights {
  Matrix attn_norm;               // [hidden]
  Matrix q, k, v, o;              // [heads*hd, hidden], [kv*hd, hidden] x2, [hidden, heads*hd]
                                  // (q: [heads*2*hd, hidden] with the output gate)
  Matrix q_bias, k_bias, v_bias;  // empty unless attention_bias
  Matrix q_norm, k_norm;          // [head_dim], empty unless qk_norm
  Matrix mlp_norm;                // [hidden]
  Matrix gate, up, down;          // [inter, hidden] x2, [hidden, inter]
  // Gated DeltaNet layers (empty on attention layers): input projections, the depthwise
  // convolution's taps, the decay parameters, the gated RMSNorm and the output projection.
  Matrix in_qkv;          // [conv_width, hidden]
  Matrix in_z;            // [value_width, hidden] output gate
  Matrix in_b, in_a;      // [value_heads, hidden] write strength (beta) and decay input
  Matrix conv;            // [conv_width, conv_kernel]
  Matrix dt_bias, a_log;  // [value_heads]
  Matrix delta_norm;      // [value_head_dim]
  Matrix delta_out;       // [hidden, value_width]
};

class Model {
 public:
  // Maps every *.safetensors file in dir and binds the tensors the architecture needs.
  // Throws InputError for missing files/tensors, wrong shapes or unsupported dtypes.
  static std::unique_ptr<Model> load(const std::filesystem::path& dir);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return config_; }
  const std::filesystem::path& dir() const { return dir_; }
  const std::vector<LayerWeights>& layers() const { return layers_; }
  const Matrix& embedding() const { return embedding_; }  // [vocab, hidden]
  const Matrix& final_norm() const { return final_norm_; }
  const Matrix& lm_head() const { return lm_head_; }  // the embedding when tied
  uint64_t weight_bytes() const { return weight_bytes_; }
  WeightType weight_type() const { return weight_type_; }  // of the projection matrices
  // What of the checkpoint the engine does not run (a vision tower, an MTP head).
  const std::vector<std::string>& notes() const { return notes_; }

  struct Mapping;  // one mapped shard file (opaque)

 private:
  Model() = default;
  ModelConfig config_;
  std::filesystem::path dir_;
  std::vector<std::unique_ptr<Mapping>> mappings_;
  std::vector<LayerWeights> layers_;
  Matrix embedding_, final_norm_, lm_head_;
  uint64_t weight_bytes_ = 0;
  WeightType weight_type_ = WeightType::f32;
  std::vector<std::string> notes_;
};

// ---------------------------------------------------------------- kernels
// The forward pass's ops are numerics' (its "ops" section): matmul against stored weights,
// softmax, the attention GEMMs; the SIMD target chosen at run time is
// numerics::simd_target_name() (one dispatch table).
using numerics::matmul;
using numerics::matmul_reference;
using numerics::softmax;
using numerics::weight_at;
using numerics::weight_row;

// ---------------------------------------------------------------- KV statistics
// Per-layer absolute maxima of K (as stored: after QK-norm and RoPE) and V, per channel
// ([kv_heads * head_dim], head-major), both raw and after the per-head Walsh-Hadamard
// rotation that "+hadamard" formats apply. Used to calibrate static scales.
struct KvLayerAmax {
  std::vector<float> k_channel_amax, v_channel_amax;
  std::vector<float> k_rotated_amax, v_rotated_amax;
  // Per token and KV head ([tokens * kv_heads], token-major): the row maxima that percentile
  // calibration ranks (a scale from the 99.9th percentile ignores a few outlier tokens).
  std::vector<float> k_token_head_amax, v_token_head_amax;
  int64_t tokens = 0;
};
// The StaticAmax a format's static strategy needs, from captured maxima.
numerics::StaticAmax static_amax_for(const numerics::KvFormat& format, const KvLayerAmax& stats,
                                     numerics::KvRole role, int kv_heads);

// ---------------------------------------------------------------- recurrent state

// The precision a Gated DeltaNet layer's recurrent state is kept in between the points an
// engine stores it (SGLang --mamba-ssm-dtype, vLLM --mamba-ssm-cache-dtype). The update
// itself runs in F32, as the engines' kernels do: the state is read, updated and rounded
// to this precision when stored: after every token (what decode does; a prefill chunk of
// one token), or every store_every_tokens prefill tokens and at the end of each forward
// call (an engine stores it at the end of each prefill chunk).
enum class StateDtype { f32, bf16, f16, int8 };
struct StateFormat {
  StateDtype dtype = StateDtype::f32;
  int64_t store_every_tokens = 1;  // 0: only at the end of each forward call
  std::string spec = "fp32";       // as parsed
  // > 0: prefill calls (more than one token) see the state as FLA's chunked kernel gives it
  // to them (chunk_gated_delta_rule_fwd_h, chunk_size 64, as SGLang and vLLM vendor it): at
  // each chunk's start, counted from the call's first token, the state is rounded to
  // kernel_chunk_dtype (h is allocated as k.new_empty, and v_new is computed from the state
  // cast to w's dtype), while the part the rounding dropped stays in the F32 state the
  // kernel carries in registers, decayed over the chunk. Decode (one token) runs the
  // recurrent kernel: untouched. Some forks carry the state itself in BF16; not modelled.
  int64_t kernel_chunk_tokens = 0;
  StateDtype kernel_chunk_dtype = StateDtype::bf16;
};
// "fp32" (also float32), "bf16" (bfloat16), "fp16" (float16), "int8" (symmetric, one F32
// scale per value head and key row: absmax / 127, round to nearest; the per-(head, dim)
// layout of vLLM's quantized SSM caches). Throws InputError("--state-dtype", ...).
// A ":fla" suffix ("fp32:fla", "bf16:fla64") sets kernel_chunk_tokens (64 when no count
// follows): the precision the engine stores, with prefill through FLA's chunked kernel.
StateFormat parse_state_format(std::string_view text, int64_t store_every_tokens = 1);
// Rounds a state in place to the format's precision (int8: per row of `row_width`).
void round_state(const StateFormat& format, std::span<float> state, int64_t row_width);

// ---------------------------------------------------------------- session

// One sequence being run: the KV cache (one numerics::KvStream per layer and K/V) plus the
// scratch buffers of the forward pass. Not thread-safe; the pool parallelises inside it.
// What a Session's cache holds for positions [0, tokens): every layer's encoded K and V, as
// stored. A prefix cache keeps these, on the device or in a host tier; restoring one lets a
// request that shares the prefix skip recomputing it.
struct KvSnapshot {
  int64_t tokens = 0;
  std::vector<numerics::KvStream> k, v;  // per layer
  int64_t stored_bytes() const;
  KvSnapshot Copy() const;  // explicit: snapshots are large
};

class Session {
 public:
  // calibration: per layer {K, V} amax for static-scale formats (may be empty: scale 1.0).
  // state: how Gated DeltaNet layers keep their recurrent state (ignored without them).
  Session(const Model& model, const numerics::KvFormat& kv_format, ThreadPool& pool,
          std::vector<std::array<numerics::StaticAmax, 2>> calibration = {},
          StateFormat state = {});
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Runs tokens at positions [position(), position() + tokens.size()), appending their K/V
  // to the cache. Logits of tokens[i] for i >= logits_from are written to `logits`
  // ([tokens.size() - logits_from, vocab]); logits_from >= tokens.size() computes none.
  // Long inputs are processed in batches of at most max_batch_tokens.
  void forward(std::span<const int32_t> tokens, int64_t logits_from, std::vector<float>& logits);
  // One decode step: logits of the token.
  void decode(int32_t token, std::vector<float>& logits);

  int64_t position() const { return position_; }
  void reset();  // empties the cache (and zeroes the recurrent state)
  // Keeps the first `tokens` positions. A recurrent state cannot be rewound: on a hybrid
  // model only 0 and position() are allowed (InputError otherwise).
  void truncate(int64_t tokens);
  // The cache as it is now. A recurrent state is not part of it: on a hybrid model both
  // throw InputError.
  KvSnapshot snapshot() const;
  // Replaces the cache with a copy of `snapshot` (whose layers and format must be this
  // session's: InputError otherwise); position() becomes snapshot.tokens.
  void restore(const KvSnapshot& snapshot);
  const StateFormat& state_format() const { return state_format_; }
  // Bytes the recurrent and convolution states hold in their stored precision (all
  // Gated DeltaNet layers; 0 on a model without them).
  int64_t state_bytes() const;

  // Bytes the KV cache holds now (the real encoded bytes, all layers, K and V).
  int64_t kv_bytes() const;
  const numerics::KvFormat& kv_format() const { return kv_format_; }
  // What happened to the encoded K/V elements so far (all layers; kept across reset()).
  numerics::EncodeCounts encode_counts() const;
  // The same counts per layer, {K, V}.
  const std::vector<std::array<numerics::EncodeCounts, 2>>& layer_encode_counts() const {
    return layer_counts_;
  }

  void capture_amax(bool enabled);  // off by default
  const std::vector<KvLayerAmax>& amax() const { return amax_; }

  int64_t max_batch_tokens = 256;

 private:
  struct Scratch;
  void for_each_token(int64_t tokens, const std::function<void(int64_t)>& body);
  void forward_batch(std::span<const int32_t> tokens, int64_t logits_from, float* logits,
                     bool store_state_at_end);
  void attention_block(int layer, int64_t n);
  void attention(int layer, int64_t tokens, int64_t first_position);
  void delta_net_block(int layer, int64_t n, bool store_state_at_end);
  void delta_rule(int layer, int64_t n, bool store_state_at_end);
  void record_amax(int layer, int64_t tokens);

  const Model& model_;
  numerics::KvFormat kv_format_;
  ThreadPool& pool_;
  std::vector<numerics::KvStream> k_streams_, v_streams_;
  std::vector<double> inverse_frequencies_;
  std::unique_ptr<Scratch> scratch_;
  int64_t position_ = 0;
  std::vector<std::array<numerics::EncodeCounts, 2>> layer_counts_;
  bool capture_ = false;
  std::vector<KvLayerAmax> amax_;
  StateFormat state_format_;
  // Per Gated DeltaNet layer (empty on attention layers): the last conv_kernel - 1
  // convolution inputs [conv_kernel - 1, conv_width] and the recurrent state.
  std::vector<std::vector<float>> conv_state_, recurrent_state_;
  // The forward call being run (StateFormat::kernel_chunk_tokens counts chunks from its
  // start), and per layer the F32 part of the state the current chunk's rounding dropped
  // [value_heads, dk, dv] with its decay so far [value_heads].
  int64_t call_start_ = 0, call_tokens_ = 0;
  std::vector<std::vector<float>> chunk_carry_, chunk_carry_decay_;
};

}  // namespace kvaudit::model
