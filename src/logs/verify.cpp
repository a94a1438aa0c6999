// logs verify: findings per launch and --expect checks. The cross-check with the checkpoint
// the launch served is in cross_check.cpp.
#include <fmt/format.h>

#include <cmath>
#include <limits>

#include <algorithm>
#include <map>
#include <set>

#include "audit/audit.h"
#include "logs/logs.h"
#include "logs/parse.h"
#include "util/util.h"

namespace kvaudit::logs {

namespace {

using engines::LogKind;
using report::Evidence;
using report::Finding;
using report::Severity;

std::string line_ref(int64_t line) {
  return fmt::format("log:{}", line);
}

}  // namespace

namespace {

// Crashes, out-of-memory, errors after ready, a launch that never became ready.
void add_failure_findings(Launch& launch, const std::string& who, bool is_latest,
                          const std::string& ready_advice) {
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
         ready_advice,
         ""});
  }
}

// The engine lowered max_running_requests: by the mamba state cache (SGLang says so, with
// its slots), or "due to the available KV cache capacity", a cause that on a hybrid may be
// the state pool (sgl-project/sglang PR #32360). Requests beyond the cap queue, while
// /get_server_info keeps reporting the launch value (sglang#38846).
void add_concurrency_findings(const engines::Registry& registry, Launch& launch,
                              const std::string& who) {
  if (!launch.running_requests_cap) return;
  const RunningRequestsCap& cap = *launch.running_requests_cap;
  std::optional<int64_t> requested = cap.requested;
  if (!requested && launch.server_args.is_object()) {
    const auto it = launch.server_args.find("max_running_requests");
    if (it != launch.server_args.end() && it->is_number_integer()) requested = it->get<int64_t>();
  }
  std::vector<Evidence> evidence = {
      {line_ref(cap.line), "max_running_requests", std::to_string(cap.effective)}};
  if (requested && !cap.requested)
    evidence.push_back({line_ref(launch.server_args_line), "server_args max_running_requests",
                        std::to_string(*requested)});
  const Severity severity =
      requested && *requested > cap.effective ? Severity::warning : Severity::info;
  const std::string asked = requested ? fmt::format(" ({} asked)", *requested) : std::string();
  const std::string consequence = fmt::format(
      "requests beyond {} queue instead of running; SGLang's /get_server_info keeps reporting "
      "the launch value, so a load test against it measures the queue",
      cap.effective);
  if (cap.by == "mamba state cache" && cap.state_slots && cap.slots_per_request) {
    const std::string pool_size =
        requested && *requested > cap.effective
            ? fmt::format("{} ({} x {})", *requested * *cap.slots_per_request, *requested,
                          *cap.slots_per_request)
            : fmt::format("N x {} for N requests", *cap.slots_per_request);
    evidence.push_back({line_ref(cap.line), "max_mamba_cache_size / state slots per request",
                        fmt::format("{} / {}", *cap.state_slots, *cap.slots_per_request)});
    launch.findings.push_back(
        {"running-requests-capped-by-state", severity,
         fmt::format("{} runs at most {} requests at once{}: the mamba state cache holds {} slots "
                     "at {} per request",
                     who, cap.effective, asked, *cap.state_slots, *cap.slots_per_request),
         consequence, evidence,
         fmt::format("size the state pool for the concurrency wanted: --max-mamba-cache-size {} "
                     "(the KV pool shrinks by as much: check with kvaudit plan), or raise "
                     "--mamba-full-memory-ratio, or halve the state with --mamba-ssm-dtype "
                     "bfloat16 where the model tolerates it",
                     pool_size),
         "sgl-project/sglang mem_cache/kv_cache_configurator.py resolve_max_num_reqs; "
         "sglang#38846"});
    return;
  }
  // "due to the available KV cache capacity": check the cause against the state pool when the
  // log printed one and this release's slot rules say how many slots a request holds.
  std::string cause = "the KV cache capacity, as the line says";
  if (launch.memory.mamba_slots && *launch.memory.mamba_slots > 0) {
    const engines::EngineModel* engine = registry.find(launch.engine);
    const auto version = engines::parse_version(launch.engine_version.empty() && engine
                                                    ? engine->latest_known_version
                                                    : launch.engine_version);
    if (engine && version)
      if (const engines::MambaSlotRules* rules = engine->mamba_slots_for(*version))
        for (const auto& [strategy, slots] : rules->slots)
          if (slots > 0 && *launch.memory.mamba_slots / slots == cap.effective) {
            cause = fmt::format(
                "probably the mamba state pool, not the KV cache: {} state slots / {} per "
                "request ({}) = {}",
                *launch.memory.mamba_slots, slots, strategy, cap.effective);
            evidence.push_back(
                {"launch", "max_mamba_cache_size", std::to_string(*launch.memory.mamba_slots)});
            break;
          }
  }
  launch.findings.push_back(
      {"running-requests-reduced", severity,
       fmt::format("{} runs at most {} requests at once{}: bound by {}", who, cap.effective, asked,
                   cause),
       consequence, evidence,
       "raise the limit that binds (for a hybrid's state pool: --max-mamba-cache-size or "
       "--mamba-full-memory-ratio; for the KV pool: --mem-fraction-static or a smaller "
       "--context-length), or lower --max-running-requests to what runs",
       "sgl-project/sglang mem_cache/kv_cache_configurator.py resolve_max_num_reqs; PR #32360 "
       "(the message names the KV cache when the state pool binds)"});
}

