// Checkpoint reader: architecture facts per family, scale tensors and their values,
// and malformed input (each a one-line InputError naming the file).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "checkpoint/checkpoint.h"
#include "common/fixtures.h"
#include "util/util.h"

namespace kvaudit::checkpoint {
namespace {

namespace fs = std::filesystem;
using kvaudit::testing::fixture_checkpoint;

TEST(Reader, Qwen35DemoShapeFromTextConfig) {
  ModelFacts facts = read_checkpoint(fs::path(KVAUDIT_TEST_DIR) / ".." / "examples" /
                                     "qwen3.5-397b-a17b-nvfp4" / "config.json");
  EXPECT_EQ(facts.outer_model_type, "qwen3_5_moe");
  EXPECT_EQ(facts.model_type, "qwen3_5_moe_text");
  EXPECT_TRUE(facts.architecture_known);
  EXPECT_EQ(facts.num_layers, 60);
  EXPECT_EQ(facts.attention_layer_count(), 15);
  EXPECT_EQ(facts.num_kv_heads, 2);
  EXPECT_EQ(facts.head_dim, 256);
  ASSERT_TRUE(facts.linear_attention.has_value());
  EXPECT_EQ(facts.linear_attention->num_value_heads, 64);
  EXPECT_EQ(facts.linear_attention->ssm_dtype, "float32");
  EXPECT_EQ(facts.layers[3].kind, LayerKind::full_attention);
  EXPECT_EQ(facts.layers[0].kind, LayerKind::linear_attention);
  ASSERT_TRUE(facts.quant.has_value());
  EXPECT_EQ(facts.quant->kv_cache_quant_algo, "FP8");
  EXPECT_EQ(facts.quant->weight_algo, "NVFP4");
  EXPECT_FALSE(facts.has_weights);
  EXPECT_EQ(facts.torch_dtype, "bfloat16");
}

TEST(Reader, DeepSeekMla) {
  ModelFacts facts = read_checkpoint(fixture_checkpoint("deepseek-v3-mla"));
  ASSERT_TRUE(facts.mla.has_value());
  EXPECT_EQ(facts.layers.size(), 61u);
  EXPECT_EQ(facts.layers[0].kind, LayerKind::mla);
  EXPECT_EQ(facts.layers[0].k_head_dim, 576);
  EXPECT_EQ(facts.layers[0].kv_heads, 1);
  EXPECT_EQ(facts.kv_scales.size(), 122u);
  EXPECT_FALSE(facts.rope_scaling.is_null());
}

// The real Llama-3.3-Nemotron-Super-49B config (tests/fixtures/configs/SOURCES.md): 80 blocks,
// 31 with no attention (block_configs no_op), the other 49 at 64 / n_heads_in_group 8 = 8 KV
// heads; num_key_value_heads is null.
TEST(Reader, NemotronNasLayersWithoutAttentionHoldNoKv) {
  ModelFacts facts = read_checkpoint(fs::path(KVAUDIT_TEST_DIR) / "fixtures" / "configs" /
                                     "nvidia-llama-3_3-nemotron-super-49b-v1" / "config.json");
  ASSERT_EQ(facts.layers.size(), 80u);
  EXPECT_EQ(facts.attention_layer_count(), 49);
  EXPECT_EQ(facts.num_kv_heads, 8);
  int skipped = 0;
  for (const LayerFacts& layer : facts.layers) {
    if (layer.kind == LayerKind::no_attention) {
      ++skipped;
      EXPECT_EQ(layer.kv_heads, 0);
    } else {
      EXPECT_EQ(layer.kind, LayerKind::full_attention);
      EXPECT_EQ(layer.kv_heads, 8);
      EXPECT_EQ(layer.k_head_dim, 128);
    }
  }
  EXPECT_EQ(skipped, 31);
  EXPECT_TRUE(facts.architecture_known);
}

TEST(Reader, NemotronNasWithoutBlockConfigsIsRefusedNamingTheLayer) {
  const fs::path dir = fs::path(::testing::TempDir()) / "nas-no-blocks";
  fs::create_directories(dir);
  std::ofstream(dir / "config.json")
      << R"({"model_type": "nemotron-nas", "num_hidden_layers": 2, "hidden_size": 64,
            "num_attention_heads": 8, "block_configs": [{"attention": {"n_heads_in_group": 3}}]})";
  try {
    read_checkpoint(dir / "config.json");
    FAIL() << "accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("n_heads_in_group = 3"), std::string::npos) << e.what();
  }
}

