// Reading config.json into ModelConfig, and the rotary frequencies each rope_scaling type
// implies (as Hugging Face transformers' modeling_rope_utils defines them).
#include <fmt/format.h>

#include <cmath>
#include <numbers>

#include "model/model.h"
#include "util/util.h"

namespace kvaudit::model {

std::string_view family_name(Family family) {
  switch (family) {
    case Family::llama:
      return "llama";
    case Family::mistral:
      return "mistral";
    case Family::qwen2:
      return "qwen2";
    case Family::qwen3:
      return "qwen3";
  }
  return "?";
}

std::string_view rope_type_name(RopeType type) {
  switch (type) {
    case RopeType::standard:
      return "default";
    case RopeType::linear:
      return "linear";
    case RopeType::llama3:
      return "llama3";
    case RopeType::yarn:
      return "yarn";
  }
  return "?";
}

namespace {

int64_t get_int(const nlohmann::json& object, const char* key, const std::string& label,
                std::optional<int64_t> fallback = std::nullopt) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) {
    if (fallback) return *fallback;
    throw InputError(label, fmt::format("missing \"{}\"", key));
  }
  if (!it->is_number_integer() && !it->is_number_unsigned())
    throw InputError(label, fmt::format("\"{}\" must be an integer", key));
  return it->get<int64_t>();
}

double get_number(const nlohmann::json& object, const char* key, const std::string& label,
                  double fallback) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return fallback;
  if (!it->is_number()) throw InputError(label, fmt::format("\"{}\" must be a number", key));
  return it->get<double>();
}

bool get_bool(const nlohmann::json& object, const char* key, const std::string& label,
              bool fallback) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) throw InputError(label, fmt::format("\"{}\" must be true/false", key));
  return it->get<bool>();
}

RopeConfig parse_rope(const nlohmann::json& config, const ModelConfig& model,
                      const std::string& label) {
  RopeConfig rope;
  rope.theta = get_number(config, "rope_theta", label, 10000.0);
  double partial = get_number(config, "partial_rotary_factor", label, 1.0);
  rope.rotary_dim = static_cast<int>(model.head_dim * partial);
  if (rope.rotary_dim <= 0 || rope.rotary_dim > model.head_dim || rope.rotary_dim % 2 != 0)
    throw InputError(label, fmt::format("partial_rotary_factor {} gives an unusable rotary "
                                        "width {} for head_dim {}",
                                        partial, rope.rotary_dim, model.head_dim));
  auto scaling = config.find("rope_scaling");
  if (scaling == config.end() || scaling->is_null()) return rope;
  if (!scaling->is_object()) throw InputError(label, "\"rope_scaling\" must be an object");
  std::string type = scaling->value("rope_type", scaling->value("type", std::string("default")));
  rope.factor = get_number(*scaling, "factor", label, 1.0);
  rope.original_max_position =
      get_int(*scaling, "original_max_position_embeddings", label, model.max_position_embeddings);
  if (type == "default") {
    rope.type = RopeType::standard;
  } else if (type == "linear") {
    rope.type = RopeType::linear;
  } else if (type == "llama3") {
    rope.type = RopeType::llama3;
    rope.low_freq_factor = get_number(*scaling, "low_freq_factor", label, 1.0);
    rope.high_freq_factor = get_number(*scaling, "high_freq_factor", label, 4.0);
    if (rope.high_freq_factor <= rope.low_freq_factor)
      throw InputError(label, "llama3 rope_scaling needs high_freq_factor > low_freq_factor");
  } else if (type == "yarn") {
    rope.type = RopeType::yarn;
    rope.beta_fast = get_number(*scaling, "beta_fast", label, 32.0);
    rope.beta_slow = get_number(*scaling, "beta_slow", label, 1.0);
    // YaRN's default attention temperature: 0.1 ln(s) + 1 (get_mscale in transformers).
    double fallback = rope.factor > 1.0 ? 0.1 * std::log(rope.factor) + 1.0 : 1.0;
    rope.attention_factor = get_number(*scaling, "attention_factor", label, fallback);
  } else {
    throw InputError(label, fmt::format("rope_scaling type \"{}\" is not supported (supported: "
                                        "default, linear, llama3, yarn)",
                                        type));
  }
  if (!(rope.factor > 0.0)) throw InputError(label, "rope_scaling factor must be positive");
  return rope;
}

}  // namespace

