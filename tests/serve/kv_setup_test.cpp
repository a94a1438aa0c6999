// serve's KV set-up against SGLang's behaviour as engines/ encodes it: auto resolution equals
// what `kvaudit check` predicts, checkpoint scales reach the cache bit for bit with SGLang's
// fallback rules, --quantization-param-path is read as SGLang's loader reads it, and the pool
// arithmetic gives SGLang's token count from the printed memory.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "checkpoint/checkpoint.h"
#include "common/registry.h"
#include "engines/engines.h"
#include "serve_test_util.h"
#include "util/util.h"

namespace kvaudit::serve {
namespace {

using testing::options_for;
using testing::TempModel;

// SGLang's newest wording (load_model_utils.py@00c614b6); serve emulates the newest release.
const char* kWarning =
    "Using FP8 KV cache but no scaling factors provided. Defaulting to scaling factors of 1.0.";

uint32_t bits(float value) {
  uint32_t out;
  std::memcpy(&out, &value, 4);
  return out;
}

bool logged(const KvSetup& kv, const std::string& text) {
  for (const auto& m : kv.load_messages)
    if (m.text == text) return true;
  return false;
}

TEST(ServeKvSetup, AutoOnPlainCheckpointIsModelDtypeLikeCheck) {
  auto facts = checkpoint::read_checkpoint(testing::fixture_model());
  KvSetup kv =
      resolve_kv_setup(kvaudit::testing::registry(), facts, options_for(testing::fixture_model()));
  EXPECT_EQ(kv.kv_cache_dtype, "bf16");
  EXPECT_EQ(kv.format.spec, "bf16");
  EXPECT_EQ(engines::scale_source_name(kv.scale_source), "not_applicable");
  EXPECT_EQ(kv.torch_dtype, "torch.bfloat16");
  EXPECT_TRUE(kv.load_messages.empty());
  EXPECT_EQ(kv.engine_version, kvaudit::testing::engine("sglang").latest_known_version);
}

TEST(ServeKvSetup, AutoWithDeclaredFp8AndNoScalesIsUnitScaleWithSglangWarning) {
  TempModel model;
  model.declare_fp8_kv();
  auto facts = checkpoint::read_checkpoint(model.dir());
  KvSetup kv = resolve_kv_setup(kvaudit::testing::registry(), facts, options_for(model.dir()));
  // What `kvaudit check --engine sglang` predicts for the same checkpoint and flags.
  engines::LaunchFlags flags;
  flags.engine = "sglang";
  auto predicted = engines::resolve_kv(facts, flags, kvaudit::testing::engine("sglang"));
  EXPECT_EQ(predicted.kv_cache_dtype, "fp8_e4m3");
  EXPECT_EQ(kv.kv_cache_dtype, predicted.kv_cache_dtype);
  EXPECT_EQ(kv.scale_source, predicted.scale_source);
  EXPECT_EQ(kv.format.spec, "fp8_e4m3:none+nan");
  EXPECT_TRUE(kv.scales.empty());
  EXPECT_TRUE(logged(kv, kWarning));
  EXPECT_EQ(kv.torch_dtype, "torch.float8_e4m3fn");
}

TEST(ServeKvSetup, ExplicitE5m2LogsNoWarningAndBf16OverridesDeclaredFp8) {
  TempModel model;
  model.declare_fp8_kv();
  auto facts = checkpoint::read_checkpoint(model.dir());
  KvSetup e5m2 =
      resolve_kv_setup(kvaudit::testing::registry(), facts, options_for(model.dir(), "fp8_e5m2"));
  EXPECT_EQ(e5m2.format.spec, "fp8_e5m2:none+nan");
  EXPECT_FALSE(logged(e5m2, kWarning));
  KvSetup bf16 =
      resolve_kv_setup(kvaudit::testing::registry(), facts, options_for(model.dir(), "bfloat16"));
  EXPECT_EQ(bf16.kv_cache_dtype, "bf16");
  EXPECT_EQ(bf16.format.spec, "bf16");
}

TEST(ServeKvSetup, CheckpointScalesReachTheCacheBitForBitWithSglangFallbacks) {
  TempModel model;
  model.declare_fp8_kv();
  const float k0 = 0.0371093750f, v0 = 0.00341796875f, k1 = 0.1234567f;
  model.write_scales({
      {"model.layers.0.self_attn.k_proj.k_scale", {k0}},
      {"model.layers.0.self_attn.v_proj.v_scale", {v0}},
      // layer 1: only k_scale -> SGLang uses it for V as well
      {"model.layers.1.self_attn.k_proj.k_scale", {k1}},
      // layer 2: a non-positive pair counts as missing -> 1.0
      {"model.layers.2.self_attn.k_proj.k_scale", {-1.0f}},
      {"model.layers.2.self_attn.v_proj.v_scale", {0.0f}},
      // layer 3: nothing -> 1.0
  });
  auto facts = checkpoint::read_checkpoint(model.dir());
  ASSERT_EQ(facts.kv_scales.size(), 5u);
  KvSetup kv = resolve_kv_setup(kvaudit::testing::registry(), facts, options_for(model.dir()));
  EXPECT_EQ(engines::scale_source_name(kv.scale_source), "checkpoint");
  EXPECT_EQ(kv.format.spec, "fp8_e4m3:tensor+nan");
  ASSERT_EQ(kv.scales.size(), 4u);
  EXPECT_EQ(bits(kv.scales[0][0].scales.at(0)), bits(k0));
  EXPECT_EQ(bits(kv.scales[0][1].scales.at(0)), bits(v0));
  EXPECT_EQ(bits(kv.scales[1][0].scales.at(0)), bits(k1));
  EXPECT_EQ(bits(kv.scales[1][1].scales.at(0)), bits(k1));
  EXPECT_EQ(kv.scales[2][0].scales.at(0), 1.0f);
  EXPECT_EQ(kv.scales[2][1].scales.at(0), 1.0f);
  EXPECT_EQ(kv.scales[3][0].scales.at(0), 1.0f);
  for (const auto& layer : kv.scales) EXPECT_TRUE(layer[0].amax.empty());
  // The numerics codec uses exactly these scales.
  numerics::KvLayout layout{2, 32};
  EXPECT_EQ(bits(numerics::static_scales(kv.format, layout, kv.scales[0][1]).at(0)), bits(v0));
  // SGLang still logs its warning: it only looks at --quantization-param-path (#31224).
  EXPECT_TRUE(logged(kv, kWarning));
}

TEST(ServeKvSetup, PerHeadScalesAreRefusedLikeSglangButServedAsAnExtension) {
  TempModel model;
  model.declare_fp8_kv();
  std::map<std::string, std::vector<float>> scales;
  for (int layer = 0; layer < 4; ++layer) {
    scales["model.layers." + std::to_string(layer) + ".self_attn.k_proj.k_scale"] = {0.5f, 0.25f};
    scales["model.layers." + std::to_string(layer) + ".self_attn.v_proj.v_scale"] = {0.125f,
                                                                                     0.0625f};
  }
  model.write_scales(scales);
  auto facts = checkpoint::read_checkpoint(model.dir());
  try {
    resolve_kv_setup(kvaudit::testing::registry(), facts, options_for(model.dir()));
    FAIL() << "per-head scales under an SGLang dtype must be refused";
  } catch (const InputError& error) {
    EXPECT_NE(std::string(error.what()).find("Only support per-tensor scaling factor"),
              std::string::npos);
  }
  KvSetup kv = resolve_kv_setup(kvaudit::testing::registry(), facts,
                                options_for(model.dir(), "fp8_e4m3:head"));
  EXPECT_FALSE(kv.sglang_spelling);
  EXPECT_EQ(engines::scale_source_name(kv.scale_source), "checkpoint");
  ASSERT_EQ(kv.scales.size(), 4u);
  EXPECT_EQ(kv.scales[3][0].scales, (std::vector<float>{0.5f, 0.25f}));
  EXPECT_EQ(kv.scales[3][1].scales, (std::vector<float>{0.125f, 0.0625f}));
}

TEST(ServeKvSetup, UnknownDtypeIsAnInputError) {
  auto facts = checkpoint::read_checkpoint(testing::fixture_model());
  EXPECT_THROW(resolve_kv_setup(kvaudit::testing::registry(), facts,
                                options_for(testing::fixture_model(), "fp7")),
               InputError);
  auto options = options_for(testing::fixture_model());
  options.engine_version = "not-a-version";
  EXPECT_THROW(resolve_kv_setup(kvaudit::testing::registry(), facts, options), InputError);
}

TEST(ServeKvSetup, QuantizationParamPathOverridesScalesForE4m3) {
  TempModel model;
  auto path = model.dir() / "kv_scales.json";
  std::ofstream(path) << R"({"model_type": "qwen3", "kv_cache": {"dtype": "float8_e4m3fn",
      "scaling_factor": {"0": {"0": 0.5, "1": 0.25, "2": 2.0, "3": 0.03125}}}})";
  auto facts = checkpoint::read_checkpoint(model.dir());
  auto options = options_for(model.dir(), "fp8_e4m3");
  options.quantization_param_path = path.string();
  KvSetup kv = resolve_kv_setup(kvaudit::testing::registry(), facts, options);
  EXPECT_EQ(engines::scale_source_name(kv.scale_source), "quantization_param_path");
  EXPECT_EQ(kv.k_scales, (std::vector<float>{0.5f, 0.25f, 2.0f, 0.03125f}));
  EXPECT_EQ(kv.v_scales, kv.k_scales);  // one scale per layer for K and V
  EXPECT_EQ(kv.format.spec, "fp8_e4m3:tensor+nan");
  EXPECT_TRUE(logged(kv, "Loaded KV cache scaling factors from " + path.string()));
  EXPECT_FALSE(logged(kv, kWarning));
  // fp8_e5m2: SGLang does not read the file at all.
  options.kv_cache_dtype = "fp8_e5m2";
  KvSetup e5m2 = resolve_kv_setup(kvaudit::testing::registry(), facts, options);
  EXPECT_EQ(e5m2.format.spec, "fp8_e5m2:none+nan");
  EXPECT_TRUE(e5m2.load_messages.empty());
}

