// run_perplexity: every KV format over the same chunks of text, compared position by position
// with the baseline format, whose log-probs are computed once per chunk and reused.
#include <fmt/format.h>

#include <chrono>

#include "eval/eval.h"
#include "util/util.h"

namespace kvaudit::eval {

namespace {

using Clock = std::chrono::steady_clock;

bool needs_calibration(const numerics::KvFormat& format) {
  using numerics::ScaleStrategy;
  return format.strategy == ScaleStrategy::tensor || format.strategy == ScaleStrategy::head ||
         format.strategy == ScaleStrategy::channel || format.kind == numerics::KvFormatKind::nvfp4;
}

// The scored positions [first, first + scored_per_chunk) cut into `buckets` equal ranges,
// each summarised over the samples that fall in it.
std::vector<PositionBucket> bucket_summaries(const std::vector<TokenComparison>& samples,
                                             int64_t first, int64_t scored_per_chunk, int buckets) {
  std::vector<PositionBucket> out;
  for (int b = 0; b < buckets; ++b) {
    PositionBucket bucket;
    bucket.first_position = first + scored_per_chunk * b / buckets;
    bucket.last_position = first + scored_per_chunk * (b + 1) / buckets - 1;
    std::vector<TokenComparison> in_bucket;
    for (const TokenComparison& s : samples)
      if (s.position >= bucket.first_position && s.position <= bucket.last_position)
        in_bucket.push_back(s);
    bucket.summary = summarize(in_bucket);
    out.push_back(bucket);
  }
  return out;
}

}  // namespace

std::vector<std::array<numerics::StaticAmax, 2>> loaded_scales_for(
    const numerics::KvFormat& format, const LoadedScales& loaded,
    const model::ModelConfig& config) {
  using numerics::ScaleStrategy;
  if (loaded.layers.empty() || format.element != numerics::ElementType::fp8_e4m3 ||
      format.hadamard ||
      (format.strategy != ScaleStrategy::tensor && format.strategy != ScaleStrategy::head))
    return {};
  if (loaded.layers.size() != size_t(config.num_layers))
    throw InputError(loaded.label, fmt::format("holds scales for {} layers; the model has {}",
                                               loaded.layers.size(), config.num_layers));
  const size_t want = format.strategy == ScaleStrategy::tensor ? 1 : size_t(config.num_kv_heads);
  for (size_t index = 0; index < loaded.layers.size(); ++index) {
    if (config.mixers[index] != model::Mixer::attention) continue;  // no KV cache, no scales
    const auto& layer = loaded.layers[index];
    for (const numerics::StaticAmax& role : layer)
      if (role.scales.size() != want)
        throw InputError(loaded.label, fmt::format("holds {} scale(s) per layer; {} needs {}",
                                                   role.scales.size(), format.spec, want));
  }
  return loaded.layers;
}

// Captures the K/V maxima the static strategies need by running `tokens` through a session
// of `capture_format`, and turns them into per-layer {K, V} StaticAmax for `format`.
std::vector<std::array<numerics::StaticAmax, 2>> calibrate_static_scales(
    const model::Model& model, const numerics::KvFormat& capture_format,
    const numerics::KvFormat& format, std::span<const int32_t> tokens, ThreadPool& pool) {
  model::Session session(model, capture_format, pool);
  session.capture_amax(true);
  std::vector<float> unused;
  session.forward(tokens, static_cast<int64_t>(tokens.size()), unused);
  std::vector<std::array<numerics::StaticAmax, 2>> calibration;
  const int kv_heads = model.config().num_kv_heads;
  for (const model::KvLayerAmax& layer : session.amax())
    calibration.push_back(
        {model::static_amax_for(format, layer, numerics::KvRole::key, kv_heads),
         model::static_amax_for(format, layer, numerics::KvRole::value, kv_heads)});
  return calibration;
}

std::vector<model::StateFormat> state_variants(const model::Model& model,
                                               const std::vector<std::string>& specs,
                                               int64_t store_every_tokens) {
  if (!specs.empty() && !model.config().hybrid())
    throw InputError("--state-dtype",
                     "the model has no recurrent state (no Gated DeltaNet "
                     "layers): only KV formats apply");
  std::vector<model::StateFormat> states;
  for (const std::string& spec : specs.empty() ? std::vector<std::string>{"fp32"} : specs)
    states.push_back(model::parse_state_format(spec, store_every_tokens));
  return states;
}

PerplexityResult run_perplexity(const model::Model& model, const std::vector<int32_t>& tokens,
                                const PerplexityOptions& options, ThreadPool& pool) {
  if (options.kv_formats.empty()) throw InputError("--kv", "give at least one KV format");
  if (options.ctx_tokens < 4) throw InputError("--ctx", "must be at least 4 tokens");
  PerplexityResult result;
  result.ctx_tokens = options.ctx_tokens;
  result.text_tokens = static_cast<int64_t>(tokens.size());
  result.chunks = result.text_tokens / options.ctx_tokens;
  if (options.max_chunks > 0) result.chunks = std::min(result.chunks, options.max_chunks);
  if (result.chunks == 0)
    throw InputError("--text", fmt::format("the text has {} tokens, fewer than one chunk of {}",
                                           tokens.size(), options.ctx_tokens));
  const int64_t ctx = options.ctx_tokens;
  result.first_scored = options.first_scored < 0 ? ctx / 2 : options.first_scored;
  if (result.first_scored < 0 || result.first_scored >= ctx - 1)
    throw InputError("--score-from", fmt::format("must lie in [0, {})", ctx - 1));
  const int64_t first = result.first_scored;
  const int64_t scored_per_chunk = ctx - 1 - first;
  const int64_t vocab = model.config().vocab_size;
  result.simd_target = numerics::simd_target_name();

  // Every KV format with every state precision (one variant each; KV-major order).
  std::vector<numerics::KvFormat> kv_formats;
  for (const std::string& spec : options.kv_formats)
    kv_formats.push_back(numerics::parse_kv_format(spec));
  result.state_axis = !options.state_formats.empty();
  result.state_store_every_tokens = options.state_store_every_tokens;
  const std::vector<model::StateFormat> states =
      state_variants(model, options.state_formats, options.state_store_every_tokens);
  std::vector<numerics::KvFormat> formats;
  std::vector<model::StateFormat> state_of;
  for (const numerics::KvFormat& kv : kv_formats)
    for (const model::StateFormat& state : states) {
      formats.push_back(kv);
      state_of.push_back(state);
    }

  std::span<const int32_t> calibration_tokens =
      options.calibration_tokens.empty() ? std::span<const int32_t>(tokens).first(ctx)
                                         : std::span<const int32_t>(options.calibration_tokens);
  std::vector<std::unique_ptr<model::Session>> sessions;
  for (size_t v = 0; v < formats.size(); ++v) {
    const numerics::KvFormat& format = formats[v];
    FormatResult fr;
    fr.spec = format.spec;
    if (result.state_axis) fr.state = state_of[v].spec;
    std::vector<std::array<numerics::StaticAmax, 2>> calibration;
    calibration = loaded_scales_for(format, options.loaded_scales, model.config());
    if (!calibration.empty()) {
      fr.calibration = "scales loaded from " + options.loaded_scales.label;
    } else if (needs_calibration(format)) {
      calibration = calibrate_static_scales(model, formats[0], format, calibration_tokens, pool);
      fr.calibration = fmt::format(
          "static scales from {} K/V maxima over {} tokens of {}", formats[0].spec,
          calibration_tokens.size(),
          options.calibration_tokens.empty() ? "the first chunk" : "the calibration text");
    }
    sessions.push_back(
        std::make_unique<model::Session>(model, format, pool, calibration, state_of[v]));
    result.formats.push_back(fr);
  }
  result.formats[0].baseline = true;

  // All formats advance through each chunk in lockstep, one piece of at most piece_tokens at
  // a time, so only one piece of baseline log-probs is held ([piece, vocab] floats; a 32K
  // chunk of a 152K-vocabulary model would otherwise need ~10 GB).
  std::vector<std::vector<TokenComparison>> samples(formats.size());
  std::vector<double> seconds(formats.size(), 0.0);
  const int64_t piece_tokens = std::max<int64_t>(1, options.piece_tokens);
  std::vector<float> base_log_probs(static_cast<size_t>(std::min(piece_tokens, ctx) * vocab));
  std::vector<float> logits;
  for (int64_t c = 0; c < result.chunks; ++c) {
    std::span<const int32_t> chunk = std::span<const int32_t>(tokens).subspan(c * ctx, ctx);
    for (auto& session : sessions) session->reset();
    for (int64_t begin = 0; begin < ctx; begin += piece_tokens) {
      const int64_t count = std::min(piece_tokens, ctx - begin);
      const int64_t local_from = std::clamp<int64_t>(first - begin, 0, count);
      const int64_t first_row_position = begin + local_from;
      const int64_t scored_end = std::min(begin + count, ctx - 1);  // exclusive
      for (size_t f = 0; f < formats.size(); ++f) {
        model::Session& session = *sessions[f];
        auto started = Clock::now();
        session.forward(chunk.subspan(begin, count), local_from, logits);
        seconds[f] += std::chrono::duration<double>(Clock::now() - started).count();
        if (begin + count == ctx) {
          result.formats[f].kv_bytes_per_token = session.kv_bytes() / ctx;
          result.formats[f].state_bytes = session.state_bytes();
        }
        for (int64_t position = first_row_position; position < scored_end; ++position) {
          const int64_t row = position - first_row_position;
          std::span<float> base(&base_log_probs[row * vocab], vocab);
          std::span<const float> test(&logits[row * vocab], vocab);
          if (f == 0) log_softmax(test, base);
          samples[f].push_back(compare_logits(base, test, chunk[position + 1], position));
        }
      }
    }
  }

  const int buckets =
      std::max(1, std::min<int>(options.position_buckets, static_cast<int>(scored_per_chunk)));
  for (size_t f = 0; f < formats.size(); ++f) {
    FormatResult& fr = result.formats[f];
    fr.summary = summarize(samples[f]);
    fr.tokens_per_second =
        seconds[f] > 0.0 ? static_cast<double>(result.chunks * ctx) / seconds[f] : 0.0;
    fr.counts = sessions[f]->encode_counts();
    fr.buckets = bucket_summaries(samples[f], first, scored_per_chunk, buckets);
  }
  return result;
}

}  // namespace kvaudit::eval
