// logs parse: what each recognised line says about its launch. Lines are recognised by
// the engines' own log messages (the templates in data/engines/<engine>.json), plus the
// generic Python and systemd lines no engine data owns (tracebacks, exception lines,
// OOM, unit start and exit). Launch boundaries come from start-up markers: a marker
// opens a new launch when the current one has already passed that stage. Memory figures
// printed once per TP rank keep the minimum, as the engines do.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include "logs/parse.h"
#include "util/util.h"

namespace kvaudit::logs {

namespace {

using engines::LogKind;

enum Stage { kSystemd = 0, kVersion = 1, kArgs = 2, kEngineInit = 3, kLoading = 5, kReady = 8 };

bool contains(std::string_view text, std::string_view part) {
  return text.find(part) != std::string_view::npos;
}

std::string clip(std::string_view text, size_t n = 300) {
  return std::string(text.substr(0, std::min(n, text.size())));
}

// A number as the engines print it ("1,573,854", "94.57", "-1.05").
std::optional<double> parse_number(std::string_view text) {
  std::string digits;
  for (char c : text)
    if (c != ',') digits.push_back(c);
  while (!digits.empty() && digits.back() == ' ') digits.pop_back();
  while (!digits.empty() && digits.front() == ' ') digits.erase(digits.begin());
  if (digits.empty()) return std::nullopt;
  char* end = nullptr;
  double value = std::strtod(digits.c_str(), &end);
  if (end != digits.c_str() + digits.size() || !std::isfinite(value)) return std::nullopt;
  return value;
}

std::optional<int64_t> parse_count(std::string_view text) {
  auto v = parse_number(text);
  if (!v || *v < 0 || *v > 9.0e18 || *v != std::floor(*v)) return std::nullopt;
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

// "DP0 TP3", "PP1 TP3", "rank=2": the TP and DP indices, for the rank counts.
void note_rank_indices(Launch& launch, std::string_view rank) {
  size_t i = 0;
  while (i < rank.size()) {
    size_t end = rank.find(' ', i);
    if (end == std::string_view::npos) end = rank.size();
    std::string_view token = rank.substr(i, end - i);
    auto index = [&](size_t skip) { return parse_count(token.substr(skip)); };
    if (token.rfind("TP", 0) == 0) {
      if (auto n = index(2); n && *n < 1 << 16) launch.tp_ranks_seen.insert(static_cast<int>(*n));
    } else if (token.rfind("rank=", 0) == 0) {
      if (auto n = index(5); n && *n < 1 << 16) launch.tp_ranks_seen.insert(static_cast<int>(*n));
    } else if (token.rfind("DP", 0) == 0) {
      if (auto n = index(2); n && *n < 1 << 16) launch.dp_ranks_seen.insert(static_cast<int>(*n));
    }
    i = end + 1;
  }
}

}  // namespace

// One template that matched a line, with its captures by field name.
struct TemplateHit {
  const engines::EngineModel* engine;
  const engines::LogTemplate* log;
  std::vector<std::string> captures;
  std::optional<std::string> text(std::string_view field) const {
    for (size_t i = 0; i < log->fields.size() && i < captures.size(); ++i)
      if (log->fields[i] == field) return captures[i];
    return std::nullopt;
  }
  // A number is the capture's first word: a last placeholder captures the rest of the
  // line ("8192, available_gpu_mem=3.63 GB" after context_len=).
  static std::string_view first_word(std::string_view t) {
    size_t end = t.find(' ');
    if (end != std::string_view::npos) t = t.substr(0, end);
    while (!t.empty() && (t.back() == ',' || t.back() == ';')) t.remove_suffix(1);
    return t;
  }
  std::optional<double> number(std::string_view field) const {
    auto t = text(field);
    return t ? parse_number(first_word(*t)) : std::nullopt;
  }
  std::optional<int64_t> count(std::string_view field) const {
    auto t = text(field);
    return t ? parse_count(first_word(*t)) : std::nullopt;
  }
};

namespace {

// Every engine's log templates (engine models live for the process).
std::vector<std::pair<const engines::EngineModel*, const engines::LogTemplate*>> all_templates(
    const engines::Registry& registry) {
  std::vector<std::pair<const engines::EngineModel*, const engines::LogTemplate*>> out;
  for (const std::string& name : registry.names()) {
    const engines::EngineModel& engine = registry.engine(name);
    for (const auto& log : engine.log_templates) out.push_back({&engine, &log});
  }
  return out;
}

bool is_marker(LogKind kind) {
  return kind == LogKind::launch_args || kind == LogKind::engine_version ||
         kind == LogKind::engine_config;
}

}  // namespace

// The literal runs the scanner looks for: every template's anchor plus the generic lines.
std::vector<std::string> scan_patterns(const engines::Registry& registry) {
  std::vector<std::string> out;
  for (const auto& [engine, log] : all_templates(registry))
    if (std::find(out.begin(), out.end(), log->anchor) == out.end()) out.push_back(log->anchor);
  for (const char* generic : {"Traceback (most recent call last)", "CUDA out of memory",
                              "OutOfMemoryError", "CUDA error: out of memory", "HIP out of memory",
                              "Error: ", "Exception: ", "AssertionError", "Main process exited",
                              "Failed with result", "Started ", "Stopped "})
    out.emplace_back(generic);
  return out;
}

LaunchBuilder::LaunchBuilder(const engines::Registry& registry, size_t max_launches,
                             audit::KvPolicy kv_policy)
    : registry_(registry),
      templates_(all_templates(registry)),
      max_launches_(std::max<size_t>(1, max_launches)),
      kv_policy_(kv_policy) {}

Launch& LaunchBuilder::current(int64_t line_no, const std::string& timestamp) {
  if (launches_.empty()) return open_launch(line_no, timestamp);
  Launch& launch = launches_.back();
  launch.last_line = line_no;
  if (!timestamp.empty()) launch.end_time = timestamp;
  if (launch.start_time.empty()) launch.start_time = timestamp;
  return launch;
}

Launch& LaunchBuilder::open_launch(int64_t line_no, const std::string& timestamp) {
  Launch launch;
  launch.index = next_index_++;
  launch.kv_policy = kv_policy_;
  launch.first_line = line_no;
  launch.start_time = timestamp;
  launches_.push_back(std::move(launch));
  if (launches_.size() > max_launches_) {
    launches_.pop_front();
    ++dropped_;
  }
  return current(line_no, timestamp);
}

Launch& LaunchBuilder::start_marker(int stage, int64_t line_no, const std::string& timestamp) {
  if (!launches_.empty() && launches_.back().stage >= stage) open_launch(line_no, timestamp);
  Launch& launch = current(line_no, timestamp);
  launch.stage = std::max(launch.stage, stage);
  return launch;
}

Launch& LaunchBuilder::start_unmarked(int64_t line_no, const std::string& timestamp,
                                      std::string reason) {
  Launch& launch = open_launch(line_no, timestamp);
  launch.split_reason = std::move(reason);
  return launch;
}

void LaunchBuilder::record_failure(Launch& launch, const std::string& kind,
                                   const std::string& message, int64_t line_no) {
  if (launch.failures.size() >= 20) {
    ++launch.failures_dropped;
    return;
  }
  LogEvent event;
  event.line = line_no;
  event.kind = kind;
  event.text = clip(message);
  event.after_ready = launch.ready;
  launch.failures.push_back(std::move(event));
}

void LaunchBuilder::apply_args(Launch& launch, const engines::EngineModel& engine,
                               const nlohmann::json& args, bool complete, bool omits_defaults,
                               bool fill_only, const std::string& what, int64_t line_no) {
  if (!args.is_object()) return;
  launch.server_args_read_by = engine.log_args.provenance.reference;
  auto value_of = [&](const std::string& field) -> std::pair<const nlohmann::json*, std::string> {
    auto keys = engine.log_args.keys.find(field);
    if (keys == engine.log_args.keys.end()) return {nullptr, ""};
    for (const std::string& key : keys->second)
      if (auto it = args.find(key); it != args.end() && !it->is_null()) return {&*it, key};
    return {nullptr, ""};
  };
  auto text = [&](const std::string& field) -> std::string {
    auto [v, key] = value_of(field);
    return v && v->is_string() ? v->get<std::string>() : std::string();
  };
  auto number = [&](const std::string& field) -> std::optional<double> {
    auto [v, key] = value_of(field);
    if (v && v->is_number()) return v->get<double>();
    return std::nullopt;
  };
  // A parallel size: a whole number in [1, 65536].
  auto size = [&](const std::string& field) -> int {
    auto n = number(field);
    return n && *n >= 1 && *n <= 1 << 16 && *n == std::floor(*n) ? static_cast<int>(*n) : 0;
  };
  if (std::string model = text("model_path"); !model.empty() && launch.model_path.empty())
    launch.model_path = model;
  if (auto [v, key] = value_of("kv_cache_dtype"); v && v->is_string()) {
    if (!fill_only || launch.kv_cache_dtype_requested.empty())
      launch.kv_cache_dtype_requested = v->get<std::string>();
  } else if (omits_defaults && complete && launch.kv_cache_dtype_requested.empty()) {
    // A repr of the non-default arguments leaves the default out.
    if (auto d = engine.log_args.omitted_defaults.find("kv_cache_dtype");
        d != engine.log_args.omitted_defaults.end())
      launch.kv_cache_dtype_requested = d->second;
  }
  if (std::string path = text("quantization_param_path"); !path.empty())
    launch.quantization_param_path = path;
  if (std::string q = text("quantization"); !q.empty() && q != "None") launch.quantization = q;
  if (int tp = size("tp"); tp && (!fill_only || launch.tp == 0)) {
    launch.tp = tp, launch.memory.tp = tp;
    launch.tp_source = fmt::format("log:{} {} {}", line_no, what, value_of("tp").second);
  }
  if (int pp = size("pp"); pp && (!fill_only || launch.pp == 0))
    launch.pp = pp, launch.memory.pp = pp;
  if (int dp = size("dp"); dp && (!fill_only || launch.dp == 0))
    launch.dp = dp, launch.memory.dp = dp;
  if (auto [v, key] = value_of("dp_attention"); v && v->is_boolean())
    launch.dp_attention = v->get<bool>(), launch.memory.dp_attention = launch.dp_attention;
  if (std::string ssm = text("mamba_ssm_dtype"); !ssm.empty() && ssm != "auto")
    launch.memory.mamba_ssm_dtype = ssm;
  if (auto f = number("memory_fraction")) launch.memory.mem_fraction_static = f;
  if (auto page = number("page_size"); page && *page >= 1 && *page <= 1 << 20) {
    // SGLang's page and vLLM's block: each pool model reads its own.
    launch.memory.page_size = static_cast<int>(*page);
    launch.memory.block_size = static_cast<int>(*page);
  }
  if (auto ratio = number("mamba_full_memory_ratio")) launch.memory.mamba_full_memory_ratio = ratio;
  if (auto n = number("max_running_requests"); n && *n >= 1 && *n < 1e9)
    launch.memory.requested_running_requests = static_cast<int64_t>(*n);
  if (std::string s = text("mamba_radix_cache_strategy"); !s.empty())
    launch.memory.mamba_radix_cache_strategy = s;
  auto flag = [&](const std::string& field) {
    auto [v, key] = value_of(field);
    return v && v->is_boolean() && v->get<bool>();
  };
  launch.memory.disable_radix_cache |= flag("disable_radix_cache");
  launch.memory.disable_overlap_schedule |= flag("disable_overlap_schedule");
  if (std::string spec = text("speculative_algorithm"); !spec.empty() && spec != "None")
    launch.memory.speculative = true;
  if (auto cap = number("max_total_tokens"))
    launch.memory.max_total_tokens_arg = static_cast<int64_t>(*cap);
  if (auto ctx = number("context_length"); ctx && *ctx > 0 && *ctx < 9e15)
    launch.context_length = static_cast<int64_t>(*ctx);
  if (std::string dtype = text("dtype"); !dtype.empty() && dtype != "auto") {
    std::string d = registry_.dtypes().normalise(dtype);
    if (!d.empty() && d != "auto" && (!fill_only || launch.model_dtype.empty()))
      launch.model_dtype = d;
  }
}

namespace {

// vLLM's engine-config line ("model='/m', dtype=torch.bfloat16, kv_cache_dtype=fp8, ..."):
// the value of each argument name the engine data lists, as JSON (quotes stripped, numbers
// as numbers, None as null).
nlohmann::json config_line_values(std::string_view config, const engines::LogArgs& args) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [field, keys] : args.keys)
    for (const std::string& key : keys) {
      // The name at the start of the text or after a separator, not inside another name
      // (" dtype=" is not "kv_cache_dtype=").
      size_t at = 0;
      std::string value;
      bool found = false;
      while ((at = config.find(key + "=", at)) != std::string_view::npos) {
        if (at == 0 || config[at - 1] == ' ' || config[at - 1] == ',' || config[at - 1] == '(') {
          value = word_after(config.substr(at), key + "=");
          found = true;
          break;
        }
        at += key.size();
      }
      if (!found || value.empty()) continue;
      if (value.size() >= 2 && (value.front() == '\'' || value.front() == '"'))
        value = value.substr(1, value.size() - 2);
      if (value == "None") {
        out[key] = nullptr;
      } else if (auto n = parse_number(value);
                 n && value.find_first_not_of("0123456789.") == std::string::npos) {
        out[key] = *n;
      } else {
        out[key] = value;
      }
    }
  return out;
}

}  // namespace