// What the KV cache resolved to and whether its scales fell back to 1.0.
void add_kv_findings(const engines::Registry& registry, Launch& launch, const std::string& who) {
  auto quantized = [&](const std::string& dtype) { return registry.dtypes().is_quantized(dtype); };
  std::string requested = registry.dtypes().normalise(launch.kv_cache_dtype_requested);
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
         "auto follows the checkpoint's kv_cache_quant_algo: SGLang configure_kv_cache_dtype "
         "(python/sglang/srt/mem_cache/kv_cache_dtype.py), vLLM get_kv_cache_quant_algo_string "
         "(vllm/utils/torch_utils.py)"});
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
    // The same finding check reports, in the same words, for the release the log printed
    // (else the newest known one); the evidence is the log's own lines.
    audit::UnitScaleText text{
        "keys above 448 clip (or turn into NaN) and values below 2^-6 lose precision: "
        "long-context recall suffers while benchmarks look fine",
        "serve with --kv-cache-dtype bf16, or ship calibrated k_scale/v_scale (kvaudit "
        "calibrate) that this engine version loads",
        ""};
    if (const engines::EngineModel* known = registry.find(launch.engine)) {
      const engines::EngineModel& engine = *known;
      const auto printed = engines::parse_version(launch.engine_version);
      const auto version = printed && !launch.engine_version.empty()
                               ? printed
                               : engines::parse_version(engine.latest_known_version);
      if (version) text = audit::unit_scale_text(engine, *version, launch.kv_cache_dtype_resolved);
    }
    // Severity as check judges it: scales the checkpoint shipped and the engine dropped
    // (the log shows the drop) are critical unless permissive; a cache that simply has no
    // scales follows --kv-policy, and a log says nothing about the model's K/V range.
    const bool dropped = std::any_of(
        launch.scale_messages.begin(), launch.scale_messages.end(),
        [](const LogEvent& msg) { return msg.message_kind == LogKind::scale_not_loaded; });
    const audit::KvPolicy policy = launch.kv_policy;
    Severity severity = Severity::warning;
    std::string basis = "none", judged_on;
    if (policy == audit::KvPolicy::lossless) {
      severity = Severity::critical;
      judged_on = "--kv-policy lossless: any quantized KV cache is critical";
    } else if (dropped) {
      severity = policy == audit::KvPolicy::permissive ? Severity::warning : Severity::critical;
      basis = "engine";
      judged_on =
          "the log shows the engine dropping KV scales the checkpoint ships: they are not "
          "applied as shipped";
    } else {
      severity = policy == audit::KvPolicy::permissive ? Severity::info : Severity::warning;
      judged_on =
          "a log proves the scale, not this model's K/V range: rerun with --checkpoint DIR, "
          "or run kvaudit check with --kv-stats, to judge the damage";
    }
    report::Finding finding{
        "fp8-unit-scale",
        severity,
        fmt::format("{}: {} KV cache with scale 1.0", who, launch.kv_cache_dtype_resolved),
        text.consequence,
        scale_evidence.empty()
            ? std::vector<Evidence>{{"launch", "scale_fallback", launch.scale_fallback_reason}}
            : scale_evidence,
        text.fix,
        text.reference};
    finding.basis = basis;
    finding.judged_on = judged_on;
    launch.findings.push_back(std::move(finding));
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
}

