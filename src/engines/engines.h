// engines: what SGLang and vLLM do with the KV cache, as versioned data
// (data/engines/<engine>.json) plus the small generic code that applies it:
// launch-command parsing, version ranges, dtype resolution under `auto`, and
// which checkpoint scales a given version loads. Knows engines, not findings.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"

namespace kvaudit::engines {

// ---------------------------------------------------------------- versions

struct Version {
  int major = 0, minor = 0, patch = 0;
  bool latest = false;  // "latest" / unspecified: newer than every known release
  auto operator<=>(const Version&) const = default;
};
// "0.5.9", "v0.5.9", "0.5.9.post1", "0.5" and "0.5.x" (= highest 0.5), "latest" or "".
std::optional<Version> parse_version(std::string_view text);
std::string version_text(const Version& version);
// ">=0.4.0 <0.5.10", "*", "<0.11.0": space-separated comparisons, all must hold.
bool version_in_range(const Version& version, std::string_view range);

// ---------------------------------------------------------------- launch flags

struct LaunchFlags {
  std::string engine;          // "sglang" | "vllm"
  std::string engine_version;  // as given ("" = latest known behaviour)
  std::string kv_cache_dtype = "auto";
  std::string kv_cache_dtype_flag;  // spelling seen ("--kv-cache-dtype"), empty if defaulted
  std::string model_path;
  int tp = 1;
  int pp = 1;
  int dp = 1;
  bool dp_attention = false;
  std::string quantization_param_path;
  std::string quantization;               // --quantization
  std::string dtype = "auto";             // --dtype
  std::optional<int64_t> context_length;  // --context-length / --max-model-len
  std::optional<double> memory_fraction;  // --mem-fraction-static / --gpu-memory-utilization
  std::string mamba_ssm_dtype;            // --mamba-ssm-dtype / --mamba-ssm-cache-dtype
  bool calculate_kv_scales = false;       // vLLM --calculate-kv-scales
  std::optional<int64_t> max_total_tokens;
  std::optional<int> page_size;
  std::string source;  // "flags", "launch command", "unit FILE"
  std::vector<std::string> ignored_arguments;
};

// Parses a shell command line (quotes, backslash-newlines, `bash -c '...'`, docker
// wrappers) that starts SGLang or vLLM. Throws InputError(label, ...) when it
// starts neither.
LaunchFlags parse_launch_command(std::string_view command_line, const std::string& label);
// Reads a systemd unit: [Service] ExecStart= with continuations, Environment=
// (expanded in ExecStart as systemd does).
LaunchFlags parse_systemd_unit(const std::filesystem::path& unit_file);
// Splits a command line into words as a POSIX shell would (no expansion).
std::vector<std::string> split_shell_words(std::string_view command_line, const std::string& label);

// ---------------------------------------------------------------- engine data

// One engine's data file, loaded and checked. Rules keep their JSON so new fields
// need no code; typed accessors below cover what the code reads.
struct EngineData {
  std::string engine;
  std::filesystem::path file;
  std::string latest_known_version;
  nlohmann::json document;
};
EngineData load_engine_data(std::string_view engine);  // data_dir()/engines/<engine>.json
std::vector<std::string> known_engines();

// The --kv-cache-dtype values this version accepts (as spelled on the CLI).
std::vector<std::string> kv_cache_dtype_choices(const EngineData& data, const Version& version);
// CLI spelling -> normalised dtype ("bfloat16" -> "bf16", "fp8" -> "fp8_e4m3").
std::string normalise_kv_dtype(const EngineData& data, std::string_view cli_value);

// ---------------------------------------------------------------- resolution

// How one layer's K/V scales end up in the engine.
struct ScaleLoad {
  int layer = -1;
  std::optional<float> k_scale;  // what the engine will use, when it uses a checkpoint value
  std::optional<float> v_scale;
};

struct DroppedScales {
  std::string rule_id;
  std::string reason;
  std::string reference;
  std::string status;  // "open", "fixed in X", "fix merged, release unverified"
  std::vector<std::string> tensor_names;
};

struct ResolvedKv {
  std::string engine;
  Version version;
  std::string requested;       // normalised CLI value ("auto", "bf16", ...)
  std::string kv_cache_dtype;  // normalised resolved dtype: bf16, fp16, fp8_e4m3, fp8_e5m2, ...
  std::string rule_id;         // auto_resolution rule that decided
  std::string rule_reference;
  std::string reason;      // one sentence: why this dtype
  bool quantized = false;  // resolved dtype narrower than 16 bits
  // Where the scales come from: "not_applicable" (16-bit cache), "checkpoint",
  // "quantization_param_path", "dynamic", "unit_default" (1.0).
  std::string scale_source = "not_applicable";
  std::vector<DroppedScales> dropped;  // scales present but not loaded
  std::vector<std::string> loaded_scale_names;
  bool scale_warning_logged = false;  // will the engine log a scale warning
  std::string scale_warning_text;
};

ResolvedKv resolve_kv(const checkpoint::ModelFacts& model, const LaunchFlags& flags,
                      const EngineData& data);

}  // namespace kvaudit::engines
