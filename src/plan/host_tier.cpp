// plan, the host tier: SGLang's HiCache host pool per rank (HostKVCache.__init__; the
// constants and their source in data/engines/capacity/sglang.json, references.host_pool).
// One host pool mirrors each rank's device pool at its bytes per token: --hicache-size GB
// (1e9 bytes) of it when given, else --hicache-ratio x the device pool's tokens.
#include <fmt/format.h>

#include <cmath>
#include <cstdlib>

#include "plan/plan.h"
#include "util/util.h"

namespace kvaudit::plan {

namespace {

constexpr double kBytesPerGb = 1e9;  // SGLang sizes and prints the host pool in 1e9 bytes

// A number setting as the launch wrote it ("2", "0.5", "120"); unset when absent or not a
// finite number.
std::optional<double> tier_number(const PlanOptions& options, const std::string& setting) {
  auto it = options.tier_settings.find(setting);
  if (it == options.tier_settings.end()) return std::nullopt;
  char* end = nullptr;
  const double value = std::strtod(it->second.c_str(), &end);
  if (end == it->second.c_str() || *end != '\0' || !std::isfinite(value)) return std::nullopt;
  return value;
}

std::string gb_text(double bytes) {
  return fmt::format("{:.2f} GB", bytes / kBytesPerGb);
}

// The finding when a row's host pool would not exceed its device pool.
report::Finding not_larger_finding(const PlanRow& row, const std::string& sizing,
                                   const std::string& reference) {
  return {"host-pool-not-larger",
          report::Severity::warning,
          fmt::format("{}: HiCache host pool of {} tokens is not larger than the device pool of "
                      "{} tokens",
                      row.kv_cache_dtype, with_thousands(row.host_pool_tokens),
                      with_thousands(row.max_total_tokens)),
          "SGLang asserts the host pool is larger than the device pool and does not start ('The "
          "host memory should be larger than the device memory with the current protocol'); "
          "releases that only warn run with a host tier that cannot hold what the device pool "
          "evicts",
          {{"plan", "host pool", sizing},
           {"plan", "device pool", with_thousands(row.max_total_tokens) + " tokens"}},
          "raise --hicache-ratio above 1, or --hicache-size above the device pool's bytes",
          reference};
}

}  // namespace

void add_host_tier(const engines::EngineModel& engine, const PlanOptions& options,
                   CapacityPlan& plan) {
  const engines::CapacityData& capacity = engine.capacity;
  auto enabled = options.tier_settings.find("hierarchical_cache");
  if (capacity.host_pool_default_ratio <= 0 || enabled == options.tier_settings.end() ||
      enabled->second != "true")
    return;
  const auto size_gb = tier_number(options, "hicache_size_gb");
  const auto ratio_given = tier_number(options, "hicache_ratio");
  const double ratio = ratio_given.value_or(capacity.host_pool_default_ratio);
  const bool by_size = size_gb && *size_gb > 0;
  const std::string reference =
      "sgl-project/sglang mem_cache/pool_host/base.py HostKVCache.__init__ (older: "
      "memory_pool_host.py); data/engines/capacity/sglang.json references.host_pool";
  int64_t largest_bytes = 0;
  for (PlanRow& row : plan.rows) {
    const int64_t cell = row.cell_bytes_per_token_per_gpu;
    if (cell <= 0) continue;
    std::string sizing;
    if (by_size) {
      row.host_pool_tokens = static_cast<int64_t>(std::floor(*size_gb * kBytesPerGb / cell));
      sizing = fmt::format("--hicache-size {} GB: {} x 1e9 B // {} B/token = {} tokens", *size_gb,
                           *size_gb, cell, row.host_pool_tokens);
    } else if (row.max_total_tokens > 0) {
      row.host_pool_tokens =
          static_cast<int64_t>(std::floor(static_cast<double>(row.max_total_tokens) * ratio));
      sizing = fmt::format("--hicache-ratio {}{}: {} device tokens x {} = {} tokens", ratio,
                           ratio_given ? "" : " (default)", row.max_total_tokens, ratio,
                           row.host_pool_tokens);
    } else {
      continue;  // the ratio needs the device pool, which needs the GPU's memory
    }
    row.host_pool_bytes = row.host_pool_tokens * cell;
    largest_bytes = std::max(largest_bytes, row.host_pool_bytes);
    row.derivation.push_back(fmt::format(
        "host pool (HiCache, per rank): {}; x {} B/token = {} B ({}, as SGLang prints it); "
        "aligned to the page by the engine (one page either way, by release)",
        sizing, cell, row.host_pool_bytes, gb_text(static_cast<double>(row.host_pool_bytes))));
    if (row.max_total_tokens > 0 && row.host_pool_tokens <= row.max_total_tokens)
      plan.findings.push_back(not_larger_finding(row, sizing, reference));
  }
  if (largest_bytes == 0) {
    plan.notes.push_back(
        "HiCache host pool: --hicache-ratio sizes it from the device pool, which needs the "
        "GPU's memory (--gpu or --gpu-mem)");
    return;
  }
  const int ranks = options.parallel.tp * options.parallel.pp;
  plan.notes.push_back(fmt::format(
      "HiCache host pool: up to {} per rank, {} over the launch's {} rank{}: it must fit in "
      "host RAM; SGLang refuses to start when a rank's pool exceeds the host's available "
      "memory less {} ('Not enough host memory available', checked by each rank as it "
      "allocates)",
      gb_text(static_cast<double>(largest_bytes)),
      gb_text(static_cast<double>(largest_bytes) * ranks), ranks, ranks > 1 ? "s" : "",
      fmt::format("{:.0f} GiB", static_cast<double>(capacity.host_pool_reserve_bytes) / kGiB)));
}

}  // namespace kvaudit::plan
