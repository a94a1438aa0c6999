// serve's prefix cache: SGLang's radix cache in the device pool, and HiCache's host tier
// behind it. Private to src/serve/.
//
// Finished requests leave their KV (prompt and generated tokens) in the device pool; a
// request that shares a prefix with one restores it and computes only the rest. When the
// pool is full the least recently used entries leave it: with the host tier on they are
// written to host memory first, and a later hit there loads them back into the pool. Both
// tiers count tokens, the device one against the pool's max_total_num_tokens.
//
// The host tier can be told to corrupt what it stores (a test switch, never on by default),
// so that `kvaudit probe --roundtrip` is proven to catch each corruption users reported:
// codes kept without their scales (SGLang's HiCache and FP4 block scales), and pages that
// come back in another layer's place (vLLM's persistent tier after a TP change).
#pragma once

#include <cstdint>
#include <list>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model/model.h"

namespace kvaudit::serve {

enum class CacheTier { device, host };
enum class HostTierFault { none, drop_scales, swap_layers };

// "none", "drop-scales", "swap-layers"; throws InputError("--fault-host-tier", ...) otherwise.
HostTierFault parse_host_tier_fault(std::string_view text);
const char* host_tier_fault_name(HostTierFault fault);

struct PrefixCacheOptions {
  bool enabled = true;        // --disable-radix-cache turns it off
  int64_t device_tokens = 0;  // the device pool, max_total_num_tokens
  bool host_tier = false;     // --enable-hierarchical-cache
  int64_t host_tokens = 0;    // the host pool
  HostTierFault fault = HostTierFault::none;
};

struct PrefixHit {
  int64_t tokens = 0;  // leading prompt tokens restored (0: computed from the start)
  CacheTier tier = CacheTier::device;
};

struct PrefixCacheCounters {
  int64_t queried_tokens = 0;       // prompt tokens looked up
  int64_t device_hit_tokens = 0;    // restored from the device pool
  int64_t host_hit_tokens = 0;      // restored from the host tier (then loaded back)
  int64_t host_written_tokens = 0;  // written to the host tier on eviction
  int64_t evicted_tokens = 0;       // left the device pool
  int64_t dropped_tokens = 0;       // left the last tier (gone)
  int64_t device_tokens = 0;        // held now
  int64_t host_tokens = 0;
};

class PrefixCache {
 public:
  explicit PrefixCache(PrefixCacheOptions options);

  // Restores into `session` (reset first) the longest cached prefix of `prompt`, at most
  // prompt.size() - 1 tokens (the last prompt token is always computed: its logits start
  // the generation). A host-tier hit is loaded back into the device pool.
  PrefixHit restore_longest(std::span<const int32_t> prompt, model::Session& session);
  // Keeps `snapshot` (the KV of `tokens`, snapshot.tokens == tokens.size()) in the device
  // pool, evicting the least recently used entries to make room. Entries it covers (their
  // tokens a prefix of these) are dropped from both tiers. Too large for the pool: not kept.
  void insert(std::vector<int32_t> tokens, model::KvSnapshot snapshot);

  PrefixCacheCounters counters() const;
  const PrefixCacheOptions& options() const { return options_; }

 private:
  struct Entry {
    std::vector<int32_t> tokens;
    model::KvSnapshot kv;
    CacheTier tier = CacheTier::device;
  };
  int64_t held(CacheTier tier) const;
  void make_room(CacheTier tier, int64_t tokens);
  model::KvSnapshot stored_on_host(model::KvSnapshot kv) const;

  PrefixCacheOptions options_;
  mutable std::mutex mutex_;
  std::list<Entry> entries_;  // most recently used first
  PrefixCacheCounters counters_;
};

}  // namespace kvaudit::serve
