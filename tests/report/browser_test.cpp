// Renders HTML reports in headless Chromium (tools/render-html.sh) to PNG:
// no console messages (so nothing was blocked or failed to parse), the charts'
// SVG elements and series exist in the DOM Chromium built, and a page that
// tries to load something from the network is caught. Chromium is a test
// dependency (tools/install-deps.sh --full): when it is missing this test fails,
// unless KVAUDIT_SKIP_BROWSER=1 says to skip it on purpose.
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include <gtest/gtest.h>

#include "report/report.h"
#include "sample_report.h"

namespace kvaudit::report {
namespace {

namespace fs = std::filesystem;

bool browser_skipped() {
  const char* skip = std::getenv("KVAUDIT_SKIP_BROWSER");
  return skip != nullptr && std::string(skip) == "1";
}

fs::path output_dir() {
  fs::path dir = fs::path(KVAUDIT_BUILD_DIR) / "report_browser_test";
  fs::create_directories(dir);
  return dir;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_file(const fs::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// Runs tools/render-html.sh; returns its exit status.
int render(const fs::path& html, const fs::path& png, const fs::path& dom,
           const std::string& environment = "") {
  std::string script = std::string(KVAUDIT_TEST_DIR) + "/../tools/render-html.sh";
  std::string command = environment + " bash '" + script + "' '" + html.string() + "' '" +
                        png.string() + "' '" + dom.string() + "' 2>'" + png.string() + ".log'";
  int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

struct PngSize {
  uint32_t width = 0, height = 0;
};

PngSize png_size(const std::string& png) {
  static const std::string signature = "\x89PNG\r\n\x1a\n";
  if (png.size() < 24 || png.compare(0, 8, signature) != 0 || png.compare(12, 4, "IHDR") != 0) {
    return {};
  }
  auto be32 = [&](size_t at) {
    return (uint32_t{static_cast<uint8_t>(png[at])} << 24) |
           (uint32_t{static_cast<uint8_t>(png[at + 1])} << 16) |
           (uint32_t{static_cast<uint8_t>(png[at + 2])} << 8) |
           uint32_t{static_cast<uint8_t>(png[at + 3])};
  };
  return {be32(16), be32(20)};
}

TEST(Browser, SampleReportRendersWithoutConsoleErrorsAndWithEveryChart) {
  if (browser_skipped()) GTEST_SKIP() << "KVAUDIT_SKIP_BROWSER=1";
  Report report = testing::sample_report();
  fs::path dir = output_dir();
  write_file(dir / "sample-report.html", render_html(report));
  int status = render(dir / "sample-report.html", dir / "sample-report.png",
                      dir / "sample-report.dom.html", "KVAUDIT_RENDER_SIZE=1200x2400");
  ASSERT_EQ(status, 0) << "tools/render-html.sh failed (2: no chromium, run tools/install-deps.sh "
                          "--full or set KVAUDIT_SKIP_BROWSER=1; 3: browser failed; 4: console "
                          "messages):\n"
                       << read_file(dir / "sample-report.png.log");
  PngSize size = png_size(read_file(dir / "sample-report.png"));
  EXPECT_EQ(size.width, 1200u);
  EXPECT_EQ(size.height, 2400u);
  // A blank page compresses to a few kilobytes; the report is text and charts.
  EXPECT_GT(fs::file_size(dir / "sample-report.png"), 60000u);
  std::string dom = read_file(dir / "sample-report.dom.html");
  for (const Chart& chart : report.charts) {
    size_t svg = dom.find("data-chart-id=\"" + chart.id + "\" data-chart-kind=");
    ASSERT_NE(svg, std::string::npos) << chart.id;
    size_t end = dom.find("</svg>", svg);
    for (const Series& series : chart.series) {
      std::string group = "data-series=\"" + escape_html(series.name) + "\" data-series-index=";
      size_t at = dom.find(group, svg);
      EXPECT_TRUE(at != std::string::npos && at < end) << chart.id << " / " << series.name;
    }
  }
  EXPECT_NE(dom.find("data-finding-id=\"fp8-unit-scale\""), std::string::npos);
  std::cout << "rendered " << (dir / "sample-report.png").string() << '\n';
}

TEST(Browser, DarkModeRendersDifferently) {
  if (browser_skipped()) GTEST_SKIP() << "KVAUDIT_SKIP_BROWSER=1";
  fs::path dir = output_dir();
  write_file(dir / "dark.html", render_html(testing::sample_report()));
  ASSERT_EQ(render(dir / "dark.html", dir / "light.png", dir / "light.dom.html",
                   "KVAUDIT_RENDER_SIZE=1000x900"),
            0)
      << read_file(dir / "light.png.log");
  ASSERT_EQ(render(dir / "dark.html", dir / "dark.png", dir / "dark.dom.html",
                   "KVAUDIT_RENDER_SIZE=1000x900 KVAUDIT_RENDER_DARK=1"),
            0)
      << read_file(dir / "dark.png.log");
  EXPECT_NE(read_file(dir / "light.png"), read_file(dir / "dark.png"));
}

// The console check must be able to fail: a page that tries to fetch an image
// is blocked by the report's Content-Security-Policy and the script says so.
TEST(Browser, NetworkLoadIsCaughtAsAConsoleMessage) {
  if (browser_skipped()) GTEST_SKIP() << "KVAUDIT_SKIP_BROWSER=1";
  fs::path dir = output_dir();
  std::string html = render_html(testing::sample_report());
  html.insert(html.find("</body>"), "<img src=\"http://192.0.2.1/pixel.png\" alt=\"\">\n");
  write_file(dir / "leaky.html", html);
  EXPECT_EQ(render(dir / "leaky.html", dir / "leaky.png", dir / "leaky.dom.html",
                   "KVAUDIT_RENDER_SIZE=800x600"),
            4)
      << read_file(dir / "leaky.png.log");
  EXPECT_NE(read_file(dir / "leaky.png.log").find("192.0.2.1"), std::string::npos);
}

}  // namespace
}  // namespace kvaudit::report
