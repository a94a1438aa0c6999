// watch: keeps checking a deployment after the restart (kvaudit watch). It follows a log as
// it grows (a journal on stdin, a log file through rotation and truncation) or polls a live
// server, re-reads the latest launch after every line that carries a fact, checks it
// against the expectations `check` printed, and renders what it found as Prometheus metrics
// (resolved KV dtype as an info metric, scale fallback, capacity, expectation failures,
// last check time). Memory stays bounded on an endless stream: the log is read with
// logs::LogStream (a few launches kept, long lines cut) and nothing else grows with it.
// Nothing here prints or serves: cli/cmd_watch.cpp runs the loop and the HTTP endpoint.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "audit/audit.h"
#include "engines/engines.h"
#include "logs/logs.h"
#include "net/net.h"
#include "probe/probe.h"

namespace kvaudit::watch {

// ---------------------------------------------------------------- state

// What the latest launch shows, as /metrics exposes it.
struct LaunchState {
  int64_t number = 0;      // 1-based: the how-manieth launch this watch has seen
  int64_t first_line = 0;  // line of the followed stream that opened it (0: a server)
  std::string engine, engine_version, model;
  std::string kv_requested;   // as launched ("auto", "fp8"); "" unknown
  std::string kv_resolved;    // normalised dtype the cache holds; "" not known yet
  std::string kv_decided_by;  // the evidence that decided it
  std::optional<bool> scale_fallback;
  std::optional<int64_t> capacity_tokens;
  bool ready = false;
  bool failed = false;                                  // a traceback, OOM or exit after its start
  std::map<std::string, int64_t> findings_by_severity;  // "critical" -> count
  std::vector<logs::ExpectationResult> expectations;
  // An unmet expectation whose value the launch has not shown yet waits until the launch is
  // ready or failed; one the launch contradicts fails at once.
  std::vector<bool> expectation_pending;
  int64_t expectation_failures = 0;
};

// Speculative acceptance over time (a server source): the tokens drafted and accepted in
// each poll interval, a baseline (the first tokens after the launch) against a sliding recent
// window. Acceptance sinking for hours is the one signal users notice of KV that comes back
// wrong from a tier (a drafter fed FP8 KV, a corrupted offload). From vLLM's and
// llama-server's counters; SGLang only reports a gauge per logging interval, compared as
// samples.
struct AcceptanceOptions {
  double baseline_drafted = 4000;  // drafted tokens the baseline holds
  double window_drafted = 4000;    // drafted tokens the recent window holds (at least)
  double drop = 0.05;              // the fall in acceptance that counts (5 points)
  double alpha = 0.01;             // and how sure it must be
  size_t gauge_samples = 8;        // SGLang: samples in the baseline and in the window
};

struct AcceptanceState {
  std::string source;  // "counters", "gauge", "" (nothing seen)
  // counters: cumulative figures at the last poll (-1: none yet)
  double last_drafted = -1, last_accepted = -1;
  double baseline_drafted = 0, baseline_accepted = 0;
  std::vector<std::pair<double, double>> window;  // per interval (drafted, accepted), oldest first
  std::vector<double> baseline_gauge, window_gauge;
  std::optional<double> rate_baseline, rate_recent;
  double p_value = 1.0;
  bool drift = false;
  int64_t drifts = 0;  // times it went into drift
  std::string sentence;
};

// One poll's counters; `new_launch` restarts the baseline.
void add_acceptance_sample(const probe::ServerCounters& counters, bool new_launch,
                           const AcceptanceOptions& options, AcceptanceState& state);

// The round trip (probe --roundtrip) run at an interval against a server.
struct RoundTripWatch {
  int64_t runs = 0, failed_runs = 0, changed = 0;  // changed: runs whose verdict was that
  double last_unix_s = 0;
  std::string last_verdict, last_reason;
  std::map<std::string, double> excess_by_tier;  // the last run's KL excess over the floor
};

struct WatchState {
  std::string source;        // the file, "stdin" or the server URL
  bool source_up = false;    // the file exists / the server answered its last poll
  int64_t lines = 0;         // lines read from the stream
  int64_t launches = 0;      // launches seen
  int64_t changes = 0;       // times what the latest launch shows changed
  int64_t rotations = 0;     // the followed path named a new file
  int64_t truncations = 0;   // the followed file shrank (copytruncate)
  int64_t polls_failed = 0;  // server polls that got no answer
  double last_check_unix_s = 0;
  std::optional<LaunchState> latest;
  AcceptanceState acceptance;  // servers only
  RoundTripWatch roundtrip;    // servers with --roundtrip-every only
};

// The metrics in the Prometheus text format (0.0.4), every family with HELP and TYPE.
std::string render_metrics(const WatchState& state);

// One line for people (the journal of the watcher itself): what the latest launch shows and
// whether it meets the expectations.
std::string describe(const LaunchState& launch);

// ---------------------------------------------------------------- expectations

// The expectations in `kvaudit check --json` output: the recommended option's `expect`
// list, or the launch's own (`as-launched`) when it needs no fix. Throws InputError(path).
std::vector<logs::Expectation> expectations_from_check_json(const std::filesystem::path& path);

// Checks `launch` against `expectations` (logs::check_expectations) and sets what fails and
// what is still pending.
void judge(const engines::Registry& registry, const logs::Launch& launch,
           const std::vector<logs::Expectation>& expectations, LaunchState& state);

// ---------------------------------------------------------------- logs

struct WatchOptions {
  std::vector<logs::Expectation> expectations;
  AcceptanceOptions acceptance;
  audit::KvPolicy kv_policy = audit::KvPolicy::evidence;
  size_t max_launches = 4;  // launches the stream keeps: the latest is the one shown
  size_t max_line_bytes = 1 << 20;
};

// Reads a followed log line by line into the state.
class LogWatcher {
 public:
  LogWatcher(const engines::Registry& registry, std::string source, WatchOptions options);
  // One line of the stream. True when what the latest launch shows changed.
  bool add_line(std::string_view line, double now_unix_s);
  const WatchState& state() const { return state_; }
  WatchState& state() { return state_; }