// What the log could not say: a dtype taken by rule, a cut server_args line.
// Figures of one launch that the engine's own arithmetic ties together, checked against each
// other (SGLang: each rank's "mem usage" is its free memory before the load minus after it,
// all three printed to two decimals; every rank's pool has the same #tokens, sized from the
// minimum free memory over the world group). One that fails means lines of two runs, or an
// edited excerpt, and any capacity read from them is suspect.
std::vector<std::string> figure_contradictions(const Launch& launch, std::vector<int64_t>& lines) {
  std::vector<std::string> out;
  bool pipeline = false;
  for (const auto& [rank, f] : launch.figures_by_rank) {
    pipeline |= rank.find("PP") != std::string::npos;
    const std::string who = rank.empty() ? "the process" : rank;
    if (!f.free_before_gib || !f.free_after_gib) continue;
    const double fell = *f.free_before_gib - *f.free_after_gib;
    if (fell < -0.01) {
      out.push_back(
          fmt::format("{} had more memory free after its weights load ({:.2f} GiB, line "
                      "{}) than before it ({:.2f} GiB, line {})",
                      who, *f.free_after_gib, f.end_line, *f.free_before_gib, f.begin_line));
      lines.insert(lines.end(), {f.begin_line, f.end_line});
    } else if (f.usage_gib && std::abs(*f.usage_gib - fell) > 0.015 + 1e-9) {
      // Three figures rounded to 0.01 each: the difference is off by at most 0.015.
      out.push_back(
          fmt::format("{}'s weights load printed mem usage {:.2f} GiB (line {}), but its "
                      "free memory fell by {:.2f} GiB ({:.2f} at line {} to {:.2f}), "
                      "and the engine prints that difference",
                      who, *f.usage_gib, f.end_line, fell, *f.free_before_gib, f.begin_line,
                      *f.free_after_gib));
      lines.insert(lines.end(), {f.begin_line, f.end_line});
    }
  }
  // Pool sizes across ranks, pool by pool in print order (a hybrid prints one per pool). Under
  // pipeline parallelism each stage sizes its own layers: not compared.
  if (!pipeline && launch.engine != "trtllm") {
    for (size_t k = 0; k < 8; ++k) {
      std::vector<std::string> seen;
      std::set<int64_t> values;
      int64_t first_line = 0;
      for (const auto& [rank, f] : launch.figures_by_rank)
        if (k < f.pool_tokens.size()) {
          values.insert(f.pool_tokens[k].first);
          seen.push_back(fmt::format("{} {} (line {})", rank.empty() ? "unprefixed" : rank,
                                     f.pool_tokens[k].first, f.pool_tokens[k].second));
          if (!first_line) first_line = f.pool_tokens[k].second;
        }
      if (values.size() > 1) {
        out.push_back(
            fmt::format("the ranks' KV pools differ in #tokens ({}), where the engine "
                        "sizes every rank's pool from the smallest free memory of all",
                        fmt::join(seen, ", ")));
        lines.push_back(first_line);
      }
    }
  }
  return out;
}

void add_reading_findings(Launch& launch, const std::string& who) {
  std::vector<int64_t> contradiction_lines;
  if (auto contradictions = figure_contradictions(launch, contradiction_lines);
      !contradictions.empty()) {
    std::vector<report::Evidence> evidence;
    std::sort(contradiction_lines.begin(), contradiction_lines.end());
    contradiction_lines.erase(std::unique(contradiction_lines.begin(), contradiction_lines.end()),
                              contradiction_lines.end());
    for (int64_t line : contradiction_lines)
      if (evidence.size() < 6) evidence.push_back({line_ref(line), "memory figures", ""});
    launch.findings.push_back(
        {"log-figures-inconsistent", Severity::warning,
         fmt::format("{}: the log's own memory figures contradict each other", who),
         fmt::format("{}; lines of two runs mixed, or an edited excerpt: capacity read from these "
                     "figures is suspect",
                     fmt::join(contradictions, "; ")),
         evidence,
         "take the figures from one run's complete log (journalctl -u UNIT -b -o cat, or the "
         "run's own log file); a run whose start-up lines were cut is split only when its weights "
         "load shows it",
         ""});
  }

  if (launch.resolved_inferred) {
    launch.findings.push_back(
        {"kv-dtype-inferred",
         Severity::info,
         fmt::format("{}: KV cache taken as {}: no line names the cache's dtype", who,
                     launch.kv_cache_dtype_resolved),
         "both engines follow the model dtype under auto unless the checkpoint declares a "
         "quantized KV cache (ModelOpt kv_cache_quant_algo, a compressed-tensors "
         "kv_cache_scheme); older SGLang pools do not print their dtype, so the log alone "
         "cannot rule that out",
         {{launch.resolved_evidence.empty() ? "launch" : "log", "kv_cache_dtype",
           launch.resolved_evidence}},
         "pass --checkpoint DIR (the checkpoint the launch served) to decide it",
         ""});
  }
  if (!launch.server_args_complete && launch.server_args.is_object()) {
    // The fields a verdict needs that the cut took away.
    std::vector<std::string> lost;
    for (const char* key : {"tp_size", "kv_cache_dtype", "dtype", "mem_fraction_static",
                            "context_length", "quantization", "quantization_param_path",
                            "page_size", "dp_size", "enable_dp_attention", "max_total_tokens"})
      if (!launch.server_args.contains(key)) lost.push_back(key);
    launch.findings.push_back(
        {"server-args-cut",
         Severity::info,
         fmt::format("{}: the server_args line is cut or elided ({} place{}); {} fields read "
                     "around the cuts",
                     who, std::max(1, launch.server_args_cuts),
                     launch.server_args_cuts > 1 ? "s" : "", launch.server_args.size()),
         lost.empty() ? "every field a verdict needs was read"
                      : fmt::format("not printed in what is left: {}; the report says "
                                    "where each of those came from instead",
                                    fmt::join(lost, ", ")),
         {{line_ref(launch.server_args_line), "server_args",
           "cut (journalctl ellipsis, a pasted "
           "'...', or a truncated line)"}},
         "read the whole line: journalctl --no-pager -o cat (or -a), or the unit's log file",
         ""});
  }
}

}  // namespace