TEST(Reader, GptOssSlidingAndSinks) {
  ModelFacts facts = read_checkpoint(fixture_checkpoint("gpt-oss-20b"));
  EXPECT_TRUE(facts.attention_sinks);
  EXPECT_EQ(facts.layers[0].kind, LayerKind::sliding_attention);
  EXPECT_EQ(facts.layers[0].sliding_window, 128);
  EXPECT_EQ(facts.layers[1].kind, LayerKind::full_attention);
  EXPECT_EQ(facts.layers[1].sliding_window, 0);
  EXPECT_TRUE(facts.kv_scales.empty());
}

TEST(Reader, Gemma3PatternUnderTextConfig) {
  ModelFacts facts = read_checkpoint(fixture_checkpoint("gemma3-4b"));
  EXPECT_EQ(facts.model_type, "gemma3_text");
  int full = 0;
  for (const auto& layer : facts.layers) full += layer.kind == LayerKind::full_attention;
  EXPECT_EQ(full, 5);  // layers 5, 11, 17, 23, 29
  EXPECT_EQ(facts.layers[5].kind, LayerKind::full_attention);
  EXPECT_EQ(facts.layers[0].sliding_window, 1024);
}

TEST(Reader, Gemma2Alternates) {
  ModelFacts facts = read_checkpoint(fixture_checkpoint("gemma2-2b"));
  EXPECT_EQ(facts.layers[0].kind, LayerKind::sliding_attention);
  EXPECT_EQ(facts.layers[1].kind, LayerKind::full_attention);
  EXPECT_EQ(facts.torch_dtype, "float32");
}

TEST(Reader, Qwen3NextHybrid) {
  ModelFacts facts = read_checkpoint(fixture_checkpoint("qwen3-next-80b"));
  EXPECT_EQ(facts.attention_layer_count(), 12);
  ASSERT_TRUE(facts.linear_attention.has_value());
  EXPECT_EQ(facts.linear_attention->num_value_heads, 32);
}

TEST(Reader, ScaleValuesAndConventions) {
  ModelFacts facts = read_checkpoint(fixture_checkpoint("llama-ct-fp8-kv"));
  ASSERT_EQ(facts.kv_scales.size(), 8u);
  EXPECT_EQ(facts.kv_scales[0].convention, "ct_attn");
  EXPECT_EQ(facts.kv_scales[0].layer, 0);
  EXPECT_EQ(facts.kv_scales[0].role, ScaleRole::k);
  EXPECT_FLOAT_EQ(facts.kv_scales[0].values.at(0), 0.031f);
  EXPECT_EQ(facts.kv_scales[1].role, ScaleRole::v);
  EXPECT_FLOAT_EQ(facts.kv_scales[1].values.at(0), 0.0021f);
  ASSERT_TRUE(facts.quant.has_value());
  EXPECT_TRUE(facts.quant->has_kv_cache_scheme);
  EXPECT_EQ(facts.quant->kv_scheme_strategy, "tensor");
  EXPECT_EQ(facts.quant->method, "compressed-tensors");
}

TEST(Reader, Bf16ScalesDecodeExactly) {
  ModelFacts facts = read_checkpoint(fixture_checkpoint("llama-modelopt-bf16-scales"));
  ASSERT_EQ(facts.kv_scales.size(), 8u);
  EXPECT_EQ(facts.kv_scales[0].dtype, TensorDType::BF16);
  EXPECT_EQ(facts.kv_scales[0].values.at(0), 0.0625f);
  EXPECT_EQ(facts.kv_scales[1].values.at(0), 0.00390625f);
  EXPECT_EQ(facts.kv_scales[0].convention, "modelopt_proj");
}

TEST(Reader, PerHeadVectorsAndShardedIndex) {
  ModelFacts per_head = read_checkpoint(fixture_checkpoint("llama-ct-fp8-per-head"));
  ASSERT_EQ(per_head.kv_scales.size(), 8u);
  EXPECT_EQ(per_head.kv_scales[0].values.size(), 8u);
  ModelFacts sharded = read_checkpoint(fixture_checkpoint("qwen3-moe-modelopt-fp8"));
  EXPECT_EQ(sharded.shard_files.size(), 2u);
  EXPECT_EQ(sharded.kv_scales.size(), 8u);
  EXPECT_GT(sharded.weight_bytes, 0u);
}

TEST(Reader, NanScaleIsReadNotRejected) {
  ModelFacts facts = read_checkpoint(fixture_checkpoint("llama-modelopt-nan-scales"));
  bool saw_nan = false;
  for (const auto& scale : facts.kv_scales) saw_nan |= std::isnan(scale.values.at(0));
  EXPECT_TRUE(saw_nan);
}

