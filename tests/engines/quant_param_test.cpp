// engines' reader of SGLang's --quantization-param-path JSON, the one both serve (loading it
// as SGLang does) and calibrate (reading back what it wrote) call.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "engines/engines.h"
#include "util/util.h"

namespace kvaudit::engines {
namespace {

// The layout SGLang's documentation gives for the file (docs/advanced_features/
// quantized_kv_cache.md, "Provided via JSON": outer keys TP ranks, inner keys layers).
TEST(QuantParamFile, TheDocumentedLayoutReadsRankZerosScalesPerLayer) {
  const auto doc = nlohmann::json::parse(R"({
    "kv_cache": {"dtype": "float8_e4m3fn", "scaling_factor": {"0": {"0": 1.0, "1": 1.0}}}})");
  const QuantParamFile file = parse_quant_param_file(doc, "scales.json");
  EXPECT_EQ(file.model_type, "");
  ASSERT_EQ(file.scales_by_rank.size(), 1u);
  EXPECT_EQ(quant_param_layer_scales(file, 0, 2, "scales.json"), (std::vector<float>{1.0f, 1.0f}));
}

// pydantic reads the keys as ints laxly, and so does the reader.
TEST(QuantParamFile, KeysAreIntegersAsPydanticReadsThem) {
  const auto doc = nlohmann::json::parse(R"({"model_type": "llama", "kv_cache": {
    "dtype": "float8_e4m3fn", "scaling_factor": {" 0 ": {"+0": 0.5, " 1": 0.25}, "1": {"0": 2}}}})");
  const QuantParamFile file = parse_quant_param_file(doc, "scales.json");
  EXPECT_EQ(file.model_type, "llama");
  EXPECT_EQ(file.scales_by_rank.at(0).at(1), 0.25f);
  EXPECT_EQ(file.scales_by_rank.at(1).at(0), 2.0f);
}

TEST(QuantParamFile, WhatTheLoaderWouldRefuseIsOneLineNamingTheFile) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"[1.0]", "is not a JSON object"},
      {"{}", "no \"kv_cache\" object"},
      {R"({"kv_cache": null})", "no \"kv_cache\" object"},
      {R"({"kv_cache": {"scaling_factor": {"0": {"0": 1}}}})", "float8_e4m3fn"},
      {R"({"kv_cache": {"dtype": "float8_e5m2", "scaling_factor": {}}})", "float8_e4m3fn"},
      {R"({"kv_cache": {"dtype": "float8_e4m3fn", "scaling_factor": [1.0]}})",
       "no kv_cache.scaling_factor object"},
      {R"({"kv_cache": {"dtype": "float8_e4m3fn", "scaling_factor": {"0": [1.0]}}})",
       "not a TP rank's object"},
      {R"({"kv_cache": {"dtype": "float8_e4m3fn", "scaling_factor": {"x": {}}}})",
       "not a TP rank's object"},
      {R"({"kv_cache": {"dtype": "float8_e4m3fn", "scaling_factor": {"0": {"a": 1}}}})",
       "names layer \"a\", not an integer"},
      {R"({"kv_cache": {"dtype": "float8_e4m3fn", "scaling_factor": {"0": {"0": "abc"}}}})",
       "is not a number"},
      {R"({"kv_cache": {"dtype": "float8_e4m3fn", "scaling_factor": {"0": {"0": null}}}})",
       "is not a number"},
  };
  for (const auto& [text, words] : cases) {
    try {
      parse_quant_param_file(nlohmann::json::parse(text), "/s/scales.json");
      ADD_FAILURE() << "accepted: " << text;
    } catch (const InputError& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find("/s/scales.json"), std::string::npos) << message;
      EXPECT_NE(message.find(words), std::string::npos) << text << " -> " << message;
      EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    }
  }
}

TEST(QuantParamFile, RankScalesNeedEveryLayerAndPositiveFiniteValues) {
  auto file_of = [](const std::string& layers) {
    return parse_quant_param_file(
        nlohmann::json::parse(
            R"({"kv_cache": {"dtype": "float8_e4m3fn", "scaling_factor": {"0": )" + layers + "}}}"),
        "s.json");
  };
  auto refused = [](const QuantParamFile& file, int layers, const std::string& words) {
    try {
      quant_param_layer_scales(file, 0, layers, "s.json");
      ADD_FAILURE() << "accepted, expected: " << words;
    } catch (const InputError& error) {
      EXPECT_NE(std::string(error.what()).find(words), std::string::npos) << error.what();
    }
  };
  refused(file_of(R"({"0": 1, "1": 1})"), 3, "lists 2 layers; the model has 3");
  refused(file_of(R"({"0": 1, "2": 1})"), 2, "no scaling factor for layer 1");
  refused(file_of(R"({"0": 1, "1": 0})"), 2, "layer 1 scaling factor 0 is not positive");
  refused(file_of(R"({"0": 1, "1": -0.5})"), 2, "is not positive and finite");
  // Beyond float's range: an infinity as a float, refused, never an undefined cast.
  refused(file_of(R"({"0": 1, "1": 1e300})"), 2, "is not positive and finite");
  try {
    quant_param_layer_scales(file_of(R"({"0": 1})"), 1, 1, "s.json");
    ADD_FAILURE() << "rank 1 found";
  } catch (const InputError& error) {
    EXPECT_NE(std::string(error.what()).find("no entry for TP rank 1"), std::string::npos);
  }
}

}  // namespace
}  // namespace kvaudit::engines
