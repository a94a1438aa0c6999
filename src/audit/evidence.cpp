// The evidence behind a severity: what is known about this model's K/V range under the
// scales the engine will use, strongest first: measured maxima (check --kv-stats), bounds
// from the checkpoint (key-norm weights, scale values the checkpoint ships), published
// damage on the model family (data/evidence/kv_damage.json), or nothing. How the user's
// --kv-policy turns that into a severity: policy.cpp. The rules say what is wrong; this file
// says how sure kvaudit is that it hurts.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "audit/internal.h"
#include "util/json.h"
#include "util/util.h"

namespace kvaudit::audit {

using report::Evidence;

namespace {

// ---------------------------------------------------------------- scales in effect

struct LayerScale {
  float k = 1.0f, v = 1.0f;
};

// The K and V scale each quantized attention layer runs with (1.0 where none applies).
std::map<int, LayerScale> scales_in_effect(const CheckInput& input,
                                           const engines::ResolvedKv& resolved) {
  std::map<int, LayerScale> out;
  const float unit = resolved.fallback ? float(resolved.fallback->both_missing_scale) : 1.0f;
  for (int layer : attention_layers(input.model))
    if (std::find(resolved.skipped_layers.begin(), resolved.skipped_layers.end(), layer) ==
        resolved.skipped_layers.end())
      out[layer] = {unit, unit};
  if (resolved.scale_source != engines::ScaleSource::checkpoint || !resolved.fallback) return out;
  std::set<std::string> loaded(resolved.loaded_scale_names.begin(),
                               resolved.loaded_scale_names.end());
  std::map<int, std::pair<std::optional<float>, std::optional<float>>> values;
  for (const auto& scale : input.model.kv_scales) {
    if (!loaded.count(scale.name) || scale.values.empty()) continue;
    auto& [k, v] = values[scale.layer];
    if (scale.role != checkpoint::ScaleRole::v) k = scale.values.front();
    if (scale.role != checkpoint::ScaleRole::k) v = scale.values.front();
  }
  for (auto& [layer, scale] : out) {
    auto it = values.find(layer);
    if (it == values.end()) continue;
    engines::LayerScales applied =
        engines::apply_fallback(*resolved.fallback, it->second.first, it->second.second);
    scale = {applied.k, applied.v};
  }
  return out;
}

std::string layers_text(const std::vector<int>& layers) {
  std::vector<std::string> names;
  names.reserve(layers.size());
  for (int layer : layers) names.push_back(std::to_string(layer));
  return names_preview(names, 6);
}

std::string settle_text(const CheckInput& input) {
  return fmt::format(
      "measure this model's K/V maxima (kvaudit calibrate --model DIR --text FILE --engine {} "
      "--out OVERLAY --stats-out STATS.json, or the same kvaudit-kv-stats/1 file from the "
      "serving GPUs) and pass --kv-stats STATS.json, or A/B it against a 16-bit server (kvaudit "
      "probe URL --compare URL_BF16){}",
      input.flags.engine,
      input.model.has_weights ? ""
                              : " (this check read a bare config.json: no scale or norm "
                                "tensors could be read)");
}

// ---------------------------------------------------------------- measured

std::optional<RangeAssessment> from_measured(const CheckInput& input, const FormatLimits& limits,
                                             const std::map<int, LayerScale>& scales) {
  if (!input.measured) return std::nullopt;
  const MeasuredKvRange& measured = *input.measured;
  std::map<int, const MeasuredKvRange::Layer*> by_layer;
  for (const auto& layer : measured.layers) by_layer[layer.layer] = &layer;
  std::vector<std::string> clipped;
  std::vector<int> missing;
  float worst_k = 0, worst_v = 0;
  for (const auto& [layer, scale] : scales) {
    auto it = by_layer.find(layer);
    if (it == by_layer.end()) {
      missing.push_back(layer);
      continue;
    }
    const double k = it->second->k_amax / scale.k, v = it->second->v_amax / scale.v;
    worst_k = std::max<float>(worst_k, float(k));
    worst_v = std::max<float>(worst_v, float(v));
    if (k > limits.max_finite)
      clipped.push_back(fmt::format("layer {} K {} / scale {} = {}", layer,
                                    float_text(it->second->k_amax), float_text(scale.k),
                                    float_text(k)));
    if (v > limits.max_finite)
      clipped.push_back(fmt::format("layer {} V {} / scale {} = {}", layer,
                                    float_text(it->second->v_amax), float_text(scale.v),
                                    float_text(v)));
  }
  RangeAssessment out;
  out.basis = "measured";
  out.evidence.push_back(
      {measured.source,
       fmt::format("largest |K| / |V| over {} layer(s){}, divided by the scale in effect",
                   scales.size() - missing.size(),
                   measured.tokens ? fmt::format(", {} tokens", measured.tokens) : ""),
       fmt::format("{} / {} (the format saturates above {})", float_text(worst_k),
                   float_text(worst_v), float_text(limits.max_finite))});
  if (!clipped.empty()) {
    out.verdict = RangeVerdict::damaging;
    out.evidence.push_back(
        {measured.source, "values beyond the format's range", names_preview(clipped, 4)});
    out.judged_on = fmt::format(
        "measured maxima of this model exceed the format's largest value ({}) at the scales in "
        "effect in {} place(s): those values saturate or become NaN",
        float_text(limits.max_finite), clipped.size());
    return out;
  }
  if (!missing.empty()) {
    out.verdict = RangeVerdict::unknown;
    out.judged_on = fmt::format(
        "measured maxima fit the format in the {} layer(s) the statistics cover; layers {} have "
        "no statistics. Values below {} still lose precision. To settle: collect statistics for "
        "every attention layer",
        scales.size() - missing.size(), layers_text(missing), float_text(limits.min_normal));
    return out;
  }
  out.verdict = RangeVerdict::safe;
  out.judged_on = fmt::format(
      "measured maxima of this model (|K| {}, |V| {} at the scales in effect) fit the format's "
      "range ({}): nothing saturates; values below {} still lose mantissa bits, which an A/B "
      "(kvaudit probe --compare) measures",
      float_text(worst_k), float_text(worst_v), float_text(limits.max_finite),
      float_text(limits.min_normal));
  return out;
}

// ---------------------------------------------------------------- bounded

struct Bounds {
  std::vector<std::string> k_exceeds;  // layers whose key bound exceeds the format
  std::vector<int> k_fits, k_missing;
  double worst_k_bound = 0;
  int stand_in_norms = 0;                // all-zero vectors: a sparse stand-in, not evidence
  std::vector<std::string> scale_clips;  // shipped scales that imply clipping at 1.0
  std::vector<int> scale_fits;           // layers whose shipped K and V scales fit
  std::vector<Evidence> evidence;
};

// What RoPE multiplies the rotated pairs by: 1 for default, linear, dynamic and llama3
// scaling; YaRN's attention factor (given, else 0.1 ln(factor) + 1, transformers
// _compute_yarn_parameters); nullopt for a scheme whose factor kvaudit does not know.
std::optional<double> rope_attention_factor(const nlohmann::json& rope_scaling) {
  if (!rope_scaling.is_object()) return 1.0;
  const std::string type = rope_scaling.value("rope_type", rope_scaling.value("type", ""));
  if (type.empty() || type == "default" || type == "linear" || type == "dynamic" ||
      type == "llama3")
    return 1.0;
  if (type == "yarn") {
    if (auto it = rope_scaling.find("attention_factor");
        it != rope_scaling.end() && it->is_number())
      return it->get<double>();
    const double factor = rope_scaling.value("factor", 1.0);
    return factor > 1.0 ? 0.1 * std::log(factor) + 1.0 : 1.0;
  }
  return std::nullopt;
}

// Key bound per layer from the k_norm weights: |k_i| <= sqrt(head_dim) * max |gain_i|, times
// RoPE's attention factor, with slack for the two bf16 roundings of the normalised key.
void bound_keys(const CheckInput& input, const FormatLimits& limits,
                const std::map<int, LayerScale>& scales, Bounds& out) {
  const auto& model = input.model;
  if (model.qk_norm == checkpoint::QkNorm::none) return;
  const std::optional<double> rope = rope_attention_factor(model.rope_scaling);
  if (!rope) {
    out.evidence.push_back({model.config_file, "rope_scaling",
                            model.rope_scaling.dump() + ": its attention factor is not known, so "
                                                        "the key norms bound nothing"});
    for (const auto& [layer, scale] : scales) out.k_missing.push_back(layer);
    return;
  }
  constexpr double kBf16Slack = (1.0 + 1.0 / 256) * (1.0 + 1.0 / 256);
  std::map<int, const checkpoint::NormTensor*> norms;
  for (const auto& norm : model.k_norms) norms[norm.layer] = &norm;
  int head_dim = model.head_dim;
  for (const auto& layer : model.layers)
    if (checkpoint::holds_kv_cache(layer.kind) && layer.k_head_dim > 0) head_dim = layer.k_head_dim;
  for (const auto& [layer, scale] : scales) {
    auto it = norms.find(layer);
    if (it == norms.end() || it->second->values.empty()) {
      out.k_missing.push_back(layer);
      continue;
    }
    const auto& values = it->second->values;
    const bool all_zero =
        std::all_of(values.begin(), values.end(), [](float value) { return value == 0.0f; });
    const bool finite =
        std::all_of(values.begin(), values.end(), [](float value) { return std::isfinite(value); });
    if (all_zero || !finite) {
      out.stand_in_norms += all_zero;
      out.k_missing.push_back(layer);
      continue;
    }
    double max_gain = 0;
    for (float w : values)
      max_gain = std::max(
          max_gain, std::fabs(model.qk_norm == checkpoint::QkNorm::one_plus_gain ? 1.0 + double(w)
                                                                                 : double(w)));
    const double bound = std::sqrt(double(values.size())) * max_gain * *rope * kBf16Slack / scale.k;
    out.worst_k_bound = std::max(out.worst_k_bound, bound);
    if (bound > limits.max_finite)
      out.k_exceeds.push_back(fmt::format("layer {}: {}", layer, float_text(float(bound))));
    else
      out.k_fits.push_back(layer);
  }
  if (!out.k_fits.empty() || !out.k_exceeds.empty())
    out.evidence.push_back(
        {model.dir.string(),
         fmt::format("key bound sqrt({}) x max |{}| of self_attn.k_norm.weight{}, over {} "
                     "layer(s)",
                     head_dim, checkpoint::qk_norm_name(model.qk_norm),
                     *rope != 1.0 ? fmt::format(" x RoPE attention factor {:.3f}", *rope) : "",
                     out.k_fits.size() + out.k_exceeds.size()),
         fmt::format("largest {} (the format saturates above {})",
                     float_text(float(out.worst_k_bound)), float_text(limits.max_finite))});
  if (out.stand_in_norms)
    out.evidence.push_back({model.dir.string(), "self_attn.k_norm.weight",
                            fmt::format("all zeros in {} layer(s): a sparse stand-in, not the "
                                        "trained weights (no evidence)",
                                        out.stand_in_norms)});
}

// Calibrated scales the checkpoint ships but the launch does not use (dropped, or not
// loaded under this dtype): scale x 448 is the calibration's amax (FP8 E4M3), so a shipped
// scale above max_finite / 448 means values the scale in effect cannot hold.
void bound_from_shipped_scales(const CheckInput& input, const engines::ResolvedKv& resolved,
                               const FormatLimits& limits, const std::map<int, LayerScale>& scales,
                               Bounds& out) {
  if (input.scales_are_stand_ins || input.model.kv_scales.empty()) return;
  if (resolved.scale_source == engines::ScaleSource::checkpoint) return;  // in effect as shipped
  constexpr double kE4m3Max = 448.0;
  std::map<int, std::pair<double, double>> shipped;  // layer -> (k amax, v amax)
  bool any_real = false;
  for (const auto& scale : input.model.kv_scales)
    for (float value : scale.values) {
      if (!(value > 0) || !std::isfinite(value)) continue;
      any_real |= value != 1.0f;
      auto& [k, v] = shipped[scale.layer];
      if (scale.role != checkpoint::ScaleRole::v) k = std::max(k, value * kE4m3Max);
      if (scale.role != checkpoint::ScaleRole::k) v = std::max(v, value * kE4m3Max);
    }
  if (!any_real) return;  // placeholders (all 1.0) say nothing about the range
  double worst = 0;
  for (const auto& [layer, scale] : scales) {
    auto it = shipped.find(layer);
    if (it == shipped.end()) continue;
    const double k = it->second.first / scale.k, v = it->second.second / scale.v;
    worst = std::max({worst, k, v});
    if (k > limits.max_finite || v > limits.max_finite)
      out.scale_clips.push_back(fmt::format("layer {}: amax K {} V {}", layer,
                                            float_text(float(it->second.first)),
                                            float_text(float(it->second.second))));
    else if (it->second.first > 0 && it->second.second > 0)
      out.scale_fits.push_back(layer);
  }
  out.evidence.push_back(
      {input.model.dir.string(), "calibrated amax implied by the shipped k/v scales (x 448)",
       fmt::format("largest {} at the scales in effect (the format saturates above {})",
                   float_text(float(worst)), float_text(limits.max_finite))});
}

// ---------------------------------------------------------------- published

std::string_view scale_kind(const engines::ResolvedKv& resolved) {
  switch (resolved.scale_source) {
    case engines::ScaleSource::unit_default:
      return "unit";
    case engines::ScaleSource::checkpoint:
    case engines::ScaleSource::quantization_param_path:
      return "calibrated";
    case engines::ScaleSource::calculated:
    case engines::ScaleSource::dynamic_by_design:
      return "dynamic";
    default:
      return "";
  }
}

struct Published {
  std::vector<const PublishedMeasurement*> rows;  // apply to this model, format and scales
  // Measured on a GPU or backend this launch is not known to use, or at a longer context:
  // reported, not decisive.
  std::vector<const PublishedMeasurement*> elsewhere;
  bool damaging = false;
};

Published published_for(const CheckInput& input, const engines::ResolvedKv& resolved) {
  Published out;
  if (!input.published) return out;
  const std::string_view kind = scale_kind(resolved);
  const std::string& backend = input.flags.attention_backend;
  const int64_t context = input.flags.context_length.value_or(input.model.max_position_embeddings);
  for (const auto& m : input.published->measurements) {
    if (m.kv_dtype != resolved.kv_cache_dtype) continue;
    if (m.scales != "any" && m.scales != kind) continue;
    const bool family =
        std::any_of(m.model_types.begin(), m.model_types.end(), [&](const std::string& glob) {
          return glob_match(glob, input.model.model_type) ||
                 (!input.model.outer_model_type.empty() &&
                  glob_match(glob, input.model.outer_model_type));
        });
    if (!family) continue;
    // A result that belongs to one GPU or backend: skipped where the launch runs elsewhere,
    // reported (not decisive) where kvaudit does not know where it runs.
    bool known_here = true;
    if (!m.only_gpu_arch.empty()) {
      if (input.flags.gpu_arch.empty())
        known_here = false;
      else if (!glob_match(m.only_gpu_arch, input.flags.gpu_arch))
        continue;
    }
    if (!m.only_backend.empty()) {
      if (backend.empty())
        known_here = false;
      else if (!glob_match(m.only_backend, backend))
        continue;
    }
    if (!known_here || (m.context_tokens > 0 && context > 0 && m.context_tokens > context)) {
      out.elsewhere.push_back(&m);
      continue;
    }
    out.rows.push_back(&m);
    const bool below =
        m.recovery && *m.recovery < input.published->recovery_threshold && !m.within_noise;
    out.damaging |= m.damage >= Damage::damaging || below;
  }
  return out;
}

std::string row_text(const PublishedMeasurement& m) {
  std::string numbers;
  if (m.baseline && m.quantized)
    numbers = fmt::format(" {} -> {}", float_text(*m.baseline), float_text(*m.quantized));
  if (m.recovery) numbers += fmt::format(" (recovery {:.0f}%)", *m.recovery * 100.0);
  std::string where = m.measured_on.empty() ? "" : ", " + m.measured_on;
  if (m.context_tokens) where += fmt::format(", {}K context", m.context_tokens / 1024);
  return fmt::format("{} {}{}{}: {}{} [{}]", fmt::join(m.models, "/"), m.metric, where, numbers,
                     damage_name(m.damage), m.within_noise ? " (within the source's noise)" : "",
                     m.cite);
}

// One measurement in a few words, for a sentence.
std::string row_brief(const PublishedMeasurement& m) {
  std::string result = m.recovery ? fmt::format("{:.0f}% kept", *m.recovery * 100.0)
                                  : std::string(damage_name(m.damage));
  if (m.within_noise) result += ", within the source's noise";
  return fmt::format("{}{} {} [{}]", m.models.front(),
                     m.context_tokens ? fmt::format(" at {}K", m.context_tokens / 1024) : "",
                     result, m.cite);
}

std::string scale_kind_text(std::string_view kind) {
  if (kind == "unit") return "scale 1.0";
  if (kind == "calibrated") return "calibrated scales";
  if (kind == "dynamic") return "dynamic scales";
  return "unknown scales";
}

// The published rows, each in a few words, for a sentence.
std::string briefs_text(const std::vector<const PublishedMeasurement*>& rows) {
  std::vector<std::string> parts;
  parts.reserve(rows.size());
  for (const auto* m : rows) parts.push_back(row_brief(*m));
  return fmt::format("{}", fmt::join(parts, "; "));
}

// The verdict when the checkpoint bounds nothing: what the published rows on the family say
// (taken on other checkpoints), else nothing known; both with why no bound applies.
void assess_without_bounds(const CheckInput& input, const engines::ResolvedKv& resolved,
                           const Bounds& bounds, const Published& published,
                           const std::string& published_text, const std::string& other_backend_text,
                           RangeAssessment& out) {
  std::string missing_bound;
  if (input.model.qk_norm == checkpoint::QkNorm::none)
    missing_bound = "this architecture has no key norm, so the checkpoint bounds nothing";
  else if (bounds.stand_in_norms)
    missing_bound =
        "the key-norm weights read are all zeros (a sparse stand-in), so they bound "
        "nothing";
  else if (!input.model.has_weights)
    missing_bound = "no safetensors were read, so no key-norm weights";
  else
    missing_bound =
        fmt::format("key-norm weights missing for layer(s) {}", layers_text(bounds.k_missing));
  if (!published.rows.empty()) {
    out.verdict = RangeVerdict::unknown;
    out.basis = "published";
    out.judged_on = fmt::format(
        "published measurements on this model family with a {} cache at {} keep at least "
        "{:.0f}% (the damage threshold [{}]): {}. They were taken on other checkpoints, and "
        "{}.{} To settle for this one: {}",
        resolved.kv_cache_dtype, scale_kind_text(scale_kind(resolved)),
        input.published->recovery_threshold * 100, input.published->threshold_cite, published_text,
        missing_bound, other_backend_text, settle_text(input));
    return;
  }
  out.verdict = RangeVerdict::unknown;
  out.basis = "none";
  out.judged_on = fmt::format(
      "nothing is known about this model's K/V range: {}, and nothing is published for this "
      "family with a {} cache at {}.{} To settle: {}",
      missing_bound, resolved.kv_cache_dtype, scale_kind_text(scale_kind(resolved)),
      other_backend_text, settle_text(input));
}

}  // namespace

RangeAssessment assess_kv_range(const CheckInput& input, const engines::ResolvedKv& resolved) {
  RangeAssessment out;
  if (!resolved.quantized) return out;
  const auto limits = limits_of(resolved.dtype);
  const bool static_scales =
      resolved.dtype && (resolved.dtype->scales == engines::ScaleSemantics::static_per_tensor);
  const std::map<int, LayerScale> scales = scales_in_effect(input, resolved);
  const Published published = published_for(input, resolved);
  for (const auto* m : published.rows)
    out.evidence.push_back({input.published->file, "published " + m->id, row_text(*m)});
  for (const auto* m : published.elsewhere)
    out.evidence.push_back({input.published->file,
                            "published " + m->id + " (another GPU, backend or context length)",
                            row_text(*m)});
  std::string published_text;
  if (!published.rows.empty()) published_text = briefs_text(published.rows);
  std::string other_backend_text;
  if (!published.elsewhere.empty())
    other_backend_text = fmt::format(
        " Not counted: {} measured on a GPU or backend this launch is not known to use, or at a "
        "longer context (pass --gpu and --attention-backend).",
        briefs_text(published.elsewhere));

  // 1. Measured maxima: the strongest evidence.
  if (limits && static_scales)
    if (auto measured = from_measured(input, *limits, scales)) {
      measured->evidence.insert(measured->evidence.end(), out.evidence.begin(), out.evidence.end());
      return *measured;
    }

  // 2. Bounds from the checkpoint.
  Bounds bounds;
  if (limits && static_scales) {
    bound_keys(input, *limits, scales, bounds);
    bound_from_shipped_scales(input, resolved, *limits, scales, bounds);
  }
  out.evidence.insert(out.evidence.begin(), bounds.evidence.begin(), bounds.evidence.end());
  const size_t quantized_layers = scales.size();
  if (!bounds.scale_clips.empty()) {
    out.verdict = RangeVerdict::damaging;
    out.basis = "bounded";
    out.judged_on = fmt::format(
        "the checkpoint's own calibrated scales imply maxima beyond the format's range at the "
        "scales in effect ({}): those values saturate",
        names_preview(bounds.scale_clips, 3));
    return out;
  }
  if (published.damaging) {
    out.verdict = RangeVerdict::damaging;
    out.basis = "published";
    out.judged_on = fmt::format(
        "damage published for this model family with a {} cache at {}, beyond the threshold "
        "(below {:.0f}% kept is damage [{}]): {}. Not measured on this checkpoint",
        resolved.kv_cache_dtype, scale_kind_text(scale_kind(resolved)),
        input.published->recovery_threshold * 100, input.published->threshold_cite, published_text);
    return out;
  }
  const bool keys_bounded = !bounds.k_fits.empty() && bounds.k_exceeds.empty() &&
                            bounds.k_missing.empty() && bounds.k_fits.size() == quantized_layers;
  // Shipped calibrated scales bound K and V of every layer they cover.
  const bool values_bounded = bounds.scale_fits.size() == quantized_layers && quantized_layers > 0;
  if (values_bounded) {
    out.verdict = RangeVerdict::safe;
    out.basis = "bounded";
    out.judged_on = fmt::format(
        "the checkpoint's own calibrated k/v scales (not in effect here) put every layer's |K| "
        "and |V| inside the format's range ({}) at the scales in effect: nothing saturates; "
        "values below {} still lose mantissa bits.{}",
        float_text(limits->max_finite), float_text(limits->min_normal), other_backend_text);
    return out;
  }
  if (!bounds.k_exceeds.empty()) {
    out.verdict = RangeVerdict::unknown;
    out.basis = "bounded";
    out.judged_on = fmt::format(
        "the key-norm weights allow keys up to {} at the scales in effect, beyond the format's "
        "largest value ({}) in {} layer(s) ({}): keys may saturate, the bound is not proof that "
        "they do. {}.{}",
        float_text(float(bounds.worst_k_bound)), float_text(limits->max_finite),
        bounds.k_exceeds.size(), names_preview(bounds.k_exceeds, 3),
        published_text.empty() ? "No damage published for this family"
                               : "Published on this family: " + published_text,
        other_backend_text);
    out.judged_on += " To settle: " + settle_text(input);
    return out;
  }
  if (keys_bounded && !published.rows.empty()) {
    out.verdict = RangeVerdict::safe;
    out.basis = "bounded + published";
    out.judged_on = fmt::format(
        "keys cannot exceed {} (key-norm bound, every quantized layer), inside the format's "
        "range ({}); values have no norm, but the published measurements on this family keep "
        "at least {:.0f}% (the damage threshold [{}]): {}.{}",
        float_text(float(bounds.worst_k_bound)), float_text(limits->max_finite),
        input.published->recovery_threshold * 100, input.published->threshold_cite, published_text,
        other_backend_text);
    return out;
  }
  if (keys_bounded) {
    out.verdict = RangeVerdict::unknown;
    out.basis = "bounded";
    out.judged_on = fmt::format(
        "keys cannot exceed {} (key-norm bound) inside the format's range ({}), but values "
        "have no norm and nothing bounds them here.{} To settle: {}",
        float_text(float(bounds.worst_k_bound)), float_text(limits->max_finite), other_backend_text,
        settle_text(input));
    return out;
  }
  // 3. Published damage on the family, no bound on this checkpoint.
  assess_without_bounds(input, resolved, bounds, published, published_text, other_backend_text,
                        out);
  return out;
}

}  // namespace kvaudit::audit
