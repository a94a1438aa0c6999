// logs parse, the lines a launch prints as it loads and runs: the weights' load, the pools it
// allocated, the memory profile, the cache dtype, caps, scale messages, ready and errors.
// Memory figures printed once per TP rank keep the minimum, as the engines do.
#include <fmt/format.h>

#include <algorithm>

#include "logs/parse.h"
#include "util/util.h"

namespace kvaudit::logs {

namespace {

using engines::LogKind;

void keep_min(std::optional<double>& slot, std::optional<double> value) {
  if (value && (!slot || *value < *slot)) slot = value;
}

// A fact line of the loading stage moves the launch there (never back).
void mark_loading(Launch& launch) {
  launch.stage = std::max<int>(launch.stage, kLoading);
}

// "log:LINE: message" (clipped): the evidence a resolved KV dtype carries.
std::string fact_evidence(int64_t line_no, const std::string& message) {
  return fmt::format("log:{}: {}", line_no, clip(message, 120));
}

// Settings a line names, whatever its kind ("Automatically reduce --mem-fraction-static
// to 0.760", "under --mem-fraction-static=0.88", "max_total_tokens=131072 is larger").
void apply_named_settings(Launch& launch, const TemplateHit& hit) {
  auto& memory = launch.memory;
  if (auto f = hit.number("mem_fraction_static"); f && *f > 0 && *f <= 1)
    memory.mem_fraction_static = f;
  if (auto cap = hit.count("max_total_tokens_arg")) memory.max_total_tokens_arg = cap;
  if (auto block = hit.count("block_size"); block && *block > 0 && *block < 1 << 20)
    memory.block_size = static_cast<int>(*block);
  if (auto n = hit.count("max_num_batched_tokens"); n && *n > 0 && *n < 1LL << 40)
    memory.max_num_batched_tokens = n;
  if (auto dp = hit.count("dp_size"); dp && *dp >= 1 && *dp <= 1 << 16 && launch.dp == 0)
    launch.dp = static_cast<int>(*dp), memory.dp = launch.dp;
  if (auto q = hit.text("quantization"); q && !q->empty()) launch.quantization = *q;
  if (auto f = hit.number("memory_fraction"); f && *f > 0 && *f <= 1) memory.printed_fraction = f;
}

// The weights' load (load_begin, load_end, weights_loaded): free memory before and after,
// the weights' size, and the dtype and quantization the load names.
void apply_weights_fact(Launch& launch, const TemplateHit& hit) {
  auto& memory = launch.memory;
  switch (hit.log->kind) {
    case LogKind::load_begin:
      keep_min(memory.total_before_load_gib, hit.number("avail_mem_gib"));
      break;
    case LogKind::load_end: {
      keep_min(memory.avail_after_weights_gib, hit.number("avail_mem_gib"));
      if (auto usage = hit.number("mem_usage_gib")) launch.weights_gib = usage;
      const std::string details = hit.text("load_details").value_or("");
      std::string dtype = word_after(details, "dtype=");
      if (!dtype.empty() && launch.model_dtype.empty())
        launch.model_dtype = hit.engine->dtypes->normalise(dtype);
      if (std::string q = word_after(details, "quant="); !q.empty()) launch.quantization = q;
      break;
    }
    case LogKind::weights_loaded:
      launch.weights_gib = hit.number("weights_gib");
      break;
    default:
      break;
  }
}

// "Using fp8 data type": the cache dtype the engine says it uses. Older vLLM prints a bare
// "fp8" for every FP8 cache, which says less than an explicit request, which then decides
// (see finish()).
void apply_kv_dtype_used(Launch& launch, const TemplateHit& hit, int64_t line_no,
                         const std::string& message) {
  std::string raw = hit.text("kv_dtype").value_or("");
  std::string d = hit.engine->dtypes->normalise(raw);
  if (!d.empty() && (launch.kv_cache_dtype_resolved.empty() || raw != "fp8")) {
    launch.kv_cache_dtype_resolved = d;
    launch.resolved_evidence = fact_evidence(line_no, message);
    launch.resolved_generic = raw == "fp8";
  }
}

// The pools the engine allocated (kv_pool_allocated, state_pool_allocated, swa_pool,
// token_summary): their tokens, slots and sizes, and the cache dtype the KV pool names.
void apply_pool_fact(Launch& launch, const TemplateHit& hit, int64_t line_no,
                     const std::string& message) {
  auto& memory = launch.memory;
  switch (hit.log->kind) {
    case LogKind::kv_pool_allocated: {
      if (auto n = hit.count("pool_tokens")) memory.pool_tokens = n;
      if (auto k = hit.number("k_gib")) memory.k_gib = k;
      if (auto v = hit.number("v_gib")) memory.v_gib = v;
      if (auto kv = hit.number("kv_gib")) memory.kv_gib = kv;
      std::string d = hit.engine->dtypes->normalise(hit.text("kv_dtype").value_or(""));
      if (!d.empty() && (launch.kv_cache_dtype_resolved.empty() || launch.resolved_generic)) {
        launch.kv_cache_dtype_resolved = d;
        launch.resolved_evidence = fact_evidence(line_no, message);
        launch.resolved_generic = false;
      }
      // An engine that allocates twice (a profiling cache, then the real one) prints the
      // one in effect last.
      if (!launch.max_total_tokens || hit.log->last_wins)
        launch.max_total_tokens = memory.pool_tokens;
      break;
    }
    case LogKind::state_pool_allocated:
      if (auto n = hit.count("mamba_slots")) memory.mamba_slots = n;
      if (auto c = hit.number("conv_gib")) memory.conv_gib = c;
      if (auto s = hit.number("ssm_gib")) memory.ssm_gib = s;
      break;
    case LogKind::swa_pool:
      if (auto n = hit.count("full_tokens")) memory.full_tokens = n;
      if (auto n = hit.count("swa_tokens")) memory.swa_tokens = n;
      break;
    case LogKind::token_summary:
      memory.max_total_num_tokens = hit.count("max_total_num_tokens");
      launch.max_total_tokens = memory.max_total_num_tokens;
      launch.max_running_requests = hit.count("max_running_requests");
      if (launch.max_running_requests) memory.max_running_requests = launch.max_running_requests;
      if (auto ctx = hit.count("context_len"))
        launch.context_length = ctx, memory.context_len = ctx;
      break;
    default:
      break;
  }
}

// What the memory profile found (available_kv_memory, kv_cache_size, max_concurrency,
// gpu_blocks): the KV memory, the cache's tokens and blocks, the concurrency it allows.
void apply_profile_fact(Launch& launch, const TemplateHit& hit) {
  auto& memory = launch.memory;
  switch (hit.log->kind) {
    case LogKind::available_kv_memory: {
      std::optional<double> gib = hit.number("available_kv_gib");
      if (auto details = hit.text("load_details")) {  // "... kv_cache_size=61.84GiB ..."
        std::string size = word_after(*details, "kv_cache_size=");
        gib = parse_number(size.substr(0, size.find("GiB")));
      }
      keep_min(memory.available_kv_gib, gib);
      // TensorRT-LLM's profile line carries the terms of its own arithmetic.
      if (auto peak = hit.number("peak_gib")) memory.peak_gib = peak;
      if (auto total = hit.number("total_gpu_gib")) memory.total_gpu_gib = total;
      if (auto tmp = hit.number("tmp_kv_gib")) memory.tmp_kv_gib = tmp;
      if (auto bytes = hit.count("kv_bytes_per_token")) memory.kv_bytes_per_token = bytes;
      // V0 profiles print the weights on the same line (V1 logs them separately).
      if (hit.text("weights_gib") || hit.text("load_details")) {
        memory.vllm_v0 = true;
        if (auto w = hit.number("weights_gib")) launch.weights_gib = w;
      }
      break;
    }
    case LogKind::kv_cache_size:
      // Each worker prints its own; the engine allocates the smallest (min over ranks).
      if (auto n = hit.count("kv_cache_tokens");
          n && (!memory.gpu_kv_cache_tokens || *n < *memory.gpu_kv_cache_tokens))
        memory.gpu_kv_cache_tokens = n;
      launch.max_total_tokens = memory.gpu_kv_cache_tokens;
      break;
    case LogKind::max_concurrency:
      // Proportional to the worker's token count, so its minimum pairs with the minimum.
      memory.concurrency_context = hit.count("concurrency_context");
      keep_min(memory.concurrency_x, hit.number("concurrency_x"));
      break;
    case LogKind::gpu_blocks:
      memory.num_gpu_blocks = hit.count("gpu_blocks");
      if (hit.text("cpu_blocks")) memory.vllm_v0 = true;  // CPU swap blocks exist only in V0
      break;
    default:
      break;
  }
}

// A line about scales, fallbacks, ignored flags or deprecations, kept as it was printed
// (at most 64 per launch) with the template's id and reference.
void record_scale_message(Launch& launch, const TemplateHit& hit, int64_t line_no,
                          const std::string& message) {
  if (launch.scale_messages.size() >= 64) return;
  const engines::Provenance& p = hit.log->provenance;
  launch.scale_messages.push_back(
      {line_no, std::string(engines::log_kind_name(hit.log->kind)), clip(message), launch.ready,
       hit.log->kind, hit.log->id, hit.engine->engine,
       p.verified ? p.reference
                  : fmt::format("{} (version bound inferred: {})", p.reference, p.bound)});
}

// A KV tier's start-up line: a host pool's size on the rank that printed it, or the
// connector class. No stage: tiers are built while the launch loads.
void apply_tier_fact(Launch& launch, const TemplateHit& hit, int64_t line_no,
                     const std::string& rank) {
  KvTierLines& tiers = launch.tiers;
  if (auto gb = hit.number("host_pool_gb"); gb && *gb >= 0 && tiers.host_pools.size() < 256)
    tiers.host_pools.push_back({rank, *gb, line_no});
  if (auto connector = hit.text("kv_connector"); connector && !connector->empty()) {
    tiers.kv_connector = std::string(TemplateHit::first_word(*connector));
    tiers.connector_line = line_no;
  }
}

}  // namespace

void LaunchBuilder::apply_fact(Launch& launch, const TemplateHit& hit, int64_t line_no,
                               const std::string& message, const std::string& rank) {
  if (launch.engine.empty()) launch.engine = hit.engine->engine;
  apply_named_settings(launch, hit);
  switch (hit.log->kind) {
    case LogKind::load_begin:
    case LogKind::load_end:
    case LogKind::weights_loaded:
      apply_weights_fact(launch, hit);
      mark_loading(launch);
      break;
    case LogKind::kv_dtype_used:
      // No stage: vLLM validates the cache dtype before it prints its engine config, so
      // this line must not make the config line look like a new launch.
      apply_kv_dtype_used(launch, hit, line_no, message);
      break;
    case LogKind::kv_pool_allocated:
    case LogKind::state_pool_allocated:
    case LogKind::swa_pool:
    case LogKind::token_summary:
      apply_pool_fact(launch, hit, line_no, message);
      mark_loading(launch);
      break;
    case LogKind::available_kv_memory:
    case LogKind::kv_cache_size:
    case LogKind::max_concurrency:
    case LogKind::gpu_blocks:
      apply_profile_fact(launch, hit);
      mark_loading(launch);
      break;
    case LogKind::memory_pool_end:
    case LogKind::startup_progress:
      mark_loading(launch);
      break;
    case LogKind::launch_setting:
      break;  // its settings were read above; no stage
    case LogKind::kv_tier:
      apply_tier_fact(launch, hit, line_no, rank);
      break;
    case LogKind::running_requests_capped: {
      RunningRequestsCap cap;
      cap.effective = hit.count("max_running_requests").value_or(0);
      cap.requested = hit.count("requested_running_requests");
      cap.state_slots = hit.count("mamba_slots");
      cap.slots_per_request = hit.count("state_slots_per_request");
      cap.by = cap.slots_per_request ? "mamba state cache" : "KV cache capacity";
      cap.line = line_no;
      cap.message = message;
      launch.running_requests_cap = cap;
      // The scheduler's summary line, later, prints the same value; a log cut before it
      // still has the cap in effect.
      if (cap.effective > 0)
        launch.max_running_requests = cap.effective,
        launch.memory.max_running_requests = cap.effective;
      if (cap.requested) launch.memory.requested_running_requests = cap.requested;
      if (cap.slots_per_request) launch.memory.state_slots_per_request = cap.slots_per_request;
      if (cap.state_slots && !launch.memory.mamba_slots)
        launch.memory.mamba_slots = cap.state_slots;
      mark_loading(launch);
      break;
    }
    case LogKind::kv_dtype_requested:
      // No stage: the engine validates the request before it loads anything.
      if (auto requested = hit.text("kv_dtype"); requested && !requested->empty())
        launch.kv_cache_dtype_requested = *requested;
      break;
    case LogKind::scale_unit_fallback:
    case LogKind::scale_warning:
    case LogKind::scale_not_loaded:
    case LogKind::scales_loaded:
    case LogKind::nvfp4_unit_global:
    case LogKind::flag_ignored:
    case LogKind::dtype_fallback:
    case LogKind::deprecation:
      record_scale_message(launch, hit, line_no, message);
      break;
    case LogKind::ready:
      launch.ready = true, launch.ready_line = line_no;
      launch.stage = std::max<int>(launch.stage, kReady);
      break;
    case LogKind::startup_error:
      record_failure(launch, "engine_error", message, line_no);
      if (!launch.failures.empty() && launch.failures.back().line == line_no)
        launch.failures.back().reference = hit.log->provenance.reference;
      break;
    case LogKind::launch_args:
    case LogKind::engine_version:
    case LogKind::engine_config:
      break;  // markers: apply_marker
  }
}

}  // namespace kvaudit::logs
