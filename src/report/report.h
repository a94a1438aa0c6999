// report: the one place that turns a command's result into words, JSON, HTML, SARIF or JUnit.
// Commands build a Report value (facts, tables, charts, findings, a machine payload)
// and call a renderer; no command formats its own output. Renderers never print:
// they return strings, the CLI writes them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

namespace kvaudit::report {

// Version of the JSON schema shared by every command (docs/json-schema.md).
inline constexpr int kSchemaVersion = 1;

enum class Severity { info, warning, critical };
std::string_view severity_name(Severity severity);  // "info" | "warning" | "critical"

// One piece of evidence: where it was seen, what it is, and the value seen there.
struct Evidence {
  std::string file;   // path of the file (or "launch", "log:LINE", "server:URL")
  std::string key;    // JSON key, tensor name, flag or log line label
  std::string value;  // the value seen, as text
  // 1-based line of `file` where the value is written (a flag, a config key, a unit line),
  // 0 when unknown or when `file` is a label rather than a file. SARIF locations use it.
  int64_t line = 0;
};

struct Finding {
  std::string id;  // stable rule id, e.g. "fp8-unit-scale"
  Severity severity = Severity::info;
  std::string title;        // one line: what is wrong
  std::string consequence;  // one sentence: what it does to accuracy or capacity
  std::vector<Evidence> evidence;
  std::string fix;        // the exact change (flag, file, command)
  std::string reference;  // engine source path, issue or PR
  // What a precision verdict rests on, strongest first: "measured" (this model's K/V
  // maxima), "bounded" (from the checkpoint: key-norm weights, shipped scale values),
  // "published" (damage measured on this model family), "none"; or "engine" (what the
  // engine does, read in its source: a start-up failure, a dropped scale). Empty when the
  // finding judges no precision.
  std::string basis = {};
  std::string judged_on = {};  // the evidence used and what could not be known, for people
};

// A cell value. Integers stay integers (bytes, token counts are exact); doubles
// carry their display precision in the column.
using Value = std::variant<std::monostate, bool, int64_t, double, std::string>;

struct Column {
  std::string key;           // JSON key for this column
  std::string label;         // header shown to people
  std::string unit;          // "B", "GiB", "tokens", "%", "" ...
  int precision = 3;         // decimals for doubles (see format_value)
  bool group_digits = true;  // "1,234,567"; false for ids, ports, years
};

struct Table {
  std::string id;
  std::string title;
  std::vector<Column> columns;
  std::vector<std::vector<Value>> rows;  // rows[i].size() == columns.size()
  std::string note;                      // shown under the table
};

enum class ChartKind { bars, lines, heatmap };

// A named series of y values over the chart's x axis (categories or numbers).
// For a heatmap each series is one row (named by y category) and y holds the cells.
struct Series {
  std::string name;
  std::vector<double> y;
};

struct Chart {
  std::string id;
  std::string title;
  ChartKind kind = ChartKind::bars;
  std::string x_label;
  std::string y_label;
  std::vector<std::string> x_categories;  // bars and heatmap columns; or
  std::vector<double> x_values;           // numeric x for lines
  bool log_x = false;
  bool log_y = false;
  std::vector<Series> series;
  // Heatmap colour scale: diverging (red below 0, blue above, white at 0) for an A/B
  // difference; otherwise sequential from the smallest to the largest value.
  bool diverging = false;
  int precision = 3;            // decimals for values shown in tooltips and heatmap cells
  std::string value_unit = {};  // unit of y (lines, bars) or of the cells (heatmap)
};

// A labelled value shown at the top of a report ("Resolved KV dtype: fp8_e4m3").
struct Fact {
  std::string key;    // JSON key
  std::string label;  // shown to people
  Value value;
  std::string unit;
  int precision = 3;  // decimals for a double value
  bool group_digits = true;
};

struct Report {
  std::string command;  // "check", "plan", "logs", "quant", "eval", "probe", ...
  std::string title;    // e.g. "kvaudit check: examples/qwen3.5-397b-nvfp4 on sglang 0.5.9"
  std::string verdict;  // one line, printed last (and alone with --quiet)
  Severity verdict_severity = Severity::info;
  std::vector<Fact> facts;
  std::vector<Table> tables;
  std::vector<Chart> charts;
  std::vector<Finding> findings;
  std::vector<std::string> notes;
  // Command-specific machine fields merged at the top level of the JSON output
  // (check: engine, resolved_kv; plan: rows; logs: launches ...).
  nlohmann::json payload = nlohmann::json::object();
};

struct TerminalOptions {
  bool color = false;  // ANSI colours
  bool quiet = false;  // verdict line only
  int width = 100;     // wrap long text at this many columns
};

std::string render_terminal(const Report& report, const TerminalOptions& options);
nlohmann::json render_json(const Report& report);
std::string render_html(const Report& report);  // one self-contained file, inline SVG

// What a command's exit code is decided on, as CI outputs show it. A finding fails the
// command when its severity is at or above `fail_on` (check's and probe's --fail-on; empty
// where findings never set the exit code: logs, plan, quant ...); each check is one more
// pass/fail test the command runs (a logs --expect expectation, a probe --gate limit, a
// plan --from-log figure against its range).
struct GateCheck {
  // What sort of check, JUnit's classname after "kvaudit.COMMAND.": "expect" (logs),
  // "figure" (plan), "smoke", "gate", "verdict", "load" (probe).
  std::string kind;
  std::string name;  // what it checks, e.g. "kv_cache_dtype=bf16"
  bool passed = false;
  std::string message;  // why it failed or what passed: "expected bf16, log says fp8_e4m3"
};
struct ExitGate {
  std::optional<Severity> fail_on;
  std::vector<GateCheck> checks;
};
// True when a finding reaches gate.fail_on or a check failed: the command exits 1.
bool gate_fails(const Report& report, const ExitGate& gate);

// SARIF 2.1.0 for code scanning (docs/ci.md): one rule per finding id the report holds, one
// result per finding, located at the first evidence with a line, else at the first evidence
// whose `file` is an existing regular file, else at `fallback_file`, else at no file (a
// logical location only).
struct SarifOptions {
  std::string tool_version;  // tool.driver.version, as `kvaudit --version` prints it
  // Evidence files inside this folder are written relative to it under uriBaseId %SRCROOT%
  // (code scanning resolves them against the repository); others as absolute file: URIs.
  // Empty: the process's current directory.
  std::string working_directory = {};
  // Where a result goes when no evidence of it names a file: the command's own input (the
  // --unit file of check, the log of logs), at line 1. Code scanning refuses an upload with
  // a result that has no file (docs/ci.md). Empty: such a result has a logical location only.
  std::string fallback_file = {};
};
std::string render_sarif(const Report& report, const SarifOptions& options);

// JUnit XML as jenkins-junit.xsd reads it: one <testsuite> "kvaudit COMMAND" with a test case
// per finding (failing when it reaches gate.fail_on) and per gate check; one passing test
// case naming what was checked when there is neither.
std::string render_junit(const Report& report, const ExitGate& gate);

// Formats a value as the terminal and HTML show it (same digits in both).
std::string format_value(const Value& value, const Column& column);

// True when stdout should get colour: a tty and NO_COLOR unset or empty.
bool stdout_wants_color();

// Formats a fact's value with its unit ("71.250 GiB", "12.5%"), as both renderers show it.
std::string format_fact(const Fact& fact);

// Columns a string takes in a terminal: wide East Asian characters and emoji count 2,
// combining marks and zero-width joiners 0, one grapheme cluster at most 2.
size_t display_width(std::string_view text);

// JSON and HTML must be valid UTF-8 (log lines and file names may not be): they go
// through kvaudit::to_valid_utf8 (util/).

// Escapes &, <, >, " and ' for HTML text and attribute values (after to_valid_utf8).
std::string escape_html(std::string_view text);

// One chart as a standalone inline <svg> element (render_html uses it). Elements carry
// data-chart-id / data-series attributes so tests and scripts can find them.
std::string render_chart_svg(const Chart& chart);

}  // namespace kvaudit::report
