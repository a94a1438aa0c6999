// calibrate stats: the statistics file format and maxima -> scales. Pure functions of their
// inputs (no model, no files beyond reading one), so the fuzzer builds them alone.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "calibrate/calibrate.h"
#include "util/util.h"

namespace kvaudit::calibrate {

namespace {

using nlohmann::json;

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
  return {{"format", "kvaudit-kv-stats/1"},
          {"source", stats.source},
          {"num_layers", stats.num_layers},
          {"num_kv_heads", stats.num_kv_heads},
          {"tokens", stats.tokens},
          {"percentile", stats.percentile},
          {"layers_without_kv", stats.layers_without_kv},
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
  std::vector<bool> seen(size_t(stats.num_layers), false);
  if (auto it = doc.find("layers_without_kv"); it != doc.end()) {
    if (!it->is_array()) throw InputError(label, "\"layers_without_kv\" must be a list");
    for (const json& item : *it) {
      if (!item.is_number_integer() || item.get<int64_t>() < 0 ||
          item.get<int64_t>() >= stats.num_layers)
        throw InputError(label, fmt::format("\"layers_without_kv\" entries must be layers "
                                            "0..{}",
                                            stats.num_layers - 1));
      stats.layers_without_kv.push_back(int(item.get<int64_t>()));
      seen[size_t(item.get<int64_t>())] = true;  // must not appear in "layers" as well
    }
  }
  auto layers = doc.find("layers");
  if (layers == doc.end() || !layers->is_array())
    throw InputError(label, "\"layers\" must be a list");
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

namespace {

constexpr double kE4m3Max = 448.0;

// amax * margin / 448, rounded to float and nudged up where rounding went down: the codec
// divides by the scale in float, and amax / scale must not land above 448 (it would count as
// saturated on the very text it was calibrated on).
float scale_of(float amax, double margin) {
  float scale = float(double(amax) * margin / kE4m3Max);
  while (scale > 0.0f && amax / scale > float(kE4m3Max))
    scale = std::nextafter(scale, std::numeric_limits<float>::infinity());
  return scale;
}

std::vector<float> scales_for(const std::vector<float>& amax, Granularity granularity,
                              double margin, int layer, char role) {
  if (granularity == Granularity::head && amax.size() == 1)
    throw InputError("--granularity head",
                     fmt::format("layer {} {} has one per-tensor maximum; per-head scales need "
                                 "per-head maxima",
                                 layer, role));
  std::vector<float> result;
  if (granularity == Granularity::tensor) {
    result.push_back(scale_of(*std::max_element(amax.begin(), amax.end()), margin));
  } else {
    for (float head : amax) result.push_back(scale_of(head, margin));
  }
  for (float scale : result)
    if (!(scale > 0.0f) || !std::isfinite(scale))
      throw InputError("calibration",
                       fmt::format("layer {} {}: maximum 0 (the layer never produced a non-zero "
                                   "value on the calibration text), so no scale can be derived",
                                   layer, role));
  return result;
}

}  // namespace

std::vector<LayerScales> compute_scales(const KvStats& stats, const ScaleOptions& options) {
  if (!(options.margin >= 1.0 && options.margin <= 16.0))
    throw InputError("--margin", "must lie in [1, 16]");
  std::vector<LayerScales> result;
  for (const LayerKvStats& layer : stats.layers) {
    const bool percentile = options.use_percentile;
    if (percentile && layer.k_amax_percentile.empty())
      throw InputError("--percentile",
                       fmt::format("the statistics ({}) hold no percentile maxima", stats.source));
    const auto& k = percentile ? layer.k_amax_percentile : layer.k_amax;
    const auto& v = percentile ? layer.v_amax_percentile : layer.v_amax;
    LayerScales scales;
    scales.layer = layer.layer;
    scales.k_scale = scales_for(k, options.granularity, options.margin, layer.layer, 'K');
    scales.v_scale = scales_for(v, options.granularity, options.margin, layer.layer, 'V');
    scales.k_amax = *std::max_element(k.begin(), k.end());
    scales.v_amax = *std::max_element(v.begin(), v.end());
    result.push_back(std::move(scales));
  }
  return result;
}

}  // namespace kvaudit::calibrate
