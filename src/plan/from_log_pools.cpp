// plan from a log, SGLang's and vLLM's pool models: the engine's arithmetic run on the memory
// figures a launch printed. Logs round GiB to two decimals, so every printed figure stands
// for an interval of +-0.005 GiB; the predicted token count is the exact image of those
// intervals under the engine's (monotone, piecewise) formula, never a fudge factor.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "plan/plan.h"
#include "plan/pools.h"
#include "util/util.h"

namespace kvaudit::plan {

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

namespace {

// The pool line: per-token K (or MLA KV) bytes checked against the printed size; and the
// Mamba pool's printed ssm_state size against its printed slots.
void check_sglang_pool_sizes(const checkpoint::ModelFacts& model, const LoggedMemory& logged,
                             const engines::EngineModel& engine,
                             const engines::KvDtype& launch_dtype, const SglangSetup& setup,
                             LogPrediction& out) {
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
}

// Requests at once: the state pool at its slots per request (as printed, else this
// release's rule for the launch's strategy) bounds the max_running_requests printed.
void check_sglang_running_requests(const LoggedMemory& logged, const engines::EngineModel& engine,
                                   const engines::Version& version, LogPrediction& out) {
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
}

}  // namespace

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

  // The pool sizes the log printed, and the requests at once the state pool allows.
  check_sglang_pool_sizes(model, logged, engine, launch_dtype, setup, out);
  check_sglang_running_requests(logged, engine, version, out);

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

}  // namespace kvaudit::plan
