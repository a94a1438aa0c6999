// logs parse: what each recognised line says about its launch. Launch boundaries
// come from start-up markers (systemd `Started`, SGLang `server_args=`, vLLM's
// version, args and engine-config lines): a marker opens a new launch when the
// current one has already passed that stage. Memory figures printed once per TP
// rank keep the minimum, as the engines do.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include "logs/parse.h"
#include "util/util.h"

namespace kvaudit::logs {

namespace {

enum Stage { kSystemd = 0, kVersion = 1, kArgs = 2, kEngineInit = 3, kLoading = 5, kReady = 8 };

bool contains(std::string_view text, std::string_view part) {
  return text.find(part) != std::string_view::npos;
}

// The number printed right after `key` (spaces skipped, thousands commas allowed).
std::optional<double> number_after(std::string_view text, std::string_view key) {
  size_t at = text.find(key);
  if (at == std::string_view::npos) return std::nullopt;
  size_t i = at + key.size();
  while (i < text.size() && text[i] == ' ') ++i;
  std::string digits;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.' ||
                             text[i] == ',' || (digits.empty() && text[i] == '-'))) {
    if (text[i] == ',') {
      // A comma then exactly three digits is a thousands separator; else it ends the number.
      auto digit = [&](size_t k) {
        return k < text.size() && std::isdigit(static_cast<unsigned char>(text[k]));
      };
      if (!digits.empty() && digit(i + 1) && digit(i + 2) && digit(i + 3) && !digit(i + 4)) {
        ++i;
        continue;
      }
      break;
    }
    digits += text[i++];
  }
  while (!digits.empty() && digits.back() == '.') digits.pop_back();
  if (digits.empty() || digits == "-") return std::nullopt;
  char* end = nullptr;
  double value = std::strtod(digits.c_str(), &end);
  if (end != digits.c_str() + digits.size()) return std::nullopt;
  return value;
}

std::optional<int64_t> int_after(std::string_view text, std::string_view key) {
  auto v = number_after(text, key);
  if (!v || *v < 0 || *v > 9.0e18) return std::nullopt;
  return static_cast<int64_t>(*v);
}

void keep_min(std::optional<double>& slot, std::optional<double> value) {
  if (value && (!slot || *value < *slot)) slot = value;
}

std::string word_after(std::string_view text, std::string_view key) {
  size_t at = text.find(key);
  if (at == std::string_view::npos) return "";
  size_t i = at + key.size();
  while (i < text.size() && text[i] == ' ') ++i;
  size_t j = i;
  while (j < text.size() && text[j] != ' ' && text[j] != ',' && text[j] != ')' && text[j] != ';')
    ++j;
  return std::string(text.substr(i, j - i));
}

std::string clip(std::string_view text, size_t n = 300) {
  return std::string(text.substr(0, std::min(n, text.size())));
}

}  // namespace

Launch& LaunchBuilder::current(int64_t line_no, const std::string& timestamp) {
  if (launches_.empty()) {
    Launch launch;
    launch.index = next_index_++;
    launch.first_line = line_no;
    launch.start_time = timestamp;
    launches_.push_back(std::move(launch));
  }
  Launch& launch = launches_.back();
  launch.last_line = line_no;
  if (!timestamp.empty()) launch.end_time = timestamp;
  if (launch.start_time.empty()) launch.start_time = timestamp;
  return launch;
}

Launch& LaunchBuilder::start_marker(int stage, int64_t line_no, const std::string& timestamp) {
  if (!launches_.empty() && launches_.back().stage >= stage) {
    Launch launch;
    launch.index = next_index_++;
    launch.first_line = line_no;
    launch.start_time = timestamp;
    launches_.push_back(std::move(launch));
    if (launches_.size() > max_launches_) {
      launches_.pop_front();
      ++dropped_;
    }
  }
  Launch& launch = current(line_no, timestamp);
  launch.stage = std::max(launch.stage, stage);
  return launch;
}

void LaunchBuilder::record_failure(Launch& launch, const std::string& kind,
                                   const std::string& message, int64_t line_no) {
  if (launch.failures.size() >= 20) {
    ++launch.failures_dropped;
    return;
  }
  launch.failures.push_back({line_no, kind, clip(message), launch.ready});
}

