// SGLang's --quantization-param-path file: {"model_type": ..., "kv_cache": {"dtype":
// "float8_e4m3fn", "scaling_factor": {tp_rank: {layer: scale}}}}, read for TP rank 0 with
// the checks SGLang's kv_cache_scales_loader (model_loader/weight_utils.py, pydantic
// QuantParamSchema) makes. Any failure is logged the way SGLang logs it and leaves the scales
// where they were: SGLang keeps serving, so does serve.
#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>

#include "serve/serve.h"
#include "util/util.h"

namespace kvaudit::serve {

namespace {

// pydantic's lax int parsing of a JSON object key ("0", " 1", "+2"); nullopt if not an int.
std::optional<int64_t> int_key(std::string key) {
  while (!key.empty() && key.front() == ' ') key.erase(key.begin());
  while (!key.empty() && key.back() == ' ') key.pop_back();
  if (!key.empty() && key.front() == '+') key.erase(key.begin());
  int64_t value = 0;
  auto [end, error] = std::from_chars(key.data(), key.data() + key.size(), value);
  if (error != std::errc() || end != key.data() + key.size() || key.empty()) return std::nullopt;
  return value;
}

// Validates and extracts rank 0's per-layer scales; throws std::runtime_error on a schema
// problem (the caller logs SGLang's generic message for it).
std::vector<float> validate(const nlohmann::json& doc, const std::string& model_type,
                            int num_layers) {
  auto fail = [](const std::string& why) { throw std::runtime_error(why); };
  if (!doc.is_object() || !doc.contains("kv_cache")) fail("no kv_cache");
  const auto& model_type_field = doc.value("model_type", nlohmann::json());
  if (!model_type.empty() &&
      !(model_type_field.is_string() && model_type_field.get<std::string>() == model_type))
    fail("model type differs");
  const auto& kv = doc["kv_cache"];
  if (!kv.is_object() || !kv.contains("dtype") || !kv["dtype"].is_string() ||
      kv["dtype"].get<std::string>() != "float8_e4m3fn")
    fail("dtype is not float8_e4m3fn");
  if (!kv.contains("scaling_factor") || !kv["scaling_factor"].is_object())
    fail("no scaling_factor");
  std::map<int64_t, std::map<int64_t, float>> ranks;
  for (const auto& [rank_key, layers] : kv["scaling_factor"].items()) {
    auto rank = int_key(rank_key);
    if (!rank || !layers.is_object()) fail("bad rank entry");
    auto& map = ranks[*rank];
    for (const auto& [layer_key, value] : layers.items()) {
      auto layer = int_key(layer_key);
      if (!layer || !value.is_number()) fail("bad layer entry");
      map[*layer] = value.get<float>();
    }
  }
  const int tp_size = 1;
  if (static_cast<int>(ranks.size()) != tp_size) fail("TP size differs");
  if (!ranks.count(0)) fail("rank 0 missing");
  for (const auto& [rank, layers] : ranks)
    if (static_cast<int>(layers.size()) != num_layers) fail("layer count differs");
  std::vector<float> scales(num_layers, 1.0f);
  for (int layer = 0; layer < num_layers; ++layer) {
    auto it = ranks[0].find(layer);
    if (it == ranks[0].end()) fail("layer missing");
    // Stricter than SGLang, which would divide by a zero or negative scale: refuse those.
    if (!(std::isfinite(it->second) && it->second > 0.0f)) fail("non-positive scale");
    scales[layer] = it->second;
  }
  return scales;
}

}  // namespace

std::optional<std::vector<float>> read_quantization_param_file(const std::filesystem::path& path,
                                                               const std::string& model_type,
                                                               int num_layers,
                                                               std::vector<LogLine>& messages) {
  const std::string name = path.string();
  std::optional<std::string> error;
  std::vector<float> scales;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    error = fmt::format("File or directory '{}' not found.", name);
  } else {
    std::string text;
    try {
      text = read_text_file(path, 64ull << 20);
    } catch (const InputError&) {
      error = fmt::format("An error occurred while reading '{}'.", name);
    }
    if (!error) {
      nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
      if (doc.is_discarded()) {
        error = fmt::format("Error decoding JSON in file '{}'.", name);
      } else {
        try {
          scales = validate(doc, model_type, num_layers);
        } catch (const std::exception&) {
          error = fmt::format("An error occurred while reading '{}'.", name);
        }
      }
    }
  }
  if (error) {
    messages.push_back({"ERROR", *error});
    messages.push_back({"WARNING",
                        "Defaulting to KV cache scaling factors = 1.0 for all layers in TP rank 0 "
                        "as an error occurred during loading."});
    return std::nullopt;
  }
  return scales;
}

}  // namespace kvaudit::serve
