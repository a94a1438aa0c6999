// calibrate scales: maxima -> FP8 E4M3 scales, their effect on the calibration text, and
// reading scales back from safetensors or SGLang's JSON.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "calibrate/calibrate.h"
#include "util/util.h"

namespace kvaudit::calibrate {

namespace {

using nlohmann::json;
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

std::vector<std::array<numerics::StaticAmax, 2>> session_scales(
    const std::vector<LayerScales>& scales) {
  std::vector<std::array<numerics::StaticAmax, 2>> result;
  for (const LayerScales& layer : scales)
    result.push_back(
        {numerics::StaticAmax{{}, layer.k_scale}, numerics::StaticAmax{{}, layer.v_scale}});
  return result;
}

std::vector<LayerClipping> measure_clipping(const model::Model& model,
                                            std::span<const int32_t> tokens,
                                            const std::vector<LayerScales>& scales,
                                            Granularity granularity,
                                            const CollectOptions& options) {
  const std::string spec = granularity == Granularity::tensor ? "fp8_e4m3:tensor" : "fp8_e4m3:head";
  model::ThreadPool pool(options.threads);
  model::Session session(model, numerics::parse_kv_format(spec), pool, session_scales(scales));
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
    result.push_back({int(layer), fraction(k.saturated + k.became_nan, k.elements),
                      fraction(v.saturated + v.became_nan, v.elements),
                      fraction(k.flushed_to_zero, k.elements),
                      fraction(v.flushed_to_zero, v.elements)});
  }
  return result;
}

namespace {

std::vector<LayerScales> load_param_path_json(const std::filesystem::path& file, int num_layers) {
  const std::string label = file.string();
  json doc = json::parse(read_text_file(file), nullptr, false);
  if (doc.is_discarded() || !doc.is_object()) throw InputError(label, "is not a JSON object");
  auto kv = doc.find("kv_cache");
  if (kv == doc.end() || !kv->is_object()) throw InputError(label, "has no \"kv_cache\" object");
  auto factors = kv->find("scaling_factor");
  if (factors == kv->end() || !factors->is_object())
    throw InputError(label, "has no kv_cache.scaling_factor object");
  auto rank = factors->find("0");
  if (rank == factors->end() || !rank->is_object())
    throw InputError(label, "kv_cache.scaling_factor has no entry for TP rank 0");
  std::vector<LayerScales> result(static_cast<size_t>(num_layers));
  std::vector<bool> seen(static_cast<size_t>(num_layers), false);
  for (auto it = rank->begin(); it != rank->end(); ++it) {
    char* end = nullptr;
    long layer = std::strtol(it.key().c_str(), &end, 10);
    if (it.key().empty() || *end != '\0' || layer < 0 || layer >= num_layers)
      throw InputError(label, fmt::format("scaling_factor[\"0\"] names layer \"{}\", outside 0..{}",
                                          it.key(), num_layers - 1));
    if (!it.value().is_number())
      throw InputError(label, fmt::format("layer {} scaling factor is not a number", layer));
    float scale = it.value().get<float>();
    if (!(scale > 0.0f) || !std::isfinite(scale))
      throw InputError(label, fmt::format("layer {} scaling factor {} is not positive and finite",
                                          layer, scale));
    result[size_t(layer)] = {int(layer), {scale}, {scale}, 0.0f, 0.0f};
    seen[size_t(layer)] = true;
  }
  for (int layer = 0; layer < num_layers; ++layer)
    if (!seen[size_t(layer)])
      throw InputError(label, fmt::format("has no scaling factor for layer {}", layer));
  return result;
}

}  // namespace

std::vector<LayerScales> load_scales(const std::filesystem::path& path, int num_layers,
                                     int num_kv_heads) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec)) throw InputError(path.string(), "does not exist");
  if (path.extension() == ".json") return load_param_path_json(path, num_layers);
  std::vector<fs::path> files;
  if (fs::is_directory(path, ec)) {
    for (const auto& entry : fs::directory_iterator(path, ec))
      if (entry.path().extension() == ".safetensors") files.push_back(entry.path());
    std::sort(files.begin(), files.end());
    if (files.empty()) throw InputError(path.string(), "holds no .safetensors file");
  } else {
    files.push_back(path);
  }
  std::map<int, std::array<std::vector<float>, 2>> found;  // layer -> {K, V}
  for (const fs::path& file : files) {
    checkpoint::SafetensorsHeader header = checkpoint::read_safetensors_header(file);
    for (const checkpoint::TensorInfo& tensor : header.tensors) {
      auto scale = checkpoint::classify_scale_tensor(tensor.name);
      if (!scale || scale->layer < 0) continue;
      std::vector<float> values = checkpoint::read_tensor_values(header, tensor);
      if (values.size() != 1 && values.size() != size_t(num_kv_heads))
        throw InputError(file.string(), fmt::format("{} has {} values; expected 1 or {} (KV heads)",
                                                    tensor.name, values.size(), num_kv_heads));
      for (float value : values)
        if (!(value > 0.0f) || !std::isfinite(value))
          throw InputError(file.string(), fmt::format("{} holds {}, not a positive finite scale",
                                                      tensor.name, value));
      if (scale->layer >= num_layers)
        throw InputError(file.string(), fmt::format("{} names layer {}, but the model has {}",
                                                    tensor.name, scale->layer, num_layers));
      auto& slot = found[scale->layer];
      if (scale->role != checkpoint::ScaleRole::v) slot[0] = values;
      if (scale->role != checkpoint::ScaleRole::k) slot[1] = values;
    }
  }
  std::vector<LayerScales> result;
  for (int layer = 0; layer < num_layers; ++layer) {
    auto it = found.find(layer);
    if (it == found.end() || it->second[0].empty() || it->second[1].empty())
      throw InputError(path.string(),
                       fmt::format("has no {} scale for layer {}",
                                   it == found.end() || it->second[0].empty() ? "K" : "V", layer));
    result.push_back({layer, it->second[0], it->second[1], 0.0f, 0.0f});
  }
  return result;
}

}  // namespace kvaudit::calibrate
