// calibrate: statistics, scales, the overlay the engines load (checked through the same
// reader and engine data as `kvaudit check`), the refusals, and the bit-exact round trip.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>

#include "audit/audit.h"
#include "calibrate/calibrate.h"
#include "common/fixtures.h"
#include "common/registry.h"
#include "eval/eval.h"
#include "tokenizer/tokenizer.h"
#include "util/util.h"

namespace kvaudit::calibrate {
namespace {

// The tests' thread pool, owned here as the CLI owns its own.
ThreadPool& test_pool() {
  static ThreadPool pool(2);
  return pool;
}

namespace fs = std::filesystem;
using kvaudit::testing::fixture_checkpoint;
using nlohmann::json;

const fs::path kFixtureModel = fs::path(KVAUDIT_TEST_DIR) / "fixtures" / "model" / "qwen3-pystd";

fs::path fresh_dir(const std::string& name) {
  fs::path dir =
      fs::path(KVAUDIT_BUILD_DIR) / "calibrate_test" / (name + "-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir.parent_path());
  return dir;
}

// The original checkpoint with the overlay's files placed beside (and over) its own.
fs::path deploy(const fs::path& model_dir, const fs::path& overlay, const std::string& name) {
  fs::path merged = fresh_dir(name);
  fs::create_directories(merged);
  for (const auto& entry : fs::directory_iterator(model_dir))
    fs::create_symlink(fs::absolute(entry.path()), merged / entry.path().filename());
  for (const auto& entry : fs::directory_iterator(overlay)) {
    fs::remove(merged / entry.path().filename());
    fs::copy_file(entry.path(), merged / entry.path().filename());
  }
  return merged;
}

KvStats two_layer_stats() {
  KvStats stats;
  stats.source = "test";
  stats.num_layers = 2;
  stats.num_kv_heads = 2;
  stats.layers = {{0, {1.0f, 3.5f}, {0.25f, 0.5f}, {}, {}},
                  {1, {448.0f, 0.1f}, {7.0f, 2.0f}, {}, {}}};
  return stats;
}

TEST(Stats, JsonRoundTripAndValidation) {
  KvStats stats = two_layer_stats();
  KvStats back = kv_stats_from_json(kv_stats_to_json(stats), "mem");
  ASSERT_EQ(back.layers.size(), 2u);
  EXPECT_EQ(back.layers[1].k_amax, stats.layers[1].k_amax);
  EXPECT_EQ(back.layers[0].v_amax, stats.layers[0].v_amax);

  json doc = kv_stats_to_json(stats);
  json missing = doc;
  missing["layers"].erase(1);
  EXPECT_THROW(kv_stats_from_json(missing, "mem"), InputError);  // layer 1 missing
  json negative = doc;
  negative["layers"][0]["k_amax"][0] = -1.0;
  EXPECT_THROW(kv_stats_from_json(negative, "mem"), InputError);
  json wrong_heads = doc;
  wrong_heads["layers"][0]["v_amax"] = {1.0, 2.0, 3.0};
  EXPECT_THROW(kv_stats_from_json(wrong_heads, "mem"), InputError);
  json twice = doc;
  twice["layers"][1]["layer"] = 0;
  EXPECT_THROW(kv_stats_from_json(twice, "mem"), InputError);
  json bad_format = doc;
  bad_format["format"] = "something else";
  EXPECT_THROW(kv_stats_from_json(bad_format, "mem"), InputError);
  json scalar = doc;  // a per-tensor maximum is allowed, but gives no per-head scales
  scalar["layers"][0]["k_amax"] = 5.0;
  KvStats per_tensor = kv_stats_from_json(scalar, "mem");
  EXPECT_EQ(per_tensor.layers[0].k_amax, std::vector<float>{5.0f});
  ScaleOptions head;
  head.granularity = Granularity::head;
  EXPECT_THROW(compute_scales(per_tensor, head), InputError);
}

TEST(Scales, AmaxOver448TimesMargin) {
  std::vector<LayerScales> scales = compute_scales(two_layer_stats(), {});
  ASSERT_EQ(scales.size(), 2u);
  EXPECT_EQ(scales[0].k_scale, std::vector<float>{float(3.5 / 448.0)});
  EXPECT_EQ(scales[1].k_scale, std::vector<float>{1.0f});
  EXPECT_EQ(scales[1].v_scale, std::vector<float>{float(7.0 / 448.0)});
  ScaleOptions head;
  head.granularity = Granularity::head;
  head.margin = 2.0;
  scales = compute_scales(two_layer_stats(), head);
  ASSERT_EQ(scales[1].k_scale.size(), 2u);
  EXPECT_EQ(scales[1].k_scale[0], 2.0f);
  // Never below what float division needs to keep amax inside 448 x margin, and at most one
  // ulp above the correctly rounded quotient.
  const float exact = float(double(0.1f) * 2.0 / 448.0);
  EXPECT_LE(0.1f / scales[1].k_scale[1], 448.0f * 2.0f);
  EXPECT_LE(scales[1].k_scale[1], std::nextafter(exact, 1.0f));
  EXPECT_GE(scales[1].k_scale[1], exact);
  for (float amax : {0.1f, 0.3f, 1.7f, 3.3e-3f, 123.456f, 447.9f}) {
    KvStats one;
    one.num_layers = 1;
    one.num_kv_heads = 1;
    one.layers = {{0, {amax}, {amax}, {}, {}}};
    const float scale = compute_scales(one, {})[0].k_scale[0];
    EXPECT_LE(amax / scale, 448.0f) << amax;
    EXPECT_GT(amax / std::nextafter(scale, 0.0f), 448.0f * (1.0f - 1e-6f)) << amax;
  }
  ScaleOptions percentile;
  percentile.use_percentile = true;  // none collected
  EXPECT_THROW(compute_scales(two_layer_stats(), percentile), InputError);
  KvStats zero = two_layer_stats();
  zero.layers[0].v_amax = {0.0f, 0.0f};
  EXPECT_THROW(compute_scales(zero, {}), InputError);
}

class FixtureModel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = model::Model::load(kFixtureModel).release();
    auto tokenizer = tokenizer::Tokenizer::load(kFixtureModel);
    tokens_ = tokenizer.encode(read_text_file(kFixtureModel / "heldout.txt"));
    tokens_.resize(std::min<size_t>(tokens_.size(), 2048));
    CollectOptions options;
    options.chunk_tokens = 512;
    options.percentile = 99.0;
    stats_ = collect_kv_stats(*model_, tokens_, options, test_pool());
  }
  static void TearDownTestSuite() { delete model_; }
  static model::Model* model_;
  static std::vector<int32_t> tokens_;
  static KvStats stats_;
};
model::Model* FixtureModel::model_ = nullptr;
std::vector<int32_t> FixtureModel::tokens_;
KvStats FixtureModel::stats_;

TEST_F(FixtureModel, CollectsPerHeadMaximaAndPercentiles) {
  ASSERT_EQ(stats_.layers.size(), size_t(model_->config().num_layers));
  for (const LayerKvStats& layer : stats_.layers) {
    ASSERT_EQ(layer.k_amax.size(), size_t(model_->config().num_kv_heads));
    for (size_t head = 0; head < layer.k_amax.size(); ++head) {
      EXPECT_GT(layer.k_amax[head], 0.0f);
      EXPECT_LE(layer.k_amax_percentile[head], layer.k_amax[head]);
      EXPECT_LE(layer.v_amax_percentile[head], layer.v_amax[head]);
    }
  }
  // The maxima agree with what the session's own per-channel capture saw.
  ThreadPool pool(2);
  model::Session session(*model_, numerics::parse_kv_format("bf16"), pool);
  session.capture_amax(true);
  std::vector<float> unused;
  session.forward(std::span<const int32_t>(tokens_).first(512), 512, unused);
  const auto& channels = session.amax()[0].k_channel_amax;
  float tensor_max = *std::max_element(channels.begin(), channels.end());
  CollectOptions one_chunk;
  one_chunk.chunk_tokens = 512;
  KvStats first = collect_kv_stats(*model_, std::span<const int32_t>(tokens_).first(512), one_chunk,
                                   test_pool());
  EXPECT_EQ(*std::max_element(first.layers[0].k_amax.begin(), first.layers[0].k_amax.end()),
            tensor_max);
}

TEST_F(FixtureModel, CalibratedScalesDoNotClipTheCalibrationText) {
  std::vector<LayerScales> scales = compute_scales(stats_, {});
  CollectOptions options;
  options.chunk_tokens = 512;
  std::vector<LayerClipping> clipping =
      measure_clipping(*model_, tokens_, scales, Granularity::tensor, options, test_pool());
  // Layer 0 sees exactly the K/V it was calibrated on: its maximum maps onto 448, nothing
  // clips. Later layers see activations already shaped by the FP8 cache below them, which can
  // step slightly past the BF16-calibrated maxima: rare, but real, and reported.
  EXPECT_EQ(clipping[0].k_saturated, 0.0);
  EXPECT_EQ(clipping[0].v_saturated, 0.0);
  for (const LayerClipping& layer : clipping) {
    EXPECT_LT(layer.k_saturated, 1e-4) << layer.layer;
    EXPECT_LT(layer.v_saturated, 1e-4) << layer.layer;
  }
  ScaleOptions p99;
  p99.use_percentile = true;
  double clipped = 0.0;
  for (const LayerClipping& layer : measure_clipping(*model_, tokens_, compute_scales(stats_, p99),
                                                     Granularity::tensor, options, test_pool()))
    clipped += layer.k_saturated + layer.v_saturated;
  EXPECT_GT(clipped, 0.0);  // the p99 maxima leave the top tokens above the range
}

TEST_F(FixtureModel, VllmOverlayLoadsAndRoundTripsBitForBit) {
  std::vector<LayerScales> scales = compute_scales(stats_, {});
  checkpoint::ModelFacts facts = checkpoint::read_checkpoint(kFixtureModel);
  OverlayRequest request{kFixtureModel,      fresh_dir("vllm-overlay"), "vllm", "", 1,
                         Granularity::tensor};
  OverlayResult result = write_overlay(kvaudit::testing::registry(), facts, scales, request);
  EXPECT_EQ(result.carrier, Carrier::kv_only_compressed_tensors);
  EXPECT_EQ(engines::scale_source_name(result.resolved.scale_source), "checkpoint");
  EXPECT_EQ(result.tensor_names.size(), 2u * size_t(facts.num_layers));
  EXPECT_TRUE(fs::exists(request.out_dir / "kv_scales.safetensors"));
  EXPECT_TRUE(fs::exists(request.out_dir / "config.json"));
  // The original is untouched.
  EXPECT_FALSE(checkpoint::read_checkpoint(kFixtureModel).quant.has_value());

  // Round trip: the checkpoint reader gives back the very bits.
  std::vector<LayerScales> back =
      load_scales(request.out_dir, facts.num_layers, facts.num_kv_heads);
  ASSERT_EQ(back.size(), scales.size());
  for (size_t i = 0; i < scales.size(); ++i) {
    ASSERT_EQ(back[i].k_scale.size(), 1u);
    uint32_t a, b;
    std::memcpy(&a, &scales[i].k_scale[0], 4);
    std::memcpy(&b, &back[i].k_scale[0], 4);
    EXPECT_EQ(a, b);
    std::memcpy(&a, &scales[i].v_scale[0], 4);
    std::memcpy(&b, &back[i].v_scale[0], 4);
    EXPECT_EQ(a, b);
  }

  // kvaudit check on checkpoint + overlay, every vLLM version kvaudit knows: loaded.
  fs::path merged = deploy(kFixtureModel, request.out_dir, "vllm-merged");
  audit::CheckInput input;
  input.model = checkpoint::read_checkpoint(merged);
  for (const char* version : {"0.10.2", "0.11.0", "0.14.0", ""}) {
    input.flags = engines::LaunchFlags{};
    input.flags.engine = "vllm";
    input.flags.engine_version = version;
    input.flags.kv_cache_dtype = "fp8";
    input.engine = &kvaudit::testing::engine("vllm");
    audit::CheckResult check = audit::run_check(input);
    for (const auto& finding : check.findings)
      EXPECT_NE(finding.severity, report::Severity::critical) << version << ": " << finding.id;
    EXPECT_EQ(engines::scale_source_name(check.resolved.scale_source), "checkpoint") << version;
    EXPECT_TRUE(check.resolved.dropped.empty()) << version;
    EXPECT_FALSE(audit::fails_gate(check.findings, audit::FailOn::critical)) << version;
  }
  // The same overlay under SGLang before PR #35455: its compressed-tensors path drops the
  // scales, and check says so.
  input.flags = engines::LaunchFlags{};
  input.flags.engine = "sglang";
  input.flags.engine_version = "0.5.15";
  input.flags.kv_cache_dtype = "fp8_e4m3";
  input.engine = &kvaudit::testing::engine("sglang");
  audit::CheckResult sglang = audit::run_check(input);
  ASSERT_FALSE(sglang.resolved.dropped.empty());
  EXPECT_EQ(sglang.resolved.dropped[0].rule_id, "sglang-35455-compressed-tensors");
  EXPECT_EQ(engines::scale_source_name(sglang.resolved.scale_source), "unit_default");
  EXPECT_TRUE(audit::fails_gate(sglang.findings, audit::FailOn::critical));
  // After it (0.5.19 assumed), SGLang loads the same per-tensor scales.
  input.flags.engine_version = "0.5.23";
  audit::CheckResult fixed = audit::run_check(input);
  EXPECT_TRUE(fixed.resolved.dropped.empty());
  EXPECT_EQ(engines::scale_source_name(fixed.resolved.scale_source), "checkpoint");
}

TEST_F(FixtureModel, SglangFallsBackToTheParamPathJson) {
  std::vector<LayerScales> scales = compute_scales(stats_, {});
  checkpoint::ModelFacts facts = checkpoint::read_checkpoint(kFixtureModel);
  OverlayRequest request{kFixtureModel,      fresh_dir("sglang-overlay"), "sglang", "0.5.9", 2,
                         Granularity::tensor};  // before PR #35455
  OverlayResult result = write_overlay(kvaudit::testing::registry(), facts, scales, request);
  ASSERT_EQ(result.attempts.size(), 2u);
  EXPECT_FALSE(result.attempts[0].works);  // compressed-tensors scales are dropped (#35455)
  EXPECT_NE(result.attempts[0].why.find("sglang-35455"), std::string::npos);
  EXPECT_EQ(result.carrier, Carrier::quantization_param_path);
  const fs::path json_file = request.out_dir / "kv_cache_scales.json";
  json doc = json::parse(read_text_file(json_file));
  EXPECT_EQ(doc["kv_cache"]["dtype"], "float8_e4m3fn");
  EXPECT_TRUE(doc["kv_cache"]["scaling_factor"].contains("1"));  // one entry per TP rank
  std::vector<LayerScales> back = load_scales(json_file, facts.num_layers, facts.num_kv_heads);
  for (size_t i = 0; i < scales.size(); ++i)
    EXPECT_EQ(back[i].k_scale[0], std::max(scales[i].k_scale[0], scales[i].v_scale[0]));

  audit::CheckInput input;
  input.model = checkpoint::read_checkpoint(kFixtureModel);
  input.flags.engine = "sglang";
  input.flags.engine_version = "0.5.9";
  input.flags.kv_cache_dtype = "fp8_e4m3";
  input.flags.quantization_param_path = json_file.string();
  input.engine = &kvaudit::testing::engine("sglang");
  audit::CheckResult check = audit::run_check(input);
  EXPECT_EQ(engines::scale_source_name(check.resolved.scale_source), "quantization_param_path");
  EXPECT_FALSE(audit::fails_gate(check.findings, audit::FailOn::critical));
}

TEST_F(FixtureModel, RefusesWhatNoEngineVersionLoads) {
  std::vector<LayerScales> scales = compute_scales(stats_, {});
  checkpoint::ModelFacts facts = checkpoint::read_checkpoint(kFixtureModel);
  // SGLang refuses per-head scales at start-up.
  ScaleOptions head;
  head.granularity = Granularity::head;
  OverlayRequest request{kFixtureModel, fresh_dir("head"), "sglang", "", 1, Granularity::head};
  EXPECT_THROW(
      write_overlay(kvaudit::testing::registry(), facts, compute_scales(stats_, head), request),
      InputError);
  EXPECT_FALSE(fs::exists(request.out_dir));
  // vLLM takes them (compressed-tensors attn_head).
  request.engine = "vllm";
  OverlayResult per_head =
      write_overlay(kvaudit::testing::registry(), facts, compute_scales(stats_, head), request);
  EXPECT_EQ(engines::scale_source_name(per_head.resolved.scale_source), "checkpoint");
  EXPECT_EQ(load_scales(request.out_dir, facts.num_layers, facts.num_kv_heads)[0].k_scale.size(),
            size_t(facts.num_kv_heads));
  // Never into the checkpoint itself, never over someone else's files.
  request = {kFixtureModel, kFixtureModel, "vllm", "", 1, Granularity::tensor};
  EXPECT_THROW(write_overlay(kvaudit::testing::registry(), facts, scales, request), InputError);
  fs::path busy = fresh_dir("busy");
  fs::create_directories(busy);
  std::ofstream(busy / "notes.txt") << "mine";
  request.out_dir = busy;
  EXPECT_THROW(write_overlay(kvaudit::testing::registry(), facts, scales, request), InputError);
}

TEST_F(FixtureModel, CalibratedScalesBeatScaleOneInEval) {
  // Calibrated on the first 2048 held-out tokens, measured on the rest: the scales an engine
  // would load lower the KL divergence against BF16 compared with FP8 at scale 1.0.
  auto tokenizer = tokenizer::Tokenizer::load(kFixtureModel);
  std::vector<int32_t> all = tokenizer.encode(read_text_file(kFixtureModel / "heldout.txt"));
  ASSERT_GT(all.size(), 2048u + 4 * 256u);
  std::vector<int32_t> eval_tokens(all.begin() + 2048, all.end());
  eval::PerplexityOptions options;
  options.kv_formats = {"bf16", "fp8_e4m3:none", "fp8_e4m3:tensor"};
  options.ctx_tokens = 256;
  options.max_chunks = 4;
  options.loaded_scales = {session_scales(compute_scales(stats_, {}), model_->config().num_layers),
                           "calibration"};
  eval::PerplexityResult result = eval::run_perplexity(*model_, eval_tokens, options, test_pool());
  const eval::KldSummary& unit = result.formats[1].summary;
  const eval::KldSummary& calibrated = result.formats[2].summary;
  EXPECT_EQ(result.formats[2].calibration, "scales loaded from calibration");
  EXPECT_LT(calibrated.kld_mean, unit.kld_mean);
  EXPECT_GE(calibrated.same_top, unit.same_top);
}

TEST(Refusal, VllmDropsQwen3MoeScalesAndCalibrateSaysWhy) {
  checkpoint::ModelFacts facts =
      checkpoint::read_checkpoint(fixture_checkpoint("qwen3-moe-modelopt-fp8"));
  KvStats stats;
  stats.num_layers = facts.num_layers;
  stats.num_kv_heads = facts.num_kv_heads;
  for (int layer = 0; layer < facts.num_layers; ++layer)
    stats.layers.push_back({layer, {2.0f}, {3.0f}, {}, {}});
  std::vector<LayerScales> scales = compute_scales(stats, {});
  // vLLM before PR #35656 (0.19 assumed) drops Qwen3-MoE scales.
  OverlayRequest request{facts.dir, fresh_dir("moe"), "vllm", "0.17.0", 1, Granularity::tensor};
  try {
    write_overlay(kvaudit::testing::registry(), facts, scales, request);
    FAIL() << "expected a refusal";
  } catch (const InputError& error) {
    EXPECT_NE(std::string(error.problem()).find("vllm-35656"), std::string::npos)
        << error.problem();
    EXPECT_NE(std::string(error.problem()).find("bf16"), std::string::npos);
  }
  EXPECT_FALSE(fs::exists(request.out_dir));
  // SGLang drops the checkpoint tensors too (#39942), and its JSON needs a
  // load_kv_cache_scales the Qwen3-MoE class does not have: start-up would stop.
  request.engine = "sglang";
  request.engine_version = "";
  try {
    write_overlay(kvaudit::testing::registry(), facts, scales, request);
    FAIL() << "expected a refusal";
  } catch (const InputError& error) {
    EXPECT_NE(std::string(error.problem()).find("sglang-39942"), std::string::npos)
        << error.problem();
    EXPECT_NE(std::string(error.problem()).find("does not support loading scaling factors"),
              std::string::npos)
        << error.problem();
  }
  EXPECT_FALSE(fs::exists(request.out_dir));
}

TEST(Refusal, ModelOptOverlayAddsScalesToTheIndex) {
  // A sharded ModelOpt checkpoint that declares FP8 KV without scales (the motivating case
  // in small): the overlay names the new file in the index and SGLang loads the tensors.
  checkpoint::ModelFacts facts =
      checkpoint::read_checkpoint(fixture_checkpoint("llama-modelopt-kv-no-scales"));
  ASSERT_TRUE(fs::exists(facts.dir / "model.safetensors.index.json"));
  KvStats stats;
  stats.num_layers = facts.num_layers;
  stats.num_kv_heads = facts.num_kv_heads;
  for (int layer = 0; layer < facts.num_layers; ++layer)
    stats.layers.push_back({layer, {20.0f}, {4.0f}, {}, {}});
  OverlayRequest request{facts.dir, fresh_dir("modelopt"), "sglang", "", 1, Granularity::tensor};
  OverlayResult result =
      write_overlay(kvaudit::testing::registry(), facts, compute_scales(stats, {}), request);
  EXPECT_EQ(result.carrier, Carrier::modelopt);
  EXPECT_EQ(engines::scale_source_name(result.resolved.scale_source), "checkpoint");
  fs::path merged = deploy(facts.dir, request.out_dir, "modelopt-merged");
  checkpoint::ModelFacts seen = checkpoint::read_checkpoint(merged);
  int written = 0;
  for (const auto& scale : seen.kv_scales)
    if (scale.shard_file == "kv_scales.safetensors") {
      ++written;
      EXPECT_EQ(scale.values,
                std::vector<float>{scale.role == checkpoint::ScaleRole::k ? float(20.0 / 448.0)
                                                                          : float(4.0 / 448.0)});
    }
  EXPECT_EQ(written, 2 * facts.num_layers);
  json index = json::parse(read_text_file(request.out_dir / "model.safetensors.index.json"));
  EXPECT_EQ(index["weight_map"]["model.layers.0.self_attn.k_proj.k_scale"],
            "kv_scales.safetensors");

  // A checkpoint that already ships scales cannot be overlaid: both would load.
  checkpoint::ModelFacts unit =
      checkpoint::read_checkpoint(fixture_checkpoint("llama-modelopt-unit-scales"));
  request = {unit.dir, fresh_dir("unit"), "vllm", "", 1, Granularity::tensor};
  try {
    write_overlay(kvaudit::testing::registry(), unit, compute_scales(stats, {}), request);
    FAIL() << "expected a refusal";
  } catch (const InputError& error) {
    EXPECT_NE(error.problem().find("already holds"), std::string::npos) << error.problem();
  }
}

TEST_F(FixtureModel, EvalUsesLoadedScalesBitForBit) {
  std::vector<LayerScales> scales = compute_scales(stats_, {});
  eval::LoadedScales loaded{session_scales(scales, model_->config().num_layers), "test"};
  const model::ModelConfig& config = model_->config();
  auto applied =
      eval::loaded_scales_for(numerics::parse_kv_format("fp8_e4m3:tensor"), loaded, config);
  ASSERT_EQ(applied.size(), scales.size());
  EXPECT_EQ(applied[2][1].scales, scales[2].v_scale);
  EXPECT_TRUE(
      eval::loaded_scales_for(numerics::parse_kv_format("fp8_e4m3:none"), loaded, config).empty());
  EXPECT_THROW(eval::loaded_scales_for(numerics::parse_kv_format("fp8_e4m3:head"), loaded, config),
               InputError);  // per-tensor scales cannot serve a per-head format
}

// A Qwen3.5 hybrid (tests/fixtures/model/qwen35-pystd): only its full-attention layer has a
// KV cache, so calibrate collects, scales and writes that layer alone, the overlay names
// only its projections, eval loads it for that layer, and kvaudit check on checkpoint +
// overlay agrees that the engine loads the scales.
TEST(Hybrid, CalibratesOnlyTheAttentionLayers) {
  const fs::path dir = fs::path(KVAUDIT_TEST_DIR) / "fixtures" / "model" / "qwen35-pystd";
  auto model = model::Model::load(dir);
  auto tokenizer = tokenizer::Tokenizer::load(dir);
  std::vector<int32_t> tokens = tokenizer.encode(read_text_file(dir / "heldout.txt"));
  tokens.resize(1024);
  CollectOptions collect;
  collect.chunk_tokens = 512;
  KvStats stats = collect_kv_stats(*model, tokens, collect, test_pool());
  EXPECT_EQ(stats.layers_without_kv, (std::vector<int>{0, 1, 2}));
  ASSERT_EQ(stats.layers.size(), 1u);
  EXPECT_EQ(stats.layers[0].layer, 3);
  // The statistics file keeps the layers without a KV cache, and refuses them twice.
  KvStats back = kv_stats_from_json(kv_stats_to_json(stats), "stats.json");
  EXPECT_EQ(back.layers_without_kv, stats.layers_without_kv);
  json twice = kv_stats_to_json(stats);
  twice["layers_without_kv"].push_back(3);
  EXPECT_THROW(kv_stats_from_json(twice, "stats.json"), InputError);

  std::vector<LayerScales> scales = compute_scales(stats, {});
  ASSERT_EQ(scales.size(), 1u);
  checkpoint::ModelFacts facts = checkpoint::read_checkpoint(dir);
  // vLLM's Qwen3.5 loader drops checkpoint KV scales (vllm#54623, open): calibrate refuses
  // to write scales no vLLM release would load, and says why.
  OverlayRequest vllm{dir, fresh_dir("hybrid-vllm"), "vllm", "", 1, Granularity::tensor};
  try {
    write_overlay(kvaudit::testing::registry(), facts, scales, vllm);
    FAIL() << "expected a refusal";
  } catch (const InputError& error) {
    EXPECT_NE(error.problem().find("vllm-54623-qwen3.5"), std::string::npos) << error.problem();
  }
  // SGLang loads them from 0.5.18 on (PR #31220).
  OverlayRequest request{dir, fresh_dir("hybrid-overlay"), "sglang", "0.5.23",
                         1,   Granularity::tensor};
  OverlayResult result = write_overlay(kvaudit::testing::registry(), facts, scales, request);
  ASSERT_EQ(result.tensor_names.size(), 2u);
  for (const std::string& name : result.tensor_names)
    EXPECT_TRUE(name.starts_with("model.layers.3.self_attn.")) << name;
  std::vector<LayerScales> loaded =
      load_scales(request.out_dir, facts.num_layers, facts.num_kv_heads, stats.layers_without_kv);
  ASSERT_EQ(loaded.size(), 4u);
  EXPECT_TRUE(loaded[0].k_scale.empty());
  EXPECT_EQ(loaded[3].k_scale, scales[0].k_scale);
  EXPECT_THROW(load_scales(request.out_dir, facts.num_layers, facts.num_kv_heads),
               InputError);  // a dense reading of the same file misses layers 0-2

  // eval runs the hybrid with the overlay's scales on its attention layer.
  eval::LoadedScales applied{session_scales(loaded, facts.num_layers), request.out_dir.string()};
  auto calibration = eval::loaded_scales_for(numerics::parse_kv_format("fp8_e4m3:tensor"), applied,
                                             model->config());
  ASSERT_EQ(calibration.size(), 4u);
  EXPECT_EQ(calibration[3][1].scales, scales[0].v_scale);

  fs::path merged = deploy(dir, request.out_dir, "hybrid-merged");
  audit::CheckInput input;
  input.model = checkpoint::read_checkpoint(merged);
  input.flags.engine = "sglang";
  input.flags.engine_version = "0.5.23";
  input.flags.kv_cache_dtype = "fp8_e4m3";
  input.engine = &kvaudit::testing::engine("sglang");
  audit::CheckResult check = audit::run_check(input);
  EXPECT_EQ(engines::scale_source_name(check.resolved.scale_source), "checkpoint");
  EXPECT_TRUE(check.resolved.dropped.empty());
  EXPECT_FALSE(audit::fails_gate(check.findings, audit::FailOn::critical));
  // Before PR #31220 the same overlay is dropped, and check says so.
  input.flags.engine_version = "0.5.15";
  audit::CheckResult old = audit::run_check(input);
  ASSERT_FALSE(old.resolved.dropped.empty());
  EXPECT_EQ(old.resolved.dropped[0].rule_id, "sglang-31220-qwen3.5");
}

}  // namespace
}  // namespace kvaudit::calibrate
