// kvaudit logs: what the latest launch in a start-up log or journal really did,
// checked against --expect and, with --checkpoint, against check and plan.
#include <fmt/format.h>

#include <iostream>

#include "audit/audit.h"
#include "checkpoint/checkpoint.h"
#include "cli/commands.h"
#include "engines/engines.h"
#include "logs/logs.h"
#include "util/util.h"

namespace kvaudit::cli {

namespace {

struct LogsFlags {
  std::string file;
  bool all = false;
  int launch = 0;
  std::vector<std::string> expect;
  std::string checkpoint;
  std::string kv_policy = "evidence";
  OutputOptions output;
};

// What `kvaudit check` predicts for this launch (same checkpoint, the flags the log
// printed): the resolved dtype must agree. (The scale fallback the log alone cannot
// decide is logs::cross_check_checkpoint's.)
void check_against_audit(const engines::EngineModel& engine, logs::Launch& launch,
                         const checkpoint::ModelFacts& model, std::vector<report::Finding>& out) {
  audit::CheckInput input;
  input.policy = launch.kv_policy;
  input.model = model;
  input.engine = &engine;
  input.flags.engine = launch.engine;
  input.flags.engine_version = launch.engine_version;
  input.flags.kv_cache_dtype =
      launch.kv_cache_dtype_requested.empty() ? "auto" : launch.kv_cache_dtype_requested;
  input.flags.tp = std::max(1, launch.tp);
  input.flags.quantization_param_path = launch.quantization_param_path;
  input.flags.model_path = launch.model_path;
  input.flags.source = "log launch " + std::to_string(launch.index + 1);
  input.version_given =
      !launch.engine_version.empty() && engines::parse_version(launch.engine_version);
  if (!input.version_given) input.flags.engine_version.clear();
  audit::CheckResult result = audit::run_check(input);
  const std::string& predicted = result.resolved.kv_cache_dtype;
  const std::string& observed = launch.kv_cache_dtype_resolved;
  std::string who = "launch " + std::to_string(launch.index + 1);
  if (!observed.empty() && !predicted.empty()) {
    bool agree = predicted == observed;
    out.push_back(
        {agree ? "check-agrees" : "check-disagrees",
         agree ? report::Severity::info : report::Severity::warning,
         who + (agree ? ": the log's KV dtype is what kvaudit check predicts (" + observed + ")"
                      : ": the log shows " + observed + " but kvaudit check predicts " + predicted),
         agree ? ""
               : "the engine version or flags differ from what check assumed, or the engine data "
                 "needs a rule",
         {{"log", "kv_cache_dtype", observed},
          {"check", result.resolved.rule_id, result.resolved.reason}},
         agree ? "" : "run kvaudit check with the launch's exact --engine-version and flags",
         result.resolved.rule_provenance.reference});
  }
}

int run_logs(const engines::Registry& registry, LogsFlags& f) {
  std::vector<logs::Expectation> expectations;
  for (const auto& e : f.expect) expectations.push_back(logs::parse_expectation(e));
  logs::ScanOptions options;
  options.kv_policy = *audit::parse_kv_policy(f.kv_policy);  // CLI11 checked the spelling
  logs::LogScan scan = f.file == "-" ? logs::scan_log(registry, std::cin, "stdin", options)
                                     : logs::scan_log_file(registry, f.file, options);
  if (scan.launches.empty())
    throw InputError(scan.source, fmt::format("no start-up lines of a known engine ({}) found in "
                                              "{} lines",
                                              fmt::join(registry.names(), ", "), scan.lines));
  if (f.launch < 0 || f.launch > static_cast<int>(scan.launches.size()))
    throw InputError("--launch",
                     "the log has " + std::to_string(scan.launches.size()) + " launches");
  if (f.launch > 0) {
    // Verify launch N as if it were the latest: drop the ones after it.
    scan.launches_after = static_cast<int64_t>(scan.launches.size()) - f.launch;
    scan.launches.resize(static_cast<size_t>(f.launch));
  }
  std::vector<report::Finding> check_findings;
  if (!f.checkpoint.empty()) {
    checkpoint::ModelFacts model = checkpoint::read_checkpoint(f.checkpoint);
    for (size_t i = 0; i < scan.launches.size(); ++i) {
      logs::Launch& launch = scan.launches[i];
      if (const engines::EngineModel* engine = registry.find(launch.engine))
        check_against_audit(*engine, launch, model, check_findings);
      logs::cross_check_checkpoint(registry, launch, model, i + 1 == scan.launches.size());
    }
  }
  auto results = logs::check_expectations(registry, scan.launches.back(), expectations);
  report::Report report = logs::to_report(scan, f.all, results);
  for (auto& finding : check_findings) report.findings.push_back(std::move(finding));
  // The expectations are the gate (findings do not set logs' exit code): one JUnit test each.
  report::ExitGate gate;
  for (const auto& r : results) {
    std::string said = r.actual.empty() ? "nothing" : r.actual;
    gate.checks.push_back({"expect", r.expected.key + "=" + r.expected.value, r.met,
                           fmt::format("expected {}, log says {}", r.expected.value, said)});
  }
  if (f.file != "-") f.output.sarif_fallback_file = f.file;
  emit(report, f.output, gate);
  return report::gate_fails(report, gate) ? kExitGateFailed : kExitOk;
}

}  // namespace

void add_logs_command(CLI::App& app, Runner& run, EngineData& engines) {
  auto flags = std::make_shared<LogsFlags>();
  CLI::App* cmd = app.add_subcommand("logs",
                                     "Read an engine's start-up log or journal: what the latest "
                                     "launch resolved (dtype, scales, capacity)");
  cmd->add_option("file", flags->file, "Log file or journalctl output ('-' = stdin)")->required();
  cmd->add_flag("--all", flags->all, "Report every launch, not only the latest");
  cmd->add_option("--launch", flags->launch, "Verify launch N (1-based) instead of the latest");
  cmd->add_option(
      "--expect", flags->expect,
      "KEY=VALUE the launch must show (kv_cache_dtype, scale_fallback, engine, tp, ready, "
      "max_total_tokens=N, >=N or LO..HI); exit 1 when not met");
  cmd->add_option(
      "--checkpoint", flags->checkpoint,
      "The checkpoint the launch served: decides the scale fallback and checks capacity");
  cmd->add_option("--kv-policy", flags->kv_policy,
                  "How scale findings are judged: lossless, evidence (default) or permissive "
                  "(as kvaudit check)")
      ->check(CLI::IsMember({"lossless", "evidence", "permissive"}));
  add_output_options(*cmd, flags->output);
  cmd->callback([flags, &run, &engines] {
    run = [flags, &engines] { return run_logs(engines.registry(), *flags); };
  });
}

}  // namespace kvaudit::cli
