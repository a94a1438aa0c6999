// plan from a log: run the engines' arithmetic on the memory figures a launch
// printed. Logs round GiB to two decimals, so every printed figure stands for an
// interval of +-0.005 GiB; the predicted token count is the exact image of those
// intervals under the engine's (monotone, piecewise) formula, never a fudge factor.
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

namespace {

constexpr long double kHalfCent = 0.005L;  // half the last printed decimal, in GiB

long double to_bytes(long double gib_value) {
  return gib_value * static_cast<long double>(kGiB);
}

struct SglangSetup {
  CellSize cell;
  std::optional<MambaState> mamba;
  double mamba_ratio = 0.9;
  int page_size = 1;
  std::optional<int64_t> cap;
  std::optional<int64_t> fixed_slots;
  double swa_ratio = 0.8;
};

int64_t sglang_tokens(long double rest_bytes, const SglangSetup& s, std::optional<int64_t> slots) {
  int64_t rest = static_cast<int64_t>(std::floor(rest_bytes));
  auto pools = sglang_pools(rest, s.cell, s.mamba, s.mamba_ratio, s.page_size, s.cap,
                            slots ? slots : s.fixed_slots, s.swa_ratio);
  return pools.max_total_tokens;
}

// Exact range of SGLang's token count for rest memory anywhere in [lo, hi] bytes.
// Without a printed slot count the Mamba reservation is a staircase, so the extremes
// sit at the interval ends and on either side of each step.
TokenInterval sglang_interval(long double lo, long double hi, const SglangSetup& s) {
  TokenInterval out{sglang_tokens(lo, s, std::nullopt), sglang_tokens(hi, s, std::nullopt)};
  if (s.mamba && !s.fixed_slots && s.mamba->bytes_per_request > 0) {
    const long double c = s.mamba_ratio / (1.0L + s.mamba_ratio);
    const long double per = static_cast<long double>(s.mamba->bytes_per_request);
    int64_t first = static_cast<int64_t>(std::floor(lo * c / per)) + 1;
    int64_t last = static_cast<int64_t>(std::floor(hi * c / per));
    for (int64_t k = first; k <= last && k - first < 100000; ++k) {
      long double step = k * per / c;
      out.lo = std::min(out.lo, sglang_tokens(step, s, k));
      out.hi = std::max(out.hi, sglang_tokens(step, s, k - 1));
    }
  }
  if (out.lo > out.hi) std::swap(out.lo, out.hi);
  return out;
}

}  // namespace