 private:
  const engines::Registry& registry_;
  WatchOptions options_;
  logs::LogStream stream_;
  WatchState state_;
};

// Splits bytes into lines of at most max_line_bytes (the rest of a longer line is dropped),
// holding at most one partial line between calls.
class LineSplitter {
 public:
  explicit LineSplitter(size_t max_line_bytes) : max_line_bytes_(max_line_bytes) {}
  void feed(std::string_view bytes, const std::function<void(std::string_view)>& on_line);
  // The partial line at the end of a stream that ended without '\n'.
  void flush(const std::function<void(std::string_view)>& on_line);
  void clear();

 private:
  size_t max_line_bytes_;
  std::string partial_;
  bool skipping_ = false;  // inside the dropped tail of an over-long line
};

// Follows a file as `tail -F` does: what is appended, a new file at the path after a rename
// or delete-and-create rotation (the old one read to its end first), the start again after a
// truncation, and a path that is absent for a while.
class FileFollower {
 public:
  FileFollower(std::filesystem::path path, size_t max_line_bytes);
  ~FileFollower();
  FileFollower(const FileFollower&) = delete;
  FileFollower& operator=(const FileFollower&) = delete;

  struct Poll {
    int64_t lines = 0;
    bool present = false;  // the path names a readable file
    bool rotated = false;
    bool truncated = false;
  };
  // Reads everything there is now (at most max_bytes), line by line.
  Poll poll(const std::function<void(std::string_view)>& on_line, size_t max_bytes = 64 << 20);

 private:
  std::filesystem::path path_;
  LineSplitter splitter_;
  int fd_ = -1;
  uint64_t offset_ = 0;
  uint64_t device_ = 0, inode_ = 0;
};

// ---------------------------------------------------------------- servers

// Polls a live server (probe's detection: SGLang /server_info, vLLM /metrics, ...). A poll
// with no answer marks the source down; an answer after that, or one whose facts differ
// from the last, is a new launch.
class ServerWatcher {
 public:
  ServerWatcher(const engines::Registry& registry, std::string url, WatchOptions options,
                net::ClientOptions client);
  // True when what the latest launch shows changed.
  bool poll(double now_unix_s);
  const WatchState& state() const { return state_; }
  WatchState& state() { return state_; }

 private:
  const engines::Registry& registry_;
  WatchOptions options_;
  net::ClientOptions client_options_;
  std::string fingerprint_;
  WatchState state_;
};

// ---------------------------------------------------------------- running

// Serves GET /metrics (the latest text set) from its own thread.
class MetricsServer {
 public:
  // Binds host:port (port 0: any free port); throws InputError("host:port") when it cannot.
  MetricsServer(const std::string& host, int port);
  ~MetricsServer();  // stops and joins
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;
  int port() const;
  void set(std::string metrics);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

enum class SourceKind { stdin_stream, file, server };
SourceKind source_kind(const std::string& source);  // "-", an http(s) URL, else a file

struct RunOptions {
  std::string source;  // "-" (stdin), a file, or an http(s):// URL
  WatchOptions watch;
  double interval_s = 1.0;  // between polls of a file or a server
  bool once = false;        // read what there is (stdin: to its end), poll a server once, stop
  double for_s = 0;         // stop after this long (0: until `stopping`)
  net::ClientOptions client;
  // A server: run probe --roundtrip every this many seconds (0: never). It sends filler that
  // evicts the server's prefix cache, so it is asked for, never on by default.
  double roundtrip_every_s = 0;
  probe::RoundTripOptions roundtrip;
};

// Follows the source until it ends (stdin), `once` is done, for_s passed or stopping()
// says so. Calls on_change after each change of what the latest launch shows, and
// on_metrics with the rendered metrics after every read or poll. Returns the final state.
// Throws InputError for a source that cannot be followed (a folder, binary data).
WatchState run(const engines::Registry& registry, const RunOptions& options,
               const std::function<bool()>& stopping,
               const std::function<void(const WatchState&)>& on_change,
               const std::function<void(const std::string&)>& on_metrics);

}  // namespace kvaudit::watch
