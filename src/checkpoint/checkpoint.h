// checkpoint: reads what a Hugging Face checkpoint says about itself without
// reading its weights: config.json (text_config wrappers too), quantization
// configs, safetensors headers (validated), and the values of small tensors such
// as KV scales. Produces ModelFacts. Knows architectures, not engines.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace kvaudit::checkpoint {

// ---------------------------------------------------------------- safetensors

enum class TensorDType {
  F64,
  F32,
  F16,
  BF16,
  F8_E4M3,
  F8_E5M2,
  F8_E8M0,
  F4,
  I64,
  I32,
  I16,
  I8,
  U64,
  U32,
  U16,
  U8,
  BOOL
};
std::string_view dtype_name(TensorDType dtype);            // "F32", "F8_E4M3", ...
std::optional<TensorDType> parse_dtype(std::string_view);  // safetensors spelling
uint32_t dtype_bits(TensorDType dtype);                    // 4 for F4, 8 for F8/U8, ...

// A tensor shape stored inline: headers of large checkpoints hold ~400K entries,
// and a heap allocation per shape would dominate parsing.
class TensorShape {
 public:
  static constexpr size_t kMaxRank = 8;
  TensorShape() = default;
  TensorShape(std::initializer_list<uint64_t> dims) {
    for (uint64_t dim : dims) push_back(dim);
  }
  void push_back(uint64_t dim) { dims_[rank_++] = dim; }  // callers check full()
  // Rank 0 again without zeroing the dimensions (never read past the rank): a parser reusing
  // one shape per entry would otherwise spend a tenth of its time clearing 64 bytes.
  void clear() { rank_ = 0; }
  bool full() const { return rank_ == kMaxRank; }
  size_t size() const { return rank_; }
  bool empty() const { return rank_ == 0; }
  uint64_t operator[](size_t i) const { return dims_[i]; }
  const uint64_t* begin() const { return dims_; }
  const uint64_t* end() const { return dims_ + rank_; }
  std::vector<uint64_t> to_vector() const { return {begin(), end()}; }
  bool operator==(const TensorShape& other) const {
    return rank_ == other.rank_ && std::equal(begin(), end(), other.begin());
  }

 private:
  uint64_t dims_[kMaxRank] = {};
  uint8_t rank_ = 0;
};

struct TensorInfo {
  std::string name;
  TensorDType dtype = TensorDType::F32;
  TensorShape shape;
  uint64_t data_begin = 0;  // offsets relative to the start of the data section
  uint64_t data_end = 0;
  uint64_t element_count() const;
};

struct SafetensorsHeader {
  std::filesystem::path file;
  uint64_t file_bytes = 0;
  uint64_t header_bytes = 0;  // the JSON header length (after the 8-byte prefix)
  std::vector<TensorInfo> tensors;
  std::map<std::string, std::string> metadata;  // "__metadata__"
  uint64_t data_offset() const { return 8 + header_bytes; }
};

// Parses and validates a header's JSON given the size of the data section that
// follows it: dtype x shape must equal the byte span, spans must lie inside the
// data section and must not overlap. Throws InputError(label, problem).
// buffer_is_padded: at least 64 readable bytes follow header_json (simdjson's padding),
// so it is parsed in place instead of copied.
SafetensorsHeader parse_safetensors_header(std::string_view header_json, uint64_t data_bytes,
                                           const std::string& label, bool buffer_is_padded = false);
inline constexpr size_t kHeaderPaddingBytes = 64;
// The same with simdjson's DOM: the reference that parse_safetensors_header's fast On-Demand
// reader defers to for every input it does not accept, and that tests and the fuzzer compare
// it with. Same contract.
SafetensorsHeader parse_safetensors_header_reference(std::string_view header_json,
                                                     uint64_t data_bytes, const std::string& label,
                                                     bool buffer_is_padded = false);

// Reads only the 8-byte length prefix and the header of a .safetensors file.
SafetensorsHeader read_safetensors_header(const std::filesystem::path& file);

// Reads and converts a small tensor's values to float (F32/F16/BF16/F8/F64/int).
// Refuses tensors over max_elements: this reader never loads weights.
std::vector<float> read_tensor_values(const SafetensorsHeader& header, const TensorInfo& tensor,
                                      uint64_t max_elements = 1 << 16);

// ---------------------------------------------------------------- model facts

// no_attention: a layer whose attention block is skipped (DeciLM / Nemotron-NAS block_configs
// "no_op", or replaced by a linear map): it holds neither KV nor recurrent state.
enum class LayerKind { full_attention, sliding_attention, linear_attention, mla, no_attention };
std::string_view layer_kind_name(LayerKind kind);
// A layer that writes the KV cache (not linear attention, not a skipped attention block).
inline bool holds_kv_cache(LayerKind kind) {
  return kind != LayerKind::linear_attention && kind != LayerKind::no_attention;
}

