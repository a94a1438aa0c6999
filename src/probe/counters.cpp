// The servers' own counters, read from /metrics: speculative decoding's drafted and accepted
// tokens (vLLM's and llama-server's counters, SGLang's gauges), prompt tokens served from the
// cache and generated tokens, under the names the engine data gives. The load bench reads
// them around each level, watch at every poll.
#include <algorithm>
#include <cmath>

#include "probe/probe.h"
#include "util/util.h"

namespace kvaudit::probe {

// The speculative-decoding counters (vLLM's vllm:spec_decode_*, llama-server's
// llamacpp:spec_decode_*: the same suffixes), summed over labels, and the counters the
// engine data names; none when /metrics is absent or has none.
ServerCounters read_server_counters(net::Client& client, const CounterNames& names) {
  auto named = [&](const char* kind, const std::string& name) {
    auto it = names.find(kind);
    return it != names.end() &&
           std::find(it->second.begin(), it->second.end(), name) != it->second.end();
  };
  ServerCounters out;
  int rate_count = 0, length_count = 0;
  try {
    net::HttpResponse response = client.get("/metrics");
    if (response.status != 200) return out;
    for (const net::MetricSample& sample :
         net::parse_prometheus(response.body, client.where("/metrics"))) {
      // Every figure read here is a count or a rate, finite and >= 0: a NaN, an infinity
      // or a negative value (Prometheus text allows them) is a server misreporting, and
      // is left out rather than spread through the level's deltas and averages.
      if (!std::isfinite(sample.value) || sample.value < 0) continue;
      const std::string& name = sample.name;
      auto ends = [&](std::string_view suffix) {
        return name.size() >= suffix.size() &&
               name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0 &&
               name.find("spec_decode_num_") != std::string::npos;
      };
      if (ends("num_draft_tokens_total")) out.draft += sample.value, out.seen = true;
      if (ends("num_accepted_tokens_total")) out.accepted += sample.value, out.seen = true;
      if (ends("num_drafts_total")) out.drafts += sample.value, out.seen = true;
      // SGLang: gauges only (python/sglang/srt/metrics/collector.py,
      // SchedulerMetricsCollector, "mostrecent" over the decode log interval).
      auto average_into = [&](double& target, int& count) {
        target = (std::max(0.0, target) * count + sample.value) / (count + 1);
        ++count;
      };
      if (named("cached_tokens", name)) out.cached += sample.value, out.cached_seen = true;
      for (const char* kind : {"prefix_hit_tokens", "tier_hit_tokens", "cached_tokens"})
        if (named(kind, name)) out.hits[kind] += sample.value;
      if (named("spec_accept_rate", name)) average_into(out.accept_rate, rate_count);
      if (named("spec_accept_length", name)) average_into(out.accept_length, length_count);
      if (named("generated_tokens", name)) out.generated += sample.value, out.generated_seen = true;
    }
  } catch (const InputError&) {
    return ServerCounters{};
  }
  return out;
}

}  // namespace kvaudit::probe
