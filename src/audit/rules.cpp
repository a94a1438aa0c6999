// The check rules. Each is a small function that appends findings; engine
// specifics (messages, references, fallback semantics) come from the engine data.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "audit/audit.h"
#include "numerics/numerics.h"

namespace kvaudit::audit {

namespace {

using checkpoint::LayerKind;
using checkpoint::ModelFacts;
using checkpoint::ScaleRole;
using checkpoint::ScaleTensor;
using engines::ResolvedKv;
using nlohmann::json;
using report::Evidence;
using report::Finding;
using report::Severity;

struct Context {
  const CheckInput& input;
  const ResolvedKv& resolved;
  std::vector<Finding>& findings;
  const ModelFacts& model() const { return input.model; }
  const engines::LaunchFlags& flags() const { return input.flags; }
  const json& data() const { return input.engine.document; }
  std::string engine_label() const {
    return fmt::format("{} {}", input.engine.engine,
                       input.version_given
                           ? input.flags.engine_version
                           : "(latest known: " + input.engine.latest_known_version + ")");
  }
  std::string launch_label() const { return flags().source.empty() ? "launch" : flags().source; }
};

// What a format does to values at a given scale: thresholds in real units.
struct FormatLimits {
  float max_finite;     // saturates here (CUDA __NV_SATFINITE)
  float overflow_nan;   // torch cast: NaN (E4M3) or inf (E5M2) from here
  float min_normal;     // below: subnormal, fewer mantissa bits
  float flush_to_zero;  // at or below: stored as 0
  int mantissa_bits;
};

std::optional<FormatLimits> limits_of(const std::string& dtype) {
  if (dtype == "fp8_e4m3")
    return FormatLimits{numerics::fp8_e4m3_to_float(0x7E), 480.0f,
                        numerics::fp8_e4m3_to_float(0x08), numerics::fp8_e4m3_to_float(0x01) / 2,
                        3};
  if (dtype == "fp8_e5m2")
    return FormatLimits{numerics::fp8_e5m2_to_float(0x7B), 61440.0f,
                        numerics::fp8_e5m2_to_float(0x04), numerics::fp8_e5m2_to_float(0x01) / 2,
                        2};
  return std::nullopt;
}

std::string float_text(float value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  return fmt::format("{:g}", value);
}

std::string names_preview(const std::vector<std::string>& names, size_t shown = 3) {
  std::string text;
  for (size_t i = 0; i < names.size() && i < shown; ++i) text += (i ? ", " : "") + names[i];
  if (names.size() > shown) text += fmt::format(" (+{} more)", names.size() - shown);
  return text;
}

std::string fix_flag(const Context& /*ctx*/, const std::string& value) {
  return fmt::format("launch with --kv-cache-dtype {}", value);
}

std::string quant_evidence_key(const ModelFacts& model) {
  if (!model.quant) return "";
  if (!model.quant->kv_algo_key.empty())
    return model.quant->source_key + "." + model.quant->kv_algo_key;
  return model.quant->source_key + ".kv_cache_scheme";
}

std::vector<int> attention_layers(const ModelFacts& model) {
  std::vector<int> indices;
  for (const auto& layer : model.layers)
    if (layer.kind != LayerKind::linear_attention) indices.push_back(layer.index);
  return indices;
}

void rule_dtype_rejected(Context& ctx) {
  auto choices = engines::kv_cache_dtype_choices(ctx.input.engine, ctx.resolved.version);
  if (choices.empty() ||
      std::find(choices.begin(), choices.end(), ctx.flags().kv_cache_dtype) != choices.end())
    return;
  ctx.findings.push_back(
      Finding{"kv-dtype-rejected",
              Severity::critical,
              fmt::format("{} does not accept --kv-cache-dtype {}", ctx.engine_label(),
                          ctx.flags().kv_cache_dtype),
              "The server will refuse to start with this value.",
              {{ctx.launch_label(), "--kv-cache-dtype", ctx.flags().kv_cache_dtype},
               {ctx.input.engine.file.string(), "kv_cache_dtype_choices",
                fmt::format("{}", fmt::join(choices, ", "))}},
              fmt::format("use one of: {}", fmt::join(choices, ", ")),
              "server_args / CacheConfig --kv-cache-dtype choices"});
}

void rule_auto_quantized(Context& ctx) {
  const ModelFacts& model = ctx.model();
  if (!model.quant) return;
  bool declares = !model.quant->kv_cache_quant_algo.empty() || model.quant->has_kv_cache_scheme;
  if (!declares) return;
  std::string declared = !model.quant->kv_cache_quant_algo.empty()
                             ? model.quant->kv_cache_quant_algo
                             : model.quant->kv_cache_scheme.dump();
  bool auto_chose = ctx.resolved.rule_id != "explicit" &&
                    ctx.resolved.rule_id.find("model-dtype") == std::string::npos;
  if (ctx.resolved.quantized && auto_chose) {
    bool overrides_cli = ctx.resolved.requested != "auto";
    // Forced to what the launch asked for anyway: nothing is overridden, nothing to report.
    if (overrides_cli && ctx.resolved.requested == ctx.resolved.kv_cache_dtype) return;
    ctx.findings.push_back(Finding{
        overrides_cli ? "kv-quant-overrides-cli" : "kv-auto-quantized",
        overrides_cli ? Severity::critical : Severity::warning,
        overrides_cli ? fmt::format("{} ignores --kv-cache-dtype {} and stores the KV cache as {}",
                                    ctx.engine_label(), ctx.flags().kv_cache_dtype,
                                    ctx.resolved.kv_cache_dtype)
                      : fmt::format("The checkpoint declares a {} KV cache; {} enables it under "
                                    "--kv-cache-dtype auto ({})",
                                    declared, ctx.engine_label(), ctx.resolved.kv_cache_dtype),
        fmt::format("The KV cache is quantized to {} without anyone asking for it; accuracy then "
                    "depends entirely on the KV scales (see the scale findings).",
                    ctx.resolved.kv_cache_dtype),
        {{model.quant->source_file, quant_evidence_key(model), declared},
         {ctx.launch_label(), "--kv-cache-dtype",
          ctx.flags().kv_cache_dtype_flag.empty() ? "auto (default)" : ctx.flags().kv_cache_dtype},
         {ctx.input.engine.file.string(), "auto_resolution." + ctx.resolved.rule_id,
          ctx.resolved.reason}},
        fmt::format(
            "decide explicitly: {} for full precision, or keep {} only with calibrated scales "
            "(kvaudit calibrate)",
            fix_flag(ctx, "bf16"), ctx.resolved.kv_cache_dtype),
        ctx.resolved.rule_reference});
  } else if (!ctx.resolved.quantized && ctx.resolved.requested == "auto") {
    ctx.findings.push_back(Finding{
        "kv-declared-not-enabled",
        Severity::info,
        fmt::format("The checkpoint declares a {} KV cache but {} keeps it in {} under auto",
                    declared, ctx.engine_label(), ctx.resolved.kv_cache_dtype),
        "No accuracy risk from the KV cache; the declared format (and its capacity gain) is "
        "unused.",
        {{model.quant->source_file, quant_evidence_key(model), declared}},
        "nothing to fix for accuracy; pass the quantized --kv-cache-dtype explicitly only with "
        "calibrated scales",
        ctx.resolved.rule_reference});
  }
}

// Per attention layer: the k and v values the engine will end up with.
struct LayerScales {
  std::vector<const ScaleTensor*> k, v;
};

std::map<int, LayerScales> loaded_scales_by_layer(const Context& ctx) {
  std::set<std::string> loaded(ctx.resolved.loaded_scale_names.begin(),
                               ctx.resolved.loaded_scale_names.end());
  std::map<int, LayerScales> by_layer;
  for (const auto& scale : ctx.model().kv_scales) {
    if (!loaded.count(scale.name)) continue;
    auto& entry = by_layer[scale.layer];
    if (scale.role != ScaleRole::v) entry.k.push_back(&scale);
    if (scale.role != ScaleRole::k) entry.v.push_back(&scale);
  }
  return by_layer;
}

void rule_unit_scale(Context& ctx) {
  if (!ctx.resolved.quantized) return;
  const ModelFacts& model = ctx.model();
  auto limits = limits_of(ctx.resolved.kv_cache_dtype);
  std::string numeric_meaning =
      limits ? fmt::format(
                   "at scale 1.0, |K|,|V| above {} saturate (CUDA kernels) or become {} from {} "
                   "(PyTorch casts), values below {} lose mantissa bits (subnormal) and values at "
                   "or below {} are stored as 0",
                   float_text(limits->max_finite),
                   ctx.resolved.kv_cache_dtype == "fp8_e4m3" ? "NaN" : "inf",
                   float_text(limits->overflow_nan), float_text(limits->min_normal),
                   float_text(limits->flush_to_zero))
             : "at scale 1.0 the format's range is used as is, without calibration";
  std::vector<int> attention = attention_layers(model);
  if (ctx.resolved.scale_source == "unit_default") {
    std::vector<Evidence> evidence;
    evidence.push_back(
        {ctx.launch_label(), "resolved kv_cache_dtype", ctx.resolved.kv_cache_dtype});
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
                                        expected.size(), attention.size()),
                            names_preview(expected, 2)});
    } else if (model.has_weights) {
      evidence.push_back({model.dir.string(), "k/v scale tensors",
                          fmt::format("{} present, none loaded (see the scales-dropped finding)",
                                      model.kv_scales.size())});
    } else
      evidence.push_back(
          {model.config_file, "safetensors", "not read (bare config): scales unknown"});
    const json& fallback = ctx.data()["fallback"];
    bool logged = fallback.value("both_missing", json::object()).value("logged", false);
    evidence.push_back({ctx.input.engine.file.string(), "fallback.both_missing",
                        fmt::format("scale 1.0, {}", logged ? "logged" : "not logged")});
    if (ctx.resolved.scale_warning_logged)
      evidence.push_back({"server log", "warning", ctx.resolved.scale_warning_text});
    ctx.findings.push_back(Finding{
        "fp8-unit-scale", Severity::critical,
        fmt::format("{} KV cache with no usable scales: {} uses scale 1.0 for every layer",
                    ctx.resolved.kv_cache_dtype, ctx.engine_label()),
        fmt::format("Silent precision loss that grows with context: {}.", numeric_meaning),
        evidence,
        fmt::format("{} (2x KV memory), or calibrate scales the engine loads: kvaudit calibrate "
                    "--model DIR --engine {} --format {}",
                    fix_flag(ctx, "bf16"), ctx.input.engine.engine, ctx.resolved.kv_cache_dtype),
        fallback.value("reference", "")});
    return;
  }
  if (ctx.resolved.scale_source != "checkpoint") return;
  // Some attention layers may still lack scales.
  auto by_layer = loaded_scales_by_layer(ctx);
  std::vector<std::string> missing;
  for (int layer : attention)
    if (!by_layer.count(layer)) missing.push_back(std::to_string(layer));
  if (missing.empty()) return;
  ctx.findings.push_back(Finding{
      "fp8-partial-scales",
      Severity::critical,
      fmt::format("{} of {} attention layers have no loaded KV scale and run at scale 1.0",
                  missing.size(), attention.size()),
      fmt::format("Those layers lose precision silently: {}.", numeric_meaning),
      {{model.dir.string(), "layers without k/v scales", names_preview(missing, 8)}},
      "export scales for every attention layer (kvaudit calibrate), or " + fix_flag(ctx, "bf16"),
      ctx.data()["fallback"].value("reference", "")});
}