void LaunchBuilder::apply_marker(const TemplateHit& hit, int64_t line_no, const std::string& ts) {
  const LogKind kind = hit.log->kind;
  if (kind == LogKind::engine_version) {
    // Every process of one launch may print it (TensorRT-LLM's MPI workers import the
    // package again): the same version again before anything loaded is the same launch.
    const std::string version = word_after(hit.text("engine_version").value_or(""), "");
    if (!launches_.empty()) {
      const Launch& last = launches_.back();
      if (last.engine == hit.engine->engine && last.engine_version == version &&
          last.stage < kLoading && last.failures.empty())
        return;
    }
    Launch& launch = start_marker(kVersion, line_no, ts);
    launch.engine = hit.engine->engine;
    launch.engine_version = word_after(hit.text("engine_version").value_or(""), "");
    return;
  }
  const engines::EngineModel& engine = *hit.engine;
  if (kind == LogKind::engine_config) {
    Launch& launch = start_marker(kEngineInit, line_no, ts);
    if (auto v = hit.text("engine_version")) launch.engine_version = *v;
    apply_args(launch, engine,
               config_line_values(hit.text("engine_config").value_or(""), engine.log_args), true,
               false, true, "engine config", line_no);
    launch.engine = engine.engine;
    return;
  }
  Launch& launch = start_marker(kArgs, line_no, ts);
  if (auto repr = hit.text("server_args_repr")) {
    // The whole ServerArgs(...): every argument, defaults included.
    ReprResult parsed = parse_python_repr(*repr);
    launch.server_args = parsed.value;
    launch.server_args_complete = parsed.complete;
    launch.server_args_cuts = parsed.cuts;
    launch.server_args_line = line_no;
    apply_args(launch, engine, parsed.value, parsed.complete, false, false, "server_args", line_no);
  } else if (auto ns = hit.text("namespace_args_repr")) {
    // "args: Namespace(...)": every argument, defaults included.
    ReprResult parsed = parse_python_repr("Namespace(" + *ns);
    if (launch.server_args.is_null()) launch.server_args = parsed.value;
    apply_args(launch, engine, parsed.value, parsed.complete, true, false, "non-default args",
               line_no);
  } else if (auto args = hit.text("non_default_args_repr")) {
    ReprResult parsed = parse_python_repr(*args);
    if (launch.server_args.is_null()) launch.server_args = parsed.value;
    apply_args(launch, engine, parsed.value, parsed.complete, true, false, "non-default args",
               line_no);
  }
  launch.engine = engine.engine;
}

