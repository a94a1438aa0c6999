// engines internals shared by the module's files. Private to src/engines/.
#pragma once

#include "engines/engines.h"
#include "util/json.h"

namespace kvaudit::engines {

// Compiles log.text into log.compiled and sets log.anchor; throws std::invalid_argument
// naming what is wrong with the template.
void compile_log_template(LogTemplate& log);

// The active ScopedEngineData's vocabulary and models (null when none is active).
extern const std::vector<KvDtype>* g_dtype_override;
extern const std::map<std::string, EngineModel>* g_model_override;

}  // namespace kvaudit::engines
