// decide: the motivating question answered in one report. For a checkpoint and a launch,
// every KV option the engine release offers (the launch as it is, a 16-bit cache, FP8 with
// calibrated scales, the other dtypes it accepts), each judged by the same audit `check`
// runs and sized by the same capacity model `plan` runs: resolved dtype, scale source,
// findings left, KV tokens per GPU and concurrency at the context lengths asked for. Then
// the fix as an edited unit or command line (every other byte kept), and the commands that
// prove it after the restart. Not here: the rules (audit/), the arithmetic (plan/), the
// scale carriers (calibrate/), rendering (report/).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "audit/audit.h"
#include "plan/plan.h"
#include "report/report.h"

namespace kvaudit::decide {

// What sizes each option's KV pool: a GPU (preset or size) with the launch's memory
// fraction (or the engine's default), or the memory a start-up log printed.
struct MemorySource {
  std::optional<int64_t> gpu_memory_bytes;
  std::string gpu_name;
  std::optional<plan::LoggedMemory> logged;  // --from-log: the launch's printed figures
  std::string log_label;
};

struct DecisionOptions {
  std::vector<int64_t> contexts;  // empty: 32K, 128K and the launch's context length
  MemorySource memory;
};

struct KvOption {
  std::string id;          // "as-launched", "bf16", "fp8-calibrated", "fp8_e5m2", ...
  std::string label;       // "as launched", "16-bit KV cache", ...
  std::string change;      // what to do: "--kv-cache-dtype bf16", "kvaudit calibrate ...", ""
  std::string flag_value;  // the --kv-cache-dtype value this option launches with
  // The engine has no value for this option: it runs a checkpoint-config overlay (TensorRT-LLM's
  // 16-bit cache), under flag_value (auto).
  bool overlay = false;
  std::string how;  // the full commands, where `change` is a summary
  bool possible = true;
  std::string why_not;  // when not possible: the engine data's reason
  std::string kv_cache_dtype;
  bool kv_quantized = false;  // narrower than 16 bits (scales matter)
  std::string scale_source;
  int critical = 0, warning = 0;
  std::vector<std::string> finding_ids;  // critical and warning ones
  // Known-bad combinations this option hits ("id", or "id (possible)" when the GPU or
  // backend that decides it is not known).
  std::vector<std::string> known_bad;
  std::optional<plan::TokenInterval> tokens;  // KV tokens per GPU pool (max_total_num_tokens)
  bool tokens_from_log = false;  // the exact range a log's printed memory allows, not an estimate
  std::vector<plan::ConcurrencyPoint> concurrency;
};

struct Decision {
  std::vector<KvOption> options;  // as-launched first
  std::vector<int64_t> contexts;
  std::string recommended;  // id of the option the fix applies ("" when nothing to fix)
  std::string alternative;  // id of a capacity-keeping option, when one is clean
  std::string memory_note;  // how the pools were sized, or which flag would size them
  bool sized = false;       // memory known: every option judged and sized
  std::vector<std::string> notes;
};

// Judges and sizes every option. `as_launched` is the result check already has.
Decision decide(const engines::Registry& registry, const audit::CheckInput& input,
                const audit::CheckResult& as_launched, const DecisionOptions& options);

// ---------------------------------------------------------------- the fix

// The launch with --kv-cache-dtype set to `value` (the engine's spelling): an existing flag
// keeps its place and form ("--kv-cache-dtype=x" or "--kv-cache-dtype x"), a missing one is
// appended after the last argument. Every other byte is kept.
std::string fix_command(const std::string& command, const engines::EngineModel& engine,
                        const std::string& value);
// The same on a systemd unit's ExecStart (continuation lines and all). Throws InputError
// naming `label` when the unit has no ExecStart.
std::string fix_unit(const std::string& unit_text, const engines::EngineModel& engine,
                     const std::string& value, const std::string& label);
// A launch file (manifest, compose file, --config file) with its KV dtype set to `value`
// at each edit (one per launch the file holds; all edits of `text`'s file). Every other
// byte is kept. Throws InputError(label) when edits overlap.
std::string fix_launch_file(const std::string& text, std::vector<engines::TextEdit> edits,
                            const std::string& value, const std::string& label);

// The commands that prove the fix took effect after the restart: the latest launch of
// the journal against what the table predicts (dtype, scale fallback, capacity), a smoke
// probe, and the A/B that would measure what the old launch lost.
// Where the restarted server answers: the launch's --host/--port (a wildcard bind is reached
// on the loopback), else the engine's default port, with where that default is read.
struct ServerAddress {
  std::string url;          // "http://127.0.0.1:30000"
  std::string port_source;  // "" when --port was given, else the engine source of the default
};
ServerAddress server_address(const engines::LaunchFlags& flags, const engines::EngineModel& engine);

struct Verification {
  std::string unit_name;    // "sglang" for sglang.service ("" without a unit)
  std::string url;          // from the launch's --host/--port, else the engine's default
  std::string port_source;  // server_address's, for the note on the probe line
  // The engine's start-up log never names the KV dtype (TensorRT-LLM): logs then reads the
  // served checkpoint folder, and plan --from-log proves the dtype from the printed bytes
  // per token.
  bool log_names_kv_dtype = true;
  std::string checkpoint;  // the folder the fixed launch serves (an overlay, when written)
};
// Whether an engine's start-up lines name the KV dtype it runs (a template that carries it).
bool log_names_kv_dtype(const engines::EngineModel& engine);
std::vector<std::string> verification_commands(const Decision& decision, const KvOption& fixed,
                                               const Verification& where);

// The expectations `kvaudit logs --expect` checks for an option ("kv_cache_dtype=bf16",
// "scale_fallback=false", and "max_total_tokens=LO..HI" when the range came from a log: a
// GPU preset's count is an estimate, and an expectation must not fail a correct launch).
std::vector<std::string> expectations_for(const KvOption& option);

// The decision table, the fix and the verification commands as report tables and notes.
void add_to_report(const Decision& decision, const std::vector<std::string>& fix_lines,
                   const std::vector<std::string>& verify_lines, report::Report& out);

}  // namespace kvaudit::decide
