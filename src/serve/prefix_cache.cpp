// serve's prefix cache (see prefix_cache.h).
#include "serve/prefix_cache.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "util/util.h"

namespace kvaudit::serve {

HostTierFault parse_host_tier_fault(std::string_view text) {
  if (text == "none") return HostTierFault::none;
  if (text == "drop-scales") return HostTierFault::drop_scales;
  if (text == "swap-layers") return HostTierFault::swap_layers;
  throw InputError("--fault-host-tier",
                   fmt::format("'{}' is not a fault: none, drop-scales or swap-layers", text));
}

const char* host_tier_fault_name(HostTierFault fault) {
  switch (fault) {
    case HostTierFault::drop_scales:
      return "drop-scales";
    case HostTierFault::swap_layers:
      return "swap-layers";
    case HostTierFault::none:
      break;
  }
  return "none";
}

PrefixCache::PrefixCache(PrefixCacheOptions options) : options_(options) {}

namespace {

size_t common_prefix(std::span<const int32_t> a, const std::vector<int32_t>& b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

}  // namespace

int64_t PrefixCache::held(CacheTier tier) const {
  int64_t tokens = 0;
  for (const auto& entry : entries_)
    if (entry.tier == tier) tokens += entry.kv.tokens;
  return tokens;
}

// What the host tier hands back for `kv`: the same pages, unless a fault is switched on.
model::KvSnapshot PrefixCache::stored_on_host(model::KvSnapshot kv) const {
  switch (options_.fault) {
    case HostTierFault::drop_scales:
      // The codes kept, the per-layer scales not: they read back as 1.0.
      for (auto& stream : kv.k) stream = stream.WithCalibration({});
      for (auto& stream : kv.v) stream = stream.WithCalibration({});
      break;
    case HostTierFault::swap_layers:
      // Every layer's pages come back in the next layer's place.
      if (kv.k.size() > 1) {
        std::rotate(kv.k.begin(), kv.k.begin() + 1, kv.k.end());
        std::rotate(kv.v.begin(), kv.v.begin() + 1, kv.v.end());
      }
      break;
    case HostTierFault::none:
      break;
  }
  return kv;
}

// Evicts least recently used entries of `tier` until `tokens` more fit. Device entries go
// to the host tier when it is on (written through stored_on_host), else they are dropped.
void PrefixCache::make_room(CacheTier tier, int64_t tokens) {
  const int64_t capacity =
      tier == CacheTier::device ? options_.device_tokens : options_.host_tokens;
  for (int64_t in_use = held(tier); in_use + tokens > capacity;) {
    // The least recently used entry of this tier (the list is most recent first).
    auto victim = entries_.end();
    for (auto it = entries_.begin(); it != entries_.end(); ++it)
      if (it->tier == tier) victim = it;
    if (victim == entries_.end()) return;
    Entry entry = std::move(*victim);
    entries_.erase(victim);
    in_use -= entry.kv.tokens;
    if (tier == CacheTier::device) counters_.evicted_tokens += entry.kv.tokens;
    if (tier == CacheTier::device && options_.host_tier &&
        entry.kv.tokens <= options_.host_tokens) {
      make_room(CacheTier::host, entry.kv.tokens);
      counters_.host_written_tokens += entry.kv.tokens;
      entry.kv = stored_on_host(std::move(entry.kv));
      entry.tier = CacheTier::host;
      entries_.push_front(std::move(entry));  // written now: the host tier's most recent
      continue;
    }
    counters_.dropped_tokens += entry.kv.tokens;
  }
}

PrefixHit PrefixCache::restore_longest(std::span<const int32_t> prompt, model::Session& session) {
  session.reset();
  PrefixHit hit;
  if (!options_.enabled || prompt.size() < 2) return hit;
  std::lock_guard<std::mutex> lock(mutex_);
  counters_.queried_tokens += static_cast<int64_t>(prompt.size());
  auto best = entries_.end();
  size_t best_tokens = 0;
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    const size_t shared = std::min(common_prefix(prompt, it->tokens), prompt.size() - 1);
    // Longer wins; on a tie the device copy (no load needed).
    if (shared > best_tokens || (shared == best_tokens && shared > 0 &&
                                 it->tier == CacheTier::device && best->tier == CacheTier::host)) {
      best = it;
      best_tokens = shared;
    }
  }
  if (best == entries_.end() || best_tokens == 0) return hit;
  hit.tokens = static_cast<int64_t>(best_tokens);
  hit.tier = best->tier;
  session.restore(best->kv);
  session.truncate(hit.tokens);
  if (best->tier == CacheTier::host) {
    counters_.host_hit_tokens += hit.tokens;
    // Loaded back: the entry moves to the device pool (as restored, faults included).
    Entry loaded = std::move(*best);
    entries_.erase(best);
    loaded.tier = CacheTier::device;
    make_room(CacheTier::device, loaded.kv.tokens);
    entries_.push_front(std::move(loaded));
  } else {
    counters_.device_hit_tokens += hit.tokens;
    entries_.splice(entries_.begin(), entries_, best);
  }
  return hit;
}

void PrefixCache::insert(std::vector<int32_t> tokens, model::KvSnapshot snapshot) {
  if (!options_.enabled || tokens.empty() || snapshot.tokens != int64_t(tokens.size())) return;
  if (snapshot.tokens > options_.device_tokens) return;
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = entries_.begin(); it != entries_.end();) {
    const size_t shared = common_prefix(tokens, it->tokens);
    if (shared == tokens.size() && it->tier == CacheTier::device) {
      // Already held (as part of a longer entry): only its recency changes.
      entries_.splice(entries_.begin(), entries_, it);
      return;
    }
    if (shared == it->tokens.size())
      it = entries_.erase(it);  // covered by the new entry
    else
      ++it;
  }
  make_room(CacheTier::device, snapshot.tokens);
  entries_.push_front(Entry{std::move(tokens), std::move(snapshot), CacheTier::device});
}

PrefixCacheCounters PrefixCache::counters() const {
  std::lock_guard<std::mutex> lock(mutex_);
  PrefixCacheCounters counters = counters_;
  counters.device_tokens = held(CacheTier::device);
  counters.host_tokens = held(CacheTier::host);
  return counters;
}

}  // namespace kvaudit::serve