TEST(ServeKvSetup, BadQuantizationParamFilesFallBackAsSglangLogsIt) {
  TempModel model;
  const std::string fallback =
      "Defaulting to KV cache scaling factors = 1.0 for all layers in TP rank 0 as an error "
      "occurred during loading.";
  struct Case {
    const char* name;
    const char* content;  // nullptr: file absent
    const char* error;
  };
  const Case cases[] = {
      {"absent", nullptr, "File or directory '{}' not found."},
      {"not-json", "{\"kv_cache\": ", "Error decoding JSON in file '{}'."},
      {"wrong-model-type",
       R"({"model_type": "llama", "kv_cache": {"dtype": "float8_e4m3fn",
           "scaling_factor": {"0": {"0": 1, "1": 1, "2": 1, "3": 1}}}})",
       "An error occurred while reading '{}'."},
      {"missing-layer",
       R"({"model_type": "qwen3", "kv_cache": {"dtype": "float8_e4m3fn",
           "scaling_factor": {"0": {"0": 1, "1": 1, "2": 1}}}})",
       "An error occurred while reading '{}'."},
      {"two-ranks",
       R"({"model_type": "qwen3", "kv_cache": {"dtype": "float8_e4m3fn",
           "scaling_factor": {"0": {"0": 1, "1": 1, "2": 1, "3": 1},
                              "1": {"0": 1, "1": 1, "2": 1, "3": 1}}}})",
       "An error occurred while reading '{}'."},
      {"e5m2-dtype",
       R"({"model_type": "qwen3", "kv_cache": {"dtype": "float8_e5m2",
           "scaling_factor": {"0": {"0": 1, "1": 1, "2": 1, "3": 1}}}})",
       "An error occurred while reading '{}'."},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    auto path = model.dir() / (std::string(c.name) + ".json");
    if (c.content) std::ofstream(path) << c.content;
    std::vector<LogLine> messages;
    auto scales = read_quantization_param_file(path, "qwen3", 4, messages);
    EXPECT_FALSE(scales.has_value());
    ASSERT_EQ(messages.size(), 2u);
    std::string expected = c.error;
    expected.replace(expected.find("{}"), 2, path.string());
    EXPECT_EQ(messages[0].text, expected);
    EXPECT_EQ(messages[0].level, "ERROR");
    EXPECT_EQ(messages[1].text, fallback);
  }
}

