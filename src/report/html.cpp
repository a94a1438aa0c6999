// report/html: one self-contained HTML file per report, to attach to a deploy
// review. No script, no external CSS, fonts or images; a Content-Security-Policy
// forbids any load, so opening the file never touches the network (and a
// browser logs an error if a future change tries). Light, dark (prefers-color-
// scheme) and print styles; every text is escaped.
#include <string>

#include <fmt/format.h>

#include "report/report.h"
#include "util/util.h"

namespace kvaudit::report {
namespace {

constexpr const char* kStyle = R"css(
:root { color-scheme: light dark; --bg: #ffffff; --fg: #1b1f24; --muted: #59636e;
  --line: #d1d9e0; --panel: #f6f8fa; --critical: #c62828; --warning: #b26a00;
  --info: #0b6bcb; --ok: #1a7f37; }
@media (prefers-color-scheme: dark) {
  :root { --bg: #0f1419; --fg: #e6edf3; --muted: #9198a1; --line: #30363d;
    --panel: #161b22; --critical: #ff6b6b; --warning: #f0b429; --info: #58a6ff; --ok: #3fb950; }
}
* { box-sizing: border-box; }
body { margin: 0 auto; max-width: 1280px; padding: 24px 28px 48px; background: var(--bg);
  color: var(--fg); font: 14px/1.5 system-ui, -apple-system, "Segoe UI", sans-serif; }
h1 { font-size: 22px; margin: 0 0 4px; overflow-wrap: anywhere; }
h2 { font-size: 17px; margin: 28px 0 10px; padding-bottom: 4px; border-bottom: 1px solid var(--line); }
h3 { font-size: 15px; margin: 18px 0 6px; }
.meta { color: var(--muted); margin: 0 0 16px; font-size: 12px; }
.verdict { display: flex; gap: 12px; align-items: center; padding: 12px 16px; border-radius: 8px;
  border: 1px solid var(--sev); border-left: 8px solid var(--sev); background: var(--panel);
  font-size: 16px; font-weight: 600; }
.sev-critical { --sev: var(--critical); } .sev-warning { --sev: var(--warning); }
.sev-info { --sev: var(--info); } .verdict.sev-info { --sev: var(--ok); }
.badge { display: inline-block; min-width: 72px; text-align: center; padding: 1px 8px;
  border-radius: 10px; background: var(--sev); color: var(--bg); font-size: 11px;
  font-weight: 700; letter-spacing: 0.04em; text-transform: uppercase; }
table { border-collapse: collapse; width: 100%; margin: 6px 0; font-size: 13px; }
th, td { text-align: left; padding: 5px 10px; border-bottom: 1px solid var(--line); vertical-align: top; }
th { background: var(--panel); font-weight: 600; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.unit { color: var(--muted); font-weight: 400; }
table.facts { width: auto; } table.facts th { background: none; font-weight: 500; color: var(--muted); }
table.findings tr > td:first-child { border-left: 5px solid var(--sev); white-space: nowrap; }
.finding-title { font-weight: 600; } .rule-id { color: var(--muted); font-size: 12px; }
.judged-on { font-size: 12px; margin-top: 4px; }
.evidence { margin: 0; padding: 0; list-style: none; }
.evidence li { overflow-wrap: anywhere; margin-bottom: 6px; }
.ev-file { color: var(--muted); font-size: 12px; }
table.findings col.c-sev { width: 96px; } table.findings col.c-finding { width: 36%; }
table.findings col.c-evidence { width: 32%; }
code { font: 12px ui-monospace, "DejaVu Sans Mono", monospace; background: var(--panel);
  padding: 1px 4px; border-radius: 4px; overflow-wrap: anywhere; }
figure { margin: 12px 0 20px; padding: 12px; border: 1px solid var(--line); border-radius: 8px;
  break-inside: avoid; }
figcaption { font-weight: 600; margin-bottom: 6px; }
svg.kv-chart { width: 100%; max-width: 860px; height: auto; display: block; margin: 0 auto;
  color: var(--fg); }
.scroll { overflow-x: auto; }
table.data td { white-space: nowrap; }
.note { color: var(--muted); font-size: 12px; margin: 2px 0 10px; }
footer { margin-top: 36px; color: var(--muted); font-size: 12px; }
@media print {
  :root { --bg: #fff; --fg: #000; --muted: #444; --line: #bbb; --panel: #f2f2f2;
    --critical: #b00020; --warning: #8a5300; --info: #0b4f9c; --ok: #1a6b30; }
  body { max-width: none; padding: 0; font-size: 11px; }
  .scroll { overflow: visible; } table.data { font-size: 10px; }
  table.data td { white-space: normal; }
  figure, table, .verdict, tr { break-inside: avoid; }
  h2 { break-after: avoid; }
  * { -webkit-print-color-adjust: exact; print-color-adjust: exact; }
}
)css";

bool is_number(const Value& value) {
  return std::holds_alternative<int64_t>(value) || std::holds_alternative<double>(value);
}

std::string header_cell(const std::string& label, const std::string& unit, bool numeric) {
  std::string cell = numeric ? "<th class=\"num\">" : "<th>";
  cell += escape_html(label);
  if (!unit.empty()) cell += " <span class=\"unit\">(" + escape_html(unit) + ")</span>";
  return cell + "</th>";
}

std::string html_facts(const std::vector<Fact>& facts) {
  std::string out = "<section id=\"facts\"><h2>Facts</h2>\n<table class=\"facts\">\n";
  for (const Fact& fact : facts) {
    out += fmt::format("<tr data-fact=\"{}\"><th>{}</th><td>{}</td></tr>\n", escape_html(fact.key),
                       escape_html(fact.label), escape_html(format_fact(fact)));
  }
  return out + "</table></section>\n";
}

std::string html_table(const Table& table) {
  std::vector<bool> numeric(table.columns.size(), false);
  for (size_t c = 0; c < table.columns.size(); ++c) {
    bool any_number = false, any_text = false;
    for (const auto& row : table.rows) {
      if (c >= row.size()) continue;
      any_number |= is_number(row[c]);
      any_text |= !is_number(row[c]) && !std::holds_alternative<std::monostate>(row[c]);
    }
    numeric[c] = any_number && !any_text;
  }
  std::string out =
      fmt::format("<section class=\"table\" data-table-id=\"{}\">\n", escape_html(table.id));
  if (!table.title.empty()) out += "<h3>" + escape_html(table.title) + "</h3>\n";
  out += "<div class=\"scroll\"><table class=\"data\">\n<thead><tr>";
  for (size_t c = 0; c < table.columns.size(); ++c) {
    out += header_cell(table.columns[c].label, table.columns[c].unit, numeric[c]);
  }
  out += "</tr></thead>\n<tbody>\n";
  for (const auto& row : table.rows) {
    out += "<tr>";
    for (size_t c = 0; c < table.columns.size(); ++c) {
      std::string text = c < row.size() ? format_value(row[c], table.columns[c]) : "";
      out += fmt::format("<td{} data-key=\"{}\">{}</td>", numeric[c] ? " class=\"num\"" : "",
                         escape_html(table.columns[c].key), escape_html(text));
    }
    out += "</tr>\n";
  }
  out += "</tbody></table></div>\n";
  if (!table.note.empty()) out += "<p class=\"note\">" + escape_html(table.note) + "</p>\n";
  return out + "</section>\n";
}

std::string evidence_item(const Evidence& evidence) {
  std::string item = "<li>";
  if (!evidence.file.empty())
    item += "<div class=\"ev-file\">" + escape_html(evidence.file) +
            (evidence.line > 0 ? ":" + std::to_string(evidence.line) : "") + "</div>";
  std::string what;
  if (!evidence.key.empty()) what += "<code>" + escape_html(evidence.key) + "</code>";
  if (!evidence.value.empty()) {
    what += (evidence.key.empty() ? "" : " = ") + escape_html(evidence.value);
  }
  if (!what.empty()) item += "<div>" + what + "</div>";
  return item + "</li>";
}

std::string html_findings(const std::vector<Finding>& findings) {
  std::string out =
      "<section id=\"findings\"><h2>Findings</h2>\n<table class=\"findings\">\n"
      "<colgroup><col class=\"c-sev\"><col class=\"c-finding\"><col class=\"c-evidence\"><col>"
      "</colgroup>\n<thead><tr><th>Severity</th><th>Finding</th><th>Evidence</th><th>Fix</th></"
      "tr></"
      "thead>\n<tbody>\n";
  for (Severity severity : {Severity::critical, Severity::warning, Severity::info}) {
    for (const Finding& finding : findings) {
      if (finding.severity != severity) continue;
      std::string name(severity_name(severity));
      out += fmt::format("<tr class=\"sev-{}\" data-finding-id=\"{}\" data-severity=\"{}\">", name,
                         escape_html(finding.id), name);
      out += fmt::format("<td><span class=\"badge\">{}</span></td>", name);
      out += "<td><div class=\"finding-title\">" + escape_html(finding.title) + "</div>";
      if (!finding.id.empty())
        out += "<div class=\"rule-id\">" + escape_html(finding.id) + "</div>";
      if (!finding.consequence.empty())
        out += "<div>" + escape_html(finding.consequence) + "</div>";
      if (!finding.judged_on.empty())
        out += "<div class=\"judged-on\" data-basis=\"" + escape_html(finding.basis) +
               "\">Judged on " + escape_html(finding.basis) + ": " +
               escape_html(finding.judged_on) + "</div>";
      out += "</td><td><ul class=\"evidence\">";
      for (const Evidence& evidence : finding.evidence) out += evidence_item(evidence);
      out += "</ul></td><td>";
      if (!finding.fix.empty()) out += "<div class=\"fix\">" + escape_html(finding.fix) + "</div>";
      if (!finding.reference.empty()) {
        out += "<div class=\"note\">Reference: " + escape_html(finding.reference) + "</div>";
      }
      out += "</td></tr>\n";
    }
  }
  return out + "</tbody></table></section>\n";
}

}  // namespace

std::string render_html(const Report& report) {
  std::string severity(severity_name(report.verdict_severity));
  std::string out = fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
      "style-src 'unsafe-inline'; img-src data:\">\n"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
      "<meta name=\"color-scheme\" content=\"light dark\">\n"
      "<meta name=\"generator\" content=\"kvaudit (report schema {})\">\n"
      "<title>{}</title>\n<style>{}</style>\n</head>\n<body data-command=\"{}\">\n",
      kSchemaVersion,
      escape_html(report.title.empty() ? "kvaudit " + report.command : report.title), kStyle,
      escape_html(report.command));
  out += "<header><h1>" + escape_html(report.title) + "</h1>\n";
  out += "<p class=\"meta\">kvaudit " + escape_html(report.command) + " report</p></header>\n";
  out += fmt::format(
      "<section class=\"verdict sev-{}\" data-severity=\"{}\"><span class=\"badge\">{}</span>"
      "<span class=\"verdict-text\">{}</span></section>\n",
      severity, severity, report.verdict_severity == Severity::info ? "ok" : severity,
      escape_html(report.verdict));
  if (!report.findings.empty()) out += html_findings(report.findings);
  if (!report.facts.empty()) out += html_facts(report.facts);
  if (!report.charts.empty()) {
    out += "<section id=\"charts\"><h2>Charts</h2>\n";
    for (const Chart& chart : report.charts) {
      out += fmt::format("<figure data-chart-id=\"{}\"><figcaption>{}</figcaption>\n{}</figure>\n",
                         escape_html(chart.id),
                         escape_html(chart.title.empty() ? chart.id : chart.title),
                         render_chart_svg(chart));
    }
    out += "</section>\n";
  }
  if (!report.tables.empty()) {
    out += "<section id=\"tables\"><h2>Tables</h2>\n";
    for (const Table& table : report.tables) out += html_table(table);
    out += "</section>\n";
  }
  if (!report.notes.empty()) {
    out += "<section id=\"notes\"><h2>Notes</h2>\n<ul>\n";
    for (const std::string& note : report.notes) out += "<li>" + escape_html(note) + "</li>\n";
    out += "</ul></section>\n";
  }
  out += "<footer>Generated by kvaudit. Machine-readable form: <code>kvaudit " +
         escape_html(report.command) + " ... --json</code> (docs/json-schema.md).</footer>\n";
  return out + "</body>\n</html>\n";
}

}  // namespace kvaudit::report
