// check and logs report fp8-unit-scale as one finding: on a real vLLM 0.9.0 log whose
// workers printed the definitive scale-1.0 line, logs' finding carries the same
// consequence, fix and engine reference as check's on a checkpoint without scales under
// the same release and dtype.
#include <gtest/gtest.h>

#include <filesystem>

#include "audit/audit.h"
#include "common/fixtures.h"
#include "common/registry.h"
#include "engines/engines.h"
#include "logs/logs.h"

namespace kvaudit::logs {
namespace {

const report::Finding* find(const std::vector<report::Finding>& findings, const std::string& id) {
  for (const auto& f : findings)
    if (f.id == id) return &f;
  return nullptr;
}

TEST(SharedFinding, UnitScaleReadsTheSameInCheckAndLogs) {
  const auto log = std::filesystem::path(KVAUDIT_TEST_DIR) / "fixtures" / "logs" / "real" / "vllm" /
                   "llama4-maverick-fp8-workers-0.9.0.log";
  const LogScan scan = scan_log_file(kvaudit::testing::registry(), log.string());
  ASSERT_FALSE(scan.launches.empty());
  const Launch& launch = scan.launches.back();
  const report::Finding* from_log = find(launch.findings, "fp8-unit-scale");
  ASSERT_NE(from_log, nullptr);

  audit::CheckInput input;
  input.model =
      checkpoint::read_checkpoint(testing::fixture_checkpoint("llama-modelopt-kv-no-scales"));
  input.flags.engine = "vllm";
  input.flags.engine_version = "0.9.0";
  input.flags.kv_cache_dtype = "fp8";
  input.flags.kv_cache_dtype_flag = "--kv-cache-dtype";
  input.engine = &kvaudit::testing::engine("vllm");
  input.version_given = true;
  const audit::CheckResult result = audit::run_check(input);
  const report::Finding* from_check = find(result.findings, "fp8-unit-scale");
  ASSERT_NE(from_check, nullptr);

  EXPECT_EQ(from_log->severity, from_check->severity);
  EXPECT_EQ(from_log->consequence, from_check->consequence);
  EXPECT_EQ(from_log->fix, from_check->fix);
  EXPECT_EQ(from_log->reference, from_check->reference);
  EXPECT_NE(from_log->reference.find("vllm/"), std::string::npos) << from_log->reference;
}

}  // namespace
}  // namespace kvaudit::logs