TEST(ServeKvSetup, PoolFromBudgetMatchesSglangArithmeticOnTheVirtualDevice) {
  auto facts = checkpoint::read_checkpoint(testing::fixture_model());
  for (const char* dtype : {"bf16", "fp8_e4m3"}) {
    SCOPED_TRACE(dtype);
    auto options = options_for(testing::fixture_model(), dtype);
    KvSetup kv = resolve_kv_setup(kvaudit::testing::registry(), facts, options);
    PoolPlan pool = plan_pool(kv, 4, 2, 32, 2'000'000, 4096, options);
    const int64_t bytes = std::string(dtype) == "bf16" ? 2 : 1;
    // 4 layers x 2 KV heads x 32 x bytes, for K and for V.
    EXPECT_EQ(pool.k_bytes_per_token, 4 * 2 * 32 * bytes);
    EXPECT_EQ(pool.cell_bytes_per_token, 2 * pool.k_bytes_per_token);
    EXPECT_EQ(pool.max_total_num_tokens, (int64_t{64} << 20) / pool.cell_bytes_per_token);
    EXPECT_EQ(pool.context_length, 4096);
    // SGLang: rest = avail_after_weights - total_before_load * (1 - fraction).
    double rest = pool.avail_after_weights_bytes - pool.total_before_load_bytes * (1 - 0.9);
    EXPECT_NEAR(rest, double(int64_t{64} << 20), 1.0);
    EXPECT_EQ(int64_t(std::floor((rest + 0.5) / pool.cell_bytes_per_token)),
              pool.max_total_num_tokens);
  }
  auto options = options_for(testing::fixture_model(), "bf16");
  options.max_total_tokens = 5000;
  options.context_length = 2048;
  KvSetup kv = resolve_kv_setup(kvaudit::testing::registry(), facts, options);
  PoolPlan pool = plan_pool(kv, 4, 2, 32, 0, 4096, options);
  EXPECT_EQ(pool.max_total_num_tokens, 5000);
  EXPECT_EQ(pool.max_req_input_len, 2047);
  options.context_length = 8192;
  EXPECT_THROW(plan_pool(kv, 4, 2, 32, 0, 4096, options), InputError);
}

