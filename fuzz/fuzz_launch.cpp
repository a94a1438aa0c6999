// Fuzzes the launch-command, systemd-unit and launch-config parsers: the input is a command
// line (first byte 0 mod 4, or 2), a unit file (odd), or a TensorRT-LLM --config YAML file
// (first byte 2 mod 4, e.g. 0x02). Bad input must be an InputError, never a crash or hang.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "engines/engines.h"
#include "util/util.h"

namespace fs = std::filesystem;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  // The shipped engine data, read once for the whole run.
  static const kvaudit::engines::Registry registry =
      kvaudit::engines::Registry::load(kvaudit::data_dir());
  try {
    if ((data[0] & 3) == 2) {
      static const fs::path yaml =
          fs::temp_directory_path() / ("kvaudit-fuzz-config-" + std::to_string(::getpid()));
      std::ofstream(yaml, std::ios::binary | std::ios::trunc) << text;
      kvaudit::engines::LaunchFlags flags = kvaudit::engines::parse_launch_command(
          registry, "trtllm-serve /m --config " + yaml.string(), "fuzz");
      if (flags.engine != "trtllm") __builtin_trap();
    } else if (data[0] & 1) {
      static const fs::path unit =
          fs::temp_directory_path() / ("kvaudit-fuzz-unit-" + std::to_string(::getpid()));
      std::ofstream(unit, std::ios::binary | std::ios::trunc) << text;
      kvaudit::engines::LaunchFlags flags = kvaudit::engines::parse_systemd_unit(registry, unit);
      if (flags.engine.empty()) __builtin_trap();  // a parse that succeeds names its engine
    } else {
      kvaudit::engines::LaunchFlags flags =
          kvaudit::engines::parse_launch_command(registry, text, "fuzz");
      if (flags.engine.empty()) __builtin_trap();
    }
  } catch (const kvaudit::InputError&) {
  }
  return 0;
}
