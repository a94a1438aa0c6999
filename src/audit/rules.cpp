// The check rules about the dtype and the launch, and the rule table. Each rule is a
// small function that appends findings; what the engine does comes from the engine
// model (the resolution and its rules), never from an engine-name branch.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "audit/internal.h"
#include "numerics/numerics.h"

namespace kvaudit::audit {

using checkpoint::LayerKind;
using engines::ResolvedKv;
using report::Evidence;
using report::Finding;
using report::Severity;

// ---------------------------------------------------------------- dtype and launch

void rule_startup_failures(Context& ctx) {
  for (const auto& failure : ctx.resolved.startup_failures) {
    const bool rejected = failure.id == "kv-dtype-rejected";
    const bool non_scalar = failure.id == "scale-non-scalar";
    std::vector<Evidence> evidence = {{ctx.launch_label(), "cause", failure.cause},
                                      {ctx.data_file(), "engine error", failure.message}};
    add_provenance(ctx, failure.provenance, evidence);
    std::string fix =
        rejected     ? fmt::format("use one of: {}", fmt::join(engines::kv_cache_dtype_choices(
                                                                   ctx.engine(), ctx.resolved.version),
                                                               ", "))
        : non_scalar ? "reduce to per-tensor scales (max over heads: kvaudit calibrate "
                       "--granularity tensor), or use an engine version that accepts "
                       "per-head scales"
                     : "change the launch (or the checkpoint) as the cause says, or use an "
                       "engine version without this failure";
    Finding finding{
        rejected     ? "kv-dtype-rejected"
        : non_scalar ? "scale-per-head-unsupported"
                     : "startup-failure",
        Severity::critical,
        fmt::format("{} will not start: {}", ctx.engine_label(), failure.cause),
        fmt::format("The server stops during start-up ({}) instead of serving.", failure.message),
        evidence,
        fix,
        reference_text(failure.provenance)};
    finding.judged_on = engine_basis_text(failure.provenance);
    judge(ctx, Category::broken, finding);
    ctx.findings.push_back(std::move(finding));
  }
}

void rule_auto_quantized(Context& ctx) {
  const auto& model = ctx.model();
  if (!model.quant) return;
  const bool declares =
      !model.quant->kv_cache_quant_algo.empty() || model.quant->has_kv_cache_scheme;
  if (!declares) return;
  const std::string declared = !model.quant->kv_cache_quant_algo.empty()
                                   ? model.quant->kv_cache_quant_algo
                                   : model.quant->kv_cache_scheme.dump();
  const std::string key =
      model.quant->source_key + "." +
      (model.quant->kv_algo_key.empty() ? "kv_cache_scheme" : model.quant->kv_algo_key);
  const ResolvedKv& r = ctx.resolved;
  const bool auto_chose = r.rule_id != "explicit" && r.rule_id != "auto-model-dtype" &&
                          r.kv_cache_dtype != r.model_dtype;
  std::vector<Evidence> evidence = {
      {model.quant->source_file, key, declared},
      ctx.launch_evidence(
          "kv_cache_dtype", ctx.setting_name(),
          ctx.flags().kv_cache_dtype_flag.empty() ? "auto (default)" : ctx.flags().kv_cache_dtype),
      {ctx.data_file(), "auto_resolution." + r.rule_id, r.reason}};
  add_provenance(ctx, r.rule_provenance, evidence);
  if (r.quantized && auto_chose) {
    const bool overrides_cli = r.requested != "auto";
    if (overrides_cli && r.requested == r.kv_cache_dtype) return;  // forced to what was asked
    Finding finding{
        overrides_cli ? "kv-quant-overrides-cli" : "kv-auto-quantized",
        overrides_cli ? Severity::critical : Severity::warning,
        overrides_cli
            ? fmt::format("{} ignores {} {} and stores the KV cache as {}", ctx.engine_label(),
                          ctx.setting_name(), ctx.flags().kv_cache_dtype, r.kv_cache_dtype)
            : fmt::format("The checkpoint declares a {} KV cache; {} enables it under "
                          "{} auto ({})",
                          declared, ctx.engine_label(), ctx.setting_name(), r.kv_cache_dtype),
        fmt::format("The KV cache is quantized to {} without anyone asking for it; accuracy then "
                    "depends entirely on the KV scales (see the scale findings).",
                    r.kv_cache_dtype),
        evidence,
        fmt::format("decide explicitly: for full precision, {}; or {}",
                    ctx.fix_flag(r.model_dtype == "fp16" ? "fp16" : "bf16"),
                    ctx.keep_quantized_text(r.kv_cache_dtype)),
        reference_text(r.rule_provenance)};
    if (overrides_cli) {
      // What was asked is not what runs: a substituted format, whatever its range.
      finding.judged_on = engine_basis_text(r.rule_provenance);
      judge(ctx, Category::scales_not_as_shipped, finding);
    } else {
      judge_as_unit_scale(ctx, finding);
    }
    ctx.findings.push_back(std::move(finding));
  } else if (!r.quantized && r.requested == "auto") {
    ctx.findings.push_back(Finding{
        "kv-declared-not-enabled", Severity::info,
        fmt::format("The checkpoint declares a {} KV cache but {} keeps it in {} under auto",
                    declared, ctx.engine_label(), r.kv_cache_dtype),
        "No accuracy risk from the KV cache; the declared format (and its capacity gain) is "
        "unused.",
        evidence,
        "nothing to fix for accuracy; pass the quantized --kv-cache-dtype explicitly only with "
        "calibrated scales",
        reference_text(r.rule_provenance)});
  }
}

namespace {

// "FP8" for kv_cache_quant_algo FP8 and for an 8-bit float kv_cache_scheme alike.
std::string declared_format(const std::string& declared) {
  if (declared.empty() || declared.front() != '{') {
    std::string upper = declared;
    std::transform(upper.begin(), upper.end(), upper.begin(), ::toupper);
    return upper;
  }
  auto scheme = nlohmann::json::parse(declared, nullptr, false);
  if (scheme.is_object() && scheme.value("type", "") == "float") {
    if (scheme.value("num_bits", 0) == 8) return "FP8";
    if (scheme.value("num_bits", 0) == 4) return "NVFP4";
  }
  return declared;
}

}  // namespace

// The ModelOpt sidecar and config.json's quantization_config disagree about the KV cache.
void rule_quant_configs_disagree(Context& ctx) {
  const auto& quant = ctx.model().quant;
  if (!quant || quant->other_source_file.empty()) return;
  const std::string mine = declared_format(quant->kv_declared());
  const std::string other = declared_format(quant->other_kv_declared);
  if (mine == other) return;
  auto said = [](const std::string& format) {
    return format.empty() ? std::string("no quantized KV cache") : format + " KV cache";
  };
  ctx.findings.push_back(Finding{
      "quant-configs-disagree",
      Severity::warning,
      fmt::format("hf_quant_config.json declares {} but config.json's {} declares {}", said(mine),
                  quant->other_source_key, said(other)),
      "Which file an engine release reads decides what --kv-cache-dtype auto allocates; kvaudit "
      "audits the ModelOpt sidecar (hf_quant_config.json), the reading that enables the "
      "quantized cache.",
      {{quant->source_file, quant->source_key + ".kv_cache_quant_algo",
        mine.empty() ? "absent" : quant->kv_declared()},
       {quant->other_source_file, quant->other_source_key,
        other.empty() ? "no kv_cache_scheme / kv_cache_quant_algo" : quant->other_kv_declared}},
      "pass --kv-cache-dtype explicitly instead of auto, and re-export so both files agree",
      "sglang modelopt_quant.py from_config (flat config.json vs nested hf_quant_config.json); "
      "vllm/utils/torch_utils.py get_kv_cache_quant_algo_string"});
}

void rule_e5m2(Context& ctx) {
  if (ctx.resolved.kv_cache_dtype != "fp8_e5m2") return;
  ctx.findings.push_back(Finding{
      "fp8-e5m2",
      ctx.input.policy == KvPolicy::lossless ? Severity::critical : Severity::warning,
      "FP8 E5M2 KV cache: 2 mantissa bits",
      "Every cached value carries up to 12.5% relative rounding error (E4M3: 6.25%); the range is "
      "wide, so nothing clips, but precision is lost everywhere.",
      {ctx.launch_evidence("kv_cache_dtype", "--kv-cache-dtype", ctx.flags().kv_cache_dtype)},
      fmt::format("prefer fp8_e4m3 with calibrated scales, or {}", ctx.fix_flag("bf16")),
      "OCP 8-bit Floating Point Specification (OFP8) 1.0: E5M2 keeps 2 mantissa bits, E4M3 3"});
}

// Accepted dtypes that corrupt on some models (vLLM float16 cache on a bf16 model).
void rule_dtype_hazards(Context& ctx) {
  for (const auto& hazard : ctx.engine().dtype_hazards) {
    if (!hazard.versions.contains(ctx.resolved.version)) continue;
    auto has = [](const std::vector<std::string>& list, const std::string& value) {
      return std::find(list.begin(), list.end(), value) != list.end();
    };
    const std::string trained = ctx.engine().dtypes->normalise(ctx.model().torch_dtype);
    if (!has(hazard.dtypes, ctx.resolved.kv_cache_dtype) || !has(hazard.model_dtypes, trained))
      continue;
    std::vector<Evidence> evidence = {
        {ctx.model().config_file, "torch_dtype", ctx.model().torch_dtype},
        ctx.launch_evidence("kv_cache_dtype", "resolved kv_cache_dtype",
                            ctx.resolved.kv_cache_dtype),
        {ctx.data_file(), "dtype_hazards." + hazard.id,
         std::string(engines::rule_status_name(hazard.provenance.status))}};
    add_provenance(ctx, hazard.provenance, evidence);
    Finding finding{"kv-dtype-corrupts",
                    Severity::critical,
                    fmt::format("{} stores a {} KV cache for a {} model: the values are corrupted",
                                ctx.engine_label(), ctx.resolved.kv_cache_dtype, trained),
                    hazard.consequence + ".",
                    evidence,
                    fmt::format("{} (or --kv-cache-dtype auto)", ctx.fix_flag(trained)),
                    reference_text(hazard.provenance)};
    finding.judged_on = engine_basis_text(hazard.provenance);
    judge(ctx, Category::broken, finding);
    ctx.findings.push_back(std::move(finding));
  }
}

void rule_fp16_serving(Context& ctx) {
  const std::string trained = ctx.model().torch_dtype;
  if (trained != "bfloat16") return;
  const std::string served = ctx.engine().dtypes->normalise(ctx.flags().dtype);
  const bool fp16_weights = served == "fp16";
  const bool fp16_cache = ctx.resolved.kv_cache_dtype == "fp16";
  if (!fp16_weights && !fp16_cache) return;
  // An engine-specific corruption of a float16 cache is its own, more severe finding.
  for (const auto& finding : ctx.findings)
    if (finding.id == "kv-dtype-corrupts" && !fp16_weights) return;
  ctx.findings.push_back(Finding{
      "fp16-serving-bf16-model",
      Severity::warning,
      fmt::format("A bfloat16-trained model is served with {} in float16",
                  fp16_weights ? "activations" : "the KV cache"),
      "float16 tops out at 65504: activations and keys that bfloat16 holds easily overflow to inf "
      "and turn outputs into NaN or garbage.",
      {{ctx.model().config_file, "torch_dtype", trained},
       ctx.launch_evidence(fp16_weights ? "dtype" : "kv_cache_dtype",
                           fp16_weights ? "--dtype" : "--kv-cache-dtype",
                           fp16_weights ? ctx.flags().dtype : ctx.flags().kv_cache_dtype)},
      "serve with --dtype bfloat16 (and a bf16 KV cache)",
      "IEEE 754 binary16: largest finite value 65504 (bfloat16: ~3.4e38)"});
}

// vLLM --kv-cache-dtype-skip-layers: which layers stay in the model dtype.
void rule_skip_layers(Context& ctx) {
  const std::string& spec = ctx.flags().kv_cache_dtype_skip_layers;
  if (spec.empty() || !ctx.resolved.quantized) return;
  const auto& skipped = ctx.resolved.skipped_layers;
  std::vector<std::string> names;
  names.reserve(skipped.size());
  for (int layer : skipped) names.push_back(std::to_string(layer));
  if (skipped.empty()) {
    ctx.findings.push_back(Finding{
        "kv-skip-layers-no-effect",
        Severity::warning,
        fmt::format("--kv-cache-dtype-skip-layers {} matches no attention layer of this model",
                    spec),
        fmt::format("Every attention layer is stored as {}; the layers meant to stay in {} are "
                    "quantized too.",
                    ctx.resolved.kv_cache_dtype, ctx.resolved.model_dtype),
        {ctx.launch_evidence("kv_cache_dtype_skip_layers", "--kv-cache-dtype-skip-layers", spec),
         {ctx.model().config_file, "sliding-window layers",
          std::to_string(std::count_if(
              ctx.model().layers.begin(), ctx.model().layers.end(),
              [](const auto& l) { return l.kind == LayerKind::sliding_attention; }))}},
        "name existing layer indices, or 'sliding_window' only for models with sliding-window "
        "layers",
        "vllm/model_executor/layers/attention/attention.py (skipped layers get kv_cache_dtype "
        "auto)"});
    return;
  }
  ctx.findings.push_back(Finding{
      "kv-skip-layers",
      Severity::info,
      fmt::format("{} of {} attention layers stay in {} (--kv-cache-dtype-skip-layers); the rest "
                  "are {}",
                  skipped.size(), attention_layers(ctx.model()).size(), ctx.resolved.model_dtype,
                  ctx.resolved.kv_cache_dtype),
      "The skipped layers keep full precision and their own (larger) page size; scale findings "
      "below count only the quantized layers.",
      {ctx.launch_evidence("kv_cache_dtype_skip_layers", "--kv-cache-dtype-skip-layers", spec),
       {ctx.model().config_file, "skipped layers", names_preview(names, 8)}},
      "none",
      "vllm/config/cache.py kv_cache_dtype_skip_layers"});
}

namespace {

int state_rank(const engines::DtypeVocabulary& dtypes, const std::string& dtype) {
  const std::string canonical = dtypes.normalise(dtype);
  if (canonical == "fp32") return 32;
  if (canonical == "bf16" || canonical == "fp16") return 16;
  return 0;
}

}  // namespace

void rule_hybrid_state(Context& ctx) {
  const auto& linear = ctx.model().linear_attention;
  if (!linear || linear->ssm_dtype.empty()) return;
  const auto& spellings = ctx.engine().launch.flags;
  const std::string flag =
      spellings.count("mamba_ssm_dtype") ? spellings.at("mamba_ssm_dtype").front() : "";
  const engines::StateDtypes states =
      engines::resolve_state_dtypes(ctx.engine(), ctx.resolved.version, ctx.model(),
                                    ctx.flags().mamba_ssm_dtype, ctx.resolved.model_dtype);
  const std::string& used = states.ssm.dtype;
  const engines::DtypeVocabulary& dtypes = *ctx.engine().dtypes;
  if (state_rank(dtypes, used) == 0 ||
      state_rank(dtypes, used) >= state_rank(dtypes, linear->ssm_dtype))
    return;
  const engines::Provenance& provenance =
      states.rule ? states.rule->provenance
                  : ctx.engine().defaults_for(ctx.resolved.version).provenance;
  const std::string origin =
      states.ssm.origin == "launch flag" ? "launch flag " + flag : states.ssm.origin;
  std::vector<Evidence> evidence = {{ctx.model().config_file, "mamba_ssm_dtype", linear->ssm_dtype},
                                    {ctx.launch_label(), origin, used}};
  add_provenance(ctx, provenance, evidence);
  Finding finding{
      "hybrid-state-precision",
      Severity::warning,
      fmt::format("Linear-attention (GDN/Mamba) state kept in {} but the config asks for {}", used,
                  linear->ssm_dtype),
      "The recurrent state accumulates over the whole context; rounding it every token compounds "
      "into drift on long inputs (sglang#10258: GSM8K 0.955 -> 0.945 for fp32 -> bf16 state).",
      evidence,
      flag.empty()
          ? fmt::format("{} has no launch setting kvaudit knows for the state dtype: confirm "
                        "what it runs ({}), or serve the model on an engine that keeps {}",
                        ctx.engine().engine,
                        provenance.verified ? "see the reference" : provenance.bound,
                        linear->ssm_dtype)
          : fmt::format("launch with {} {}", flag, linear->ssm_dtype),
      reference_text(provenance)};
  finding.basis = "engine";
  finding.judged_on = engine_basis_text(provenance);
  ctx.findings.push_back(std::move(finding));
}

void rule_context_length(Context& ctx) {
  const auto& context = ctx.flags().context_length;
  const int64_t max_positions = ctx.model().max_position_embeddings;
  if (!context || max_positions <= 0 || *context <= max_positions) return;
  if (!ctx.model().rope_scaling.is_null()) return;
  ctx.findings.push_back(Finding{
      "context-beyond-max-position",
      Severity::critical,  // a broken launch under every policy
      fmt::format("Context length {} exceeds max_position_embeddings {} with no rope scaling",
                  *context, max_positions),
      "Positions past the trained range get rotary angles the model never saw: quality collapses "
      "beyond that point with no error.",
      {ctx.launch_evidence("context_length", "context length", std::to_string(*context)),
       {ctx.model().config_file, "max_position_embeddings", std::to_string(max_positions)},
       {ctx.model().config_file, "rope_scaling", "absent"}},
      fmt::format("keep the context at or below {}, or configure rope scaling (e.g. yarn) the "
                  "model was validated with",
                  max_positions),
      "config.json max_position_embeddings / rope_scaling"});
}

// Flags with a life cycle: deprecated, disabled for hybrids, harmful on hybrids before
// the guard. (Removed flags are start-up failures.)
void rule_flag_lifecycle(Context& ctx) {
  const engines::Version& version = ctx.resolved.version;
  for (const auto& rule : ctx.engine().flag_rules) {
    if (!engines::flag_given(ctx.engine(), ctx.flags(), rule.flag) ||
        !rule.exists.contains(version))
      continue;
    std::vector<Evidence> evidence = {{ctx.launch_label(), rule.flag, "set"}};
    add_provenance(ctx, rule.provenance, evidence);
    const bool hybrid = ctx.model().linear_attention.has_value();
    if (hybrid && rule.disabled_for_hybrid.contains(version)) {
      evidence.push_back({ctx.model().config_file, "model_type", ctx.model().model_type});
      ctx.findings.push_back(Finding{
          "dynamic-scales-disabled", Severity::warning,
          fmt::format("{} is ignored for this hybrid (linear-attention) model", rule.flag),
          "The engine logs 'Disabling calculate_kv_scales for hybrid model' and falls back to the "
          "checkpoint scales or 1.0.",
          evidence,
          "provide calibrated scales in the checkpoint (kvaudit calibrate) or use a bf16 KV cache",
          reference_text(rule.provenance)});
    } else if (hybrid && !rule.hybrid_hazard.empty() && ctx.resolved.quantized) {
      evidence.push_back({ctx.model().config_file, "model_type", ctx.model().model_type});
      ctx.findings.push_back(Finding{
          "dynamic-scales-hybrid-garbage", Severity::critical,  // broken under every policy
          fmt::format("{} on a hybrid (linear-attention) model in {}: {}", rule.flag,
                      ctx.engine_label(), rule.hybrid_hazard),
          "The frozen scales are wrong for every layer: output degrades to gibberish without an "
          "error.",
          evidence,
          fmt::format("drop {} and provide calibrated scales (kvaudit calibrate), or {}", rule.flag,
                      ctx.fix_flag("bf16")),
          reference_text(rule.provenance)});
    }
    if (rule.deprecated.contains(version))
      ctx.findings.push_back(Finding{
          "flag-deprecated", Severity::info,
          fmt::format("{} is deprecated in {} and removed in later releases", rule.flag,
                      ctx.engine_label()),
          fmt::format("An upgrade will stop this launch from starting ({}).", rule.removed_error),
          evidence, fmt::format("drop {} before upgrading: {}", rule.flag, rule.meaning),
          reference_text(rule.provenance)});
  }
}

void rule_unknown_architecture(Context& ctx) {
  // No checkpoint at all (a live server probed without one): nothing to recognise.
  if (ctx.model().architecture_known || ctx.model().config_file.empty()) return;
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

// --kv-policy lossless: any quantized KV cache is critical, however good its scales.
void rule_lossless_policy(Context& ctx) {
  if (ctx.input.policy != KvPolicy::lossless || !ctx.resolved.quantized) return;
  Finding finding{
      "kv-cache-quantized",
      Severity::critical,
      fmt::format("The KV cache is quantized ({}) and the policy is lossless",
                  ctx.resolved.kv_cache_dtype),
      "Every cached key and value is rounded to the quantized format; under --kv-policy "
      "lossless (\"context should use no quantization\") that is a failure whatever the "
      "evidence says about its damage.",
      {ctx.launch_evidence("kv_cache_dtype", "resolved kv_cache_dtype",
                           ctx.resolved.kv_cache_dtype),
       {ctx.launch_label(), "--kv-policy", "lossless"}},
      ctx.fix_flag(ctx.resolved.model_dtype == "fp16" ? "fp16" : "bf16"),
      reference_text(ctx.resolved.rule_provenance)};
  judge(ctx, Category::precision, finding);
  ctx.findings.push_back(std::move(finding));
}

void rule_version(Context& ctx) {
  const auto& engine = ctx.engine();
  if (!ctx.input.version_given) {
    ctx.findings.push_back(Finding{
        "engine-version-assumed",
        Severity::info,
        fmt::format("No --engine-version: judged against the latest known {} behaviour ({})",
                    engine.engine, engine.latest_known_version),
        "Older releases may resolve dtypes or load scales differently.",
        {{ctx.data_file(), "latest_known_version", engine.latest_known_version}},
        "pass --engine-version with the version you deploy",
        ""});
    return;
  }
  if (ctx.resolved.version_newer_than_known)
    ctx.findings.push_back(Finding{
        "engine-version-newer",
        Severity::info,
        fmt::format("{} {} is newer than the newest release kvaudit knows ({}): the verdict may "
                    "be stale",
                    engine.engine, ctx.flags().engine_version, engine.latest_known_version),
        "A newer release may resolve dtypes, load scales or fall back differently than the data "
        "says; the findings apply the newest known behaviour.",
        {{ctx.data_file(), "latest_known_version", engine.latest_known_version}},
        "check the release notes for KV-cache changes; verify the launch with kvaudit logs",
        ""});
}

// ---------------------------------------------------------------- the table

namespace {

using Rule = void (*)(Context&);
struct NamedRule {
  const char* id;
  Rule rule;
};
// A key the engine refuses in the launch's config file (TensorRT-LLM's BaseLlmArgs forbids
// unknown keys): the server does not start, and the setting the user meant never applies.
void rule_config_refused(Context& ctx) {
  for (const std::string& error : ctx.flags().config_errors)
    ctx.findings.push_back(
        Finding{"launch-config-refused",
                Severity::critical,
                fmt::format("{} refuses a key of the launch's config file", ctx.engine().engine),
                "The server does not start with this file; the setting the key meant (often the KV "
                "dtype) never takes effect.",
                {{ctx.flags().config_file, "refused key", error}},
                fmt::format("move the setting to the key the engine reads ({})",
                            engines::kv_dtype_setting_name(ctx.engine(), ctx.resolved.version)),
                ctx.engine().launch.config_source});
}

const NamedRule kRules[] = {
    {"startup-failures", rule_startup_failures},
    {"launch-config-refused", rule_config_refused},
    {"kv-auto-quantized", rule_auto_quantized},
    {"quant-configs-disagree", rule_quant_configs_disagree},
    {"kv-skip-layers", rule_skip_layers},
    {"fp8-unit-scale", rule_unit_scale},
    {"nvfp4-unit-global-scale", rule_nvfp4_global_scale},
    {"modelopt-kv-fp8-cast", rule_modelopt_kv_cast},
    {"scales-dropped", rule_dropped_scales},
    {"scales-ignored-by-design", rule_scales_ignored},
    {"scale-values", rule_scale_values},
    {"scale-one-sided", rule_one_sided},
    {"fp8-e5m2", rule_e5m2},
    {"kv-dtype-corrupts", rule_dtype_hazards},
    {"fp16-serving-bf16-model", rule_fp16_serving},
    {"hybrid-state-precision", rule_hybrid_state},
    {"context-beyond-max-position", rule_context_length},
    {"flag-lifecycle", rule_flag_lifecycle},
    {"param-path-not-applied", rule_param_path},
    {"scale-warning-false-alarm", rule_misleading_warning},
    {"unknown-architecture", rule_unknown_architecture},
    {"engine-version", rule_version},
    {"kv-cache-quantized", rule_lossless_policy},
    {"known-bad-combination", rule_known_bad},
    {"kv-tier-hazard", rule_tier_hazards},
    {"kv-dtype-substituted", rule_platform_substitution},
    {"draft-kv-quantized", rule_draft_kv},
};

}  // namespace

std::vector<std::string> rule_ids() {
  std::vector<std::string> ids;
  for (const auto& rule : kRules) ids.emplace_back(rule.id);
  return ids;
}

CheckResult run_check(const CheckInput& input) {
  if (!input.engine) throw std::logic_error("run_check: no engine model");
  CheckResult result;
  result.resolved = engines::resolve_kv(input.model, input.flags, *input.engine);
  const RangeAssessment range = assess_kv_range(input, result.resolved);
  Context ctx{input, result.resolved, result.findings, range};
  for (const auto& rule : kRules) rule.rule(ctx);
  // A launch read from a file: every finding points at the line that sets the KV dtype (or
  // the command that leaves it to its default), which decides what each finding judges.
  if (!input.flags.launch_file.empty())
    for (Finding& finding : result.findings)
      if (std::none_of(finding.evidence.begin(), finding.evidence.end(),
                       [](const Evidence& e) { return e.line > 0; }))
        finding.evidence.push_back(ctx.launch_evidence("kv_cache_dtype", ctx.setting_name(),
                                                       input.flags.kv_cache_dtype_flag.empty()
                                                           ? "auto (default)"
                                                           : input.flags.kv_cache_dtype));
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
