// One level of the load ladder: `concurrency` workers send whole sessions (a session's turns
// in order, each after the answer to the one before) inside the run's budget; the level's
// throughput, latency percentiles (nearest rank) and prompt-cache and speculative counts, from
// the answers or the servers' counter deltas; and the key that names a level in the results
// file.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <thread>

#include "loadbench/internal.h"
#include "util/util.h"

namespace kvaudit::loadbench {

using nlohmann::json;

LatencySummary summarize_latency(std::vector<double> seconds) {
  LatencySummary out;
  out.count = static_cast<int64_t>(seconds.size());
  if (seconds.empty()) return out;
  std::sort(seconds.begin(), seconds.end());
  double sum = 0.0;
  for (double s : seconds) sum += s;
  out.mean = sum / static_cast<double>(seconds.size());
  auto rank = [&](double fraction) {
    size_t index = static_cast<size_t>(std::ceil(fraction * static_cast<double>(seconds.size())));
    return seconds[std::clamp<size_t>(index, 1, seconds.size()) - 1];
  };
  out.p50 = rank(0.50);
  out.p90 = rank(0.90);
  out.p99 = rank(0.99);
  return out;
}

std::string level_key(const LoadLevel& level, const LoadOptions& options) {
  std::string key = fmt::format(
      "{}|{}|{}|{}|{}|{}|{}", level.server, level.prompts, level.concurrency, options.seed,
      fmt::join(options.prompt_tokens, ","), fmt::join(options.output_tokens, ","), level.requests);
  if (options.turns > 1) key += fmt::format("|turns={}", options.turns);
  return key;
}

// `stream` turns false (for the rest of the run) when the server refuses stream=true with a
// 400 that says so (kvaudit serve, some gateways): the request is sent again in one piece.
// `extra_fields` go into every request body (SGLang: return_meta_info).
LoadLevel run_level(net::Client& client, const std::string& model,
                    const std::vector<LoadPrompt>& prompts, int concurrency,
                    std::atomic<bool>& stream, Budget& budget, std::atomic<bool>& server_failing,
                    const json& extra_fields, const CounterNames& counters) {
  LoadLevel level;
  level.concurrency = concurrency;
  const SpecCounters before = read_spec_counters(client, counters);
  std::vector<Timing> timings(prompts.size());
  // Sessions: runs of adjacent prompts starting at turn 0; a worker sends one session's turns
  // in order, each after the answer to the one before.
  std::vector<size_t> session_starts;
  for (size_t i = 0; i < prompts.size(); ++i)
    if (prompts[i].turn == 0 || i == 0) session_starts.push_back(i);
  session_starts.push_back(prompts.size());
  const auto started = Clock::now();
  // `concurrency` sessions in flight; a stop (the server failing, the budget, the deadline)
  // ends the hand-out, and the sessions in flight stop at their next turn.
  run_on_threads(session_starts.size() - 1, concurrency, [&](size_t session) {
    for (size_t index = session_starts[session]; index < session_starts[session + 1]; ++index) {
      if (server_failing || budget.stop() || Clock::now() >= budget.deadline) return false;
      if (budget.left.fetch_sub(1) <= 0) return false;
      timings[index] = run_request(client, model, prompts[index], stream, budget.deadline,
                                   budget.interrupted, extra_fields);
      if (stream && !timings[index].ok && timings[index].error.rfind("HTTP 400", 0) == 0 &&
          timings[index].error.find("stream") != std::string::npos) {
        stream = false;
        timings[index] = run_request(client, model, prompts[index], false, budget.deadline,
                                     budget.interrupted, extra_fields);
      }
      if (timings[index].unavailable) server_failing = true;
    }
    return true;
  });
  level.wall_seconds = std::chrono::duration<double>(Clock::now() - started).count();
  const SpecCounters after = read_spec_counters(client, counters);

  std::vector<double> ttft, gaps, e2e, ttft_first, ttft_later;
  int64_t draft = 0, accepted = 0, verify_steps = 0;
  bool per_response = false, any_steps = false;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const Timing& t = timings[i];
    if (t.total == 0.0 && t.error.empty() && !t.ok) continue;  // never sent
    ++level.requests;
    if (t.cancelled) {
      ++level.cancelled;  // the run's own limit cut it: the server did not fail it
      continue;
    }
    if (!t.ok) {
      ++level.failures;
      if (level.errors.size() < 3) level.errors.push_back(t.error);
      continue;
    }
    level.streamed |= t.streamed;
    level.prompt_tokens += t.prompt_tokens;
    level.output_tokens += t.output_tokens;
    if (t.cached_tokens >= 0)
      level.cached_prompt_tokens =
          std::max<int64_t>(0, level.cached_prompt_tokens) + t.cached_tokens;
    e2e.push_back(t.total);
    if (t.ttft >= 0) {
      ttft.push_back(t.ttft);
      (prompts[i].turn == 0 ? ttft_first : ttft_later).push_back(t.ttft);
    }
    gaps.insert(gaps.end(), t.gaps.begin(), t.gaps.end());
    if (t.draft >= 0) {
      per_response = true;
      draft += t.draft;
      accepted += std::max<int64_t>(0, t.accepted);
      if (t.verify_steps >= 0) verify_steps += t.verify_steps, any_steps = true;
    }
  }
  level.ttft = summarize_latency(ttft);
  if (!ttft_later.empty()) {
    level.ttft_first_turn = summarize_latency(ttft_first);
    level.ttft_later_turns = summarize_latency(ttft_later);
  }
  level.itl = summarize_latency(gaps);
  level.e2e = summarize_latency(e2e);
  const int64_t ok = level.requests - level.failures - level.cancelled;
  if (level.wall_seconds > 0) {
    level.requests_per_second = static_cast<double>(ok) / level.wall_seconds;
    level.output_tokens_per_second = static_cast<double>(level.output_tokens) / level.wall_seconds;
  }
  if (after.generated_seen && before.generated_seen)
    level.server_output_tokens =
        static_cast<int64_t>(std::llround(after.generated - before.generated));
  // Answers that did not say (SGLang without --enable-cache-report): its counter's delta.
  if (level.cached_prompt_tokens < 0 && after.cached_seen && before.cached_seen &&
      after.cached >= before.cached)
    level.cached_prompt_tokens = static_cast<int64_t>(std::llround(after.cached - before.cached));
  if (after.seen && before.seen && after.draft >= before.draft) {
    level.draft_tokens = static_cast<int64_t>(std::llround(after.draft - before.draft));
    level.accepted_tokens = static_cast<int64_t>(std::llround(after.accepted - before.accepted));
    level.drafts = static_cast<int64_t>(std::llround(after.drafts - before.drafts));
    level.spec_source = "/metrics";
  } else if (per_response) {
    level.draft_tokens = draft;
    level.accepted_tokens = accepted;
    if (any_steps) level.drafts = verify_steps;
    level.spec_source = "responses";
  } else if (after.accept_rate >= 0 || after.accept_length >= 0) {
    level.spec_accept_rate_gauge = after.accept_rate;
    level.spec_accept_length_gauge = after.accept_length;
    level.spec_source = "/metrics gauges";
  }
  return level;
}

}  // namespace kvaudit::loadbench
