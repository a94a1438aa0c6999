// kvaudit entry point: registers every command and turns errors into one line.
#include <exception>
#include <iostream>

#include "cli/commands.h"
#include "util/util.h"

int main(int argc, char** argv) {
  using namespace kvaudit;
  CLI::App app{
      "kvaudit: catch silent accuracy loss in LLM serving (KV cache first).\n"
      "Try: make demo   (it builds build/demo-checkpoint, then runs: kvaudit check "
      "build/demo-checkpoint --unit examples/qwen3.5-397b-a17b-nvfp4/sglang.service --gpu "
      "rtx-pro-6000)\n"
      "Exit codes: 0 done, 1 the report fails its gate (--fail-on, --expect, ...), 2 bad input "
      "(one line names the file or flag), 3 internal error (a kvaudit bug: please report it)"};
  app.require_subcommand(0, 1);
  app.set_version_flag("--version", "kvaudit " KVAUDIT_VERSION);
  cli::Runner run;
  cli::EngineData engines;  // read on first use, then shared by the command that runs
  cli::add_check_command(app, run, engines);
  cli::add_plan_command(app, run, engines);
  cli::add_logs_command(app, run, engines);
  cli::add_quant_command(app, run);
  cli::add_tokenize_command(app, run);
  cli::add_eval_command(app, run);
  cli::add_probe_command(app, run, engines);
  cli::add_calibrate_command(app, run, engines);
  cli::add_serve_command(app, run, engines);
  cli::add_watch_command(app, run, engines);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    int code = app.exit(error);
    return code == 0 ? cli::kExitOk : cli::kExitInputError;
  }
  if (!run) {
    std::cout << app.help();
    return cli::kExitOk;
  }
  try {
    return run();
  } catch (const InputError& error) {
    std::cerr << "kvaudit: " << error.what() << '\n';
    return cli::kExitInputError;
  } catch (const std::exception& error) {
    std::cerr << "kvaudit: internal error: " << error.what() << '\n';
    return cli::kExitInternalError;
  }
}