ModelConfig parse_model_config(const nlohmann::json& config, const std::string& label) {
  if (!config.is_object()) throw InputError(label, "config is not a JSON object");
  ModelConfig model;
  auto archs = config.find("architectures");
  if (archs != config.end() && archs->is_array() && !archs->empty() && (*archs)[0].is_string())
    model.architecture = (*archs)[0].get<std::string>();
  std::string model_type = config.value("model_type", std::string());
  if (model.architecture == "LlamaForCausalLM" || model_type == "llama") {
    model.family = Family::llama;
  } else if (model.architecture == "MistralForCausalLM" || model_type == "mistral") {
    model.family = Family::mistral;
  } else if (model.architecture == "Qwen2ForCausalLM" || model_type == "qwen2") {
    model.family = Family::qwen2;
  } else if (model.architecture == "Qwen3ForCausalLM" || model_type == "qwen3") {
    model.family = Family::qwen3;
  } else {
    throw InputError(label, fmt::format("architecture \"{}\" (model_type \"{}\") is not supported "
                                        "by the reference engine (Llama, Mistral, Qwen2, Qwen3)",
                                        model.architecture, model_type));
  }
  model.hidden_size = static_cast<int>(get_int(config, "hidden_size", label));
  model.intermediate_size = static_cast<int>(get_int(config, "intermediate_size", label));
  model.num_layers = static_cast<int>(get_int(config, "num_hidden_layers", label));
  model.num_heads = static_cast<int>(get_int(config, "num_attention_heads", label));
  model.num_kv_heads =
      static_cast<int>(get_int(config, "num_key_value_heads", label, model.num_heads));
  model.vocab_size = get_int(config, "vocab_size", label);
  model.max_position_embeddings = get_int(config, "max_position_embeddings", label, 4096);
  if (model.hidden_size <= 0 || model.intermediate_size <= 0 || model.num_layers <= 0 ||
      model.num_heads <= 0 || model.num_kv_heads <= 0 || model.vocab_size <= 0)
    throw InputError(label, "sizes must be positive");
  if (model.num_heads % model.num_kv_heads != 0)
    throw InputError(label, fmt::format("num_attention_heads {} is not a multiple of "
                                        "num_key_value_heads {}",
                                        model.num_heads, model.num_kv_heads));
  int64_t default_head_dim = model.hidden_size / model.num_heads;
  model.head_dim = static_cast<int>(get_int(config, "head_dim", label, default_head_dim));
  if (model.head_dim <= 0 || model.head_dim % 2 != 0)
    throw InputError(label, fmt::format("head_dim {} must be positive and even", model.head_dim));
  model.rms_norm_eps = static_cast<float>(get_number(config, "rms_norm_eps", label, 1e-6));
  model.tie_word_embeddings = get_bool(config, "tie_word_embeddings", label, false);
  model.qk_norm = model.family == Family::qwen3;
  model.attention_bias =
      model.family == Family::qwen2 || get_bool(config, "attention_bias", label, false);
  if (get_bool(config, "mlp_bias", label, false))
    throw InputError(label, "mlp_bias is not supported");
  std::string act = config.value("hidden_act", std::string("silu"));
  if (act != "silu")
    throw InputError(label, fmt::format("hidden_act \"{}\" is not supported", act));

  // Sliding windows: Mistral applies "sliding_window" to every layer; Qwen2/Qwen3 only when
  // use_sliding_window is true, to layers at and after max_window_layers; an explicit
  // "layer_types" list (newer transformers) wins.
  model.sliding_window.assign(model.num_layers, 0);
  int64_t window = get_int(config, "sliding_window", label, 0);
  if (window < 0) throw InputError(label, "sliding_window must not be negative");
  auto layer_types = config.find("layer_types");
  if (layer_types != config.end() && layer_types->is_array()) {
    if (static_cast<int>(layer_types->size()) != model.num_layers)
      throw InputError(label, "layer_types length differs from num_hidden_layers");
    for (int i = 0; i < model.num_layers; ++i) {
      if ((*layer_types)[i] == "sliding_attention") {
        if (window <= 0) throw InputError(label, "sliding_attention layer without sliding_window");
        model.sliding_window[i] = static_cast<int>(window);
      }
    }
  } else if (model.family == Family::mistral) {
    for (int& w : model.sliding_window) w = static_cast<int>(window);
  } else if (model.family == Family::qwen2 || model.family == Family::qwen3) {
    if (get_bool(config, "use_sliding_window", label, false) && window > 0) {
      int64_t first = get_int(config, "max_window_layers", label, model.num_layers);
      for (int i = 0; i < model.num_layers; ++i)
        if (i >= first) model.sliding_window[i] = static_cast<int>(window);
    }
  }
  model.rope = parse_rope(config, model, label);
  return model;
}