namespace {

// A fact line of the loading stage moves the launch there (never back).
void mark_loading(Launch& launch) {
  launch.stage = std::max<int>(launch.stage, kLoading);
}

// "log:LINE: message" (clipped): the evidence a resolved KV dtype carries.
std::string fact_evidence(int64_t line_no, const std::string& message) {
  return fmt::format("log:{}: {}", line_no, clip(message, 120));
}

// Settings a line names, whatever its kind ("Automatically reduce --mem-fraction-static
// to 0.760", "under --mem-fraction-static=0.88", "max_total_tokens=131072 is larger").
void apply_named_settings(Launch& launch, const TemplateHit& hit) {
  auto& memory = launch.memory;
  if (auto f = hit.number("mem_fraction_static"); f && *f > 0 && *f <= 1)
    memory.mem_fraction_static = f;
  if (auto cap = hit.count("max_total_tokens_arg")) memory.max_total_tokens_arg = cap;
  if (auto block = hit.count("block_size"); block && *block > 0 && *block < 1 << 20)
    memory.block_size = static_cast<int>(*block);
  if (auto n = hit.count("max_num_batched_tokens"); n && *n > 0 && *n < 1LL << 40)
    memory.max_num_batched_tokens = n;
  if (auto dp = hit.count("dp_size"); dp && *dp >= 1 && *dp <= 1 << 16 && launch.dp == 0)
    launch.dp = static_cast<int>(*dp), memory.dp = launch.dp;
  if (auto q = hit.text("quantization"); q && !q->empty()) launch.quantization = *q;
  if (auto f = hit.number("memory_fraction"); f && *f > 0 && *f <= 1) memory.printed_fraction = f;
}

// The weights' load (load_begin, load_end, weights_loaded): free memory before and after,
// the weights' size, and the dtype and quantization the load names.
void apply_weights_fact(Launch& launch, const TemplateHit& hit) {
  auto& memory = launch.memory;
  switch (hit.log->kind) {
    case LogKind::load_begin:
      keep_min(memory.total_before_load_gib, hit.number("avail_mem_gib"));
      break;
    case LogKind::load_end: {
      keep_min(memory.avail_after_weights_gib, hit.number("avail_mem_gib"));
      if (auto usage = hit.number("mem_usage_gib")) launch.weights_gib = usage;
      const std::string details = hit.text("load_details").value_or("");
      std::string dtype = word_after(details, "dtype=");
      if (!dtype.empty() && launch.model_dtype.empty())
        launch.model_dtype = hit.engine->dtypes->normalise(dtype);
      if (std::string q = word_after(details, "quant="); !q.empty()) launch.quantization = q;
      break;
    }
    case LogKind::weights_loaded:
      launch.weights_gib = hit.number("weights_gib");
      break;
    default:
      break;
  }
}

// "Using fp8 data type": the cache dtype the engine says it uses. Older vLLM prints a bare
// "fp8" for every FP8 cache, which says less than an explicit request, which then decides
// (see finish()).
void apply_kv_dtype_used(Launch& launch, const TemplateHit& hit, int64_t line_no,
                         const std::string& message) {
  std::string raw = hit.text("kv_dtype").value_or("");
  std::string d = hit.engine->dtypes->normalise(raw);
  if (!d.empty() && (launch.kv_cache_dtype_resolved.empty() || raw != "fp8")) {
    launch.kv_cache_dtype_resolved = d;
    launch.resolved_evidence = fact_evidence(line_no, message);
    launch.resolved_generic = raw == "fp8";
  }
}

// The pools the engine allocated (kv_pool_allocated, state_pool_allocated, swa_pool,
// token_summary): their tokens, slots and sizes, and the cache dtype the KV pool names.
void apply_pool_fact(Launch& launch, const TemplateHit& hit, int64_t line_no,
                     const std::string& message) {
  auto& memory = launch.memory;
  switch (hit.log->kind) {
    case LogKind::kv_pool_allocated: {
      if (auto n = hit.count("pool_tokens")) memory.pool_tokens = n;
      if (auto k = hit.number("k_gib")) memory.k_gib = k;
      if (auto v = hit.number("v_gib")) memory.v_gib = v;
      if (auto kv = hit.number("kv_gib")) memory.kv_gib = kv;
      std::string d = hit.engine->dtypes->normalise(hit.text("kv_dtype").value_or(""));
      if (!d.empty() && (launch.kv_cache_dtype_resolved.empty() || launch.resolved_generic)) {
        launch.kv_cache_dtype_resolved = d;
        launch.resolved_evidence = fact_evidence(line_no, message);
        launch.resolved_generic = false;
      }
      // An engine that allocates twice (a profiling cache, then the real one) prints the
      // one in effect last.
      if (!launch.max_total_tokens || hit.log->last_wins)
        launch.max_total_tokens = memory.pool_tokens;
      break;
    }
    case LogKind::state_pool_allocated:
      if (auto n = hit.count("mamba_slots")) memory.mamba_slots = n;
      if (auto c = hit.number("conv_gib")) memory.conv_gib = c;
      if (auto s = hit.number("ssm_gib")) memory.ssm_gib = s;
      break;
    case LogKind::swa_pool:
      if (auto n = hit.count("full_tokens")) memory.full_tokens = n;
      if (auto n = hit.count("swa_tokens")) memory.swa_tokens = n;
      break;
    case LogKind::token_summary:
      memory.max_total_num_tokens = hit.count("max_total_num_tokens");
      launch.max_total_tokens = memory.max_total_num_tokens;
      launch.max_running_requests = hit.count("max_running_requests");
      if (launch.max_running_requests) memory.max_running_requests = launch.max_running_requests;
      if (auto ctx = hit.count("context_len"))
        launch.context_length = ctx, memory.context_len = ctx;
      break;
    default:
      break;
  }
}

// What the memory profile found (available_kv_memory, kv_cache_size, max_concurrency,
// gpu_blocks): the KV memory, the cache's tokens and blocks, the concurrency it allows.
void apply_profile_fact(Launch& launch, const TemplateHit& hit) {
  auto& memory = launch.memory;
  switch (hit.log->kind) {
    case LogKind::available_kv_memory: {
      std::optional<double> gib = hit.number("available_kv_gib");
      if (auto details = hit.text("load_details")) {  // "... kv_cache_size=61.84GiB ..."
        std::string size = word_after(*details, "kv_cache_size=");
        gib = parse_number(size.substr(0, size.find("GiB")));
      }
      keep_min(memory.available_kv_gib, gib);
      // TensorRT-LLM's profile line carries the terms of its own arithmetic.
      if (auto peak = hit.number("peak_gib")) memory.peak_gib = peak;
      if (auto total = hit.number("total_gpu_gib")) memory.total_gpu_gib = total;
      if (auto tmp = hit.number("tmp_kv_gib")) memory.tmp_kv_gib = tmp;
      if (auto bytes = hit.count("kv_bytes_per_token")) memory.kv_bytes_per_token = bytes;
      // V0 profiles print the weights on the same line (V1 logs them separately).
      if (hit.text("weights_gib") || hit.text("load_details")) {
        memory.vllm_v0 = true;
        if (auto w = hit.number("weights_gib")) launch.weights_gib = w;
      }
      break;
    }
    case LogKind::kv_cache_size:
      // Each worker prints its own; the engine allocates the smallest (min over ranks).
      if (auto n = hit.count("kv_cache_tokens");
          n && (!memory.gpu_kv_cache_tokens || *n < *memory.gpu_kv_cache_tokens))
        memory.gpu_kv_cache_tokens = n;
      launch.max_total_tokens = memory.gpu_kv_cache_tokens;
      break;
    case LogKind::max_concurrency:
      // Proportional to the worker's token count, so its minimum pairs with the minimum.
      memory.concurrency_context = hit.count("concurrency_context");
      keep_min(memory.concurrency_x, hit.number("concurrency_x"));
      break;
    case LogKind::gpu_blocks:
      memory.num_gpu_blocks = hit.count("gpu_blocks");
      if (hit.text("cpu_blocks")) memory.vllm_v0 = true;  // CPU swap blocks exist only in V0
      break;
    default:
      break;
  }
}

// A line about scales, fallbacks, ignored flags or deprecations, kept as it was printed
// (at most 64 per launch) with the template's id and reference.
void record_scale_message(Launch& launch, const TemplateHit& hit, int64_t line_no,
                          const std::string& message) {
  if (launch.scale_messages.size() >= 64) return;
  const engines::Provenance& p = hit.log->provenance;
  launch.scale_messages.push_back(
      {line_no, std::string(engines::log_kind_name(hit.log->kind)), clip(message), launch.ready,
       hit.log->kind, hit.log->id, hit.engine->engine,
       p.verified ? p.reference
                  : fmt::format("{} (version bound inferred: {})", p.reference, p.bound)});
}

}  // namespace