TEST(ScaleNames, Conventions) {
  auto classify = [](const char* name) {
    auto scale = classify_scale_tensor(name);
    return scale ? scale->convention + "/" + std::string(scale_role_name(scale->role)) + "/" +
                       std::to_string(scale->layer)
                 : std::string("none");
  };
  EXPECT_EQ(classify("model.layers.7.self_attn.k_proj.k_scale"), "modelopt_proj/k/7");
  EXPECT_EQ(classify("model.layers.7.self_attn.v_proj.v_scale"), "modelopt_proj/v/7");
  EXPECT_EQ(classify("backbone.layers.3.mixer.k_proj.k_scale"), "modelopt_proj/k/3");
  EXPECT_EQ(classify("model.layers.2.self_attn.k_scale"), "ct_attn/k/2");
  EXPECT_EQ(classify("model.layers.2.self_attn.v_proj.output_scale"), "ct_output_scale/v/2");
  EXPECT_EQ(classify("model.layers.2.self_attn.kv_scale"), "kv_scale/kv/2");
  EXPECT_EQ(classify("transformer.layers.4.attention.kv_cache_scaling_factor"), "ammo/kv/4");
  EXPECT_EQ(classify("model.layers.5.self_attn.qkv_proj.k_scale"), "fused_qkv/k/5");
  EXPECT_EQ(classify("model.layers.5.self_attn.qkqkv_proj.v_scale"), "fused_qkv/v/5");
  EXPECT_EQ(classify("model.layers.5.self_attn.attn.k_scale"), "runtime_attn/k/5");
  EXPECT_EQ(classify("model.layers.5.self_attn.k_proj.weight_scale"), "none");
  EXPECT_EQ(classify("model.layers.5.self_attn.k_proj.input_scale"), "none");
  EXPECT_EQ(classify("model.layers.5.mlp.down_proj.output_scale"), "none");
}

// ---------------------------------------------------------------- malformed input

class Malformed : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("kvaudit-malformed-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    write("config.json",
          R"({"architectures":["LlamaForCausalLM"],"model_type":"llama","hidden_size":64,)"
          R"("num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2})");
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write(const std::string& name, const std::string& content) {
    std::ofstream(dir_ / name, std::ios::binary) << content;
  }
  // A safetensors file: 8-byte little-endian length, header, data bytes.
  void write_safetensors(const std::string& name, const std::string& header, size_t data_bytes,
                         uint64_t claimed_length = 0) {
    uint64_t length = claimed_length ? claimed_length : header.size();
    std::string bytes(8, '\0');
    for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(length >> (8 * i));
    write(name, bytes + header + std::string(data_bytes, '\0'));
  }
  // Expects an InputError that names `file` and mentions `words`, on one line.
  void expect_error(const std::string& file, const std::string& words) {
    try {
      read_checkpoint(dir_);
      FAIL() << "expected an InputError mentioning " << words;
    } catch (const InputError& error) {
      std::string message = error.what();
      EXPECT_NE(message.find(file), std::string::npos) << message;
      EXPECT_NE(message.find(words), std::string::npos) << message;
      EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    }
  }
  fs::path dir_;
};

constexpr const char* kGoodEntry = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";

