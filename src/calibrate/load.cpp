// calibrate scales: reading scales back from safetensors (any known naming convention) or
// SGLang's --quantization-param-path JSON.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "calibrate/calibrate.h"
#include "engines/engines.h"
#include "util/util.h"

namespace kvaudit::calibrate {

using nlohmann::json;

namespace {

// SGLang's --quantization-param-path JSON, read by engines/' reader of the format; TP rank
// 0's scales (calibrate writes the same scales for every rank).
std::vector<LayerScales> load_param_path_json(const std::filesystem::path& file, int num_layers) {
  const std::string label = file.string();
  const engines::QuantParamFile param =
      engines::parse_quant_param_file(json::parse(read_text_file(file), nullptr, false), label);
  const std::vector<float> scales = engines::quant_param_layer_scales(param, 0, num_layers, label);
  std::vector<LayerScales> result;
  result.reserve(scales.size());  // one scale a layer
  for (int layer = 0; layer < num_layers; ++layer)
    result.push_back({layer, {scales[size_t(layer)]}, {scales[size_t(layer)]}, 0.0f, 0.0f});
  return result;
}

}  // namespace

std::vector<LayerScales> load_scales(const std::filesystem::path& path, int num_layers,
                                     int num_kv_heads, const std::vector<int>& layers_without_kv) {
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
    if (std::find(layers_without_kv.begin(), layers_without_kv.end(), layer) !=
        layers_without_kv.end()) {
      result.push_back({layer, {}, {}, 0.0f, 0.0f});  // no KV cache in this layer
      continue;
    }
    if (it == found.end() || it->second[0].empty() || it->second[1].empty())
      throw InputError(path.string(),
                       fmt::format("has no {} scale for layer {}",
                                   it == found.end() || it->second[0].empty() ? "K" : "V", layer));
    result.push_back({layer, it->second[0], it->second[1], 0.0f, 0.0f});
  }
  return result;
}

}  // namespace kvaudit::calibrate
