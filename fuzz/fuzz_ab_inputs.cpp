// Fuzzes what an A/B reads from outside: a server's answer to a tool-call round (the first
// JSON object in it, validated against the tool's schema), the --gate limits a user types,
// and a line of a --results file. The first byte picks the reader. Bad input must end in
// InputError or a failed check, never a crash, hang or other exception.
#include <cstddef>
#include <cstdint>
#include <string>

#include "eval/eval.h"
#include "probe/probe.h"
#include "util/util.h"

namespace {

// One real tool-call case, made once: its schema and an expected answer.
const kvaudit::eval::TaskCase& tool_case() {
  static const kvaudit::eval::TaskCase task = kvaudit::eval::make_toolcall_case(
      {2048, 1, 3, 1}, [](std::string_view text) { return int64_t((text.size() + 3) / 4); });
  return task;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  try {
    switch (data[0] % 3) {
      case 0: {
        const auto& task = tool_case();
        (void)kvaudit::eval::check_tool_call(task.schema, task.rounds[0].expected, text);
        break;
      }
      case 1:
        (void)kvaudit::probe::parse_gates(text);
        break;
      default: {
        auto doc = nlohmann::json::parse(text, nullptr, false);
        if (!doc.is_discarded()) (void)kvaudit::probe::record_from_json(doc, "fuzz.jsonl");
        break;
      }
    }
  } catch (const kvaudit::InputError&) {
  }
  return 0;
}