void LaunchBuilder::apply_server_args(Launch& launch, const nlohmann::json& args, bool complete) {
  launch.engine = "sglang";
  launch.server_args = args;
  launch.server_args_complete = complete;
  if (!args.is_object()) return;
  auto str = [&](const char* key) {
    return args.contains(key) && args[key].is_string() ? args[key].get<std::string>()
                                                       : std::string();
  };
  auto num = [&](const char* key) -> std::optional<double> {
    if (args.contains(key) && args[key].is_number()) return args[key].get<double>();
    return std::nullopt;
  };
  launch.model_path = str("model_path");
  if (args.contains("kv_cache_dtype") && args["kv_cache_dtype"].is_string())
    launch.kv_cache_dtype_requested = args["kv_cache_dtype"].get<std::string>();
  launch.quantization_param_path = str("quantization_param_path");
  if (auto tp = num("tp_size")) launch.tp = static_cast<int>(*tp), launch.memory.tp = launch.tp;
  if (auto pp = num("pp_size")) launch.pp = static_cast<int>(*pp), launch.memory.pp = launch.pp;
  launch.memory.mem_fraction_static = num("mem_fraction_static");
  if (auto page = num("page_size")) launch.memory.page_size = static_cast<int>(*page);
  launch.memory.mamba_full_memory_ratio = num("mamba_full_memory_ratio");
  if (auto cap = num("max_total_tokens"))
    launch.memory.max_total_tokens_arg = static_cast<int64_t>(*cap);
  if (auto ctx = num("context_length")) launch.context_length = static_cast<int64_t>(*ctx);
  std::string dtype = str("dtype");
  if (!dtype.empty() && dtype != "auto") launch.model_dtype = plan::normalise_dtype_name(dtype);
}

void LaunchBuilder::apply_vllm_args(Launch& launch, const nlohmann::json& args) {
  launch.engine = "vllm";
  if (launch.server_args.is_null()) launch.server_args = args;
  if (!args.is_object()) return;
  for (const char* key : {"model", "model_tag"})
    if (args.contains(key) && args[key].is_string() && launch.model_path.empty())
      launch.model_path = args[key].get<std::string>();
  if (args.contains("kv_cache_dtype") && args["kv_cache_dtype"].is_string())
    launch.kv_cache_dtype_requested = args["kv_cache_dtype"].get<std::string>();
  if (args.contains("tensor_parallel_size") && args["tensor_parallel_size"].is_number())
    launch.tp = args["tensor_parallel_size"].get<int>(), launch.memory.tp = launch.tp;
  if (args.contains("block_size") && args["block_size"].is_number())
    launch.memory.block_size = args["block_size"].get<int>();
  if (args.contains("max_model_len") && args["max_model_len"].is_number())
    launch.context_length = args["max_model_len"].get<int64_t>();
  if (args.contains("dtype") && args["dtype"].is_string()) {
    std::string d = plan::normalise_dtype_name(args["dtype"].get<std::string>());
    if (!d.empty() && d != "auto") launch.model_dtype = d;
  }
}

void LaunchBuilder::apply_vllm_engine_config(Launch& launch, std::string_view message) {
  launch.engine = "vllm";
  size_t v = message.find("engine (v");
  if (v != std::string_view::npos) {
    size_t end = message.find(')', v);
    if (end != std::string_view::npos)
      launch.engine_version = std::string(message.substr(v + 9, end - v - 9));
  }
  std::string model = word_after(message, "model=");
  if (model.size() >= 2 && (model.front() == '\'' || model.front() == '"'))
    model = model.substr(1, model.size() - 2);
  if (!model.empty() && launch.model_path.empty()) launch.model_path = model;
  std::string dtype = word_after(message, " dtype=");
  if (!dtype.empty()) {
    std::string d = plan::normalise_dtype_name(dtype);
    if (!d.empty()) launch.model_dtype = d;
  }
  std::string kv = word_after(message, "kv_cache_dtype=");
  if (!kv.empty() && launch.kv_cache_dtype_requested.empty()) launch.kv_cache_dtype_requested = kv;
  if (auto tp = int_after(message, "tensor_parallel_size="))
    launch.tp = static_cast<int>(*tp), launch.memory.tp = launch.tp;
  if (auto ctx = int_after(message, "max_seq_len=")) launch.context_length = ctx;
}

