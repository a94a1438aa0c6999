// SGLang's --quantization-param-path file, read for TP rank 0 by engines/' reader of the
// format plus the checks the loader makes against the launch (the model's type, the TP size).
// Any failure is logged the way SGLang logs it and leaves the scales where they were: SGLang
// keeps serving, so does serve.
#include <fmt/format.h>

#include "serve/serve.h"
#include "util/util.h"

namespace kvaudit::serve {

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
          const engines::QuantParamFile file = engines::parse_quant_param_file(doc, name);
          if (!model_type.empty() && file.model_type != model_type)
            throw InputError(name, "model type differs");
          const size_t tp_size = 1;
          if (file.scales_by_rank.size() != tp_size) throw InputError(name, "TP size differs");
          scales = engines::quant_param_layer_scales(file, 0, num_layers, name);
        } catch (const InputError&) {
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
