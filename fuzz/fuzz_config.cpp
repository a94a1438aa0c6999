// Fuzzes config.json / hf_quant_config.json handling through the real reader: the
// input becomes a checkpoint folder's config.json (first byte picks hf_quant_config.json).
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "checkpoint/checkpoint.h"
#include "util/util.h"

namespace fs = std::filesystem;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const fs::path dir =
      fs::temp_directory_path() / ("kvaudit-fuzz-config-" + std::to_string(::getpid()));
  if (size < 1) return 0;
  fs::create_directories(dir);
  bool as_quant = data[0] & 1;
  std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  {
    std::ofstream config(dir / "config.json", std::ios::binary | std::ios::trunc);
    config
        << (as_quant
                ? R"({"model_type":"llama","num_hidden_layers":2,"hidden_size":64,"num_attention_heads":4})"
                : text);
  }
  std::error_code ec;
  if (as_quant)
    std::ofstream(dir / "hf_quant_config.json", std::ios::binary | std::ios::trunc) << text;
  else
    fs::remove(dir / "hf_quant_config.json", ec);
  try {
    kvaudit::checkpoint::ReadOptions options;
    options.read_safetensors = false;
    auto facts = kvaudit::checkpoint::read_checkpoint(dir, options);
    if (facts.layers.size() != static_cast<size_t>(facts.num_layers)) __builtin_trap();
  } catch (const kvaudit::InputError&) {
  }
  return 0;
}
