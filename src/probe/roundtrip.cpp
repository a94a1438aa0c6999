// probe --roundtrip: the passes against one server (cold, device, device again, filler,
// after eviction), each prompt's cached-token count and the tier counters around each pass,
// and which tier served each pass. The checks and the verdict are in roundtrip_judge.cpp.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>

#include "eval/eval.h"
#include "probe/internal.h"

namespace kvaudit::probe {

namespace {

using Clock = std::chrono::steady_clock;

// What a run has spent, and the bounds it stops at.
struct Budget {
  Clock::time_point deadline;
  int max_requests = 0;
  std::atomic<int64_t> requests{0};
  // Why the run must stop now ("" : it may go on).
  std::string exhausted() const {
    if (Clock::now() >= deadline) return "the time limit (--roundtrip-time-limit) was reached";
    if (requests.load() >= max_requests)
      return fmt::format("the request limit ({}) was reached", max_requests);
    return "";
  }
};

// The tier counters (engine data server_info.counters, every engine's names: they carry
// their engine's prefix), summed per kind; empty when /metrics is absent or unreadable.
std::map<std::string, double> read_tier_counters(
    net::Client& client, const std::map<std::string, std::vector<std::string>>& names) {
  return read_server_counters(client, names).hits;
}

std::map<std::string, double> counter_rise(const std::map<std::string, double>& before,
                                           const std::map<std::string, double>& after) {
  std::map<std::string, double> out;
  for (const auto& [kind, value] : after)
    if (auto it = before.find(kind); it != before.end()) out[kind] = value - it->second;
  return out;
}

struct RoundTripPrompt {
  std::string text;
  int64_t tokens = 0;
};

// Asks prompt `i` once for `pass`, with the tier counters read around the request (so a
// pass's counter rise holds only its own requests, whatever ran between them).
void ask_prompt(net::Client& client, const std::string& model, const RoundTripPrompt& prompt,
                size_t i, const RoundTripOptions& options, int top_k, Budget& budget,
                const std::map<std::string, std::vector<std::string>>& counter_names,
                RoundTripPass& pass) {
  const auto before = read_tier_counters(client, counter_names);
  net::CompletionRequest request;
  request.model = model;
  request.prompt = prompt.text;
  request.max_tokens = options.generate_tokens;
  request.temperature = 0.0;
  request.seed = options.seed;
  request.logprobs = top_k;
  ++budget.requests;
  const auto started = Clock::now();
  net::Completion answer = net::complete(client, request);
  ProbeRecord record;
  record.server = client.url().text();
  record.id = fmt::format("roundtrip/{}", i);
  record.kind = "roundtrip";
  record.endpoint = "/v1/completions";
  record.output = answer.text;
  record.prompt_tokens = answer.prompt_tokens.value_or(prompt.tokens);
  record.generated = positions_of(answer.tokens, 0, answer.tokens.size());
  record.top_k = top_k;
  record.passed = !record.generated.empty();
  record.seconds = std::chrono::duration<double>(Clock::now() - started).count();
  pass.records.push_back(std::move(record));
  pass.cached_tokens.push_back(answer.cached_tokens);
  if (answer.cached_tokens) {
    pass.cached_field = answer.cached_tokens_field;
    pass.cached += *answer.cached_tokens;
    pass.prompt_tokens += pass.records.back().prompt_tokens;
  }
  pass.record_counter_delta.push_back(
      counter_rise(before, read_tier_counters(client, counter_names)));
  for (const auto& [kind, rise] : pass.record_counter_delta.back())
    pass.counter_delta[kind] += rise;
}

// Filler: distinct prompts, never reused, until the device pool has been overrun.
void evict(net::Client& client, const std::string& model, const RoundTripOptions& options,
           const ServerFacts& facts, Budget& budget, RoundTripEviction& eviction,
           std::string& stopped) {
  eviction.attempted = true;
  eviction.pool_tokens = facts.capacity_tokens;
  eviction.pool_source = eviction.pool_source;
  if (!eviction.pool_tokens && facts.engine == "llama.cpp" && facts.slots && facts.context_length) {
    // llama-server's KV lives in its slots: each holds the last prompt it served, in n_ctx
    // (per slot) cells.
    eviction.pool_tokens = *facts.slots * *facts.context_length;
    eviction.pool_source = fmt::format("{}/props: total_slots {} x n_ctx {}", facts.url,
                                       *facts.slots, *facts.context_length);
  }
  if (!eviction.pool_tokens || *eviction.pool_tokens <= 0) {
    eviction.note =
        "the server does not say how many tokens its device pool holds, so the "
        "filler needed to overrun it is unknown";
    return;
  }
  const double wanted = options.overrun * double(*eviction.pool_tokens);
  if (wanted > double(options.max_filler_tokens)) {
    eviction.note = fmt::format(
        "overrunning the device pool of {} tokens {:g}x needs {:.0f} "
        "filler tokens, more than --roundtrip-max-filler-tokens ({})",
        *eviction.pool_tokens, options.overrun, wanted, options.max_filler_tokens);
    return;
  }
  const int64_t context = facts.context_length.value_or(4096);
  // Several requests per pool (LRU evicts the oldest first), each inside one request's room.
  const int64_t each =
      options.filler_prompt_tokens > 0
          ? options.filler_prompt_tokens
          : std::clamp<int64_t>(std::min(context / 2, *eviction.pool_tokens / 4), 64, 2048);
  int64_t requests = int64_t(std::ceil(wanted / double(each)));
  // llama-server keeps one prompt per slot: every slot must be overwritten.
  if (facts.slots) requests = std::max<int64_t>(requests, *facts.slots + 1);
  std::atomic<int64_t> tokens{0}, done{0};
  RunControl control;
  const eval::TokenCounter rough = [](std::string_view text) {
    return static_cast<int64_t>((text.size() + 3) / 4);
  };
  run_parallel(size_t(requests), std::max(1, options.concurrency), control.abort, [&](size_t j) {
    if (std::string why = budget.exhausted(); !why.empty()) {
      control.fail(why + " while sending filler");
      return;
    }
    net::CompletionRequest request;
    request.model = model;
    request.prompt = fmt::format("# filler {:016x}-{}\n", options.seed, j) +
                     eval::make_prose(options.seed * 7919 + j, each, rough);
    request.max_tokens = 1;
    ++budget.requests;
    try {
      net::Completion answer = net::complete(client, request);
      tokens += answer.prompt_tokens.value_or(int64_t(request.prompt.size() / 4));
    } catch (const net::RequestError& error) {
      control.fail(fmt::format("a filler request failed: {}", error.what()));
      return;
    }
    const int64_t finished = ++done;
    if (options.on_progress) {
      std::lock_guard lock(control.mutex);
      options.on_progress("filler", finished, requests);
    }
  });
  eviction.filler_requests = done.load();
  eviction.filler_tokens = tokens.load();
  if (control.failure) {
    stopped = *control.failure;
    eviction.note =
        fmt::format("the filler stopped after {} requests: {}", done.load(), *control.failure);
    return;
  }
  eviction.forced = double(eviction.filler_tokens) >= double(*eviction.pool_tokens);
  eviction.note = fmt::format(
      "{} filler requests, {} tokens: {:.2f}x the device pool of {} "
      "tokens ({})",
      eviction.filler_requests, eviction.filler_tokens,
      double(eviction.filler_tokens) / double(*eviction.pool_tokens), *eviction.pool_tokens,
      eviction.pool_source);
}

// The prompts: each starts with its own nonce (this run's id and its index, so neither an
// earlier run nor another prompt shares more than the tokens before it), then code text
// from the seed.
std::vector<RoundTripPrompt> make_prompts(const RoundTripOptions& options, uint64_t run_id,
                                          TokenCounter& counter) {
  std::vector<RoundTripPrompt> prompts;
  const eval::TokenCounter count = [&](std::string_view text) { return counter(text); };
  for (int i = 0; i < options.prompts; ++i) {
    RoundTripPrompt prompt;
    prompt.text =
        fmt::format("{:016x} roundtrip {}\n", splitmix64(run_id + uint64_t(i)), i) +
        eval::make_code(options.seed * 104729 + uint64_t(i), options.prompt_tokens, count);
    prompt.tokens = count(prompt.text);
    prompts.push_back(std::move(prompt));
  }
  return prompts;
}

}  // namespace

RoundTripResult run_roundtrip(const engines::Registry& registry, const std::string& url,
                              const net::ClientOptions& client_options,
                              const RoundTripOptions& options) {
  if (options.prompts < 1 || options.prompts > 1000)
    throw InputError("--roundtrip-prompts", "must be between 1 and 1000");
  if (options.generate_tokens < 1 || options.prompt_tokens < 16 || !(options.overrun >= 1.0) ||
      !(options.time_limit_seconds > 0) || options.max_requests < 1)
    throw InputError("--roundtrip",
                     "prompts of >= 16 tokens, >= 1 generated token, an overrun "
                     ">= 1 and positive limits are needed");
  const auto started = Clock::now();
  RoundTripResult result;
  net::ClientOptions bounded = client_options;
  // No single request may outlast the run by much.
  bounded.read_timeout = std::min(
      bounded.read_timeout, std::chrono::milliseconds(int64_t(options.time_limit_seconds * 1000)));
  net::Client client(net::parse_url(url), bounded);
  result.facts = detect_server(registry, client);
  const std::string model = options.model.empty() ? result.facts.model_id : options.model;
  if (model.empty())
    throw InputError(url, "the server lists no model (/v1/models); name it with --model");
  negotiate_logprobs(client, model, options.top_logprobs, result.facts);
  if (result.facts.top_logprobs_granted < 1)
    throw InputError(url, "the server grants no log-probs, which the round trip compares");
  const auto counter_names = load_counter_names(registry, "");

  Budget budget;
  budget.deadline = started + std::chrono::milliseconds(int64_t(options.time_limit_seconds * 1000));
  budget.max_requests = options.max_requests;
  TokenCounter counter(result.facts.has_tokenize ? &client : nullptr, model);
  const uint64_t run_id = std::random_device{}() ^
                          uint64_t(std::chrono::system_clock::now().time_since_epoch().count());
  const std::vector<RoundTripPrompt> prompts = make_prompts(options, run_id, counter);
  const int top_k = result.facts.top_logprobs_granted;

  // Each prompt cold, then at once twice more, so the device cache (a single llama-server
  // slot included) still holds it; after the filler, every prompt once more.
  for (const char* name : {"cold", "device", "device again"}) {
    result.passes.push_back(RoundTripPass{});
    result.passes.back().name = name;
  }
  auto ask = [&](RoundTripPass& pass, size_t i) {
    if (std::string why = budget.exhausted(); !why.empty()) {
      result.stopped = fmt::format("{} during the {} pass", why, pass.name);
      return false;
    }
    try {
      ask_prompt(client, model, prompts[i], i, options, top_k, budget, counter_names, pass);
    } catch (const net::RequestError& error) {
      result.stopped = fmt::format("the {} pass stopped: {}", pass.name, error.what());
      return false;
    }
    if (options.on_progress) options.on_progress(pass.name, int64_t(i + 1), options.prompts);
    return true;
  };
  bool going = true;
  for (size_t i = 0; going && i < prompts.size(); ++i)
    for (size_t p = 0; going && p < 3; ++p) going = ask(result.passes[p], i);
  if (going) {
    try {
      evict(client, model, options, result.facts, budget, result.eviction, result.stopped);
    } catch (const net::RequestError& error) {
      result.stopped = fmt::format("the filler stopped: {}", error.what());
    }
    going = result.stopped.empty();
  }
  if (going) {
    result.passes.push_back(RoundTripPass{});
    result.passes.back().name = "after eviction";
    for (size_t i = 0; going && i < prompts.size(); ++i) going = ask(result.passes.back(), i);
  }
  result.requests = budget.requests.load();
  judge_roundtrip(options, result);
  result.seconds = std::chrono::duration<double>(Clock::now() - started).count();
  return result;
}

}  // namespace kvaudit::probe