void LaunchBuilder::apply_fact(Launch& launch, const TemplateHit& hit, int64_t line_no,
                               const std::string& message) {
  if (launch.engine.empty()) launch.engine = hit.engine->engine;
  apply_named_settings(launch, hit);
  switch (hit.log->kind) {
    case LogKind::load_begin:
    case LogKind::load_end:
    case LogKind::weights_loaded:
      apply_weights_fact(launch, hit);
      mark_loading(launch);
      break;
    case LogKind::kv_dtype_used:
      // No stage: vLLM validates the cache dtype before it prints its engine config, so
      // this line must not make the config line look like a new launch.
      apply_kv_dtype_used(launch, hit, line_no, message);
      break;
    case LogKind::kv_pool_allocated:
    case LogKind::state_pool_allocated:
    case LogKind::swa_pool:
    case LogKind::token_summary:
      apply_pool_fact(launch, hit, line_no, message);
      mark_loading(launch);
      break;
    case LogKind::available_kv_memory:
    case LogKind::kv_cache_size:
    case LogKind::max_concurrency:
    case LogKind::gpu_blocks:
      apply_profile_fact(launch, hit);
      mark_loading(launch);
      break;
    case LogKind::memory_pool_end:
    case LogKind::startup_progress:
      mark_loading(launch);
      break;
    case LogKind::launch_setting:
      break;  // its settings were read above; no stage
    case LogKind::running_requests_capped: {
      RunningRequestsCap cap;
      cap.effective = hit.count("max_running_requests").value_or(0);
      cap.requested = hit.count("requested_running_requests");
      cap.state_slots = hit.count("mamba_slots");
      cap.slots_per_request = hit.count("state_slots_per_request");
      cap.by = cap.slots_per_request ? "mamba state cache" : "KV cache capacity";
      cap.line = line_no;
      cap.message = message;
      launch.running_requests_cap = cap;
      // The scheduler's summary line, later, prints the same value; a log cut before it
      // still has the cap in effect.
      if (cap.effective > 0)
        launch.max_running_requests = cap.effective,
        launch.memory.max_running_requests = cap.effective;
      if (cap.requested) launch.memory.requested_running_requests = cap.requested;
      if (cap.slots_per_request) launch.memory.state_slots_per_request = cap.slots_per_request;
      if (cap.state_slots && !launch.memory.mamba_slots)
        launch.memory.mamba_slots = cap.state_slots;
      mark_loading(launch);
      break;
    }
    case LogKind::kv_dtype_requested:
      // No stage: the engine validates the request before it loads anything.
      if (auto requested = hit.text("kv_dtype"); requested && !requested->empty())
        launch.kv_cache_dtype_requested = *requested;
      break;
    case LogKind::scale_unit_fallback:
    case LogKind::scale_warning:
    case LogKind::scale_not_loaded:
    case LogKind::scales_loaded:
    case LogKind::nvfp4_unit_global:
    case LogKind::flag_ignored:
    case LogKind::dtype_fallback:
    case LogKind::deprecation:
      record_scale_message(launch, hit, line_no, message);
      break;
    case LogKind::ready:
      launch.ready = true, launch.ready_line = line_no;
      launch.stage = std::max<int>(launch.stage, kReady);
      break;
    case LogKind::startup_error:
      record_failure(launch, "engine_error", message, line_no);
      if (!launch.failures.empty() && launch.failures.back().line == line_no)
        launch.failures.back().reference = hit.log->provenance.reference;
      break;
    case LogKind::launch_args:
    case LogKind::engine_version:
    case LogKind::engine_config:
      break;  // markers: apply_marker
  }
}

