// decide: the decision table on the motivating deployment (the bundled checkpoint, its unit
// and its journal), the fix (a unit and a command line that differ from the original only by
// the dtype flag), and the verification (the expectations the table predicts pass on the
// fixed launch's log and fail on the old one).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "common/fixtures.h"
#include "common/registry.h"
#include "decide/decide.h"
#include "engines/engines.h"
#include "logs/logs.h"
#include "util/util.h"

namespace kvaudit::decide {
namespace {

namespace fs = std::filesystem;

const fs::path kExample =
    fs::path(KVAUDIT_TEST_DIR) / ".." / "examples" / "qwen3.5-397b-a17b-nvfp4";
const fs::path kJournal =
    fs::path(KVAUDIT_TEST_DIR) / "fixtures" / "logs" / "journal_qwen35_fp8_then_bf16.log";

fs::path demo_dir() {
  return kvaudit::testing::demo_checkpoint();
}

const checkpoint::ModelFacts& demo_model() {
  static const checkpoint::ModelFacts model = checkpoint::read_checkpoint(demo_dir());
  return model;
}

// The motivating deployment, judged under its user's stance ("context should use no
// quantization": --kv-policy lossless) unless a test asks for another policy.
audit::CheckInput unit_input(const std::string& kv_override = "",
                             audit::KvPolicy policy = audit::KvPolicy::lossless) {
  audit::CheckInput input;
  input.policy = policy;
  input.flags = engines::parse_systemd_unit(kvaudit::testing::registry(),
                                            (kExample / "sglang.service").string());
  if (!kv_override.empty()) {
    input.flags.kv_cache_dtype = kv_override;
    input.flags.kv_cache_dtype_flag = "--kv-cache-dtype";
  }
  input.engine = &kvaudit::testing::engine(input.flags.engine);
  input.model = demo_model();
  return input;
}

const KvOption& option(const Decision& decision, const std::string& id) {
  for (const auto& o : decision.options)
    if (o.id == id) return o;
  throw std::runtime_error("no option " + id);
}

logs::LogScan journal() {
  return logs::scan_log_file(kvaudit::testing::registry(), kJournal.string());
}

TEST(Decision, MotivatingDeploymentSizedFromItsJournal) {
  const audit::CheckInput input = unit_input();
  const audit::CheckResult launched = audit::run_check(input);
  DecisionOptions request;
  request.memory.logged = journal().launches.back().memory;
  request.memory.log_label = "the journal";
  const Decision decision = decide(kvaudit::testing::registry(), input, launched, request);

  ASSERT_FALSE(decision.options.empty());
  EXPECT_EQ(decision.options.front().id, "as-launched");
  EXPECT_EQ(decision.options.front().kv_cache_dtype, "fp8_e4m3");
  EXPECT_EQ(decision.options.front().scale_source, "unit_default");
  EXPECT_GE(decision.options.front().critical, 1);
  EXPECT_EQ(decision.recommended, "bf16");
  // Under lossless no quantized option is clean, calibrated or not.
  EXPECT_EQ(decision.alternative, "");

  // The engine's own figures lie inside the predicted ranges: 1,573,854 tokens printed by
  // the bf16 launch, 3,147,708 by the FP8 one, from the same memory.
  const KvOption& bf16 = option(decision, "bf16");
  ASSERT_TRUE(bf16.tokens);
  EXPECT_TRUE(bf16.tokens->contains(1573854)) << bf16.tokens->lo << ".." << bf16.tokens->hi;
  EXPECT_EQ(bf16.critical, 0);
  EXPECT_EQ(bf16.flag_value, "bf16");
  const KvOption& fp8 = decision.options.front();
  ASSERT_TRUE(fp8.tokens);
  EXPECT_TRUE(fp8.tokens->contains(3147708)) << fp8.tokens->lo << ".." << fp8.tokens->hi;
  // Concurrency at 32K and 128K from the low end of the range: 1,573,227 / 32,768 = 48.
  ASSERT_EQ(decision.contexts.size(), 3u);  // 32K, 128K and the unit's 256K context
  EXPECT_EQ(decision.contexts[2], 262144);
  ASSERT_EQ(bf16.concurrency.size(), 3u);
  EXPECT_EQ(bf16.concurrency[0].requests, bf16.tokens->lo / 32768);
  EXPECT_EQ(bf16.concurrency[1].requests, bf16.tokens->lo / 131072);
  EXPECT_EQ(fp8.concurrency[0].requests, fp8.tokens->lo / 32768);

  // Calibrated FP8 keeps FP8's capacity and clears the scale finding; under lossless the
  // quantized cache itself stays critical.
  const KvOption& calibrated = option(decision, "fp8-calibrated");
  EXPECT_TRUE(calibrated.possible) << calibrated.why_not;
  EXPECT_EQ(calibrated.scale_source, "checkpoint");
  EXPECT_EQ(
      std::count(calibrated.finding_ids.begin(), calibrated.finding_ids.end(), "fp8-unit-scale"),
      0);
  EXPECT_EQ(std::count(calibrated.finding_ids.begin(), calibrated.finding_ids.end(),
                       "kv-cache-quantized"),
            1);
  EXPECT_EQ(calibrated.tokens->lo, fp8.tokens->lo);
}

// The default policy judges the same launch on evidence: the sparse demo's key norms are
// all zeros (no evidence), the published Qwen3.5 measurements keep at least 95% at scale
// 1.0, so nothing is critical; calibrated FP8 is clean and keeps the capacity.
TEST(Decision, UnderTheEvidencePolicyTheMotivatingLaunchWarns) {
  const audit::CheckInput input = unit_input("", audit::KvPolicy::evidence);
  DecisionOptions request;
  request.memory.logged = journal().launches.back().memory;
  const Decision decision =
      decide(kvaudit::testing::registry(), input, audit::run_check(input), request);
  EXPECT_EQ(decision.options.front().critical, 0);
  EXPECT_GE(decision.options.front().warning, 1);
  EXPECT_EQ(decision.recommended, "");
  EXPECT_EQ(option(decision, "fp8-calibrated").critical, 0);
  EXPECT_EQ(option(decision, "fp8-calibrated").warning, 0);
}

TEST(Decision, ExpectationsFromTheTablePassOnTheFixedLaunchAndFailOnTheOldOne) {
  const audit::CheckInput input = unit_input();
  DecisionOptions request;
  const logs::LogScan scan = journal();
  ASSERT_EQ(scan.launches.size(), 2u);
  request.memory.logged = scan.launches.back().memory;
  const Decision decision =
      decide(kvaudit::testing::registry(), input, audit::run_check(input), request);
  std::vector<logs::Expectation> expectations;
  for (const auto& text : expectations_for(option(decision, decision.recommended)))
    expectations.push_back(logs::parse_expectation(text));
  ASSERT_EQ(expectations.size(), 3u);  // dtype, scale fallback, capacity range
  EXPECT_EQ(expectations[2].key, "max_total_tokens");
  for (const auto& r :
       logs::check_expectations(kvaudit::testing::registry(), scan.launches[1], expectations))
    EXPECT_TRUE(r.met) << r.expected.key << " expected " << r.expected.value << ", log "
                       << r.actual;
  int unmet = 0;
  for (const auto& r :
       logs::check_expectations(kvaudit::testing::registry(), scan.launches[0], expectations))
    unmet += r.met ? 0 : 1;
  EXPECT_EQ(unmet, 3);  // fp8_e4m3, scale 1.0 fallback, 3,147,708 tokens
}

TEST(Decision, WithoutMemoryTheTableSaysWhichFlagSizesIt) {
  const audit::CheckInput input = unit_input();
  const Decision decision =
      decide(kvaudit::testing::registry(), input, audit::run_check(input), {});
  for (const auto& o : decision.options) EXPECT_FALSE(o.tokens) << o.id;
  EXPECT_NE(decision.memory_note.find("--gpu"), std::string::npos) << decision.memory_note;
  EXPECT_NE(decision.memory_note.find("--from-log"), std::string::npos);
}

TEST(Decision, ACleanLaunchHasNothingToFix) {
  const audit::CheckInput input = unit_input("bf16");
  const audit::CheckResult result = audit::run_check(input);
  DecisionOptions request;
  request.memory.gpu_memory_bytes = int64_t{97887} << 20;
  const Decision decision = decide(kvaudit::testing::registry(), input, result, request);
  EXPECT_EQ(decision.options.front().kv_cache_dtype, "bf16");
  EXPECT_EQ(decision.options.front().critical, 0);
  EXPECT_EQ(decision.recommended, "");
  for (const auto& o : decision.options) EXPECT_NE(o.id, "bf16");  // the launch already is
  ASSERT_TRUE(decision.options.front().tokens);
  EXPECT_GT(decision.options.front().tokens->lo, 0);
}

// TensorRT-LLM: no value gives a 16-bit cache, so the 16-bit option is the checkpoint-config
// overlay (judged on the checkpoint seen through it, under auto); FP8 with calibrated scales
// is not possible, since the PyTorch backend never uses checkpoint scales for FP8.
TEST(Decision, TrtllmSixteenBitIsAnOverlayAndCalibrationIsNoOption) {
  audit::CheckInput input;
  input.policy = audit::KvPolicy::lossless;
  input.model = checkpoint::read_checkpoint(
      kvaudit::testing::fixture_checkpoint("llama-modelopt-kv-no-scales"));
  input.flags.engine = "trtllm";
  input.flags.engine_version = "1.2.0rc5";
  input.version_given = true;
  input.engine = &kvaudit::testing::engine("trtllm");
  const audit::CheckResult result = audit::run_check(input);
  ASSERT_EQ(result.resolved.kv_cache_dtype, "fp8_e4m3");
  DecisionOptions request;
  request.memory.gpu_memory_bytes = int64_t{81559} << 20;
  const Decision decision = decide(kvaudit::testing::registry(), input, result, request);
  const KvOption& sixteen = option(decision, "bf16");
  EXPECT_TRUE(sixteen.overlay);
  EXPECT_EQ(sixteen.kv_cache_dtype, "bf16");
  EXPECT_EQ(sixteen.critical, 0);
  EXPECT_NE(sixteen.change.find("kv_cache_quant_algo to null"), std::string::npos)
      << sixteen.change;
  EXPECT_EQ(decision.recommended, "bf16");
  const KvOption& calibrated = option(decision, "fp8-calibrated");
  EXPECT_FALSE(calibrated.possible);
  EXPECT_NE(calibrated.why_not.find("trtllm-pytorch-fp8-scales-stay-1"), std::string::npos)
      << calibrated.why_not;
  // The explicit values this release takes are spelled as its config key (no flag before rc7).
  const KvOption& nvfp4 = option(decision, "nvfp4");
  EXPECT_EQ(nvfp4.change.rfind("kv_cache_config.dtype", 0), 0u) << nvfp4.change;
  // Its start-up log never names the KV dtype: the checks read the overlay and the printed
  // bytes per token instead.
  Verification where;
  where.log_names_kv_dtype = log_names_kv_dtype(*input.engine);
  where.checkpoint = "/srv/overlay";
  EXPECT_FALSE(where.log_names_kv_dtype);
  EXPECT_TRUE(log_names_kv_dtype(kvaudit::testing::engine("sglang")));
  const std::vector<std::string> lines = verification_commands(decision, sixteen, where);
  ASSERT_GE(lines.size(), 2u);
  EXPECT_NE(lines[0].find("kvaudit logs - --checkpoint /srv/overlay --expect kv_cache_dtype=bf16"),
            std::string::npos)
      << lines[0];
  EXPECT_NE(lines[1].find("kvaudit plan /srv/overlay --from-log -"), std::string::npos) << lines[1];
}

// Removing the one inserted flag gives back the original, byte for byte.
TEST(Fix, WrittenUnitDiffersOnlyByTheDtypeFlag) {
  const std::string original = read_text_file(kExample / "sglang.service");
  const engines::EngineModel& sglang = kvaudit::testing::engine("sglang");
  const std::string fixed = fix_unit(original, sglang, "bf16", "sglang.service");
  ASSERT_NE(fixed, original);
  const std::string inserted = " --kv-cache-dtype bf16";
  const size_t at = fixed.find(inserted);
  ASSERT_NE(at, std::string::npos);
  EXPECT_EQ(fixed.substr(0, at) + fixed.substr(at + inserted.size()), original);
  // The corrected unit parses to the same launch with the new dtype.
  const fs::path tmp = fs::temp_directory_path() / ("kvaudit-fixed-" + std::to_string(::getpid()));
  write_file_atomically(tmp, fixed);
  engines::LaunchFlags before = engines::parse_systemd_unit(kvaudit::testing::registry(),
                                                            (kExample / "sglang.service").string());
  engines::LaunchFlags after =
      engines::parse_systemd_unit(kvaudit::testing::registry(), tmp.string());
  fs::remove(tmp);
  EXPECT_EQ(after.kv_cache_dtype, "bf16");
  EXPECT_EQ(after.tp, before.tp);
  EXPECT_EQ(after.memory_fraction, before.memory_fraction);
  EXPECT_EQ(after.context_length, before.context_length);
  EXPECT_EQ(after.model_path, before.model_path);
}

TEST(Fix, AnExistingFlagIsReplacedInPlaceInEitherForm) {
  const engines::EngineModel& sglang = kvaudit::testing::engine("sglang");
  const std::string unit =
      "[Service]\nExecStart=/bin/python -m sglang.launch_server --kv-cache-dtype auto \\\n"
      "    --tp 8\nRestart=always\n";
  EXPECT_EQ(fix_unit(unit, sglang, "bf16", "u"),
            "[Service]\nExecStart=/bin/python -m sglang.launch_server --kv-cache-dtype bf16 \\\n"
            "    --tp 8\nRestart=always\n");
  EXPECT_EQ(fix_command("python -m sglang.launch_server --kv-cache-dtype=fp8_e4m3 --tp 8", sglang,
                        "bf16"),
            "python -m sglang.launch_server --kv-cache-dtype=bf16 --tp 8");
  // A longer flag that starts the same is not the dtype flag.
  EXPECT_EQ(fix_command("vllm serve m --kv-cache-dtype-skip-layers 0",
                        kvaudit::testing::engine("vllm"), "bfloat16"),
            "vllm serve m --kv-cache-dtype-skip-layers 0 --kv-cache-dtype bfloat16");
  EXPECT_EQ(fix_command("python -m sglang.launch_server --tp 8\n", sglang, "bf16"),
            "python -m sglang.launch_server --tp 8 --kv-cache-dtype bf16\n");
  EXPECT_THROW(fix_unit("[Service]\nType=simple\n", sglang, "bf16", "u"), InputError);
}

TEST(Verify, CommandsNameTheUnitTheUrlAndTheExpectations) {
  const audit::CheckInput input = unit_input();
  DecisionOptions request;
  request.memory.logged = journal().launches.back().memory;
  const Decision decision =
      decide(kvaudit::testing::registry(), input, audit::run_check(input), request);
  const auto lines = verification_commands(decision, option(decision, "bf16"),
                                           {"sglang", "http://127.0.0.1:30000", "", true, ""});
  ASSERT_GE(lines.size(), 3u);
  EXPECT_EQ(lines[0].rfind("journalctl -u sglang -b --no-pager | kvaudit logs - --expect "
                           "kv_cache_dtype=bf16",
                           0),
            0u)
      << lines[0];
  EXPECT_NE(lines[0].find("max_total_tokens="), std::string::npos);
  EXPECT_EQ(lines[1], "kvaudit probe http://127.0.0.1:30000 --smoke");
  EXPECT_NE(lines[2].find("--compare"), std::string::npos);
}

}  // namespace
}  // namespace kvaudit::decide