// Token counts whose printed GiB size rounds to `printed` (two decimals), given
// bytes_per_token and the engine's `padding_tokens` extra rows.
TokenInterval tokens_from_printed_size(double printed, int64_t bytes_per_token,
                                       int64_t padding_tokens) {
  long double lo = to_bytes(printed - kHalfCent) / bytes_per_token;
  long double hi = to_bytes(printed + kHalfCent) / bytes_per_token;
  return {static_cast<int64_t>(std::ceil(lo)) - padding_tokens,
          static_cast<int64_t>(std::floor(hi)) - padding_tokens};
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

void predict_sglang(const checkpoint::ModelFacts& model, const LoggedMemory& logged,
                    const PlanOptions& options, const engines::EngineModel& engine,
                    const engines::Version& version, LogPrediction& out) {
  Parallelism parallel = options.parallel;
  parallel.tp = logged.tp > 0 ? logged.tp : parallel.tp;
  parallel.pp = logged.pp > 0 ? logged.pp : parallel.pp;
  const engines::EngineDefaults& defaults = engine.defaults_for(version);
  const SizingRules rules = sizing_rules(model, engine, version, options);
  const engines::KvDtype& launch_dtype = plan_dtype(engine, version, logged.kv_cache_dtype);
  SglangSetup setup;
  setup.mamba = sglang_mamba_state(model, parallel, rules);
  setup.mamba_ratio = logged.mamba_full_memory_ratio.value_or(
      options.mamba_full_memory_ratio.value_or(defaults.mamba_full_memory_ratio.value_or(0.9)));
  setup.page_size =
      logged.page_size.value_or(options.page_size.value_or(defaults.page_size.value_or(1)));
  if (!logged.page_size && !options.page_size && defaults.dsa_page_size && model.mla &&
      model.mla->index_head_dim > 0) {
    setup.page_size = *defaults.dsa_page_size;
    out.assumed_page_size = setup.page_size;
    out.notes.push_back(fmt::format(
        "page size {}: SGLang sets it for DeepSeek DSA/NSA models on CUDA (the log prints no "
        "page size; pass --page-size for ROCm or XPU launches)",
        setup.page_size));
  }
  setup.cap = logged.max_total_tokens_arg;
  setup.fixed_slots = logged.mamba_slots;
  setup.swa_ratio = defaults.swa_full_tokens_ratio.value_or(0.8);
  setup.cell = sglang_cell_size(model, launch_dtype, parallel, rules);
  const long double mm = static_cast<long double>(rules.mm_reservation_bytes);

  std::optional<double> fraction = logged.mem_fraction_static;
  if (!fraction) fraction = options.memory_fraction;
  const bool have_memory =
      logged.total_before_load_gib && logged.avail_after_weights_gib && fraction;
  long double rest_lo = 0, rest_hi = 0;
  if (have_memory) {
    const long double T = *logged.total_before_load_gib, A = *logged.avail_after_weights_gib;
    const long double keep = 1.0L - *fraction;
    rest_lo = to_bytes((A - kHalfCent) - (T + kHalfCent) * keep) - mm;
    rest_hi = to_bytes((A + kHalfCent) - (T - kHalfCent) * keep) - mm;
    TokenInterval predicted = sglang_interval(rest_lo, rest_hi, setup);
    std::string derivation = fmt::format(
        "rest = {:.2f} (+-0.005) - {:.2f} (+-0.005) x (1 - {}){} = [{:.4f}, {:.4f}] GiB; cell {} "
        "B/token ({}){}; tokens in {}",
        *logged.avail_after_weights_gib, *logged.total_before_load_gib, *fraction,
        mm > 0 ? fmt::format(" - multimodal reservation {:.2f} GiB", static_cast<double>(mm / kGiB))
               : std::string(),
        rest_lo / kGiB, rest_hi / kGiB, setup.cell.bytes_per_token, launch_dtype.name,
        setup.mamba ? fmt::format(", Mamba {} B/request{}", setup.mamba->bytes_per_request,
                                  logged.mamba_slots
                                      ? fmt::format(" x {} printed slots", *logged.mamba_slots)
                                      : std::string(" (slots from the ratio)"))
                    : std::string(),
        interval_text(predicted));
    std::optional<int64_t> printed =
        logged.max_total_num_tokens ? logged.max_total_num_tokens : logged.pool_tokens;
    if (printed)
      add_check(out, "sglang_max_total_num_tokens",
                "max_total_num_tokens from the printed memory figures", *printed, predicted,
                derivation);
    if (!logged.mem_fraction_static)
      out.notes.push_back(fmt::format("mem_fraction_static not printed: used {}", *fraction));
  } else {
    out.notes.push_back(
        "the log lacks 'Load weight begin/end' memory or mem_fraction_static: token count not "
        "reproduced from memory, only the pool sizes are checked");
  }

  // The pool line: per-token K (or MLA KV) bytes checked against the printed size.
  if (logged.pool_tokens && setup.cell.swa_layers == 0) {
    const int64_t n = *logged.pool_tokens;
    int64_t k_bytes_per_token = 0;
    std::optional<double> printed_gib;
    std::string label;
    if (model.mla && logged.kv_gib) {
      k_bytes_per_token = setup.cell.bytes_per_token, printed_gib = logged.kv_gib,
      label = "KV size";
    } else if (logged.k_gib && launch_dtype.block_elements == 0) {
      int64_t k_dim = 0;
      for (const auto& layer : model.layers)
        if (checkpoint::holds_kv_cache(layer.kind)) k_dim = layer.k_head_dim;
      k_bytes_per_token = static_cast<int64_t>(setup.cell.kv_heads_per_rank) * k_dim *
                          std::max(1, launch_dtype.key_bits / 8) * setup.cell.full_layers;
      printed_gib = logged.k_gib, label = "K size";
    }
    if (printed_gib && k_bytes_per_token > 0) {
      // SGLang's buffers hold size + page_size rows (kv_buffer_padding_pages pages).
      const int64_t padding =
          static_cast<int64_t>(setup.page_size) * engine.capacity.kv_buffer_padding_pages;
      TokenInterval from_size = tokens_from_printed_size(*printed_gib, k_bytes_per_token, padding);
      add_check(out, "sglang_pool_size", fmt::format("#tokens against the printed {}", label), n,
                from_size,
                fmt::format("{} {:.2f} GiB = (#tokens + {} padding rows) x {} B/token ({} layers); "
                            "tokens in {}",
                            label, *printed_gib, padding, k_bytes_per_token, setup.cell.full_layers,
                            interval_text(from_size)));
    }
  }
  if (setup.mamba && logged.mamba_slots && logged.ssm_gib) {
    // MambaPool allocates max_mamba_cache_size + padding slots (slot 0 pads).
    const int64_t per_slot = setup.mamba->ssm_bytes_per_layer * setup.mamba->linear_layers;
    const int64_t padding = engine.capacity.mamba_pool_padding_slots;
    TokenInterval slots = tokens_from_printed_size(*logged.ssm_gib, per_slot, padding);
    add_check(out, "sglang_mamba_ssm_size",
              "max_mamba_cache_size against the printed ssm_state size", *logged.mamba_slots, slots,
              fmt::format("ssm_state {:.2f} GiB = (slots + {}) x {} B x {} layers; slots in {}",
                          *logged.ssm_gib, padding, setup.mamba->ssm_bytes_per_layer,
                          setup.mamba->linear_layers, interval_text(slots)));
  }

  // Requests at once: the state pool at its slots per request (as printed, else this
  // release's rule for the launch's strategy) bounds the max_running_requests printed.
  if (logged.mamba_slots && logged.max_running_requests) {
    int64_t slots = 0;
    std::string how;
    if (logged.state_slots_per_request) {
      slots = *logged.state_slots_per_request;
      how = "printed by the engine";
    } else if (const engines::MambaSlotRules* slot_rules = engine.mamba_slots_for(version)) {
      engines::MambaSlotInputs in;
      in.strategy = logged.mamba_radix_cache_strategy;
      in.disable_radix_cache = logged.disable_radix_cache;
      in.disable_overlap_schedule = logged.disable_overlap_schedule;
      in.speculative = logged.speculative;
      try {
        const engines::MambaSlotsPerRequest resolved =
            engines::resolve_mamba_slots(*slot_rules, in);
        slots = resolved.slots;
        how = resolved.derivation;
      } catch (const InputError& error) {
        out.notes.push_back(fmt::format("state slots per request: {}", error.problem()));
      }
    }
    if (slots > 0) {
      const int64_t bound = *logged.mamba_slots / slots;
      const int64_t printed = *logged.max_running_requests;
      add_check(out, "sglang_running_requests_state_pool",
                "max_running_requests within the mamba state pool", printed,
                TokenInterval{std::min<int64_t>(1, bound), bound},
                fmt::format("{} state slots / {} per request ({}) = at most {} requests at once; "
                            "printed {}: {}",
                            *logged.mamba_slots, slots, how, bound, printed,
                            printed == bound  ? "the state pool binds"
                            : printed < bound ? "another limit binds"
                                              : "more than the state pool holds"));
    }
  }

  // Every dtype from the same budget.
  for (const engines::KvDtype* spec : comparable_dtypes(engine, version, launch_dtype)) {
    SglangSetup other = setup;
    other.cell = sglang_cell_size(model, *spec, parallel, rules);
    LogPredictionRow row;
    row.kv_cache_dtype = spec->name;
    row.cell_bytes_per_token_per_gpu = other.cell.bytes_per_token;
    row.launch_dtype = spec->name == launch_dtype.name;
    if (have_memory) {
      row.max_total_tokens = sglang_interval(rest_lo, rest_hi, other);
    } else if (logged.pool_tokens) {
      // The pool that held N tokens of the launch dtype: [N, N + page) cells.
      const int64_t n = *logged.pool_tokens;
      const int64_t lo = n * setup.cell.bytes_per_token;
      const int64_t hi = (n + setup.page_size) * setup.cell.bytes_per_token - 1;
      row.max_total_tokens = {lo / other.cell.bytes_per_token / setup.page_size * setup.page_size,
                              hi / other.cell.bytes_per_token / setup.page_size * setup.page_size};
    } else {
      continue;
    }
    out.rows.push_back(row);
  }
}

void predict_vllm(const checkpoint::ModelFacts& model, const LoggedMemory& logged,
                  const PlanOptions& options, const engines::EngineModel& engine,
                  const engines::Version& version, LogPrediction& out) {
  Parallelism parallel = options.parallel;
  parallel.tp = logged.tp > 0 ? logged.tp : parallel.tp;
  parallel.pp = logged.pp > 0 ? logged.pp : parallel.pp;
  const int block = logged.block_size.value_or(
      options.page_size.value_or(engine.defaults_for(version).page_size.value_or(16)));
  const engines::KvDtype& launch_dtype = plan_dtype(engine, version, logged.kv_cache_dtype);
  VllmLayout layout = vllm_layout(model, launch_dtype, parallel, block);
  auto blocks_at = [&](long double bytes, const VllmLayout& l) {
    // vLLM clamps a negative budget to zero blocks.
    return std::max<int64_t>(
        0, static_cast<int64_t>(std::floor(bytes / l.page_bytes_per_layer / l.group_size)));
  };
  std::optional<int64_t> blocks = logged.num_gpu_blocks;
  if (logged.available_kv_gib) {
    const long double lo = to_bytes(*logged.available_kv_gib - kHalfCent);
    const long double hi = to_bytes(*logged.available_kv_gib + kHalfCent);
    TokenInterval block_range{blocks_at(lo, layout), blocks_at(hi, layout)};
    std::string derivation =
        fmt::format("num_blocks = {:.2f} (+-0.005) GiB // {} B page // {} layers in [{}, {}]",
                    *logged.available_kv_gib, layout.page_bytes_per_layer, layout.group_size,
                    block_range.lo, block_range.hi);
    if (logged.num_gpu_blocks)
      add_check(out, "vllm_num_gpu_blocks", "GPU blocks from the printed KV memory",
                *logged.num_gpu_blocks, block_range, derivation);
    if (logged.gpu_kv_cache_tokens) {
      TokenInterval tokens{block_range.lo / layout.num_groups * block,
                           block_range.hi / layout.num_groups * block};
      add_check(out, "vllm_gpu_kv_cache_size", "GPU KV cache size from the printed KV memory",
                *logged.gpu_kv_cache_tokens, tokens,
                derivation + fmt::format("; tokens = blocks // {} x {} in [{}, {}]",
                                         layout.num_groups, block, tokens.lo, tokens.hi));
      if (!blocks && tokens.lo == tokens.hi)
        blocks = *logged.gpu_kv_cache_tokens / block * layout.num_groups;
    }
    for (const engines::KvDtype* spec : comparable_dtypes(engine, version, launch_dtype)) {
      VllmLayout other = vllm_layout(model, *spec, parallel, block);
      LogPredictionRow row;
      row.kv_cache_dtype = spec->name;
      row.cell_bytes_per_token_per_gpu = other.bytes_per_token;
      row.launch_dtype = spec->name == launch_dtype.name;
      row.max_total_tokens = {blocks_at(lo, other) / other.num_groups * block,
                              blocks_at(hi, other) / other.num_groups * block};
      out.rows.push_back(row);
    }
  }
  if (!blocks && logged.gpu_kv_cache_tokens)
    blocks = *logged.gpu_kv_cache_tokens / block * layout.num_groups;
  if (blocks && logged.concurrency_context && logged.concurrency_x) {
    const int64_t context = *logged.concurrency_context;
    // Sliding-window groups hold window - 1 + max_num_batched_tokens tokens; when the log does
    // not print that budget, anything from the window alone to the whole context.
    const std::optional<int64_t> batched = logged.max_num_batched_tokens;
    const int64_t fewest = vllm_blocks_per_request(layout, context, batched.value_or(1));
    const int64_t most = vllm_blocks_per_request(layout, context, batched.value_or(context));
    const long double high = static_cast<long double>(*blocks) / fewest * 100.0L;
    const long double low = static_cast<long double>(*blocks) / most * 100.0L;
    TokenInterval predicted{static_cast<int64_t>(std::floor(low)),
                            static_cast<int64_t>(std::ceil(high))};
    std::string per_request = fmt::format("{} full-attention group(s) x cdiv({}, {})",
                                          layout.full_groups, context, block);
    if (layout.sliding_groups > 0)
      per_request += fmt::format(
          " + {} sliding group(s) x (cdiv(min({} - 1 + {}, {}), {}) + 1)", layout.sliding_groups,
          layout.sliding_window,
          batched ? std::to_string(*batched) : std::string("max_num_batched_tokens (not printed)"),
          context, block);
    add_check(
        out, "vllm_max_concurrency", "printed maximum concurrency (x100) from the blocks",
        std::llround(*logged.concurrency_x * 100.0), predicted,
        fmt::format(
            "{} blocks / ({} = {}{} blocks per request) = {:.4f}x{}", *blocks, per_request, fewest,
            most != fewest ? fmt::format("..{}", most) : "", static_cast<double>(high / 100.0L),
            most != fewest ? fmt::format("..{:.4f}x", static_cast<double>(low / 100.0L)) : ""));
  }
  if (logged.available_kv_gib && out.checks.empty())
    out.notes.push_back("the log prints the KV memory but no block or token count to compare");
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
