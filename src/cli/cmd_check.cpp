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
  std::string launch_from;  // a manifest, compose file, --config file or unit
  std::string container;    // which of its launches (--container NAME)
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
    "       kvaudit check CHECKPOINT_DIR --launch-from deployment.yaml   (Kubernetes, compose,\n"
    "                                    helm template output, an engine's --config file)\n"
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

// The launch file's corrected text, with the lines that changed and where it goes.
void fix_launch_file(const CheckOptions& options, const std::vector<engines::LaunchFlags>& launches,
                     const std::string& value, const std::string& change,
                     std::vector<std::string>& fix_lines) {
  std::vector<engines::TextEdit> edits;
  for (const auto& launch : launches)
    if (launch.kv_dtype_edit) edits.push_back(*launch.kv_dtype_edit);
  const engines::LaunchFlags& first = launches.front();
  if (edits.size() != launches.size()) {
    if (!options.write_unit.empty())
      throw InputError(options.write_unit,
                       fmt::format("kvaudit cannot tell where {} takes the KV dtype of {}; set {} "
                                   "there by hand",
                                   first.launch_file, first.workload, change));
    fix_lines.push_back(
        fmt::format("set {} in {} ({})", change, first.launch_file,
                    first.workload.empty() ? first.launch_file_kind : first.workload));
    return;
  }
  const std::string& target = edits.front().file;
  for (const auto& edit : edits)
    if (edit.file != target)
      throw InputError(options.launch_from, "the KV dtype is set in more than one file (" + target +
                                                ", " + edit.file +
                                                "): correct them one --container at a time");
  const std::string original = read_text_file(target);
  const std::string corrected = decide::fix_launch_file(original, edits, value, target);
  for (const auto& line : line_diff(original, corrected)) fix_lines.push_back(line);
  if (options.write_unit.empty()) {
    fix_lines.push_back(fmt::format(
        "kvaudit check ... --launch-from {} --write-unit {}.fixed writes the corrected file",
        options.launch_from, std::filesystem::path(target).filename().string()));
    return;
  }
  std::error_code same;
  if (std::filesystem::equivalent(target, options.write_unit, same))
    throw InputError(options.write_unit,
                     "is the file itself; the original stays untouched, name another file");
  write_file_atomically(options.write_unit, corrected);
  fix_lines.push_back(fmt::format("wrote {} ({} with {}, every other byte kept)",
                                  options.write_unit, target, change));
  if (first.launch_file_kind.rfind("Kubernetes", 0) == 0)
    fix_lines.push_back(fmt::format(
        "kubectl apply -f {} (for `helm template` output, make the same change in the chart's "
        "values: the rendered file is regenerated)",
        options.write_unit));
  else if (first.launch_file_kind == "docker-compose file")
    fix_lines.push_back(
        fmt::format("cp {} {} && docker compose -f {} up -d", options.write_unit, target, target));
}