void rule_dropped_scales(Context& ctx) {
  for (const auto& drop : ctx.resolved.dropped) {
    bool matters = ctx.resolved.quantized && ctx.resolved.scale_source != "dynamic" &&
                   ctx.resolved.scale_source != "quantization_param_path";
    ctx.findings.push_back(Finding{
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
        {{ctx.model().dir.string(), "tensors", names_preview(drop.tensor_names)},
         {ctx.model().config_file, "architectures[0]", ctx.model().architecture},
         {ctx.input.engine.file.string(), "scale_loading." + drop.rule_id,
          drop.status.empty() ? "applies to this version" : drop.status}},
        matters ? fmt::format("{}; or use an engine version with the fix (check it with kvaudit "
                              "logs after launch)",
                              fix_flag(ctx, "bf16"))
                : "none needed now",
        drop.reference.empty()
            ? "vllm/model_executor/model_loader/weight_utils.py maybe_remap_kv_scale_name"
            : drop.reference});
  }
}

void rule_scale_values(Context& ctx) {
  if (ctx.model().kv_scales.empty()) return;
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
  const json& fallback = ctx.data()["fallback"];
  if (!invalid.empty()) {
    bool missing_semantics = fallback.value("non_positive_is_missing", false);
    ctx.findings.push_back(Finding{
        "scale-values-invalid",
        Severity::critical,
        fmt::format("{} KV scale value(s) are zero, negative, NaN or infinite", invalid.size()),
        missing_semantics
            ? "The engine treats non-positive scales as missing (scale 1.0, silently) and a NaN or "
              "inf scale turns every cached value into NaN/inf."
            : "Such a scale corrupts every cached value of its layer.",
        {{ctx.model().dir.string(), "scale values", names_preview(invalid)}},
        "re-export or recalibrate the scales (kvaudit calibrate); until then " +
            fix_flag(ctx, "bf16"),
        fallback.value("reference", "")});
  }
  if (all_unit && invalid.empty()) {
    ctx.findings.push_back(Finding{
        "scale-values-unit",
        Severity::warning,
        fmt::format("All {} KV scale tensors are exactly 1.0", ctx.model().kv_scales.size()),
        "Placeholder scales: the checkpoint looks calibrated but the cache behaves exactly as with "
        "no scales (clipping large keys, flushing small values).",
        {{ctx.model().dir.string(), "scale values", "1.0 everywhere"}},
        "calibrate real scales (kvaudit calibrate) or " + fix_flag(ctx, "bf16"),
        "ENGINE-FACTS §3"});
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
        "ENGINE-FACTS §3"});
  }
}

