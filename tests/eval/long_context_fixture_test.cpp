// End to end on the long-context fixture model (tests/fixtures/model/qwen3-recall, made by
// tools/make_recall_model.py): a small Qwen3 whose copy circuit matches the last ~16 tokens
// at any distance up to 8K. In 16 bits it must answer kvaudit's recall, MRCR and tool-call
// probes at 4K tokens (>= 90%, far above the control), so a KV format that damages
// long-range retrieval shows as a drop instead of hiding under a floor of zeros.
#include <gtest/gtest.h>

#include <cmath>

#include <nlohmann/json.hpp>

#include "common/trained_fixture.h"
#include "eval/eval.h"
#include "util/util.h"

namespace kvaudit::eval {
namespace {

kvaudit::testing::TrainedFixture& long_context_fixture() {
  return kvaudit::testing::trained_fixture("qwen3-recall");
}

TEST(Fixture, LongContextModelSharesThePystdTokenizer) {
  auto& recall_model = long_context_fixture();
  auto& pystd = kvaudit::testing::trained_fixture("qwen3-pystd");
  const std::string sample = "def fetch_node_table(rows, limit):\n    return rows[:limit]\n";
  EXPECT_EQ(recall_model.tokenizer.encode(sample), pystd.tokenizer.encode(sample));
  EXPECT_EQ(static_cast<int64_t>(recall_model.tokenizer.vocab_size()),
            recall_model.model->config().vocab_size);
  EXPECT_GE(recall_model.model->config().max_position_embeddings, 8192);
}

// The generator scored the held-out text with its own PyTorch forward pass (positions
// 256..511 of 512-token chunks, as `eval --text --ctx 512` scores them); ours must agree.
TEST(Fixture, LongContextModelHeldOutLossMatchesPyTorch) {
  const auto& held = long_context_fixture().training["heldout_512_second_half"];
  PerplexityOptions options;
  options.kv_formats = {"f32"};
  options.ctx_tokens = 512;
  PerplexityResult result =
      run_perplexity(*long_context_fixture().model, long_context_fixture().heldout, options,
                     kvaudit::testing::fixture_thread_pool());
  const double nll = std::log(result.formats[0].summary.ppl_base);
  EXPECT_NEAR(nll, held["mean_nll_nats"].get<double>(), 5e-3);
  // A language model, if a weak one: far below the uniform 2048-token guess (7.6 nats).
  EXPECT_LT(nll, 6.0);
}

TEST(Fixture, LongContextModelRecallsAt4KFarAboveControl) {
  RecallOptions options;
  options.kv_formats = {"bf16"};
  options.ctx_tokens = {4096};
  options.depth_tokens = {3000};
  options.cases_per_cell = 4;
  RecallResult result = run_recall(*long_context_fixture().model, long_context_fixture().tokenizer,
                                   options, kvaudit::testing::fixture_thread_pool());
  ASSERT_EQ(result.formats[0].cells.size(), 1u);
  for (const RecallCell& cell : result.formats[0].cells) {
    EXPECT_GE(cell.exact_match, 0.9) << "depth " << cell.depth_tokens;
    EXPECT_LE(cell.control_exact_match, 0.25) << "depth " << cell.depth_tokens;
    EXPECT_GT(cell.mean_logprob_per_token, cell.control_logprob_per_token + 3.0);
  }
}

// MRCR's answers end in ")" where the text goes on with ")\n": the round counts as exact
// when the model's argmax writes ")" (what greedy decoding would produce). bf16 must answer
// >= 90% of the rounds at 4K, and FP8 without scales must lose rounds and log-probability on
// both tasks: the cells measure KV damage instead of sitting at a floor or a ceiling.
TEST(Fixture, LongContextModelAnswersMrcrAndToolCallsAt4K) {
  TaskOptions options;
  options.kv_formats = {"bf16", "fp8_e4m3:none"};
  options.ctx_tokens = {4096};
  options.cases_per_cell = 4;
  TaskResult result = run_tasks(*long_context_fixture().model, long_context_fixture().tokenizer,
                                options, kvaudit::testing::fixture_thread_pool());
  ASSERT_EQ(result.formats.size(), 2u);
  ASSERT_EQ(result.formats[0].cells.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const TaskCell& reference = result.formats[0].cells[i];
    const TaskCell& fp8 = result.formats[1].cells[i];
    EXPECT_EQ(reference.rounds, 12) << reference.kind;
    EXPECT_GE(reference.accuracy, 0.9) << reference.kind;
    EXPECT_LT(fp8.accuracy, reference.accuracy) << fp8.kind;
    EXPECT_LT(fp8.mean_logprob_per_token, reference.mean_logprob_per_token) << fp8.kind;
  }
}

}  // namespace
}  // namespace kvaudit::eval
