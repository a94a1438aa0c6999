// Names of the engine model's enums (log message kinds, audit verdicts, source kinds), and
// the fields a log template may capture.

#include "engines/internal.h"

namespace kvaudit::engines {

std::string_view log_kind_name(LogKind kind) {
  switch (kind) {
    case LogKind::launch_args:
      return "launch_args";
    case LogKind::engine_version:
      return "engine_version";
    case LogKind::engine_config:
      return "engine_config";
    case LogKind::load_begin:
      return "load_begin";
    case LogKind::load_end:
      return "load_end";
    case LogKind::weights_loaded:
      return "weights_loaded";
    case LogKind::kv_dtype_used:
      return "kv_dtype_used";
    case LogKind::kv_pool_allocated:
      return "kv_pool_allocated";
    case LogKind::state_pool_allocated:
      return "state_pool_allocated";
    case LogKind::swa_pool:
      return "swa_pool";
    case LogKind::token_summary:
      return "token_summary";
    case LogKind::memory_pool_end:
      return "memory_pool_end";
    case LogKind::available_kv_memory:
      return "available_kv_memory";
    case LogKind::kv_cache_size:
      return "kv_cache_size";
    case LogKind::max_concurrency:
      return "max_concurrency";
    case LogKind::gpu_blocks:
      return "gpu_blocks";
    case LogKind::scale_unit_fallback:
      return "scale_unit_fallback";
    case LogKind::scale_warning:
      return "scale_warning";
    case LogKind::scale_not_loaded:
      return "scale_not_loaded";
    case LogKind::scales_loaded:
      return "scales_loaded";
    case LogKind::nvfp4_unit_global:
      return "nvfp4_unit_global";
    case LogKind::ready:
      return "ready";
    case LogKind::startup_error:
      return "startup_error";
    case LogKind::deprecation:
      return "deprecation";
    case LogKind::flag_ignored:
      return "flag_ignored";
    case LogKind::dtype_fallback:
      return "dtype_fallback";
    case LogKind::startup_progress:
      return "startup_progress";
    case LogKind::kv_dtype_requested:
      return "kv_dtype_requested";
    case LogKind::running_requests_capped:
      return "running_requests_capped";
    case LogKind::launch_setting:
      return "launch_setting";
    case LogKind::kv_tier:
      return "kv_tier";
  }
  return "?";
}

namespace {

// Every field a log template may name, and whether it holds a number (its placeholder then
// matches numbers only, whatever the format spec says).
struct LogField {
  std::string_view name;
  bool numeric;
};

constexpr LogField kLogFields[] = {
    {"", false},  // a placeholder nobody reads
    {"server_args_repr", false},
    {"non_default_args_repr", false},
    {"engine_config", false},
    {"engine_version", false},
    {"avail_mem_gib", true},
    {"mem_usage_gib", true},
    {"model_class", false},
    {"load_details", false},
    {"model_dtype", false},
    {"kv_dtype", false},
    {"pool_tokens", true},
    {"k_gib", true},
    {"v_gib", true},
    {"kv_gib", true},
    {"mamba_slots", true},
    {"conv_gib", true},
    {"ssm_gib", true},
    {"full_tokens", true},
    {"swa_tokens", true},
    {"max_total_num_tokens", true},
    {"max_running_requests", true},
    {"context_len", true},
    {"summary_details", false},
    {"available_kv_gib", true},
    {"kv_cache_tokens", true},
    {"concurrency_context", true},
    {"concurrency_x", true},
    {"gpu_blocks", true},
    {"cpu_blocks", true},
    {"weights_gib", true},
    {"scale_name", false},
    {"tensor_example", false},
    {"expected_name", false},
    {"scales_file", false},
    {"model_name", false},
    {"error_detail", false},
    {"argument", false},
    {"namespace_args_repr", false},
    {"mem_fraction_static", true},
    {"max_total_tokens_arg", true},
    {"block_size", true},
    {"dp_size", true},
    {"max_num_batched_tokens", true},  // vLLM's scheduler budget (sliding-window admission)
    {"quantization", false},
    {"peak_gib", true},                    // TensorRT-LLM profile: peak memory while profiling
    {"total_gpu_gib", true},               // the device's total memory
    {"tmp_kv_gib", true},                  // the estimation cache held during profiling
    {"memory_fraction", true},             // free_gpu_memory_fraction as the engine holds it
    {"kv_bytes_per_token", true},          // "kv size is N" / "kv size per token is N"
    {"max_tokens_arg", true},              // a token cap the launch set
    {"requested_running_requests", true},  // the max_running_requests a launch asked for
    {"state_slots_per_request", true},     // SGLang: mamba state slots per running request
    {"host_pool_gb", true},                // SGLang HiCache: one host pool's size (1e9 bytes)
    {"kv_connector", false},               // vLLM: the KV connector class the factory built
};

}  // namespace

const std::vector<std::string>& log_field_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const LogField& field : kLogFields) out.emplace_back(field.name);
    return out;
  }();
  return names;
}

bool is_numeric_log_field(std::string_view name) {
  for (const LogField& field : kLogFields)
    if (field.name == name) return field.numeric;
  return false;
}

std::string_view audit_verdict_name(AuditVerdict verdict) {
  switch (verdict) {
    case AuditVerdict::confirmed:
      return "confirmed";
    case AuditVerdict::corrected:
      return "corrected";
    case AuditVerdict::stale:
      return "stale";
    case AuditVerdict::unverifiable:
      return "unverifiable";
    case AuditVerdict::added:
      return "added";
  }
  return "?";
}

std::string_view source_kind_name(SourceKind kind) {
  switch (kind) {
    case SourceKind::release_code:
      return "release_code";
    case SourceKind::merged_pr:
      return "merged_pr";
    case SourceKind::issue_report:
      return "issue_report";
    case SourceKind::release_log:
      return "release_log";
    case SourceKind::docs:
      return "docs";
  }
  return "?";
}

}  // namespace kvaudit::engines
