// model: the reference CPU transformer engine. Loads Hugging Face Llama, Mistral, Qwen2 and
// Qwen3 checkpoints (config.json + safetensors, memory-mapped; weights stay in their stored
// F32/BF16/F16 type and kernels convert on the fly) and runs batched prefill and single-token
// decode with a KV cache that holds the real encoded bytes of any numerics KV format and
// decodes them inside attention. It is a measuring instrument for eval/ and serve/: exact
// and readable first, fast enough for 2 CPU cores second. Not here: tokenization
// (tokenizer/), sampling policies and statistics (eval/), HTTP (serve/).
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "numerics/numerics.h"

namespace kvaudit::model {

using numerics::ThreadPool;

// ---------------------------------------------------------------- configuration

enum class Family { llama, mistral, qwen2, qwen3 };

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

enum class WeightType { f32, bf16, f16 };
std::string_view weight_type_name(WeightType type);

// A row-major [rows, cols] view into mapped memory (vectors have rows == 1).
struct Matrix {
  const void* data = nullptr;
  WeightType type = WeightType::f32;
  int64_t rows = 0;
  int64_t cols = 0;
  bool empty() const { return data == nullptr; }
};

struct LayerWeights {
  Matrix attn_norm;               // [hidden]
  Matrix q, k, v, o;              // [heads*hd, hidden], [kv*hd, hidden] x2, [hidden, heads*hd]
  Matrix q_bias, k_bias, v_bias;  // empty unless attention_bias
  Matrix q_norm, k_norm;          // [head_dim], empty unless qk_norm
  Matrix mlp_norm;                // [hidden]
  Matrix gate, up, down;          // [inter, hidden] x2, [hidden, inter]
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
};

// ---------------------------------------------------------------- kernels
// SIMD via Highway dynamic dispatch; each has a scalar reference that tests compare with.
// Every output element is computed by one thread with a fixed summation order, so results
// do not depend on the thread count.

// out[t, r] = sum_c x[t, c] * w[r, c]   for t < tokens, r < w.rows; x: [tokens, w.cols].
void matmul(const float* x, int64_t tokens, const Matrix& w, float* out, ThreadPool& pool);
void matmul_reference(const float* x, int64_t tokens, const Matrix& w, float* out);
// Reads element i of a weight vector/matrix as float.
float weight_at(const Matrix& w, int64_t index);
// Converts row `row` of w to floats.
void weight_row(const Matrix& w, int64_t row, float* out);
// In-place softmax of one row, as torch.softmax (NaN or +inf anywhere: the row is NaN).
void softmax(float* x, int64_t n);
// The SIMD target chosen at run time is numerics::simd_target_name() (one dispatch table).

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

// ---------------------------------------------------------------- session

// One sequence being run: the KV cache (one numerics::KvStream per layer and K/V) plus the
// scratch buffers of the forward pass. Not thread-safe; the pool parallelises inside it.
class Session {
 public:
  // calibration: per layer {K, V} amax for static-scale formats (may be empty: scale 1.0).
  Session(const Model& model, const numerics::KvFormat& kv_format, ThreadPool& pool,
          std::vector<std::array<numerics::StaticAmax, 2>> calibration = {});
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
  void reset();                   // empties the cache
  void truncate(int64_t tokens);  // keeps the first `tokens` positions

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
  void forward_batch(std::span<const int32_t> tokens, int64_t logits_from, float* logits);
  void attention(int layer, int64_t tokens, int64_t first_position);
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
};

}  // namespace kvaudit::model