void add_findings(const engines::Registry& registry, Launch& launch, bool is_latest) {
  launch.findings.clear();
  const std::string who =
      fmt::format("launch {} ({})", launch.index + 1,
                  launch.start_time.empty() ? "no timestamp" : launch.start_time);
  // The ready line of the launch's engine (of every engine when it is unknown), from the data.
  std::vector<std::string> ready_lines;
  for (const std::string& name : registry.names()) {
    if (!launch.engine.empty() && name != launch.engine) continue;
    for (const auto& log : registry.engine(name).log_templates)
      if (log.kind == engines::LogKind::ready) {
        const std::string line = fmt::format("'{}' ({})", log.text, name);
        if (std::find(ready_lines.begin(), ready_lines.end(), line) == ready_lines.end())
          ready_lines.push_back(line);
      }
  }
  const std::string ready_advice =
      ready_lines.empty() ? "look for the error that stopped it"
                          : fmt::format("wait for {}, or look for the error that stopped it",
                                        fmt::join(ready_lines, " or "));
  add_failure_findings(launch, who, is_latest, ready_advice);
  add_kv_findings(registry, launch, who);
  add_concurrency_findings(registry, launch, who);
  add_tier_findings(launch, who);
  add_reading_findings(launch, who);
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

std::vector<ExpectationResult> check_expectations(const engines::Registry& registry,
                                                  const Launch& launch,
                                                  const std::vector<Expectation>& expectations) {
  std::vector<ExpectationResult> results;
  for (const auto& e : expectations) {
    ExpectationResult r{e, "", false};
    if (e.key == "kv_cache_dtype") {
      r.actual = launch.kv_cache_dtype_resolved;
      r.met = !r.actual.empty() && registry.dtypes().normalise(e.value) == r.actual;
    } else if (e.key == "kv_cache_dtype_requested") {
      r.actual = launch.kv_cache_dtype_requested;
      r.met = !r.actual.empty() &&
              registry.dtypes().normalise(e.value) == registry.dtypes().normalise(r.actual);
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
      // N, >=N, or LO..HI (the interval check and plan print for a launch's memory).
      std::string v = e.value;
      const bool at_least = v.rfind(">=", 0) == 0;
      if (at_least) v = v.substr(2);
      std::optional<int64_t> lo, hi;
      if (size_t dots = v.find(".."); dots != std::string::npos) {
        lo = parse_token_count(v.substr(0, dots));
        hi = parse_token_count(v.substr(dots + 2));
        if (!lo || !hi || *lo > *hi || at_least)
          throw InputError("--expect",
                           "max_total_tokens range must read LO..HI with LO <= HI: " + e.value);
      } else {
        lo = parse_token_count(v);
        if (!lo)
          throw InputError("--expect",
                           "max_total_tokens needs a token count (N, >=N or LO..HI): " + e.value);
        hi = at_least ? std::numeric_limits<int64_t>::max() : *lo;
      }
      r.met = launch.max_total_tokens && *lo <= *launch.max_total_tokens &&
              *launch.max_total_tokens <= *hi;
    }
    results.push_back(r);
  }
  return results;
}

}  // namespace kvaudit::logs
