// loadbench: `kvaudit probe URL --load [--compare URL2]`: throughput and latency at a ladder
// of concurrencies on realistic agentic-coding prompts (long code contexts: the recall
// generator's synthetic files or the user's own files), and the same requests with
// random-token prompts of the same lengths as the control that `bench_serving --dataset
// random` would have sent. Speculative decoding's acceptance is read from the servers' own
// counters (/metrics) and per-response fields. Bounded: a request budget and a time limit for
// the whole run, 429/Retry-After honoured (net::Client), an interrupt flag polled between and
// inside requests; each finished level is appended to a results file so a rerun resumes. Load
// goes only to the URLs given. Not here: what a server is and runs (probe/'s detection, which
// this uses), HTTP and the OpenAI protocol (net/), rendering (report/, via cli/).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engines/engines.h"
#include "net/net.h"
#include "probe/probe.h"
#include "report/report.h"

namespace kvaudit::loadbench {

struct LoadOptions {
  std::vector<int> concurrency = {1, 4, 16, 32};
  int64_t requests_per_level = 0;  // 0: max(8, 2 x concurrency)
  int64_t max_requests = 2000;     // whole run (every server, prompt kind and level)
  double max_seconds = 900;        // whole run
  std::vector<int64_t> prompt_tokens = {1024, 2048, 4096};  // cycled over a level's requests
  std::vector<int64_t> output_tokens = {64, 128, 256};      // max_tokens, cycled
  std::string corpus_dir;  // the user's files as contexts ("" : synthetic code)
  // Requests per session, as a coding agent sends them: a session's turns go one after the
  // other, each re-sending the session's context grown by an equal step up to the session's
  // prompt length, so every turn's prompt begins with the previous turn's (what prefix
  // caching serves). 1: independent requests. A level runs whole sessions, at least one per
  // concurrency slot.
  int turns = 1;
  bool random_control = true;
  bool stream = true;  // SSE where the server streams; TTFT/ITL need it
  uint64_t seed = 1;
  std::string model;                  // "" : each server's /v1/models id
  std::string results_path;           // "" : no resume
  std::function<bool()> interrupted;  // true: stop cleanly with what was measured
  std::function<void(int64_t done, int64_t total, const std::string& label)> on_progress;
};

struct LatencySummary {
  int64_t count = 0;
  double mean = 0.0, p50 = 0.0, p90 = 0.0, p99 = 0.0;  // seconds
};
// Nearest-rank percentiles of `seconds` (empty: count 0).
LatencySummary summarize_latency(std::vector<double> seconds);

// One (server, prompt kind, concurrency) level.
struct LoadLevel {
  std::string server;   // URL
  std::string prompts;  // "real" | "random"
  int concurrency = 0;
  // Requests sent; of them, failed by the server (or its answer), and cancelled: cut by the
  // run's own time limit or an interrupt, which say nothing about the server.
  int64_t requests = 0, failures = 0, cancelled = 0;
  double wall_seconds = 0.0;
  double requests_per_second = 0.0;
  double output_tokens_per_second = 0.0;
  int64_t prompt_tokens = 0, output_tokens = 0;  // as the server's usage counted them
  // Of prompt_tokens, those the server says it served from its prompt cache
  // (usage.prompt_tokens_details.cached_tokens: llama-server always, vLLM with
  // --enable-prompt-tokens-details; SGLang's meta_info, else its sglang:cached_tokens_total
  // counter over the level); -1 when nothing said.
  int64_t cached_prompt_tokens = -1;
  LatencySummary ttft, itl, e2e;  // first streamed token; gap between streamed chunks; whole
  // With turns > 1: TTFT of each session's first turn and of its later turns (whose prompt
  // begins with the turn before's: the gap is what the server's prefix cache saves).
  LatencySummary ttft_first_turn, ttft_later_turns;
  bool streamed = false;  // false: the server answered without SSE (no TTFT/ITL)
  // Speculative decoding over the level (server counters' deltas, else the responses').
  int64_t draft_tokens = -1, accepted_tokens = -1, drafts = -1;  // -1: not reported
  // "/metrics", "responses" (llama-server timings, SGLang meta_info), or "/metrics gauges"
  // (SGLang without per-response counts: its sglang:spec_accept_rate and
  // sglang:spec_accept_length over the last logging interval, read as the level ends).
  std::string spec_source;
  double spec_accept_rate_gauge = -1.0;    // accepted / drafted (SGLang gauge), -1: none
  double spec_accept_length_gauge = -1.0;  // tokens per verify step, bonus included
  // The server's own count of generated tokens over the level (-1: it exports none), the
  // independent check of output_tokens.
  int64_t server_output_tokens = -1;
  std::vector<std::string> errors;  // the first few failures, one line each
  bool resumed = false;             // read back from the results file
};

struct LoadResult {
  std::vector<probe::ServerFacts> servers;
  std::vector<LoadLevel> levels;  // ladder order; per level real before random, A before B
  std::string stopped;            // "" : the whole ladder ran; else why it stopped early
  int64_t requests_sent = 0;
  double seconds = 0.0;
  std::string prompt_source;  // how the prompts were made and their lengths measured
  std::vector<std::string> notes;
};

LoadResult run_load(const engines::Registry& registry, const std::vector<std::string>& urls,
                    const net::ClientOptions& client, const LoadOptions& options);
report::Report to_report(const LoadResult& result, const LoadOptions& options);
// One level as a results-file line and back (resume).
nlohmann::json to_json(const LoadLevel& level);
LoadLevel load_level_from_json(const nlohmann::json& doc, const std::string& where);

}  // namespace kvaudit::loadbench
