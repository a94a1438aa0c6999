// Severity from evidence and intent: the key-norm bound on trained weights, measured maxima,
// published damage, a sparse stand-in that is not evidence, and what --kv-policy makes of
// each.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>

#include "audit/audit.h"
#include "common/fixtures.h"
#include "common/registry.h"
#include "util/json.h"
#include "util/util.h"

namespace kvaudit::audit {
namespace evidence_test {
namespace {

namespace fs = std::filesystem;
using report::Finding;
using report::Severity;

// The trained Qwen3 fixture (tools/train_fixture_model.py): real learned k_norm weights, and
// K/V maxima measured on held-out text in training.json.
fs::path trained_qwen3() {
  return fs::path(KVAUDIT_TEST_DIR) / "fixtures" / "model" / "qwen3-pystd";
}

const PublishedEvidence& published() {
  static const PublishedEvidence table = load_published_evidence(
      data_dir() / "evidence" / "kv_damage.json", kvaudit::testing::registry().dtypes());
  return table;
}

CheckResult check_model(const checkpoint::ModelFacts& model, const std::string& engine,
                        const std::string& kv, const std::string& version,
                        KvPolicy policy = KvPolicy::evidence,
                        std::optional<MeasuredKvRange> measured = std::nullopt) {
  CheckInput input;
  input.model = model;
  input.flags.engine = engine;
  input.flags.engine_version = version;
  input.flags.kv_cache_dtype = kv;
  input.flags.kv_cache_dtype_flag = kv == "auto" ? "" : "--kv-cache-dtype";
  input.engine = &kvaudit::testing::engine(engine);
  input.version_given = true;
  input.policy = policy;
  input.published = &published();
  input.measured = measured;
  return run_check(input);
}

const Finding* find(const CheckResult& result, const std::string& id) {
  for (const auto& finding : result.findings)
    if (finding.id == id) return &finding;
  return nullptr;
}

// A copy of the trained checkpoint whose key-norm gains are multiplied by `factor`
// (bf16, in place): the same model with keys that can reach past FP8's range.
fs::path scaled_norm_copy(float factor) {
  const fs::path dir = fs::path(KVAUDIT_BUILD_DIR) / "fixtures" /
                       ("qwen3-pystd-knorm-x" + std::to_string(static_cast<int>(factor)));
  fs::create_directories(dir);
  for (const char* file : {"config.json", "tokenizer.json", "tokenizer_config.json"})
    fs::copy_file(trained_qwen3() / file, dir / file, fs::copy_options::overwrite_existing);
  std::string bytes = read_text_file(trained_qwen3() / "model.safetensors", 64u << 20);
  const checkpoint::SafetensorsHeader header =
      checkpoint::read_safetensors_header(trained_qwen3() / "model.safetensors");
  for (const auto& tensor : header.tensors) {
    if (!checkpoint::classify_k_norm_tensor(tensor.name)) continue;
    for (uint64_t at = header.data_offset() + tensor.data_begin;
         at < header.data_offset() + tensor.data_end; at += 2) {
      uint32_t bits = uint32_t(uint8_t(bytes[at])) << 16 | uint32_t(uint8_t(bytes[at + 1])) << 24;
      float value;
      std::memcpy(&value, &bits, 4);
      value *= factor;
      std::memcpy(&bits, &value, 4);
      bytes[at] = char((bits >> 16) & 0xff);
      bytes[at + 1] = char((bits >> 24) & 0xff);
    }
  }
  write_file_atomically(dir / "model.safetensors", bytes);
  return dir;
}

// The bound is sound on real trained weights: every layer's held-out K maximum (measured by
// PyTorch when the fixture was trained) lies under sqrt(head_dim) x max|k_norm weight|.
TEST(KeyNormBound, HoldsOnTheTrainedModel) {
  const checkpoint::ModelFacts model = checkpoint::read_checkpoint(trained_qwen3());
  ASSERT_EQ(model.qk_norm, checkpoint::QkNorm::gain);
  ASSERT_EQ(model.k_norms.size(), 4u);
  const nlohmann::json training = read_json_file(trained_qwen3() / "training.json");
  for (const auto& row : training.at("kv_amax_heldout")) {
    const int layer = row.at("layer");
    float max_gain = 0;
    for (float w : model.k_norms.at(layer).values) max_gain = std::max(max_gain, std::fabs(w));
    const double bound = std::sqrt(double(model.head_dim)) * max_gain;
    EXPECT_LE(row.at("k_amax").get<double>(), bound) << "layer " << layer;
  }
}

// The "must show": the same trained Qwen3 with an FP8 cache at scale 1.0 is a note when its
// key norms bound every key inside FP8 (and the Qwen3 family's published measurements keep
// 97%+), and a warning when the gains allow keys past 448: the bound is printed either way.
TEST(KeyNormBound, FitsAndExceedsGetDifferentSeverities) {
  const checkpoint::ModelFacts fits = checkpoint::read_checkpoint(trained_qwen3());
  const CheckResult ok = check_model(fits, "vllm", "fp8", "0.22.0");
  const Finding* unit = find(ok, "fp8-unit-scale");
  ASSERT_NE(unit, nullptr);
  EXPECT_EQ(unit->severity, Severity::info) << unit->judged_on;
  EXPECT_EQ(unit->basis, "bounded + published");
  EXPECT_NE(unit->judged_on.find("keys cannot exceed 17.1"), std::string::npos) << unit->judged_on;

  const checkpoint::ModelFacts exceeds = checkpoint::read_checkpoint(scaled_norm_copy(50));
  const CheckResult risky = check_model(exceeds, "vllm", "fp8", "0.22.0");
  const Finding* clip = find(risky, "fp8-unit-scale");
  ASSERT_NE(clip, nullptr);
  EXPECT_EQ(clip->severity, Severity::warning) << clip->judged_on;
  EXPECT_EQ(clip->basis, "bounded");
  EXPECT_NE(clip->judged_on.find("allow keys up to 85"), std::string::npos) << clip->judged_on;
  EXPECT_NE(clip->judged_on.find("--kv-stats"), std::string::npos);
  // Under lossless both are critical, with the evidence kept for the record.
  EXPECT_EQ(find(check_model(fits, "vllm", "fp8", "0.22.0", KvPolicy::lossless), "fp8-unit-scale")
                ->severity,
            Severity::critical);
}

// The demo checkpoint is a sparse stand-in: its k_norm vectors read as zeros, which bound
// nothing (with Qwen3.5's 1 + w gains they would even look like a tight bound of 16).
TEST(KeyNormBound, ASparseStandInIsNotEvidence) {
  const checkpoint::ModelFacts demo = checkpoint::read_checkpoint(testing::demo_checkpoint());
  ASSERT_EQ(demo.qk_norm, checkpoint::QkNorm::one_plus_gain);
  ASSERT_EQ(demo.k_norms.size(), 15u);
  const CheckResult result = check_model(demo, "sglang", "auto", "0.5.15");
  const Finding* unit = find(result, "fp8-unit-scale");
  ASSERT_NE(unit, nullptr);
  EXPECT_EQ(unit->basis, "published");
  EXPECT_EQ(unit->severity, Severity::warning);
  EXPECT_NE(unit->judged_on.find("sparse stand-in"), std::string::npos) << unit->judged_on;
}

MeasuredKvRange measured_from_training(float k_factor) {
  const nlohmann::json training = read_json_file(trained_qwen3() / "training.json");
  MeasuredKvRange out;
  out.source = "training.json kv_amax_heldout";
  for (const auto& row : training.at("kv_amax_heldout"))
    out.layers.push_back({row.at("layer").get<int>(), row.at("k_amax").get<float>() * k_factor,
                          row.at("v_amax").get<float>()});
  return out;
}

// Measured maxima are the strongest evidence and decide alone: the held-out maxima fit FP8
// (a note); maxima 50x larger clip (critical under the default policy, a warning when
// permissive).
TEST(Measured, MaximaDecideTheSeverity) {
  const checkpoint::ModelFacts model = checkpoint::read_checkpoint(trained_qwen3());
  // Each result is kept in a variable: find() points into it.
  const CheckResult fitting =
      check_model(model, "vllm", "fp8", "0.22.0", KvPolicy::evidence, measured_from_training(1));
  const Finding* fits = find(fitting, "fp8-unit-scale");
  ASSERT_NE(fits, nullptr);
  EXPECT_EQ(fits->basis, "measured");
  EXPECT_EQ(fits->severity, Severity::info);
  const CheckResult clips =
      check_model(model, "vllm", "fp8", "0.22.0", KvPolicy::evidence, measured_from_training(50));
  ASSERT_NE(find(clips, "fp8-unit-scale"), nullptr);
  EXPECT_EQ(find(clips, "fp8-unit-scale")->basis, "measured");
  EXPECT_EQ(find(clips, "fp8-unit-scale")->severity, Severity::critical);
  EXPECT_NE(find(clips, "fp8-unit-scale")->judged_on.find("exceed"), std::string::npos);
  const CheckResult permissive =
      check_model(model, "vllm", "fp8", "0.22.0", KvPolicy::permissive, measured_from_training(50));
  ASSERT_NE(find(permissive, "fp8-unit-scale"), nullptr);
  EXPECT_EQ(find(permissive, "fp8-unit-scale")->severity, Severity::warning);
  // A statistics file that misses layers settles nothing for them.
  MeasuredKvRange partial = measured_from_training(1);
  partial.layers.pop_back();
  const CheckResult unsettled =
      check_model(model, "vllm", "fp8", "0.22.0", KvPolicy::evidence, partial);
  ASSERT_NE(find(unsettled, "fp8-unit-scale"), nullptr);
  EXPECT_EQ(find(unsettled, "fp8-unit-scale")->severity, Severity::warning);
}

// Published damage on the family decides when nothing about this checkpoint does: Qwen2 at
// scale 1.0 collapses (GSM8K 90.5 -> 2.0), Llama keeps 97% of MRCR.
TEST(Published, FamilyDamageDecidesWithoutABound) {
  checkpoint::ModelFacts qwen2 =
      checkpoint::read_checkpoint(testing::fixture_checkpoint("llama-bf16-plain"));
  qwen2.model_type = "qwen2";
  const CheckResult qwen2_result = check_model(qwen2, "vllm", "fp8", "0.22.0");
  const Finding* bad = find(qwen2_result, "fp8-unit-scale");
  ASSERT_NE(bad, nullptr);
  EXPECT_EQ(bad->basis, "published");
  EXPECT_EQ(bad->severity, Severity::critical);
  EXPECT_NE(bad->judged_on.find("Qwen2.5-7B"), std::string::npos) << bad->judged_on;

  const checkpoint::ModelFacts llama =
      checkpoint::read_checkpoint(testing::fixture_checkpoint("llama-bf16-plain"));
  const CheckResult llama_result = check_model(llama, "vllm", "fp8", "0.22.0");
  const Finding* fine = find(llama_result, "fp8-unit-scale");
  ASSERT_NE(fine, nullptr);
  EXPECT_EQ(fine->severity, Severity::warning);  // published alone does not clear a checkpoint
  EXPECT_NE(fine->judged_on.find("no key norm"), std::string::npos) << fine->judged_on;
}

// Scales the checkpoint ships but the engine drops are critical (not applied as shipped);
// their values still bound the range the cache runs with.
TEST(ShippedScales, DroppedScalesAreCriticalAndTheirValuesBoundTheRange) {
  const checkpoint::ModelFacts model =
      checkpoint::read_checkpoint(testing::fixture_checkpoint("qwen3-moe-modelopt-fp8"));
  const CheckResult result = check_model(model, "sglang", "auto", "0.5.19");
  ASSERT_NE(find(result, "scales-dropped"), nullptr);
  EXPECT_EQ(find(result, "scales-dropped")->severity, Severity::critical);
  EXPECT_EQ(find(result, "scales-dropped")->basis, "engine");
  const Finding* unit = find(result, "fp8-unit-scale");
  ASSERT_NE(unit, nullptr);
  EXPECT_EQ(unit->basis, "bounded");
  EXPECT_EQ(unit->severity, Severity::info) << unit->judged_on;
  // Permissive: the drop is a warning, start-up failures stay critical.
  const CheckResult permissive =
      check_model(model, "sglang", "auto", "0.5.19", KvPolicy::permissive);
  EXPECT_EQ(find(permissive, "scales-dropped")->severity, Severity::warning);
}

// Lossless: a quantized cache is critical even with every scale loaded as shipped.
TEST(Policy, LosslessFailsEveryQuantizedCache) {
  const checkpoint::ModelFacts model =
      checkpoint::read_checkpoint(testing::fixture_checkpoint("llama-modelopt-bf16-scales"));
  const CheckResult evidence = check_model(model, "vllm", "fp8", "0.22.0");
  EXPECT_FALSE(fails_gate(evidence.findings, FailOn::critical));
  const CheckResult lossless = check_model(model, "vllm", "fp8", "0.22.0", KvPolicy::lossless);
  ASSERT_NE(find(lossless, "kv-cache-quantized"), nullptr);
  EXPECT_TRUE(fails_gate(lossless.findings, FailOn::critical));
  EXPECT_EQ(find(check_model(model, "vllm", "bfloat16", "0.22.0", KvPolicy::lossless),
                 "kv-cache-quantized"),
            nullptr);
}

TEST(Policy, NamesRoundTrip) {
  for (KvPolicy policy : {KvPolicy::lossless, KvPolicy::evidence, KvPolicy::permissive})
    EXPECT_EQ(parse_kv_policy(kv_policy_name(policy)), policy);
  EXPECT_FALSE(parse_kv_policy("strict"));
}

// The shipped table loads; a row whose call contradicts the threshold, or a call with
// nothing behind it, is refused with the file and key.
TEST(Published, TableIsLinted) {
  EXPECT_GE(published().measurements.size(), 20u);
  EXPECT_DOUBLE_EQ(published().recovery_threshold, 0.95);
  nlohmann::json doc = read_json_file(data_dir() / "evidence" / "kv_damage.json");
  const fs::path bad = fs::temp_directory_path() / ("kvaudit-damage-" + std::to_string(::getpid()));
  auto refused = [&](const nlohmann::json& d, const std::string& needle) {
    std::ofstream(bad) << d.dump();
    try {
      load_published_evidence(bad, kvaudit::testing::registry().dtypes());
    } catch (const InputError& error) {
      return std::string(error.what()).find(needle) != std::string::npos;
    }
    return false;
  };
  nlohmann::json contradicts = doc;
  contradicts["measurements"][0]["recovery"] = 0.5;
  EXPECT_TRUE(refused(contradicts, "below the threshold"));
  nlohmann::json unsupported = doc;
  unsupported["measurements"][0].erase("recovery");
  EXPECT_TRUE(refused(unsupported, "damage_basis"));
  nlohmann::json unknown_dtype = doc;
  unknown_dtype["measurements"][0]["kv_dtype"] = "fp7";
  EXPECT_TRUE(refused(unknown_dtype, "kv_dtype"));
  fs::remove(bad);
}

}  // namespace
}  // namespace evidence_test
}  // namespace kvaudit::audit