std::vector<double> rope_inverse_frequencies(const RopeConfig& rope) {
  const int pairs = rope.rotary_dim / 2;
  const double dim = rope.rotary_dim;
  std::vector<double> inv(pairs);
  for (int i = 0; i < pairs; ++i) inv[i] = 1.0 / std::pow(rope.theta, (2.0 * i) / dim);
  const double two_pi = 2.0 * std::numbers::pi;
  switch (rope.type) {
    case RopeType::standard:
      break;
    case RopeType::linear:
      for (double& f : inv) f /= rope.factor;
      break;
    case RopeType::llama3: {
      // Long wavelengths are interpolated by `factor`, short ones kept, the band between
      // blended linearly in old_context / wavelength.
      double old_context = static_cast<double>(rope.original_max_position);
      double low_freq_wavelen = old_context / rope.low_freq_factor;
      double high_freq_wavelen = old_context / rope.high_freq_factor;
      for (double& f : inv) {
        double wavelen = two_pi / f;
        if (wavelen > low_freq_wavelen) {
          f = f / rope.factor;
        } else if (wavelen >= high_freq_wavelen) {
          double smooth = (old_context / wavelen - rope.low_freq_factor) /
                          (rope.high_freq_factor - rope.low_freq_factor);
          f = (1.0 - smooth) * f / rope.factor + smooth * f;
        }
      }
      break;
    }
    case RopeType::yarn: {
      // NTK-by-parts: dimensions that rotate more than beta_fast times over the original
      // context are extrapolated, fewer than beta_slow times interpolated, ramp between.
      double base = rope.theta;
      double old_context = static_cast<double>(rope.original_max_position);
      auto correction_dim = [&](double rotations) {
        return (dim * std::log(old_context / (rotations * two_pi))) / (2.0 * std::log(base));
      };
      double low = std::floor(correction_dim(rope.beta_fast));
      double high = std::ceil(correction_dim(rope.beta_slow));
      low = std::max(low, 0.0);
      high = std::min(high, dim - 1.0);
      if (low == high) high += 0.001;
      for (int i = 0; i < pairs; ++i) {
        double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
        double extrapolation_weight = 1.0 - ramp;
        double extrapolated = inv[i];
        double interpolated = inv[i] / rope.factor;
        inv[i] = interpolated * (1.0 - extrapolation_weight) + extrapolated * extrapolation_weight;
      }
      break;
    }
  }
  return inv;
}

}  // namespace kvaudit::model
