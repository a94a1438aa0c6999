// kvaudit check: checkpoint + launch -> findings.
#include <chrono>
#include <iostream>

#include "audit/audit.h"
#include "cli/commands.h"
#include "util/util.h"

namespace kvaudit::cli {

namespace {

struct CheckOptions {
  std::string checkpoint;
  std::string engine;
  std::string engine_version;
  std::string kv_cache_dtype;
  int tp = 0, pp = 0, dp = 0;
  bool dp_attention = false;
  std::string quantization_param_path;
  std::string context_length;
  std::string dtype;
  std::string mamba_ssm_dtype;
  bool calculate_kv_scales = false;
  std::string skip_layers;
  std::string launch;
  std::string unit;
  std::string fail_on = "critical";
  CheckpointSource source;
  OutputOptions output;
};

constexpr const char* kCheckUsage =
    "kvaudit check: find silent KV-cache precision threats in a checkpoint and launch.\n"
    "usage: kvaudit check CHECKPOINT_DIR --engine sglang|vllm [--engine-version V] [--tp N] ...\n"
    "       kvaudit check CHECKPOINT_DIR --launch \"python -m sglang.launch_server ...\"\n"
    "       kvaudit check CHECKPOINT_DIR --unit sglang.service\n"
    "Try the bundled example: make demo   (runs kvaudit check on "
    "examples/qwen3.5-397b-a17b-nvfp4)\n"
    "kvaudit check --help lists every flag.\n";

int run_check_command(CheckOptions& options) {
  if (options.checkpoint.empty() && options.launch.empty() && options.unit.empty()) {
    std::cerr << kCheckUsage;
    return kExitInputError;
  }
  engines::LaunchFlags flags;
  if (!options.launch.empty()) flags = engines::parse_launch_command(options.launch, "--launch");
  if (!options.unit.empty()) flags = engines::parse_systemd_unit(options.unit);
  if (!options.engine.empty()) {
    if (!flags.engine.empty() && flags.engine != options.engine)
      throw InputError("--engine",
                       "says " + options.engine + " but the launch command starts " + flags.engine);
    flags.engine = options.engine;
  }
  if (flags.engine.empty())
    throw InputError("--engine", "which engine? pass --engine sglang|vllm, --launch or --unit");
  if (flags.source.empty()) flags.source = "launch flags";
  flags.engine_version = options.engine_version;
  if (!options.kv_cache_dtype.empty()) {
    flags.kv_cache_dtype = options.kv_cache_dtype;
    flags.kv_cache_dtype_flag = "--kv-cache-dtype";
  }
  if (options.tp) flags.tp = options.tp;
  if (options.pp) flags.pp = options.pp;
  if (options.dp) flags.dp = options.dp;
  flags.dp_attention |= options.dp_attention;
  if (!options.quantization_param_path.empty())
    flags.quantization_param_path = options.quantization_param_path;
  if (!options.context_length.empty()) {
    auto tokens = parse_token_count(options.context_length);
    if (!tokens) throw InputError("--context-length", "expects a token count like 131072 or 128k");
    flags.context_length = *tokens;
  }
  if (!options.dtype.empty()) flags.dtype = options.dtype;
  if (!options.mamba_ssm_dtype.empty()) flags.mamba_ssm_dtype = options.mamba_ssm_dtype;
  flags.calculate_kv_scales |= options.calculate_kv_scales;
  if (!options.skip_layers.empty()) flags.kv_cache_dtype_skip_layers = options.skip_layers;
  std::string checkpoint_path = options.checkpoint.empty() ? flags.model_path : options.checkpoint;
  if (checkpoint_path.empty())
    throw InputError("check", "no checkpoint folder given and the launch command names none");

  audit::CheckInput input;
  input.engine = &engines::engine_model(flags.engine);
  input.version_given = !flags.engine_version.empty();
  if (input.version_given && !engines::parse_version(flags.engine_version))
    throw InputError("--engine-version", "cannot read version '" + flags.engine_version + "'");
  auto start = std::chrono::steady_clock::now();
  input.model = read_checkpoint_argument(checkpoint_path, options.source);
  input.read_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  input.flags = flags;

  audit::CheckResult result = audit::run_check(input);
  emit(audit::build_check_report(input, result), options.output);
  audit::FailOn fail_on = options.fail_on == "never"     ? audit::FailOn::never
                          : options.fail_on == "warning" ? audit::FailOn::warning
                                                         : audit::FailOn::critical;
  return audit::fails_gate(result.findings, fail_on) ? kExitGateFailed : kExitOk;
}

}  // namespace

void add_check_command(CLI::App& app, Runner& run) {
  auto options = std::make_shared<CheckOptions>();
  CLI::App* check =
      app.add_subcommand("check", "Audit a checkpoint + launch for silent KV-cache precision loss");
  check->add_option("checkpoint", options->checkpoint,
                    "Checkpoint folder, a bare config.json, or a hub repository "
                    "org/model[@revision] (read without its weights)");
  add_checkpoint_source_options(*check, options->source);
  check->add_option("--engine", options->engine, "sglang or vllm")
      ->check(CLI::IsMember(engines::known_engines()));
  check->add_option("--engine-version", options->engine_version,
                    "Engine version, e.g. 0.5.9 (default: latest known)");
  check->add_option("--kv-cache-dtype", options->kv_cache_dtype,
                    "As passed to the engine (default auto)");
  check->add_option("--tp", options->tp, "Tensor-parallel size");
  check->add_option("--pp", options->pp, "Pipeline-parallel size");
  check->add_option("--dp", options->dp, "Data-parallel size");
  check->add_flag("--dp-attention", options->dp_attention, "SGLang --enable-dp-attention");
  check->add_option("--quantization-param-path", options->quantization_param_path,
                    "SGLang KV scales JSON");
  check->add_option("--context-length", options->context_length,
                    "Requested context (e.g. 262144 or 256k)");
  check->add_option("--dtype", options->dtype, "Engine --dtype");
  check->add_option("--mamba-ssm-dtype", options->mamba_ssm_dtype,
                    "Linear-attention state dtype flag");
  check->add_flag("--calculate-kv-scales", options->calculate_kv_scales, "vLLM dynamic KV scales");
  check->add_option("--kv-cache-dtype-skip-layers", options->skip_layers,
                    "vLLM: layers kept in the model dtype (indices or sliding_window)");
  check->add_option("--launch", options->launch, "The engine's launch command line");
  check->add_option("--unit", options->unit,
                    "A systemd unit file whose ExecStart launches the engine");
  check->add_option("--fail-on", options->fail_on, "Exit 1 when a finding is at least this severe")
      ->check(CLI::IsMember({"critical", "warning", "never"}));
  add_output_options(*check, options->output);
  check->callback([options, &run] { run = [options] { return run_check_command(*options); }; });
}

}  // namespace kvaudit::cli