void LaunchBuilder::handle(std::string_view raw_line, int64_t line_no) {
  LogLine line = normalise_line(raw_line);
  const std::string& m = line.message;
  const std::string& ts = line.timestamp;

  // systemd
  if (line.journal_ident == "systemd") {
    if (m.rfind("Started ", 0) == 0 || m.rfind("Starting ", 0) == 0) {
      start_marker(kSystemd, line_no, ts);
    } else if (contains(m, "Main process exited") || contains(m, "Failed with result")) {
      if (!launches_.empty()) record_failure(current(line_no, ts), "exited", m, line_no);
    }
    return;
  }

  // Launch markers.
  if (size_t at = m.find("server_args=ServerArgs("); at != std::string::npos) {
    Launch& launch = start_marker(kArgs, line_no, ts);
    ReprResult parsed = parse_python_repr(std::string_view(m).substr(at + 12));
    apply_server_args(launch, parsed.value, parsed.complete);
    return;
  }
  if (contains(m, "vLLM API server version")) {
    Launch& launch = start_marker(kVersion, line_no, ts);
    launch.engine = "vllm";
    launch.engine_version = word_after(m, "vLLM API server version");
    return;
  }
  if (size_t at = m.find("non-default args:"); at != std::string::npos) {
    Launch& launch = start_marker(kArgs, line_no, ts);
    ReprResult parsed = parse_python_repr(std::string_view(m).substr(at + 17));
    apply_vllm_args(launch, parsed.value);
    return;
  }
  if (contains(m, "LLM engine (v")) {
    Launch& launch = start_marker(kEngineInit, line_no, ts);
    apply_vllm_engine_config(launch, m);
    return;
  }

  Launch& launch = current(line_no, ts);
  if (!line.rank.empty() && launch.ranks_seen.size() < 1024) launch.ranks_seen.insert(line.rank);
  auto loading = [&] { launch.stage = std::max<int>(launch.stage, kLoading); };
  auto mark_vllm = [&] {
    if (launch.engine.empty()) launch.engine = "vllm";
  };

  // SGLang start-up.
  if (contains(m, "Load weight begin")) {
    if (launch.engine.empty()) launch.engine = "sglang";
    keep_min(launch.memory.total_before_load_gib, number_after(m, "avail mem="));
    loading();
  } else if (contains(m, "Load weight end")) {
    if (launch.engine.empty()) launch.engine = "sglang";
    keep_min(launch.memory.avail_after_weights_gib, number_after(m, "avail mem="));
    if (auto usage = number_after(m, "mem usage=")) launch.weights_gib = usage;
    std::string dtype = word_after(m, "dtype=");
    if (!dtype.empty() && launch.model_dtype.empty())
      launch.model_dtype = plan::normalise_dtype_name(dtype);
    loading();
  } else if (contains(m, "Using KV cache dtype")) {
    std::string d = plan::normalise_dtype_name(word_after(m, "Using KV cache dtype:"));
    if (!d.empty())
      launch.kv_cache_dtype_resolved = d,
      launch.resolved_evidence = fmt::format("log:{}: {}", line_no, clip(m, 120));
    loading();
  } else if (contains(m, "KV Cache is allocated")) {
    if (launch.engine.empty()) launch.engine = "sglang";
    if (auto n = int_after(m, "#tokens:")) launch.memory.pool_tokens = n;
    if (auto k = number_after(m, "K size:")) launch.memory.k_gib = k;
    if (auto v = number_after(m, "V size:")) launch.memory.v_gib = v;
    if (auto kv = number_after(m, "KV size:")) launch.memory.kv_gib = kv;
    std::string d = plan::normalise_dtype_name(word_after(m, "dtype:"));
    if (!d.empty() && launch.kv_cache_dtype_resolved.empty())
      launch.kv_cache_dtype_resolved = d,
      launch.resolved_evidence = fmt::format("log:{}: {}", line_no, clip(m, 120));
    if (!launch.max_total_tokens) launch.max_total_tokens = launch.memory.pool_tokens;
    loading();
  } else if (contains(m, "Mamba Cache is allocated")) {
    if (auto n = int_after(m, "max_mamba_cache_size:")) launch.memory.mamba_slots = n;
    if (auto c = number_after(m, "conv_state size:")) launch.memory.conv_gib = c;
    if (auto s = number_after(m, "ssm_state size:")) launch.memory.ssm_gib = s;
    loading();
  } else if (contains(m, "max_total_num_tokens=")) {
    launch.memory.max_total_num_tokens = int_after(m, "max_total_num_tokens=");
    launch.max_total_tokens = launch.memory.max_total_num_tokens;
    launch.max_running_requests = int_after(m, "max_running_requests=");
    if (auto ctx = int_after(m, "context_len=")) launch.context_length = ctx;
    loading();
  } else if (contains(m, "fired up and ready to roll")) {
    launch.ready = true, launch.ready_line = line_no;
    launch.stage = std::max<int>(launch.stage, kReady);
  } else if (contains(m, "Using FP8 KV cache but no scaling factors")) {
    if (launch.scale_messages.size() < 64)
      launch.scale_messages.push_back({line_no, "sglang_no_scale_warning", clip(m), launch.ready});
  }
  // vLLM start-up.
  else if (contains(m, "Available KV cache memory")) {
    mark_vllm();
    launch.engine = launch.engine.empty() ? "vllm" : launch.engine;
    keep_min(launch.memory.available_kv_gib, number_after(m, "Available KV cache memory:"));
    loading();
  } else if (contains(m, "GPU KV cache size")) {
    mark_vllm();
    launch.memory.gpu_kv_cache_tokens = int_after(m, "GPU KV cache size:");
    launch.max_total_tokens = launch.memory.gpu_kv_cache_tokens;
    loading();
  } else if (contains(m, "Maximum concurrency for")) {
    mark_vllm();
    launch.memory.concurrency_context = int_after(m, "Maximum concurrency for");
    launch.memory.concurrency_x = number_after(m, "tokens per request:");
    loading();
  } else if (contains(m, "# GPU blocks:") || contains(m, "# cuda blocks:")) {
    mark_vllm();
    launch.memory.num_gpu_blocks = contains(m, "# GPU blocks:") ? int_after(m, "# GPU blocks:")
                                                                : int_after(m, "# cuda blocks:");
    launch.memory.vllm_v0 = contains(m, "CPU blocks") || launch.memory.vllm_v0;
    loading();
  } else if (contains(m, "reserved for KV Cache is")) {
    mark_vllm();
    keep_min(launch.memory.available_kv_gib, number_after(m, "reserved for KV Cache is"));
    launch.memory.vllm_v0 = true;
    if (auto w = number_after(m, "model weights take")) launch.weights_gib = w;
    loading();
  } else if (contains(m, "Memory profiling results:")) {
    mark_vllm();
    keep_min(launch.memory.available_kv_gib, number_after(m, "kv_cache_size="));
    launch.memory.vllm_v0 = true;
    loading();
  } else if (contains(m, "Loading model weights took") || contains(m, "Model loading took")) {
    mark_vllm();
    launch.weights_gib = contains(m, "Model loading took")
                             ? number_after(m, "Model loading took")
                             : number_after(m, "Loading model weights took");
    if (launch.engine.empty()) launch.engine = "vllm";
    loading();
  } else if (contains(m, "Using fp8 data type to store kv")) {
    mark_vllm();
    if (launch.kv_cache_dtype_resolved.empty())
      launch.kv_cache_dtype_resolved = "fp8_e4m3",
      launch.resolved_evidence = fmt::format("log:{}: {}", line_no, clip(m, 120));
    if (launch.scale_messages.size() < 64)
      launch.scale_messages.push_back({line_no, "vllm_fp8_accuracy_note", clip(m), launch.ready});
  } else if (contains(m, "Using KV cache scaling factor")) {
    mark_vllm();
    if (launch.scale_messages.size() < 64)
      launch.scale_messages.push_back({line_no,
                                       contains(m, "factor 1.0") ? "vllm_unit_scale" : "vllm_scale",
                                       clip(m), launch.ready});
  } else if (contains(m, "not found the expected name")) {
    mark_vllm();
    if ((contains(m, "scale") || contains(m, "kv_cache")) && launch.scale_messages.size() < 64)
      launch.scale_messages.push_back({line_no, "vllm_scale_not_loaded", clip(m), launch.ready});
  } else if (contains(m, "Application startup complete")) {
    mark_vllm();
    launch.ready = true, launch.ready_line = line_no;
    launch.stage = std::max<int>(launch.stage, kReady);
  }
  // Failures.
  else if (contains(m, "out of memory") || contains(m, "OutOfMemoryError")) {
    record_failure(launch, "oom", m, line_no);
  } else if (contains(m, "Not enough memory")) {
    record_failure(launch, "not_enough_memory", m, line_no);
  } else if (contains(m, "Traceback (most recent call last)") ||
             contains(m, "Scheduler hit an exception")) {
    if (launch.engine.empty() && contains(m, "Scheduler hit an exception"))
      launch.engine = "sglang";
    record_failure(launch, "traceback", m, line_no);
  } else if (contains(m, "Error: ") || contains(m, "AssertionError")) {
    // The exception line that ends a traceback: "ValueError: ...". Only lines that
    // start with an exception name, not request logs that quote one.
    size_t colon = m.find("Error");
    bool exception_line = colon != std::string::npos && colon < 60 &&
                          m.substr(0, colon).find(' ') == std::string::npos;
    if (exception_line) record_failure(launch, "exception", m, line_no);
  }
}

