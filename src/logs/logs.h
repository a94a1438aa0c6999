// logs: reads SGLang and vLLM start-up logs (plain, journalctl-prefixed, docker
// compose, with ANSI colours, CRLF and interleaved TP-rank lines), streams them with
// bounded memory, splits them into launches and says what each launch really
// resolved: engine, version, model, TP, requested and resolved KV dtype, scale
// messages (and whether they prove a scale-1.0 fallback), pool sizes, token
// capacity, memory figures and failures. Not a general log viewer: lines that carry
// none of these facts are skipped without being parsed.
#pragma once

#include <cstdint>
#include <filesystem>
#include <istream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "audit/audit.h"
#include "checkpoint/checkpoint.h"
#include "engines/engines.h"
#include "plan/plan.h"
#include "report/report.h"

namespace kvaudit::logs {

// ---------------------------------------------------------------- Python repr

// The result of reading a Python repr (`ServerArgs(a=1, b='x', c=[1, None])`):
// calls become objects of their keyword arguments, None null, True/False booleans,
// tuples and sets arrays, `<Enum.X: 'x'>` and bare names strings. Never throws:
// truncated or malformed input gives what was read so far and complete=false.
struct ReprResult {
  nlohmann::json value;
  bool complete = false;
  std::string error;  // empty when complete; else the first cut or error
  size_t consumed = 0;
  int cuts = 0;  // places where the text was cut or elided (reading resumed after each)
};
ReprResult parse_python_repr(std::string_view text);

// ---------------------------------------------------------------- lines

// One log line with its wrappers removed.
struct LogLine {
  std::string message;        // the engine's text, without journal/docker/engine prefixes
  std::string timestamp;      // journal timestamp when present, else the engine's
  std::string journal_ident;  // "sglang", "systemd" ... (journal lines only)
  std::string rank;           // "TP0", "PP1 TP3", "rank=2", ...
};
// Strips CR, ANSI escape sequences and the known prefixes.
LogLine normalise_line(std::string_view raw);

// ---------------------------------------------------------------- launches

struct LogEvent {
  int64_t line = 0;  // 1-based line number in the input
  // Failures: "traceback", "oom", "exception", "engine_error", "exited". Engine messages:
  // the LogKind's name.
  std::string kind;
  std::string text;  // the message (first 300 characters)
  bool after_ready = false;
  // Engine messages only: what the template says the line means, which template, whose.
  engines::LogKind message_kind = engines::LogKind::startup_error;
  std::string template_id;
  std::string engine;
  std::string reference;  // the template's source, and its version bound when inferred
};

// A line where the engine lowered max_running_requests below what was asked or allowed.
struct RunningRequestsCap {
  int64_t effective = 0;                     // the cap in effect (per DP worker)
  std::optional<int64_t> requested;          // what the launch asked for, when printed
  std::optional<int64_t> state_slots;        // max_mamba_cache_size
  std::optional<int64_t> slots_per_request;  // state slots each running request holds
  std::string by;                            // "mamba state cache" | "KV cache capacity"
  int64_t line = 0;
  std::string message;
};

// One host pool a rank printed (SGLang HiCache: "Allocating X GB host memory for hierarchical
// KV cache."): its size in GB of 1e9 bytes, as the engine divides.
struct HostPoolLine {
  std::string rank;  // "" when the line had no rank prefix
  double gb = 0;
  int64_t line = 0;
};

// The KV tiers a launch set up besides the GPU pool, as its own lines print them.
struct KvTierLines {
  std::vector<HostPoolLine> host_pools;  // every rank's, in print order (at most 256 kept)
  std::string kv_connector;              // vLLM's connector class ("" none printed)
  int64_t connector_line = 0;
};

struct Launch {
  int index = 0;                                          // 0-based, in file order
  audit::KvPolicy kv_policy = audit::KvPolicy::evidence;  // how its findings are judged
  int64_t first_line = 0, last_line = 0;
  std::string start_time, end_time;
  std::string engine;  // an engine of the registry, "" when no line named one
  std::string engine_version;
  std::string model_path;
  nlohmann::json server_args;  // SGLang ServerArgs or vLLM non-default args; null if absent
  bool server_args_complete = true;
  int server_args_cuts = 0;  // places the line was cut or elided (fields after each read)
  int64_t server_args_line = 0;
  std::string server_args_read_by;  // where the engine data's argument names were read
  int tp = 0;                       // 0: not printed
  int pp = 0;
  int dp = 0;                        // 0: not printed
  std::optional<bool> dp_attention;  // SGLang enable_dp_attention
  std::string tp_source;             // the line that printed tp ("log:2 server_args tp_size")
  int tp_at_least = 0;               // from the rank prefixes seen (TP0..TPn-1), when tp is not
  std::set<std::string> ranks_seen;
  std::set<int> tp_ranks_seen, dp_ranks_seen;  // indices in "TP3", "rank=3", "DP1" prefixes
  std::string kv_cache_dtype_requested;  // as written ("auto", "fp8_e4m3", "bf16"); "" unknown
  std::string kv_cache_dtype_resolved;   // normalised (bf16, fp16, fp8_e4m3, ...); "" unknown
  std::string resolved_evidence;         // the line that decided it
  bool resolved_generic = false;         // decided by a bare "fp8" (any FP8 format) only
  // Decided by a rule, not a line: SGLang's auto follows the printed model dtype when no
  // line names an FP8 cache. A checkpoint that declares FP8 KV would change it.
  bool resolved_inferred = false;
  // auto on a quantized checkpoint with no line naming the cache: unknown, for --checkpoint.
  bool resolved_auto_pending = false;
  std::string model_dtype;  // "bf16" ... from the engine's config line
  std::string quantization_param_path;
  // The weight quantization the launch names (server_args quantization, vLLM's config
  // quantization=, SGLang's "quant=fp8"); "" when none is named. A quantized checkpoint
  // may declare a quantized KV cache that auto enables without a log line.
  std::string quantization;
  std::vector<LogEvent> scale_messages;  // kind: sglang_no_scale_warning, vllm_unit_scale, ...
  std::optional<bool> scale_fallback;    // null when the log cannot tell
  std::string scale_fallback_reason;
  plan::LoggedMemory memory;
  std::optional<int64_t> max_total_tokens;
  std::optional<int64_t> max_running_requests;
  std::optional<RunningRequestsCap> running_requests_cap;
  std::optional<int64_t> context_length;
  std::optional<double> weights_gib;  // per GPU, as the engine printed it
  KvTierLines tiers;
  // The tier settings its args line gave (kv_tier_flags names, as a launch command's
  // LaunchFlags::tier_settings holds them; engines::record_tier_setting).
  std::map<std::string, std::string> tier_settings;
  bool ready = false;
  int64_t ready_line = 0;
  std::vector<LogEvent> failures;
  int64_t failures_dropped = 0;
  std::vector<report::Finding> findings;
  // Set when no start-up marker opened this launch: the line that shows a new process (a
  // weights load on a rank that already loaded, with its memory free again), and why.
  std::string split_reason;
  int stage = -1;  // internal: how far start-up got
  // internal: what each rank printed of its first weights load and its KV pools, to tell a
  // new run from a second model's load and to check the figures against each other.
  struct RankFigures {
    std::optional<double> free_before_gib, free_after_gib, usage_gib;
    int64_t begin_line = 0, end_line = 0;
    bool weights_loaded = false;                           // vLLM's weight-memory line
    std::vector<std::pair<int64_t, int64_t>> pool_tokens;  // (#tokens, line), in print order
  };
  std::map<std::string, RankFigures> figures_by_rank;
};

struct LogScan {
  std::string source;
  std::vector<Launch> launches;  // file order, latest last
  int64_t launches_dropped = 0;  // oldest launches beyond the kept window
  int64_t launches_after = 0;    // later launches set aside to verify an older one (--launch N)
  uint64_t bytes = 0;
  int64_t lines = 0;
  int64_t matched_lines = 0;
  int64_t truncated_lines = 0;  // lines longer than the line cap, read in part
};

struct ScanOptions {
  size_t max_line_bytes = 1 << 20;                        // longer lines are kept in part
  size_t max_launches = 256;                              // older launches are dropped (counted)
  audit::KvPolicy kv_policy = audit::KvPolicy::evidence;  // --kv-policy, as check judges
};

// Streams a log from `in` with memory bounded by the options, whatever its size.
// Throws InputError for input that is not a text log (NUL bytes in the first block).
// `registry` gives the engines whose lines are read (their log templates and vocabulary).
LogScan scan_log(const engines::Registry& registry, std::istream& in, const std::string& label,
                 const ScanOptions& options = {});
LogScan scan_log_file(const engines::Registry& registry, const std::filesystem::path& path,
                      const ScanOptions& options = {});
LogScan scan_log_text(const engines::Registry& registry, std::string_view text,
                      const std::string& label = "log");

// A log read as it grows (kvaudit watch): lines are added as they arrive and the launches
// read so far can be looked at after any of them. Memory is bounded as scan_log's is: the
// oldest launches beyond options.max_launches are dropped, a line is read up to
// options.max_line_bytes. Lines that carry no fact cost one sampled filter pass.
class LogStream {
 public:
  LogStream(const engines::Registry& registry, std::string label, const ScanOptions& options = {});
  ~LogStream();
  LogStream(const LogStream&) = delete;
  LogStream& operator=(const LogStream&) = delete;
  // One line (a trailing '\n' is dropped). True when it matched a scan pattern: only then
  // can the launches have changed.
  bool add_line(std::string_view line);
  // The scan so far, as scan_log would return it had the log ended after the last line.
  LogScan snapshot() const;
  // Its newest launch alone, as snapshot().launches.back() would be (none before any).
  std::optional<Launch> latest() const;
  int64_t lines() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// The literal patterns the scanner looks for; a line matching none is skipped.
// (The benchmark hands the same list to grep -c -E.)
std::vector<std::string> scan_patterns(const engines::Registry& registry);

// ---------------------------------------------------------------- verification

struct Expectation {
  std::string key;  // kv_cache_dtype, scale_fallback, engine, tp, ready, max_total_tokens
  std::string value;
};
// "kv_cache_dtype=bf16" -> {key, value}; throws InputError for unknown keys.
Expectation parse_expectation(std::string_view text);

struct ExpectationResult {
  Expectation expected;
  std::string actual;  // "" when the log does not say
  bool met = false;
};
std::vector<ExpectationResult> check_expectations(const engines::Registry& registry,
                                                  const Launch& launch,
                                                  const std::vector<Expectation>& expectations);

// With the checkpoint the launch served: decides the scale fallback the log alone
// cannot (no k/v scales in the checkpoint and no --quantization-param-path under an
// FP8 cache means SGLang uses 1.0), and compares the printed capacity with plan's.
// Recomputes the launch's findings.
void cross_check_checkpoint(const engines::Registry& registry, Launch& launch,
                            const checkpoint::ModelFacts& model, bool is_latest);

// Adds the per-launch findings (silent FP8, unit scales, failures, not ready).
void add_findings(const engines::Registry& registry, Launch& launch, bool is_latest);

// Which launch a capacity reading was taken from, for people, when the log holds more than
// one ("" otherwise): every launch's lines, how an unmarked one was told apart, and the flag
// that picks another.
std::string chosen_launch_note(const LogScan& scan, const Launch& chosen);

report::Report to_report(const LogScan& scan, bool all_launches,
                         const std::vector<ExpectationResult>& expectations);

}  // namespace kvaudit::logs
