// logs, the KV tiers a launch set up besides the GPU pool, as its start-up lines print them:
// SGLang's HiCache host pools (GB per rank, and tokens where the launch printed its device
// pool's size), vLLM's KV connector; and the host pool checked against the launch's own
// --hicache-size / --hicache-ratio (SGLang HostKVCache.__init__, data/engines/capacity/
// sglang.json references.host_pool).
#include <fmt/format.h>

#include <cmath>
#include <map>

#include "logs/parse.h"
#include "util/util.h"

namespace kvaudit::logs {

namespace {

using report::Severity;

// GB as SGLang divides host bytes (1e9), GiB as it divides device pool bytes (2^30).
constexpr double kBytesPerGb = 1e9;
constexpr double kBytesPerGib = 1073741824.0;

// The device pool's K+V bytes, as printed ("K size" + "V size", or MLA's "KV size"), and the
// half-unit of rounding each printed GiB figure carries.
struct DevicePool {
  double bytes = 0;
  double rounding_bytes = 0;
};
std::optional<DevicePool> device_pool(const Launch& launch) {
  const plan::LoggedMemory& m = launch.memory;
  if (m.k_gib && m.v_gib)
    return DevicePool{(*m.k_gib + *m.v_gib) * kBytesPerGib, 0.01 * kBytesPerGib};
  if (m.kv_gib) return DevicePool{*m.kv_gib * kBytesPerGib, 0.005 * kBytesPerGib};
  return std::nullopt;
}

std::optional<double> setting_number(const Launch& launch, const std::string& setting) {
  auto it = launch.tier_settings.find(setting);
  if (it == launch.tier_settings.end()) return std::nullopt;
  return parse_number(it->second);
}

// Bytes per token of the device pool: its printed size over its rows (SGLang's buffers hold
// #tokens + one page of padding rows).
std::optional<double> device_bytes_per_token(const Launch& launch) {
  auto pool = device_pool(launch);
  const auto& tokens = launch.memory.pool_tokens;
  if (!pool || !tokens || *tokens <= 0) return std::nullopt;
  return pool->bytes / static_cast<double>(*tokens + launch.memory.page_size.value_or(1));
}

}  // namespace

std::optional<HostPoolSummary> host_pool_summary(const Launch& launch) {
  const auto& lines = launch.tiers.host_pools;
  if (lines.empty()) return std::nullopt;
  std::map<std::string, std::pair<double, int>> by_rank;  // rank -> (GB, pools)
  for (const HostPoolLine& line : lines) {
    auto& [gb, pools] = by_rank[line.rank];
    gb += line.gb, ++pools;
  }
  HostPoolSummary out;
  const auto& first = by_rank.at(lines.front().rank);
  out.gb_per_rank = first.first;
  out.pools_per_rank = first.second;
  out.ranks = static_cast<int>(by_rank.size());
  for (const auto& [rank, figures] : by_rank)
    out.ranks_agree &=
        std::abs(figures.first - out.gb_per_rank) < 0.005 && figures.second == out.pools_per_rank;
  if (auto cell = device_bytes_per_token(launch); cell && *cell > 0)
    out.tokens_per_rank = static_cast<int64_t>(std::llround(out.gb_per_rank * kBytesPerGb / *cell));
  return out;
}

std::string tiers_text(const Launch& launch) {
  std::vector<std::string> parts;
  if (auto host = host_pool_summary(launch)) {
    std::string text = fmt::format("HiCache host pool {:.2f} GB per rank", host->gb_per_rank);
    if (host->pools_per_rank > 1) text += fmt::format(" ({} pools)", host->pools_per_rank);
    if (host->tokens_per_rank)
      text += fmt::format(", ~{} tokens", with_thousands(*host->tokens_per_rank));
    text += fmt::format(" x {} rank{}", host->ranks, host->ranks > 1 ? "s" : "");
    if (!host->ranks_agree) text += " (ranks differ)";
    parts.push_back(text);
  }
  if (!launch.tiers.kv_connector.empty())
    parts.push_back("KV connector " + launch.tiers.kv_connector);
  return fmt::format("{}", fmt::join(parts, "; "));
}

nlohmann::json tiers_json(const Launch& launch) {
  nlohmann::json out = {{"settings", launch.tier_settings}};
  if (auto host = host_pool_summary(launch)) {
    nlohmann::json lines = nlohmann::json::array();
    for (const HostPoolLine& line : launch.tiers.host_pools)
      lines.push_back({{"rank", line.rank}, {"gb", line.gb}, {"line", line.line}});
    out["host_pool"] = {
        {"gb_per_rank", host->gb_per_rank},
        {"pools_per_rank", host->pools_per_rank},
        {"ranks", host->ranks},
        {"ranks_agree", host->ranks_agree},
        {"tokens_per_rank",
         host->tokens_per_rank ? nlohmann::json(*host->tokens_per_rank) : nlohmann::json()},
        {"lines", lines}};
  }
  if (!launch.tiers.kv_connector.empty())
    out["kv_connector"] = {{"name", launch.tiers.kv_connector},
                           {"line", launch.tiers.connector_line}};
  return out;
}

// The host pool against what the launch asked for: --hicache-size GB per rank (summed over
// a rank's pools, as newer releases split it), else --hicache-ratio x the device pool's
// bytes (one pool per rank only); and against the device pool, which it must exceed.
void add_tier_findings(Launch& launch, const std::string& who) {
  auto host = host_pool_summary(launch);
  if (!host) return;
  const auto pool = device_pool(launch);
  const double cell = device_bytes_per_token(launch).value_or(0);
  const double page_bytes = cell * (launch.memory.page_size.value_or(1) + 1);
  const std::string printed = fmt::format("{:.2f} GB", host->gb_per_rank);
  const std::string first_line = fmt::format("log:{}", launch.tiers.host_pools.front().line);
  const std::string reference =
      "sgl-project/sglang mem_cache/pool_host/base.py HostKVCache.__init__ (older: "
      "memory_pool_host.py)";
  if (pool && host->pools_per_rank == 1 && host->gb_per_rank * kBytesPerGb <= pool->bytes)
    launch.findings.push_back(
        {"host-pool-not-larger",
         Severity::warning,
         fmt::format("{}: HiCache host pool ({}) is not larger than the device pool ({:.2f} GB)",
                     who, printed, pool->bytes / kBytesPerGb),
         "SGLang asserts the host pool is larger than the device pool ('The host memory should "
         "be larger than the device memory with the current protocol'); releases that only warn "
         "run with a host tier that cannot hold what the device pool evicts",
         {{first_line, "host pool", printed}},
         "raise --hicache-ratio above 1, or --hicache-size above the device pool's K+V size",
         reference});
  const bool enabled = launch.tier_settings.count("hierarchical_cache") > 0;
  const auto size_gb = setting_number(launch, "hicache_size_gb");
  const auto ratio = setting_number(launch, "hicache_ratio");
  if (!enabled) return;
  double expected = 0, tolerance = 0;
  std::string rule;
  if (size_gb && *size_gb > 0) {
    expected = *size_gb * kBytesPerGb;
    tolerance = 0.005 * kBytesPerGb * host->pools_per_rank + page_bytes;
    rule = fmt::format("--hicache-size {} GB per rank", *size_gb);
  } else if (ratio && pool && host->pools_per_rank == 1) {
    const double tokens = static_cast<double>(launch.memory.pool_tokens.value_or(0));
    const double rows = tokens + launch.memory.page_size.value_or(1);
    const double share = tokens > 0 ? tokens / rows : 1.0;  // the padding rows are not mirrored
    expected = *ratio * pool->bytes * share;
    tolerance = *ratio * pool->rounding_bytes + 0.005 * kBytesPerGb + page_bytes;
    rule = fmt::format("--hicache-ratio {} x the device pool's {:.2f} GB", *ratio,
                       pool->bytes * share / kBytesPerGb);
  } else {
    return;
  }
  const double actual = host->gb_per_rank * kBytesPerGb;
  if (std::abs(actual - expected) <= tolerance) return;
  launch.findings.push_back(
      {"host-pool-mismatch",
       Severity::info,
       fmt::format("{}: HiCache host pool {} per rank, {} gives {:.2f} GB", who, printed, rule,
                   expected / kBytesPerGb),
       "the host tier is not the size the launch asked for: another release's sizing rule, "
       "host pools split or duplicated across the KV, state or draft pools, or lines of "
       "another run",
       {{first_line, "host pool", printed},
        {"server_args", "tier settings",
         fmt::format("hicache_size={}, hicache_ratio={}",
                     size_gb ? fmt::format("{}", *size_gb) : "unset",
                     ratio ? fmt::format("{}", *ratio) : "unset")}},
       "compare with the release's HostKVCache sizing (kvaudit plan --from-log sizes the "
       "host pool the launch asked for)",
       reference});
}

}  // namespace kvaudit::logs
