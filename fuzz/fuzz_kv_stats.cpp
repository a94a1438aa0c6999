// Fuzzes the statistics format calibrate reads from users (--from-stats,
// kvaudit-kv-stats/1 JSON) and the scale computation behind it. Anything malformed must end
// in InputError, never a crash; every scale produced must be positive and finite.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "calibrate/calibrate.h"
#include "util/util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  kvaudit::calibrate::ScaleOptions options;
  options.granularity =
      data[0] & 1 ? kvaudit::calibrate::Granularity::head : kvaudit::calibrate::Granularity::tensor;
  options.use_percentile = data[0] & 2;
  options.margin = 1.0 + (data[0] >> 4);
  std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  auto doc = nlohmann::json::parse(text, nullptr, false);
  if (doc.is_discarded()) return 0;
  try {
    auto stats = kvaudit::calibrate::kv_stats_from_json(doc, "fuzz");
    if (stats.layers.size() != static_cast<size_t>(stats.num_layers)) __builtin_trap();
    auto back = kvaudit::calibrate::kv_stats_from_json(kvaudit::calibrate::kv_stats_to_json(stats),
                                                       "again");
    if (back.layers.size() != stats.layers.size()) __builtin_trap();
    for (const auto& layer : kvaudit::calibrate::compute_scales(stats, options))
      for (const auto* scales : {&layer.k_scale, &layer.v_scale})
        for (float scale : *scales)
          if (!(scale > 0.0f) || !std::isfinite(scale)) __builtin_trap();
  } catch (const kvaudit::InputError&) {
  }
  return 0;
}
