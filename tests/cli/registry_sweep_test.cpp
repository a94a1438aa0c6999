// Every engine of the registry, through every command that takes an engine: check on a
// checkpoint that declares an FP8 cache without scales, plan on a GPU, logs on the engine's
// real start-up logs, and probe's adapter with the engine's real server answers present. A new data
// file without its adapter, pool model or real artifacts fails here.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "audit/audit.h"
#include "common/fixtures.h"
#include "common/registry.h"
#include "logs/logs.h"
#include "plan/plan.h"
#include "probe/probe.h"
#include "util/json.h"
#include "util/util.h"

namespace kvaudit {
namespace {

namespace fs = std::filesystem;

class RegistrySweep : public ::testing::TestWithParam<std::string> {};

TEST_P(RegistrySweep, CheckResolvesAndSpellsTheFixInTheEnginesTerms) {
  const engines::EngineModel& engine = kvaudit::testing::engine(GetParam());
  audit::CheckInput input;
  input.model = checkpoint::read_checkpoint(
      kvaudit::testing::fixture_checkpoint("llama-modelopt-kv-no-scales"));
  input.flags.engine = engine.engine;
  input.engine = &engine;
  audit::CheckResult result = audit::run_check(input);
  EXPECT_FALSE(result.resolved.kv_cache_dtype.empty());
  const engines::KvDtypeFix fix = engines::kv_dtype_fix(engine, result.resolved.version, "bf16");
  EXPECT_FALSE(fix.text.empty());
  bool spelled = false;  // some finding carries the engine's own 16-bit fix
  for (const auto& finding : result.findings)
    spelled |= finding.fix.find(fix.text.substr(0, 40)) != std::string::npos;
  if (result.resolved.quantized) {
    EXPECT_TRUE(spelled) << fix.text;
  }
}

TEST_P(RegistrySweep, PlanHasAPoolModelAndARowPerDtype) {
  plan::PlanOptions options;
  options.engine = GetParam();
  options.gpu_memory_bytes = int64_t{80} << 30;
  options.weight_bytes_per_gpu = int64_t{16} << 30;
  const auto model = checkpoint::read_checkpoint(
      kvaudit::testing::fixture_checkpoint("llama-modelopt-kv-no-scales"));
  plan::CapacityPlan capacity = plan::plan_capacity(kvaudit::testing::registry(), model, options);
  ASSERT_FALSE(capacity.rows.empty());
  for (const auto& row : capacity.rows) {
    EXPECT_GT(row.cell_bytes_per_token_per_gpu, 0) << row.kv_cache_dtype;
    EXPECT_GT(row.max_total_tokens, 0) << row.kv_cache_dtype;
  }
}

// Excerpts can hold too little to name their engine (a crash's tail); most must.
TEST_P(RegistrySweep, RealLogsReadAsTheEngine) {
  const fs::path dir = fs::path(KVAUDIT_TEST_DIR) / "fixtures" / "logs" / "real" / GetParam();
  ASSERT_TRUE(fs::exists(dir / "EXPECTED.json")) << "no real start-up logs of " << GetParam();
  ASSERT_TRUE(fs::exists(dir / "SOURCES.md"));
  int logs = 0, named = 0;
  for (const auto& entry : read_json_file(dir / "EXPECTED.json")) {
    const std::string file = entry.at("file").get<std::string>();
    logs::LogScan scan = logs::scan_log_file(kvaudit::testing::registry(), dir / file);
    ASSERT_FALSE(scan.launches.empty()) << file;
    ++logs;
    named += scan.launches.back().engine == GetParam();
    EXPECT_TRUE(scan.launches.back().engine.empty() || scan.launches.back().engine == GetParam())
        << file << " read as " << scan.launches.back().engine;
  }
  EXPECT_GE(logs, 5) << "at least five real logs per engine";
  EXPECT_GE(named * 5, logs * 4) << named << " of " << logs << " name " << GetParam();
}

TEST_P(RegistrySweep, RealServerAnswersExist) {
  const fs::path dir = fs::path(KVAUDIT_TEST_DIR) / "fixtures" / "servers" / GetParam();
  ASSERT_TRUE(fs::is_directory(dir)) << "no real server answers of " << GetParam();
  int answers = 0;
  for (const auto& entry : read_json_file(dir.parent_path() / "EXPECTED.json"))
    answers += entry.at("file").get<std::string>().rfind(GetParam() + "/", 0) == 0;
  EXPECT_GE(answers, 3);
  bool adapter = false;
  for (const auto& a : probe::server_adapters()) adapter |= a.engine == GetParam();
  EXPECT_TRUE(adapter);
}

INSTANTIATE_TEST_SUITE_P(Engines, RegistrySweep,
                         ::testing::ValuesIn(kvaudit::testing::registry().names()),
                         [](const ::testing::TestParamInfo<std::string>& param_info) {
                           return param_info.param;
                         });

}  // namespace
}  // namespace kvaudit
