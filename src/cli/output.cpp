#include <cstdio>
#include <iostream>

#include "cli/commands.h"
#include "util/util.h"

namespace kvaudit::cli {

void add_output_options(CLI::App& command, OutputOptions& options) {
  command.add_flag("--json", options.json,
                   "Print the report as JSON (schema: docs/json-schema.md)");
  command.add_option("--html", options.html_path, "Also write a self-contained HTML report here");
  command.add_flag("-q,--quiet", options.quiet, "Print only the verdict line");
  command.add_flag("--no-color", options.no_color, "Never use ANSI colours (NO_COLOR also works)");
}

void emit(const report::Report& report, const OutputOptions& options) {
  if (!options.html_path.empty())
    write_file_atomically(options.html_path, report::render_html(report));
  if (options.json) {
    std::cout << report::render_json(report).dump(2) << '\n';
    return;
  }
  report::TerminalOptions terminal;
  terminal.color = !options.no_color && report::stdout_wants_color();
  terminal.quiet = options.quiet;
  std::cout << report::render_terminal(report, terminal);
  std::cout.flush();
}

}  // namespace kvaudit::cli
