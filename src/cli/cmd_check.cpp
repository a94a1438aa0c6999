// kvaudit check: checkpoint + launch -> findings.
#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <iostream>

#include "audit/audit.h"
#include "calibrate/calibrate.h"
#include "cli/commands.h"
#include "decide/decide.h"
#include "logs/logs.h"
#include "plan/plan.h"
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
  std::string kv_policy = "evidence";
  std::string kv_stats;
  std::string attention_backend;
  // The decision table: what sizes the KV pools, at which context lengths, and where the
  // corrected unit goes.
  std::string gpu;
  std::string gpu_mem;
  std::string from_log;
  std::string contexts;
  std::string write_unit;
  std::string write_overlay;
  CheckpointSource source;
  OutputOptions output;
};

constexpr const char* kCheckUsage =
    "kvaudit check: find silent KV-cache precision threats in a checkpoint and launch.\n"
    "usage: kvaudit check CHECKPOINT_DIR --engine ENGINE [--engine-version V] [--tp N] ...\n"
    "       kvaudit check CHECKPOINT_DIR --launch \"python -m sglang.launch_server ...\"\n"
    "       kvaudit check CHECKPOINT_DIR --unit sglang.service\n"
    "Try the bundled example: make demo   (runs kvaudit check on "
    "examples/qwen3.5-397b-a17b-nvfp4)\n"
    "kvaudit check --help lists every flag.\n";

