// Fuzzes the safetensors header parser: any bytes must give a header or an InputError, and the
// fast On-Demand reader must agree with the DOM reference (same tensors, or the same error).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "checkpoint/checkpoint.h"
#include "util/util.h"

namespace {

// The tensors read, or the error's problem: what the two readers must agree on.
template <class Parse>
std::string outcome(Parse&& parse) {
  try {
    auto parsed = parse();
    std::string out = "ok";
    for (const auto& [key, value] : parsed.metadata) out += "|" + key + "=" + value;
    for (const auto& tensor : parsed.tensors) {
      out += "|" + tensor.name + ":" + std::to_string(static_cast<int>(tensor.dtype));
      for (uint64_t dim : tensor.shape) out += "," + std::to_string(dim);
      out += ":" + std::to_string(tensor.data_begin) + "-" + std::to_string(tensor.data_end);
    }
    return out;
  } catch (const kvaudit::InputError& error) {
    return "error " + error.problem();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // First 4 bytes pick the data-section size so span checks get exercised both ways.
  if (size < 4) return 0;
  uint64_t data_bytes = uint64_t{data[0]} | uint64_t{data[1]} << 8 | uint64_t{data[2]} << 16 |
                        uint64_t{data[3]} << 24;
  std::string_view header(reinterpret_cast<const char*>(data + 4), size - 4);
  std::string fast = outcome([&] {
    auto parsed = kvaudit::checkpoint::parse_safetensors_header(header, data_bytes, "fuzz");
    for (const auto& tensor : parsed.tensors)
      if (tensor.data_end > data_bytes || tensor.data_begin > tensor.data_end) __builtin_trap();
    return parsed;
  });
  std::string reference = outcome([&] {
    return kvaudit::checkpoint::parse_safetensors_header_reference(header, data_bytes, "fuzz");
  });
  if (fast != reference) __builtin_trap();
  return 0;
}
