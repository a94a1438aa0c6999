// calibrate collect: K/V maxima and clipping measured on the reference engine.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "calibrate/calibrate.h"
#include "util/util.h"

namespace kvaudit::calibrate {

namespace {

// Max over each head's entries of a token-major [tokens * heads] list.
std::vector<float> head_max(const std::vector<float>& token_head, int heads) {
  std::vector<float> result(size_t(heads), 0.0f);
  for (size_t i = 0; i < token_head.size(); ++i)
    result[i % size_t(heads)] = std::max(result[i % size_t(heads)], token_head[i]);
  return result;
}

// Nearest-rank percentile of each head's per-token maxima.
std::vector<float> head_percentile(const std::vector<float>& token_head, int heads,
                                   double percentile) {
  std::vector<float> result(size_t(heads), 0.0f);
  std::vector<float> column;
  for (int head = 0; head < heads; ++head) {
    column.clear();
    for (size_t i = size_t(head); i < token_head.size(); i += size_t(heads))
      column.push_back(token_head[i]);
    if (column.empty()) continue;
    size_t rank = size_t(std::ceil(percentile / 100.0 * double(column.size())));
    rank = std::clamp<size_t>(rank, 1, column.size());
    std::nth_element(column.begin(), column.begin() + long(rank - 1), column.end());
    result[size_t(head)] = column[rank - 1];
  }
  return result;
}

}  // namespace

KvStats collect_kv_stats(const model::Model& model, std::span<const int32_t> tokens,
                         const CollectOptions& options, ThreadPool& pool) {
  const model::ModelConfig& config = model.config();
  if (tokens.empty()) throw InputError("--text", "the calibration text holds no tokens");
  if (options.chunk_tokens < 1) throw InputError("--ctx", "must be at least 1 token");
  if (!(options.percentile > 0.0 && options.percentile <= 100.0))
    throw InputError("--percentile", "must lie in (0, 100]");
  model::Session session(model, numerics::parse_kv_format("bf16"), pool);
  session.capture_amax(true);
  std::vector<float> unused;
  const int64_t chunk =
      std::min<int64_t>(options.chunk_tokens, std::max<int64_t>(1, config.max_position_embeddings));
  for (size_t first = 0; first < tokens.size(); first += size_t(chunk)) {
    session.reset();
    session.forward(tokens.subspan(first, std::min(tokens.size() - first, size_t(chunk))), chunk,
                    unused);
  }
  KvStats stats;
  stats.num_layers = config.num_layers;
  stats.num_kv_heads = config.num_kv_heads;
  stats.tokens = int64_t(tokens.size());
  stats.percentile = options.percentile;
  for (int layer = 0; layer < config.num_layers; ++layer) {
    if (config.mixers[size_t(layer)] != model::Mixer::attention) {
      stats.layers_without_kv.push_back(layer);  // Gated DeltaNet: a recurrent state, no KV
      continue;
    }
    const model::KvLayerAmax& amax = session.amax()[size_t(layer)];
    LayerKvStats entry;
    entry.layer = layer;
    entry.k_amax = head_max(amax.k_token_head_amax, config.num_kv_heads);
    entry.v_amax = head_max(amax.v_token_head_amax, config.num_kv_heads);
    if (options.percentile < 100.0) {
      entry.k_amax_percentile =
          head_percentile(amax.k_token_head_amax, config.num_kv_heads, options.percentile);
      entry.v_amax_percentile =
          head_percentile(amax.v_token_head_amax, config.num_kv_heads, options.percentile);
    }
    stats.layers.push_back(std::move(entry));
  }
  return stats;
}

std::vector<std::array<numerics::StaticAmax, 2>> session_scales(
    const std::vector<LayerScales>& scales, int num_layers) {
  // Indexed by layer: a hybrid's scales cover its attention layers only, the rest stay empty.
  std::vector<std::array<numerics::StaticAmax, 2>> result(static_cast<size_t>(num_layers));
  for (const LayerScales& layer : scales) {
    if (layer.layer < 0 || layer.layer >= num_layers)
      throw InputError("scales",
                       fmt::format("layer {} is outside 0..{}", layer.layer, num_layers - 1));
    result[size_t(layer.layer)] = {numerics::StaticAmax{{}, layer.k_scale},
                                   numerics::StaticAmax{{}, layer.v_scale}};
  }
  return result;
}

std::vector<LayerClipping> measure_clipping(const model::Model& model,
                                            std::span<const int32_t> tokens,
                                            const std::vector<LayerScales>& scales,
                                            Granularity granularity, const CollectOptions& options,
                                            ThreadPool& pool) {
  const std::string spec = granularity == Granularity::tensor ? "fp8_e4m3:tensor" : "fp8_e4m3:head";
  model::Session session(model, numerics::parse_kv_format(spec), pool,
                         session_scales(scales, model.config().num_layers));
  std::vector<float> unused;
  const int64_t chunk = std::min<int64_t>(
      options.chunk_tokens, std::max<int64_t>(1, model.config().max_position_embeddings));
  for (size_t first = 0; first < tokens.size(); first += size_t(chunk)) {
    session.reset();
    session.forward(tokens.subspan(first, std::min(tokens.size() - first, size_t(chunk))), chunk,
                    unused);
  }
  std::vector<LayerClipping> result;
  const auto& counts = session.layer_encode_counts();
  for (size_t layer = 0; layer < counts.size(); ++layer) {
    auto fraction = [](int64_t part, int64_t whole) {
      return whole > 0 ? double(part) / double(whole) : 0.0;
    };
    const numerics::EncodeCounts& k = counts[layer][0];
    const numerics::EncodeCounts& v = counts[layer][1];
    if (model.config().mixers[layer] != model::Mixer::attention) continue;  // no KV cache
    result.push_back({int(layer), fraction(k.saturated + k.became_nan, k.elements),
                      fraction(v.saturated + v.became_nan, v.elements),
                      fraction(k.flushed_to_zero, k.elements),
                      fraction(v.flushed_to_zero, v.elements)});
  }
  return result;
}

}  // namespace kvaudit::calibrate