decide::MemorySource memory_source(const engines::Registry& registry, const CheckOptions& options) {
  decide::MemorySource memory;
  const GpuMemory gpu = gpu_memory_from_flags(options.gpu, options.gpu_mem);
  memory.gpu_memory_bytes = gpu.bytes;
  memory.gpu_name = gpu.name;
  if (!options.from_log.empty()) {
    logs::LogScan scan = options.from_log == "-" ? logs::scan_log(registry, std::cin, "stdin")
                                                 : logs::scan_log_file(registry, options.from_log);
    if (scan.launches.empty())
      throw InputError(options.from_log,
                       fmt::format("no start-up lines of a known engine ({}) found",
                                   fmt::join(registry.names(), ", ")));
    memory.logged = scan.launches.back().memory;
    memory.log_label = fmt::format("the latest launch of {} (launch {} of {})",
                                   options.from_log == "-" ? "stdin" : options.from_log,
                                   scan.launches.size(), scan.launches.size());
  }
  return memory;
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  size_t begin = 0;
  while (begin < text.size()) {
    size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    lines.push_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
  return lines;
}

// The unit text with only the changed lines, as "-" / "+" pairs.
std::vector<std::string> line_diff(const std::string& before, const std::string& after) {
  std::vector<std::string> a = split_lines(before), b = split_lines(after);
  size_t head = 0;
  while (head < a.size() && head < b.size() && a[head] == b[head]) ++head;
  size_t tail = 0;
  while (tail < a.size() - head && tail < b.size() - head &&
         a[a.size() - 1 - tail] == b[b.size() - 1 - tail])
    ++tail;
  std::vector<std::string> out;
  for (size_t i = head; i < a.size() - tail; ++i) out.push_back("- " + a[i]);
  for (size_t i = head; i < b.size() - tail; ++i) out.push_back("+ " + b[i]);
  return out;
}

void add_decision(const engines::Registry& registry, const CheckOptions& options,
                  const audit::CheckInput& input, const audit::CheckResult& result,
                  report::Report& report) {
  decide::DecisionOptions request;
  if (!options.contexts.empty())
    request.contexts = parse_token_counts(options.contexts, "--context", "32k,128k");
  request.memory = memory_source(registry, options);
  decide::Decision decision = decide::decide(registry, input, result, request);

  std::vector<std::string> fix_lines;
  const decide::KvOption* fixed = nullptr;
  for (const auto& option : decision.options)
    if (option.id == decision.recommended) fixed = &option;
  if (!options.write_unit.empty() && options.unit.empty())
    throw InputError("--write-unit", "needs --unit (the unit to correct)");
  decide::Verification where;
  if (!options.unit.empty()) where.unit_name = std::filesystem::path(options.unit).stem().string();
  const decide::ServerAddress address = decide::server_address(input.flags, *input.engine);
  where.url = address.url;
  where.log_names_kv_dtype = decide::log_names_kv_dtype(*input.engine);
  where.checkpoint =
      !options.write_overlay.empty() ? options.write_overlay : input.model.dir.string();
  where.port_source = address.port_source;
  // --write-overlay asks for the 16-bit option whatever the verdict: the user's own policy.
  const decide::KvOption* overlay_option = nullptr;
  for (const auto& option : decision.options)
    if (option.overlay) overlay_option = &option;
  if (!options.write_overlay.empty() && overlay_option && (!fixed || !fixed->overlay))
    fixed = overlay_option;
  if (fixed && fixed->overlay) {
    // No launch value gives this option: a copy of the checkpoint's config files does.
    fix_lines.push_back(fixed->change);
    if (!options.write_overlay.empty()) {
      const calibrate::SixteenBitOverlayResult written = calibrate::write_sixteen_bit_overlay(
          *input.engine, input.flags, input.model, options.write_overlay);
      fix_lines.push_back(fmt::format(
          "wrote {}: {} ({} entries linked to the original); {} "
          "resolves it to {} under auto",
          written.out_dir.string(), fmt::join(written.edited, "; "), written.linked.size(),
          input.engine->engine, written.resolved.kv_cache_dtype));
      fix_lines.push_back(fmt::format("serve {} in place of {} (the model path of the launch)",
                                      written.out_dir.string(), input.model.dir.string()));
    }
  } else if (!options.write_overlay.empty()) {
    throw InputError("--write-overlay",
                     fixed ? fmt::format("{} gives this fix with a launch value ({}): no overlay "
                                         "is needed",
                                         input.engine->engine, fixed->change)
                           : "nothing to correct: the launch has no critical finding");
  } else if (fixed &&
             !engines::kv_dtype_fix(*input.engine, result.resolved.version, fixed->kv_cache_dtype)
                  .setting.starts_with("-")) {
    // This release sets the KV dtype in its config file, not with a flag: say where.
    const engines::KvDtypeFix spelled =
        engines::kv_dtype_fix(*input.engine, result.resolved.version, fixed->kv_cache_dtype);
    if (!options.write_unit.empty())
      throw InputError("--write-unit",
                       fmt::format("{} {} sets the KV dtype in its config file, not on the "
                                   "command line: {}",
                                   input.engine->engine,
                                   result.resolved.version.latest
                                       ? input.engine->latest_known_version
                                       : engines::version_text(result.resolved.version),
                                   spelled.text));
    fix_lines.push_back(spelled.text);
  } else if (fixed) {
    const std::string change =
        engines::kv_dtype_fix(*input.engine, result.resolved.version, fixed->kv_cache_dtype)
            .setting +
        " " + fixed->flag_value;
    if (!options.unit.empty()) {
      const std::string original = read_text_file(options.unit);
      const std::string corrected =
          decide::fix_unit(original, *input.engine, fixed->flag_value, options.unit);
      for (const auto& line : line_diff(original, corrected)) fix_lines.push_back(line);
      if (!options.write_unit.empty()) {
        std::error_code same;
        if (std::filesystem::equivalent(options.unit, options.write_unit, same))
          throw InputError(options.write_unit,
                           "is the unit itself; the original stays untouched, name another file");
        write_file_atomically(options.write_unit, corrected);
        fix_lines.push_back(fmt::format("wrote {} (the unit with {}, every other byte kept)",
                                        options.write_unit, change));
        fix_lines.push_back(
            fmt::format("sudo install -m 644 {} /etc/systemd/system/{}.service && sudo systemctl "
                        "daemon-reload && sudo systemctl restart {}",
                        options.write_unit, where.unit_name, where.unit_name));
      } else {
        fix_lines.push_back(fmt::format(
            "kvaudit check ... --unit {} --write-unit {}.fixed.service writes the corrected unit",
            options.unit, where.unit_name));
      }
    } else if (!options.launch.empty()) {
      fix_lines.push_back(decide::fix_command(options.launch, *input.engine, fixed->flag_value));
    } else {
      fix_lines.push_back(fmt::format("launch with {}", change));
    }
  }
  if (!fixed && !options.write_unit.empty())
    throw InputError("--write-unit", decision.options.front().critical == 0
                                         ? "nothing to correct: the launch has no critical finding"
                                         : "no KV option clears the critical findings; see the "
                                           "decision table");
  std::vector<std::string> verify_lines;
  if (fixed) verify_lines = decide::verification_commands(decision, *fixed, where);
  decide::add_to_report(decision, fix_lines, verify_lines, report);
}

int run_check_command(const engines::Registry& registry, CheckOptions& options) {
  if (options.checkpoint.empty() && options.launch.empty() && options.unit.empty()) {
    std::cerr << kCheckUsage;
    return kExitInputError;
  }
  engines::LaunchFlags flags;
  if (!options.launch.empty())
    flags = engines::parse_launch_command(registry, options.launch, "--launch");
  if (!options.unit.empty()) flags = engines::parse_systemd_unit(registry, options.unit);
  if (!options.engine.empty()) {
    if (!flags.engine.empty() && flags.engine != options.engine)
      throw InputError("--engine",
                       "says " + options.engine + " but the launch command starts " + flags.engine);
    flags.engine = options.engine;
  }
  if (flags.engine.empty())
    throw InputError("--engine", fmt::format("which engine? pass --engine {}, --launch or --unit",
                                             fmt::join(registry.names(), "|")));
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
  if (!options.attention_backend.empty())
    flags.attention_backend = ascii_lower(options.attention_backend);
  std::string checkpoint_path = options.checkpoint.empty() ? flags.model_path : options.checkpoint;
  if (checkpoint_path.empty())
    throw InputError("check", "no checkpoint folder given and the launch command names none");

  audit::CheckInput input;
  input.engine = &registry.engine(flags.engine);
  input.policy = *audit::parse_kv_policy(options.kv_policy);  // CLI11 checked the spelling
  const audit::PublishedEvidence published = load_published_damage(registry);
  input.published = &published;
  if (!options.kv_stats.empty()) input.measured = measured_range(options.kv_stats);
  if (!options.gpu.empty()) {
    const plan::GpuPreset gpu = plan::find_gpu(options.gpu);
    flags.gpu_arch = gpu.arch;
    flags.platform = gpu.platform;
    input.gpu_name = gpu.name;
  }
  input.version_given = !flags.engine_version.empty();
  if (input.version_given && !engines::parse_version(flags.engine_version))
    throw InputError("--engine-version", "cannot read version '" + flags.engine_version + "'");
  auto start = std::chrono::steady_clock::now();
  input.model = read_checkpoint_argument(checkpoint_path, options.source);
  input.read_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  input.flags = flags;

  audit::CheckResult result = audit::run_check(input);
  report::Report report = audit::to_report(input, result);
  add_decision(registry, options, input, result, report);
  audit::FailOn fail_on = options.fail_on == "never"     ? audit::FailOn::never
                          : options.fail_on == "warning" ? audit::FailOn::warning
                                                         : audit::FailOn::critical;
  report::ExitGate gate;
  if (fail_on != audit::FailOn::never)
    gate.fail_on =
        fail_on == audit::FailOn::warning ? report::Severity::warning : report::Severity::critical;
  // A finding no evidence places is shown on the unit it judges (code scanning needs a file).
  options.output.sarif_fallback_file = options.unit;
  emit(report, options.output, gate);
  return audit::fails_gate(result.findings, fail_on) ? kExitGateFailed : kExitOk;
}

}  // namespace

