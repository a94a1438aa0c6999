// config.json parsing and the rotary frequencies of each rope_scaling type, checked against
// values worked out by hand from the published formulas.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "checkpoint/checkpoint.h"
#include "model/model.h"
#include "util/util.h"

namespace kvaudit::model {
namespace {

nlohmann::json base_config() {
  return nlohmann::json::parse(R"({
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
    "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
    "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936,
    "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
    "sliding_window": 32768, "max_window_layers": 21, "use_sliding_window": false,
    "tie_word_embeddings": true, "hidden_act": "silu"})");
}

TEST(Config, Qwen2Shape) {
  ModelConfig c = parse_model_config(base_config(), "config.json");
  EXPECT_EQ(c.family, Family::qwen2);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_TRUE(c.attention_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.rope.rotary_dim, 64);
  for (int w : c.sliding_window) EXPECT_EQ(w, 0);  // use_sliding_window false
}

TEST(Config, Qwen2SlidingWindowFromMaxWindowLayers) {
  auto json = base_config();
  json["use_sliding_window"] = true;
  ModelConfig c = parse_model_config(json, "config.json");
  EXPECT_EQ(c.sliding_window[20], 0);
  EXPECT_EQ(c.sliding_window[21], 32768);
  EXPECT_EQ(c.sliding_window[23], 32768);
}

TEST(Config, LayerTypesWin) {
  auto json = base_config();
  json["layer_types"] = nlohmann::json::array();
  for (int i = 0; i < 24; ++i)
    json["layer_types"].push_back(i % 2 ? "sliding_attention" : "full_attention");
  json["sliding_window"] = 128;
  ModelConfig c = parse_model_config(json, "config.json");
  EXPECT_EQ(c.sliding_window[0], 0);
  EXPECT_EQ(c.sliding_window[1], 128);
}

// One reader: the audit's layer facts and the engine's windows come from the same reading,
// so the cases the two used to disagree on (Qwen3's use_sliding_window, a missing
// max_window_layers) give the same layers in both.
std::vector<int> audit_windows(const nlohmann::json& json) {
  checkpoint::ModelFacts facts;
  checkpoint::fill_from_config(json, facts);
  std::vector<int> out;
  for (const auto& layer : facts.layers)
    out.push_back(layer.kind == checkpoint::LayerKind::sliding_attention ? layer.sliding_window
                                                                         : 0);
  return out;
}

TEST(Config, Qwen3SlidingWindowFollowsTransformersDefaults) {
  auto json = base_config();
  json["architectures"] = {"Qwen3ForCausalLM"};
  json["model_type"] = "qwen3";
  json["num_hidden_layers"] = 36;
  json["use_sliding_window"] = true;
  json.erase("max_window_layers");  // transformers' Qwen3Config default: 28
  json.erase("sliding_window");     // default 4096
  ModelConfig c = parse_model_config(json, "config.json");
  for (int i = 0; i < 36; ++i) EXPECT_EQ(c.sliding_window[i], i >= 28 ? 4096 : 0) << i;
  EXPECT_EQ(c.sliding_window, audit_windows(json));
  json["use_sliding_window"] = false;
  c = parse_model_config(json, "config.json");
  for (int w : c.sliding_window) EXPECT_EQ(w, 0);
  EXPECT_EQ(c.sliding_window, audit_windows(json));
}

TEST(Config, EngineAndAuditSeeTheSameLayersOnEveryFixtureModel) {
  const auto models = std::filesystem::path(KVAUDIT_TEST_DIR) / "fixtures" / "model";
  int seen = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(models)) {
    if (entry.path().filename() != "config.json") continue;
    const auto json = nlohmann::json::parse(read_text_file(entry.path()));
    EXPECT_EQ(parse_model_config(json, "config.json").sliding_window, audit_windows(json))
        << entry.path();
    ++seen;
  }
  EXPECT_GE(seen, 7);  // qwen3-pystd and the six tiny families
  for (bool use : {false, true}) {
    auto json = base_config();
    json["use_sliding_window"] = use;
    EXPECT_EQ(parse_model_config(json, "config.json").sliding_window, audit_windows(json));
  }
}

