// SGLang's --quantization-param-path JSON (see QuantParamFile in engines.h): the schema's
// checks, with pydantic's lax reading of integer keys.
#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <limits>

#include "engines/engines.h"
#include "util/util.h"

namespace kvaudit::engines {

namespace {

// pydantic's lax int parsing of a JSON object key ("0", " 1", "+2"); nullopt if not an int.
std::optional<int64_t> int_key(std::string_view key) {
  while (!key.empty() && key.front() == ' ') key.remove_prefix(1);
  while (!key.empty() && key.back() == ' ') key.remove_suffix(1);
  if (!key.empty() && key.front() == '+') key.remove_prefix(1);
  int64_t value = 0;
  auto [end, error] = std::from_chars(key.data(), key.data() + key.size(), value);
  if (key.empty() || error != std::errc() || end != key.data() + key.size()) return std::nullopt;
  return value;
}

}  // namespace

QuantParamFile parse_quant_param_file(const nlohmann::json& doc, const std::string& where) {
  auto fail = [&](const std::string& problem) { throw InputError(where, problem); };
  if (!doc.is_object()) fail("is not a JSON object");
  QuantParamFile file;
  if (auto type = doc.find("model_type"); type != doc.end() && type->is_string())
    file.model_type = type->get<std::string>();
  auto kv = doc.find("kv_cache");
  if (kv == doc.end() || !kv->is_object()) fail("has no \"kv_cache\" object");
  auto dtype = kv->find("dtype");
  if (dtype == kv->end() || !dtype->is_string() || dtype->get<std::string>() != "float8_e4m3fn")
    fail("kv_cache.dtype is not \"float8_e4m3fn\", the only dtype SGLang's loader accepts");
  auto factors = kv->find("scaling_factor");
  if (factors == kv->end() || !factors->is_object()) fail("has no kv_cache.scaling_factor object");
  for (const auto& [rank_key, layers] : factors->items()) {
    auto rank = int_key(rank_key);
    if (!rank || !layers.is_object())
      fail(fmt::format("kv_cache.scaling_factor[\"{}\"] is not a TP rank's object of layers",
                       rank_key));
    auto& scales = file.scales_by_rank[*rank];
    for (const auto& [layer_key, value] : layers.items()) {
      auto layer = int_key(layer_key);
      if (!layer)
        fail(fmt::format("scaling_factor[\"{}\"] names layer \"{}\", not an integer", rank_key,
                         layer_key));
      if (!value.is_number())
        fail(fmt::format("scaling_factor[\"{}\"][\"{}\"] is not a number", rank_key, layer_key));
      // As a float, as torch holds it; a double beyond float's range becomes an infinity
      // (the cast itself would be undefined), which the layer check then refuses.
      const double scale = value.get<double>();
      scales[*layer] = std::fabs(scale) <= std::numeric_limits<float>::max()
                           ? static_cast<float>(scale)
                           : std::copysign(std::numeric_limits<float>::infinity(), scale);
    }
  }
  return file;
}

std::vector<float> quant_param_layer_scales(const QuantParamFile& file, int64_t rank,
                                            int num_layers, const std::string& where) {
  auto found = file.scales_by_rank.find(rank);
  if (found == file.scales_by_rank.end())
    throw InputError(where,
                     fmt::format("kv_cache.scaling_factor has no entry for TP rank {}", rank));
  const auto& layers = found->second;
  if (static_cast<int64_t>(layers.size()) != num_layers)
    throw InputError(where, fmt::format("TP rank {} lists {} layers; the model has {}", rank,
                                        layers.size(), num_layers));
  std::vector<float> scales(static_cast<size_t>(num_layers), 1.0f);
  for (int layer = 0; layer < num_layers; ++layer) {
    auto it = layers.find(layer);
    if (it == layers.end())
      throw InputError(where, fmt::format("has no scaling factor for layer {}", layer));
    if (!(std::isfinite(it->second) && it->second > 0.0f))
      throw InputError(where, fmt::format("layer {} scaling factor {} is not positive and finite",
                                          layer, it->second));
    scales[static_cast<size_t>(layer)] = it->second;
  }
  return scales;
}

}  // namespace kvaudit::engines
