// decide: the options, each judged by audit::run_check and sized by plan::plan_capacity
// (and, from a log, plan::predict_from_log's exact interval), and the recommendation.
#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "calibrate/calibrate.h"
#include "decide/decide.h"
#include "util/util.h"

namespace kvaudit::decide {

namespace {

std::vector<int64_t> default_contexts(const audit::CheckInput& input) {
  std::vector<int64_t> out = {32768, 131072};
  int64_t longest = input.flags.context_length.value_or(input.model.max_position_embeddings);
  if (longest > 131072 && longest <= (int64_t{1} << 22)) out.push_back(longest);
  return out;
}

KvOption judged(std::string id, std::string label, std::string change, std::string flag_value,
                const audit::CheckResult& result) {
  KvOption option;
  option.flag_value = std::move(flag_value);
  option.id = std::move(id);
  option.label = std::move(label);
  option.change = std::move(change);
  option.kv_cache_dtype = result.resolved.kv_cache_dtype;
  option.kv_quantized = result.resolved.quantized;
  option.scale_source = std::string(engines::scale_source_name(result.resolved.scale_source));
  if (!result.resolved.startup_failures.empty()) {
    option.possible = false;
    option.why_not = fmt::format("the server would not start: {}",
                                 result.resolved.startup_failures.front().message);
  }
  for (const auto& hit : result.resolved.known_bad)
    option.known_bad.push_back(hit.rule->id + (hit.certain ? "" : " (possible)"));
  for (const auto& f : result.findings) {
    if (f.severity == report::Severity::critical) ++option.critical;
    if (f.severity == report::Severity::warning) ++option.warning;
    if (f.severity != report::Severity::info) option.finding_ids.push_back(f.id);
  }
  return option;
}

audit::CheckResult check_with(const audit::CheckInput& base, const std::string& kv_value,
                              const checkpoint::ModelFacts* model = nullptr,
                              const std::string& param_path = "") {
  audit::CheckInput input = base;
  if (model) {
    input.model = *model;
    input.scales_are_stand_ins = true;  // decide's preview of a calibration, not evidence
  }
  input.flags.kv_cache_dtype = kv_value;
  input.flags.kv_cache_dtype_flag = "--kv-cache-dtype";
  if (!param_path.empty()) input.flags.quantization_param_path = param_path;
  return audit::run_check(input);
}

// FP8 with calibrated scales: whether a carrier the release loads exists for this checkpoint
// (calibrate's dry run with stand-in scales), and the audit of the checkpoint as it would look.
KvOption calibrated_option(const engines::Registry& registry, const audit::CheckInput& input,
                           const engines::Version& version) {
  const engines::EngineModel& engine = *input.engine;
  const std::string fp8 = engines::cli_spelling(engine, version, "fp8_e4m3");
  const engines::KvDtypeFix setting = engines::kv_dtype_fix(engine, version, "fp8_e4m3");
  const std::string change = fmt::format(
      "kvaudit calibrate --model DIR --engine {}{} --format fp8_e4m3 --from-stats AMAX.json "
      "(maxima measured on the GPUs; --text FILE where the CPU engine runs the model) --out "
      "OVERLAY, then serve OVERLAY with {} {}",
      engine.engine, input.version_given ? " --engine-version " + input.flags.engine_version : "",
      setting.setting, fp8.empty() ? "fp8_e4m3" : fp8);
  KvOption option;
  option.id = "fp8-calibrated";
  option.label = "FP8 with calibrated scales";
  option.change = change;
  option.kv_cache_dtype = "fp8_e4m3";
  if (fp8.empty()) {
    option.possible = false;
    option.why_not = "this release accepts no fp8_e4m3 KV cache";
    return option;
  }
  if (const engines::ScaleNameRule* ignored =
          engines::scales_ignored_for(engine, version, input.model, "fp8_e4m3")) {
    option.possible = false;
    option.why_not = fmt::format("{} never uses checkpoint scales for an fp8_e4m3 cache ({}: {})",
                                 engine.engine, ignored->id, ignored->reason);
    return option;
  }
  if (!input.model.has_weights) {
    option.possible = false;
    option.why_not = "needs the checkpoint's safetensors (a bare config.json was given)";
    return option;
  }
  // Stand-in scales (amax 100 over 448): what matters is where the engine looks for them.
  std::vector<calibrate::LayerScales> scales;
  for (const auto& layer : input.model.layers)
    if (checkpoint::holds_kv_cache(layer.kind))
      scales.push_back({layer.index, {100.0f / 448.0f}, {100.0f / 448.0f}, 100.0f, 100.0f});
  calibrate::OverlayRequest request;
  request.model_dir = input.model.files_dir;
  request.engine = engine.engine;
  request.engine_version = input.version_given ? input.flags.engine_version : "";
  request.tp = std::max(1, input.flags.tp);
  request.dry_run = true;
  calibrate::OverlayResult preview;
  try {
    preview = calibrate::write_overlay(registry, input.model, scales, request);
  } catch (const InputError& error) {
    option.possible = false;
    option.why_not = error.problem();
    return option;
  }
  if (!preview.view) {
    option.possible = false;
    std::vector<std::string> reasons;
    for (const auto& attempt : preview.attempts)
      reasons.push_back(
          fmt::format("{}: {}{}", calibrate::carrier_name(attempt.carrier), attempt.why,
                      attempt.reference.empty() ? "" : " [" + attempt.reference + "]"));
    option.why_not = reasons.empty() ? "no scale carrier for this checkpoint"
                                     : fmt::format("{}", fmt::join(reasons, "; "));
    return option;
  }
  const bool param_path = preview.carrier == calibrate::Carrier::quantization_param_path;
  KvOption out =
      judged(option.id, option.label,
             fmt::format("calibrate ({} scales), then {} {}",
                         calibrate::carrier_name(preview.carrier), setting.setting, fp8),
             fp8, check_with(input, fp8, &*preview.view, param_path ? "SCALES.json" : ""));
  out.how = change;
  return out;
}

// Sizes one option: its pool in tokens and the concurrency at each context.
void size_option(const engines::Registry& registry, KvOption& option,
                 const audit::CheckInput& input, const engines::Version& version,
                 const std::vector<int64_t>& contexts, const MemorySource& memory,
                 std::vector<std::string>& notes) {
  if (!option.possible || option.kv_cache_dtype.empty()) return;
  plan::PlanOptions p;
  p.engine = input.engine->engine;
  p.engine_version = engines::version_text(version);
  p.parallel = {std::max(1, input.flags.tp), std::max(1, input.flags.pp),
                std::max(1, input.flags.dp), input.flags.dp_attention,
                std::max(1, input.flags.dcp)};
  p.kv_cache_dtypes = {option.kv_cache_dtype};
  p.contexts = contexts;
  p.mamba_ssm_dtype = input.flags.mamba_ssm_dtype;
  if (input.flags.page_size) p.page_size = *input.flags.page_size;
  if (input.flags.max_total_tokens) p.max_total_tokens = *input.flags.max_total_tokens;
  p.memory_fraction = input.flags.memory_fraction;
  if (memory.logged && memory.logged->total_before_load_gib &&
      memory.logged->avail_after_weights_gib) {
    // What the launch printed: SGLang's rest = avail_after - total x (1 - fraction), which
    // plan computes from a GPU of `total` holding `total - avail_after` of weights.
    const double total = *memory.logged->total_before_load_gib;
    const double after = *memory.logged->avail_after_weights_gib;
    p.gpu_memory_bytes = static_cast<int64_t>(total * kBytesPerGiB);
    p.weight_bytes_per_gpu = static_cast<int64_t>((total - after) * kBytesPerGiB);
    if (memory.logged->mem_fraction_static) p.memory_fraction = memory.logged->mem_fraction_static;
  } else if (memory.gpu_memory_bytes) {
    p.gpu_memory_bytes = memory.gpu_memory_bytes;
    p.gpu_name = memory.gpu_name;
  } else {
    return;
  }
  try {
    plan::CapacityPlan plan = plan::plan_capacity(registry, input.model, p);
    if (plan.rows.empty()) return;
    const plan::PlanRow& row = plan.rows.front();
    option.tokens = plan::TokenInterval{row.max_total_tokens, row.max_total_tokens};
    option.concurrency = row.concurrency;
    if (memory.logged) {
      // The exact image of the printed figures (+-0.005 GiB) under the engine's formula.
      plan::PlanOptions every = p;
      every.kv_cache_dtypes.clear();
      // Without --engine-version the log's own figures say which release's arithmetic fits.
      if (!input.version_given) every.engine_version.clear();
      plan::LogPrediction prediction = plan::predict_from_log(
          registry, input.model, plan::reconcile_log_flags(registry, *memory.logged, every, {}));
      for (const auto& r : prediction.rows)
        if (r.kv_cache_dtype == option.kv_cache_dtype) {
          option.tokens = r.max_total_tokens;
          option.tokens_from_log = true;
        }
      // Requests the pool holds, from the low end of that range (the plan's own budget model
      // differs from the printed one by its reserve estimates); other limits stay the plan's.
      if (option.tokens && !option.tokens->empty())
        for (auto& point : option.concurrency) {
          const int64_t by_pool = option.tokens->lo / std::max<int64_t>(1, point.context_tokens);
          plan::relimit_requests(point, "kv pool", by_pool);
        }
    }
  } catch (const InputError& error) {
    notes.push_back(fmt::format("{}: not sized ({})", option.label, error.problem()));
  }
}

}  // namespace

Decision decide(const engines::Registry& registry, const audit::CheckInput& input,
                const audit::CheckResult& as_launched, const DecisionOptions& options) {
  Decision out;
  const engines::EngineModel& engine = *input.engine;
  const engines::Version version = as_launched.resolved.version;
  out.contexts = options.contexts.empty() ? default_contexts(input) : options.contexts;

  const std::string requested =
      input.flags.kv_cache_dtype.empty() ? "auto" : input.flags.kv_cache_dtype;
  out.options.push_back(judged(
      "as-launched", "as launched",
      fmt::format("{} {} (no change)", engines::kv_dtype_setting_name(engine, version), requested),
      requested, as_launched));
  std::set<std::string> seen = {as_launched.resolved.kv_cache_dtype};

  // A 16-bit cache in the model's own dtype (a float16 cache on a bf16 model is its own hazard).
  const std::string sixteen =
      engine.dtypes->normalise(input.model.torch_dtype) == "fp16" ? "fp16" : "bf16";
  if (!seen.count(sixteen)) {
    const engines::KvDtypeFix fix = engines::kv_dtype_fix(engine, version, sixteen);
    if (fix.overlay) {
      // No value gives a 16-bit cache: the checkpoint seen through its config overlay, auto.
      const checkpoint::ModelFacts overlaid = calibrate::without_kv_quantization(input.model);
      KvOption option = judged(sixteen, "16-bit KV cache", fix.text, "auto",
                               check_with(input, "auto", &overlaid));
      option.overlay = true;
      out.options.push_back(std::move(option));
      seen.insert(sixteen);
    } else if (!engines::cli_spelling(engine, version, sixteen).empty()) {
      out.options.push_back(judged(sixteen, "16-bit KV cache", fix.setting + " " + fix.value,
                                   fix.value, check_with(input, fix.value)));
      seen.insert(sixteen);
    }
  }
  // Without memory the table cannot be sized: the fix (a 16-bit cache) and its verification
  // still hold, and the note says which flag brings the full table. The other options cost
  // a re-read of every shard header (the calibrated view) and are left for a sized run.
  const bool sizable = options.memory.gpu_memory_bytes ||
                       (options.memory.logged && options.memory.logged->total_before_load_gib &&
                        options.memory.logged->avail_after_weights_gib);
  out.sized = sizable;
  const bool calibrated_differs =
      sizable && !(as_launched.resolved.kv_cache_dtype == "fp8_e4m3" &&
                   as_launched.resolved.scale_source == engines::ScaleSource::checkpoint);
  if (calibrated_differs) out.options.push_back(calibrated_option(registry, input, version));
  // Every other dtype this release accepts, as it would run with this checkpoint.
  for (const std::string& value :
       sizable ? engines::kv_cache_dtype_choices(engine, version) : std::vector<std::string>{}) {
    const std::string dtype = engines::cli_dtype(engine, version, value);
    if (dtype.empty() || value == "auto" || seen.count(dtype)) continue;
    const engines::KvDtype* spec = engine.dtypes->find(dtype);
    if (spec && spec->mla_only && !input.model.mla) continue;  // a layout of the MLA latent
    seen.insert(dtype);
    out.options.push_back(
        judged(dtype, dtype, engines::kv_dtype_fix(engine, version, dtype).setting + " " + value,
               value, check_with(input, value)));
  }

  MemorySource memory = options.memory;
  if (memory.logged && memory.logged->kv_cache_dtype.empty())
    memory.logged->kv_cache_dtype = as_launched.resolved.kv_cache_dtype;  // the log's own launch
  for (auto& option : out.options)
    size_option(registry, option, input, version, out.contexts, memory, out.notes);
  if (options.memory.logged && options.memory.logged->total_before_load_gib &&
      options.memory.logged->avail_after_weights_gib)
    out.memory_note = fmt::format(
        "sized from the memory {} printed ({:.2f} GiB before weights, {:.2f} GiB after); token "
        "counts are the exact range those two-decimal figures allow",
        options.memory.log_label, *options.memory.logged->total_before_load_gib,
        *options.memory.logged->avail_after_weights_gib);
  else if (options.memory.gpu_memory_bytes)
    out.memory_note = fmt::format(
        "sized for {} ({} MiB per GPU), TP {}, mem fraction {}, weights per GPU from the "
        "checkpoint",
        options.memory.gpu_name.empty() ? "the GPU given" : options.memory.gpu_name,
        *options.memory.gpu_memory_bytes >> 20, std::max(1, input.flags.tp),
        input.flags.memory_fraction ? fmt::format("{} (launch)", *input.flags.memory_fraction)
                                    : std::string("the engine's default"));
  else
    out.memory_note =
        "memory unknown: pass --gpu NAME (or --gpu-mem SIZE), or --from-log LOG (a start-up log "
        "of this deployment), for the table of every KV option with its KV tokens and "
        "concurrency";

  // The fix: nothing if the launch is clean; else the 16-bit cache when it is (no artifact
  // to make), with FP8 + calibrated scales as the capacity-keeping alternative.
  const KvOption& launched = out.options.front();
  if (launched.critical > 0 || !launched.possible) {
    for (const auto& option : out.options)
      if (option.id == sixteen && option.possible && option.critical == 0)
        out.recommended = option.id;
    for (const auto& option : out.options)
      if (option.id == "fp8-calibrated" && option.possible && option.critical == 0)
        out.alternative = option.id;
  }
  return out;
}

std::vector<std::string> expectations_for(const KvOption& option) {
  std::vector<std::string> out = {"kv_cache_dtype=" + option.kv_cache_dtype};
  if (!option.kv_quantized || option.scale_source == "checkpoint" ||
      option.scale_source == "quantization_param_path")
    out.push_back("scale_fallback=false");
  if (option.tokens && option.tokens_from_log)
    out.push_back(
        option.tokens->lo == option.tokens->hi
            ? fmt::format("max_total_tokens={}", option.tokens->lo)
            : fmt::format("max_total_tokens={}..{}", option.tokens->lo, option.tokens->hi));
  return out;
}

bool log_names_kv_dtype(const engines::EngineModel& engine) {
  return engine.kv_dtype_setting.logged;
}

std::vector<std::string> verification_commands(const Decision& decision, const KvOption& fixed,
                                               const Verification& where) {
  std::vector<std::string> expect;
  for (const auto& e : expectations_for(fixed)) expect.push_back("--expect " + e);
  std::vector<std::string> out;
  const std::string checkpoint = where.checkpoint.empty() ? "CHECKPOINT" : where.checkpoint;
  const std::string logs =
      where.log_names_kv_dtype
          ? fmt::format("kvaudit logs - {}", fmt::join(expect, " "))
          : fmt::format("kvaudit logs - --checkpoint {} {}", checkpoint, fmt::join(expect, " "));
  const std::string log_source =
      where.unit_name.empty() ? "<the new launch's start-up log>"
                              : fmt::format("journalctl -u {} -b --no-pager", where.unit_name);
  out.push_back(fmt::format("{} | {}", log_source, logs));
  if (!where.log_names_kv_dtype)
    out.push_back(fmt::format(
        "{} | kvaudit plan {} --from-log -   (the log never names the KV dtype: its printed "
        "bytes per token must be {}'s for this model)",
        log_source, checkpoint, fixed.kv_cache_dtype));
  const std::string url = where.url.empty() ? "http://HOST:PORT" : where.url;
  out.push_back(
      fmt::format("kvaudit probe {} --smoke{}", url,
                  where.port_source.empty()
                      ? ""
                      : fmt::format("   (no --port in the launch: {})", where.port_source)));
  const KvOption& before = decision.options.front();
  if (before.kv_cache_dtype != fixed.kv_cache_dtype)
    out.push_back(fmt::format(
        "kvaudit probe {} --compare OLD_URL --smoke --recall   (OLD_URL: the previous launch, {} "
        "KV, on another port: measures what it lost)",
        url, before.kv_cache_dtype));
  return out;
}

}  // namespace kvaudit::decide