TEST(Config, RopeThetaInsideRopeParameters) {
  auto json = base_config();
  json.erase("rope_theta");
  json["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 5000000.0}};
  EXPECT_DOUBLE_EQ(parse_model_config(json, "config.json").rope.theta, 5000000.0);
}

TEST(Config, RejectsWhatItCannotRun) {
  auto json = base_config();
  json["architectures"] = {"DeepseekV3ForCausalLM"};
  json["model_type"] = "deepseek_v3";
  EXPECT_THROW(parse_model_config(json, "config.json"), InputError);
  json = base_config();
  json["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 2.0}};
  EXPECT_THROW(parse_model_config(json, "config.json"), InputError);
  json = base_config();
  json["num_key_value_heads"] = 3;
  EXPECT_THROW(parse_model_config(json, "config.json"), InputError);
  json = base_config();
  json.erase("hidden_size");
  EXPECT_THROW(parse_model_config(json, "config.json"), InputError);
  EXPECT_THROW(parse_model_config(nlohmann::json::array(), "config.json"), InputError);
}

TEST(Rope, DefaultAndLinear) {
  RopeConfig rope;
  rope.theta = 10000.0;
  rope.rotary_dim = 8;
  auto inv = rope_inverse_frequencies(rope);
  ASSERT_EQ(inv.size(), 4u);
  EXPECT_DOUBLE_EQ(inv[0], 1.0);
  EXPECT_NEAR(inv[1], 0.1, 1e-15);  // 10000^(-2/8)
  EXPECT_NEAR(inv[3], 1e-3, 1e-15);
  rope.type = RopeType::linear;
  rope.factor = 4.0;
  EXPECT_NEAR(rope_inverse_frequencies(rope)[1], 0.025, 1e-15);
}

TEST(Rope, Llama3Bands) {
  // Llama 3.1 values: factor 8, low 1, high 4, original context 8192, theta 500000, dim 128.
  RopeConfig rope{RopeType::llama3, 500000.0, 128, 8.0, 1.0, 4.0, 8192};
  auto inv = rope_inverse_frequencies(rope);
  auto plain = [](int i) { return 1.0 / std::pow(500000.0, 2.0 * i / 128.0); };
  // Short wavelengths (< 8192/4 = 2048 positions) are untouched.
  EXPECT_DOUBLE_EQ(inv[0], plain(0));
  EXPECT_DOUBLE_EQ(inv[20], plain(20));  // wavelength 2*pi/plain(20) ~ 1.0e3
  // Long wavelengths (> 8192) are divided by the factor.
  EXPECT_DOUBLE_EQ(inv[63], plain(63) / 8.0);
  // In between: blended with smooth = (8192 / wavelength - 1) / 3.
  for (int i = 0; i < 64; ++i) {
    double wavelen = 2 * std::numbers::pi / plain(i);
    if (wavelen >= 2048 && wavelen <= 8192) {
      double smooth = (8192 / wavelen - 1.0) / 3.0;
      EXPECT_NEAR(inv[i], (1 - smooth) * plain(i) / 8.0 + smooth * plain(i), 1e-18);
    }
  }
}

TEST(Rope, YarnRampAndTemperature) {
  auto json = base_config();
  json["rope_scaling"] = {
      {"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}};
  ModelConfig c = parse_model_config(json, "config.json");
  EXPECT_EQ(c.rope.type, RopeType::yarn);
  EXPECT_NEAR(c.rope.attention_factor, 0.1 * std::log(4.0) + 1.0, 1e-12);
  auto inv = rope_inverse_frequencies(c.rope);
  auto plain = [](int i) { return 1.0 / std::pow(1e6, 2.0 * i / 64.0); };
  // Fastest dimensions (many rotations in 32K tokens) extrapolate: unchanged.
  EXPECT_DOUBLE_EQ(inv[0], plain(0));
  // Slowest dimension interpolates: divided by the factor.
  EXPECT_NEAR(inv[31], plain(31) / 4.0, 1e-18);
  for (int i = 1; i < 32; ++i) EXPECT_LE(inv[i], inv[i - 1]);
}

TEST(Rope, PartialRotary) {
  auto json = base_config();
  json["partial_rotary_factor"] = 0.25;
  ModelConfig c = parse_model_config(json, "config.json");
  EXPECT_EQ(c.rope.rotary_dim, 16);
  EXPECT_EQ(rope_inverse_frequencies(c.rope).size(), 8u);
}

}  // namespace
}  // namespace kvaudit::model
