// What the CLI hands the audit as evidence: the published-damage table of the data folder,
// and K/V maxima measured on the model (calibrate's statistics format).
#include <algorithm>

#include "audit/audit.h"
#include "calibrate/calibrate.h"
#include "cli/commands.h"
#include "util/util.h"

namespace kvaudit::cli {

const engines::Registry& EngineData::registry() {
  if (!registry_) registry_.emplace(engines::Registry::load(data_dir()));
  return *registry_;
}

audit::PublishedEvidence load_published_damage(const engines::Registry& registry) {
  return audit::load_published_evidence(data_dir() / "evidence" / "kv_damage.json",
                                        registry.dtypes());
}

audit::MeasuredKvRange measured_range(const std::string& stats_file) {
  const calibrate::KvStats stats = calibrate::read_kv_stats(stats_file);
  audit::MeasuredKvRange out;
  out.source = display_path(stats_file);
  out.tokens = stats.tokens;
  for (const auto& layer : stats.layers) {
    audit::MeasuredKvRange::Layer row;
    row.layer = layer.layer;
    // The largest head decides whether a per-tensor scale clips.
    for (float value : layer.k_amax) row.k_amax = std::max(row.k_amax, value);
    for (float value : layer.v_amax) row.v_amax = std::max(row.v_amax, value);
    out.layers.push_back(row);
  }
  return out;
}

}  // namespace kvaudit::cli
