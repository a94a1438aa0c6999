// cli: thin front end. Each command file parses its flags into plain structs,
// calls the modules, and hands a report::Report to emit(). Exit codes:
// 0 success, 1 the report fails its gate (--fail-on, --expect, ...), 2 bad input (one
// line naming the file or flag), 3 internal error (an exception that is not InputError:
// a kvaudit bug, never the user's input).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "audit/audit.h"
#include "checkpoint/checkpoint.h"
#include "report/report.h"

namespace kvaudit::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitGateFailed = 1;
inline constexpr int kExitInputError = 2;
inline constexpr int kExitInternalError = 3;

// `kvaudit --version` and the SARIF tool record.
inline constexpr const char* kVersion = KVAUDIT_VERSION;  // project(VERSION) in CMakeLists.txt

struct OutputOptions {
  bool json = false;
  std::string html_path;
  std::string sarif_path;  // --sarif FILE
  std::string junit_path;  // --junit FILE
  bool quiet = false;
  bool no_color = false;
  // Set by the command, not a flag: the input file a SARIF result points at when none of its
  // evidence names a file (check's --unit, the log of logs); see report::SarifOptions.
  std::string sarif_fallback_file = {};
};
void add_output_options(CLI::App& command, OutputOptions& options);

// Writes --html, --sarif and --junit atomically (before the exit code is known to the
// caller: a failed gate still leaves its files for CI), then prints the report (terminal or
// --json) on stdout. `gate` is what the command's exit code is decided on; JUnit shows it.
void emit(const report::Report& report, const OutputOptions& options,
          const report::ExitGate& gate = {});

// "1k,4k,32k" -> {1024, 4096, 32768}; throws InputError naming `flag` with `example`.
std::vector<int64_t> parse_token_counts(const std::string& list, const char* flag,
                                        const char* example);

// A checkpoint argument: a local folder or config.json (which wins when it exists), else a
// hub reference ("org/model[@revision]", "hf://org/model"), read without its weights.
struct CheckpointSource {
  std::string hf_token;     // --hf-token (else HF_TOKEN, HF_TOKEN_PATH, $HF_HOME/token)
  std::string hf_endpoint;  // --hf-endpoint (else HF_ENDPOINT)
  bool offline = false;     // --offline: only what the caches hold
};
void add_checkpoint_source_options(CLI::App& command, CheckpointSource& source);
checkpoint::ModelFacts read_checkpoint_argument(const std::string& argument,
                                                const CheckpointSource& source,
                                                const checkpoint::ReadOptions& read = {});

// "96GiB", "98304MiB", "80GB" (decimal), "103079215104" (bytes); InputError naming `flag`.
int64_t parse_size_bytes(const std::string& text, const std::string& flag);

// --gpu PRESET and --gpu-mem SIZE (which wins for the size; the preset's name stays):
// the bytes per GPU and the name reports show. Nothing when both are empty.
struct GpuMemory {
  std::optional<int64_t> bytes;
  std::string name;
};
GpuMemory gpu_memory_from_flags(const std::string& gpu, const std::string& gpu_mem);

// The engine data of this run (data/engines/ of the data folder), loaded on first use, so
// that --help and the commands that name no engine never read it. main() owns the one
// instance and hands it to every command, which passes the registry down by const reference.
class EngineData {
 public:
  const engines::Registry& registry();

 private:
  std::optional<engines::Registry> registry_;
};

// The published-damage table (data/evidence/kv_damage.json), linted against the registry's
// dtype vocabulary.
audit::PublishedEvidence load_published_damage(const engines::Registry& registry);
// K/V maxima measured on a model, from a kvaudit-kv-stats/1 file (InputError naming it).
audit::MeasuredKvRange measured_range(const std::string& stats_file);

// Long-running commands (serve, watch) end on SIGTERM or SIGINT. block_stop_signals() blocks
// them in this thread and every thread started after it; a StopSignalWaiter then waits for
// one in its own thread and calls on_stop once. Its destructor wakes and joins that thread,
// so a command that ends on its own does not leave it waiting.
void block_stop_signals();
class StopSignalWaiter {
 public:
  explicit StopSignalWaiter(std::function<void()> on_stop);
  ~StopSignalWaiter();
  StopSignalWaiter(const StopSignalWaiter&) = delete;
  StopSignalWaiter& operator=(const StopSignalWaiter&) = delete;

 private:
  std::thread thread_;
};

// A command registers its flags on `app` and sets `run` to what executes it once
// the command line is parsed. run returns the exit code.
using Runner = std::function<int()>;
void add_check_command(CLI::App& app, Runner& run, EngineData& engines);
void add_plan_command(CLI::App& app, Runner& run, EngineData& engines);
void add_logs_command(CLI::App& app, Runner& run, EngineData& engines);
void add_quant_command(CLI::App& app, Runner& run);
void add_tokenize_command(CLI::App& app, Runner& run);
void add_eval_command(CLI::App& app, Runner& run);
void add_probe_command(CLI::App& app, Runner& run, EngineData& engines);
void add_calibrate_command(CLI::App& app, Runner& run, EngineData& engines);
void add_serve_command(CLI::App& app, Runner& run, EngineData& engines);
void add_watch_command(CLI::App& app, Runner& run, EngineData& engines);

}  // namespace kvaudit::cli