void rule_one_sided(Context& ctx) {
  std::map<int, std::pair<int, int>> counts;  // layer -> (k, v)
  for (const auto& scale : ctx.model().kv_scales) {
    auto& entry = counts[scale.layer];
    if (scale.role != ScaleRole::v) ++entry.first;
    if (scale.role != ScaleRole::k) ++entry.second;
  }
  std::vector<std::string> one_sided;
  for (const auto& [layer, kv] : counts)
    if ((kv.first == 0) != (kv.second == 0))
      one_sided.push_back(
          fmt::format("layer {} has only {}", layer, kv.first ? "k_scale" : "v_scale"));
  if (one_sided.empty()) return;
  std::string semantics = ctx.data()["fallback"].value("one_missing", "");
  ctx.findings.push_back(Finding{
      "scale-one-sided",
      Severity::warning,
      fmt::format("{} layer(s) have only one of k_scale / v_scale", one_sided.size()),
      semantics == "max_of_present"
          ? "The engine uses the one present (the larger) for both K and V: V, usually far smaller "
            "than K, then loses precision or flushes to zero."
          : "The missing side falls back to scale 1.0.",
      {{ctx.model().dir.string(), "scales", names_preview(one_sided)}},
      "export both k_scale and v_scale for every attention layer (kvaudit calibrate)",
      ctx.data()["fallback"].value("reference", "")});
}

