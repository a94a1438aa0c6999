// Fuzzes the start-up log reader: the input is a log (first byte picks how it is fed: a
// whole text, the ServerArgs repr alone (odd), or also line by line as kvaudit watch reads
// it (2 mod 4)). Invariants: no crash, no hang, every launch's line range inside the input,
// a repr never reports more fields than it had text for, and the watch's latest launch is
// the whole read's.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "logs/logs.h"
#include "util/util.h"
#include "watch/watch.h"

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
    (void)kvaudit::logs::to_report(scan, true, {});
    if ((data[0] & 3) == 2 && !scan.launches.empty()) {
      kvaudit::watch::LogWatcher watcher(registry, "fuzz", {});
      kvaudit::watch::LineSplitter lines(1 << 20);
      auto add = [&](std::string_view line) { watcher.add_line(line, 0); };
      lines.feed(text, add);
      lines.flush(add);
      const kvaudit::logs::Launch& last = scan.launches.back();
      const auto& latest = watcher.state().latest;
      if (!latest || latest->number != last.index + 1 ||
          latest->kv_resolved != last.kv_cache_dtype_resolved)
        __builtin_trap();
      (void)kvaudit::watch::render_metrics(watcher.state());
    }
  } catch (const kvaudit::InputError&) {
  }
  return 0;
}