void add_check_command(CLI::App& app, Runner& run, EngineData& engines) {
  auto options = std::make_shared<CheckOptions>();
  CLI::App* check =
      app.add_subcommand("check", "Audit a checkpoint + launch for silent KV-cache precision loss");
  check->add_option("checkpoint", options->checkpoint,
                    "Checkpoint folder, a bare config.json, or a hub repository "
                    "org/model[@revision] (read without its weights)");
  add_checkpoint_source_options(*check, options->source);
  check->add_option("--engine", options->engine,
                    "The engine: a file of data/engines/ (sglang, vllm, trtllm, ...)");
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
  check->add_option("--gpu", options->gpu,
                    "GPU preset (data/gpus.json) sizing each KV option: h100, h200, b200, "
                    "rtx-pro-6000, ...");
  check->add_option("--gpu-mem", options->gpu_mem, "GPU memory per device: 96GiB, 80GB");
  check->add_option("--from-log", options->from_log,
                    "A start-up log (or - for stdin) whose printed memory sizes each option");
  check->add_option("--context", options->contexts,
                    "Context lengths for the concurrency columns (default 32k,128k and the "
                    "launch's context length)");
  check->add_option("--write-overlay", options->write_overlay,
                    "Write the checkpoint-config overlay the fix needs where the engine has no "
                    "16-bit KV value (TensorRT-LLM): a new folder, the original untouched");
  check->add_option("--write-unit", options->write_unit,
                    "Write the corrected --unit here (atomically; the original stays untouched)");
  check->add_option("--fail-on", options->fail_on, "Exit 1 when a finding is at least this severe")
      ->check(CLI::IsMember({"critical", "warning", "never"}));
  check
      ->add_option("--kv-policy", options->kv_policy,
                   "What the KV cache may lose: lossless (any quantized KV cache is critical), "
                   "evidence (default: severity from what is known about this model's K/V "
                   "range), permissive (only broken combinations and start-up failures)")
      ->check(CLI::IsMember({"lossless", "evidence", "permissive"}));
  check->add_option("--kv-stats", options->kv_stats,
                    "K/V maxima measured on this model (kvaudit-kv-stats/1: calibrate "
                    "--stats-out, or the same file from the serving GPUs): the strongest evidence");
  check->add_option("--attention-backend", options->attention_backend,
                    "The attention backend the server runs (when the launch does not name it), "
                    "for combinations known to break on one backend");
  add_output_options(*check, options->output);
  check->callback([options, &run, &engines] {
    run = [options, &engines] { return run_check_command(engines.registry(), *options); };
  });
}

}  // namespace kvaudit::cli
