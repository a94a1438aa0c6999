#include <cctype>
#include <cstdio>
#include <iostream>

#include <fmt/format.h>

#include "cli/commands.h"
#include "plan/plan.h"
#include "util/util.h"

namespace kvaudit::cli {

void add_output_options(CLI::App& command, OutputOptions& options) {
  command.add_flag("--json", options.json,
                   "Print the report as JSON (schema: docs/json-schema.md)");
  command.add_option("--html", options.html_path, "Also write a self-contained HTML report here");
  command.add_option("--sarif", options.sarif_path,
                     "Also write the findings as SARIF 2.1.0 here, for code scanning (docs/ci.md)");
  command.add_option("--junit", options.junit_path,
                     "Also write JUnit XML here: a test case per finding, expectation and gate");
  command.add_flag("-q,--quiet", options.quiet, "Print only the verdict line");
  command.add_flag("--no-color", options.no_color, "Never use ANSI colours (NO_COLOR also works)");
}

void emit(const report::Report& report, const OutputOptions& options,
          const report::ExitGate& gate) {
  if (!options.html_path.empty())
    write_file_atomically(options.html_path, report::render_html(report));
  if (!options.sarif_path.empty()) {
    report::SarifOptions sarif{.tool_version = kVersion,
                               .fallback_file = options.sarif_fallback_file};
    write_file_atomically(options.sarif_path, report::render_sarif(report, sarif));
  }
  if (!options.junit_path.empty())
    write_file_atomically(options.junit_path, report::render_junit(report, gate));
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

// "96GiB", "98304MiB", "80GB" (decimal), "103079215104" (bytes).
GpuMemory gpu_memory_from_flags(const std::string& gpu, const std::string& gpu_mem) {
  GpuMemory out;
  if (!gpu.empty()) {
    plan::GpuPreset preset = plan::find_gpu(gpu);
    out.bytes = preset.memory_mib * plan::kMiB;
    out.name = preset.name;
  }
  if (!gpu_mem.empty()) {
    out.bytes = parse_size_bytes(gpu_mem, "--gpu-mem");
    if (out.name.empty()) out.name = gpu_mem;
  }
  return out;
}

int64_t parse_size_bytes(const std::string& text, const std::string& flag) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.'))
    ++i;
  if (i == 0) throw InputError(flag, "expected a size such as 96GiB, 98304MiB or 80GB: " + text);
  double value = std::stod(text.substr(0, i));
  std::string unit = text.substr(i);
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double scale = 1;
  if (unit == "gib" || unit == "g")
    scale = double(1 << 30);
  else if (unit == "mib" || unit == "m")
    scale = double(1 << 20);
  else if (unit == "gb")
    scale = 1e9;
  else if (unit == "mb")
    scale = 1e6;
  else if (unit == "tib")
    scale = double(int64_t{1} << 40);
  else if (!unit.empty() && unit != "b")
    throw InputError(flag, "unknown unit '" + unit + "' in " + text);
  return static_cast<int64_t>(std::llround(value * scale));
}

}  // namespace kvaudit::cli
