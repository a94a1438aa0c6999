// HTML report: self-contained (nothing loads from anywhere), all text escaped,
// charts present as SVG with the series tests and scripts look for, and the
// colour scales and axes follow the chart's data.
#include <algorithm>
#include <cctype>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "report/report.h"
#include "sample_report.h"

namespace kvaudit::report {
namespace {

size_t count(const std::string& text, const std::string& needle) {
  size_t found = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) {
    ++found;
  }
  return found;
}

std::string svg_of(const std::string& html, const std::string& chart_id) {
  size_t at = html.find("<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"kv-chart");
  while (at != std::string::npos) {
    size_t end = html.find("</svg>", at);
    std::string svg = html.substr(at, end - at);
    if (svg.find("data-chart-id=\"" + chart_id + "\"") != std::string::npos) return svg;
    at = html.find("<svg xmlns", end);
  }
  return "";
}

TEST(Html, IsOneSelfContainedDocument) {
  std::string html = render_html(testing::sample_report());
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_NE(html.find("</html>"), std::string::npos);
  EXPECT_NE(html.find("Content-Security-Policy\" content=\"default-src 'none'"), std::string::npos);
  // No script and no reference to anything outside the file. The only URL is the
  // SVG namespace name, which is an identifier and never fetched.
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find(" src="), std::string::npos);
  EXPECT_EQ(html.find(" href="), std::string::npos);
  EXPECT_EQ(html.find("url("), std::string::npos);
  EXPECT_EQ(html.find("@import"), std::string::npos);
  EXPECT_EQ(count(html, "http://") + count(html, "https://"),
            count(html, "xmlns=\"http://www.w3.org/2000/svg\""));
  EXPECT_NE(html.find("@media print"), std::string::npos);
  EXPECT_NE(html.find("@media (prefers-color-scheme: dark)"), std::string::npos);
}

TEST(Html, ShowsVerdictFactsFindingsTablesAndNotes) {
  Report report = testing::sample_report();
  std::string html = render_html(report);
  EXPECT_NE(html.find("<section class=\"verdict sev-critical\" data-severity=\"critical\">"),
            std::string::npos);
  EXPECT_NE(html.find(report.verdict), std::string::npos);
  EXPECT_NE(
      html.find("<tr data-fact=\"max_total_tokens\"><th>KV capacity</th><td>1,234,567 tokens</td>"),
      std::string::npos);
  // Findings table, most severe first, each row coloured by its severity class.
  size_t critical = html.find("<tr class=\"sev-critical\" data-finding-id=\"fp8-unit-scale\"");
  size_t warning = html.find("<tr class=\"sev-warning\" data-finding-id=\"mem-fraction-low\"");
  size_t info = html.find("<tr class=\"sev-info\" data-finding-id=\"hybrid-state\"");
  ASSERT_NE(critical, std::string::npos);
  ASSERT_NE(warning, std::string::npos);
  ASSERT_NE(info, std::string::npos);
  EXPECT_LT(critical, warning);
  EXPECT_LT(warning, info);
  EXPECT_NE(html.find(".sev-critical { --sev: var(--critical); }"), std::string::npos);
  EXPECT_NE(html.find("<li><div "
                      "class=\"ev-file\">hf_quant_config.json</"
                      "div><div><code>quantization.kv_cache_quant_algo</code> = FP8</div></li>"),
            std::string::npos);
  EXPECT_NE(html.find("data-table-id=\"capacity\""), std::string::npos);
  EXPECT_NE(html.find("<li>Recall numbers come from 20 needles per cell.</li>"), std::string::npos);
}

TEST(Html, EscapesEveryText) {
  const std::string attack = "<script>alert(1)</script>\"'><img src=x onerror=alert(2)>&";
  const std::string escaped =
      "&lt;script&gt;alert(1)&lt;/script&gt;&quot;&#39;&gt;&lt;img src=x onerror=alert(2)&gt;&amp;";
  Report report;
  report.command = attack;
  report.title = attack;
  report.verdict = attack;
  report.facts = {{attack, attack, Value{attack}, attack}};
  Table table;
  table.id = attack;
  table.title = attack;
  table.columns = {{attack, attack, attack}};
  table.rows = {{Value{attack}}};
  table.note = attack;
  report.tables.push_back(table);
  for (ChartKind kind : {ChartKind::bars, ChartKind::lines, ChartKind::heatmap}) {
    Chart chart;
    chart.id = attack;
    chart.title = attack;
    chart.kind = kind;
    chart.x_label = attack;
    chart.y_label = attack;
    chart.value_unit = attack;
    chart.x_categories = {attack, "b"};
    chart.series = {{attack, {1.0, 2.0}}, {"second", {3.0, 4.0}}};
    report.charts.push_back(chart);
  }
  report.findings.push_back(Finding{
      attack, Severity::warning, attack, attack, {{attack, attack, attack}}, attack, attack});
  report.notes = {attack};
  std::string html = render_html(report);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("<img"), std::string::npos);
  EXPECT_EQ(html.find("\"'>"), std::string::npos);
  EXPECT_GE(count(html, escaped), 30u);
  // Every '<' in the document starts a tag we wrote.
  for (size_t at = html.find('<'); at != std::string::npos; at = html.find('<', at + 1)) {
    size_t name = html[at + 1] == '/' ? at + 2 : at + 1;
    bool is_tag = std::isalpha(static_cast<unsigned char>(html[name])) ||
                  html.compare(at, 9, "<!DOCTYPE") == 0;
    EXPECT_TRUE(is_tag) << html.substr(at, 40);
  }
}