void rule_per_head(Context& ctx) {
  std::vector<std::string> vectors;
  for (const auto& scale : ctx.model().kv_scales)
    if (scale.values.size() > 1)
      vectors.push_back(fmt::format("{} [{}]", scale.name, scale.values.size()));
  if (vectors.empty() || !ctx.resolved.quantized) return;
  const json& fallback = ctx.data()["fallback"];
  if (fallback.value("non_scalar", "") != "startup_error") return;
  ctx.findings.push_back(Finding{
      "scale-per-head-unsupported",
      Severity::critical,
      fmt::format("{} KV scale tensor(s) are per-head vectors; {} supports per-tensor scales only",
                  vectors.size(), ctx.engine_label()),
      fmt::format("The server fails at load time ('{}') instead of serving.",
                  fallback.value("non_scalar_message", "")),
      {{ctx.model().dir.string(), "non-scalar scales", names_preview(vectors)}},
      "reduce to per-tensor scales (max over heads: kvaudit calibrate --granularity tensor), or "
      "serve with vLLM, which accepts per-head scales",
      fallback.value("reference", "")});
}

void rule_e5m2(Context& ctx) {
  if (ctx.resolved.kv_cache_dtype != "fp8_e5m2") return;
  ctx.findings.push_back(Finding{
      "fp8-e5m2",
      Severity::warning,
      "FP8 E5M2 KV cache: 2 mantissa bits",
      "Every cached value carries up to 12.5% relative rounding error (E4M3: 6.25%); the range is "
      "wide, so nothing clips, but precision is lost everywhere.",
      {{ctx.launch_label(), "--kv-cache-dtype", ctx.flags().kv_cache_dtype}},
      fmt::format("prefer fp8_e4m3 with calibrated scales, or {}", fix_flag(ctx, "bf16")),
      "ENGINE-FACTS §1"});
}