struct LayerFacts {
  int index = 0;
  LayerKind kind = LayerKind::full_attention;
  int kv_heads = 0;        // KV heads of this layer (0 for linear attention)
  int k_head_dim = 0;      // K width per head (MLA: kv_lora_rank + qk_rope_head_dim)
  int v_head_dim = 0;      // V width per head (MLA: 0, V is rebuilt from the latent)
  int sliding_window = 0;  // tokens, 0 when the layer attends to everything
};

struct MlaFacts {
  int kv_lora_rank = 0;
  int qk_rope_head_dim = 0;
  int qk_nope_head_dim = 0;
  int v_head_dim = 0;
  int q_lora_rank = 0;
  int index_head_dim = 0;  // DSA/NSA lightning indexer key width (DeepSeek-V3.2, GLM-5); 0: none
};

// Gated DeltaNet / Mamba-style linear attention (Qwen3-Next, Qwen3.5).
struct LinearAttentionFacts {
  int num_key_heads = 0;
  int num_value_heads = 0;
  int key_head_dim = 0;
  int value_head_dim = 0;
  int conv_kernel = 0;
  std::string ssm_dtype;  // config's mamba_ssm_dtype ("float32"), empty if absent
};

// What the checkpoint declares about quantization, and where it says it.
struct QuantFacts {
  std::string source_file;          // hf_quant_config.json or config.json
  std::string source_key;           // "quantization" or "quantization_config"
  std::string method;               // "modelopt", "compressed-tensors", "fp8", ...
  std::string producer;             // "modelopt 0.29.0", ...
  std::string weight_algo;          // "NVFP4", "FP8", ...
  std::string kv_cache_quant_algo;  // as declared ("FP8", "NVFP4"); empty when absent or null
  std::string kv_algo_key;  // key it came from: "kv_cache_quant_algo", "kv_cache_quant_method"
  bool has_kv_cache_scheme = false;       // compressed-tensors kv_cache_scheme present and non-null
  nlohmann::json kv_cache_scheme;         // as declared
  std::string kv_scheme_strategy;         // "tensor", "attn_head", "channel", ...
  int kv_scheme_bits = 0;                 // num_bits
  std::optional<bool> kv_scheme_dynamic;  // the scheme's "dynamic", when it says
  std::string kv_scheme_type;             // "float" or "int"
  // When hf_quant_config.json and config.json's quantization_config both exist: what the
  // other file says about the KV cache (engines differ in which one they read).
  std::string other_source_file;  // "" when there is only one declaration
  std::string other_source_key;
  std::string other_kv_declared;  // "FP8", a scheme's JSON, or "" when it declares none
  // What this declaration says about the KV cache ("" = none): kv algo or scheme.
  std::string kv_declared() const {
    return !kv_cache_quant_algo.empty() ? kv_cache_quant_algo
           : has_kv_cache_scheme        ? kv_cache_scheme.dump()
                                        : std::string();
  }
};

enum class ScaleRole { k, v, kv_shared };
std::string_view scale_role_name(ScaleRole role);

// A KV-cache scale tensor found in the checkpoint, with its values.
struct ScaleTensor {
  std::string name;        // full tensor name
  std::string shard_file;  // file it lives in (relative to the checkpoint dir)
  ScaleRole role = ScaleRole::k;
  int layer = -1;
  std::string convention;  // naming convention id (see kScaleConventions)
  TensorDType dtype = TensorDType::F32;
  std::vector<uint64_t> shape;
  std::vector<float> values;
};

struct ScaleConvention {
  std::string_view id;           // "modelopt_proj", "ct_attn", ...
  std::string_view pattern;      // ECMAScript regex over the tensor name
  std::string_view description;  // who produces it
};
// The naming conventions the reader recognises (the engines' scale names: data/engines/*.json).
const std::vector<ScaleConvention>& scale_conventions();
// Classifies a tensor name as a KV-cache scale (values left empty), or nullopt.
std::optional<ScaleTensor> classify_scale_tensor(std::string_view name);

// How an architecture normalises each key head over head_dim before RoPE (QK-norm). The
// RMS of the normalised head is 1 before the learned per-channel gain, so every cached key
// component is bounded: |k_i| <= sqrt(head_dim) * max_i |gain_i| (RoPE rotates pairs and
// keeps each pair's norm). Qwen3 multiplies by the weight; Qwen3-Next / Qwen3.5 and
// Gemma-3 store a zero-centred weight and multiply by (1 + weight).
enum class QkNorm { none, gain, one_plus_gain };
std::string_view qk_norm_name(QkNorm norm);  // "none" | "weight" | "1 + weight"

