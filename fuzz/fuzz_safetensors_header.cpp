// Fuzzes the safetensors header parser: any bytes must give a header or an InputError.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "checkpoint/checkpoint.h"
#include "util/util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // First 4 bytes pick the data-section size so span checks get exercised both ways.
  if (size < 4) return 0;
  uint64_t data_bytes = uint64_t{data[0]} | uint64_t{data[1]} << 8 | uint64_t{data[2]} << 16 |
                        uint64_t{data[3]} << 24;
  std::string_view header(reinterpret_cast<const char*>(data + 4), size - 4);
  try {
    auto parsed = kvaudit::checkpoint::parse_safetensors_header(header, data_bytes, "fuzz");
    for (const auto& tensor : parsed.tensors)
      if (tensor.data_end > data_bytes || tensor.data_begin > tensor.data_end) __builtin_trap();
  } catch (const kvaudit::InputError&) {
  }
  return 0;
}
