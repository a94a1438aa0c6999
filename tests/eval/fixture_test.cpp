// End to end on the trained fixture model (tests/fixtures/model/qwen3-pystd, made by
// tools/train_fixture_model.py): its tokenizer, its held-out loss as PyTorch measured it,
// perplexity far below uniform, recall far above the control, and KV formats ordered by
// how much they damage predictions.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "common/trained_fixture.h"
#include "eval/eval.h"
#include "util/util.h"

namespace kvaudit::eval {
namespace {

ThreadPool& test_pool() {
  return kvaudit::testing::fixture_thread_pool();
}

kvaudit::testing::TrainedFixture& fixture() {
  return kvaudit::testing::trained_fixture("qwen3-pystd");
}

TEST(Fixture, TokenizerMatchesTheTrainingScript) {
  const auto& sample = fixture().training["tokenizer_sample"];
  std::vector<int32_t> expected = sample["ids"].get<std::vector<int32_t>>();
  EXPECT_EQ(fixture().tokenizer.encode(sample["text"].get<std::string>()), expected);
  EXPECT_EQ(static_cast<int64_t>(fixture().tokenizer.vocab_size()),
            fixture().model->config().vocab_size);
}

TEST(Fixture, HeldOutLossMatchesPyTorch) {
  const auto& held = fixture().training["heldout"];
  PerplexityOptions options;
  options.kv_formats = {"f32"};
  options.ctx_tokens = held["seq_len"].get<int64_t>();
  options.max_chunks = held["chunks"].get<int64_t>();
  options.first_scored = 0;  // PyTorch scored every position of each chunk
  PerplexityResult result =
      run_perplexity(*fixture().model, fixture().heldout, options, test_pool());
  const double nll = std::log(result.formats[0].summary.ppl_base);
  EXPECT_NEAR(nll, held["mean_nll_nats"].get<double>(), 2e-3);
}

TEST(Fixture, PerplexityFarBelowUniform) {
  PerplexityOptions options;
  options.kv_formats = {"bf16"};
  options.ctx_tokens = 256;
  options.max_chunks = 8;
  PerplexityResult result =
      run_perplexity(*fixture().model, fixture().heldout, options, test_pool());
  const double vocab = static_cast<double>(fixture().model->config().vocab_size);
  EXPECT_LT(result.formats[0].summary.ppl_base, vocab / 10.0);
}

// The fixture starts with a seeded induction circuit (see SEED_CIRCUIT in
// tools/train_fixture_model.py: four attempts to train one from random weights on this CPU
// left recall at the control level), so the probe must find the definition through the KV
// cache of a real forward pass.
TEST(Fixture, RecallFarAboveControl) {
  RecallOptions options;
  options.kv_formats = {"bf16"};
  options.ctx_tokens = {256};
  options.depth_tokens = {16, 48};
  options.cases_per_cell = 6;
  RecallResult result = run_recall(*fixture().model, fixture().tokenizer, options, test_pool());
  ASSERT_EQ(result.formats[0].cells.size(), 2u);
  for (const RecallCell& cell : result.formats[0].cells) {
    // Per argument token, copying from the definition is at least e^1.5 = 4.5x likelier than
    // the same prompt without it.
    EXPECT_GT(cell.mean_logprob_per_token, cell.control_logprob_per_token + 1.5)
        << "depth " << cell.depth_tokens;
    EXPECT_GE(cell.exact_match, cell.control_exact_match);
  }
}

// The fixture's layer 1 V and layer 2 K are rescaled by powers of two (function unchanged,
// see MAGNITUDE in tools/train_fixture_model.py) to amax ~0.02-0.03, where FP8 E4M3 at scale
// 1.0 stores most values as subnormals: scale 1.0 must then be measurably worse than a
// calibrated per-tensor scale (4.9x the mean KLD over the whole held-out text), while the
// other layers keep the two equal.
TEST(Fixture, ScaleOneLosesPrecisionOnSmallLayers) {
  const auto& amax = fixture().training["kv_amax_heldout"];
  ASSERT_EQ(amax.size(), 4u);
  EXPECT_LT(amax[1]["v_amax"].get<double>(), 0.1);
  EXPECT_LT(amax[2]["k_amax"].get<double>(), 0.1);
  EXPECT_GT(amax[0]["k_amax"].get<double>(), 1.0);
  PerplexityOptions options;
  options.kv_formats = {"bf16", "fp8_e4m3:none", "fp8_e4m3:tensor"};
  options.ctx_tokens = 256;
  options.max_chunks = 8;
  PerplexityResult result =
      run_perplexity(*fixture().model, fixture().heldout, options, test_pool());
  ASSERT_EQ(result.formats.size(), 3u);
  const double unscaled = result.formats[1].summary.kld_mean;
  const double calibrated = result.formats[2].summary.kld_mean;
  EXPECT_GT(unscaled, 1.5 * calibrated) << unscaled << " vs " << calibrated;
  EXPECT_LT(result.formats[1].summary.same_top, result.formats[2].summary.same_top);
}

TEST(Fixture, FormatsOrderedByDamage) {
  PerplexityOptions options;
  options.kv_formats = {"f32",      "bf16",     "fp8_e4m3:tensor", "fp8_e5m2",
                        "int8:g32", "int4:g32", "int4:g128"};
  options.ctx_tokens = 256;
  options.max_chunks = 4;
  PerplexityResult result =
      run_perplexity(*fixture().model, fixture().heldout, options, test_pool());
  ASSERT_EQ(result.formats.size(), 7u);
  const auto& f = result.formats;
  EXPECT_EQ(f[0].summary.kld_mean, 0.0);
  EXPECT_EQ(f[0].kv_bytes_per_token, 2 * f[1].kv_bytes_per_token);
  EXPECT_EQ(f[1].kv_bytes_per_token, 2 * f[2].kv_bytes_per_token);
  for (size_t i = 1; i < f.size(); ++i) {
    EXPECT_EQ(f[i].summary.nonfinite, 0) << f[i].spec;
    EXPECT_GT(f[i].summary.kld_mean, 0.0) << f[i].spec;
  }
  EXPECT_LT(f[1].summary.kld_mean, f[2].summary.kld_mean);  // bf16 < fp8 e4m3
  EXPECT_LT(f[2].summary.kld_mean, f[3].summary.kld_mean);  // e4m3 (3 mantissa bits) < e5m2 (2)
  // Integer grids: fewer bits, or one scale for more elements, damage more. (Across the
  // families the order depends on the data: on this model's induction-head keys, a few
  // large values of equal magnitude and exact zeros, int4:g32 and fp8_e5m2 are close.)
  EXPECT_LT(f[4].summary.kld_mean, f[5].summary.kld_mean);  // int8 < int4, groups of 32
  EXPECT_LT(f[5].summary.kld_mean, f[6].summary.kld_mean);  // int4: groups of 32 < 128
  EXPECT_FALSE(f[2].calibration.empty());
}

}  // namespace
}  // namespace kvaudit::eval

namespace kvaudit::eval {
namespace {

TEST(Fixture, PiecewiseScoringEqualsWholeChunks) {
  PerplexityOptions options;
  options.kv_formats = {"bf16", "fp8_e4m3:none"};
  options.ctx_tokens = 128;
  options.max_chunks = 2;
  PerplexityResult whole =
      run_perplexity(*fixture().model, fixture().heldout, options, test_pool());
  options.piece_tokens = 37;  // pieces that straddle the first scored position (64)
  PerplexityResult pieces =
      run_perplexity(*fixture().model, fixture().heldout, options, test_pool());
  for (size_t f = 0; f < 2; ++f) {
    EXPECT_EQ(whole.formats[f].summary.count, 2 * 63);
    EXPECT_EQ(whole.formats[f].summary.kld_mean, pieces.formats[f].summary.kld_mean);
    EXPECT_EQ(whole.formats[f].summary.ppl_test, pieces.formats[f].summary.ppl_test);
    EXPECT_EQ(whole.formats[f].kv_bytes_per_token, pieces.formats[f].kv_bytes_per_token);
  }
}

}  // namespace
}  // namespace kvaudit::eval
