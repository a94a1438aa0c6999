// Bounded memory and bad input: over-long lines are read in part, old launches are
// dropped beyond the window, binary and empty input fail with a clear error.
#include <gtest/gtest.h>

#include <sstream>

#include "common/registry.h"
#include "logs/logs.h"
#include "util/util.h"

namespace kvaudit::logs {
namespace {

TEST(Bounds, OverLongLineIsReadInPart) {
  std::string text =
      "[2026-03-07 14:02:19] server_args=ServerArgs(model_path='/m', kv_cache_dtype='bf16', x='";
  text += std::string(3 << 20, 'a');
  text += "')\n[2026-03-07 14:05:45] Load weight begin. avail mem=44.00 GB\n";
  std::istringstream in(text);
  ScanOptions options;
  options.max_line_bytes = 1 << 20;
  LogScan scan = scan_log(kvaudit::testing::registry(), in, "long", options);
  EXPECT_EQ(scan.truncated_lines, 1);
  ASSERT_EQ(scan.launches.size(), 1u);
  EXPECT_FALSE(scan.launches[0].server_args_complete);
  EXPECT_EQ(scan.launches[0].kv_cache_dtype_requested, "bf16");  // fields before the cut
  EXPECT_DOUBLE_EQ(*scan.launches[0].memory.total_before_load_gib, 44.0);
  EXPECT_EQ(scan.lines, 2);
}

TEST(Bounds, OldLaunchesAreDroppedBeyondTheWindow) {
  std::string text;
  for (int i = 0; i < 10; ++i)
    text += "[2026-03-07 14:02:19] server_args=ServerArgs(kv_cache_dtype='bf16', tp_size=" +
            std::to_string(i + 1) +
            ")\n[2026-03-07 14:02:20] Load weight begin. avail mem=44.00 GB\n";
  std::istringstream in(text);
  ScanOptions options;
  options.max_launches = 4;
  LogScan scan = scan_log(kvaudit::testing::registry(), in, "many", options);
  EXPECT_EQ(scan.launches.size(), 4u);
  EXPECT_EQ(scan.launches_dropped, 6);
  EXPECT_EQ(scan.launches.back().tp, 10);
}

TEST(Bounds, BadInputFailsClearly) {
  std::istringstream empty("");
  EXPECT_THROW(scan_log(kvaudit::testing::registry(), empty, "empty"), InputError);
  std::string binary(
      "\x7f"
      "ELF\x02\x01\x01\x00\x00\x00",
      10);
  std::istringstream bin(binary);
  EXPECT_THROW(scan_log(kvaudit::testing::registry(), bin, "binary"), InputError);
  EXPECT_THROW(scan_log_file(kvaudit::testing::registry(), "/nonexistent/kvaudit.log"), InputError);
  EXPECT_THROW(parse_expectation("kv_cache_dtype"), InputError);
  EXPECT_THROW(parse_expectation("colour=blue"), InputError);
}

TEST(Bounds, LinesSplitAcrossReadBlocksAreWhole) {
  // A 1 MiB block boundary falls inside the capacity line.
  std::string filler;
  while (filler.size() < (1 << 20) - 30) filler += "Decode batch, #running-req: 1, #token: 10\n";
  std::string text = filler +
                     "[2026-03-07 14:05:46 TP0] KV Cache is allocated. #tokens: 183133, K size: "
                     "11.18 GB, V size: 11.18 GB\n";
  LogScan scan = scan_log_text(kvaudit::testing::registry(), text);
  ASSERT_EQ(scan.launches.size(), 1u);
  EXPECT_EQ(*scan.launches[0].memory.pool_tokens, 183133);
  EXPECT_DOUBLE_EQ(*scan.launches[0].memory.k_gib, 11.18);
}

}  // namespace
}  // namespace kvaudit::logs

namespace kvaudit::logs {
namespace {

// Message texts as vLLM's source prints them (the engine data's log templates cite where).
TEST(ScaleMessages, VllmUnitScaleIsProofOfFallback) {
  LogScan scan = scan_log_text(
      kvaudit::testing::registry(),
      "INFO 03-07 14:02:11 [api_server.py:1] vLLM API server version 0.11.0\n"
      "INFO 03-07 14:02:12 [api_server.py:2] non-default args: {'model': '/m', 'kv_cache_dtype': "
      "'fp8', "
      "'tensor_parallel_size': 2}\n"
      "WARNING 03-07 14:03:12 [kv_cache.py:9] Using KV cache scaling factor 1.0 for fp8_e4m3. If "
      "this is "
      "unintended, verify that k/v_scale scaling factors are properly set in the checkpoint.\n");
  ASSERT_EQ(scan.launches.size(), 1u);
  const Launch& l = scan.launches[0];
  EXPECT_EQ(l.engine_version, "0.11.0");
  EXPECT_EQ(l.tp, 2);
  EXPECT_EQ(l.kv_cache_dtype_resolved, "fp8_e4m3");
  ASSERT_TRUE(l.scale_fallback.has_value());
  EXPECT_TRUE(*l.scale_fallback);
}

TEST(ScaleMessages, VllmDroppedScaleNameIsProofOfFallback) {
  LogScan scan = scan_log_text(
      kvaudit::testing::registry(),
      "INFO 03-07 14:02:12 [api_server.py:2] non-default args: {'model': '/m', 'kv_cache_dtype': "
      "'fp8_e4m3'}\n"
      "WARNING 03-07 14:03:12 [weight_utils.py:9] Found kv_scale in the checkpoint (e.g. "
      "model.layers.0.self_attn.kv_scale), but not found the expected name in the model (e.g. "
      "model.layers.0.self_attn.attn.kv_scale). kv_scale is not loaded.\n");
  ASSERT_EQ(scan.launches.size(), 1u);
  EXPECT_EQ(scan.launches[0].scale_fallback, true);
}

TEST(ScaleMessages, SglangDtypeOnThePoolLineAndE5m2) {
  LogScan scan = scan_log_text(
      kvaudit::testing::registry(),
      "[2026-03-07 14:02:19] server_args=ServerArgs(kv_cache_dtype='fp8_e5m2', tp_size=1)\n"
      "[2026-03-07 14:05:46] KV Cache is allocated. dtype: torch.float8_e5m2, #tokens: 1000, K "
      "size: 0.01 GB, "
      "V size: 0.01 GB\n");
  ASSERT_EQ(scan.launches.size(), 1u);
  const Launch& l = scan.launches[0];
  EXPECT_EQ(l.kv_cache_dtype_resolved, "fp8_e5m2");
  EXPECT_EQ(*l.memory.pool_tokens, 1000);
  EXPECT_FALSE(l.scale_fallback.has_value());  // e5m2 never logs the warning: cannot tell
}

}  // namespace
}  // namespace kvaudit::logs
