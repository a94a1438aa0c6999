#include <cstdio>
#include <iostream>

#include <fmt/format.h>

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

std::vector<int64_t> parse_token_counts(const std::string& list, const char* flag,
                                        const char* example) {
  std::vector<int64_t> values;
  for (const std::string& item : split_list(list)) {
    auto tokens = parse_token_count(item);
    if (!tokens || *tokens <= 0) {
      throw InputError(flag, fmt::format("expects token counts like {}", example));
    }
    values.push_back(*tokens);
  }
  if (values.empty()) throw InputError(flag, "expects at least one token count");
  return values;
}

}  // namespace kvaudit::cli