int dtype_rank(const std::string& dtype) {
  if (dtype == "float32" || dtype == "fp32") return 32;
  if (dtype == "bfloat16" || dtype == "bf16" || dtype == "float16" || dtype == "fp16") return 16;
  return 0;
}

void rule_hybrid_state(Context& ctx) {
  const auto& linear = ctx.model().linear_attention;
  if (!linear || linear->ssm_dtype.empty()) return;
  const json hybrid = ctx.data().value("hybrid_state", json::object());
  std::string used = ctx.flags().mamba_ssm_dtype;
  std::string origin = "launch flag " + hybrid.value("flag", std::string("--mamba-ssm-dtype"));
  if (used.empty()) {
    used = hybrid.value("default", "");
    origin = "engine default";
    if (used == "auto") return;  // follows the config
  }
  if (used.empty() || dtype_rank(used) == 0 || dtype_rank(used) >= dtype_rank(linear->ssm_dtype))
    return;
  ctx.findings.push_back(Finding{
      "hybrid-state-precision",
      Severity::warning,
      fmt::format("Linear-attention (GDN/Mamba) state kept in {} but the config asks for {}", used,
                  linear->ssm_dtype),
      "The recurrent state accumulates over the whole context; rounding it every token compounds "
      "into drift on long inputs.",
      {{ctx.model().config_file, "mamba_ssm_dtype", linear->ssm_dtype},
       {ctx.launch_label(), origin, used}},
      fmt::format("launch with {} {}", hybrid.value("flag", "--mamba-ssm-dtype"),
                  linear->ssm_dtype),
      hybrid.value("reference", "")});
}