// A per-head key-norm weight vector ("...self_attn.k_norm.weight", [head_dim]), read by
// range like a scale value: a few hundred bytes per layer, never a weight matrix.
struct NormTensor {
  std::string name;
  std::string shard_file;
  int layer = -1;
  TensorDType dtype = TensorDType::BF16;
  std::vector<float> values;
};
// The layer index of a per-head key-norm weight, or nullopt for any other tensor.
std::optional<int> classify_k_norm_tensor(std::string_view name);
// True for every tensor whose values the checkpoint reader reads (KV scales, key norms):
// what a remote reader must fetch besides the headers.
bool reads_tensor_values(std::string_view name);

struct ModelFacts {
  std::filesystem::path dir;        // checkpoint folder (hub: "hf://org/model@sha")
  std::filesystem::path files_dir;  // where its files are on this machine (hub: the cache)
  std::string source;               // where it was read, when not a local folder ("" local)
  std::string config_file;          // path of config.json
  std::string model_type;           // of the language model ("qwen3_5_moe_text" -> as written)
  std::string outer_model_type;     // wrapper's model_type when nested under text_config
  std::string architecture;         // architectures[0]
  bool architecture_known = false;
  std::string torch_dtype;  // "bfloat16", "float16", ...
  int num_layers = 0;
  int num_attention_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int hidden_size = 0;
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  nlohmann::json rope_scaling;  // null when absent
  bool attention_sinks = false;
  int num_experts = 0;
  bool multimodal = false;  // the config carries a vision tower (vision_config)
  int mtp_layers = 0;       // multi-token-prediction (NEXTN / MTP) draft layers in the checkpoint
  // What a forward pass needs beyond the KV facts (read by model/, as config.json says it;
  // checkpoint/ is the one reader of config.json).
  int intermediate_size = 0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // the config's "attention_bias" (Qwen2 has q/k/v biases anyway)
  bool mlp_bias = false;
  std::string hidden_act;       // "silu" when absent
  double rope_theta = 10000.0;  // rope_theta, or rope_parameters.rope_theta (newer configs)
  double partial_rotary_factor = 1.0;
  // Qwen3-Next / Qwen3.5 full attention: q_proj also emits a per-head output gate
  // (attn_output_gate, default true for those families).
  bool attention_output_gate = false;
  std::vector<int64_t> eos_token_ids;  // config.json's eos_token_id (an integer or a list)
  std::vector<LayerFacts> layers;
  std::optional<MlaFacts> mla;
  std::optional<LinearAttentionFacts> linear_attention;
  std::optional<QuantFacts> quant;
  std::vector<ScaleTensor> kv_scales;
  QkNorm qk_norm = QkNorm::none;    // the architecture's key normalisation
  std::vector<NormTensor> k_norms;  // per attention layer, in layer order (empty: none read)
  // From the safetensors headers:
  std::vector<std::string> shard_files;  // relative to dir
  uint64_t tensor_count = 0;
  uint64_t weight_bytes = 0;  // sum of all tensor byte spans
  // Names of the attention K/V projection weights ("...self_attn.k_proj.weight"), so
  // findings can name the scale tensors an exporter should have written next to them.
  std::vector<std::string> kv_projection_weights;
  bool has_weights = false;        // false for a bare config.json
  std::vector<std::string> notes;  // e.g. "unknown architecture ..."

  int attention_layer_count() const;  // layers that hold a KV cache
};

struct ReadOptions {
  bool read_safetensors = true;  // false: config files only
};

// Reads a checkpoint folder (or a bare config.json). Throws InputError naming the
// file and the problem for anything malformed.
ModelFacts read_checkpoint(const std::filesystem::path& dir_or_config,
                           const ReadOptions& options = {});

// The one reader of a safetensors index (model.safetensors.index.json): calls `each` for
// every weight_map entry, tensor name and shard file, in file order. Throws InputError(where)
// for invalid JSON, no weight_map object, an entry that is not a file name, or a shard
// outside the checkpoint folder. simdjson, since a 400B MoE's index lists ~400K tensors;
// check (which needs the shard names only) and the hub (which fetches by shard) both use it.
void read_safetensors_index(
    std::string_view text, const std::string& where,
    const std::function<void(std::string_view tensor, std::string_view shard)>& each);

// The checkpoint's shard files, relative to dir: the index's weight_map when
// model.safetensors.index.json exists (every file it names must exist), else every
// *.safetensors in the folder, sorted.
std::vector<std::string> list_shards(const std::filesystem::path& dir);

// Builds per-layer facts from a (language-model) config object. Exposed for tests.
void fill_architecture(const nlohmann::json& text_config, ModelFacts& facts);
// Everything read_checkpoint takes from a whole config.json object: the language model's
// facts (text_config's for wrappers such as Qwen3_5ForConditionalGeneration, with the
// wrapper's architectures, model_type, vision tower, tied embeddings and dtype).
void fill_from_config(const nlohmann::json& config, ModelFacts& facts);

}  // namespace kvaudit::checkpoint
