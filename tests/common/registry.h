// Test helper: the engine registry of the repository's data folder (or of
// $KVAUDIT_DATA_DIR), loaded once per test binary. Tests of what a data change does build
// their own with engines::Registry::load(other_folder).
#pragma once

#include "engines/engines.h"
#include "util/util.h"

namespace kvaudit::testing {

inline const engines::Registry& registry() {
  static const engines::Registry loaded = engines::Registry::load(data_dir());
  return loaded;
}

// One engine of it, as the CLI hands it to check (InputError for an unknown name).
inline const engines::EngineModel& engine(std::string_view name) {
  return registry().engine(name);
}

}  // namespace kvaudit::testing
