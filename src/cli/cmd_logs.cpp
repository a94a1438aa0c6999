// kvaudit logs: what the latest launch in a start-up log or journal really did,
// checked against --expect and, with --checkpoint, against check and plan.
#include <iostream>

#include "checkpoint/checkpoint.h"
#include "cli/commands.h"
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
  OutputOptions output;
};

int run_logs(LogsFlags& f) {
  std::vector<logs::Expectation> expectations;
  for (const auto& e : f.expect) expectations.push_back(logs::parse_expectation(e));
  logs::LogScan scan =
      f.file == "-" ? logs::scan_log(std::cin, "stdin") : logs::scan_log_file(f.file);
  if (scan.launches.empty())
    throw InputError(scan.source, "no SGLang or vLLM start-up lines found in " +
                                      std::to_string(scan.lines) + " lines");
  if (f.launch < 0 || f.launch > static_cast<int>(scan.launches.size()))
    throw InputError("--launch",
                     "the log has " + std::to_string(scan.launches.size()) + " launches");
  if (f.launch > 0) {
    // Verify launch N as if it were the latest: drop the ones after it.
    scan.launches.resize(static_cast<size_t>(f.launch));
  }
  if (!f.checkpoint.empty()) {
    checkpoint::ModelFacts model = checkpoint::read_checkpoint(f.checkpoint);
    for (size_t i = 0; i < scan.launches.size(); ++i)
      logs::cross_check_checkpoint(scan.launches[i], model, i + 1 == scan.launches.size());
  }
  auto results = logs::check_expectations(scan.launches.back(), expectations);
  report::Report report = logs::logs_report(scan, f.all, results);
  emit(report, f.output);
  for (const auto& r : results)
    if (!r.met) return kExitGateFailed;
  return kExitOk;
}

}  // namespace

void add_logs_command(CLI::App& app, Runner& run) {
  auto flags = std::make_shared<LogsFlags>();
  CLI::App* cmd = app.add_subcommand("logs",
                                     "Read an SGLang/vLLM start-up log or journal: what the latest "
                                     "launch resolved (dtype, scales, capacity)");
  cmd->add_option("file", flags->file, "Log file or journalctl output ('-' = stdin)")->required();
  cmd->add_flag("--all", flags->all, "Report every launch, not only the latest");
  cmd->add_option("--launch", flags->launch, "Verify launch N (1-based) instead of the latest");
  cmd->add_option(
      "--expect", flags->expect,
      "KEY=VALUE the launch must show (kv_cache_dtype, scale_fallback, engine, tp, ready, "
      "max_total_tokens); exit 1 when not met");
  cmd->add_option(
      "--checkpoint", flags->checkpoint,
      "The checkpoint the launch served: decides the scale fallback and checks capacity");
  add_output_options(*cmd, flags->output);
  cmd->callback([flags, &run] { run = [flags] { return run_logs(*flags); }; });
}

}  // namespace kvaudit::cli
