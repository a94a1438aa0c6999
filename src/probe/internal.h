// What probe's files share and nothing outside the module uses: the probes of a run and their
// prompts, running one probe, the workers and failure state of a run, a comparison's gates,
// and the report's helpers.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "eval/eval.h"
#include "net/net.h"
#include "probe/probe.h"
#include "report/report.h"
#include "util/util.h"

namespace kvaudit::probe {

// ---------------------------------------------------------------- the probes of a run

struct Spec {
  std::string id;
  std::string kind;   // "smoke" | "recall" | "forced" | "mrcr" | "toolcall"
  std::string smoke;  // "short" | "arithmetic" | "medium"; forced: "code" | "text"
  int64_t ctx = 0, depth = 0;
  int case_index = 0;
};

struct Prepared {
  std::string prompt;
  std::string expected;
  int64_t prompt_tokens = 0;  // as counted
  int64_t depth_tokens = 0;
  int64_t expected_tokens = 0;
  std::optional<eval::TaskCase> task;  // mrcr / toolcall
  std::vector<int64_t> round_tokens;   // each round's answer, as counted
  std::string error;                   // the case cannot be built
};

// What every probe of a run asks for, once the servers said what they grant.
struct RunSettings {
  int top_logprobs = 0;  // alternatives per token, the smallest any server granted
  bool echo = true;      // prompt log-probs (echo) asked for: no server refused them
};

// One probe on one server: indices into the servers and the specs.
struct Task {
  size_t side, spec;
};

// What the parallel passes share: the first failure stops the rest. `mutex` also guards
// the results file, the slots and the progress count in run_pending.
struct RunControl {
  std::atomic<bool> abort{false};
  std::mutex mutex;
  std::optional<std::string> failure;
  void fail(const std::string& message) {
    std::lock_guard lock(mutex);
    if (!failure) failure = message;
    abort = true;
  }
};

// Runs f(i) for i in [0, n) on util's run_on_threads with `threads` in flight, until done or
// `abort` is set (checked before each i is handed out).
template <class F>
void run_parallel(size_t n, int threads, std::atomic<bool>& abort, F f) {
  if (abort) return;
  run_on_threads(n, threads, [&](size_t i) {
    f(i);
    return !abort.load();
  });
}

// ---------------------------------------------------------------- prompts (prompts.cpp)

// Counts tokens with the server's /tokenize (in the dialect it speaks), memoised; else
// bytes / 4. A tokenizer that stops answering tokens stops the run (no_progress).
class TokenCounter {
 public:
  TokenCounter(net::Client* client, std::string model) {
    if (client) tokenizer_.emplace(*client, std::move(model)), client_ = client;
  }
  int64_t operator()(std::string_view text) {
    if (!tokenizer_) return static_cast<int64_t>((text.size() + 3) / 4);
    {
      std::lock_guard lock(mutex_);
      if (auto it = cache_.find(std::string(text)); it != cache_.end()) return it->second;
    }
    auto tokens = tokenizer_->tokenize(text);
    if (!tokens)
      throw net::RequestError(client_->where("/tokenize"), "the tokenizer endpoint went away",
                              net::FailureKind::http, 404);
    int64_t count = static_cast<int64_t>(tokens->ids.size());
    std::lock_guard lock(mutex_);
    if (cache_.size() > 200'000) cache_.clear();
    cache_.emplace(std::string(text), count);
    return count;
  }

 private:
  net::Client* client_ = nullptr;
  std::optional<net::Tokenizer> tokenizer_;
  std::mutex mutex_;
  std::unordered_map<std::string, int64_t> cache_;
};

// The prompts of the probes some server still runs, options.concurrency at a time (one
// Prepared per spec; the others stay empty). A case that cannot be built is a finished,
// failed probe (its error set); a failed request or anything else stops the run.
std::vector<Prepared> prepare_prompts(const std::vector<Spec>& specs,
                                      const std::vector<Task>& tasks, const ProbeOptions& options,
                                      std::optional<int64_t> context, TokenCounter& counter,
                                      RunControl& control);

// ---------------------------------------------------------------- one probe (ask.cpp)

// Asks one probe of one server and scores the answer. A request error that stops the run
// (the server is gone, refuses auth or the route, answers garbage or too much, or makes no
// progress) propagates; any other is the record's error.
ProbeRecord run_one(net::Client& client, const std::string& model, const Spec& spec,
                    const Prepared& prepared, const ProbeOptions& options,
                    const RunSettings& settings);

// ---------------------------------------------------------------- comparing two records
// (compare.cpp)

// The first position where the two records' greedy tokens differ (the shorter length when
// one is a prefix of the other).
size_t first_divergence(const ProbeRecord& left, const ProbeRecord& right);

// KL of one probe pair on a basis both share: the teacher-forced window when `forced_ok`
// (every arm scored the same tokens), else the greedy prefix up to and including the first
// divergence (positions after it follow other text).
struct PairKl {
  std::optional<double> kl;
  int64_t positions = 0;
  std::string basis;
};
PairKl pair_kl(const ProbeRecord& left, const ProbeRecord& right, bool forced_ok);

// The answer's tokens [begin, end) as scored positions, each with its top alternatives.
std::vector<Position> positions_of(const std::vector<net::TokenLogprob>& tokens, size_t begin,
                                   size_t end);

// ---------------------------------------------------------------- gates (gates.cpp)

// A gate against the comparison's metrics: the metric's excess over the control (drops are
// -excess) against the limit, failed when no probe measured the metric.
GateResult evaluate_gate(const Gate& gate, const std::vector<MetricTest>& metrics);

// ---------------------------------------------------------------- the report (report.cpp)

// `text` on one line, cut to `limit` bytes (at a character boundary) with "...".
std::string excerpt(std::string text, size_t limit = 60);
report::Value optional_double(const std::optional<double>& value);

// What detection established about a server, as the report's JSON gives it.
nlohmann::json facts_json(const ServerFacts& facts);

// The A/B table, chart and facts; the payload's "compare" (null without --compare). In
// compare_report.cpp.
nlohmann::json add_compare(const RunResult& result, report::Report& out);

}  // namespace kvaudit::probe
