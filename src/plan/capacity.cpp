// plan capacity: from GPU memory to the KV pool, tokens and concurrent requests, the
// way SGLang (profile_max_num_token / init_memory) and vLLM V1 (get_kv_cache_configs)
// do it. All byte and token quantities are integers; fractions are applied once.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "engines/engines.h"
#include "plan/plan.h"
#include "plan/pools.h"
#include "util/util.h"

namespace kvaudit::plan {

namespace {

std::string gib(int64_t bytes) {
  return gib_text(static_cast<double>(bytes)) + " GiB";
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

// SGLang (kv_cache_configurator.py resolve_max_num_reqs): the KV pool (and the sliding-
// window pool) per context; the mamba state pool at its slots per request; the running-
// request cap, --max-running-requests or the engine's default (min(clamp(tokens x 512 /
// context_len, 2048, 4096), tokens / 2), per DP worker); and the context length itself.
std::vector<ConcurrencyPoint> sglang_concurrency(const SglangPools& pools, const CellSize& cell,
                                                 const PoolContext& pool_context) {
  const PlanOptions& options = pool_context.options;
  const int64_t model_context =
      options.context_length.value_or(pool_context.model.max_position_embeddings);
  std::vector<ConcurrencyPoint> points;
  for (int64_t context : options.contexts) {
    ConcurrencyPoint point;
    point.context_tokens = context;
    if (context <= 0) continue;
    limit_requests(point, "kv pool", pools.max_total_tokens / context);
    if (pools.swa_tokens > 0 && cell.swa_window > 0)
      limit_requests(point, "sliding-window pool",
                     pools.swa_tokens / std::min<int64_t>(context, cell.swa_window));
    if (pools.mamba_slots > 0) {
      const int slots = std::max(1, pool_context.mamba_slots.slots);
      limit_requests(
          point,
          fmt::format("mamba state pool ({} slots / {} per request)", pools.mamba_slots, slots),
          pools.mamba_slots / slots);
    }
    if (options.max_running_requests) {
      limit_requests(point, "--max-running-requests", *options.max_running_requests);
    } else if (model_context > 0 && pools.max_total_tokens > 0) {
      const int64_t by_length =
          std::clamp<int64_t>(pools.max_total_tokens * 512 / model_context, 2048, 4096);
      limit_requests(point, "the engine's default running-request cap",
                     std::min(by_length, pools.max_total_tokens / 2));
    }
    if (model_context > 0 && context > model_context)
      limit_requests(point, fmt::format("context length ({} tokens)", model_context), 0);
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
    // Every group keeps its own block table; sliding-window groups hold the window (and the
    // chunk being prefilled).
    const int64_t blocks_per_request =
        vllm_blocks_per_request(layout, context, options.max_num_batched_tokens);
    limit_requests(point, "kv blocks",
                   blocks_per_request > 0 ? num_blocks / blocks_per_request : 0);
    if (options.max_running_requests)
      limit_requests(point, "--max-num-seqs", *options.max_running_requests);
    points.push_back(point);
  }
  return points;
}

}  // namespace

void limit_requests(ConcurrencyPoint& point, std::string what, int64_t requests) {
  point.limits.emplace_back(what, requests);
  if (point.limited_by.empty() || requests < point.requests)
    point.requests = requests, point.limited_by = std::move(what);
}

void relimit_requests(ConcurrencyPoint& point, const std::string& what, int64_t requests) {
  bool found = false;
  for (auto& [name, n] : point.limits)
    if (name == what) n = requests, found = true;
  if (!found) point.limits.emplace_back(what, requests);
  point.limited_by.clear();
  for (const auto& [name, n] : point.limits)
    if (point.limited_by.empty() || n < point.requests) point.requests = n, point.limited_by = name;
}

SizingRules sizing_rules(const checkpoint::ModelFacts& model, const engines::EngineModel& engine,
                         const engines::Version& version, const PlanOptions& options) {
  const engines::EngineDefaults& defaults = engine.defaults_for(version);
  SizingRules rules;
  rules.fp4_dequant_workspace = defaults.fp4_dequant_workspace;
  rules.speculative_draft_layers = options.speculative_draft_layers.value_or(0);
  // The recurrent state dtypes: the launch flag, else the release's rule for this model
  // family, else its default (the model dtype, or "read it from the model config").
  const engines::DtypeVocabulary& vocabulary = *engine.dtypes;
  std::string model_dtype = vocabulary.normalise(model.torch_dtype);
  if (model_dtype.empty() || model_dtype == "fp32") model_dtype = "bf16";
  const engines::StateDtypes states =
      engines::resolve_state_dtypes(engine, version, model, options.mamba_ssm_dtype, model_dtype);
  rules.conv_dtype = states.conv_dtype.empty() ? "bf16" : states.conv_dtype;
  const std::string& ssm = states.ssm.dtype;
  rules.ssm_dtype_origin = states.ssm.origin;
  rules.ssm_dtype = vocabulary.normalise(ssm).empty() ? "fp32" : vocabulary.normalise(ssm);
  auto bytes_of = [&](const std::string& dtype) {
    const engines::KvDtype* d = vocabulary.find(dtype);
    return d ? std::max(1, d->key_bits / 8) : 4;
  };
  rules.conv_bytes = bytes_of(rules.conv_dtype);
  rules.ssm_bytes = bytes_of(rules.ssm_dtype);
  if (model.multimodal)
    rules.mm_reservation_bytes = static_cast<int64_t>(defaults.mm_reservation_mib * kMiB);
  return rules;
}

namespace {

// The dtypes to plan: the ones asked for, else the model dtype then every dtype this
// release accepts, widest first.
std::vector<const engines::KvDtype*> planned_dtypes(const checkpoint::ModelFacts& model,
                                                    const engines::EngineModel& engine,
                                                    const engines::Version& version,
                                                    const PlanOptions& options) {
  std::vector<const engines::KvDtype*> dtypes;
  for (const auto& name : options.kv_cache_dtypes) {
    const engines::KvDtype* dtype = &plan_dtype(engine, version, name);
    if (dtype->mla_only && !model.mla)
      throw InputError("--kv-cache-dtype",
                       fmt::format("{} is a layout of the MLA latent (DeepSeek-style attention); "
                                   "this model has none",
                                   dtype->name));
    if (std::find(dtypes.begin(), dtypes.end(), dtype) == dtypes.end()) dtypes.push_back(dtype);
  }
  if (dtypes.empty()) {
    // The model dtype first, then every dtype this release accepts (as the data spells them).
    const engines::KvDtype* model_dtype = engine.dtypes->find(
        engines::served_model_dtype(*engine.dtypes, model, engines::LaunchFlags{}));
    if (model_dtype) dtypes.push_back(model_dtype);
    std::vector<const engines::KvDtype*> others;
    for (const auto& cli : engines::kv_cache_dtype_choices(engine, version)) {
      const engines::KvDtype* dtype = engine.dtypes->find(engines::cli_dtype(engine, version, cli));
      if (dtype && (!dtype->mla_only || model.mla) &&
          std::find(dtypes.begin(), dtypes.end(), dtype) == dtypes.end() &&
          std::find(others.begin(), others.end(), dtype) == others.end())
        others.push_back(dtype);
    }
    // Widest first, then by name: the order a user compares them in.
    std::sort(others.begin(), others.end(),
              [](const engines::KvDtype* a, const engines::KvDtype* b) {
                return a->key_bits != b->key_bits ? a->key_bits > b->key_bits : a->name < b->name;
              });
    dtypes.insert(dtypes.end(), others.begin(), others.end());
  }

  return dtypes;
}

// GPU memory and weights per GPU (given, else the checkpoint's bytes over TP x PP).
void set_weights(const checkpoint::ModelFacts& model, const PlanOptions& options,
                 CapacityPlan& plan) {
  plan.gpu_memory_bytes = options.gpu_memory_bytes.value_or(0);
  if (options.weight_bytes_per_gpu) {
    plan.weight_bytes_per_gpu = *options.weight_bytes_per_gpu;
  } else if (model.has_weights) {
    plan.weight_bytes_per_gpu =
        static_cast<int64_t>(model.weight_bytes / (static_cast<uint64_t>(options.parallel.tp) *
                                                   static_cast<uint64_t>(options.parallel.pp)));
    plan.notes.push_back(fmt::format(
        "weights per GPU = safetensors bytes {} / (TP {} x PP {}) = {} (replicated norms and "
        "unsharded embeddings make the real figure slightly larger)",
        model.weight_bytes, options.parallel.tp, options.parallel.pp,
        gib(plan.weight_bytes_per_gpu)));
  } else {
    plan.notes.push_back(
        "no safetensors headers read: weights per GPU taken as 0 (pass --weights-per-gpu)");
  }
}

}  // namespace

// The KV budget per GPU as SGLang computes it: its profile with mem_fraction_static (given
// or its default table).
void sglang_budget(const PoolContext& context, CapacityPlan& plan) {
  const engines::EngineModel& engine = context.engine;
  const engines::Version& version = context.version;
  const PlanOptions& options = context.options;
  const SizingRules& rules = context.rules;
  if (plan.gpu_memory_bytes <= 0) {
    plan.notes.push_back("no GPU memory given (--gpu or --gpu-mem): bytes per token only");
    return;
  }
  if (options.memory_fraction) {
    plan.memory_fraction = *options.memory_fraction;
    plan.memory_fraction_source = "--mem-fraction-static";
  } else if (const engines::MemFractionTable* table = engine.capacity.mem_fraction_for(version)) {
    auto d = sglang_default_mem_fraction(*table, plan.gpu_memory_bytes / kMiB, options.parallel.tp,
                                         options.parallel.pp, options.parallel.dp_attention,
                                         options.parallel.dp);
    plan.memory_fraction = d.mem_fraction_static;
    plan.memory_fraction_source = "SGLang default";
    plan.derivation.push_back(d.derivation + " [" + table->provenance.reference + "]");
    if (!table->caveats.empty()) plan.notes.push_back(table->caveats);
  } else {
    throw InputError(engine.capacity.file,
                     "no mem_fraction_static_default covers " + engines::version_text(version));
  }
  const int64_t reserved =
      static_cast<int64_t>(std::llround(plan.gpu_memory_bytes * (1.0 - plan.memory_fraction)));
  plan.budget_bytes =
      plan.gpu_memory_bytes - plan.weight_bytes_per_gpu - reserved - rules.mm_reservation_bytes;
  plan.derivation.push_back(
      fmt::format("rest = avail after weights ({} - {}) - total {} x (1 - {:.3f}){} = {} (SGLang "
                  "profile; min over ranks)",
                  gib(plan.gpu_memory_bytes), gib(plan.weight_bytes_per_gpu),
                  gib(plan.gpu_memory_bytes), plan.memory_fraction,
                  rules.mm_reservation_bytes > 0
                      ? fmt::format(" - multimodal reservation {}", gib(rules.mm_reservation_bytes))
                      : std::string(),
                  gib(plan.budget_bytes)));
  plan.notes.push_back(
      "free memory before loading is taken as the whole GPU; the CUDA context and NCCL "
      "buffers (typically 0.5-2 GiB) lower the real figure. plan --from-log uses the printed "
      "figures instead.");
}

// vLLM's available KV memory: gpu_memory_utilization x total - weights (- what it measures).
void vllm_budget(const PoolContext& context, CapacityPlan& plan) {
  const PlanOptions& options = context.options;
  if (context.model.linear_attention)
    plan.notes.push_back(
        "vLLM hybrid GDN/Mamba layouts (attention pages padded to the Mamba state page) are not "
        "modelled: the vLLM figures count attention layers only and overstate capacity");
  if (plan.gpu_memory_bytes <= 0) {
    plan.notes.push_back("no GPU memory given (--gpu or --gpu-mem): bytes per token only");
    return;
  }
  plan.memory_fraction =
      options.memory_fraction.value_or(context.defaults.memory_fraction.value_or(0.9));
  plan.memory_fraction_source =
      options.memory_fraction
          ? "--gpu-memory-utilization"
          : fmt::format("vLLM {} default", engines::version_text(context.version));
  plan.budget_bytes =
      static_cast<int64_t>(std::floor(plan.gpu_memory_bytes * plan.memory_fraction)) -
      plan.weight_bytes_per_gpu;
  plan.derivation.push_back(fmt::format(
      "available KV memory = {} x {:.2f} - weights {} = {} (upper bound: vLLM also subtracts "
      "peak activations and non-torch memory it measures at start-up)",
      gib(plan.gpu_memory_bytes), plan.memory_fraction, gib(plan.weight_bytes_per_gpu),
      gib(plan.budget_bytes)));
}

// SGLang's row: the cell, the Mamba state, the pools and the concurrency.
PlanRow sglang_row(const PoolContext& context, const engines::KvDtype& dtype,
                   const CapacityPlan& plan) {
  const checkpoint::ModelFacts& model = context.model;
  const PlanOptions& options = context.options;
  const SizingRules& rules = context.rules;
  PlanRow row;
  row.kv_cache_dtype = dtype.name;
  CellSize cell = sglang_cell_size(model, dtype, options.parallel, rules);
  auto mamba = sglang_mamba_state(model, options.parallel, rules);
  row.cell_bytes_per_token_per_gpu = cell.bytes_per_token;
  row.derivation = cell.derivation;
  if (mamba) {
    row.mamba_state_bytes_per_request = mamba->bytes_per_request;
    for (const auto& line : mamba->derivation) row.derivation.push_back(line);
  }
  if (plan.gpu_memory_bytes > 0) {
    SglangPools pools =
        sglang_pools(plan.budget_bytes, cell, mamba, context.mamba_ratio, context.page,
                     options.max_total_tokens, std::nullopt, context.swa_ratio);
    if (options.parallel.dcp > 1) {
      pools.max_total_tokens *= options.parallel.dcp;
      pools.derivation.push_back(
          fmt::format("x DCP {} = {} tokens", options.parallel.dcp, pools.max_total_tokens));
    }
    row.kv_pool_bytes = pools.kv_budget_bytes;
    row.max_total_tokens = pools.max_total_tokens;
    row.swa_tokens = pools.swa_tokens;
    row.mamba_slots = pools.mamba_slots;
    row.mamba_pool_bytes = pools.mamba_pool_bytes;
    for (const auto& line : pools.derivation) row.derivation.push_back(line);
    if (pools.mamba_slots > 0) row.derivation.push_back(context.mamba_slots.derivation);
    row.concurrency = sglang_concurrency(pools, cell, context);
  }
  return row;
}

// vLLM's row: the block layout, the blocks and the concurrency.
PlanRow vllm_row(const PoolContext& context, const engines::KvDtype& dtype,
                 const CapacityPlan& plan) {
  PlanRow row;
  row.kv_cache_dtype = dtype.name;
  VllmLayout layout = vllm_layout(context.model, dtype, context.options.parallel, context.page);
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
    row.concurrency = vllm_concurrency(row.num_blocks, layout, context.options);
  }
  return row;
}

engines::MambaSlotsPerRequest mamba_slots_per_request(const engines::EngineModel& engine,
                                                      const engines::Version& version,
                                                      const PlanOptions& options) {
  const engines::MambaSlotRules* rules = engine.mamba_slots_for(version);
  if (!rules)
    return {1, "",
            fmt::format("{} {}: no state-slot rule, 1 slot per request assumed", engine.engine,
                        engines::version_text(version))};
  engines::MambaSlotInputs in;
  in.strategy = options.mamba_radix_cache_strategy;
  in.disable_radix_cache = options.disable_radix_cache;
  in.disable_overlap_schedule = options.disable_overlap_schedule;
  in.speculative = options.speculative_draft_layers.value_or(0) > 0;
  in.skip_decode_lock = options.mamba_skip_decode_lock;
  engines::MambaSlotsPerRequest out = engines::resolve_mamba_slots(*rules, in);
  if (!rules->provenance.verified)
    out.derivation += fmt::format(" (release bound inferred: {})", rules->provenance.bound);
  return out;
}

// The passes: the dtypes, the weights, the budget, then a row per dtype.
CapacityPlan plan_capacity(const engines::Registry& registry, const checkpoint::ModelFacts& model,
                           const PlanOptions& options) {
  const engines::EngineModel& engine = registry.engine(options.engine);
  auto parsed_version = engines::parse_version(options.engine_version);
  if (!parsed_version)
    throw InputError("--engine-version", "cannot read version '" + options.engine_version + "'");
  const engines::Version version = *parsed_version;
  const engines::EngineDefaults& defaults = engine.defaults_for(version);
  const SizingRules rules = sizing_rules(model, engine, version, options);
  const PoolModel& pool = pool_model(engine);
  CapacityPlan plan;
  plan.engine = options.engine;
  plan.engine_version =
      options.engine_version.empty() ? engine.latest_known_version : options.engine_version;
  plan.parallel = options.parallel;
  plan.gpu_name = options.gpu_name;
  plan.sources = engine.capacity.references;
  plan.budget_label = std::string(pool.budget_label);
  if (options.parallel.tp < 1 || options.parallel.pp < 1 || options.parallel.dp < 1 ||
      options.parallel.dcp < 1)
    throw InputError("--tp/--pp/--dp", "must be at least 1");
  if (options.parallel.dp_attention && options.parallel.tp % options.parallel.dp != 0)
    throw InputError("--dp", "DP attention needs TP divisible by DP");

  const std::vector<const engines::KvDtype*> dtypes =
      planned_dtypes(model, engine, version, options);
  set_weights(model, options, plan);
  PoolContext context{model, engine, version, defaults, rules, options};
  context.mamba_ratio =
      options.mamba_full_memory_ratio.value_or(defaults.mamba_full_memory_ratio.value_or(0.9));
  context.swa_ratio = defaults.swa_full_tokens_ratio.value_or(0.8);
  context.mamba_slots = mamba_slots_per_request(engine, version, options);
  context.page = options.page_size.value_or(defaults.page_size.value_or(pool.default_page_size));
  if (!options.page_size && defaults.dsa_page_size && model.mla && model.mla->index_head_dim > 0) {
    context.page = *defaults.dsa_page_size;
    plan.notes.push_back(fmt::format(
        "page size {}: SGLang sets it for DeepSeek DSA/NSA models on CUDA whatever --page-size "
        "says (pass --page-size for ROCm or XPU)",
        context.page));
  }

  pool.set_budget(context, plan);
  if (options.parallel.dcp > 1)
    plan.notes.push_back(fmt::format(
        "DCP {}: each rank holds the heads of attention TP / DCP and 1/{} of the tokens; the "
        "token count is the pool's times DCP (SGLang PagedTokenToKVPoolAllocator; head split "
        "read from SGLang's test stub of get_num_kv_heads, not confirmed in a release)",
        options.parallel.dcp, options.parallel.dcp));

  for (const engines::KvDtype* dtype : dtypes) plan.rows.push_back(pool.row(context, *dtype, plan));
  add_host_tier(engine, options, plan);
  return plan;
}

const std::vector<PoolModel>& pool_models() {
  static const std::vector<PoolModel> models = {
      {"sglang_token_pool", "Rest memory (KV + state)", 1, sglang_budget, sglang_row,
       predict_sglang, nullptr},
      {"vllm_block_pool", "Available KV memory", 16, vllm_budget, vllm_row, predict_vllm, nullptr},
      {"trtllm_fraction_pool", "KV memory ((total - peak) x fraction)", 32, trtllm_budget,
       trtllm_row, predict_trtllm, trtllm_dtype_from_log},
  };
  return models;
}

const PoolModel& pool_model(const engines::EngineModel& engine) {
  for (const PoolModel& model : pool_models())
    if (model.name == engine.capacity.model) return model;
  std::vector<std::string_view> known;
  for (const PoolModel& model : pool_models()) known.push_back(model.name);
  throw InputError(engine.capacity.file,
                   fmt::format("capacity_model '{}' is not a pool model plan knows ({})",
                               engine.capacity.model, fmt::join(known, ", ")));
}

}  // namespace kvaudit::plan