TEST(Html, InvalidUtf8AndControlCharactersAreReplaced) {
  Report report;
  report.title = "bad \xFF byte and \x1b[31m escape";
  std::string html = render_html(report);
  EXPECT_EQ(html.find('\xFF'), std::string::npos);
  EXPECT_EQ(html.find('\x1b'), std::string::npos);
  EXPECT_NE(html.find("bad \xEF\xBF\xBD byte and \xEF\xBF\xBD[31m escape"), std::string::npos);
}

TEST(HtmlCharts, EveryChartAndSeriesIsFindable) {
  Report report = testing::sample_report();
  std::string html = render_html(report);
  for (const Chart& chart : report.charts) {
    std::string svg = svg_of(html, chart.id);
    ASSERT_FALSE(svg.empty()) << chart.id;
    const char* kind = chart.kind == ChartKind::bars    ? "bars"
                       : chart.kind == ChartKind::lines ? "lines"
                                                        : "heatmap";
    EXPECT_NE(svg.find(std::string("data-chart-kind=\"") + kind + "\""), std::string::npos);
    for (size_t s = 0; s < chart.series.size(); ++s) {
      std::string group =
          "class=\"kv-series" +
          std::string(chart.kind == ChartKind::heatmap ? "" : " s" + std::to_string(s)) +
          "\" data-series=\"" + escape_html(chart.series[s].name) + "\"";
      EXPECT_NE(svg.find(group), std::string::npos) << chart.id << ": " << group;
    }
  }
}

TEST(HtmlCharts, MarksMatchTheData) {
  Report report = testing::sample_report();
  std::string html = render_html(report);
  // Bars: one rect per category and series.
  std::string bars = svg_of(html, "capacity-by-dtype");
  EXPECT_EQ(count(bars, "<rect x="), 3u);
  EXPECT_NE(bars.find("data-x=\"nvfp4\" data-y=\"2194785\""), std::string::npos);
  // Lines: one marker per finite point; the NaN in "int4 per-group" is a gap
  // (two path segments), not a point.
  std::string error = svg_of(html, "error-vs-context");
  EXPECT_EQ(count(error, "<circle"), 14u);
  size_t int4 = error.find("class=\"kv-series s2\" data-series=\"int4 per-group\"");
  std::string int4_path = error.substr(error.find("<path d=\"", int4), 200);
  EXPECT_EQ(count(int4_path.substr(0, int4_path.find("\" fill")), "M"), 2u) << int4_path;
  // Heatmap: a cell per row and column, the NaN drawn as n/a.
  std::string recall = svg_of(html, "recall-heatmap");
  EXPECT_EQ(count(recall, "data-y=\""), 12u);
  EXPECT_EQ(count(recall, "data-y=\"NaN\""), 1u);
  EXPECT_NE(recall.find(">n/a<"), std::string::npos);
}

