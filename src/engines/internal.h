// engines internals shared by the module's files. Private to src/engines/.
#pragma once

#include "engines/engines.h"
#include "util/json.h"

namespace kvaudit::engines {

// Compiles log.text into log.compiled and sets log.anchor; throws std::invalid_argument
// naming what is wrong with the template.
void compile_log_template(LogTemplate& log);

}  // namespace kvaudit::engines