void LaunchBuilder::finish(LogScan& out) {
  out.launches_dropped = dropped_;
  for (auto& launch : launches_) {
    // A launch with no recognised content (e.g. systemd lines only) is still kept: it
    // shows a restart that never printed anything.
    if (launch.tp == 0 && !launch.ranks_seen.empty()) {
      int tp_ranks = 0;
      for (const auto& r : launch.ranks_seen)
        if (r.rfind("TP", 0) == 0 || r.rfind("rank=", 0) == 0) ++tp_ranks;
      if (tp_ranks > 0) launch.tp = tp_ranks, launch.memory.tp = tp_ranks;
    }
    if (launch.memory.tp <= 0) launch.memory.tp = std::max(1, launch.tp);
    if (launch.memory.pp <= 0) launch.memory.pp = std::max(1, launch.pp);
    // Resolved dtype when no line said it: an explicit request is what the engine
    // allocates; `auto` follows the model dtype (ModelOpt FP8 under auto logs it).
    std::string requested = plan::normalise_dtype_name(launch.kv_cache_dtype_requested);
    if (launch.kv_cache_dtype_resolved.empty() && !requested.empty() && requested != "auto") {
      launch.kv_cache_dtype_resolved = requested;
      launch.resolved_evidence = "requested --kv-cache-dtype " + launch.kv_cache_dtype_requested;
    }
    if (launch.kv_cache_dtype_resolved.empty() && requested == "auto" && launch.engine == "vllm" &&
        !launch.model_dtype.empty()) {
      launch.kv_cache_dtype_resolved = launch.model_dtype;
      launch.resolved_evidence = "kv_cache_dtype auto with model dtype " + launch.model_dtype;
    }
    launch.memory.engine = launch.engine;
    launch.memory.kv_cache_dtype = launch.kv_cache_dtype_resolved;
    if (!launch.max_total_tokens && launch.memory.num_gpu_blocks)
      launch.max_total_tokens =
          *launch.memory.num_gpu_blocks * launch.memory.block_size.value_or(16);

    // Scale fallback, from the log alone (ENGINE-FACTS §3).
    const std::string& dtype = launch.kv_cache_dtype_resolved;
    bool fp8 = dtype.rfind("fp8", 0) == 0 || dtype == "fp4_e2m1" || dtype == "nvfp4";
    bool unit_scale_logged = false, dropped_logged = false, sglang_warning = false;
    for (const auto& msg : launch.scale_messages) {
      unit_scale_logged |= msg.kind == "vllm_unit_scale";
      dropped_logged |= msg.kind == "vllm_scale_not_loaded";
      sglang_warning |= msg.kind == "sglang_no_scale_warning";
    }
    if (dtype.empty()) {
      launch.scale_fallback_reason = "the log does not say which KV dtype the launch used";
    } else if (!fp8) {
      launch.scale_fallback = false;
      launch.scale_fallback_reason = dtype + " KV cache: no scales involved";
    } else if (unit_scale_logged) {
      launch.scale_fallback = true;
      launch.scale_fallback_reason =
          "vLLM logged that it uses KV scaling factor 1.0 (it checks the loaded values)";
    } else if (dropped_logged) {
      launch.scale_fallback = true;
      launch.scale_fallback_reason = "vLLM dropped the checkpoint's KV scales (name not matched)";
    } else if (sglang_warning) {
      launch.scale_fallback_reason =
          "SGLang's 'no scaling factors provided' warning fires whenever --quantization-param-path "
          "is unset, even when the checkpoint's per-layer scales load (sgl-project/sglang#31224); "
          "the real fallback logs nothing. Pass --checkpoint to decide.";
    } else {
      launch.scale_fallback_reason =
          "no scale message: this engine version does not log whether it loaded KV scales";
    }
  }
  for (size_t i = 0; i < launches_.size(); ++i)
    add_findings(launches_[i], i + 1 == launches_.size());
  out.launches.assign(std::make_move_iterator(launches_.begin()),
                      std::make_move_iterator(launches_.end()));
}

}  // namespace kvaudit::logs