TEST(HtmlCharts, LogAxesTickAtTheRightPlaces) {
  std::string html = render_html(testing::sample_report());
  std::string concurrency = svg_of(html, "concurrency-vs-context");
  // Few integer context lengths on a log axis: one tick per length, binary labels.
  for (const char* tick :
       {"data-tick=\"4096\">4K<", "data-tick=\"131072\">128K<", "data-tick=\"262144\">256K<"}) {
    EXPECT_NE(concurrency.find(tick), std::string::npos) << tick;
  }
  // Log y: decades.
  for (const char* tick :
       {"data-tick=\"1\">1<", "data-tick=\"10\">10<", "data-tick=\"1000\">1000<"}) {
    EXPECT_NE(concurrency.find(tick), std::string::npos) << tick;
  }
  std::string error = svg_of(html, "error-vs-context");
  EXPECT_NE(error.find("data-tick=\"0.001\">0.001<"), std::string::npos);
  EXPECT_NE(error.find("data-tick=\"0.1\">0.1<"), std::string::npos);
  // Points are placed in log space: on the x axis 16384 sits halfway (in pixels)
  // between 4096 and 65536.
  std::vector<double> xs(3);
  const std::string slots[] = {"4096", "16384", "65536"};
  for (size_t at = error.find("<circle cx=\""); at != std::string::npos;
       at = error.find("<circle cx=\"", at + 1)) {
    std::string tag = error.substr(at, error.find('>', at) - at);
    for (int slot = 0; slot < 3; ++slot) {
      if (tag.find("data-x=\"" + slots[slot] + "\"") != std::string::npos) {
        xs[slot] = std::stod(tag.substr(12));
      }
    }
  }
  EXPECT_GT(xs[0], 0);
  EXPECT_NEAR(xs[1] - xs[0], xs[2] - xs[1], 0.2);
}

int red_of(const std::string& svg, const std::string& row, const std::string& column) {
  std::string series = "data-series=\"" + row + "\"";
  size_t at = svg.find(series);
  size_t cell = svg.find("data-x=\"" + column + "\"", at);
  size_t fill = svg.rfind("fill=\"#", cell);
  return std::stoi(svg.substr(fill + 7, 2), nullptr, 16);
}

int blue_of(const std::string& svg, const std::string& row, const std::string& column) {
  size_t at = svg.find("data-series=\"" + row + "\"");
  size_t cell = svg.find("data-x=\"" + column + "\"", at);
  size_t fill = svg.rfind("fill=\"#", cell);
  return std::stoi(svg.substr(fill + 11, 2), nullptr, 16);
}

TEST(HtmlCharts, DivergingHeatmapIsRedBelowZeroAndBlueAbove) {
  std::string svg = svg_of(render_html(testing::sample_report()), "recall-difference");
  // 50% depth at 128K is -0.4 (the strongest loss): strongly red.
  EXPECT_GT(red_of(svg, "50%", "128K"), 150);
  EXPECT_LT(blue_of(svg, "50%", "128K"), 80);
  // 100% depth at 8K is +0.05: bluish. 0% at 8K is 0: near white.
  EXPECT_GT(blue_of(svg, "100%", "8K"), red_of(svg, "100%", "8K"));
  EXPECT_GT(red_of(svg, "0%", "8K"), 240);
  EXPECT_GT(blue_of(svg, "0%", "8K"), 240);
  // Sequential scale: higher recall is darker.
  std::string recall = svg_of(render_html(testing::sample_report()), "recall-heatmap");
  EXPECT_LT(red_of(recall, "0%", "8K"), red_of(recall, "50%", "128K"));
}

TEST(HtmlCharts, EmptyChartsStillRender) {
  Report report;
  for (ChartKind kind : {ChartKind::bars, ChartKind::lines, ChartKind::heatmap}) {
    Chart chart;
    chart.id = "empty-" + std::to_string(static_cast<int>(kind));
    chart.kind = kind;
    chart.log_x = chart.log_y = kind == ChartKind::lines;
    report.charts.push_back(chart);
  }
  Chart all_nan;
  all_nan.id = "all-missing";
  all_nan.kind = ChartKind::lines;
  all_nan.x_values = {1, 2};
  all_nan.series = {{"s", {std::nan(""), std::nan("")}}};
  report.charts.push_back(all_nan);
  std::string html = render_html(report);
  EXPECT_EQ(count(html, "</svg>"), 4u);
  EXPECT_EQ(count(html, "no data to draw"), 3u) << "bars, lines and the all-NaN lines";
  EXPECT_EQ(html.find("nan\""), std::string::npos) << "no NaN coordinates";
  EXPECT_EQ(html.find("inf\""), std::string::npos);
}

}  // namespace
}  // namespace kvaudit::report
