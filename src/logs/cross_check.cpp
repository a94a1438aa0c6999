// logs verify, with the checkpoint the launch served: the dtype an auto launch got, whether
// its scales fell back to 1.0 (for every release the log may be of), and the printed
// capacity against plan's prediction from the printed memory.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

#include "logs/logs.h"
#include "logs/parse.h"
#include "util/util.h"

namespace kvaudit::logs {

namespace {

using report::Severity;

// What the engine does with this checkpoint's scales under the launch's request, per the
// engine model: "" when nothing falls back to 1.0, else why.
std::string fallback_under(const engines::EngineModel& engine, const engines::Version& version,
                           const Launch& launch, const checkpoint::ModelFacts& model) {
  // The log proves the dtype; what is left to decide is which scales reach it.
  engines::LaunchFlags flags;
  flags.engine = engine.engine;
  flags.engine_version = engines::version_text(version);
  const std::string spelling =
      engines::cli_spelling(engine, version, launch.kv_cache_dtype_resolved);
  flags.kv_cache_dtype = spelling.empty() ? launch.kv_cache_dtype_resolved : spelling;
  flags.kv_cache_dtype_flag = "--kv-cache-dtype";
  flags.quantization_param_path = launch.quantization_param_path;
  engines::ResolvedKv resolved = engines::resolve_kv(model, flags, engine);
  if (resolved.scale_source == engines::ScaleSource::unit_default) {
    if (model.kv_scales.empty())
      return fmt::format("the checkpoint ({} tensors) ships no k_scale/v_scale",
                         model.tensor_count);
    std::vector<std::string> rules;
    for (const auto& drop : resolved.dropped) rules.push_back(drop.rule_id);
    return fmt::format("the checkpoint's {} KV scale tensors are not loaded ({})",
                       model.kv_scales.size(), fmt::join(rules, ", "));
  }
  if (resolved.scale_source != engines::ScaleSource::checkpoint) return "";
  std::set<int> covered;
  for (const auto& scale : model.kv_scales)
    if (std::find(resolved.loaded_scale_names.begin(), resolved.loaded_scale_names.end(),
                  scale.name) != resolved.loaded_scale_names.end())
      covered.insert(scale.layer);
  int missing = 0, attention = 0;
  for (const auto& layer : model.layers)
    if (checkpoint::holds_kv_cache(layer.kind))
      ++attention, missing += covered.count(layer.index) ? 0 : 1;
  if (missing == 0) return "";
  return fmt::format("{} of {} attention layers have no loaded k/v scale", missing, attention);
}

// The releases whose rules decide a launch: the log's when it printed one, else every
// release the engine data distinguishes (a verdict stands only when they all agree).
std::vector<engines::Version> candidate_versions(const engines::EngineModel& engine,
                                                 const Launch& launch) {
  if (auto v = engines::parse_version(launch.engine_version); v && !launch.engine_version.empty())
    return {*v};
  return engines::boundary_versions(engine);
}

// An inferred dtype (auto, no line naming the cache) decided with the checkpoint.
void resolve_inferred_dtype(const engines::EngineModel& engine, Launch& launch,
                            const checkpoint::ModelFacts& model) {
  std::map<std::string, std::vector<std::string>> by_dtype;  // dtype -> releases
  std::string reason;
  for (const auto& version : candidate_versions(engine, launch)) {
    engines::LaunchFlags flags;
    flags.engine = engine.engine;
    flags.engine_version = engines::version_text(version);
    flags.kv_cache_dtype = "auto";
    flags.quantization_param_path = launch.quantization_param_path;
    engines::ResolvedKv resolved = engines::resolve_kv(model, flags, engine);
    std::string dtype = resolved.kv_cache_dtype;
    // auto follows the dtype the launch printed for its weights, not the config's.
    if (!engine.dtypes->is_quantized(dtype)) dtype = launch.model_dtype;
    if (by_dtype.empty()) reason = resolved.reason;
    by_dtype[dtype].push_back(engines::version_text(version));
  }
  if (by_dtype.size() != 1) {
    std::vector<std::string> parts;
    parts.reserve(by_dtype.size());
    for (const auto& [dtype, where] : by_dtype)
      parts.push_back(fmt::format("{}: {}", dtype, fmt::join(where, ", ")));
    launch.resolved_evidence +=
        fmt::format("; with the checkpoint it depends on the release ({}): pass --engine-version",
                    fmt::join(parts, "; "));
    return;
  }
  launch.kv_cache_dtype_resolved = by_dtype.begin()->first;
  launch.memory.kv_cache_dtype = launch.kv_cache_dtype_resolved;
  launch.resolved_inferred = false;
  launch.resolved_auto_pending = false;
  launch.resolved_evidence =
      fmt::format("kv_cache_dtype auto with the checkpoint {}: {}", model.dir.string(), reason);
}

}  // namespace

void cross_check_checkpoint(const engines::Registry& registry, Launch& launch,
                            const checkpoint::ModelFacts& model, bool is_latest) {
  const engines::EngineModel* known_engine = registry.find(launch.engine);
  if ((launch.resolved_inferred || launch.resolved_auto_pending) && known_engine) {
    resolve_inferred_dtype(*known_engine, launch, model);
    decide_scale_fallback(registry, launch);
  }
  const std::string& dtype = launch.kv_cache_dtype_resolved;
  if (registry.dtypes().is_quantized(dtype) && model.has_weights && launch.scale_fallback != true &&
      known_engine) {
    // The log's version when it printed one, else every release the data distinguishes:
    // the verdict stands only when they all agree.
    const engines::EngineModel& engine = *known_engine;
    const std::vector<engines::Version> versions = candidate_versions(engine, launch);
    std::map<std::string, std::vector<std::string>> verdicts;  // reason -> versions
    for (const auto& version : versions)
      verdicts[fallback_under(engine, version, launch, model)].push_back(
          engines::version_text(version));
    if (verdicts.size() == 1) {
      const std::string& reason = verdicts.begin()->first;
      launch.scale_fallback = !reason.empty();
      launch.scale_fallback_reason =
          reason.empty()
              ? fmt::format(
                    "{} loads the checkpoint's k/v scales for every layer ({})", launch.engine,
                    launch.engine_version.empty() ? "every known release" : launch.engine_version)
              : fmt::format(
                    "{} and the launch passed no scales the engine applies: {} uses "
                    "scale 1.0 ({})",
                    reason, launch.engine,
                    launch.engine_version.empty() ? "every known release" : launch.engine_version);
    } else {
      std::vector<std::string> parts;
      parts.reserve(verdicts.size());
      for (const auto& [reason, where] : verdicts)
        parts.push_back(
            fmt::format("{}: {}", reason.empty() ? "scales load" : reason, fmt::join(where, ", ")));
      launch.scale_fallback.reset();
      launch.scale_fallback_reason = fmt::format(
          "the log does not print the {} version and the answer depends on it ({}); pass "
          "--engine-version or run kvaudit check",
          launch.engine, fmt::join(parts, "; "));
    }
  }
  add_findings(registry, launch, is_latest);
  // Capacity: the printed count against plan's prediction from the printed memory.
  if (!launch.engine.empty() && !dtype.empty()) {
    try {
      plan::PlanOptions options;
      options.engine = launch.engine;
      plan::LogPrediction prediction = plan::predict_from_log(
          registry, model, plan::reconcile_log_flags(registry, launch.memory, options, {}));
      for (const auto& finding : prediction.findings) launch.findings.push_back(finding);
      for (const auto& check : prediction.checks) {
        double mid = (check.predicted.lo + check.predicted.hi) / 2.0;
        double ratio = mid > 0 ? check.printed / mid : 0;
        launch.findings.push_back(
            {check.inside ? "capacity-as-planned" : "capacity-mismatch",
             check.inside ? Severity::info : Severity::warning,
             fmt::format("launch {}: {}: printed {} vs predicted {} (observed / predicted {:.3f})",
                         launch.index + 1, check.what, with_thousands(check.printed),
                         check.predicted.empty()
                             ? plan::interval_text(check.predicted)
                             : fmt::format("[{}, {}]", with_thousands(check.predicted.lo),
                                           with_thousands(check.predicted.hi)),
                         ratio),
             check.inside ? ""
                          : "the engine's accounting differs from the model plan uses: check TP, "
                            "dtype and version",
             {{"plan", check.id, check.derivation}},
             "",
             "kvaudit plan --from-log"});
      }
    } catch (const InputError&) {
      // Not enough figures in this launch for a capacity check: nothing to add.
    }
  }
}

}  // namespace kvaudit::logs