void rule_fp16_serving(Context& ctx) {
  std::string trained = ctx.model().torch_dtype;
  if (trained != "bfloat16") return;
  std::string served = ctx.flags().dtype;
  bool fp16_weights = served == "float16" || served == "half" || served == "fp16";
  bool fp16_cache = ctx.resolved.kv_cache_dtype == "fp16";
  if (!fp16_weights && !fp16_cache) return;
  ctx.findings.push_back(Finding{
      "fp16-serving-bf16-model",
      Severity::warning,
      fmt::format("A bfloat16-trained model is served with {} in float16",
                  fp16_weights ? "activations" : "the KV cache"),
      "float16 tops out at 65504: activations and keys that bfloat16 holds easily overflow to inf "
      "and turn outputs into NaN or garbage.",
      {{ctx.model().config_file, "torch_dtype", trained},
       {ctx.launch_label(), fp16_weights ? "--dtype" : "--kv-cache-dtype",
        fp16_weights ? served : ctx.flags().kv_cache_dtype}},
      "serve with --dtype bfloat16 (and a bf16 KV cache)",
      "ENGINE-FACTS §1"});
}

void rule_context_length(Context& ctx) {
  const auto& context = ctx.flags().context_length;
  int64_t max_positions = ctx.model().max_position_embeddings;
  if (!context || max_positions <= 0 || *context <= max_positions) return;
  if (!ctx.model().rope_scaling.is_null()) return;
  ctx.findings.push_back(Finding{
      "context-beyond-max-position",
      Severity::critical,
      fmt::format("Context length {} exceeds max_position_embeddings {} with no rope scaling",
                  *context, max_positions),
      "Positions past the trained range get rotary angles the model never saw: quality collapses "
      "beyond that point with no error.",
      {{ctx.launch_label(), "context length", std::to_string(*context)},
       {ctx.model().config_file, "max_position_embeddings", std::to_string(max_positions)},
       {ctx.model().config_file, "rope_scaling", "absent"}},
      fmt::format(
          "keep the context at or below {}, or configure rope scaling (e.g. yarn) the model "
          "was validated with",
          max_positions),
      "config.json max_position_embeddings / rope_scaling"});
}

void rule_dynamic_disabled(Context& ctx) {
  if (!ctx.flags().calculate_kv_scales || !ctx.model().linear_attention) return;
  const json dynamic = ctx.data().value("dynamic_scales", json::object());
  if (!dynamic.value("disabled_for_hybrid", false)) return;
  ctx.findings.push_back(Finding{
      "dynamic-scales-disabled",
      Severity::warning,
      "--calculate-kv-scales is ignored for this hybrid (linear-attention) model",
      "The engine logs 'Disabling calculate_kv_scales for hybrid model' and falls back to the "
      "checkpoint scales or 1.0.",
      {{ctx.launch_label(), "--calculate-kv-scales", "set"},
       {ctx.model().config_file, "model_type", ctx.model().model_type}},
      "provide calibrated scales in the checkpoint (kvaudit calibrate) or use a bf16 KV cache",
      dynamic.value("reference", "")});
}

void rule_param_path(Context& ctx) {
  const json info = ctx.data().value("quantization_param_path", json::object());
  if (ctx.flags().quantization_param_path.empty() || info.empty() || !ctx.resolved.quantized)
    return;
  if (!engines::version_in_range(ctx.resolved.version, info.value("broken_versions", ""))) return;
  ctx.findings.push_back(Finding{
      "param-path-not-applied",
      Severity::warning,
      "Scales from --quantization-param-path may not be applied by this version",
      info.value("reason", "") + ".",
      {{ctx.launch_label(), "--quantization-param-path", ctx.flags().quantization_param_path},
       {ctx.input.engine.file.string(), "quantization_param_path.status",
        info.value("status", "")}},
      "confirm after launch with kvaudit logs; prefer scales inside the checkpoint",
      info.value("reference", "")});
}