// A weights load is printed once per rank and process. The same rank loading again is a
// new process, even when the excerpt cut the new run's start-up markers, when its launch was
// ready by then or when the memory the first load took is free again: above what the rank had
// after its first load by more than half of what that load took (at least 0.25 GiB), or, with
// no figure after it, at 90% of what it had before it. A second model of the same process
// (SGLang's speculative draft) loads with the target's weights still held: before #23862 after
// the target's KV pool, since then right after the target's weights.
std::optional<std::string> LaunchBuilder::new_run_without_marker(
    const std::vector<TemplateHit>& hits, const std::string& rank, int64_t line_no) const {
  if (launches_.empty()) return std::nullopt;
  const Launch& launch = launches_.back();
  const auto first = launch.figures_by_rank.find(rank);
  if (first == launch.figures_by_rank.end()) return std::nullopt;
  const std::string where = rank.empty() ? "the unprefixed process" : rank;
  const auto after_ready = [&] {
    return fmt::format(
        "line {}: {} loads weights again after the launch was ready (line {}): a new run", line_no,
        where, launch.ready_line);
  };
  for (const TemplateHit& hit : hits) {
    if (hit.log->kind == LogKind::load_begin) {
      if (!first->second.free_before_gib) continue;
      if (launch.ready) return after_ready();
      const std::optional<double> free_gib = hit.number("avail_mem_gib");
      if (!free_gib) continue;
      const double before = *first->second.free_before_gib;
      const std::optional<double> after = first->second.free_after_gib;
      const bool released = after ? *free_gib - *after > std::max(0.25, 0.5 * (before - *after))
                                  : *free_gib >= 0.9 * before;
      if (released)
        return fmt::format(
            "line {}: {} loads weights again with {:.2f} GiB free, as before its first load "
            "({:.2f} GiB{}): the first load's memory was released, so a new process",
            line_no, where, *free_gib, before,
            after ? fmt::format(", {:.2f} GiB after it", *after) : std::string());
    } else if (hit.log->kind == LogKind::weights_loaded) {
      if (launch.ready && first->second.weights_loaded) return after_ready();
    }
  }
  return std::nullopt;
}