TEST_F(Malformed, TruncatedFile) {
  write("model.safetensors", "abc");
  expect_error("model.safetensors", "truncated");
}
TEST_F(Malformed, HeaderLengthBeyondFile) {
  write_safetensors("model.safetensors", std::string("{") + kGoodEntry + "}", 8, 4096);
  expect_error("model.safetensors", "runs past the end");
}
TEST_F(Malformed, HeaderLengthAbsurd) {
  write_safetensors("model.safetensors", "{}", 0, 1ull << 40);
  expect_error("model.safetensors", "100 MB");
}
TEST_F(Malformed, InvalidHeaderJson) {
  write_safetensors("model.safetensors", R"({"a":{"dtype":"F32",)", 8);
  expect_error("model.safetensors", "not valid JSON");
}
TEST_F(Malformed, OverlappingSpans) {
  write_safetensors("model.safetensors",
                    R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                    R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                    12);
  expect_error("model.safetensors", "overlap");
}
TEST_F(Malformed, UnknownDtype) {
  write_safetensors("model.safetensors",
                    R"({"a":{"dtype":"F13","shape":[2],"data_offsets":[0,8]}})", 8);
  expect_error("model.safetensors", "unknown dtype 'F13'");
}
TEST_F(Malformed, ShapeDoesNotMatchSpan) {
  write_safetensors("model.safetensors",
                    R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8);
  expect_error("model.safetensors", "needs 12 bytes");
}
TEST_F(Malformed, SpanBeyondData) {
  write_safetensors("model.safetensors",
                    R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8);
  expect_error("model.safetensors", "beyond the data section");
}
TEST_F(Malformed, BackwardsOffsets) {
  write_safetensors("model.safetensors",
                    R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", 8);
  expect_error("model.safetensors", "run backwards");
}
TEST_F(Malformed, ShapeOverflow) {
  write_safetensors(
      "model.safetensors",
      R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,8]}})", 8);
  expect_error("model.safetensors", "overflows");
}
TEST_F(Malformed, MissingShard) {
  write(
      "model.safetensors.index.json",
      R"({"weight_map":{"a":"model-00001-of-00002.safetensors","b":"model-00002-of-00002.safetensors"}})");
  write_safetensors("model-00001-of-00002.safetensors", std::string("{") + kGoodEntry + "}", 8);
  expect_error("model.safetensors.index.json",
               "model-00002-of-00002.safetensors', which is missing");
}
TEST_F(Malformed, IndexEscapesFolder) {
  write("model.safetensors.index.json", R"({"weight_map":{"a":"../../etc/passwd"}})");
  expect_error("model.safetensors.index.json", "outside the checkpoint folder");
}
TEST_F(Malformed, InvalidConfigJson) {
  write("config.json", R"({"model_type": "llama",)");
  expect_error("config.json", "invalid JSON");
}
// A number past a double's range is nlohmann's out_of_range, not a parse_error: it must
// still be a one-line error (found by fuzz_config).
TEST_F(Malformed, ConfigNumberOutOfRange) {
  write("config.json", R"({"model_type": "llama", "hidden_size": 1e99999})");
  expect_error("config.json", "invalid JSON: number overflow");
}
TEST_F(Malformed, ConfigNotObject) {
  write("config.json", "[1,2,3]");
  expect_error("config.json", "expected a JSON object");
}
TEST_F(Malformed, EmptyConfig) {
  write("config.json", "");
  expect_error("config.json", "empty");
}
TEST_F(Malformed, LayerTypesLengthMismatch) {
  write(
      "config.json",
      R"({"model_type":"qwen3_next","num_hidden_layers":4,"hidden_size":64,"num_attention_heads":4,)"
      R"("layer_types":["full_attention"]})");
  expect_error("config.json", "layer_types has 1 entries");
}
TEST_F(Malformed, BadHfQuantConfig) {
  write("hf_quant_config.json", R"({"producer": {"name": "modelopt"}})");
  expect_error("hf_quant_config.json", "no \"quantization\" object");
}
TEST_F(Malformed, ConfigIsADirectory) {
  fs::remove(dir_ / "config.json");
  fs::create_directories(dir_ / "config.json");
  expect_error("config.json", "is a directory");
}
TEST_F(Malformed, EmptyFolder) {
  fs::remove(dir_ / "config.json");
  expect_error(dir_.string(), "folder is empty");
}
TEST_F(Malformed, NoConfig) {
  fs::remove(dir_ / "config.json");
  write("README.md", "hello");
  expect_error(dir_.string(), "no config.json");
}
TEST_F(Malformed, MissingPath) {
  EXPECT_THROW(read_checkpoint(dir_ / "nope"), InputError);
}
TEST_F(Malformed, WrongTypedField) {
  write("config.json", R"({"model_type":"llama","num_hidden_layers":"two"})");
  expect_error("config.json", "num_hidden_layers: expected an integer");
}
TEST_F(Malformed, TrailingGarbageInHeader) {
  write_safetensors("model.safetensors", std::string("{") + kGoodEntry + "} trailing", 8);
  expect_error("model.safetensors", "not valid JSON");
}

// serve stops generation on these (with the tokenizer's own); checkpoint/ is the one reader of
// config.json, so the ids come from here, as a list (Llama 3.2) or a single integer.
TEST(Reader, EosTokenIdsAsAListOrOneInteger) {
  const fs::path configs = fs::path(KVAUDIT_TEST_DIR) / "fixtures" / "configs";
  ModelFacts llama = read_checkpoint(configs / "meta-llama-llama-3.2-1b-instruct" / "config.json");
  EXPECT_EQ(llama.eos_token_ids, (std::vector<int64_t>{128001, 128008, 128009}));
  nlohmann::json config = nlohmann::json::parse(R"({"model_type": "llama",
      "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
      "eos_token_id": 7})");
  ModelFacts one;
  fill_from_config(config, one);
  EXPECT_EQ(one.eos_token_ids, (std::vector<int64_t>{7}));
  config["eos_token_id"] = "7";  // not an id: names no end token
  ModelFacts text;
  fill_from_config(config, text);
  EXPECT_TRUE(text.eos_token_ids.empty());
}

}  // namespace
}  // namespace kvaudit::checkpoint