// A Qwen3.5 hybrid: the recurrent state dtype comes from --mamba-ssm-dtype, else the
// config's mamba_ssm_dtype, and is stored where SGLang stores it (end of each call).
TEST(ServeKvSetup, HybridStateDtypeFromFlagOrConfig) {
  const std::filesystem::path hybrid =
      std::filesystem::path(KVAUDIT_TEST_DIR) / "fixtures" / "model" / "qwen35-pystd";
  auto facts = checkpoint::read_checkpoint(hybrid);
  ServeOptions options = options_for(hybrid);
  KvSetup kv = resolve_kv_setup(kvaudit::testing::registry(), facts, options);
  EXPECT_EQ(kv.state.spec, "fp32");  // config.json: "mamba_ssm_dtype": "float32"
  EXPECT_EQ(kv.state.store_every_tokens, 0);
  options.mamba_ssm_dtype = "bfloat16";
  EXPECT_EQ(resolve_kv_setup(kvaudit::testing::registry(), facts, options).state.dtype,
            model::StateDtype::bf16);
  options.mamba_ssm_dtype = "fp8";
  EXPECT_THROW(resolve_kv_setup(kvaudit::testing::registry(), facts, options), InputError);
  // A model without linear attention has no state to set.
  auto dense = checkpoint::read_checkpoint(testing::fixture_model());
  ServeOptions dense_options = options_for(testing::fixture_model());
  dense_options.mamba_ssm_dtype = "bfloat16";
  EXPECT_THROW(resolve_kv_setup(kvaudit::testing::registry(), dense, dense_options), InputError);
}

}  // namespace
}  // namespace kvaudit::serve
