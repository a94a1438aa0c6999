// TensorRT-LLM's pool model (capacity_model "trtllm_fraction_pool"): the PyTorch backend
// allocates a small cache, profiles one batch, then sizes the real cache as
//   available = (total GPU memory - peak during profiling + that temporary cache) x fraction
//   tokens    = available // bytes per token, in whole blocks of tokens_per_block (rounded up)
// (tensorrt_llm/_torch/pyexecutor/_util.py KvCacheCreator; resource_manager.py; the C++
// KVCacheManager::allocatePools prints the result). Logs round GiB to two decimals, so each
// printed figure is an interval, and the prediction is the exact image of it.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "plan/plan.h"
#include "plan/pools.h"
#include "util/util.h"

namespace kvaudit::plan {

namespace {

constexpr long double kTrtllmHalfCent = 0.005L;

std::string trtllm_gib(int64_t bytes) {
  return fmt::format("{:.2f} GiB", static_cast<double>(bytes) / static_cast<double>(kGiB));
}

int64_t trtllm_round_up(int64_t tokens, int block) {
  return (tokens + block - 1) / block * block;
}

// Tokens the engine allocates from `available` bytes: whole tokens, then whole blocks.
int64_t trtllm_tokens_for(long double available_bytes, int64_t bytes_per_token, int block) {
  if (available_bytes <= 0 || bytes_per_token <= 0) return 0;
  auto tokens = static_cast<int64_t>(std::floor(available_bytes / bytes_per_token));
  return trtllm_round_up(tokens, block);
}

std::vector<ConcurrencyPoint> trtllm_concurrency(int64_t tokens, int block,
                                                 const PlanOptions& options) {
  std::vector<ConcurrencyPoint> points;
  for (int64_t context : options.contexts) {
    if (context <= 0) continue;
    ConcurrencyPoint point;
    point.context_tokens = context;
    // Each request holds whole blocks.
    limit_requests(point, "kv blocks", tokens / trtllm_round_up(context, block));
    if (options.max_running_requests)
      limit_requests(point, "--max_batch_size", *options.max_running_requests);
    points.push_back(point);
  }
  return points;
}

int trtllm_block_of(const LoggedMemory& logged, const PlanOptions& options,
                    const engines::EngineModel& engine, const engines::Version& version) {
  return logged.block_size.value_or(
      options.page_size.value_or(engine.defaults_for(version).page_size.value_or(32)));
}

Parallelism trtllm_parallel_of(const LoggedMemory& logged, const PlanOptions& options) {
  Parallelism parallel = options.parallel;
  parallel.tp = logged.tp > 0 ? logged.tp : parallel.tp;
  parallel.pp = logged.pp > 0 ? logged.pp : parallel.pp;
  return parallel;
}

}  // namespace

// TensorRT-LLM KVCacheManager.get_cache_size_per_token: kv_factor (2, or 1 for the MLA
// latent) x attention layers on the rank x head_dim x kv_heads // TP, in elements; FP8 one
// byte each, NVFP4 half a byte plus one FP8 block scale per 16 elements (rounded up over
// the whole token), anything else two bytes.
TrtllmCell trtllm_cell(const checkpoint::ModelFacts& model, const engines::KvDtype& dtype,
                       const Parallelism& parallel) {
  TrtllmCell cell;
  std::vector<checkpoint::LayerFacts> layers = kv_layers_of_busiest_rank(model, parallel.pp);
  const int tp = parallel.dp_attention ? 1 : parallel.tp;  // attention DP: heads not split
  for (const auto& layer : layers) {
    if (layer.kind == checkpoint::LayerKind::mla) {
      if (!model.mla) throw InputError(model.config_file, "MLA layers without MLA dimensions");
      cell.elements += model.mla->kv_lora_rank + model.mla->qk_rope_head_dim;
      cell.mla = true;
    } else {
      cell.elements += 2LL * layer.k_head_dim * layer.kv_heads / tp;
    }
  }
  cell.attention_layers = static_cast<int>(layers.size());
  std::string unit;
  if (dtype.name == "nvfp4") {
    cell.bytes_per_token = (cell.elements + 1) / 2 + (cell.elements + 15) / 16;
    unit = "ceil(e / 2) + ceil(e / 16) (NVFP4 values and FP8 block scales)";
  } else if (dtype.quantized && dtype.key_bits == 8) {
    cell.bytes_per_token = cell.elements;
    unit = "1 B each";
  } else {
    cell.bytes_per_token = 2 * cell.elements;
    unit = "2 B each";
  }
  const checkpoint::LayerFacts* first = layers.empty() ? nullptr : &layers.front();
  cell.derivation.push_back(
      cell.mla ? fmt::format("{} MLA layers x (kv_lora_rank + qk_rope_head_dim) = {} elements",
                             layers.size(), cell.elements)
      : first  ? fmt::format("2 x {} attention layers x head_dim {} x {} KV heads // TP {} = {} "
                              "elements",
                             layers.size(), first->k_head_dim, first->kv_heads, tp, cell.elements)
               : std::string("no attention layers"));
  cell.derivation.push_back(
      fmt::format("{}: {} B per token per GPU ({}; TensorRT-LLM "
                  "get_cache_size_per_token)",
                  dtype.name, cell.bytes_per_token, unit));
  return cell;
}

void trtllm_budget(const PoolContext& context, CapacityPlan& plan) {
  if (plan.gpu_memory_bytes <= 0) {
    plan.notes.push_back("no GPU memory given (--gpu or --gpu-mem): bytes per token only");
    return;
  }
  const PlanOptions& options = context.options;
  plan.memory_fraction =
      options.memory_fraction.value_or(context.defaults.memory_fraction.value_or(0.9));
  plan.memory_fraction_source =
      options.memory_fraction ? "--kv_cache_free_gpu_memory_fraction"
                              : "TensorRT-LLM default (KvCacheConfig.free_gpu_memory_fraction)";
  plan.budget_bytes = static_cast<int64_t>(
      std::floor(static_cast<long double>(plan.gpu_memory_bytes - plan.weight_bytes_per_gpu) *
                 plan.memory_fraction));
  plan.derivation.push_back(fmt::format(
      "KV memory = (total {} - weights {}) x {:.2f} = {} (upper bound: TensorRT-LLM subtracts "
      "the peak it measures in a profiling run, activations and CUDA graphs included, not only "
      "the weights)",
      trtllm_gib(plan.gpu_memory_bytes), trtllm_gib(plan.weight_bytes_per_gpu),
      plan.memory_fraction, trtllm_gib(plan.budget_bytes)));
  plan.notes.push_back(
      "TensorRT-LLM sizes its cache from the peak of a profiling run kvaudit cannot know ahead: "
      "these token counts are upper bounds. plan --from-log reproduces the engine's own figure "
      "from its start-up log.");
}

PlanRow trtllm_row(const PoolContext& context, const engines::KvDtype& dtype,
                   const CapacityPlan& plan) {
  PlanRow row;
  row.kv_cache_dtype = dtype.name;
  TrtllmCell cell = trtllm_cell(context.model, dtype, context.options.parallel);
  row.cell_bytes_per_token_per_gpu = cell.bytes_per_token;
  row.derivation = cell.derivation;
  if (plan.gpu_memory_bytes > 0 && plan.budget_bytes > 0 && cell.bytes_per_token > 0) {
    row.max_total_tokens = trtllm_tokens_for(plan.budget_bytes, cell.bytes_per_token, context.page);
    if (context.options.max_total_tokens &&
        *context.options.max_total_tokens < row.max_total_tokens)
      row.max_total_tokens = trtllm_round_up(*context.options.max_total_tokens, context.page);
    row.num_blocks = row.max_total_tokens / context.page;
    row.kv_pool_bytes = row.max_total_tokens * cell.bytes_per_token;
    row.derivation.push_back(fmt::format(
        "tokens = {} B // {} B = {}, in blocks of {}: {} tokens ({} blocks)", plan.budget_bytes,
        cell.bytes_per_token, plan.budget_bytes / cell.bytes_per_token, context.page,
        row.max_total_tokens, row.num_blocks));
    row.concurrency = trtllm_concurrency(row.max_total_tokens, context.page, context.options);
  }
  return row;
}

// The log prints the bytes per token ("kv size is N") or the allocation's GiB and tokens,
// never the dtype: the dtype whose bytes per token for this model's geometry the figures
// match, when exactly one does.
std::string trtllm_dtype_from_log(const checkpoint::ModelFacts& model, const LoggedMemory& logged,
                                  const PlanOptions& options, const engines::EngineModel& engine,
                                  const engines::Version& version, std::string& evidence) {
  const Parallelism parallel = trtllm_parallel_of(logged, options);
  const std::vector<const engines::KvDtype*> candidates = candidate_dtypes(model, engine, version);
  std::vector<std::string> matches;
  std::string how;
  for (const engines::KvDtype* dtype : candidates) {
    const int64_t bytes = trtllm_cell(model, *dtype, parallel).bytes_per_token;
    if (logged.kv_bytes_per_token) {
      if (bytes == *logged.kv_bytes_per_token) matches.push_back(dtype->name);
      how = fmt::format("the printed kv size per token {}", *logged.kv_bytes_per_token);
    } else if (logged.kv_gib && logged.pool_tokens && *logged.pool_tokens > 0) {
      if (tokens_from_printed_size(*logged.kv_gib, bytes, 0).contains(*logged.pool_tokens))
        matches.push_back(dtype->name);
      how = fmt::format("the final allocation ({:.2f} GiB for {} tokens)", *logged.kv_gib,
                        *logged.pool_tokens);
    }
  }
  if (how.empty() || matches.size() != 1) return "";
  evidence = fmt::format(
      "KV cache dtype {} derived from {}: it is this model's bytes per token in {} and in no "
      "other dtype the release accepts (TensorRT-LLM never prints the dtype)",
      matches.front(), how, matches.front());
  return matches.front();
}

void predict_trtllm(const checkpoint::ModelFacts& model, const LoggedMemory& logged,
                    const PlanOptions& options, const engines::EngineModel& engine,
                    const engines::Version& version, LogPrediction& out) {
  const Parallelism parallel = trtllm_parallel_of(logged, options);
  const int block = trtllm_block_of(logged, options, engine, version);
  const engines::KvDtype& launch_dtype = plan_dtype(engine, version, logged.kv_cache_dtype);
  const TrtllmCell cell = trtllm_cell(model, launch_dtype, parallel);
  if (logged.kv_bytes_per_token)
    add_check(out, "trtllm_kv_size_per_token", "printed KV bytes per token from the geometry",
              *logged.kv_bytes_per_token, {cell.bytes_per_token, cell.bytes_per_token},
              fmt::format("{}; {}", fmt::join(cell.derivation, "; "),
                          "a larger printed figure includes a draft model's cache"));
  // The profile's own arithmetic: available = (total - peak + temporary KV) x fraction, each
  // printed figure +-0.005 GiB (the fraction is printed in full).
  if (logged.available_kv_gib && logged.total_gpu_gib && logged.peak_gib &&
      logged.printed_fraction) {
    const long double fraction = *logged.printed_fraction;
    const long double base = static_cast<long double>(*logged.total_gpu_gib) - *logged.peak_gib +
                             logged.tmp_kv_gib.value_or(0.0);
    const int terms = logged.tmp_kv_gib ? 3 : 2;
    const long double lo = (base - terms * kTrtllmHalfCent) * fraction;
    const long double hi = (base + terms * kTrtllmHalfCent) * fraction;
    add_check(out, "trtllm_available_from_profile",
              "printed available KV memory (x100 GiB) from total, peak and fraction",
              std::llround(*logged.available_kv_gib * 100.0),
              {static_cast<int64_t>(std::floor(lo * 100.0L + 0.5L)),
               static_cast<int64_t>(std::floor(hi * 100.0L + 0.5L))},
              fmt::format("({:.2f} - {:.2f}{}) x {} GiB", *logged.total_gpu_gib, *logged.peak_gib,
                          logged.tmp_kv_gib ? fmt::format(" + {:.2f}", *logged.tmp_kv_gib) : "",
                          static_cast<double>(fraction)));
  }
  if (logged.available_kv_gib) {
    const long double lo =
        static_cast<long double>(*logged.available_kv_gib - kTrtllmHalfCent) * kGiB;
    const long double hi =
        static_cast<long double>(*logged.available_kv_gib + kTrtllmHalfCent) * kGiB;
    if (logged.pool_tokens) {
      TokenInterval predicted{trtllm_tokens_for(lo, cell.bytes_per_token, block),
                              trtllm_tokens_for(hi, cell.bytes_per_token, block)};
      if (logged.max_total_tokens_arg && *logged.max_total_tokens_arg > 0) {
        // A kv_cache_config.max_tokens cap takes the smaller (TensorRT-LLM warns).
        const int64_t cap = trtllm_round_up(*logged.max_total_tokens_arg, block);
        predicted.lo = std::min(predicted.lo, cap), predicted.hi = std::min(predicted.hi, cap);
      }
      add_check(out, "trtllm_max_tokens", "paged KV cache tokens from the printed KV memory",
                *logged.pool_tokens, predicted,
                fmt::format("{:.2f} (+-0.005) GiB // {} B per token, rounded up to blocks of {}: "
                            "[{}, {}]",
                            *logged.available_kv_gib, cell.bytes_per_token, block, predicted.lo,
                            predicted.hi));
    }
    for (const engines::KvDtype* spec : comparable_dtypes(engine, version, launch_dtype)) {
      const TrtllmCell other = trtllm_cell(model, *spec, parallel);
      LogPredictionRow row;
      row.kv_cache_dtype = spec->name;
      row.cell_bytes_per_token_per_gpu = other.bytes_per_token;
      row.launch_dtype = spec->name == launch_dtype.name;
      row.max_total_tokens = {trtllm_tokens_for(lo, other.bytes_per_token, block),
                              trtllm_tokens_for(hi, other.bytes_per_token, block)};
      out.rows.push_back(row);
    }
  }
  if (logged.kv_gib && logged.pool_tokens && *logged.pool_tokens > 0)
    add_check(
        out, "trtllm_allocated_size", "printed allocation size from its token count",
        *logged.pool_tokens, tokens_from_printed_size(*logged.kv_gib, cell.bytes_per_token, 0),
        fmt::format("{:.2f} (+-0.005) GiB / {} B per token", *logged.kv_gib, cell.bytes_per_token));
  if (!logged.available_kv_gib && logged.pool_tokens)
    out.notes.push_back(
        "the log prints no profiling line (its level hides it, or an explicit max_tokens sized "
        "the cache): the allocation is checked against its own size only");
}

}  // namespace kvaudit::plan
