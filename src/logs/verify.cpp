// logs verify: findings per launch, --expect checks, and the cross-check with the
// checkpoint the launch served (scale fallback, capacity against plan).
#include <fmt/format.h>

#include <algorithm>

#include "logs/logs.h"
#include "util/util.h"

namespace kvaudit::logs {

namespace {

using report::Evidence;
using report::Finding;
using report::Severity;

bool quantized(const std::string& dtype) {
  return dtype.rfind("fp8", 0) == 0 || dtype == "fp4_e2m1" || dtype == "nvfp4" || dtype == "mxfp8";
}

std::string line_ref(int64_t line) {
  return fmt::format("log:{}", line);
}

}  // namespace

void add_findings(Launch& launch, bool is_latest) {
  launch.findings.clear();
  const std::string who =
      fmt::format("launch {} ({})", launch.index + 1,
                  launch.start_time.empty() ? "no timestamp" : launch.start_time);
  std::vector<Evidence> crash, oom, runtime;
  for (const auto& f : launch.failures) {
    Evidence e{line_ref(f.line), f.kind, f.text};
    if (f.kind == "oom") oom.push_back(e);
    if (f.after_ready)
      runtime.push_back(e);
    else
      crash.push_back(e);
  }
  if (!oom.empty()) {
    launch.findings.push_back(
        {"launch-oom", Severity::critical, who + " ran out of GPU memory",
         "the server stops (or drops requests) when memory runs out", oom,
         "lower --mem-fraction-static / --gpu-memory-utilization, --max-running-requests or "
         "--context-length; check `kvaudit plan` for the budget",
         ""});
  }
  if (!crash.empty() && !launch.ready) {
    launch.findings.push_back(
        {"launch-failed", Severity::critical,
         who + " failed during start-up: " + crash.back().value, "the server never served requests",
         crash, "fix the error shown (the last exception line names it) and relaunch", ""});
  } else if (!runtime.empty()) {
    launch.findings.push_back(
        {"runtime-error", Severity::warning, who + " logged errors after it became ready",
         "requests may have failed", runtime, "read the traceback at the lines shown", ""});
  }
  if (!launch.ready && crash.empty()) {
    launch.findings.push_back(
        {is_latest ? "launch-not-ready" : "launch-never-ready",
         Severity::warning,
         is_latest ? who + " has not printed its ready line (still starting, hung or killed)"
                   : who + " was replaced before it printed its ready line",
         "a launch that never became ready served nothing",
         {{line_ref(launch.last_line), "last recognised line", ""}},
         "wait for 'The server is fired up and ready to roll!' (SGLang) or 'Application startup "
         "complete.' (vLLM), or look for the error that stopped it",
         ""});
  }
  std::string requested = plan::normalise_dtype_name(launch.kv_cache_dtype_requested);
  if ((requested.empty() || requested == "auto") && quantized(launch.kv_cache_dtype_resolved)) {
    launch.findings.push_back(
        {"kv-auto-quantized",
         Severity::warning,
         fmt::format(
             "{}: KV cache silently {} (requested '{}')", who, launch.kv_cache_dtype_resolved,
             launch.kv_cache_dtype_requested.empty() ? "auto" : launch.kv_cache_dtype_requested),
         "an FP8 cache without calibrated scales clips large keys and flushes small values",
         {{launch.resolved_evidence, "kv_cache_dtype", launch.kv_cache_dtype_resolved}},
         "pass --kv-cache-dtype bf16 (or auto with a checkpoint whose KV scales load) and verify "
         "with kvaudit logs --expect kv_cache_dtype=bf16",
         "ENGINE-FACTS §2: ModelOpt kv_cache_quant_algo FP8 under auto resolves to fp8_e4m3"});
  }
  // One evidence row per distinct message (each TP rank prints the same warning).
  std::vector<Evidence> scale_evidence;
  std::vector<int> repeats;
  for (const auto& msg : launch.scale_messages) {
    bool seen = false;
    for (size_t i = 0; i < scale_evidence.size(); ++i)
      if (scale_evidence[i].value == msg.text) seen = true, ++repeats[i];
    if (!seen)
      scale_evidence.push_back({line_ref(msg.line), msg.kind, msg.text}), repeats.push_back(1);
  }
  for (size_t i = 0; i < scale_evidence.size(); ++i)
    if (repeats[i] > 1) scale_evidence[i].key += fmt::format(" (x{}, once per rank)", repeats[i]);
  if (!launch.scale_fallback_reason.empty())
    scale_evidence.push_back({"launch", "scale_fallback", launch.scale_fallback_reason});
  if (launch.scale_fallback.value_or(false)) {
    launch.findings.push_back(
        {"fp8-unit-scale", Severity::critical,
         fmt::format("{}: {} KV cache with scale 1.0", who, launch.kv_cache_dtype_resolved),
         "keys above 448 clip (or turn into NaN) and values below 2^-6 lose "
         "precision: long-context recall suffers while benchmarks look fine",
         scale_evidence.empty()
             ? std::vector<Evidence>{{"launch", "scale_fallback", launch.scale_fallback_reason}}
             : scale_evidence,
         "serve with --kv-cache-dtype bf16, or ship calibrated k_scale/v_scale "
         "(kvaudit calibrate) that this engine version loads",
         "ENGINE-FACTS §3 (SGLang BaseKVCacheMethod, vLLM scale check)"});
  } else if (!launch.scale_fallback && quantized(launch.kv_cache_dtype_resolved)) {
    launch.findings.push_back(
        {"fp8-scale-unverified", Severity::warning,
         fmt::format("{}: {} KV cache, scales unverified", who, launch.kv_cache_dtype_resolved),
         "if the scales silently default to 1.0, accuracy drops on long context",
         scale_evidence.empty()
             ? std::vector<Evidence>{{"launch", "scale_fallback", launch.scale_fallback_reason}}
             : scale_evidence,
         "rerun with --checkpoint DIR (the checkpoint the launch served)",
         "sgl-project/sglang#31224 (warning fires even when scales load)"});
  }
  if (!launch.server_args_complete) {
    launch.findings.push_back(
        {"server-args-truncated",
         Severity::info,
         who + ": server_args line is cut short; fields after the cut are unknown",
         "",
         {{line_ref(launch.first_line), "server_args", "truncated"}},
         "",
         ""});
  }
}

Expectation parse_expectation(std::string_view text) {
  static const std::vector<std::string> keys = {
      "kv_cache_dtype", "kv_cache_dtype_requested", "scale_fallback", "engine", "tp",
      "ready",          "max_total_tokens"};
  size_t eq = text.find('=');
  if (eq == std::string_view::npos || eq == 0)
    throw InputError("--expect", fmt::format("'{}' is not KEY=VALUE", text));
  Expectation e{std::string(text.substr(0, eq)), std::string(text.substr(eq + 1))};
  if (std::find(keys.begin(), keys.end(), e.key) == keys.end()) {
    std::string known;
    for (const auto& k : keys) known += (known.empty() ? "" : ", ") + k;
    throw InputError("--expect", fmt::format("unknown key '{}' (known: {})", e.key, known));
  }
  return e;
}

std::vector<ExpectationResult> check_expectations(const Launch& launch,
                                                  const std::vector<Expectation>& expectations) {
  std::vector<ExpectationResult> results;
  for (const auto& e : expectations) {
    ExpectationResult r{e, "", false};
    if (e.key == "kv_cache_dtype") {
      r.actual = launch.kv_cache_dtype_resolved;
      r.met = !r.actual.empty() && plan::normalise_dtype_name(e.value) == r.actual;
    } else if (e.key == "kv_cache_dtype_requested") {
      r.actual = launch.kv_cache_dtype_requested;
      r.met = !r.actual.empty() &&
              plan::normalise_dtype_name(e.value) == plan::normalise_dtype_name(r.actual);
    } else if (e.key == "scale_fallback") {
      r.actual = launch.scale_fallback ? (*launch.scale_fallback ? "true" : "false") : "null";
      r.met = r.actual == e.value;
    } else if (e.key == "engine") {
      r.actual = launch.engine;
      r.met = r.actual == e.value;
    } else if (e.key == "tp") {
      r.actual = launch.tp > 0 ? std::to_string(launch.tp) : "";
      r.met = r.actual == e.value;
    } else if (e.key == "ready") {
      r.actual = launch.ready ? "true" : "false";
      r.met = r.actual == e.value;
    } else if (e.key == "max_total_tokens") {
      r.actual = launch.max_total_tokens ? std::to_string(*launch.max_total_tokens) : "";
      std::string v = e.value;
      bool at_least = v.rfind(">=", 0) == 0;
      if (at_least) v = v.substr(2);
      auto wanted = parse_token_count(v);
      if (!wanted) throw InputError("--expect", "max_total_tokens needs a token count: " + e.value);
      r.met = launch.max_total_tokens && (at_least ? *launch.max_total_tokens >= *wanted
                                                   : *launch.max_total_tokens == *wanted);
    }
    results.push_back(r);
  }
  return results;
}

void cross_check_checkpoint(Launch& launch, const checkpoint::ModelFacts& model, bool is_latest) {
  const std::string& dtype = launch.kv_cache_dtype_resolved;
  if (quantized(dtype) && model.has_weights && launch.scale_fallback != true) {
    if (model.kv_scales.empty() && launch.quantization_param_path.empty()) {
      launch.scale_fallback = true;
      launch.scale_fallback_reason = fmt::format(
          "the checkpoint ({} tensors) ships no k_scale/v_scale and the launch passed no "
          "--quantization-param-path: {} uses scale 1.0",
          model.tensor_count, launch.engine.empty() ? "the engine" : launch.engine);
    } else if (!model.kv_scales.empty()) {
      launch.scale_fallback_reason = fmt::format(
          "the checkpoint ships {} KV scale tensors; whether this {} version loads them for {} is "
          "what `kvaudit check` decides (known drops: sgl-project/sglang#39942, vllm#54623)",
          model.kv_scales.size(), launch.engine, model.architecture);
    }
  }
  add_findings(launch, is_latest);
  // Capacity: the printed count against plan's prediction from the printed memory.
  if (!launch.engine.empty() && !dtype.empty()) {
    try {
      plan::PlanOptions options;
      options.engine = launch.engine;
      plan::LogPrediction prediction = plan::predict_from_log(model, launch.memory, options);
      for (const auto& check : prediction.checks) {
        double mid = (check.predicted.lo + check.predicted.hi) / 2.0;
        double ratio = mid > 0 ? check.printed / mid : 0;
        launch.findings.push_back(
            {check.inside ? "capacity-as-planned" : "capacity-mismatch",
             check.inside ? Severity::info : Severity::warning,
             fmt::format(
                 "launch {}: {}: printed {} vs predicted [{}, {}] (observed / predicted {:.3f})",
                 launch.index + 1, check.what, with_thousands(check.printed),
                 with_thousands(check.predicted.lo), with_thousands(check.predicted.hi), ratio),
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