void add_decision(const engines::Registry& registry, const CheckOptions& options,
                  const audit::CheckInput& input, const audit::CheckResult& result,
                  const std::vector<engines::LaunchFlags>& file_launches, report::Report& report) {
  decide::DecisionOptions request;
  if (!options.contexts.empty())
    request.contexts = parse_token_counts(options.contexts, "--context", "32k,128k");
  request.memory = memory_source(registry, options);
  decide::Decision decision = decide::decide(registry, input, result, request);

  std::vector<std::string> fix_lines;
  const decide::KvOption* fixed = nullptr;
  for (const auto& option : decision.options)
    if (option.id == decision.recommended) fixed = &option;
  if (!options.write_unit.empty() && options.unit.empty() && options.launch_from.empty())
    throw InputError("--write-unit", "needs --unit or --launch-from (the file to correct)");
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
    if (input.flags.kv_dtype_edit && input.flags.kv_dtype_edit->file == input.flags.config_file) {
      // The launch names its config file: correct that file.
      CheckOptions config_options = options;
      config_options.launch_from = input.flags.config_file;
      fix_launch_file(config_options, {input.flags}, spelled.value,
                      spelled.setting + ": " + spelled.value, fix_lines);
    } else if (!options.write_unit.empty()) {
      throw InputError("--write-unit",
                       fmt::format("{} {} sets the KV dtype in its config file, not on the "
                                   "command line: {}",
                                   input.engine->engine,
                                   result.resolved.version.latest
                                       ? input.engine->latest_known_version
                                       : engines::version_text(result.resolved.version),
                                   spelled.text));
    } else {
      fix_lines.push_back(spelled.text);
    }
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
    } else if (!file_launches.empty()) {
      fix_launch_file(options, file_launches, fixed->flag_value, change, fix_lines);
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

// The check's own flags over what the launch says (--engine must agree with it).
void apply_flag_overrides(const engines::Registry& registry, const CheckOptions& options,
                          engines::LaunchFlags& flags) {
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
}

// The launches of a file that --container names (all when it is empty).
std::vector<engines::LaunchFlags> select_launches(std::vector<engines::LaunchFlags> launches,
                                                  const std::string& container,
                                                  const std::string& file) {
  if (container.empty()) return launches;
  std::vector<engines::LaunchFlags> chosen;
  std::vector<std::string> names;
  for (auto& launch : launches) {
    names.push_back(launch.workload);
    const std::string& w = launch.workload;
    for (const std::string& marker : {" container " + container, "service " + container})
      if (const size_t at = w.find(marker); at != std::string::npos) {
        const size_t end = at + marker.size();
        if (end == w.size() || w[end] == ',' || w[end] == ' ') {
          chosen.push_back(launch);
          break;
        }
      }
  }
  if (chosen.empty())
    throw InputError("--container", fmt::format("{} runs no container or service named {}: {}",
                                                file, container, fmt::join(names, "; ")));
  return chosen;
}

// Whether two launches run the same settings (two containers of one LeaderWorkerSet).
bool same_settings(const engines::LaunchFlags& a, const engines::LaunchFlags& b) {
  return a.engine == b.engine && a.kv_cache_dtype == b.kv_cache_dtype &&
         a.model_path == b.model_path && a.tp == b.tp && a.pp == b.pp && a.dp == b.dp &&
         a.dcp == b.dcp && a.dp_attention == b.dp_attention &&
         a.quantization_param_path == b.quantization_param_path &&
         a.quantization == b.quantization && a.dtype == b.dtype &&
         a.context_length == b.context_length && a.memory_fraction == b.memory_fraction &&
         a.mamba_ssm_dtype == b.mamba_ssm_dtype &&
         a.kv_cache_dtype_skip_layers == b.kv_cache_dtype_skip_layers &&
         a.speculative_algorithm == b.speculative_algorithm &&
         a.speculative_draft_kv_cache_dtype == b.speculative_draft_kv_cache_dtype &&
         a.calculate_kv_scales == b.calculate_kv_scales &&
         a.attention_backend == b.attention_backend && a.page_size == b.page_size &&
         a.config_file == b.config_file;
}

// The file's other launches: their findings join this report, each named by its workload;
// and a file that holds both sides of a disaggregated pair has the two compared.
void check_other_launches(const engines::Registry& registry, const CheckOptions& options,
                          const audit::CheckInput& input, const audit::CheckResult& result,
                          const std::vector<engines::LaunchFlags>& file_launches,
                          const std::vector<engines::LaunchFlags>& other_launches,
                          report::Report& report, std::vector<report::Finding>& all_findings) {
  std::vector<audit::TransferSide> sides;
  sides.reserve(file_launches.size() + other_launches.size());
  for (const auto& launch : file_launches)
    sides.push_back({launch.workload, launch.engine, audit::transfer_role(launch),
                     result.resolved.kv_cache_dtype, launch.dtype});
  for (const auto& other : other_launches) {
    audit::CheckInput other_input = input;
    other_input.flags = other;
    apply_flag_overrides(registry, options, other_input.flags);
    other_input.flags.gpu_arch = input.flags.gpu_arch;
    other_input.flags.platform = input.flags.platform;
    const audit::CheckResult other_result = audit::run_check(other_input);
    sides.push_back({other.workload, other.engine, audit::transfer_role(other),
                     other_result.resolved.kv_cache_dtype, other.dtype});
    for (report::Finding finding : other_result.findings) {
      finding.title = other.workload + ": " + finding.title;
      all_findings.push_back(finding);
      report.findings.push_back(std::move(finding));
    }
    report.notes.push_back(fmt::format(
        "{} also runs {} with other settings ({} KV cache: {}); its findings are named by it, "
        "and the decision table is for {} (--container picks one)",
        options.launch_from, other.workload, other.kv_cache_dtype,
        other_result.resolved.kv_cache_dtype, input.flags.workload));
  }
  if (options.launch_from.empty()) return;
  audit::TransferPairCheck pairs = audit::check_transfer_pairs(sides, options.launch_from);
  for (auto& finding : pairs.findings) {
    all_findings.push_back(finding);
    report.findings.push_back(std::move(finding));
  }
  for (auto& note : pairs.notes) report.notes.push_back(std::move(note));
}

int run_check_command(const engines::Registry& registry, CheckOptions& options) {
  if (options.checkpoint.empty() && options.launch.empty() && options.unit.empty() &&
      options.launch_from.empty()) {
    std::cerr << kCheckUsage;
    return kExitInputError;
  }
  engines::LaunchFlags flags;
  if (int given = !options.launch.empty() + !options.unit.empty() + !options.launch_from.empty();
      given > 1)
    throw InputError("check", "give one launch: --launch, --unit or --launch-from");
  if (!options.launch.empty())
    flags = engines::parse_launch_command(registry, options.launch, "--launch");
  if (!options.unit.empty()) flags = engines::parse_systemd_unit(registry, options.unit);
  std::vector<engines::LaunchFlags> file_launches;   // the launches checked as one
  std::vector<engines::LaunchFlags> other_launches;  // launches of the file that differ
  std::string same_launch_note;
  if (!options.launch_from.empty()) {
    file_launches =
        select_launches(engines::read_launch_file(registry, options.launch_from, options.engine),
                        options.container, options.launch_from);
    if (file_launches.front().launch_file_kind == "systemd unit") {
      options.unit = options.launch_from;  // --write-unit corrects it as --unit does
      options.launch_from.clear();
      flags = file_launches.front();
      file_launches.clear();
    } else {
      // Launches that run the same settings are checked once; the fix changes each.
      for (size_t i = 1; i < file_launches.size();) {
        if (same_settings(file_launches[i], file_launches.front())) {
          ++i;
          continue;
        }
        other_launches.push_back(file_launches[i]);
        file_launches.erase(file_launches.begin() + static_cast<std::ptrdiff_t>(i));
      }
      flags = file_launches.front();
      if (file_launches.size() > 1) {
        std::vector<std::string> names;
        names.reserve(file_launches.size());
        for (const auto& launch : file_launches) names.push_back(launch.workload);
        same_launch_note =
            fmt::format("{} launches of {} run the same settings, checked once: {}",
                        file_launches.size(), options.launch_from, fmt::join(names, "; "));
      }
      if (!other_launches.empty() && !options.write_unit.empty())
        throw InputError("--write-unit",
                         fmt::format("{} holds launches with different settings; pass "
                                     "--container NAME to correct one",
                                     options.launch_from));
    }
  }
  apply_flag_overrides(registry, options, flags);
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
  if (!same_launch_note.empty()) report.notes.push_back(same_launch_note);
  std::vector<report::Finding> all_findings = result.findings;
  check_other_launches(registry, options, input, result, file_launches, other_launches, report,
                       all_findings);
  add_decision(registry, options, input, result, file_launches, report);
  audit::FailOn fail_on = options.fail_on == "never"     ? audit::FailOn::never
                          : options.fail_on == "warning" ? audit::FailOn::warning
                                                         : audit::FailOn::critical;
  report::ExitGate gate;
  if (fail_on != audit::FailOn::never)
    gate.fail_on =
        fail_on == audit::FailOn::warning ? report::Severity::warning : report::Severity::critical;
  // A finding no evidence places is shown on the launch file it judges (code scanning needs a
  // file).
  options.output.sarif_fallback_file = !options.unit.empty() ? options.unit : flags.launch_file;
  emit(report, options.output, gate);
  return audit::fails_gate(all_findings, fail_on) ? kExitGateFailed : kExitOk;
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
  check->add_option("--launch-from", options->launch_from,
                    "A file that launches the engine: Kubernetes manifests (helm template "
                    "output too), a docker-compose file, a systemd unit, or the engine's own "
                    "--config YAML (with --engine)");
  check->add_option("--container", options->container,
                    "With --launch-from: the container (or compose service) to check");
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
  check->add_option(
      "--write-unit", options->write_unit,
      "Write the corrected --unit or --launch-from file here (atomically; only the KV dtype "
      "setting changes; the original stays untouched)");
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