void rule_misleading_warning(Context& ctx) {
  if (!ctx.resolved.scale_warning_logged || ctx.resolved.scale_source == "unit_default") return;
  ctx.findings.push_back(Finding{
      "scale-warning-false-alarm",
      Severity::info,
      "The engine will log a scale-1.0 warning that does not apply here",
      fmt::format(
          "'{}' is printed because --quantization-param-path is unset, yet the checkpoint's "
          "per-layer scales do load.",
          ctx.resolved.scale_warning_text),
      {{ctx.input.engine.file.string(), "warnings", ctx.resolved.scale_warning_text}},
      "none: verify with kvaudit logs instead of grepping for the warning",
      "sgl-project/sglang#31224"});
}

void rule_unknown_architecture(Context& ctx) {
  if (ctx.model().architecture_known) return;
  ctx.findings.push_back(Finding{
      "unknown-architecture",
      Severity::warning,
      fmt::format("Unknown architecture '{}' ({})", ctx.model().model_type,
                  ctx.model().architecture),
      "Layer kinds (sliding window, linear attention, MLA) are guessed as plain attention, so "
      "capacity and per-layer scale checks may be off; dtype and scale checks still apply.",
      {{ctx.model().config_file, "model_type", ctx.model().model_type}},
      "none; report the architecture so kvaudit can learn it",
      ""});
}

void rule_version_assumed(Context& ctx) {
  if (ctx.input.version_given) return;
  ctx.findings.push_back(
      Finding{"engine-version-assumed",
              Severity::info,
              fmt::format("No --engine-version: judged against the latest known {} behaviour ({})",
                          ctx.input.engine.engine, ctx.input.engine.latest_known_version),
              "Older releases may resolve dtypes or load scales differently.",
              {{ctx.input.engine.file.string(), "latest_known_version",
                ctx.input.engine.latest_known_version}},
              "pass --engine-version with the version you deploy",
              ""});
}

using Rule = void (*)(Context&);
struct NamedRule {
  const char* id;
  Rule rule;
};
const NamedRule kRules[] = {
    {"kv-dtype-rejected", rule_dtype_rejected},
    {"kv-auto-quantized", rule_auto_quantized},
    {"fp8-unit-scale", rule_unit_scale},
    {"scales-dropped", rule_dropped_scales},
    {"scale-values-invalid", rule_scale_values},
    {"scale-one-sided", rule_one_sided},
    {"scale-per-head-unsupported", rule_per_head},
    {"fp8-e5m2", rule_e5m2},
    {"hybrid-state-precision", rule_hybrid_state},
    {"fp16-serving-bf16-model", rule_fp16_serving},
    {"context-beyond-max-position", rule_context_length},
    {"dynamic-scales-disabled", rule_dynamic_disabled},
    {"param-path-not-applied", rule_param_path},
    {"scale-warning-false-alarm", rule_misleading_warning},
    {"unknown-architecture", rule_unknown_architecture},
    {"engine-version-assumed", rule_version_assumed},
};

}  // namespace

std::vector<std::string> rule_ids() {
  std::vector<std::string> ids;
  for (const auto& rule : kRules) ids.emplace_back(rule.id);
  return ids;
}

CheckResult run_check(const CheckInput& input) {
  CheckResult result;
  result.resolved = engines::resolve_kv(input.model, input.flags, input.engine);
  Context ctx{input, result.resolved, result.findings};
  for (const auto& rule : kRules) rule.rule(ctx);
  std::stable_sort(result.findings.begin(), result.findings.end(),
                   [](const Finding& a, const Finding& b) { return a.severity > b.severity; });
  return result;
}

bool fails_gate(const std::vector<Finding>& findings, FailOn fail_on) {
  if (fail_on == FailOn::never) return false;
  Severity gate = fail_on == FailOn::critical ? Severity::critical : Severity::warning;
  return std::any_of(findings.begin(), findings.end(),
                     [&](const Finding& finding) { return finding.severity >= gate; });
}

}  // namespace kvaudit::audit