namespace {

void note_rank_figures(Launch& launch, const std::vector<TemplateHit>& hits,
                       const std::string& rank, int64_t line_no) {
  if (launch.figures_by_rank.size() >= 1024 && !launch.figures_by_rank.count(rank))
    return;  // bounded on hostile input
  for (const TemplateHit& hit : hits) {
    const LogKind kind = hit.log->kind;
    if (kind == LogKind::load_begin || kind == LogKind::load_end) {
      auto free_gib = hit.number("avail_mem_gib");
      if (!free_gib) continue;
      Launch::RankFigures& first = launch.figures_by_rank[rank];
      if (kind == LogKind::load_begin && !first.free_before_gib)
        first.free_before_gib = free_gib, first.begin_line = line_no;
      if (kind == LogKind::load_end && first.free_before_gib && !first.free_after_gib) {
        first.free_after_gib = free_gib, first.end_line = line_no;
        first.usage_gib = hit.number("mem_usage_gib");
      }
    } else if (kind == LogKind::kv_pool_allocated) {
      auto tokens = hit.count("pool_tokens");
      Launch::RankFigures& figures = launch.figures_by_rank[rank];
      if (tokens && figures.pool_tokens.size() < 8)
        figures.pool_tokens.emplace_back(*tokens, line_no);
    } else if (kind == LogKind::weights_loaded) {
      launch.figures_by_rank[rank].weights_loaded = true;
    }
  }
}

}  // namespace

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

  // Every template that matches; of several of one kind (an older message that extends a
  // newer one, say), the longest says the most.
  std::vector<TemplateHit> hits;
  // Named pairs, not a structured binding: clang 14 (the sanitizer build) cannot capture
  // structured bindings in a lambda.
  for (const auto& pair : templates_) {
    const engines::EngineModel* engine = pair.first;
    const engines::LogTemplate* log = pair.second;
    auto captures = engines::match_log_template(*log, m);
    if (!captures) continue;
    auto same = std::find_if(hits.begin(), hits.end(), [&](const TemplateHit& h) {
      return h.log->kind == log->kind && h.engine == engine;
    });
    if (same == hits.end())
      hits.push_back({engine, log, std::move(*captures)});
    else if (log->text.size() > same->log->text.size())
      *same = {engine, log, std::move(*captures)};
  }
  for (const TemplateHit& hit : hits)
    if (is_marker(hit.log->kind)) {
      apply_marker(hit, line_no, ts);
      return;
    }

  if (auto reason = new_run_without_marker(hits, line.rank, line_no))
    start_unmarked(line_no, ts, std::move(*reason));
  Launch& launch = current(line_no, ts);
  note_rank_figures(launch, hits, line.rank, line_no);
  if (!line.rank.empty() && launch.ranks_seen.size() < 1024) {
    launch.ranks_seen.insert(line.rank);
    note_rank_indices(launch, line.rank);
  }
  bool engine_error = false;
  for (const TemplateHit& hit : hits) {
    apply_fact(launch, hit, line_no, m);
    engine_error |= hit.log->kind == LogKind::startup_error;
  }
  if (engine_error) return;

  // Generic failures (Python, CUDA), which no engine template owns.
  // Not a bare "out of memory": vLLM's own advice says "If you are running out of memory".
  if (contains(m, "CUDA out of memory") || contains(m, "OutOfMemoryError") ||
      contains(m, "CUDA error: out of memory") || contains(m, "HIP out of memory")) {
    record_failure(launch, "oom", m, line_no);
  } else if (contains(m, "Traceback (most recent call last)")) {
    record_failure(launch, "traceback", m, line_no);
  } else if (hits.empty() && (contains(m, "Error: ") || contains(m, "AssertionError") ||
                              contains(m, "Exception: "))) {
    // The exception line that ends a traceback: "ValueError: ...", "Exception: ...". Only
    // lines that start with an exception name, not request logs that quote one.
    size_t name_end = m.find(": ");
    std::string_view name = std::string_view(m).substr(0, std::min(name_end, m.size()));
    bool exception_line = name_end != std::string::npos && name_end < 60 &&
                          name.find(' ') == std::string_view::npos &&
                          (name.ends_with("Error") || name.ends_with("Exception"));
    if (m.rfind("AssertionError", 0) == 0) exception_line = true;
    if (exception_line) record_failure(launch, "exception", m, line_no);
  }
}

