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

#include "common/trained_fixture.h"
#include "eval/eval.h"
#include "util/util.h"

namespace kvaudit::eval {
namespace {

ThreadPool& hybrid_pool() {
  return kvaudit::testing::fixture_thread_pool();
}

kvaudit::testing::TrainedFixture& hybrid() {
  return kvaudit::testing::trained_fixture("qwen35-pystd");
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

// Recall on the same grid for every KV format x state precision: the variants in KV-major
// order, each labelled, the control on the baseline only. Recall's teacher-forced log-prob
// moves with the state precision (INT8 most), but by far less than the gap to the control:
// the recall circuit's copy step sits in the attention layer, whose KV these leave alone.
TEST(HybridFixture, RecallRunsOnTheStateAxis) {
  RecallOptions options;
  options.kv_formats = {"bf16", "fp8_e4m3:tensor"};
  options.state_formats = {"fp32", "bf16", "int8"};
  options.ctx_tokens = {256};
  options.depth_tokens = {16, 48};
  options.cases_per_cell = 6;
  RecallResult result = run_recall(*hybrid().model, hybrid().tokenizer, options, hybrid_pool());
  ASSERT_EQ(result.formats.size(), 6u);
  EXPECT_EQ(result.formats[0].label(), "bf16, fp32 state");
  EXPECT_EQ(result.formats[2].label(), "bf16, int8 state");
  EXPECT_EQ(result.formats[3].label(), "fp8_e4m3:tensor, fp32 state");
  const RecallCell& base = result.formats[0].cells[1];
  for (size_t v = 0; v < result.formats.size(); ++v) {
    const RecallCell& cell = result.formats[v].cells[1];
    std::printf("%-34s depth 48: log-prob/token %.6f (control %.4f)\n",
                result.formats[v].label().c_str(), cell.mean_logprob_per_token,
                base.control_logprob_per_token);
    EXPECT_GT(cell.mean_logprob_per_token, base.control_logprob_per_token + 1.0);
    if (v > 0) {
      EXPECT_EQ(result.formats[v].cells[1].control_logprob_per_token, 0.0);
    }
  }
  // The state precision reaches the scores (not silently dropped), INT8 furthest.
  const double fp32 = result.formats[0].cells[1].mean_logprob_per_token;
  const double bf16 = result.formats[1].cells[1].mean_logprob_per_token;
  const double int8 = result.formats[2].cells[1].mean_logprob_per_token;
  EXPECT_NE(bf16, fp32);
  EXPECT_GT(std::fabs(int8 - fp32), std::fabs(bf16 - fp32));
  // A model without recurrent state refuses the state axis.
  auto& dense = kvaudit::testing::trained_fixture("qwen3-pystd");
  EXPECT_THROW(run_recall(*dense.model, dense.tokenizer, options, hybrid_pool()), InputError);
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
