// Fuzzes the launch-command, systemd-unit and launch-file parsers: the input is a command
// line (first byte 0 mod 8), a unit file (odd), a TensorRT-LLM --config YAML file (first
// byte 2 mod 4, e.g. 0x02), or a launch file read by content (first byte 4 mod 8: Kubernetes
// manifests, compose files; 0x0c reads it as SGLang's --config file). Bad input must be an
// InputError, never a crash or hang.
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
    } else if ((data[0] & 7) == 4) {
      static const fs::path file =
          fs::temp_directory_path() / ("kvaudit-fuzz-launch-" + std::to_string(::getpid()));
      std::ofstream(file, std::ios::binary | std::ios::trunc) << text;
      const auto launches =
          kvaudit::engines::read_launch_file(registry, file, data[0] == 0x0c ? "sglang" : "");
      for (const auto& flags : launches) {
        if (flags.engine.empty()) __builtin_trap();
        // A place to write the KV dtype lies inside the file it names.
        if (flags.kv_dtype_edit && flags.kv_dtype_edit->file == file.string() &&
            flags.kv_dtype_edit->offset + flags.kv_dtype_edit->length > text.size())
          __builtin_trap();
      }
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
