// Test helpers: checkpoints generated from tests/fixtures/checkpoints/<name>/manifest.json
// (sparse shards with real headers) into the build folder, once per test binary run.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>

#include <unistd.h>

namespace kvaudit::testing {

inline std::filesystem::path fixture_source(const std::string& name) {
  return std::filesystem::path(KVAUDIT_TEST_DIR) / "fixtures" / "checkpoints" / name;
}

// Generates (if needed) and returns the folder of fixture checkpoint `name`.
inline std::filesystem::path fixture_checkpoint(const std::string& name) {
  namespace fs = std::filesystem;
  fs::path out = fs::path(KVAUDIT_BUILD_DIR) / "fixtures" / name;
  fs::path manifest = fixture_source(name) / "manifest.json";
  fs::path stamp = out / ".generated";
  std::error_code ec;
  auto fresh = [&] {
    std::error_code error;
    return fs::exists(stamp, error) &&
           fs::last_write_time(stamp, error) >= fs::last_write_time(manifest, error);
  };
  if (fresh()) return out;
  // ctest runs tests in parallel: build in a private folder, then rename into place.
  fs::path temp = out.string() + ".tmp" + std::to_string(::getpid());
  fs::remove_all(temp, ec);
  std::string command = std::string(KVAUDIT_MAKE_CHECKPOINT) + " '" + manifest.string() + "' '" +
                        temp.string() + "' > /dev/null";
  if (std::system(command.c_str()) != 0)
    throw std::runtime_error("cannot generate fixture " + name);
  if (std::FILE* file = std::fopen((temp / ".generated").c_str(), "w")) std::fclose(file);
  if (fresh()) {  // another process finished first
    fs::remove_all(temp, ec);
    return out;
  }
  fs::remove_all(out, ec);
  fs::rename(temp, out, ec);
  if (ec) fs::remove_all(temp, ec);  // another process won the race; its copy is identical
  return out;
}

// The build's demo checkpoint (the bundled Qwen3.5 example as sparse shards), made once,
// under a lock, by tools/ensure-demo-checkpoint.sh if a clean build lacks it.
inline std::filesystem::path demo_checkpoint() {
  const std::string command = std::string(KVAUDIT_TEST_DIR) +
                              "/../tools/ensure-demo-checkpoint.sh " + KVAUDIT_BUILD_DIR +
                              " > /dev/null";
  if (std::system(command.c_str()) != 0)
    throw std::runtime_error("cannot make the demo checkpoint: " + command);
  return std::filesystem::path(KVAUDIT_BUILD_DIR) / "demo-checkpoint";
}

}  // namespace kvaudit::testing
