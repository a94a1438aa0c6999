// The reference engine against an independent PyTorch forward pass (tools/torch_reference.py,
// float64) on tiny random models of each family: Llama (default RoPE), Llama 3 (llama3 RoPE,
// tied embeddings, BF16), Mistral (sliding window, MQA, F16), Qwen2 (q/k/v bias, YaRN, BF16),
// Qwen3 (QK-norm, head_dim != hidden/heads, linear RoPE, per-layer sliding window) and Qwen3
// with partial rotary. Error is max |ours - reference| / max |reference| over all logits.
#include <gtest/gtest.h>

#include <unistd.h>
#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "model/model.h"
#include "model/torch_reference.h"
#include "util/util.h"

namespace kvaudit::model {
namespace {

namespace fs = std::filesystem;

fs::path tiny_dir(const std::string& name) {
  return fs::path(KVAUDIT_TEST_DIR) / "fixtures" / "model" / "tiny" / name;
}

using test_support::load_reference;
using test_support::Reference;
using test_support::relative_error;

const char* kCases[] = {"llama_f32",  "llama3_bf16", "mistral_f16",
                        "qwen2_bf16", "qwen3_f32",   "qwen3_bf16_partial"};

class ForwardVsTorch : public ::testing::TestWithParam<const char*> {};

TEST_P(ForwardVsTorch, PrefillMatchesWithF32Cache) {
  auto model = Model::load(tiny_dir(GetParam()));
  Reference ref = load_reference(tiny_dir(GetParam()));
  ThreadPool pool(2);
  Session session(*model, numerics::parse_kv_format("f32"), pool);
  std::vector<float> logits;
  session.forward(ref.tokens, 0, logits);
  EXPECT_LT(relative_error(logits, ref.logits), 1e-4) << GetParam();
  EXPECT_EQ(session.position(), static_cast<int64_t>(ref.tokens.size()));
}

TEST_P(ForwardVsTorch, DecodeStepsMatchPrefill) {
  auto model = Model::load(tiny_dir(GetParam()));
  Reference ref = load_reference(tiny_dir(GetParam()));
  const int64_t vocab = model->config().vocab_size;
  ThreadPool pool(2);
  Session session(*model, numerics::parse_kv_format("f32"), pool);
  const size_t prompt = 7;
  std::vector<float> all, step;
  session.forward(std::span(ref.tokens).first(prompt), 0, all);
  for (size_t t = prompt; t < ref.tokens.size(); ++t) {
    session.decode(ref.tokens[t], step);
    ASSERT_EQ(step.size(), static_cast<size_t>(vocab));
    all.insert(all.end(), step.begin(), step.end());
  }
  EXPECT_LT(relative_error(all, ref.logits), 1e-4) << GetParam();
}

TEST_P(ForwardVsTorch, Bf16CacheWithinOnePercent) {
  auto model = Model::load(tiny_dir(GetParam()));
  Reference ref = load_reference(tiny_dir(GetParam()));
  ThreadPool pool(2);
  Session session(*model, numerics::parse_kv_format("bf16"), pool);
  std::vector<float> logits;
  session.forward(ref.tokens, 0, logits);
  double error = relative_error(logits, ref.logits);
  EXPECT_LT(error, 1e-2) << GetParam();
  EXPECT_GT(error, 0.0) << "a BF16 cache that changes nothing is not storing BF16";
}

INSTANTIATE_TEST_SUITE_P(Families, ForwardVsTorch, ::testing::ValuesIn(kCases));

TEST(Session, ResultsIndependentOfThreadsAndBatching) {
  auto model = Model::load(tiny_dir("qwen3_f32"));
  Reference ref = load_reference(tiny_dir("qwen3_f32"));
  ThreadPool one(1), two(2);
  Session a(*model, numerics::parse_kv_format("bf16"), one);
  Session b(*model, numerics::parse_kv_format("bf16"), two);
  b.max_batch_tokens = 5;  // several batches, crossing the sliding window
  std::vector<float> la, lb;
  a.forward(ref.tokens, 3, la);
  b.forward(ref.tokens, 3, lb);
  ASSERT_EQ(la.size(), (ref.tokens.size() - 3) * model->config().vocab_size);
  EXPECT_EQ(la, lb);  // bit-identical
}

TEST(Session, KvBytesFollowTheFormat) {
  auto model = Model::load(tiny_dir("llama_f32"));
  const auto& c = model->config();
  ThreadPool pool(1);
  Session bf16(*model, numerics::parse_kv_format("bf16"), pool);
  Session fp8(*model, numerics::parse_kv_format("fp8_e4m3:none"), pool);
  std::vector<int32_t> tokens(10, 3);
  std::vector<float> logits;
  bf16.forward(tokens, 10, logits);
  fp8.forward(tokens, 10, logits);
  EXPECT_TRUE(logits.empty());
  const int64_t elements = 10LL * c.num_layers * 2 * c.num_kv_heads * c.head_dim;
  EXPECT_EQ(bf16.kv_bytes(), elements * 2);
  EXPECT_EQ(fp8.kv_bytes(), elements);
  bf16.truncate(4);
  EXPECT_EQ(bf16.position(), 4);
  EXPECT_EQ(bf16.kv_bytes(), elements * 2 * 4 / 10);
}

TEST(Session, TruncateThenReplayGivesSameLogits) {
  auto model = Model::load(tiny_dir("mistral_f16"));
  Reference ref = load_reference(tiny_dir("mistral_f16"));
  ThreadPool pool(2);
  Session session(*model, numerics::parse_kv_format("fp8_e4m3:none"), pool);
  std::vector<float> first, second;
  session.forward(ref.tokens, 12, first);
  session.truncate(12);
  session.forward(std::span(ref.tokens).subspan(12), 0, second);
  EXPECT_EQ(first, second);
}

TEST(Session, RejectsTokensOutsideVocabulary) {
  auto model = Model::load(tiny_dir("llama_f32"));
  ThreadPool pool(1);
  Session session(*model, numerics::parse_kv_format("bf16"), pool);
  std::vector<float> logits;
  std::vector<int32_t> bad = {1, 256};
  EXPECT_THROW(session.forward(bad, 0, logits), InputError);
  std::vector<int32_t> negative = {-1};
  EXPECT_THROW(session.forward(negative, 0, logits), InputError);
  EXPECT_EQ(session.position(), 0);
}

TEST(Session, CapturesKAfterRopeAndNormAndV) {
  auto model = Model::load(tiny_dir("qwen3_f32"));
  Reference ref = load_reference(tiny_dir("qwen3_f32"));
  const auto& c = model->config();
  ThreadPool pool(2);
  Session session(*model, numerics::parse_kv_format("f32"), pool);
  session.capture_amax(true);
  std::vector<float> logits;
  session.forward(ref.tokens, static_cast<int64_t>(ref.tokens.size()), logits);
  ASSERT_EQ(session.amax().size(), static_cast<size_t>(c.num_layers));
  const KvLayerAmax& stats = session.amax()[0];
  EXPECT_EQ(stats.tokens, static_cast<int64_t>(ref.tokens.size()));
  ASSERT_EQ(stats.k_channel_amax.size(), static_cast<size_t>(c.num_kv_heads * c.head_dim));
  ASSERT_EQ(stats.v_rotated_amax.size(), stats.k_channel_amax.size());
  for (float a : stats.k_channel_amax) EXPECT_GT(a, 0.0f);

  auto tensor = static_amax_for(numerics::parse_kv_format("fp8_e4m3:tensor"), stats,
                                numerics::KvRole::key, c.num_kv_heads);
  ASSERT_EQ(tensor.amax.size(), 1u);
  EXPECT_EQ(tensor.amax[0],
            *std::max_element(stats.k_channel_amax.begin(), stats.k_channel_amax.end()));
  auto head = static_amax_for(numerics::parse_kv_format("fp8_e4m3:head"), stats,
                              numerics::KvRole::value, c.num_kv_heads);
  EXPECT_EQ(head.amax.size(), static_cast<size_t>(c.num_kv_heads));
  auto dynamic = static_amax_for(numerics::parse_kv_format("int8:token"), stats,
                                 numerics::KvRole::value, c.num_kv_heads);
  EXPECT_TRUE(dynamic.amax.empty());

  // Static per-tensor FP8 scales built from the captured maxima keep logits close.
  std::vector<std::array<numerics::StaticAmax, 2>> calibration;
  for (int l = 0; l < c.num_layers; ++l) {
    auto format = numerics::parse_kv_format("fp8_e4m3:tensor");
    calibration.push_back(
        {static_amax_for(format, session.amax()[l], numerics::KvRole::key, c.num_kv_heads),
         static_amax_for(format, session.amax()[l], numerics::KvRole::value, c.num_kv_heads)});
  }
  Session calibrated(*model, numerics::parse_kv_format("fp8_e4m3:tensor"), pool, calibration);
  std::vector<float> with_scales;
  calibrated.forward(ref.tokens, 0, with_scales);
  EXPECT_LT(relative_error(with_scales, ref.logits), 0.05);
}

// With an index, the engine maps the shards it names, as the engines do: a scales-only file
// that calibrate writes beside the shards (here: not even a valid safetensors file) is not
// read, and one the index names but the folder lacks is a one-line error.
TEST(Load, ReadsTheShardsTheIndexNamesOnly) {
  const fs::path dir =
      fs::temp_directory_path() / ("kvaudit-indexed-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const char* file : {"config.json", "model.safetensors"})
    fs::copy_file(tiny_dir("llama_f32") / file, dir / file);
  nlohmann::json index = {{"metadata", nlohmann::json::object()},
                          {"weight_map", nlohmann::json::object()}};
  for (const auto& tensor : checkpoint::read_safetensors_header(dir / "model.safetensors").tensors)
    index["weight_map"][tensor.name] = "model.safetensors";
  write_file_atomically(dir / "model.safetensors.index.json", index.dump());
  write_file_atomically(dir / "kv_scales.safetensors", "not a safetensors file");
  auto model = Model::load(dir);
  EXPECT_EQ(model->config().num_layers, Model::load(tiny_dir("llama_f32"))->config().num_layers);
  index["weight_map"]["lm_head.weight"] = "model-00002-of-00002.safetensors";
  write_file_atomically(dir / "model.safetensors.index.json", index.dump());
  EXPECT_THROW(Model::load(dir), InputError);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kvaudit::model
