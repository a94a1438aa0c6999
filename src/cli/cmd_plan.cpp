// kvaudit plan: checkpoint (or config.json) + engine + GPU -> KV capacity per dtype;
// with --from-log, the same arithmetic run on the figures a launch printed.
#include <fmt/format.h>

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <iostream>

#include "checkpoint/checkpoint.h"
#include "cli/commands.h"
#include "engines/engines.h"
#include "logs/logs.h"
#include "plan/plan.h"
#include "util/util.h"

namespace kvaudit::cli {

namespace {

struct PlanFlags {
  std::string checkpoint;
  std::string engine = "sglang";
  std::string engine_version;
  int tp = 1, pp = 1, dp = 1, dcp = 1;
  std::string mamba_ssm_dtype;
  int speculative_draft_layers = 0;
  std::string mamba_radix_cache_strategy;
  bool disable_radix_cache = false;
  bool disable_overlap_schedule = false;
  int64_t context_length = 0;
  bool dp_attention = false;
  std::string kv_cache_dtypes;
  std::string gpu;
  std::string gpu_mem;
  double mem_fraction = -1;
  std::string weights_per_gpu;
  std::string contexts = "8k,32k,128k";
  int64_t max_running_requests = 0;
  int64_t max_num_batched_tokens = 0;
  int page_size = 0;
  int64_t max_total_tokens = 0;
  bool hierarchical_cache = false;
  double hicache_ratio = 0;
  double hicache_size_gb = 0;
  std::string from_log;
  int launch = 0;
  plan::LogFlagOverrides given;  // the flags above that were given, for --from-log
  CheckpointSource source;
  bool explain = false;
  OutputOptions output;
};

int run_plan(const engines::Registry& registry, PlanFlags& f) {
  if (f.checkpoint.empty()) throw InputError("plan", "give a checkpoint folder or a config.json");
  checkpoint::ReadOptions read;
  checkpoint::ModelFacts model = read_checkpoint_argument(f.checkpoint, f.source, read);

  plan::PlanOptions options;
  options.engine = f.engine;
  options.engine_version = f.engine_version;
  options.parallel = {f.tp, f.pp, f.dp, f.dp_attention, f.dcp};
  options.mamba_ssm_dtype = f.mamba_ssm_dtype;
  if (f.speculative_draft_layers > 0) options.speculative_draft_layers = f.speculative_draft_layers;
  options.mamba_radix_cache_strategy = f.mamba_radix_cache_strategy;
  options.disable_radix_cache = f.disable_radix_cache;
  options.disable_overlap_schedule = f.disable_overlap_schedule;
  // SGLang reads the opt-in from its environment; so does the plan of a launch made here.
  if (const char* lock = std::getenv("SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK"))
    options.mamba_skip_decode_lock =
        std::string_view(lock) == "1" || std::string_view(lock) == "true";
  if (f.context_length > 0) options.context_length = f.context_length;
  options.kv_cache_dtypes = split_list(f.kv_cache_dtypes);
  const GpuMemory gpu = gpu_memory_from_flags(f.gpu, f.gpu_mem);
  if (gpu.bytes) options.gpu_memory_bytes = gpu.bytes;
  options.gpu_name = gpu.name;
  if (f.mem_fraction >= 0) {
    if (f.mem_fraction <= 0 || f.mem_fraction > 1)
      throw InputError("--mem-fraction", "must be in (0, 1]");
    options.memory_fraction = f.mem_fraction;
  }
  if (!f.weights_per_gpu.empty())
    options.weight_bytes_per_gpu = parse_size_bytes(f.weights_per_gpu, "--weights-per-gpu");
  options.contexts.clear();
  for (const auto& part : split_list(f.contexts)) {
    auto tokens = parse_token_count(part);
    if (!tokens || *tokens <= 0) throw InputError("--context", "not a token count: " + part);
    options.contexts.push_back(*tokens);
  }
  if (f.max_running_requests > 0) options.max_running_requests = f.max_running_requests;
  if (f.max_num_batched_tokens > 0) options.max_num_batched_tokens = f.max_num_batched_tokens;
  if (f.page_size > 0) options.page_size = f.page_size;
  if (f.max_total_tokens > 0) options.max_total_tokens = f.max_total_tokens;
  // The host tier, in the tier-setting names a parsed launch uses (kv_tier_flags).
  if (f.hierarchical_cache) options.tier_settings["hierarchical_cache"] = "true";
  if (f.hicache_ratio > 0)
    options.tier_settings["hicache_ratio"] = fmt::format("{}", f.hicache_ratio);
  if (f.hicache_size_gb > 0)
    options.tier_settings["hicache_size_gb"] = fmt::format("{}", f.hicache_size_gb);

  std::optional<plan::LogPrediction> prediction;
  if (!f.from_log.empty()) {
    logs::LogScan scan = f.from_log == "-" ? logs::scan_log(registry, std::cin, "stdin")
                                           : logs::scan_log_file(registry, f.from_log);
    if (scan.launches.empty())
      throw InputError(f.from_log, fmt::format("no start-up lines of a known engine ({}) found",
                                               fmt::join(registry.names(), ", ")));
    if (f.launch < 0 || f.launch > static_cast<int>(scan.launches.size()))
      throw InputError("--launch",
                       "the log has " + std::to_string(scan.launches.size()) + " launches");
    const logs::Launch& launch = f.launch > 0 ? scan.launches[f.launch - 1] : scan.launches.back();
    plan::LogSetup setup = plan::reconcile_log_flags(registry, launch.memory, options, f.given);
    prediction = plan::predict_from_log(registry, model, setup);
    if (std::string note = logs::chosen_launch_note(scan, launch); !note.empty())
      prediction->notes.insert(prediction->notes.begin(), note);
    for (const report::Finding& finding : launch.findings)
      if (finding.id == "log-figures-inconsistent") prediction->findings.push_back(finding);
    options = setup.options;
    // The page the prediction assumed (and said so): the plan runs the same pool.
    if (prediction->assumed_page_size && !options.page_size)
      options.page_size = prediction->assumed_page_size;
  }
  plan::CapacityPlan capacity = plan::plan_capacity(registry, model, options);
  report::Report report =
      plan::to_report(model, capacity, prediction ? &*prediction : nullptr, f.explain);
  // The figures the log printed, each against the range kvaudit predicts, are the gate.
  report::ExitGate gate;
  if (prediction)
    for (const auto& check : prediction->checks)
      gate.checks.push_back(
          {"figure", check.id, check.inside,
           fmt::format("{}: the log printed {}, kvaudit predicts {}..{}", check.what, check.printed,
                       check.predicted.lo, check.predicted.hi)});
  if (!f.from_log.empty() && f.from_log != "-") f.output.sarif_fallback_file = f.from_log;
  emit(report, f.output, gate);
  return report::gate_fails(report, gate) ? kExitGateFailed : kExitOk;
}

}  // namespace

void add_plan_command(CLI::App& app, Runner& run, EngineData& engines) {
  auto flags = std::make_shared<PlanFlags>();
  CLI::App* cmd = app.add_subcommand("plan",
                                     "KV-cache capacity per dtype as the engine computes it "
                                     "(bytes/token/GPU, pool, tokens, concurrency)");
  cmd->add_option("checkpoint", flags->checkpoint,
                  "Checkpoint folder, config.json, or a hub repository org/model[@revision]")
      ->required();
  add_checkpoint_source_options(*cmd, flags->source);
  CLI::Option* engine_opt = cmd->add_option("--engine", flags->engine,
                                            "The engine: a file of data/engines/ (default sglang)");
  CLI::Option* version_opt =
      cmd->add_option("--engine-version", flags->engine_version,
                      "Engine release whose sizing rules apply (default: the newest known)");
  CLI::Option* tp_opt =
      cmd->add_option("--tp", flags->tp, "Tensor parallel size")->check(CLI::PositiveNumber);
  cmd->add_option("--dcp", flags->dcp, "Decode context parallel size")->check(CLI::PositiveNumber);
  cmd->add_option("--mamba-ssm-dtype", flags->mamba_ssm_dtype,
                  "Recurrent state dtype of GDN/Mamba hybrids (default: the engine's)");
  cmd->add_option("--speculative-draft-layers", flags->speculative_draft_layers,
                  "EAGLE/MTP draft layers sharing the KV pool (SGLang)");
  cmd->add_option("--mamba-radix-cache-strategy", flags->mamba_radix_cache_strategy,
                  "SGLang hybrids: auto, no_buffer, extra_buffer, extra_buffer_lazy (state slots "
                  "per running request; default: the release's)")
      ->check(CLI::IsMember({"auto", "no_buffer", "extra_buffer", "extra_buffer_lazy"}));
  cmd->add_flag("--disable-radix-cache", flags->disable_radix_cache,
                "SGLang --disable-radix-cache (hybrids: one state slot per request)");
  cmd->add_flag("--disable-overlap-schedule", flags->disable_overlap_schedule,
                "SGLang --disable-overlap-schedule (hybrids: extra_buffer holds one slot less)");
  cmd->add_option("--context-length", flags->context_length,
                  "The engine's context length (default: the model's max_position_embeddings)")
      ->check(CLI::PositiveNumber);
  CLI::Option* pp_opt =
      cmd->add_option("--pp", flags->pp, "Pipeline parallel size")->check(CLI::PositiveNumber);
  CLI::Option* dp_opt =
      cmd->add_option("--dp", flags->dp, "Data parallel size (with --dp-attention)")
          ->check(CLI::PositiveNumber);
  CLI::Option* dp_attention_opt = cmd->add_flag("--dp-attention", flags->dp_attention,
                                                "DP attention: KV heads split over TP/DP");
  CLI::Option* kv_opt =
      cmd->add_option("--kv-cache-dtype", flags->kv_cache_dtypes,
                      "One or several (comma-separated); default: every dtype the engine accepts");
  cmd->add_option("--gpu", flags->gpu,
                  "GPU preset (data/gpus.json): h100, h200, b200, rtx-pro-6000, a100, l40s, 4090, "
                  "5090, mi300x");
  cmd->add_option("--gpu-mem", flags->gpu_mem, "GPU memory per device: 96GiB, 98304MiB, 80GB");
  CLI::Option* fraction_opt = cmd->add_option(
      "--mem-fraction", flags->mem_fraction,
      "SGLang --mem-fraction-static / vLLM --gpu-memory-utilization (default: the engine's)");
  cmd->add_option("--weights-per-gpu", flags->weights_per_gpu,
                  "Weight bytes per GPU (default: safetensors bytes / TP / PP)");
  cmd->add_option("--context", flags->contexts,
                  "Context lengths for the concurrency columns (8k,32k,128k)");
  cmd->add_option("--max-num-batched-tokens", flags->max_num_batched_tokens,
                  "vLLM --max-num-batched-tokens: sliding-window groups hold window - 1 + this "
                  "per request (default: the window alone, the most requests)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--max-running-requests", flags->max_running_requests,
                  "Cap on concurrent requests");
  cmd->add_option("--page-size", flags->page_size, "SGLang --page-size / vLLM --block-size");
  cmd->add_option("--max-total-tokens", flags->max_total_tokens, "SGLang --max-total-tokens cap");
  cmd->add_flag("--enable-hierarchical-cache", flags->hierarchical_cache,
                "SGLang HiCache: size the host pool each rank mirrors its device pool into");
  cmd->add_option("--hicache-ratio", flags->hicache_ratio,
                  "SGLang host pool = this x the device pool's tokens (default: the engine's)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--hicache-size", flags->hicache_size_gb,
                  "SGLang host pool per rank in GB (1e9 bytes); overrides --hicache-ratio")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--from-log", flags->from_log,
                  "Reproduce a launch's capacity from its start-up log ('-' = stdin)");
  cmd->add_option("--launch", flags->launch,
                  "With --from-log: use launch N (1-based) instead of the latest");
  cmd->add_flag("--explain", flags->explain, "Show each number's derivation");
  add_output_options(*cmd, flags->output);
  cmd->callback([=, &run, &engines] {
    // Which flags were given, so --from-log can check them against the log.
    plan::LogFlagOverrides& given = flags->given;
    if (engine_opt->count()) given.engine = flags->engine;
    if (version_opt->count()) given.engine_version = flags->engine_version;
    if (tp_opt->count()) given.tp = flags->tp;
    if (pp_opt->count()) given.pp = flags->pp;
    if (dp_opt->count()) given.dp = flags->dp;
    if (dp_attention_opt->count()) given.dp_attention = flags->dp_attention;
    if (kv_opt->count() && !split_list(flags->kv_cache_dtypes).empty())
      given.kv_cache_dtype = split_list(flags->kv_cache_dtypes).front();
    if (fraction_opt->count()) given.memory_fraction = flags->mem_fraction;
    run = [flags, &engines] { return run_plan(engines.registry(), *flags); };
  });
}

}  // namespace kvaudit::cli
