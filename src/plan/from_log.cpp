// plan from a log: what a launch ran with (the log's figures reconciled with the flags), the
// release and KV dtype whose arithmetic applies, and the prediction of its pool model (the
// SGLang and vLLM arithmetic: from_log_pools.cpp).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "plan/plan.h"
#include "plan/pools.h"
#include "util/util.h"

namespace kvaudit::plan {

std::string interval_text(const TokenInterval& interval) {
  if (interval.empty())
    return fmt::format("none (no whole count rounds to the printed size: {} > {})", interval.lo,
                       interval.hi);
  return fmt::format("[{}, {}]", interval.lo, interval.hi);
}

void add_check(LogPrediction& out, std::string id, std::string what, int64_t printed,
               TokenInterval predicted, std::string derivation) {
  LogCheck check;
  check.id = std::move(id);
  check.what = std::move(what);
  check.printed = printed;
  check.predicted = predicted;
  check.inside = predicted.contains(printed);
  check.derivation = std::move(derivation);
  out.checks.push_back(std::move(check));
}

// The dtypes a from-log prediction compares: every dtype this release accepts.
std::vector<const engines::KvDtype*> comparable_dtypes(const engines::EngineModel& engine,
                                                       const engines::Version& version,
                                                       const engines::KvDtype& launch_dtype) {
  std::vector<const engines::KvDtype*> out = {&launch_dtype};
  for (const auto& cli : engines::kv_cache_dtype_choices(engine, version)) {
    const engines::KvDtype* dtype = engine.dtypes->find(engines::cli_dtype(engine, version, cli));
    if (!dtype || std::find(out.begin(), out.end(), dtype) != out.end()) continue;
    if (dtype->name == "fp16" && launch_dtype.name != "fp16") continue;
    out.push_back(dtype);
  }
  return out;
}

namespace {

// A flag that disagrees with the log: the log wins (it is what the engine ran), with a
// warning that names both.
void log_flag_conflict(LogSetup& out, const std::string& flag, const std::string& flag_value,
                       const std::string& key, const std::string& log_value,
                       const std::string& where) {
  out.findings.push_back(
      {"log-flag-conflict",
       report::Severity::warning,
       fmt::format("{} {} disagrees with the log, which says {} {}", flag, flag_value, key,
                   log_value),
       fmt::format("the log is what the engine ran, so plan used {} {}; a prediction from the "
                   "flag would describe another launch",
                   key, log_value),
       {{where.empty() ? "log" : where, key, log_value}, {"command line", flag, flag_value}},
       fmt::format("drop {} (the log decides it) or check that this is the launch you meant "
                   "(--launch N)",
                   flag),
       ""});
}

// A setting the log does not print, taken from the command line.
void note_from_flag(LogSetup& out, const std::string& what, const std::string& flag,
                    const std::string& value) {
  out.notes.push_back(
      fmt::format("the log does not print {}: {} {} from the command line", what, flag, value));
}

// Engine and release: printed, else the flags.
void reconcile_engine(const LoggedMemory& logged, const LogFlagOverrides& given, LogSetup& out) {
  if (!logged.engine.empty()) {
    if (given.engine && *given.engine != logged.engine)
      log_flag_conflict(out, "--engine", *given.engine, "engine", logged.engine, "");
    out.options.engine = logged.engine;
  } else if (given.engine) {
    out.memory.engine = out.options.engine = *given.engine;
    note_from_flag(out, "its engine", "--engine", *given.engine);
  }
  if (!logged.engine_version.empty() && engines::parse_version(logged.engine_version)) {
    if (given.engine_version && *given.engine_version != logged.engine_version)
      log_flag_conflict(out, "--engine-version", *given.engine_version, "version",
                        logged.engine_version, "");
    out.options.engine_version = logged.engine_version;
  } else if (given.engine_version) {
    out.options.engine_version = *given.engine_version;
  }
}

// Tensor parallelism: printed, else the flag (at least the ranks seen), else the ranks,
// else 1.
void reconcile_tp(const LoggedMemory& logged, const LogFlagOverrides& given, LogSetup& out) {
  if (logged.tp > 0) {
    if (given.tp && *given.tp != logged.tp)
      log_flag_conflict(out, "--tp", std::to_string(*given.tp), "tp", std::to_string(logged.tp),
                        logged.tp_source);
    out.options.parallel.tp = logged.tp;
  } else if (given.tp) {
    if (logged.tp_at_least > *given.tp)
      log_flag_conflict(out, "--tp", std::to_string(*given.tp), "ranks up to TP",
                        std::to_string(logged.tp_at_least - 1), "rank prefixes");
    out.memory.tp = out.options.parallel.tp = std::max(*given.tp, logged.tp_at_least);
    note_from_flag(out, "the TP size", "--tp", std::to_string(*given.tp));
  } else if (logged.tp_at_least > 1) {
    out.memory.tp = out.options.parallel.tp = logged.tp_at_least;
    // Ranks 0..n-1 all printing is the common case (every rank logs its memory); gaps
    // (workers 0, 2, 4, 6) mean an excerpt or a log level that hides ranks.
    const bool contiguous = logged.tp_ranks_contiguous;
    out.findings.push_back(
        {"log-tp-from-ranks",
         contiguous ? report::Severity::info : report::Severity::warning,
         fmt::format("the log prints no TP size: {} printed lines, so TP is at least {}; "
                     "sized at {}",
                     contiguous ? fmt::format("ranks 0 to {}", logged.tp_at_least - 1)
                                : fmt::format("ranks up to {} (with gaps)", logged.tp_at_least - 1),
                     logged.tp_at_least, logged.tp_at_least),
         "a larger TP holds more tokens per GPU; the prediction is for the smallest TP the "
         "ranks allow",
         {{"rank prefixes", "highest rank", std::to_string(logged.tp_at_least - 1)}},
         "pass --tp N (the launch's --tp-size / --tensor-parallel-size) to be sure",
         ""});
  } else {
    out.memory.tp = out.options.parallel.tp = 1;
    out.notes.push_back(
        "the log prints no TP size and no rank beyond TP0: sized at TP 1 (pass --tp if the "
        "launch used more GPUs)");
  }
}

// Pipeline and data parallelism and DP attention: printed, else the flags.
void reconcile_pp_dp(const LoggedMemory& logged, const LogFlagOverrides& given, LogSetup& out) {
  if (logged.pp > 0) {
    if (given.pp && *given.pp != logged.pp)
      log_flag_conflict(out, "--pp", std::to_string(*given.pp), "pp", std::to_string(logged.pp),
                        "");
    out.options.parallel.pp = logged.pp;
  } else if (given.pp) {
    out.memory.pp = out.options.parallel.pp = *given.pp;
    note_from_flag(out, "the PP size", "--pp", std::to_string(*given.pp));
  }
  if (logged.dp) {
    if (given.dp && *given.dp != *logged.dp)
      log_flag_conflict(out, "--dp", std::to_string(*given.dp), "dp", std::to_string(*logged.dp),
                        "");
    out.options.parallel.dp = *logged.dp;
  } else if (given.dp) {
    out.options.parallel.dp = *given.dp;
    note_from_flag(out, "the DP size", "--dp", std::to_string(*given.dp));
  }
  if (logged.dp_attention) {
    if (given.dp_attention && *given.dp_attention != *logged.dp_attention)
      log_flag_conflict(out, "--dp-attention", *given.dp_attention ? "on" : "off",
                        "enable_dp_attention", *logged.dp_attention ? "True" : "False", "");
    out.options.parallel.dp_attention = *logged.dp_attention;
  } else if (given.dp_attention) {
    out.options.parallel.dp_attention = *given.dp_attention;
    note_from_flag(out, "DP attention", "--dp-attention", *given.dp_attention ? "on" : "off");
  }
}

// The KV dtype the launch used and its Mamba state dtype: printed, else the flags.
void reconcile_dtypes(const engines::DtypeVocabulary& dtypes, const LoggedMemory& logged,
                      const PlanOptions& base, const LogFlagOverrides& given, LogSetup& out) {
  if (!logged.kv_cache_dtype.empty()) {
    if (given.kv_cache_dtype && dtypes.normalise(*given.kv_cache_dtype) != logged.kv_cache_dtype)
      log_flag_conflict(out, "--kv-cache-dtype", *given.kv_cache_dtype, "kv_cache_dtype",
                        logged.kv_cache_dtype, "");
  } else if (given.kv_cache_dtype) {
    out.memory.kv_cache_dtype = dtypes.normalise(*given.kv_cache_dtype);
    note_from_flag(out, "the KV dtype", "--kv-cache-dtype", *given.kv_cache_dtype);
  }
  if (!logged.mamba_ssm_dtype.empty()) {
    if (!base.mamba_ssm_dtype.empty() &&
        dtypes.normalise(base.mamba_ssm_dtype) != dtypes.normalise(logged.mamba_ssm_dtype))
      log_flag_conflict(out, "--mamba-ssm-dtype", base.mamba_ssm_dtype, "mamba_ssm_dtype",
                        logged.mamba_ssm_dtype, "");
    out.options.mamba_ssm_dtype = logged.mamba_ssm_dtype;
  }
  if (logged.max_num_batched_tokens)
    out.options.max_num_batched_tokens = logged.max_num_batched_tokens;
}

// The memory fraction: printed, else the flag, else the engine's default for the GPU (which
// depends on the parallelism reconciled before).
void reconcile_memory_fraction(const engines::Registry& registry, const LoggedMemory& logged,
                               const LogFlagOverrides& given, LogSetup& out) {
  if (logged.mem_fraction_static) {
    if (given.memory_fraction &&
        std::abs(*given.memory_fraction - *logged.mem_fraction_static) > 1e-9)
      log_flag_conflict(out, "--mem-fraction", fmt::format("{}", *given.memory_fraction),
                        "mem_fraction_static", fmt::format("{}", *logged.mem_fraction_static), "");
  } else if (given.memory_fraction) {
    out.options.memory_fraction = given.memory_fraction;
    note_from_flag(out, "mem_fraction_static", "--mem-fraction",
                   fmt::format("{}", *given.memory_fraction));
  } else if (out.options.gpu_memory_bytes && registry.find(out.options.engine)) {
    const engines::EngineModel& engine = registry.engine(out.options.engine);
    auto version = engines::parse_version(out.options.engine_version);
    const engines::MemFractionTable* table =
        version ? engine.capacity.mem_fraction_for(*version) : nullptr;
    if (table) {
      MemFractionDefault d = sglang_default_mem_fraction(
          *table, *out.options.gpu_memory_bytes / kMiB, out.options.parallel.tp,
          out.options.parallel.pp, out.options.parallel.dp_attention, out.options.parallel.dp);
      out.options.memory_fraction = d.mem_fraction_static;
      out.notes.push_back(
          fmt::format("mem_fraction_static not printed: the engine's default, {}", d.derivation));
    }
  }
}

}  // namespace

LogSetup reconcile_log_flags(const engines::Registry& registry, const LoggedMemory& logged,
                             const PlanOptions& base, const LogFlagOverrides& given) {
  LogSetup out;
  out.memory = logged;
  out.options = base;
  reconcile_engine(logged, given, out);
  reconcile_tp(logged, given, out);
  reconcile_pp_dp(logged, given, out);
  reconcile_dtypes(registry.dtypes(), logged, base, given, out);
  reconcile_memory_fraction(registry, logged, given, out);
  // The tiers the launch ran with (its args line), over any given beside --from-log.
  if (!logged.tier_settings.empty()) out.options.tier_settings = logged.tier_settings;
  return out;
}

LogPrediction predict_from_log(const engines::Registry& registry,
                               const checkpoint::ModelFacts& model, const LogSetup& setup) {
  LogPrediction out = predict_from_log(registry, model, setup.memory, setup.options);
  out.findings.insert(out.findings.begin(), setup.findings.begin(), setup.findings.end());
  out.notes.insert(out.notes.begin(), setup.notes.begin(), setup.notes.end());
  return out;
}

std::vector<const engines::KvDtype*> candidate_dtypes(const checkpoint::ModelFacts& model,
                                                      const engines::EngineModel& engine,
                                                      const engines::Version& version) {
  std::vector<const engines::KvDtype*> candidates;
  auto add = [&](const std::string& name) {
    const engines::KvDtype* dtype = engine.dtypes->find(name);
    if (dtype && std::find(candidates.begin(), candidates.end(), dtype) == candidates.end())
      candidates.push_back(dtype);
  };
  add(engines::served_model_dtype(*engine.dtypes, model, engines::LaunchFlags{}));
  for (const auto& cli : engines::kv_cache_dtype_choices(engine, version))
    add(engines::cli_dtype(engine, version, cli));
  return candidates;
}

namespace {

// The checks whose predicted interval depends on the KV dtype's size.
bool dtype_sized_check(const std::string& id) {
  return id == "sglang_pool_size" || id == "sglang_max_total_num_tokens" ||
         id == "vllm_num_gpu_blocks" || id == "vllm_gpu_kv_cache_size" || id == "trtllm_max_tokens";
}

// A log that names no KV dtype ('auto' with no dtype line) but prints sizes: the dtypes the
// release accepts (the model's own first) whose bytes per token put every printed size inside
// its interval. Dtypes of one size (bf16 and fp16, the FP8 formats) cannot be told apart by
// size: the first is used and the evidence names the others.
std::string dtype_from_sizes(const checkpoint::ModelFacts& model, const LoggedMemory& logged,
                             const PlanOptions& options, const engines::EngineModel& engine,
                             const PoolModel& pool, std::string& evidence) {
  const auto parsed = engines::parse_version(
      !logged.engine_version.empty() ? logged.engine_version : options.engine_version);
  const engines::Version version = parsed ? *parsed
                                          : engines::parse_version(engine.latest_known_version)
                                                .value_or(engines::Version{0, 0, 0, true});
  const std::vector<const engines::KvDtype*> candidates = candidate_dtypes(model, engine, version);
  std::vector<const engines::KvDtype*> matches;
  std::vector<std::string> figures;
  for (const engines::KvDtype* dtype : candidates) {
    LoggedMemory trial = logged;
    trial.kv_cache_dtype = dtype->name;
    LogPrediction p;
    try {
      pool.predict_from_log(model, trial, options, engine, version, p);
    } catch (const InputError&) {
      continue;
    }
    bool sized = false, inside = true;
    std::vector<std::string> seen;
    for (const LogCheck& c : p.checks) {
      if (!dtype_sized_check(c.id)) continue;
      sized = true;
      inside = inside && c.inside;
      seen.push_back(fmt::format("{} {}", c.what, c.printed));
    }
    if (sized && inside) matches.push_back(dtype), figures = seen;
  }
  if (matches.empty()) return "";
  for (const engines::KvDtype* m : matches)
    if (m->key_bits != matches.front()->key_bits ||
        m->block_elements != matches.front()->block_elements)
      return "";  // sizes that differ both fit: the figures do not decide
  std::vector<std::string> same;
  for (size_t i = 1; i < matches.size(); ++i) same.push_back(matches[i]->name);
  evidence = fmt::format(
      "KV cache dtype {} derived, not printed: the log names none, and only this size ({} bits "
      "per element) puts {} inside its interval for this model{}",
      matches.front()->name, matches.front()->key_bits, fmt::join(figures, ", "),
      same.empty() ? std::string()
                   : fmt::format(" ({} has the same size: the figures cannot tell them apart)",
                                 fmt::join(same, ", ")));
  return matches.front()->name;
}

}  // namespace

LogPrediction predict_from_log(const engines::Registry& registry,
                               const checkpoint::ModelFacts& model, const LoggedMemory& logged,
                               const PlanOptions& options) {
  if (!registry.find(logged.engine))
    throw InputError("--from-log",
                     fmt::format("the log is not a start-up log of a known engine ({})",
                                 fmt::join(registry.names(), ", ")));
  LoggedMemory filled = logged;
  const engines::EngineModel& engine = registry.engine(filled.engine);
  const PoolModel& pool = pool_model(engine);
  if (filled.kv_cache_dtype.empty() && !options.kv_cache_dtypes.empty())
    filled.kv_cache_dtype = registry.dtypes().normalise(options.kv_cache_dtypes.front());
  std::string dtype_evidence;
  if (filled.kv_cache_dtype.empty() && pool.dtype_from_log) {
    auto version = engines::parse_version(!filled.engine_version.empty() ? filled.engine_version
                                                                         : options.engine_version);
    filled.kv_cache_dtype =
        pool.dtype_from_log(model, filled, options, engine,
                            version ? *version : engines::Version{0, 0, 0, true}, dtype_evidence);
  }
  if (filled.kv_cache_dtype.empty())
    filled.kv_cache_dtype = dtype_from_sizes(model, filled, options, engine, pool, dtype_evidence);
  if (filled.kv_cache_dtype.empty())
    throw InputError(
        "--from-log",
        "the log does not say which KV cache dtype the launch used, and its sizes do not decide "
        "it (pass --kv-cache-dtype)");
  auto run = [&](const engines::Version& version) {
    LogPrediction prediction;
    pool.predict_from_log(model, filled, options, engine, version, prediction);
    if (!dtype_evidence.empty()) prediction.notes.insert(prediction.notes.begin(), dtype_evidence);
    return prediction;
  };
  auto all_inside = [](const LogPrediction& p) {
    return std::all_of(p.checks.begin(), p.checks.end(),
                       [](const LogCheck& c) { return c.inside; });
  };
  // The release whose arithmetic applies: the log's, else the one the user named; else
  // each set of defaults the engine data distinguishes, newest first, and the first whose
  // arithmetic reproduces every printed figure.
  std::string version_text =
      !filled.engine_version.empty() && engines::parse_version(filled.engine_version)
          ? filled.engine_version
          : options.engine_version;
  LogPrediction out;
  if (!version_text.empty()) {
    auto version = engines::parse_version(version_text);
    if (!version)
      throw InputError("--engine-version", "cannot read version '" + version_text + "'");
    out = run(*version);
  } else {
    const std::vector<engines::Version> boundaries = engines::boundary_versions(engine);
    std::vector<std::pair<engines::Version, std::string>> candidates;
    for (auto d = engine.defaults.rbegin(); d != engine.defaults.rend(); ++d)
      for (auto v = boundaries.rbegin(); v != boundaries.rend(); ++v)
        if (d->versions.contains(*v)) {
          candidates.push_back({*v, d->versions.text});
          break;
        }
    bool matched = false;
    for (const auto& [version, range] : candidates) {
      LogPrediction p = run(version);
      if (!p.checks.empty() && all_inside(p)) {
        p.notes.push_back(fmt::format(
            "the log prints no {} version: its figures match the arithmetic of releases {}",
            engine.engine, range));
        out = std::move(p);
        matched = true;
        break;
      }
    }
    if (!matched) {
      out = run(candidates.empty() ? engines::Version{0, 0, 0, true} : candidates.front().first);
      if (candidates.size() > 1 && !out.checks.empty())
        out.notes.push_back(fmt::format(
            "the log prints no {} version and no release's arithmetic reproduces every printed "
            "figure; shown: the newest ({})",
            engine.engine, candidates.front().second));
    }
  }
  if (out.checks.empty() && out.rows.empty())
    throw InputError("--from-log", "the log has no memory or capacity figures plan can check");
  return out;
}

}  // namespace kvaudit::plan