void LaunchBuilder::finish(LogScan& out) {
  out.launches_dropped = dropped_;
  for (auto& launch : launches_) {
    // A launch with no recognised content (e.g. systemd lines only) is still kept: it
    // shows a restart that never printed anything.
    // Without a printed size, the ranks seen bound TP from below: a log of TP0 lines only
    // says nothing (SGLang prints most lines on TP0), ranks 0, 2, 4, 6 say at least 7.
    if (launch.tp == 0 && !launch.tp_ranks_seen.empty() && *launch.tp_ranks_seen.rbegin() > 0) {
      launch.tp_at_least = *launch.tp_ranks_seen.rbegin() + 1;
      launch.memory.tp_at_least = launch.tp_at_least;
      launch.memory.tp_ranks_contiguous =
          static_cast<int>(launch.tp_ranks_seen.size()) == launch.tp_at_least;
    }
    launch.memory.tp_source = launch.tp_source;
    // Resolved dtype when no line said it (or only a bare "fp8" did): an explicit request
    // is what the engine allocates; vLLM's auto follows the model dtype.
    const engines::DtypeVocabulary& dtypes = registry_.dtypes();
    std::string requested = dtypes.normalise(launch.kv_cache_dtype_requested);
    if ((launch.kv_cache_dtype_resolved.empty() || launch.resolved_generic) && !requested.empty() &&
        requested != "auto" &&
        (launch.kv_cache_dtype_resolved.empty() || dtypes.is_quantized(requested))) {
      launch.kv_cache_dtype_resolved = requested;
      launch.resolved_evidence = "requested --kv-cache-dtype " + launch.kv_cache_dtype_requested;
    }
    // A scale warning the engine prints for one dtype only names that dtype.
    if (launch.kv_cache_dtype_resolved.empty())
      for (const auto& msg : launch.scale_messages) {
        if ((msg.message_kind != LogKind::scale_warning &&
             msg.message_kind != LogKind::scale_unit_fallback) ||
            msg.engine.empty())
          continue;
        for (const auto& rule : registry_.engine(msg.engine).scale_warnings)
          if (rule.log_message == msg.template_id && rule.dtypes.size() == 1) {
            launch.kv_cache_dtype_resolved = rule.dtypes[0];
            launch.resolved_evidence =
                fmt::format("log:{}: the engine prints this warning only for a {} cache", msg.line,
                            rule.dtypes[0]);
          }
        if (!launch.kv_cache_dtype_resolved.empty()) break;
      }
    // auto with no line naming the cache: both engines store it in the model dtype unless
    // the checkpoint declares a quantized KV cache, which the log may not show (older
    // SGLang pools do not print their dtype). Inferred, and said so; --checkpoint decides.
    // A launch that names a weight quantization is not inferred at all: its checkpoint may
    // well declare the KV cache quantized, and a wrong "bf16" is the all-clear kvaudit must
    // never give; it stays unknown until --checkpoint decides it.
    const bool quantized_weights = !launch.quantization.empty() && launch.quantization != "None";
    if (launch.kv_cache_dtype_resolved.empty() && requested == "auto" &&
        !launch.model_dtype.empty() && !launch.engine.empty()) {
      if (quantized_weights) {
        launch.resolved_auto_pending = true;
        launch.resolved_evidence = fmt::format(
            "kv_cache_dtype '{}' on a {}-quantized checkpoint and no line naming the cache: its "
            "quant config decides (pass --checkpoint)",
            launch.kv_cache_dtype_requested, launch.quantization);
      } else {
        launch.kv_cache_dtype_resolved = launch.model_dtype;
        launch.resolved_inferred = true;
        launch.resolved_evidence = fmt::format(
            "kv_cache_dtype '{}' and no line naming an FP8 cache: the model dtype {} (inferred)",
            launch.kv_cache_dtype_requested, launch.model_dtype);
      }
    }
    launch.memory.engine = launch.engine;
    launch.memory.engine_version = launch.engine_version;
    launch.memory.kv_cache_dtype = launch.kv_cache_dtype_resolved;
    if (!launch.max_total_tokens && launch.memory.num_gpu_blocks)
      launch.max_total_tokens =
          *launch.memory.num_gpu_blocks * launch.memory.block_size.value_or(16);
    decide_scale_fallback(registry_, launch);
  }
  for (size_t i = 0; i < launches_.size(); ++i)
    add_findings(registry_, launches_[i], i + 1 == launches_.size());
  out.launches.assign(std::make_move_iterator(launches_.begin()),
                      std::make_move_iterator(launches_.end()));
}

