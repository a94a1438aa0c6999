// Fuzzes the log as kvaudit watch reads it, line by line as it grows, against the same log
// read whole: the input is a log after one byte (ignored: the byte is fuzz_logs' mode, so
// the two targets share seeds). Invariants: no crash, no hang; once the whole read finds a
// launch, the watch's latest launch is that read's last one (same number, same resolved KV
// dtype), and its metrics render.
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
  static const kvaudit::engines::Registry registry =
      kvaudit::engines::Registry::load(kvaudit::data_dir());
  try {
    const kvaudit::logs::LogScan scan = kvaudit::logs::scan_log_text(registry, text, "fuzz");
    if (scan.launches.empty()) return 0;
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
  } catch (const kvaudit::InputError&) {
  }
  return 0;
}
