// The load bench's run: its options checked, each server detected (probe's detection) and
// given a client wide enough for the ladder, the prompts made once, then the concurrency
// ladder (per level real before random, A before B), each level run or read back from the
// results file, until the ladder ends or the request budget, the time limit, an interrupt or
// a failing server stops it; the notes on how to read what was measured.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <map>
#include <memory>
#include <thread>

#include "loadbench/internal.h"
#include "util/util.h"

namespace kvaudit::loadbench {

using nlohmann::json;

namespace {

// Throws InputError naming the flag of the first option out of range.
void check_load_options(const std::vector<std::string>& urls, const LoadOptions& options) {
  if (urls.empty() || urls.size() > 2) throw InputError("probe --load", "give one or two URLs");
  if (options.concurrency.empty())
    throw InputError("--load-concurrency", "give at least one level");
  for (int c : options.concurrency)
    if (c < 1 || c > 1024) throw InputError("--load-concurrency", "levels must lie in [1, 1024]");
  if (options.prompt_tokens.empty() || options.output_tokens.empty())
    throw InputError("--load-prompt-tokens", "give at least one prompt and one output length");
  if (!(options.max_seconds > 0)) throw InputError("--load-time", "must be positive");
  if (options.turns < 1 || options.turns > 64)
    throw InputError("--load-turns", "must lie in [1, 64]");
}

// A client per URL that may hold the widest level's requests at once, what each server is
// (result.servers) and the model asked of it.
void open_load_servers(const engines::Registry& registry, const std::vector<std::string>& urls,
                       const net::ClientOptions& client_options, const LoadOptions& options,
                       LoadResult& result, std::vector<std::unique_ptr<net::Client>>& clients,
                       std::vector<std::string>& models) {
  for (const std::string& url : urls) {
    net::ClientOptions per_server = client_options;
    const int widest = *std::max_element(options.concurrency.begin(), options.concurrency.end());
    per_server.max_concurrency = std::max(per_server.max_concurrency, widest);
    clients.push_back(std::make_unique<net::Client>(net::parse_url(url), per_server));
    result.servers.push_back(probe::detect_server(registry, *clients.back()));
    std::string model = options.model.empty() ? result.servers.back().model_id : options.model;
    if (model.empty()) throw InputError(url, "reports no model (/v1/models); pass --model");
    models.push_back(model);
  }
}

// Every server gets the same prompts, so they must fit the smallest context (for a
// llama-server, /props' n_ctx is already one slot's: recorded a-get-props.json).
std::optional<int64_t> smallest_context(const std::vector<probe::ServerFacts>& servers) {
  std::optional<int64_t> request_limit;
  for (const probe::ServerFacts& facts : servers)
    if (facts.context_length)
      request_limit =
          std::min(request_limit.value_or(*facts.context_length), *facts.context_length);
  return request_limit;
}

// What the levels of one run share: the servers, the limits, the results file.
struct Ladder {
  const engines::Registry& registry;
  const std::vector<std::string>& urls;
  const LoadOptions& options;
  const std::vector<std::unique_ptr<net::Client>>& clients;
  const std::vector<std::string>& models;            // per server
  const std::map<std::string, LoadLevel>& previous;  // by level_key, from the results file
  std::ofstream& results_out;
  Budget& budget;
  std::atomic<bool>& failing;  // a server stopped answering: no level starts
  std::vector<std::unique_ptr<std::atomic<bool>>>& streams;  // per server: still asked to stream
};

// False when no further level may start: result.stopped says which limit was reached (a
// failing server is said once the ladder ends).
bool may_start_level(const Ladder& ladder, LoadResult& result) {
  if (ladder.failing) return false;
  if (ladder.budget.stop()) {
    result.stopped = "interrupted";
    return false;
  }
  if (Clock::now() >= ladder.budget.deadline) {
    result.stopped = fmt::format("time limit of {:.0f} s reached", ladder.options.max_seconds);
    return false;
  }
  if (ladder.budget.left <= 0) {
    result.stopped = fmt::format("request budget of {} spent", ladder.options.max_requests);
    return false;
  }
  return true;
}

// One server's level: read back from the results file, else run (and appended to the file
// when it ran whole). False when it did neither because a limit was reached.
bool run_or_resume_level(const Ladder& ladder, size_t s, const std::string& kind, int concurrency,
                         const std::vector<LoadPrompt>& level_prompts, LoadResult& result) {
  LoadLevel planned;
  planned.server = ladder.urls[s];
  planned.prompts = kind;
  planned.concurrency = concurrency;
  planned.requests = static_cast<int64_t>(level_prompts.size());
  const std::string key = level_key(planned, ladder.options);
  if (auto it = ladder.previous.find(key); it != ladder.previous.end()) {
    result.levels.push_back(it->second);
    return true;
  }
  if (!may_start_level(ladder, result)) return false;
  // Per-request counters some engines add only when asked (engine data:
  // server_info.completion_extra; SGLang's speculative counts in meta_info).
  const json extra = probe::completion_extra_fields(ladder.registry, result.servers[s].engine);
  LoadLevel level = run_level(*ladder.clients[s], ladder.models[s], level_prompts, concurrency,
                              *ladder.streams[s], ladder.budget, ladder.failing, extra,
                              probe::load_counter_names(ladder.registry, result.servers[s].engine));
  level.server = ladder.urls[s];
  level.prompts = kind;
  result.requests_sent += level.requests;
  // A level the limits cut short is reported but not kept for resume.
  const bool complete = level.requests == planned.requests && !ladder.failing;
  if (complete && ladder.results_out) append_level(ladder.results_out, level, key);
  result.levels.push_back(level);
  return true;
}

// The ladder, level by level (`level_offsets`: where each concurrency's prompts begin in the
// prompt set), until it ends or something stops it (result.stopped).
void run_ladder(const Ladder& ladder, const PromptSet& prompts,
                const std::vector<int64_t>& level_offsets, LoadResult& result) {
  const LoadOptions& options = ladder.options;
  const std::vector<std::string> kinds = options.random_control
                                             ? std::vector<std::string>{"real", "random"}
                                             : std::vector<std::string>{"real"};
  int64_t total_levels =
      static_cast<int64_t>(options.concurrency.size() * kinds.size() * ladder.urls.size());
  int64_t done_levels = 0;
  for (size_t ladder_index = 0; ladder_index < options.concurrency.size(); ++ladder_index) {
    const int concurrency = options.concurrency[ladder_index];
    const int64_t count = requests_per_level(options, concurrency);
    const int64_t offset = level_offsets[ladder_index];
    for (const std::string& kind : kinds) {
      const auto& set = kind == "real" ? prompts.real : prompts.random;
      std::vector<LoadPrompt> level_prompts(set.begin() + offset, set.begin() + offset + count);
      for (size_t s = 0; s < ladder.urls.size(); ++s) {
        if (!run_or_resume_level(ladder, s, kind, concurrency, level_prompts, result)) break;
        if (options.on_progress)
          options.on_progress(++done_levels, total_levels,
                              fmt::format("{} x{} {}", kind, concurrency, ladder.urls[s]));
      }
      if (!result.stopped.empty() || ladder.failing) break;
    }
    if (!result.stopped.empty()) break;
    if (ladder.failing) {
      result.stopped = "a server stopped answering (see the errors)";
      break;
    }
  }
  if (result.stopped.empty() && ladder.failing)
    result.stopped = "a server stopped answering (see the errors)";
}

// How to read the run: a server on this machine, a server that refused to stream, and each
// client's request counts.
void add_run_notes(const Ladder& ladder, LoadResult& result) {
  for (const auto& client : ladder.clients) {
    const std::string& host = client->url().host;
    if (host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0) {
      // Measured on a 2-core host: kvaudit serve with 2 compute threads gave real/random
      // ratios of 0.73-1.43 on identical token counts; with 1 thread (a core left for the
      // client) 1.001-1.003.
      result.notes.push_back(fmt::format(
          "{} is on this machine: the load generator competes with it for {} cores, so "
          "levels vary with scheduling; leave the client a core (fewer server threads) or "
          "run the load from another machine before reading small differences",
          client->url().text(), std::max(1u, std::thread::hardware_concurrency())));
      break;
    }
  }
  for (size_t s = 0; s < ladder.clients.size(); ++s) {
    if (ladder.options.stream && !*ladder.streams[s])
      result.notes.push_back(fmt::format(
          "{} refuses stream=true: its requests were sent without streaming, so it has no "
          "first-token or inter-token times",
          ladder.urls[s]));
    const net::ClientStats stats = ladder.clients[s]->stats();
    result.notes.push_back(fmt::format(
        "{}: {} requests, {} HTTP attempts ({} retries), {} connections", ladder.urls[s],
        stats.requests, stats.attempts, stats.retries, stats.connections));
  }
}

}  // namespace

LoadResult run_load(const engines::Registry& registry, const std::vector<std::string>& urls,
                    const net::ClientOptions& client_options, const LoadOptions& options) {
  check_load_options(urls, options);
  const auto started = Clock::now();
  LoadResult result;
  std::vector<std::unique_ptr<net::Client>> clients;
  std::vector<std::string> models;
  open_load_servers(registry, urls, client_options, options, result, clients, models);

  // Earlier levels of the same run, from the results file.
  std::map<std::string, LoadLevel> previous = read_levels(options.results_path);
  std::ofstream results_out = open_results_file(options.results_path);

  // Every level gets prompts of its own: a server that caches prompts (SGLang's radix cache,
  // vLLM's prefix caching, llama-server's slots and --cache-ram) would otherwise serve a
  // later level's prompts from an earlier level's work and report a TTFT no cold request
  // sees. (Measured: llama-server's TTFT p50 fell from 153 ms at x1 to 11 ms at x4 when
  // both levels sent the same prompts.)
  int64_t total = 0;
  std::vector<int64_t> level_offsets;
  for (int c : options.concurrency) {
    level_offsets.push_back(total);
    total += requests_per_level(options, c);
  }
  const std::optional<int64_t> request_limit = smallest_context(result.servers);
  PromptSet prompts = make_prompts(*clients[0], models[0], options, total, request_limit);
  result.prompt_source = prompts.source;
  if (!prompts.fitted.empty()) result.notes.push_back(prompts.fitted);

  Budget budget{
      {options.max_requests},
      started + std::chrono::milliseconds(static_cast<int64_t>(options.max_seconds * 1000)),
      options.interrupted};
  std::atomic<bool> failing{false};
  std::vector<std::unique_ptr<std::atomic<bool>>> streams;
  for (size_t s = 0; s < urls.size(); ++s)
    streams.push_back(std::make_unique<std::atomic<bool>>(options.stream));
  const Ladder ladder{registry, urls,        options, clients, models,
                      previous, results_out, budget,  failing, streams};
  run_ladder(ladder, prompts, level_offsets, result);
  add_run_notes(ladder, result);
  result.seconds = std::chrono::duration<double>(Clock::now() - started).count();
  return result;
}

}  // namespace kvaudit::loadbench
