// calibrate stats: K/V maxima per layer and head, from the reference engine or a file.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "calibrate/calibrate.h"
#include "util/util.h"

namespace kvaudit::calibrate {

namespace {

using nlohmann::json;

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

std::vector<float> float_list(const json& value, const std::string& label, const std::string& key,
                              size_t expected) {
  std::vector<float> result;
  if (value.is_number()) {
    result.push_back(value.get<float>());
  } else if (value.is_array()) {
    for (const json& item : value) {
      if (!item.is_number()) throw InputError(label, fmt::format("{} holds a non-number", key));
      result.push_back(item.get<float>());
    }
    if (result.size() != expected)
      throw InputError(label, fmt::format("{} has {} values, expected {} (one per KV head)", key,
                                          result.size(), expected));
  } else {
    throw InputError(label, fmt::format("{} must be a number or a list of numbers", key));
  }
  for (float amax : result)
    if (!std::isfinite(amax) || amax < 0.0f)
      throw InputError(label, fmt::format("{} holds {}, not a finite maximum >= 0", key, amax));
  return result;
}

}  // namespace

KvStats collect_kv_stats(const model::Model& model, std::span<const int32_t> tokens,
                         const CollectOptions& options) {
  const model::ModelConfig& config = model.config();
  if (tokens.empty()) throw InputError("--text", "the calibration text holds no tokens");
  if (options.chunk_tokens < 1) throw InputError("--ctx", "must be at least 1 token");
  if (!(options.percentile > 0.0 && options.percentile <= 100.0))
    throw InputError("--percentile", "must lie in (0, 100]");
  model::ThreadPool pool(options.threads);
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

json kv_stats_to_json(const KvStats& stats) {
  json layers = json::array();
  for (const LayerKvStats& layer : stats.layers) {
    json entry = {{"layer", layer.layer}, {"k_amax", layer.k_amax}, {"v_amax", layer.v_amax}};
    if (!layer.k_amax_percentile.empty()) {
      entry["k_amax_percentile"] = layer.k_amax_percentile;
      entry["v_amax_percentile"] = layer.v_amax_percentile;
    }
    layers.push_back(std::move(entry));
  }
  return {{"format", "kvaudit-kv-stats/1"}, {"source", stats.source},
          {"num_layers", stats.num_layers}, {"num_kv_heads", stats.num_kv_heads},
          {"tokens", stats.tokens},         {"percentile", stats.percentile},
          {"layers", std::move(layers)}};
}

KvStats kv_stats_from_json(const json& doc, const std::string& label) {
  if (!doc.is_object()) throw InputError(label, "expected a JSON object");
  auto format = doc.find("format");
  if (format == doc.end() || !format->is_string() || *format != "kvaudit-kv-stats/1")
    throw InputError(label, "\"format\" must be \"kvaudit-kv-stats/1\"");
  KvStats stats;
  auto source = doc.find("source");
  stats.source = source != doc.end() && source->is_string() && !source->get<std::string>().empty()
                     ? source->get<std::string>()
                     : label;
  auto positive_int = [&](const char* key) {
    auto it = doc.find(key);
    if (it == doc.end() || !it->is_number_integer() || it->get<int64_t>() < 1 ||
        it->get<int64_t>() > 100000)
      throw InputError(label, fmt::format("\"{}\" must be a positive integer", key));
    return int(it->get<int64_t>());
  };
  stats.num_layers = positive_int("num_layers");
  stats.num_kv_heads = positive_int("num_kv_heads");
  if (auto it = doc.find("tokens"); it != doc.end() && it->is_number_integer())
    stats.tokens = it->get<int64_t>();
  if (auto it = doc.find("percentile"); it != doc.end()) {
    if (!it->is_number() || !(it->get<double>() > 0.0 && it->get<double>() <= 100.0))
      throw InputError(label, "\"percentile\" must lie in (0, 100]");
    stats.percentile = it->get<double>();
  }
  auto layers = doc.find("layers");
  if (layers == doc.end() || !layers->is_array())
    throw InputError(label, "\"layers\" must be a list");
  std::vector<bool> seen(size_t(stats.num_layers), false);
  const size_t heads = size_t(stats.num_kv_heads);
  for (const json& item : *layers) {
    if (!item.is_object()) throw InputError(label, "each entry of \"layers\" must be an object");
    auto index = item.find("layer");
    if (index == item.end() || !index->is_number_integer())
      throw InputError(label, "a layer entry has no integer \"layer\"");
    int64_t layer = index->get<int64_t>();
    if (layer < 0 || layer >= stats.num_layers)
      throw InputError(label,
                       fmt::format("layer {} is outside 0..{}", layer, stats.num_layers - 1));
    if (seen[size_t(layer)]) throw InputError(label, fmt::format("layer {} appears twice", layer));
    seen[size_t(layer)] = true;
    LayerKvStats entry;
    entry.layer = int(layer);
    for (const char* key : {"k_amax", "v_amax"})
      if (!item.contains(key))
        throw InputError(label, fmt::format("layer {} has no \"{}\"", layer, key));
    entry.k_amax = float_list(item["k_amax"], label, fmt::format("layer {} k_amax", layer), heads);
    entry.v_amax = float_list(item["v_amax"], label, fmt::format("layer {} v_amax", layer), heads);
    if (item.contains("k_amax_percentile") || item.contains("v_amax_percentile")) {
      if (!item.contains("k_amax_percentile") || !item.contains("v_amax_percentile"))
        throw InputError(label, fmt::format("layer {} has only one of k/v_amax_percentile", layer));
      entry.k_amax_percentile = float_list(item["k_amax_percentile"], label,
                                           fmt::format("layer {} k_amax_percentile", layer), heads);
      entry.v_amax_percentile = float_list(item["v_amax_percentile"], label,
                                           fmt::format("layer {} v_amax_percentile", layer), heads);
    }
    stats.layers.push_back(std::move(entry));
  }
  for (int layer = 0; layer < stats.num_layers; ++layer)
    if (!seen[size_t(layer)]) throw InputError(label, fmt::format("layer {} is missing", layer));
  std::sort(stats.layers.begin(), stats.layers.end(),
            [](const LayerKvStats& a, const LayerKvStats& b) { return a.layer < b.layer; });
  return stats;
}

KvStats read_kv_stats(const std::filesystem::path& file) {
  const std::string text = read_text_file(file);
  json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) throw InputError(file.string(), "is not valid JSON");
  return kv_stats_from_json(doc, file.string());
}

}  // namespace kvaudit::calibrate
