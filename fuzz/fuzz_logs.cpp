// Fuzzes the start-up log reader: the input is a log after one mode byte. An odd mode byte
// reads the ServerArgs repr alone; otherwise the whole text is scanned, and with bit 2 set
// the scan is also rendered as logs' JSON report. Invariants: no crash, no hang, every
// launch's line range inside the input, a repr never reports more fields than it had text
// for. (Rendering costs more than the scan; on every input it held the target to ~150
// inputs/s. The line-by-line reading kvaudit watch does is fuzz_log_stream's.)
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "logs/logs.h"
#include "util/util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  if (data[0] & 1) {
    kvaudit::logs::ReprResult r = kvaudit::logs::parse_python_repr(text);
    if (r.consumed > text.size()) __builtin_trap();
    if (r.complete && r.cuts != 0) __builtin_trap();
    return 0;
  }
  // The shipped engine data, read once for the whole run.
  static const kvaudit::engines::Registry registry =
      kvaudit::engines::Registry::load(kvaudit::data_dir());
  try {
    kvaudit::logs::LogScan scan = kvaudit::logs::scan_log_text(registry, text, "fuzz");
    for (const auto& launch : scan.launches) {
      if (launch.first_line < 1 || launch.last_line < launch.first_line) __builtin_trap();
      if (launch.last_line > scan.lines + 1) __builtin_trap();
    }
    if (data[0] & 4) (void)kvaudit::logs::to_report(scan, true, {});
  } catch (const kvaudit::InputError&) {
  }
  return 0;
}
