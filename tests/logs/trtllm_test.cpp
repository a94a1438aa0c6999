// TensorRT-LLM start-up logs through plan: the token counts its real logs print are
// reproduced from their printed memory (gpt-oss-120b: 5.95 GiB at 73728 B per token ->
// 86720 tokens), the KV dtype it never prints is derived exactly from the bytes per token
// against the model's geometry, and a log whose figures disagree is caught.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/registry.h"
#include "logs/logs.h"
#include "util/util.h"

namespace kvaudit::logs {
namespace {

namespace fs = std::filesystem;

fs::path trtllm_log(const std::string& name) {
  return fs::path(KVAUDIT_TEST_DIR) / "fixtures" / "logs" / "real" / "trtllm" / name;
}
fs::path trtllm_geometry(const std::string& name) {
  return fs::path(KVAUDIT_TEST_DIR) / "fixtures" / "configs" / name;
}

struct TrtllmReproduced {
  plan::LogPrediction prediction;
  plan::LoggedMemory memory;
  const plan::LogCheck* check(const std::string& id) const {
    for (const auto& c : prediction.checks)
      if (c.id == id) return &c;
    return nullptr;
  }
  bool all_inside() const {
    for (const auto& c : prediction.checks)
      if (!c.inside) return false;
    return !prediction.checks.empty();
  }
  std::string notes() const {
    std::string out;
    for (const auto& n : prediction.notes) out += n + "\n";
    return out;
  }
};

TrtllmReproduced trtllm_reproduce(const fs::path& log, const std::string& config,
                                  const std::vector<std::string>& kv = {}) {
  const auto& registry = kvaudit::testing::registry();
  LogScan scan = scan_log_file(registry, log);
  EXPECT_FALSE(scan.launches.empty()) << log;
  TrtllmReproduced out;
  out.memory = scan.launches.back().memory;
  plan::PlanOptions options;
  options.engine = "trtllm";
  options.kv_cache_dtypes = kv;
  out.prediction = plan::predict_from_log(
      registry, checkpoint::read_checkpoint(trtllm_geometry(config)), out.memory, options);
  return out;
}

TEST(TrtllmLogs, GptOss120bTokensReproducedFromThePrintedMemory) {
  TrtllmReproduced r = trtllm_reproduce(trtllm_log("gpt-oss-120b-tp1-dgxspark-1.1.0rc3.log"),
                                        "trtllm-geometry/gpt-oss-120b");
  EXPECT_EQ(r.memory.engine, "trtllm");
  EXPECT_EQ(r.memory.engine_version, "1.1.0rc3");
  EXPECT_EQ(r.memory.pool_tokens, 86720) << "the final allocation, not the profiling one (8224)";
  ASSERT_TRUE(r.all_inside()) << r.notes();
  const plan::LogCheck* tokens = r.check("trtllm_max_tokens");
  ASSERT_NE(tokens, nullptr);
  EXPECT_EQ(tokens->printed, 86720);
  EXPECT_TRUE(tokens->predicted.contains(86720));
  EXPECT_LE(tokens->predicted.hi - tokens->predicted.lo, 200)
      << "the rounding interval of 0.01 GiB at 73728 B per token is ~146 tokens, in blocks of 32";
  ASSERT_NE(r.check("trtllm_kv_size_per_token"), nullptr);
  EXPECT_EQ(r.check("trtllm_kv_size_per_token")->predicted.lo, 73728);
  ASSERT_NE(r.check("trtllm_available_from_profile"), nullptr);
  // The other dtypes at the same budget: FP8 holds twice the tokens.
  for (const auto& row : r.prediction.rows) {
    if (row.kv_cache_dtype == "fp8_e4m3") {
      EXPECT_NEAR(row.max_total_tokens.lo, 2 * 86592, 64);
    }
  }
}

TEST(TrtllmLogs, TinyLlamaAndTheDtypeFromKvSize) {
  TrtllmReproduced r = trtllm_reproduce(trtllm_log("tinyllama-1.1b-tp1-serve-1.1.0.log"),
                                        "trtllm-geometry/tinyllama-1.1b-chat");
  ASSERT_TRUE(r.all_inside()) << r.notes();
  EXPECT_EQ(r.check("trtllm_max_tokens")->printed, 1871136);
}

// No profiling line, no dtype line: only "Allocated 3.17 GiB ... (46208)". Its bytes per token
// match the FP8 layout of Qwen3-8B and no other dtype: the FP8 checkpoint's cache, derived.
TEST(TrtllmLogs, Qwen3Fp8DtypeDerivedFromTheAllocationAlone) {
  TrtllmReproduced r = trtllm_reproduce(trtllm_log("qwen3-8b-fp8-tp1-llmapi-1.2.0rc2.log"),
                                        "trtllm-geometry/qwen3-8b");
  ASSERT_TRUE(r.all_inside()) << r.notes();
  EXPECT_NE(r.notes().find("KV cache dtype fp8_e4m3 derived from the final allocation"),
            std::string::npos)
      << r.notes();
}

// Kimi-K2.5 (MLA, TP 8): 166.02 GiB for 5073376 tokens is 61 x 576 B, the FP8 latent.
TEST(TrtllmLogs, KimiMlaFp8FromTheAllocation) {
  TrtllmReproduced r =
      trtllm_reproduce(trtllm_log("kimi-k2.5-nvfp4-tp8-tail-1.3.0rc7.log"), "kimi-k2.5");
  ASSERT_TRUE(r.all_inside()) << r.notes();
  EXPECT_NE(r.notes().find("fp8_e4m3 derived"), std::string::npos) << r.notes();
}

// The same real log with one figure changed: the profile's own arithmetic no longer holds,
// and the wrong dtype forced on the real log misses every figure.
TEST(TrtllmLogs, InconsistentFiguresAndAWrongDtypeAreCaught) {
  std::ifstream in(trtllm_log("gpt-oss-120b-tp1-dgxspark-1.1.0rc3.log"));
  std::stringstream text;
  text << in.rdbuf();
  std::string edited = text.str();
  const std::string from = "(torch + non-torch): 113.65 GiB";
  ASSERT_NE(edited.find(from), std::string::npos);
  edited.replace(edited.find(from), from.size(), "(torch + non-torch): 103.65 GiB");
  const fs::path copy = fs::temp_directory_path() / "kvaudit-trtllm-edited.log";
  std::ofstream(copy) << edited;
  TrtllmReproduced r = trtllm_reproduce(copy, "trtllm-geometry/gpt-oss-120b");
  fs::remove(copy);
  ASSERT_NE(r.check("trtllm_available_from_profile"), nullptr);
  EXPECT_FALSE(r.check("trtllm_available_from_profile")->inside);

  TrtllmReproduced wrong = trtllm_reproduce(trtllm_log("gpt-oss-120b-tp1-dgxspark-1.1.0rc3.log"),
                                            "trtllm-geometry/gpt-oss-120b", {"fp8_e4m3"});
  EXPECT_FALSE(wrong.check("trtllm_kv_size_per_token")->inside);
  EXPECT_FALSE(wrong.check("trtllm_max_tokens")->inside);
}

}  // namespace
}  // namespace kvaudit::logs
