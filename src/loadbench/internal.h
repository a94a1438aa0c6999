// What loadbench's files share and nothing outside the module uses: the prompts of a run,
// one timed request, the servers' counters, one level of the ladder, the results file.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "loadbench/loadbench.h"
#include "net/net.h"

namespace kvaudit::loadbench {

using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------- prompts (prompts.cpp)

struct LoadPrompt {
  nlohmann::json prompt;  // token ids, or text when the server has no /tokenize
  int64_t tokens = 0;
  int64_t max_tokens = 0;
  int turn = 0;  // within its session (0: the first; prompts of a session are adjacent)
  int64_t session_tokens = 0;  // the session's last and longest prompt
};

// Requests of a level: whole sessions, at least one per concurrency slot.
int64_t requests_per_level(const LoadOptions& options, int concurrency);

struct PromptSet {
  std::vector<LoadPrompt> real, random;
  std::string source;
  std::string fitted;  // how lengths were cut to the servers' context ("" : none were)
};

// `request_limit`: the most tokens (prompt + output) one request may hold on every server.
PromptSet make_prompts(net::Client& client, const std::string& model, const LoadOptions& options,
                       int64_t count, std::optional<int64_t> request_limit);

// ---------------------------------------------------------------- one request (request.cpp)

struct Timing {
  bool ok = false;
  bool cancelled = false;  // cut by the run's own time limit or an interrupt, not failed
  std::string error;
  bool unavailable = false;  // the server itself is failing: stop the run
  bool streamed = false;
  double ttft = -1.0, total = 0.0;
  std::vector<double> gaps;
  int64_t prompt_tokens = 0, output_tokens = 0, chunks = 0;
  int64_t cached_tokens = -1;  // usage.prompt_tokens_details.cached_tokens, when given
  int64_t draft = -1, accepted = -1, verify_steps = -1;
};

// One completion, streamed when asked; stops reading (and counts as cut) past `deadline`
// or when interrupted.
Timing run_request(net::Client& client, const std::string& model, const LoadPrompt& prompt,
                   bool stream, Clock::time_point deadline, const std::function<bool()>& stop,
                   const nlohmann::json& extra_fields);

// ---------------------------------------------------------------- counters

// The servers' counters (probe's reader, shared with watch).
using SpecCounters = probe::ServerCounters;
using CounterNames = probe::CounterNames;
inline SpecCounters read_spec_counters(net::Client& client, const CounterNames& names) {
  return probe::read_server_counters(client, names);
}

// ---------------------------------------------------------------- one level (level.cpp)

std::string level_key(const LoadLevel& level, const LoadOptions& options);

struct Budget {
  std::atomic<int64_t> left;
  Clock::time_point deadline;
  std::function<bool()> interrupted;
  bool stop() const { return interrupted && interrupted(); }
};

// `stream` turns false (for the rest of the run) when the server refuses stream=true with a
// 400 that says so (kvaudit serve, some gateways): the request is sent again in one piece.
// `extra_fields` go into every request body (SGLang: return_meta_info).
LoadLevel run_level(net::Client& client, const std::string& model,
                    const std::vector<LoadPrompt>& prompts, int concurrency,
                    std::atomic<bool>& stream, Budget& budget, std::atomic<bool>& server_failing,
                    const nlohmann::json& extra_fields, const CounterNames& counters);

// ---------------------------------------------------------------- results file (results.cpp)

// Earlier levels of the same run, from the results file, by key ({} without one).
std::map<std::string, LoadLevel> read_levels(const std::string& results_path);
// The results file, opened for appending ("" : not opened).
std::ofstream open_results_file(const std::string& results_path);
// A finished level as one line of the results file, flushed.
void append_level(std::ofstream& results_out, const LoadLevel& level, const std::string& key);

}  // namespace kvaudit::loadbench