// Scale fallback from the log alone: only the engine's own check of the loaded values
// (vLLM's "Using KV cache scaling factor 1.0") or a logged drop proves it.
void decide_scale_fallback(const engines::Registry& registry, Launch& launch) {
  const std::string& dtype = launch.kv_cache_dtype_resolved;
  const engines::KvDtype* kv = registry.dtypes().find(dtype);
  const LogEvent* unit = nullptr;
  const LogEvent* dropped = nullptr;
  const LogEvent* warning = nullptr;
  for (const auto& msg : launch.scale_messages) {
    if (msg.message_kind == LogKind::scale_unit_fallback ||
        msg.message_kind == LogKind::nvfp4_unit_global)
      unit = unit ? unit : &msg;
    if (msg.message_kind == LogKind::scale_not_loaded) dropped = dropped ? dropped : &msg;
    if (msg.message_kind == LogKind::scale_warning) warning = warning ? warning : &msg;
  }
  if (dtype.empty()) {
    launch.scale_fallback_reason = "the log does not say which KV dtype the launch used";
  } else if (!kv || !kv->quantized) {
    launch.scale_fallback = false;
    launch.scale_fallback_reason = dtype + " KV cache: no scales involved";
  } else if (kv->scales == engines::ScaleSemantics::dynamic_block ||
             kv->scales == engines::ScaleSemantics::dynamic_per_token_head ||
             kv->scales == engines::ScaleSemantics::packed_dynamic) {
    launch.scale_fallback = false;
    launch.scale_fallback_reason =
        dtype + " KV cache computes its own scales at cache write: no scale-1.0 fallback";
  } else if (unit) {
    launch.scale_fallback = true;
    launch.scale_fallback_reason = fmt::format(
        "the engine logged that it uses KV scaling factor 1.0 after checking the loaded values "
        "(log:{})",
        unit->line);
  } else if (dropped) {
    launch.scale_fallback = true;
    launch.scale_fallback_reason = fmt::format(
        "the engine dropped the checkpoint's KV scales (name not matched, log:{})", dropped->line);
  } else if (warning) {
    std::string meaning;
    if (const engines::EngineModel* engine =
            launch.engine.empty() ? nullptr : registry.find(warning->engine))
      for (const auto& rule : engine->scale_warnings)
        if (rule.log_message == warning->template_id) meaning = rule.meaning;
    launch.scale_fallback_reason = fmt::format(
        "the engine's warning does not prove a fallback{}{}; pass --checkpoint to decide",
        meaning.empty() ? "" : ": it is ", meaning);
  } else {
    launch.scale_fallback_reason =
        "no scale message: this engine version does not log whether it loaded KV scales";
  }
}

}  // namespace kvaudit::logs
