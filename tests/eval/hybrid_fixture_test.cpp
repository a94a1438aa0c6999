// End to end on the trained Qwen3.5-pattern hybrid (tests/fixtures/model/qwen35-pystd, made
// by tools/train_hybrid_fixture.py): three Gated DeltaNet layers then gated full attention,
// trained on the same stdlib text with a seeded recall circuit whose first half is a Gated
// DeltaNet head. Its held-out loss as PyTorch measured it, recall above the control, and
// both precision axes: the KV cache (only the attention layer has one) and the recurrent
// state.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "eval/eval.h"
#include "util/util.h"

namespace kvaudit::eval {
namespace {

ThreadPool& hybrid_pool() {
  static ThreadPool pool(2);
  return pool;
}

namespace fs = std::filesystem;

fs::path hybrid_fixture_dir() {
  return fs::path(KVAUDIT_TEST_DIR) / "fixtures" / "model" / "qwen35-pystd";
}

struct HybridFixtureData {
  std::unique_ptr<model::Model> model = model::Model::load(hybrid_fixture_dir());
  tokenizer::Tokenizer tokenizer = tokenizer::Tokenizer::load(hybrid_fixture_dir());
  nlohmann::json training =
      nlohmann::json::parse(read_text_file(hybrid_fixture_dir() / "training.json"));
  std::vector<int32_t> heldout =
      tokenizer.encode(read_text_file(hybrid_fixture_dir() / "heldout.txt"));
};

HybridFixtureData& hybrid() {
  static HybridFixtureData f;
  return f;
}

TEST(HybridFixture, IsAQwen35Hybrid) {
  const model::ModelConfig& c = hybrid().model->config();
  EXPECT_EQ(c.family, model::Family::qwen3_5);
  EXPECT_TRUE(c.hybrid());
  EXPECT_EQ(c.attention_layers(), 1);
  EXPECT_EQ(c.mixers[3], model::Mixer::attention);
}

TEST(HybridFixture, HeldOutLossMatchesPyTorch) {
  const auto& held = hybrid().training["heldout"];
  PerplexityOptions options;
  options.kv_formats = {"f32"};
  options.ctx_tokens = held["seq_len"].get<int64_t>();
  options.max_chunks = held["chunks"].get<int64_t>();
  options.first_scored = 0;
  PerplexityResult result =
      run_perplexity(*hybrid().model, hybrid().heldout, options, hybrid_pool());
  EXPECT_NEAR(std::log(result.formats[0].summary.ppl_base), held["mean_nll_nats"].get<double>(),
              2e-3);
  const double vocab = static_cast<double>(hybrid().model->config().vocab_size);
  EXPECT_LT(result.formats[0].summary.ppl_base, vocab / 10.0);
}

TEST(HybridFixture, RecallAboveControl) {
  RecallOptions options;
  options.kv_formats = {"bf16"};
  options.ctx_tokens = {256};
  options.depth_tokens = {16, 48};
  options.cases_per_cell = 6;
  RecallResult result = run_recall(*hybrid().model, hybrid().tokenizer, options, hybrid_pool());
  ASSERT_EQ(result.formats[0].cells.size(), 2u);
  for (const RecallCell& cell : result.formats[0].cells)
    EXPECT_GT(cell.mean_logprob_per_token, cell.control_logprob_per_token + 1.0)
        << "depth " << cell.depth_tokens;
}

// Both axes in one run, as `kvaudit eval --kv ... --state-dtype ...` reports them. The state
// is stored after every token (as decode does): BF16 must damage more than FP32 (which is
// the baseline itself) and less than INT8.
TEST(HybridFixture, StatePrecisionOrdersTheDamage) {
  PerplexityOptions options;
  options.kv_formats = {"bf16", "fp8_e4m3:none", "fp8_e4m3:tensor"};
  options.state_formats = {"fp32", "bf16", "int8"};
  options.ctx_tokens = 256;
  options.max_chunks = 6;
  PerplexityResult result =
      run_perplexity(*hybrid().model, hybrid().heldout, options, hybrid_pool());
  ASSERT_EQ(result.formats.size(), 9u);
  EXPECT_TRUE(result.state_axis);
  for (const FormatResult& f : result.formats)
    std::printf("%-36s PPL ratio %.6f  mean KLD %.3e  same top %.2f%%  state %lld B\n",
                f.label().c_str(), f.summary.ppl_ratio, f.summary.kld_mean,
                100.0 * f.summary.same_top, static_cast<long long>(f.state_bytes));
  auto kld = [&](size_t kv, size_t state) {
    return result.formats[kv * 3 + state].summary.kld_mean;
  };
  EXPECT_EQ(result.formats[0].label(), "bf16, fp32 state");
  EXPECT_EQ(kld(0, 0), 0.0);  // the baseline against itself
  EXPECT_GT(kld(0, 1), 0.0);
  EXPECT_GT(kld(0, 2), kld(0, 1));
  // INT8 stores a byte per element plus a scale per row: a quarter of FP32's bytes and more.
  EXPECT_LT(result.formats[2].state_bytes, result.formats[0].state_bytes / 2);
  // The KV axis still acts on the attention layer: scale 1.0 on its small V loses precision.
  EXPECT_GT(kld(1, 0), kld(2, 0));
}

}  // namespace
}  // namespace kvaudit::eval
