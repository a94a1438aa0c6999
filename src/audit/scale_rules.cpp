// The check rules about KV scales: missing or dropped scales (the silent scale 1.0),
// placeholder and broken values, one-sided pairs, scales a dtype ignores by design,
// scale warnings that mislead, and ModelOpt's scale-less FP8 export.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "audit/internal.h"

namespace kvaudit::audit {

using checkpoint::ScaleRole;
using engines::ScaleSemantics;
using engines::ScaleSource;
using report::Evidence;
using report::Finding;
using report::Severity;

namespace {

std::string numeric_meaning(const engines::KvDtype* dtype) {
  auto limits = limits_of(dtype);
  if (!limits) return "at scale 1.0 the format's range is used as is, without calibration";
  return fmt::format(
      "at scale 1.0, |K|,|V| above {} saturate (CUDA kernels) or become {} from {} (PyTorch "
      "casts), values below {} lose mantissa bits (subnormal) and values at or below {} are "
      "stored as 0",
      float_text(limits->max_finite), limits->nan_not_inf ? "NaN" : "inf",
      float_text(limits->overflow_nan), float_text(limits->min_normal),
      float_text(limits->flush_to_zero));
}

// Attention layers stored in the quantized dtype (skip-layers excluded).
std::vector<int> quantized_layers(const Context& ctx) {
  std::vector<int> out;
  for (int layer : attention_layers(ctx.model()))
    if (std::find(ctx.resolved.skipped_layers.begin(), ctx.resolved.skipped_layers.end(), layer) ==
        ctx.resolved.skipped_layers.end())
      out.push_back(layer);
  return out;
}

bool static_scales(const Context& ctx) {
  return ctx.resolved.dtype && ctx.resolved.dtype->scales == ScaleSemantics::static_per_tensor;
}

bool is_modelopt(const checkpoint::ModelFacts& model) {
  return model.quant && (model.quant->method.rfind("modelopt", 0) == 0 ||
                         model.quant->producer.rfind("modelopt", 0) == 0);
}

}  // namespace

void rule_unit_scale(Context& ctx) {
  if (!ctx.resolved.quantized || !static_scales(ctx)) return;
  const auto& model = ctx.model();
  const std::vector<int> layers = quantized_layers(ctx);
  const engines::FallbackRule& fallback = *ctx.resolved.fallback;
  if (ctx.resolved.scale_source == ScaleSource::unknown) {
    Finding finding{
        "kv-scales-unverified",
        Severity::warning,
        fmt::format("{} KV cache with no scale source kvaudit can see: {} uses scale 1.0 unless "
                    "the checkpoint ships k/v scales this version loads",
                    ctx.resolved.kv_cache_dtype, ctx.engine_label()),
        "At scale 1.0 large keys clip and small values lose precision or flush to zero; nothing "
        "is logged per layer, and long-context recall suffers first.",
        {ctx.launch_evidence("kv_cache_dtype", "kv_cache_dtype", ctx.resolved.kv_cache_dtype),
         {ctx.launch_label(), "scale source", "not reported"},
         {ctx.data_file(), "fallback.both_missing",
          fmt::format("scale {:g} when the checkpoint's k/v scales are missing or not loaded",
                      fallback.both_missing_scale)}},
        "rerun with --checkpoint DIR (a copy of the served checkpoint) so kvaudit can see "
        "whether the scales exist and load; or serve with --kv-cache-dtype bf16",
        reference_text(fallback.provenance)};
    judge(ctx, Category::precision, finding);
    ctx.findings.push_back(std::move(finding));
    return;
  }
  if (ctx.resolved.scale_source == ScaleSource::unit_default) {
    std::vector<Evidence> evidence = {ctx.launch_evidence(
        "kv_cache_dtype", "resolved kv_cache_dtype", ctx.resolved.kv_cache_dtype)};
    if (model.has_weights && model.kv_scales.empty()) {
      // Name the tensors a ModelOpt export writes beside each K/V projection.
      std::vector<std::string> expected;
      for (const auto& weight : model.kv_projection_weights) {
        std::string name = weight.substr(0, weight.size() - std::string_view(".weight").size());
        expected.push_back(name + (name.ends_with("k_proj") ? ".k_scale" : ".v_scale"));
      }
      evidence.push_back({model.dir.string(),
                          fmt::format("k/v scale tensors among {} tensors in {} shard(s)",
                                      model.tensor_count, model.shard_files.size()),
                          "none"});
      if (!expected.empty())
        evidence.push_back({model.dir.string(),
                            fmt::format("missing ({} tensors, one per K/V projection of the {} "
                                        "attention layers)",
                                        expected.size(), attention_layers(model).size()),
                            names_preview(expected, 2)});
    } else if (model.has_weights) {
      evidence.push_back({model.dir.string(), "k/v scale tensors",
                          fmt::format("{} present, none loaded (see the scales-dropped finding)",
                                      model.kv_scales.size())});
    } else {
      evidence.push_back(
          {model.config_file, "safetensors", "not read (bare config): scales unknown"});
    }
    add_provenance(ctx, fallback.provenance, evidence);
    evidence.push_back(
        {ctx.data_file(), "fallback.both_missing",
         fmt::format(
             "k and v scale set to {}{}, {}", fallback.both_missing_scale,
             fallback.both_missing_scale == std::floor(fallback.both_missing_scale) ? ".0" : "",
             !fallback.both_missing_message.empty() && ctx.resolved.scale_warning_text
                 ? "logged"
                 : "no log line")});
    if (ctx.resolved.scale_warning_text) {
      evidence.push_back(
          {"server log",
           fmt::format("warning ({})", reference_text(ctx.resolved.scale_warning_provenance)),
           *ctx.resolved.scale_warning_text});
      add_provenance(ctx, ctx.resolved.scale_warning_provenance, evidence);
    }
    if (!ctx.resolved.skipped_layers.empty())
      evidence.push_back({ctx.launch_label(), "--kv-cache-dtype-skip-layers",
                          fmt::format("{} layer(s) stay in {}", ctx.resolved.skipped_layers.size(),
                                      ctx.resolved.model_dtype)});
    const UnitScaleText text = unit_scale_text(ctx.engine(), ctx.resolved.version,
                                               ctx.resolved.kv_cache_dtype, &ctx.input.model);
    Finding finding{"fp8-unit-scale",
                    Severity::critical,
                    fmt::format("{} KV cache with no usable scales: {} uses scale 1.0 for {}",
                                ctx.resolved.kv_cache_dtype, ctx.engine_label(),
                                ctx.resolved.skipped_layers.empty()
                                    ? std::string("every layer")
                                    : fmt::format("{} quantized layer(s)", layers.size())),
                    text.consequence,
                    evidence,
                    text.fix,
                    text.reference};
    judge(ctx, Category::precision, finding);
    ctx.findings.push_back(std::move(finding));
    return;
  }
  if (ctx.resolved.scale_source != ScaleSource::checkpoint) return;
  // Some quantized layers may still lack scales.
  std::set<std::string> loaded(ctx.resolved.loaded_scale_names.begin(),
                               ctx.resolved.loaded_scale_names.end());
  std::set<int> covered;
  for (const auto& scale : model.kv_scales)
    if (loaded.count(scale.name)) covered.insert(scale.layer);
  std::vector<std::string> missing;
  for (int layer : layers)
    if (!covered.count(layer)) missing.push_back(std::to_string(layer));
  if (missing.empty()) return;
  Finding partial{
      "fp8-partial-scales",
      Severity::critical,
      fmt::format("{} of {} attention layers have no loaded KV scale and run at scale 1.0",
                  missing.size(), layers.size()),
      fmt::format("Those layers lose precision silently: {}.", numeric_meaning(ctx.resolved.dtype)),
      {{model.dir.string(), "layers without k/v scales", names_preview(missing, 8)}},
      "export scales for every attention layer (kvaudit calibrate), or " + ctx.fix_flag("bf16"),
      reference_text(fallback.provenance)};
  judge(ctx, Category::precision, partial);
  ctx.findings.push_back(std::move(partial));
}

void rule_nvfp4_global_scale(Context& ctx) {
  const auto* dtype = ctx.resolved.dtype;
  if (!dtype || dtype->scales != ScaleSemantics::nvfp4_global) return;
  if (ctx.resolved.scale_source != ScaleSource::unit_default) return;
  Finding finding{
      "nvfp4-unit-global-scale",
      Severity::warning,
      fmt::format("{} KV cache without a calibrated global scale: {} uses 1.0", dtype->name,
                  ctx.engine_label()),
      "The E4M3 block scales are computed per 16 values, but relative to a global scale of 1.0 "
      "they run out of range: blocks whose largest value exceeds 2688 clip, and blocks below "
      "0.09 get subnormal block scales and lose precision.",
      {ctx.launch_evidence("kv_cache_dtype", "resolved kv_cache_dtype", dtype->name),
       {ctx.model().dir.string(), "k/v scale tensors loaded",
        std::to_string(ctx.resolved.loaded_scale_names.size())}},
      fmt::format("ship calibrated k/v scales (amax / (6 x 448)) or {}", ctx.fix_flag("bf16")),
      "vllm/utils/torch_utils.py nvfp4 layout; sglang fp4_kv_cache_quant_method.py "
      "NVFP4KVCacheMethod.load_scales_from_model (1.0 when missing)"};
  judge(ctx, Category::precision, finding);
  ctx.findings.push_back(std::move(finding));
}

// ModelOpt's default kv_fp8_cast recipe declares an FP8 KV cache and writes no scales.
void rule_modelopt_kv_cast(Context& ctx) {
  const auto& model = ctx.model();
  if (!model.has_weights || !model.kv_scales.empty() || !is_modelopt(model)) return;
  std::string algo = model.quant->kv_cache_quant_algo;
  std::transform(algo.begin(), algo.end(), algo.begin(), ::toupper);
  if (algo != "FP8") return;
  // A warning when this launch runs the declared FP8 cache; else a note for the day it does.
  const bool enabled = ctx.resolved.quantized;
  Finding finding{
      "modelopt-kv-fp8-cast",
      enabled ? Severity::warning : Severity::info,
      "The checkpoint declares an FP8 KV cache but ships no k/v scales: ModelOpt's default "
      "kv_fp8_cast recipe",
      enabled ? "kv_fp8_cast (now ModelOpt's default KV recipe) casts the cache to FP8 without "
                "calibrating it, so any engine that enables the declared FP8 cache runs it at "
                "scale 1.0."
              : fmt::format("kv_fp8_cast (now ModelOpt's default KV recipe) casts the cache to FP8 "
                            "without calibrating it; this launch keeps a {} cache, but any launch "
                            "that enables the declared FP8 cache runs it at scale 1.0.",
                            ctx.resolved.kv_cache_dtype),
      {{model.quant->source_file, model.quant->source_key + ".kv_cache_quant_algo",
        model.quant->kv_cache_quant_algo},
       {model.quant->source_file, "producer",
        model.quant->producer.empty() ? "modelopt" : model.quant->producer},
       {model.dir.string(), "k/v scale tensors", "none"}},
      engines::scales_ignored_for(ctx.engine(), ctx.resolved.version, model, "fp8_e4m3")
          ? fmt::format("serve with a 16-bit KV cache ({}); {}", ctx.fix_flag("bf16"),
                        ctx.keep_quantized_text("fp8_e4m3"))
          : std::string("serve with a 16-bit KV cache, or calibrate scales (kvaudit calibrate, "
                        "or ModelOpt's calibrated FP8 KV recipe) before enabling FP8"),
      "NVIDIA/Model-Optimizer KV cache recipes (kv_fp8_cast; constant-amax cast made the "
      "default by Model-Optimizer#1012, #1334)"};
  if (enabled) {
    judge_as_unit_scale(ctx, finding);
  }
  ctx.findings.push_back(std::move(finding));
}

void rule_dropped_scales(Context& ctx) {
  const ScaleSource source = ctx.resolved.scale_source;
  for (const auto& drop : ctx.resolved.dropped) {
    const bool matters = ctx.resolved.quantized && source != ScaleSource::calculated &&
                         source != ScaleSource::quantization_param_path &&
                         source != ScaleSource::dynamic_by_design;
    std::vector<Evidence> evidence = {
        {ctx.model().dir.string(), "tensors", names_preview(drop.tensor_names)},
        {ctx.model().config_file, "architectures[0]", ctx.model().architecture},
        {ctx.data_file(), "scale rule " + drop.rule_id, drop.reason}};
    add_provenance(ctx, drop.provenance, evidence);
    Finding finding{
        "scales-dropped",
        matters ? Severity::critical : Severity::info,
        fmt::format("{} KV scale tensor(s) are in the checkpoint but {} does not load them",
                    drop.tensor_names.size(), ctx.engine_label()),
        matters
            ? fmt::format("The scales were calibrated but the cache runs at scale 1.0 instead: {}.",
                          drop.reason)
            : fmt::format(
                  "No effect with a {} KV cache, but it bites as soon as FP8 is enabled: {}.",
                  ctx.resolved.kv_cache_dtype, drop.reason),
        evidence,
        matters ? fmt::format("{}; or use an engine version with the fix (check it with kvaudit "
                              "logs after launch)",
                              ctx.fix_flag("bf16"))
                : "none needed now",
        reference_text(drop.provenance)};
    if (matters) {
      finding.judged_on = engine_basis_text(drop.provenance);
      judge(ctx, Category::scales_not_as_shipped, finding);
    }
    ctx.findings.push_back(std::move(finding));
  }
}

void rule_scales_ignored(Context& ctx) {
  if (ctx.resolved.ignored_by_design.empty() || !ctx.resolved.dtype) return;
  ctx.findings.push_back(Finding{
      "scales-ignored-by-design",
      Severity::info,
      fmt::format("{} KV scale tensor(s) are not used: {} computes its own scales",
                  ctx.resolved.ignored_by_design.size(), ctx.resolved.kv_cache_dtype),
      fmt::format("{} ({}); the checkpoint's static scales are neither needed nor harmful.",
                  ctx.resolved.dtype->description,
                  engines::scale_semantics_name(ctx.resolved.dtype->scales)),
      {{ctx.model().dir.string(), "tensors", names_preview(ctx.resolved.ignored_by_design)}},
      "none",
      ""});
}

void rule_scale_values(Context& ctx) {
  if (ctx.model().kv_scales.empty() || ctx.resolved.scale_source == ScaleSource::dynamic_by_design)
    return;
  std::vector<std::string> invalid;
  bool all_unit = true;
  float smallest = INFINITY, largest = 0;
  std::string smallest_name, largest_name;
  for (const auto& scale : ctx.model().kv_scales) {
    for (float value : scale.values) {
      if (!(value > 0) || std::isinf(value)) {
        invalid.push_back(fmt::format("{} = {}", scale.name, float_text(value)));
        continue;
      }
      if (value != 1.0f) all_unit = false;
      if (value < smallest) smallest = value, smallest_name = scale.name;
      if (value > largest) largest = value, largest_name = scale.name;
    }
  }
  const engines::FallbackRule& fallback = *ctx.resolved.fallback;
  if (!invalid.empty()) {
    Finding finding{
        "scale-values-invalid",
        Severity::critical,
        fmt::format("{} KV scale value(s) are zero, negative, NaN or infinite", invalid.size()),
        fallback.zero == engines::ZeroScaleRule::missing
            ? "The engine treats non-positive scales as missing (scale 1.0, silently, or a "
              "start-up assertion when only one side is missing), and a NaN or inf scale turns "
              "every cached value into NaN/inf."
            : "A zero or NaN scale fails the engine's start-up assertion; an inf scale corrupts "
              "every cached value of its layer.",
        {{ctx.model().dir.string(), "scale values", names_preview(invalid)}},
        "re-export or recalibrate the scales (kvaudit calibrate); until then " +
            ctx.fix_flag("bf16"),
        reference_text(fallback.provenance)};
    finding.basis = "bounded";
    finding.judged_on = "the scale values the checkpoint ships, read by range; " +
                        engine_basis_text(fallback.provenance);
    judge(ctx, Category::scales_not_as_shipped, finding);
    ctx.findings.push_back(std::move(finding));
  }
  if (all_unit && invalid.empty()) {
    Finding finding{
        "scale-values-unit",
        Severity::warning,
        fmt::format("All {} KV scale tensors are exactly 1.0", ctx.model().kv_scales.size()),
        "Placeholder scales: the checkpoint looks calibrated but the cache behaves exactly as with "
        "no scales (clipping large keys, flushing small values).",
        {{ctx.model().dir.string(), "scale values", "1.0 everywhere"}},
        "calibrate real scales (kvaudit calibrate) or " + ctx.fix_flag("bf16"),
        "NVIDIA/Model-Optimizer#20 (exported scaling factors all 1.0)"};
    if (ctx.resolved.quantized) {
      judge_as_unit_scale(ctx, finding);
    }
    ctx.findings.push_back(std::move(finding));
  } else if (largest > 0 && smallest < INFINITY && largest / smallest > 1000.0f) {
    ctx.findings.push_back(Finding{
        "scale-values-inconsistent",
        Severity::warning,
        fmt::format("KV scales differ by {:.0f}x across layers", largest / smallest),
        "Scales that far apart usually mean a unit or export error in some layers (e.g. amax "
        "stored instead of amax/448).",
        {{ctx.model().dir.string(), smallest_name, float_text(smallest)},
         {ctx.model().dir.string(), largest_name, float_text(largest)}},
        "inspect the exporter's output; recalibrate with kvaudit calibrate",
        "llm-compressor#2853, #2117 (zero and wrong scales exported silently)"});
  }
}

void rule_one_sided(Context& ctx) {
  std::map<int, std::pair<int, int>> counts;  // layer -> (k, v)
  for (const auto& scale : ctx.model().kv_scales) {
    auto& entry = counts[scale.layer];
    if (scale.role != ScaleRole::v) ++entry.first;
    if (scale.role != ScaleRole::k) ++entry.second;
  }
  std::vector<std::string> k_only, v_only;
  for (const auto& [layer, kv] : counts) {
    if (kv.first && !kv.second) k_only.push_back(fmt::format("layer {} has only k_scale", layer));
    if (!kv.first && kv.second) v_only.push_back(fmt::format("layer {} has only v_scale", layer));
  }
  if (k_only.empty() && v_only.empty()) return;
  const engines::FallbackRule& fallback = *ctx.resolved.fallback;
  std::vector<std::string> all = k_only;
  all.insert(all.end(), v_only.begin(), v_only.end());
  std::string consequence =
      !k_only.empty() && fallback.k_only == engines::OneScaleRule::present_for_both
          ? "The engine uses the one present (the larger) for both K and V: V, usually far "
            "smaller than K, then loses precision or flushes to zero."
          : "The missing side runs at scale 1.0.";
  if (!v_only.empty() && fallback.v_only == engines::OneScaleRule::startup_error)
    consequence += fmt::format(
        " A lone v_scale fails the engine's start-up assertion ({}) as soon "
        "as the cache is quantized.",
        fallback.one_missing_error);
  else if (!v_only.empty())
    consequence += " With a lone v_scale the keys run at scale 1.0: no assertion stops it.";
  std::vector<Evidence> evidence = {{ctx.model().dir.string(), "scales", names_preview(all)}};
  add_provenance(ctx, fallback.provenance, evidence);
  Finding finding{"scale-one-sided",
                  Severity::warning,
                  fmt::format("{} layer(s) have only one of k_scale / v_scale", all.size()),
                  consequence,
                  evidence,
                  "export both k_scale and v_scale for every attention layer (kvaudit calibrate)",
                  reference_text(fallback.provenance)};
  // On a cache that uses them, the shipped scales are not applied as shipped.
  if (ctx.resolved.quantized && ctx.resolved.scale_source == ScaleSource::checkpoint) {
    finding.judged_on = engine_basis_text(fallback.provenance);
    judge(ctx, Category::scales_not_as_shipped, finding);
  }
  ctx.findings.push_back(std::move(finding));
}

void rule_param_path(Context& ctx) {
  if (ctx.flags().quantization_param_path.empty() || !ctx.resolved.quantized) return;
  for (const auto& rule : ctx.engine().param_path_rules) {
    if (rule.effect != engines::ParamPathRule::Effect::not_applied ||
        !rule.versions.contains(ctx.resolved.version))
      continue;
    std::vector<Evidence> evidence = {
        ctx.launch_evidence("quantization_param_path", "--quantization-param-path",
                            ctx.flags().quantization_param_path),
        {ctx.data_file(), "quantization_param_path." + rule.id,
         std::string(engines::rule_status_name(rule.provenance.status))}};
    add_provenance(ctx, rule.provenance, evidence);
    ctx.findings.push_back(
        Finding{"param-path-not-applied", Severity::warning,
                "Scales from --quantization-param-path may not be applied by this version",
                rule.reason + ".", evidence,
                "confirm after launch with kvaudit logs; prefer scales inside the checkpoint",
                reference_text(rule.provenance)});
    return;
  }
}

void rule_misleading_warning(Context& ctx) {
  if (!ctx.resolved.scale_warning_text || ctx.resolved.scale_source == ScaleSource::unit_default)
    return;
  std::vector<Evidence> evidence = {{ctx.data_file(),
                                     "scale_warnings." + ctx.resolved.scale_warning_id,
                                     *ctx.resolved.scale_warning_text}};
  add_provenance(ctx, ctx.resolved.scale_warning_provenance, evidence);
  ctx.findings.push_back(Finding{
      "scale-warning-false-alarm", Severity::info,
      "The engine will log a scale-1.0 warning that does not apply here",
      fmt::format("'{}' is {}; here the checkpoint's per-layer scales do load.",
                  *ctx.resolved.scale_warning_text, ctx.resolved.scale_warning_meaning),
      evidence, "none: verify with kvaudit logs instead of grepping for the warning",
      reference_text(ctx.resolved.scale_warning_provenance) + "; sgl-project/sglang#31224"});
}

UnitScaleText unit_scale_text(const engines::EngineModel& engine, const engines::Version& version,
                              const std::string& kv_cache_dtype,
                              const checkpoint::ModelFacts* model) {
  UnitScaleText out;
  out.consequence = fmt::format("Silent precision loss that grows with context: {}.",
                                numeric_meaning(engine.dtypes->find(kv_cache_dtype)));
  const engines::ScaleNameRule* ignored =
      model ? engines::scales_ignored_for(engine, version, *model, kv_cache_dtype) : nullptr;
  const engines::KvDtypeFix sixteen_fix = engines::kv_dtype_fix(engine, version, "bf16");
  const std::string& sixteen = sixteen_fix.text;
  out.fix = ignored
                ? fmt::format(
                      "{} (twice the KV bytes per token: the decision table, with --gpu or "
                      "--from-log, gives the tokens and concurrency left). Calibrating is no "
                      "fix here: {} never uses checkpoint scales for {} ({})",
                      sixteen, engine.engine, kv_cache_dtype, ignored->id)
                : fmt::format(
                      "{} (twice the KV bytes per token: the decision table, with --gpu or "
                      "--from-log, gives the tokens and concurrency left), or calibrate scales the "
                      "engine loads: kvaudit calibrate --model DIR --engine {} --format {}",
                      sixteen, engine.engine, kv_cache_dtype);
  out.reference = reference_text(engine.fallback_for(version).provenance);
  if (sixteen_fix.overlay && !sixteen_fix.reference.empty())
    out.reference += "; the 16-bit overlay: " + sixteen_fix.reference;
  if (ignored) out.reference += "; " + reference_text(ignored->provenance);
  return out;
}

}  // namespace kvaudit::audit
