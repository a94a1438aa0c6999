// The KV scales under an engine release: which checkpoint scale tensors reach the attention
// layers, where the scales in effect come from, and what the engine does with the loaded
// values (the scale fallback, and the values that stop start-up).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "engines/internal.h"
#include "util/util.h"

namespace kvaudit::engines {

namespace {

using checkpoint::ModelFacts;
using checkpoint::ScaleRole;
using checkpoint::ScaleTensor;

const ScaleNameRule* name_rule_for(const EngineModel& engine, const Version& version,
                                   const ModelFacts& model, const ScaleTensor& scale) {
  for (const ScaleNameRule& rule : engine.scale_name_rules) {
    if (!rule.versions.contains(version) || !rule.when.matches(model)) continue;
    if (std::find(rule.conventions.begin(), rule.conventions.end(), scale.convention) !=
        rule.conventions.end())
      return &rule;
  }
  return nullptr;  // the lint guarantees a rule; a scale of an unknown convention drops
}

void add_drop(std::vector<DroppedScales>& dropped, const std::string& id, const std::string& reason,
              const Provenance& provenance, const std::string& tensor) {
  for (auto& drop : dropped)
    if (drop.rule_id == id) {
      drop.tensor_names.push_back(tensor);
      return;
    }
  dropped.push_back({id, reason, provenance, {tensor}});
}

// Which checkpoint scale tensors reach the attention layers.
std::vector<const ScaleTensor*> loaded_scales(const EngineModel& engine, const Version& version,
                                              const ModelFacts& model, ResolvedKv& resolved) {
  std::vector<const ScaleTensor*> kept;
  for (const ScaleTensor& scale : model.kv_scales) {
    const ScaleNameRule* rule = name_rule_for(engine, version, model, scale);
    if (rule && rule->loaded) {
      kept.push_back(&scale);
    } else if (rule) {
      add_drop(resolved.dropped, rule->id, rule->reason, rule->provenance, scale.name);
    } else {
      add_drop(resolved.dropped, "unmapped-scale-name",
               "no loader of this version maps this tensor name onto an attention layer", {},
               scale.name);
    }
  }
  // Scale parameters exist only when the quantization config creates a KV-cache method.
  const std::string method = model.quant ? model.quant->method : "none";
  for (const KvMethodRule& rule : engine.kv_method_rules) {
    if (!rule.versions.contains(version) || kept.empty()) continue;
    if (!any_glob(rule.quant_methods, method) || rule.quant_methods.empty()) {
      for (const ScaleTensor* scale : kept)
        add_drop(resolved.dropped, rule.id, rule.reason, rule.provenance, scale->name);
      kept.clear();
    }
    break;
  }
  // Per-architecture and per-method loader gaps.
  for (const ScaleNameRule& rule : engine.scale_drop_rules) {
    if (!rule.versions.contains(version) || !rule.when.matches(model)) continue;
    if (!rule.dtypes.empty() && std::find(rule.dtypes.begin(), rule.dtypes.end(),
                                          resolved.kv_cache_dtype) == rule.dtypes.end())
      continue;
    std::vector<const ScaleTensor*> still;
    for (const ScaleTensor* scale : kept) {
      bool hit = std::find(rule.conventions.begin(), rule.conventions.end(), "*") !=
                     rule.conventions.end() ||
                 std::find(rule.conventions.begin(), rule.conventions.end(), scale->convention) !=
                     rule.conventions.end();
      if (hit)
        add_drop(resolved.dropped, rule.id, rule.reason, rule.provenance, scale->name);
      else
        still.push_back(scale);
    }
    kept = std::move(still);
  }
  return kept;
}

// The loaded values of every layer through the version's fallback rule: non-scalar
// scales, lone v scales, zeros and NaNs that stop start-up.
void check_loaded_values(const FallbackRule& fallback, const ModelFacts& model,
                         const std::vector<const ScaleTensor*>& kept, ResolvedKv& resolved) {
  struct Layer {
    std::optional<float> k, v;  // the last loaded value, as the loader overwrites
    std::string non_scalar;     // name of a non-scalar scale tensor
  };
  std::map<int, Layer> layers;
  for (const ScaleTensor* scale : kept) {
    Layer& layer = layers[scale->layer];
    if (scale->values.size() > 1) layer.non_scalar = scale->name;
    if (scale->values.empty()) continue;
    if (scale->role != ScaleRole::v) layer.k = scale->values.front();
    if (scale->role != ScaleRole::k) layer.v = scale->values.front();
  }
  const bool ct_attn_head = model.quant && model.quant->method == "compressed-tensors" &&
                            model.quant->kv_scheme_strategy == "attn_head";
  for (const auto& [index, layer] : layers) {
    if (!layer.non_scalar.empty()) {
      if (fallback.non_scalar == NonScalarRule::per_head_for_ct_attn_head && ct_attn_head) continue;
      resolved.startup_failures.push_back(
          {"scale-non-scalar", fallback.non_scalar_error,
           fmt::format("{} is not a scalar (per-tensor scales only{})", layer.non_scalar,
                       fallback.non_scalar == NonScalarRule::per_head_for_ct_attn_head
                           ? "; per-head only for compressed-tensors attn_head schemes"
                           : ""),
           fallback.provenance});
      return;
    }
    LayerScales scales = apply_fallback(fallback, layer.k, layer.v);
    if (scales.error_id.empty()) continue;
    const std::string cause =
        scales.error_id == "scale-nan" ? fmt::format("layer {} has a NaN k_scale", index)
        : scales.error_id == "scale-zero"
            ? fmt::format("layer {} has a k/v scale of exactly 0.0", index)
        : scales.error_id == "scale-k-only"
            ? fmt::format("layer {} has a k_scale but no usable v_scale", index)
            : fmt::format("layer {} has a v_scale but no usable k_scale", index);
    resolved.startup_failures.push_back(
        {scales.error_id, scales.error, cause, fallback.provenance});
    return;  // the first failing layer stops start-up
  }
}

ScaleSource pick_scale_source(const EngineModel& engine, const Version& version,
                              const ModelFacts& model, const LaunchFlags& flags,
                              const std::vector<const ScaleTensor*>& kept, const KvDtype& dtype) {
  if (!dtype.quantized) return ScaleSource::not_applicable;
  if (dtype.scales == ScaleSemantics::dynamic_block ||
      dtype.scales == ScaleSemantics::dynamic_per_token_head ||
      dtype.scales == ScaleSemantics::packed_dynamic)
    return ScaleSource::dynamic_by_design;
  for (const FlagRule& rule : engine.flag_rules)
    if (rule.flag == "--calculate-kv-scales" && flag_given(engine, flags, rule.flag) &&
        rule.exists.contains(version) &&
        !(model.linear_attention && rule.disabled_for_hybrid.contains(version)))
      return ScaleSource::calculated;
  if (!flags.quantization_param_path.empty() && engine.has_quantization_param_path &&
      dtype.scales == ScaleSemantics::static_per_tensor)
    return ScaleSource::quantization_param_path;
  if (!kept.empty()) return ScaleSource::checkpoint;
  // No checkpoint at all (a live server probed without --checkpoint): nobody knows.
  if (!model.has_weights && model.config_file.empty()) return ScaleSource::unknown;
  return ScaleSource::unit_default;
}

}  // namespace

// BaseKVCacheMethod (both engines) starts every scale at -1.0 and branches: both present
// -> used; both missing -> the default; else `assert k_scale > 0` and the larger is used
// for both. A value is present when > 0 and missing when < 0 (SGLang: <= 0); anything
// else (NaN, and 0.0 in vLLM) is neither, so it fails the assertion. vLLM's
// compressed-tensors method starts at 1.0 and copies what loads: a lone side keeps the
// other at 1.0 and a 0.0 is used as is (other_side_unit, used_as_is).
LayerScales apply_fallback(const FallbackRule& fallback, std::optional<float> k,
                           std::optional<float> v) {
  enum class Side { missing, present, neither };
  auto side_of = [&](std::optional<float> x) {
    if (!x) return Side::missing;
    if (*x > 0) return Side::present;
    if (*x < 0 || (*x == 0 && fallback.zero == ZeroScaleRule::missing)) return Side::missing;
    return Side::neither;
  };
  const Side ks = side_of(k), vs = side_of(v);
  LayerScales out;
  out.k = out.v = static_cast<float>(fallback.both_missing_scale);
  if (ks == Side::present && vs == Side::present) {
    out.k = *k, out.v = *v, out.from_checkpoint = true;
  } else if (ks == Side::missing && vs == Side::missing) {
    // the default, silently or with the engine's warning
  } else if (ks == Side::present && fallback.k_only == OneScaleRule::other_side_unit) {
    out.k = *k, out.from_checkpoint = true;  // V keeps its initial 1.0
    if (v && *v == 0 && fallback.zero == ZeroScaleRule::used_as_is) out.v = 0.0f;
  } else if (vs == Side::present && fallback.v_only == OneScaleRule::other_side_unit) {
    out.v = *v, out.from_checkpoint = true;  // K keeps its initial 1.0
    if (k && *k == 0 && fallback.zero == ZeroScaleRule::used_as_is) out.k = 0.0f;
  } else if (fallback.zero == ZeroScaleRule::used_as_is && ((k && *k == 0) || (v && *v == 0))) {
    // Copied as is: a zero scale is used by the kernels (which then divide by zero).
    if (k && *k == 0) out.k = 0.0f;
    if (v && *v == 0) out.v = 0.0f;
    out.from_checkpoint = true;
  } else if (ks == Side::present) {
    if (fallback.k_only == OneScaleRule::startup_error) {
      out.error_id = "scale-k-only", out.error = fallback.one_missing_error;
    } else {
      out.k = out.v = *k, out.from_checkpoint = true;  // max(k, v) with v <= 0 or NaN
    }
  } else {
    const bool zero = (k && *k == 0) || (v && *v == 0);
    const bool nan = k && std::isnan(*k);
    out.error_id = nan ? "scale-nan" : zero ? "scale-zero" : "scale-v-only";
    out.error = zero && fallback.zero == ZeroScaleRule::startup_error ? fallback.zero_error
                                                                      : fallback.one_missing_error;
  }
  return out;
}

// Which checkpoint scales reach the attention layers (reported even for a 16-bit cache: a
// drop bites the day FP8 is switched on), where the scales in effect come from, and what
// the engine does with the loaded values.
void resolve_scales(const EngineModel& engine, const Version& version, const ModelFacts& model,
                    const LaunchFlags& flags, ResolvedKv& resolved) {
  std::vector<const ScaleTensor*> kept = loaded_scales(engine, version, model, resolved);
  for (const ScaleTensor* scale : kept) resolved.loaded_scale_names.push_back(scale->name);
  resolved.fallback = &engine.fallback_for(version, &model);
  if (!resolved.dtype) return;
  resolved.scale_source = pick_scale_source(engine, version, model, flags, kept, *resolved.dtype);
  if (resolved.scale_source == ScaleSource::dynamic_by_design) {
    resolved.ignored_by_design = resolved.loaded_scale_names;
    resolved.loaded_scale_names.clear();
  }
  if (resolved.dtype->quantized && (resolved.scale_source == ScaleSource::checkpoint ||
                                    resolved.scale_source == ScaleSource::unit_default))
    check_loaded_values(*resolved.fallback, model, kept, resolved);
}

const ScaleNameRule* scales_ignored_for(const EngineModel& engine, const Version& version,
                                        const checkpoint::ModelFacts& model,
                                        const std::string& dtype) {
  for (const ScaleNameRule& rule : engine.scale_drop_rules) {
    if (rule.dtypes.empty() || !rule.versions.contains(version) || !rule.when.matches(model))
      continue;
    const bool every_name =
        std::find(rule.conventions.begin(), rule.conventions.end(), "*") != rule.conventions.end();
    if (every_name && std::find(rule.dtypes.begin(), rule.dtypes.end(), dtype) != rule.dtypes.end())
      return &rule;
  }
  return nullptr;
}

}  // namespace kvaudit::engines
