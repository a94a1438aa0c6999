// Reading config.json into ModelConfig, and the rotary frequencies each rope_scaling type
// implies (as Hugging Face transformers' modeling_rope_utils defines them).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numbers>

#include "model/model.h"
#include "util/json.h"
#include "util/util.h"

namespace kvaudit::model {

namespace {

// rope_scaling (or a non-default rope_parameters), as checkpoint/ kept it.
RopeConfig rope_from(const checkpoint::ModelFacts& facts, const ModelConfig& model,
                     const std::string& label) {
  RopeConfig rope;
  rope.theta = facts.rope_theta;
  const double partial = facts.partial_rotary_factor;
  rope.rotary_dim = static_cast<int>(model.head_dim * partial);
  if (rope.rotary_dim <= 0 || rope.rotary_dim > model.head_dim || rope.rotary_dim % 2 != 0)
    throw InputError(label, fmt::format("partial_rotary_factor {} gives an unusable rotary "
                                        "width {} for head_dim {}",
                                        partial, rope.rotary_dim, model.head_dim));
  const nlohmann::json& scaling = facts.rope_scaling;
  if (scaling.is_null()) return rope;
  if (!scaling.is_object()) throw InputError(label, "\"rope_scaling\" must be an object");
  std::string type = scaling.value("rope_type", scaling.value("type", std::string("default")));
  JsonReader fields(scaling, label, "rope_scaling");
  rope.factor = fields.number_or("factor", 1.0);
  rope.original_max_position =
      fields.integer_or("original_max_position_embeddings", model.max_position_embeddings);
  if (type == "default") {
    rope.type = RopeType::standard;
  } else if (type == "linear") {
    rope.type = RopeType::linear;
  } else if (type == "llama3") {
    rope.type = RopeType::llama3;
    rope.low_freq_factor = fields.number_or("low_freq_factor", 1.0);
    rope.high_freq_factor = fields.number_or("high_freq_factor", 4.0);
    if (rope.high_freq_factor <= rope.low_freq_factor)
      throw InputError(label, "llama3 rope_scaling needs high_freq_factor > low_freq_factor");
  } else if (type == "yarn") {
    rope.type = RopeType::yarn;
    rope.beta_fast = fields.number_or("beta_fast", 32.0);
    rope.beta_slow = fields.number_or("beta_slow", 1.0);
    // YaRN's default attention temperature: 0.1 ln(s) + 1 (get_mscale in transformers).
    double fallback = rope.factor > 1.0 ? 0.1 * std::log(rope.factor) + 1.0 : 1.0;
    rope.attention_factor = fields.number_or("attention_factor", fallback);
  } else {
    throw InputError(label, fmt::format("rope_scaling type \"{}\" is not supported (supported: "
                                        "default, linear, llama3, yarn)",
                                        type));
  }
  if (!(rope.factor > 0.0)) throw InputError(label, "rope_scaling factor must be positive");
  return rope;
}

}  // namespace

ModelConfig model_config_from(const checkpoint::ModelFacts& facts, const std::string& label) {
  ModelConfig model;
  model.architecture = facts.architecture;
  const std::string& model_type = facts.model_type;
  if (model.architecture == "LlamaForCausalLM" || model_type == "llama") {
    model.family = Family::llama;
  } else if (model.architecture == "MistralForCausalLM" || model_type == "mistral") {
    model.family = Family::mistral;
  } else if (model.architecture == "Qwen2ForCausalLM" || model_type == "qwen2") {
    model.family = Family::qwen2;
  } else if (model.architecture == "Qwen3ForCausalLM" || model_type == "qwen3") {
    model.family = Family::qwen3;
  } else if (model.architecture == "Qwen3_5ForConditionalGeneration" ||
             model.architecture == "Qwen3_5ForCausalLM" || model_type == "qwen3_5_text" ||
             model_type == "qwen3_5") {
    model.family = Family::qwen3_5;
  } else {
    throw InputError(label, fmt::format("architecture \"{}\" (model_type \"{}\") is not supported "
                                        "by the reference engine (Llama, Mistral, Qwen2, Qwen3, "
                                        "Qwen3.5 dense)",
                                        model.architecture, model_type));
  }
  model.hidden_size = facts.hidden_size;
  model.intermediate_size = facts.intermediate_size;
  model.num_layers = facts.num_layers;
  model.num_heads = facts.num_attention_heads;
  model.num_kv_heads = facts.num_kv_heads;
  model.vocab_size = facts.vocab_size;
  model.max_position_embeddings =
      facts.max_position_embeddings > 0 ? facts.max_position_embeddings : 4096;
  if (model.hidden_size <= 0 || model.intermediate_size <= 0 || model.num_layers <= 0 ||
      model.num_heads <= 0 || model.num_kv_heads <= 0 || model.vocab_size <= 0)
    throw InputError(label,
                     "sizes must be positive (hidden_size, intermediate_size, "
                     "num_hidden_layers, num_attention_heads, num_key_value_heads, "
                     "vocab_size)");
  if (model.num_heads % model.num_kv_heads != 0)
    throw InputError(label, fmt::format("num_attention_heads {} is not a multiple of "
                                        "num_key_value_heads {}",
                                        model.num_heads, model.num_kv_heads));
  model.head_dim = facts.head_dim;
  if (model.head_dim <= 0 || model.head_dim % 2 != 0)
    throw InputError(label, fmt::format("head_dim {} must be positive and even", model.head_dim));
  model.rms_norm_eps = static_cast<float>(facts.rms_norm_eps);
  model.tie_word_embeddings = facts.tie_word_embeddings;
  model.qk_norm = model.family == Family::qwen3 || model.family == Family::qwen3_5;
  if (model.family == Family::qwen3_5) {
    // Qwen3_5RMSNorm: x / rms(x) * (1 + weight) (transformers modeling_qwen3_5.py).
    model.norm_weight_offset = 1.0f;
    model.attention_output_gate = facts.attention_output_gate;
    if (facts.num_experts > 0)
      throw InputError(label, fmt::format("{} experts per layer: the reference engine runs the "
                                          "dense Qwen3.5 models only (no MoE MLP)",
                                          facts.num_experts));
  }
  model.attention_bias = model.family == Family::qwen2 || facts.attention_bias;
  if (facts.mlp_bias) throw InputError(label, "mlp_bias is not supported");
  if (facts.hidden_act != "silu")
    throw InputError(label, fmt::format("hidden_act \"{}\" is not supported", facts.hidden_act));
  // Sliding windows are checkpoint/'s per-layer facts (layer_types, Mistral's every layer,
  // Qwen's use_sliding_window from max_window_layers on): the audit and the engine agree.
  model.sliding_window.assign(model.num_layers, 0);
  model.mixers.assign(model.num_layers, Mixer::attention);
  for (const checkpoint::LayerFacts& layer : facts.layers) {
    if (layer.kind == checkpoint::LayerKind::linear_attention && model.family == Family::qwen3_5 &&
        facts.linear_attention) {
      model.mixers[layer.index] = Mixer::gated_delta_net;
    } else if (layer.kind == checkpoint::LayerKind::sliding_attention) {
      if (layer.sliding_window <= 0)
        throw InputError(label, "sliding_attention layer without sliding_window");
      model.sliding_window[layer.index] = layer.sliding_window;
    } else if (layer.kind != checkpoint::LayerKind::full_attention) {
      throw InputError(label, fmt::format("layer {} is {}: not supported by the reference engine",
                                          layer.index, checkpoint::layer_kind_name(layer.kind)));
    }
  }
  if (model.hybrid()) {
    const checkpoint::LinearAttentionFacts& linear = *facts.linear_attention;
    DeltaNetConfig& d = model.delta_net;
    d.key_heads = linear.num_key_heads;
    d.value_heads = linear.num_value_heads;
    d.key_head_dim = linear.key_head_dim;
    d.value_head_dim = linear.value_head_dim;
    d.conv_kernel = linear.conv_kernel;
    if (d.key_heads <= 0 || d.value_heads <= 0 || d.key_head_dim <= 0 || d.value_head_dim <= 0 ||
        d.conv_kernel <= 0 || d.value_heads % d.key_heads != 0)
      throw InputError(label, fmt::format("linear attention shapes: {} key heads must divide {} "
                                          "value heads, all sizes positive",
                                          d.key_heads, d.value_heads));
  }
  model.rope = rope_from(facts, model, label);
  return model;
}

bool ModelConfig::hybrid() const {
  return std::find(mixers.begin(), mixers.end(), Mixer::gated_delta_net) != mixers.end();
}

int ModelConfig::attention_layers() const {
  return static_cast<int>(std::count(mixers.begin(), mixers.end(), Mixer::attention));
}

ModelConfig parse_model_config(const nlohmann::json& config, const std::string& label) {
  if (!config.is_object()) throw InputError(label, "config is not a JSON object");
  checkpoint::ModelFacts facts;
  facts.config_file = label;
  checkpoint::fill_from_config(config, facts);
  return model_config_from(facts, label);
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
