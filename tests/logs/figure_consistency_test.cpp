// A log whose memory figures contradict the engine's own arithmetic is flagged, naming the
// figures and lines: SGLang prints each rank's weights "mem usage" as its free memory before
// the load minus after it, and sizes every rank's pool from the smallest free memory of all.
// No real log of the corpus trips it; an edited copy of one does.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/registry.h"
#include "logs/logs.h"

namespace kvaudit::logs {
namespace {

namespace fs = std::filesystem;

fs::path real_dir() {
  return fs::path(KVAUDIT_TEST_DIR) / "fixtures" / "logs" / "real";
}

const report::Finding* inconsistency(const Launch& launch) {
  for (const auto& f : launch.findings)
    if (f.id == "log-figures-inconsistent") return &f;
  return nullptr;
}

std::string replaced(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

std::string qwq_log() {
  std::ifstream in(real_dir() / "sglang" / "qwq-32b-tp4-l4-0.4.3.post4.log");
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(FigureConsistency, NoRealLogOfTheCorpusIsFlagged) {
  int logs = 0;
  for (const char* engine : {"sglang", "vllm", "trtllm"})
    for (const auto& entry : fs::directory_iterator(real_dir() / engine)) {
      if (entry.path().extension() != ".log") continue;
      ++logs;
      const LogScan scan = scan_log_file(kvaudit::testing::registry(), entry.path());
      for (const Launch& launch : scan.launches) {
        const report::Finding* f = inconsistency(launch);
        EXPECT_EQ(f, nullptr) << entry.path() << ": " << (f ? f->consequence : "");
      }
    }
  EXPECT_GE(logs, 60);
}

TEST(FigureConsistency, AWeightsLoadWhoseUsageIsNotTheDifferenceIsNamed) {
  // TP1's line 49 prints 14.54 where its free memory fell from 21.63 to 6.09 (15.54).
  const std::string text =
      replaced(qwq_log(),
               "[2025-03-08 12:29:21 TP1] Load weight end. type=Qwen2ForCausalLM, "
               "dtype=torch.bfloat16, avail mem=6.09 GB, mem usage=15.54 GB.",
               "[2025-03-08 12:29:21 TP1] Load weight end. type=Qwen2ForCausalLM, "
               "dtype=torch.bfloat16, avail mem=6.09 GB, mem usage=14.54 GB.");
  const LogScan scan = scan_log_text(kvaudit::testing::registry(), text, "edited");
  ASSERT_EQ(scan.launches.size(), 1u);
  const report::Finding* f = inconsistency(scan.launches[0]);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->severity, report::Severity::warning);
  EXPECT_NE(f->consequence.find("TP1's weights load printed mem usage 14.54 GiB (line 49)"),
            std::string::npos)
      << f->consequence;
  EXPECT_NE(f->consequence.find("fell by 15.54 GiB"), std::string::npos) << f->consequence;
  // Within the rounding of three two-decimal figures, nothing is said.
  const std::string rounded = replaced(qwq_log(), "avail mem=6.09 GB, mem usage=15.54 GB.",
                                       "avail mem=6.09 GB, mem usage=15.55 GB.");
  EXPECT_EQ(inconsistency(scan_log_text(kvaudit::testing::registry(), rounded, "r").launches[0]),
            nullptr);
}

TEST(FigureConsistency, RanksWhosePoolsDifferAreNamedWithTheirLines) {
  const std::string text = replaced(qwq_log(), "TP2] KV Cache is allocated. #tokens: 46611",
                                    "TP2] KV Cache is "
                                    "allocated. #tokens: 40000");
  const LogScan scan = scan_log_text(kvaudit::testing::registry(), text, "edited");
  const report::Finding* f = inconsistency(scan.launches.at(0));
  ASSERT_NE(f, nullptr);
  EXPECT_NE(f->consequence.find("TP2 40000 (line 55)"), std::string::npos) << f->consequence;
  EXPECT_NE(f->consequence.find("TP0 46611 (line 53)"), std::string::npos) << f->consequence;
}

TEST(FigureConsistency, MemoryThatRoseOverALoadIsNamed) {
  const std::string text = replaced(qwq_log(), "TP3] Load weight begin. avail mem=21.63 GB",
                                    "TP3] Load weight begin. avail mem=5.63 GB");
  const LogScan scan = scan_log_text(kvaudit::testing::registry(), text, "edited");
  const report::Finding* f = inconsistency(scan.launches.at(0));
  ASSERT_NE(f, nullptr);
  EXPECT_NE(f->consequence.find("TP3 had more memory free after its weights load (6.09 GiB"),
            std::string::npos)
      << f->consequence;
}

}  // namespace
}  // namespace kvaudit::logs
