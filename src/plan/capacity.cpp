// plan capacity: from GPU memory to the KV pool, tokens and concurrent requests, the
// way SGLang (profile_max_num_token / init_memory) and vLLM V1 (get_kv_cache_configs)
// do it. All byte and token quantities are integers; fractions are applied once.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "engines/engines.h"
#include "plan/plan.h"
#include "util/util.h"

namespace kvaudit::plan {

namespace {

std::string gib(int64_t bytes) {
  return fmt::format("{:.2f} GiB", static_cast<double>(bytes) / kGiB);
}

int64_t cdiv(int64_t a, int64_t b) {
  return b <= 0 ? 0 : (a + b - 1) / b;
}

}  // namespace

SglangPools sglang_pools(int64_t rest_bytes, const CellSize& cell,
                         const std::optional<MambaState>& mamba, double mamba_full_memory_ratio,
                         int page_size, std::optional<int64_t> max_total_tokens,
                         std::optional<int64_t> fixed_mamba_slots, double swa_full_tokens_ratio) {
  SglangPools pools;
  pools.rest_bytes = rest_bytes;
  pools.kv_budget_bytes = rest_bytes;
  if (rest_bytes <= 0 || cell.bytes_per_token <= 0) {
    pools.kv_budget_bytes = std::max<int64_t>(0, rest_bytes);
    pools.derivation.push_back(
        "no memory left for the KV pool: SGLang stops with 'Not enough memory. Please try to "
        "increase --mem-fraction-static'");
    return pools;
  }
  if (mamba && mamba->bytes_per_request > 0) {
    if (fixed_mamba_slots) {
      pools.mamba_slots = *fixed_mamba_slots;
    } else {
      long double raw = static_cast<long double>(rest_bytes) * mamba_full_memory_ratio /
                        (1.0L + mamba_full_memory_ratio);
      pools.mamba_slots = static_cast<int64_t>(std::floor(raw / mamba->bytes_per_request));
    }
    pools.mamba_pool_bytes = pools.mamba_slots * mamba->bytes_per_request;
    pools.kv_budget_bytes = rest_bytes - pools.mamba_pool_bytes;
    pools.derivation.push_back(fmt::format(
        "Mamba/GDN state set aside first: {} slots = {} x {:.2f} / (1 + {:.2f}) // {} B; "
        "{} x {} B = {}; KV budget {} - {} = {}",
        pools.mamba_slots, gib(rest_bytes), mamba_full_memory_ratio, mamba_full_memory_ratio,
        mamba->bytes_per_request, pools.mamba_slots, mamba->bytes_per_request,
        gib(pools.mamba_pool_bytes), gib(rest_bytes), gib(pools.mamba_pool_bytes),
        gib(pools.kv_budget_bytes)));
  }
  int64_t tokens = std::max<int64_t>(0, pools.kv_budget_bytes) / cell.bytes_per_token;
  pools.derivation.push_back(fmt::format("tokens = {} B // {} B/token = {}", pools.kv_budget_bytes,
                                         cell.bytes_per_token, tokens));
  if (max_total_tokens && *max_total_tokens < tokens) {
    tokens = *max_total_tokens;
    pools.derivation.push_back(fmt::format("capped by --max-total-tokens: {}", tokens));
  }
  page_size = std::max(1, page_size);
  if (page_size > 1) {
    tokens = tokens / page_size * page_size;
    pools.derivation.push_back(fmt::format("floored to page size {}: {}", page_size, tokens));
  }
  pools.max_total_tokens = tokens;
  if (cell.full_layers > 0 && cell.swa_layers > 0) {
    const long double full =
        static_cast<long double>(cell.full_bytes_per_token_per_layer) * cell.full_layers;
    const long double swa =
        static_cast<long double>(cell.swa_bytes_per_token_per_layer) * cell.swa_layers;
    const long double total_memory = static_cast<long double>(tokens) * (full + swa);
    int64_t full_tokens = static_cast<int64_t>(total_memory / (full + swa_full_tokens_ratio * swa));
    int64_t swa_tokens =
        static_cast<int64_t>(full_tokens * static_cast<long double>(swa_full_tokens_ratio));
    full_tokens = full_tokens / page_size * page_size;
    swa_tokens = swa_tokens / page_size * page_size;
    pools.derivation.push_back(
        fmt::format("sliding-window split (swa_full_tokens_ratio {:.2f}): full pool {} tokens, SWA "
                    "pool {} tokens",
                    swa_full_tokens_ratio, full_tokens, swa_tokens));
    pools.max_total_tokens = full_tokens;
    pools.swa_tokens = swa_tokens;
  }
  return pools;
}

namespace {

std::vector<ConcurrencyPoint> sglang_concurrency(const SglangPools& pools, const CellSize& cell,
                                                 const PlanOptions& options, int mamba_ratio) {
  std::vector<ConcurrencyPoint> points;
  for (int64_t context : options.contexts) {
    ConcurrencyPoint point;
    point.context_tokens = context;
    if (context <= 0) continue;
    point.requests = pools.max_total_tokens / context;
    point.limited_by = "kv pool";
    if (pools.swa_tokens > 0 && cell.swa_window > 0) {
      int64_t by_swa = pools.swa_tokens / std::min<int64_t>(context, cell.swa_window);
      if (by_swa < point.requests)
        point.requests = by_swa, point.limited_by = "sliding-window pool";
    }
    if (pools.mamba_slots > 0) {
      int64_t by_mamba = pools.mamba_slots / std::max(1, mamba_ratio);
      if (by_mamba < point.requests) point.requests = by_mamba, point.limited_by = "mamba slots";
    }
    if (options.max_running_requests && *options.max_running_requests < point.requests)
      point.requests = *options.max_running_requests, point.limited_by = "--max-running-requests";
    points.push_back(point);
  }
  return points;
}

std::vector<ConcurrencyPoint> vllm_concurrency(int64_t num_blocks, const VllmLayout& layout,
                                               const PlanOptions& options) {
  std::vector<ConcurrencyPoint> points;
  for (int64_t context : options.contexts) {
    if (context <= 0) continue;
    ConcurrencyPoint point;
    point.context_tokens = context;
    // Every group keeps its own block table; sliding-window groups need only the window.
    int64_t blocks_per_request = 0;
    int full_groups = layout.num_groups, swa_groups = 0;
    if (layout.sliding_window > 0 && layout.num_groups > 1)
      swa_groups = layout.num_groups - 1, full_groups = 1;
    blocks_per_request += full_groups * cdiv(context, layout.block_size);
    blocks_per_request +=
        swa_groups *
        (cdiv(std::min<int64_t>(context, layout.sliding_window), layout.block_size) + 1);
    point.requests = blocks_per_request > 0 ? num_blocks / blocks_per_request : 0;
    point.limited_by = "kv blocks";
    if (options.max_running_requests && *options.max_running_requests < point.requests)
      point.requests = *options.max_running_requests, point.limited_by = "--max-num-seqs";
    points.push_back(point);
  }
  return points;
}

}  // namespace

CapacityPlan plan_capacity(const checkpoint::ModelFacts& model, const PlanOptions& options) {
  EngineCapacityData data = load_capacity_data(options.engine);
  CapacityPlan plan;
  plan.engine = options.engine;
  plan.parallel = options.parallel;
  plan.gpu_name = options.gpu_name;
  if (options.parallel.tp < 1 || options.parallel.pp < 1 || options.parallel.dp < 1)
    throw InputError("--tp/--pp/--dp", "must be at least 1");
  if (options.parallel.dp_attention && options.parallel.tp % options.parallel.dp != 0)
    throw InputError("--dp", "DP attention needs TP divisible by DP");

  std::vector<std::string> dtypes = options.kv_cache_dtypes;
  if (dtypes.empty()) {
    // Every dtype the engine's newest known release accepts (data/engines/<engine>.json),
    // normalised; those plan has no sizing rule for are named in a note.
    engines::EngineData engine = engines::load_engine_data(options.engine);
    auto version = engines::parse_version(engine.latest_known_version);
    std::vector<std::string> unsized;
    for (const auto& cli :
         engines::kv_cache_dtype_choices(engine, version.value_or(engines::Version{}))) {
      std::string name = normalise_dtype_name(engines::normalise_kv_dtype(engine, cli));
      if (name == "auto") {  // the model's dtype, listed first
        name = normalise_dtype_name(model.torch_dtype);
        if (name.empty() || name == "auto" || name == "fp32") name = "bf16";
        if (std::find(dtypes.begin(), dtypes.end(), name) == dtypes.end())
          dtypes.insert(dtypes.begin(), name);
        continue;
      }
      if (name.empty() || std::find(dtypes.begin(), dtypes.end(), name) != dtypes.end()) continue;
      bool known = false;
      for (const auto& spec : data.kv_dtypes) known |= spec.name == name;
      if (known)
        dtypes.push_back(name);
      else if (std::find(unsized.begin(), unsized.end(), cli) == unsized.end())
        unsized.push_back(cli);
    }
    if (dtypes.empty()) dtypes = data.plan_default_dtypes;
    if (!unsized.empty()) {
      std::string list;
      for (const auto& u : unsized) list += (list.empty() ? "" : ", ") + u;
      plan.notes.push_back(fmt::format("{} {} also accepts {}: no sizing rule in plan yet",
                                       options.engine, engine.latest_known_version, list));
    }
  }

  plan.gpu_memory_bytes = options.gpu_memory_bytes.value_or(0);
  if (options.weight_bytes_per_gpu) {
    plan.weight_bytes_per_gpu = *options.weight_bytes_per_gpu;
  } else if (model.has_weights) {
    plan.weight_bytes_per_gpu =
        static_cast<int64_t>(model.weight_bytes / (options.parallel.tp * options.parallel.pp));
    plan.notes.push_back(fmt::format(
        "weights per GPU = safetensors bytes {} / (TP {} x PP {}) = {} (replicated norms and "
        "unsharded embeddings make the real figure slightly larger)",
        model.weight_bytes, options.parallel.tp, options.parallel.pp,
        gib(plan.weight_bytes_per_gpu)));
  } else {
    plan.notes.push_back(
        "no safetensors headers read: weights per GPU taken as 0 (pass --weights-per-gpu)");
  }

  const bool sglang = options.engine == "sglang";
  const double mamba_ratio = options.mamba_full_memory_ratio.value_or(
      data.document.value("mamba_full_memory_ratio_default", 0.9));
  const double swa_ratio = data.document.value("swa_full_tokens_ratio_default", 0.8);
  const int mamba_request_ratio =
      data.document.value("mamba_cache_size_per_running_request_ratio", 3);
  const int page =
      options.page_size.value_or(sglang ? data.document.value("page_size_default", 1)
                                        : data.document.value("block_size_default", 16));

  if (plan.gpu_memory_bytes > 0) {
    if (sglang) {
      if (options.memory_fraction) {
        plan.memory_fraction = *options.memory_fraction;
        plan.memory_fraction_source = "--mem-fraction-static";
      } else {
        auto d = sglang_default_mem_fraction(data, plan.gpu_memory_bytes / kMiB,
                                             options.parallel.tp, options.parallel.pp,
                                             options.parallel.dp_attention, options.parallel.dp);
        plan.memory_fraction = d.mem_fraction_static;
        plan.memory_fraction_source = "SGLang default";
        plan.derivation.push_back(d.derivation);
      }
      const int64_t reserved =
          static_cast<int64_t>(std::llround(plan.gpu_memory_bytes * (1.0 - plan.memory_fraction)));
      plan.budget_bytes = plan.gpu_memory_bytes - plan.weight_bytes_per_gpu - reserved;
      plan.derivation.push_back(
          fmt::format("rest = avail after weights ({} - {}) - total {} x (1 - {:.3f}) = {} (SGLang "
                      "profile_max_num_token; min over ranks)",
                      gib(plan.gpu_memory_bytes), gib(plan.weight_bytes_per_gpu),
                      gib(plan.gpu_memory_bytes), plan.memory_fraction, gib(plan.budget_bytes)));
      plan.notes.push_back(
          "free memory before loading is taken as the whole GPU; the CUDA context and NCCL "
          "buffers (typically 0.5-2 GiB) lower the real figure. plan --from-log uses the printed "
          "figures instead.");
    } else {
      plan.memory_fraction = options.memory_fraction.value_or(
          data.document.value("gpu_memory_utilization_default", 0.9));
      plan.memory_fraction_source =
          options.memory_fraction ? "--gpu-memory-utilization" : "vLLM default";
      plan.budget_bytes =
          static_cast<int64_t>(std::floor(plan.gpu_memory_bytes * plan.memory_fraction)) -
          plan.weight_bytes_per_gpu;
      plan.derivation.push_back(fmt::format(
          "available KV memory = {} x {:.2f} - weights {} = {} (upper bound: vLLM also subtracts "
          "peak activations and non-torch memory it measures at start-up)",
          gib(plan.gpu_memory_bytes), plan.memory_fraction, gib(plan.weight_bytes_per_gpu),
          gib(plan.budget_bytes)));
    }
  } else {
    plan.notes.push_back("no GPU memory given (--gpu or --gpu-mem): bytes per token only");
  }
  if (!sglang && model.linear_attention)
    plan.notes.push_back(
        "vLLM hybrid GDN/Mamba layouts (attention pages padded to the Mamba state page) are not "
        "modelled: the vLLM figures count attention layers only and overstate capacity");

  for (const auto& name : dtypes) {
    const KvDtypeSpec& dtype = find_dtype(data, name);
    PlanRow row;
    row.kv_cache_dtype = dtype.name;
    if (sglang) {
      CellSize cell = sglang_cell_size(model, dtype, options.parallel);
      auto mamba = sglang_mamba_state(model, options.parallel);
      row.cell_bytes_per_token_per_gpu = cell.bytes_per_token;
      row.derivation = cell.derivation;
      if (mamba) {
        row.mamba_state_bytes_per_request = mamba->bytes_per_request;
        for (const auto& line : mamba->derivation) row.derivation.push_back(line);
      }
      if (plan.gpu_memory_bytes > 0) {
        SglangPools pools = sglang_pools(plan.budget_bytes, cell, mamba, mamba_ratio, page,
                                         options.max_total_tokens, std::nullopt, swa_ratio);
        row.kv_pool_bytes = pools.kv_budget_bytes;
        row.max_total_tokens = pools.max_total_tokens;
        row.swa_tokens = pools.swa_tokens;
        row.mamba_slots = pools.mamba_slots;
        row.mamba_pool_bytes = pools.mamba_pool_bytes;
        for (const auto& line : pools.derivation) row.derivation.push_back(line);
        row.concurrency = sglang_concurrency(pools, cell, options, mamba_request_ratio);
      }
    } else {
      VllmLayout layout = vllm_layout(model, dtype, options.parallel, page);
      row.cell_bytes_per_token_per_gpu = layout.bytes_per_token;
      row.derivation = layout.derivation;
      if (plan.gpu_memory_bytes > 0 && plan.budget_bytes > 0) {
        row.num_blocks = plan.budget_bytes / layout.page_bytes_per_layer / layout.group_size;
        row.kv_pool_bytes = row.num_blocks * layout.page_bytes_per_layer * layout.group_size;
        row.max_total_tokens = row.num_blocks / layout.num_groups * layout.block_size;
        row.derivation.push_back(fmt::format(
            "num_blocks = {} B // {} B // {} layers = {}; tokens = {} // {} group(s) x {} = {}",
            plan.budget_bytes, layout.page_bytes_per_layer, layout.group_size, row.num_blocks,
            row.num_blocks, layout.num_groups, layout.block_size, row.max_total_tokens));
        row.concurrency = vllm_concurrency(row.num_blocks, layout, options);
      }
    }
    plan.rows.push_back(std::move(row));
  }
  return plan;
}

}  // namespace kvaudit::plan
