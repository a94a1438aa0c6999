// The `check` findings that apply to a detected server. For the servers kvaudit has no engine
// rules for (llama.cpp's llama-server, TGI, one no adapter recognised): what their answers
// cannot tell. For an engine of the registry: check's audit of the launch the server reports
// (on the served checkpoint when one is readable here), the request cap its scheduler really
// runs, and the KV dtype it reports against check's prediction.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "audit/audit.h"
#include "engines/engines.h"
#include "probe/probe.h"
#include "util/util.h"

namespace kvaudit::probe {

namespace {

// The servers without engine rules: what cannot be known over HTTP (nullopt for an engine of
// the registry, which check judges).
std::optional<std::vector<report::Finding>> unjudged_server_findings(
    const engines::Registry& registry, const ServerFacts& facts) {
  std::vector<report::Finding> findings;
  const std::string where = facts.url;
  if (facts.engine == "llama.cpp") {
    findings.push_back(
        {"probe-kv-type-unreported", report::Severity::info,
         "llama.cpp's llama-server does not report its KV cache types over HTTP",
         "-ctk/-ctv choose f16, q8_0, q4_0 ... caches (q4_0 keeps 4 bits per value plus a scale "
         "per 32); /props, /slots and /metrics say nothing about them, so only the start-up "
         "log (at -lv 4: 'llama_kv_cache: ... K (q4_0)') or a behavioural comparison can tell. "
         "kvaudit has no engine rules for llama.cpp.",
         [&] {
           std::vector<report::Evidence> evidence = {{where, "detected by", facts.detected_by}};
           if (facts.context_length)
             evidence.push_back({where + "/props", "n_ctx", with_thousands(*facts.context_length)});
           if (facts.slots)
             evidence.push_back({where + "/props", "total_slots", std::to_string(*facts.slots)});
           return evidence;
         }(),
         "compare against the same model with an f16 cache: kvaudit probe URL --compare "
         "F16_URL --smoke --recall",
         "llama.cpp tools/server/README.md (/props, /slots, /metrics)"});
    return findings;
  }
  if (facts.engine == "tgi") {
    findings.push_back(
        {"probe-kv-type-unreported",
         report::Severity::info,
         "Hugging Face TGI does not report its KV cache dtype over HTTP",
         "/info gives the weights' dtype and the token budgets, not the cache's; kvaudit has no "
         "engine rules for TGI, so only the behavioural probes can judge its KV precision.",
         {{where, "detected by", facts.detected_by}},
         "compare against a deployment you trust: kvaudit probe URL --compare OTHER_URL --smoke "
         "--recall",
         ""});
    return findings;
  }
  if (facts.engine == "generic") {
    std::vector<std::string> asked;  // the endpoints each engine's data says report the KV dtype
    for (const std::string& name : registry.names())
      if (const auto& info = registry.engine(name).server_info)
        asked.push_back(fmt::format("{} ({})", name, fmt::join(info->endpoints, ", ")));
    findings.push_back(
        {"probe-engine-unknown",
         report::Severity::info,
         "The server does not say which engine it is or how its KV cache is stored",
         fmt::format("None of the endpoints that report the KV dtype answered ({}), so the KV "
                     "dtype and capacity are unknown; only the behavioural probes can judge it.",
                     fmt::join(asked, "; ")),
         {{where, "detected by", facts.detected_by}},
         "read the server's start-up log with kvaudit logs",
         ""});
    return findings;
  }
  return std::nullopt;
}

// What the server reports, as the launch check reads (`version`: the reported release when
// it parses, else "").
engines::LaunchFlags reported_launch(const engines::EngineModel& engine, const ServerFacts& facts,
                                     const std::string& version, const Deployment& deployment) {
  const std::string where = facts.url;
  engines::LaunchFlags flags;
  flags.engine = facts.engine;
  flags.engine_version = version;
  flags.kv_cache_dtype = facts.kv_cache_dtype.empty() ? "auto" : facts.kv_cache_dtype;
  flags.kv_cache_dtype_flag =
      engines::kv_dtype_setting_name(engine, engines::Version{0, 0, 0, true});
  flags.model_path = facts.model_path;
  flags.tp = facts.tp;
  flags.quantization_param_path = facts.quantization_param_path;
  flags.quantization = facts.quantization;
  if (!facts.dtype.empty()) flags.dtype = facts.dtype;
  flags.context_length = facts.context_length;
  flags.calculate_kv_scales = facts.calculate_kv_scales;
  if (facts.page_size) flags.page_size = static_cast<int>(*facts.page_size);
  flags.attention_backend = facts.attention_backend;
  flags.gpu_arch = deployment.gpu_arch;
  flags.platform = deployment.platform;
  flags.source = "server " + where;
  return flags;
}

// Beside what check finds in the launch: the cap the scheduler really runs.
void add_running_requests_cap(const ServerFacts& facts, std::vector<report::Finding>& findings) {
  const std::string where = facts.url;
  if (facts.running_requests_launched && facts.running_requests_effective &&
      *facts.running_requests_effective < *facts.running_requests_launched)
    findings.push_back(
        {"probe-running-requests-capped",
         report::Severity::warning,
         fmt::format("{} runs at most {} requests at once, not the {} its server info reports",
                     where, *facts.running_requests_effective, *facts.running_requests_launched),
         "requests beyond the effective cap queue; a load test sized by the reported value "
         "measures the queue (on hybrids the mamba state cache is the usual cap)",
         {{where + "/get_server_info", "max_running_requests",
           std::to_string(*facts.running_requests_launched)},
          {facts.running_requests_source, "sum over DP ranks",
           std::to_string(*facts.running_requests_effective)}},
         "read the start-up log's 'capped to' line (kvaudit logs) and size the state pool with "
         "--max-mamba-cache-size, or drive the load test at the effective value",
         "sgl-project/sglang#38846 (/get_server_info reports the launch value)"});
}

// The KV dtype the server reports against what check predicts for the checkpoint, or what
// "auto" and no report at all leave open.
void add_reported_dtype_findings(const engines::EngineModel& engine, const ServerFacts& facts,
                                 const checkpoint::ModelFacts* model,
                                 const audit::CheckResult& result,
                                 std::vector<report::Finding>& findings) {
  const std::string where = facts.url;
  const std::string reported =
      facts.kv_cache_dtype.empty()
          ? ""
          : engines::cli_dtype(engine, result.resolved.version, facts.kv_cache_dtype);
  const bool reports_requested = engine.server_info && engine.server_info->reports_requested_dtype;
  if (model && !reported.empty() && reported != "auto" &&
      result.resolved.kv_cache_dtype != reported)
    findings.insert(
        findings.begin(),
        {"probe-kv-dtype-mismatch",
         report::Severity::warning,
         fmt::format("The server reports KV dtype {} but check predicts {} for this "
                     "checkpoint and flags",
                     reported, result.resolved.kv_cache_dtype),
         "Either the served checkpoint differs from the one given, or the engine resolved "
         "the dtype differently than its data says.",
         {{where, "kv_cache_dtype", facts.kv_cache_dtype},
          {model->dir.string(), "predicted", result.resolved.kv_cache_dtype}},
         "confirm the served checkpoint path and read the start-up log with kvaudit logs",
         result.resolved.rule_provenance.reference});
  if (!model && reported == "auto" && reports_requested)
    findings.push_back(
        {"probe-kv-dtype-auto", report::Severity::info,
         fmt::format("{} reports kv_cache_dtype auto: the resolved dtype depends on the checkpoint",
                     facts.engine),
         "Under auto a checkpoint that declares a quantized KV cache can get one (the engine "
         "data's auto rules); whether the server's report shows the resolved value is not "
         "confirmed.",
         [&] {
           std::vector<report::Evidence> evidence = {{where, "kv_cache_dtype", "auto"}};
           if (engine.server_info && !engine.server_info->provenance.verified)
             evidence.push_back({engine.file, "server_info (not confirmed in a release)",
                                 engine.server_info->provenance.bound});
           return evidence;
         }(),
         "rerun with --checkpoint DIR, or read the start-up log with kvaudit logs",
         engine.server_info ? engine.server_info->provenance.reference : ""});
  if (facts.kv_cache_dtype.empty()) {
    // Where the engine data says the server reports itself (TensorRT-LLM: no route names the
    // KV dtype at all).
    std::vector<report::Evidence> evidence = {{where, "detected by", facts.detected_by}};
    if (engine.server_info && !engine.server_info->provenance.verified)
      evidence.push_back({engine.file, "server_info (not confirmed in a release)",
                          engine.server_info->provenance.bound});
    findings.push_back({"probe-kv-dtype-unknown", report::Severity::info,
                        fmt::format("{} did not report its KV cache dtype", facts.engine),
                        "Only the behavioural probes, the start-up log or the checkpoint (pass "
                        "--checkpoint DIR: the engine data's auto rules then resolve it) can tell.",
                        evidence,
                        "read the start-up log with kvaudit logs, or rerun with --checkpoint DIR",
                        engine.server_info ? engine.server_info->provenance.reference : ""});
  }
}

}  // namespace

std::vector<report::Finding> server_findings(const engines::Registry& registry,
                                             const ServerFacts& facts,
                                             const checkpoint::ModelFacts* model,
                                             const Deployment& deployment) {
  if (auto findings = unjudged_server_findings(registry, facts)) return *findings;
  const engines::EngineModel& engine = registry.engine(facts.engine);
  std::string version = facts.engine_version;
  if (!version.empty() && !engines::parse_version(version)) version.clear();

  // What the server reports is a launch: resolve it as check would, with the served
  // checkpoint when given, else with none (the scales are then unknown).
  audit::CheckInput input;
  input.policy = deployment.policy;
  input.gpu_name = deployment.gpu_name;
  if (model) input.model = *model;
  input.flags = reported_launch(engine, facts, version, deployment);
  input.engine = &engine;
  input.version_given = !version.empty();
  audit::CheckResult result = audit::run_check(input);
  std::vector<report::Finding> findings = result.findings;
  add_running_requests_cap(facts, findings);
  add_reported_dtype_findings(engine, facts, model, result, findings);
  return findings;
}

}  // namespace kvaudit::probe
