// Per-layer attention facts for the architectures kvaudit knows. This is model
// knowledge (what the published config keys mean), not engine knowledge.
#include <fmt/format.h>

#include <algorithm>
#include <array>

#include "checkpoint/checkpoint.h"
#include "util/json.h"
#include "util/util.h"

namespace kvaudit::checkpoint {

namespace {

using nlohmann::json;

// Typed reads of config.json's keys through util's JsonReader (its one error policy: a key
// of the wrong type is an InputError naming the key; absent or null takes the fallback).
// "config.json" stands for the file until fill_from_config names it.
int64_t int_or(const json& config, const char* key, int64_t fallback) {
  return JsonReader(config, "config.json").integer_or(key, fallback);
}

std::string string_or(const json& config, const char* key, std::string_view fallback = {}) {
  return JsonReader(config, "config.json").string_or(key, fallback);
}

enum class Family { dense, mistral, qwen2, hybrid_gdn, mla, gemma2, gemma3, gpt_oss, nas };

// transformers' Qwen2Config / Qwen3Config defaults for keys a config.json may omit.
constexpr int64_t kQwenMaxWindowLayers = 28;
constexpr int64_t kQwenSlidingWindow = 4096;

double number_or(const json& config, const char* key, double fallback) {
  return JsonReader(config, "config.json").number_or(key, fallback);
}

bool bool_or(const json& config, const char* key, bool fallback) {
  return JsonReader(config, "config.json").boolean_or(key, fallback);
}

struct KnownArchitecture {
  std::string_view model_type;
  Family family;
  QkNorm qk_norm = QkNorm::none;  // the per-head key norm of its attention layers
};

// model_type values as written in config.json (text_config's for wrappers).
constexpr std::array kKnownArchitectures = {
    KnownArchitecture{"llama", Family::dense},
    KnownArchitecture{"mistral", Family::mistral},
    KnownArchitecture{"mixtral", Family::mistral},
    KnownArchitecture{"qwen2", Family::qwen2},
    KnownArchitecture{"qwen2_moe", Family::qwen2},
    // Qwen3 follows Qwen2's sliding rule (transformers Qwen3Config.__post_init__).
    KnownArchitecture{"qwen3", Family::qwen2, QkNorm::gain},
    KnownArchitecture{"qwen3_moe", Family::qwen2, QkNorm::gain},
    KnownArchitecture{"qwen3_next", Family::hybrid_gdn, QkNorm::one_plus_gain},
    KnownArchitecture{"qwen3_5", Family::hybrid_gdn, QkNorm::one_plus_gain},
    KnownArchitecture{"qwen3_5_text", Family::hybrid_gdn, QkNorm::one_plus_gain},
    KnownArchitecture{"qwen3_5_moe", Family::hybrid_gdn, QkNorm::one_plus_gain},
    KnownArchitecture{"qwen3_5_moe_text", Family::hybrid_gdn, QkNorm::one_plus_gain},
    KnownArchitecture{"deepseek_v3", Family::mla},
    KnownArchitecture{"deepseek_v2", Family::mla},
    KnownArchitecture{"deepseek_v32", Family::mla},
    KnownArchitecture{"kimi_k2", Family::mla},
    KnownArchitecture{"glm_moe_dsa", Family::mla},
    KnownArchitecture{"gemma2", Family::gemma2},
    KnownArchitecture{"gemma3", Family::gemma3, QkNorm::one_plus_gain},
    KnownArchitecture{"gemma3_text", Family::gemma3, QkNorm::one_plus_gain},
    KnownArchitecture{"gpt_oss", Family::gpt_oss},
    // DeciLM / Nemotron-NAS (Llama-3.3-Nemotron-Super-49B, -Ultra-253B): per-layer attention
    // in block_configs, some layers without attention, GQA per layer.
    KnownArchitecture{"nemotron-nas", Family::nas},
};

const KnownArchitecture* find_architecture(std::string_view model_type) {
  for (const auto& known : kKnownArchitectures)
    if (known.model_type == model_type) return &known;
  return nullptr;
}

std::optional<LayerKind> parse_layer_type(std::string_view text) {
  if (text == "full_attention" || text == "attention") return LayerKind::full_attention;
  if (text == "sliding_attention") return LayerKind::sliding_attention;
  if (text == "linear_attention") return LayerKind::linear_attention;
  return std::nullopt;
}

// A Nemotron-NAS layer's attention from block_configs[layer].attention: no_op or
// replace_with_linear layers hold no KV; the others have num_attention_heads /
// n_heads_in_group KV heads (vLLM's NemotronNas convertor and SGLang's model_config read the
// same keys).
struct NasAttention {
  bool attends = true;
  int kv_heads = 0;
};
NasAttention nas_attention(const json& config, int layer, int num_attention_heads,
                           const std::string& file) {
  const json* blocks = nullptr;
  if (auto it = config.find("block_configs"); it != config.end() && it->is_array()) blocks = &*it;
  if (!blocks || static_cast<int>(blocks->size()) <= layer)
    throw InputError(file, fmt::format("nemotron-nas needs block_configs for every layer (layer "
                                       "{} has none)",
                                       layer));
  const json& block = (*blocks)[layer];
  const json* attention = nullptr;
  if (block.is_object())
    if (auto it = block.find("attention"); it != block.end() && it->is_object()) attention = &*it;
  if (!attention)
    throw InputError(file, fmt::format("block_configs[{}].attention is missing", layer));
  if (bool_or(*attention, "no_op", false) || bool_or(*attention, "replace_with_linear", false))
    return {false, 0};
  const int64_t group = int_or(*attention, "n_heads_in_group", 0);
  if (group <= 0 || num_attention_heads % group != 0)
    throw InputError(file, fmt::format("block_configs[{}].attention.n_heads_in_group = {} does "
                                       "not divide num_attention_heads {}",
                                       layer, group, num_attention_heads));
  return {true, static_cast<int>(num_attention_heads / group)};
}

// Layer kind by family when the config has no explicit layer_types list.
LayerKind default_layer_kind(Family family, const json& config, int layer) {
  switch (family) {
    case Family::mla:
      return LayerKind::mla;
    case Family::mistral:
      return int_or(config, "sliding_window", 0) > 0 ? LayerKind::sliding_attention
                                                     : LayerKind::full_attention;
    case Family::qwen2: {
      // HF Qwen2/Qwen3 configs: sliding only when use_sliding_window, from max_window_layers
      // on (class default 28 when the key is absent), window default 4096.
      bool sliding = config.value("use_sliding_window", false) &&
                     layer >= int_or(config, "max_window_layers", kQwenMaxWindowLayers) &&
                     int_or(config, "sliding_window", kQwenSlidingWindow) > 0;
      return sliding ? LayerKind::sliding_attention : LayerKind::full_attention;
    }
    case Family::hybrid_gdn: {
      int64_t interval = int_or(config, "full_attention_interval", 4);
      if (interval <= 0) interval = 4;
      return (layer + 1) % interval == 0 ? LayerKind::full_attention : LayerKind::linear_attention;
    }
    case Family::gemma2:  // even layers slide, odd layers are global
      return layer % 2 == 0 ? LayerKind::sliding_attention : LayerKind::full_attention;
    case Family::gemma3: {
      int64_t pattern = int_or(config, "sliding_window_pattern", 6);
      if (pattern <= 0) pattern = 6;
      return (layer + 1) % pattern == 0 ? LayerKind::full_attention : LayerKind::sliding_attention;
    }
    case Family::gpt_oss:  // alternates, sliding first
      return layer % 2 == 0 ? LayerKind::sliding_attention : LayerKind::full_attention;
    case Family::dense:
    case Family::nas:  // per layer, from block_configs
      break;
  }
  return LayerKind::full_attention;
}

int positive_int(const json& config, const char* key, int64_t fallback, int64_t max) {
  int64_t value = int_or(config, key, fallback);
  if (value < 0 || value > max)
    throw InputError("config.json", fmt::format("{}: {} is out of range 0..{}", key, value, max));
  return static_cast<int>(value);
}

}  // namespace

std::string_view qk_norm_name(QkNorm norm) {
  switch (norm) {
    case QkNorm::none:
      return "none";
    case QkNorm::gain:
      return "weight";
    case QkNorm::one_plus_gain:
      return "1 + weight";
  }
  return "?";
}

std::string_view layer_kind_name(LayerKind kind) {
  switch (kind) {
    case LayerKind::full_attention:
      return "full_attention";
    case LayerKind::sliding_attention:
      return "sliding_attention";
    case LayerKind::linear_attention:
      return "linear_attention";
    case LayerKind::mla:
      return "mla";
    case LayerKind::no_attention:
      return "no_attention";
  }
  return "?";
}

int ModelFacts::attention_layer_count() const {
  return static_cast<int>(std::count_if(layers.begin(), layers.end(), [](const LayerFacts& layer) {
    return holds_kv_cache(layer.kind);
  }));
}

namespace {

// The model-wide sizes and options: head counts and dimensions, vocabulary, context, RoPE,
// experts, norms, activation, dtype, draft layers.
void read_model_dimensions(const json& config, std::optional<Family> family, ModelFacts& facts) {
  facts.num_layers = positive_int(config, "num_hidden_layers", 0, 100000);
  facts.hidden_size = positive_int(config, "hidden_size", 0, 1 << 24);
  facts.num_attention_heads = positive_int(config, "num_attention_heads", 0, 1 << 16);
  facts.num_kv_heads =
      positive_int(config, "num_key_value_heads", facts.num_attention_heads, 1 << 16);
  int default_head_dim =
      facts.num_attention_heads > 0 ? facts.hidden_size / facts.num_attention_heads : 0;
  facts.head_dim = positive_int(config, "head_dim", default_head_dim, 1 << 16);
  facts.vocab_size = int_or(config, "vocab_size", 0);
  facts.max_position_embeddings = int_or(config, "max_position_embeddings", 0);
  if (auto it = config.find("rope_scaling"); it != config.end() && it->is_object())
    facts.rope_scaling = *it;
  else if (auto params = config.find("rope_parameters");
           params != config.end() && params->is_object() && params->contains("rope_type") &&
           (*params)["rope_type"] != "default")
    facts.rope_scaling = *params;
  facts.num_experts = positive_int(
      config, config.contains("num_local_experts") ? "num_local_experts" : "n_routed_experts",
      int_or(config, "num_experts", 0), 1 << 20);
  facts.intermediate_size = positive_int(config, "intermediate_size", 0, 1 << 24);
  facts.rms_norm_eps = number_or(config, "rms_norm_eps", 1e-6);
  facts.tie_word_embeddings = bool_or(config, "tie_word_embeddings", false);
  facts.attention_bias = bool_or(config, "attention_bias", false);
  facts.mlp_bias = bool_or(config, "mlp_bias", false);
  facts.hidden_act = string_or(config, "hidden_act", "silu");
  // Newer transformers write rope_theta and partial_rotary_factor inside rope_parameters.
  const json* rope_parameters = nullptr;
  if (auto it = config.find("rope_parameters"); it != config.end() && it->is_object())
    rope_parameters = &*it;
  facts.rope_theta =
      number_or(config, "rope_theta",
                rope_parameters ? number_or(*rope_parameters, "rope_theta", 10000.0) : 10000.0);
  facts.partial_rotary_factor =
      number_or(config, "partial_rotary_factor",
                rope_parameters ? number_or(*rope_parameters, "partial_rotary_factor", 1.0) : 1.0);
  std::string dtype = string_or(config, "torch_dtype", string_or(config, "dtype"));
  if (!dtype.empty()) facts.torch_dtype = dtype;
  facts.attention_sinks = family == Family::gpt_oss;
  facts.mtp_layers =
      positive_int(config,
                   config.contains("num_nextn_predict_layers") ? "num_nextn_predict_layers"
                                                               : "mtp_num_hidden_layers",
                   0, 64);
}

// The family's own blocks: MLA's latent sizes, the gated-delta-net's recurrent state.
void read_family_blocks(const json& config, std::optional<Family> family, ModelFacts& facts) {
  if (family == Family::mla) {
    MlaFacts mla;
    mla.kv_lora_rank = positive_int(config, "kv_lora_rank", 512, 1 << 16);
    mla.qk_rope_head_dim = positive_int(config, "qk_rope_head_dim", 64, 1 << 16);
    mla.qk_nope_head_dim = positive_int(config, "qk_nope_head_dim", 128, 1 << 16);
    mla.v_head_dim = positive_int(config, "v_head_dim", 128, 1 << 16);
    mla.q_lora_rank = positive_int(config, "q_lora_rank", 0, 1 << 16);
    mla.index_head_dim = positive_int(config, "index_head_dim", 0, 1 << 16);
    facts.mla = mla;
  }
  if (family == Family::hybrid_gdn) {
    LinearAttentionFacts linear;
    linear.num_key_heads = positive_int(config, "linear_num_key_heads", 16, 1 << 16);
    linear.num_value_heads = positive_int(config, "linear_num_value_heads", 32, 1 << 16);
    linear.key_head_dim = positive_int(config, "linear_key_head_dim", 128, 1 << 16);
    linear.value_head_dim = positive_int(config, "linear_value_head_dim", 128, 1 << 16);
    linear.conv_kernel = positive_int(config, "linear_conv_kernel_dim", 4, 1 << 10);
    linear.ssm_dtype = string_or(config, "mamba_ssm_dtype");
    facts.linear_attention = linear;
    facts.attention_output_gate = bool_or(config, "attn_output_gate", true);
  }
}

// One LayerFacts per layer: its kind (the family's pattern, layer_types, or NAS's
// block_configs) and the KV heads and widths it caches.
void read_layers(const json& config, std::optional<Family> family, ModelFacts& facts) {
  const json* layer_types = nullptr;
  if (auto it = config.find("layer_types"); it != config.end() && it->is_array()) {
    if (static_cast<int>(it->size()) != facts.num_layers)
      throw InputError(facts.config_file.empty() ? "config.json" : facts.config_file,
                       fmt::format("layer_types has {} entries but num_hidden_layers is {}",
                                   it->size(), facts.num_layers));
    layer_types = &*it;
  }
  int sliding_window = positive_int(config, "sliding_window",
                                    family == Family::qwen2 ? kQwenSlidingWindow : 0, 1 << 30);
  facts.layers.clear();
  facts.layers.reserve(facts.num_layers);
  for (int i = 0; i < facts.num_layers; ++i) {
    LayerFacts layer;
    layer.index = i;
    layer.kind = default_layer_kind(family.value_or(Family::dense), config, i);
    if (layer_types && family != Family::mla) {
      const json& entry = (*layer_types)[i];
      auto kind = entry.is_string() ? parse_layer_type(entry.get<std::string>()) : std::nullopt;
      if (!kind)
        throw InputError(
            facts.config_file.empty() ? "config.json" : facts.config_file,
            fmt::format("layer_types[{}] = {} is not a known layer type", i, entry.dump()));
      layer.kind = *kind;
    }
    std::optional<int> nas_kv_heads;
    if (family == Family::nas) {
      const NasAttention nas =
          nas_attention(config, i, facts.num_attention_heads,
                        facts.config_file.empty() ? "config.json" : facts.config_file);
      layer.kind = nas.attends ? LayerKind::full_attention : LayerKind::no_attention;
      if (nas.attends) nas_kv_heads = nas.kv_heads;
    }
    switch (layer.kind) {
      case LayerKind::no_attention:
        break;
      case LayerKind::mla:
        layer.kv_heads = 1;  // one shared latent per token
        layer.k_head_dim = facts.mla->kv_lora_rank + facts.mla->qk_rope_head_dim;
        layer.v_head_dim = 0;
        break;
      case LayerKind::linear_attention:
        break;
      case LayerKind::sliding_attention:
        layer.sliding_window = sliding_window;
        [[fallthrough]];
      case LayerKind::full_attention:
        layer.kv_heads = nas_kv_heads.value_or(facts.num_kv_heads);
        layer.k_head_dim = facts.head_dim;
        layer.v_head_dim = facts.head_dim;
        break;
    }
    facts.layers.push_back(layer);
  }
}

}  // namespace

void fill_architecture(const json& config, ModelFacts& facts) {
  facts.model_type = string_or(config, "model_type");
  const KnownArchitecture* known = find_architecture(facts.model_type);
  if (!known && !facts.outer_model_type.empty()) known = find_architecture(facts.outer_model_type);
  std::optional<Family> family;
  if (known) family = known->family;
  facts.architecture_known = known != nullptr;
  facts.qk_norm = known ? known->qk_norm : QkNorm::none;

  read_model_dimensions(config, family, facts);
  if (facts.num_layers == 0)
    throw InputError(facts.config_file.empty() ? "config.json" : facts.config_file,
                     "num_hidden_layers is missing or 0");

  read_family_blocks(config, family, facts);
  read_layers(config, family, facts);
  if (family == Family::nas) {
    // The model-wide KV head count is the first attending layer's, as vLLM reads it.
    auto first = std::find_if(facts.layers.begin(), facts.layers.end(),
                              [](const LayerFacts& l) { return holds_kv_cache(l.kind); });
    if (first != facts.layers.end()) facts.num_kv_heads = first->kv_heads;
    const auto skipped = std::count_if(facts.layers.begin(), facts.layers.end(), [](const auto& l) {
      return l.kind == LayerKind::no_attention;
    });
    facts.notes.push_back(fmt::format(
        "Nemotron-NAS: {} of {} layers have no attention (block_configs no_op or "
        "replace_with_linear) and hold no KV cache; vLLM allocates none for them (reproduced "
        "on a real vLLM 0.13.0 log); other engines' pools for this family are not verified",
        skipped, facts.layers.size()));
  }
  if (!facts.architecture_known)
    facts.notes.push_back(fmt::format(
        "unknown architecture '{}' ({}): layer facts assume plain full attention with the "
        "config's head counts; architecture-specific checks are skipped",
        facts.model_type.empty() ? "no model_type" : facts.model_type,
        facts.architecture.empty() ? "no architectures entry" : facts.architecture));
}

}  // namespace kvaudit::checkpoint
