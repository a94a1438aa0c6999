// logs parse, the lines that start a launch: the engine's version and config lines, and
// its arguments (a ServerArgs or Namespace repr, vLLM's non-default args or engine-config
// line), each read through the engine data's log_args.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "logs/parse.h"
#include "util/util.h"

namespace kvaudit::logs {

namespace {

using engines::LogKind;

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

// The tier settings an args line gives (log_args keys named like kv_tier_flags settings),
// recorded as the launch command's flags would be: a true boolean as "true", a number as
// written, a JSON value (vLLM's kv_transfer_config) as JSON, so the engine's own reading of
// it applies. A false boolean is a tier not set up.
void record_tier_args(const engines::EngineModel& engine, const nlohmann::json& args,
                      Launch& launch) {
  for (const auto& [setting, keys] : engine.log_args.keys) {
    if (!engine.tier_flags.count(setting)) continue;
    for (const std::string& key : keys) {
      auto it = args.find(key);
      if (it == args.end() || it->is_null()) continue;
      std::string value;
      if (it->is_boolean()) {
        if (!it->get<bool>()) break;
        value = "true";
      } else if (it->is_number()) {
        value = fmt::format("{}", it->get<double>());
      } else {
        value = it->is_string() ? it->get<std::string>() : it->dump();
      }
      engines::record_tier_setting(setting, value, launch.tier_settings);
      break;
    }
  }
  launch.memory.tier_settings = launch.tier_settings;
}

}  // namespace

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
  record_tier_args(engine, args, launch);
  if (std::string dtype = text("dtype"); !dtype.empty() && dtype != "auto") {
    std::string d = registry_.dtypes().normalise(dtype);
    if (!d.empty() && d != "auto" && (!fill_only || launch.model_dtype.empty()))
      launch.model_dtype = d;
  }
}

void LaunchBuilder::apply_marker(const TemplateHit& hit, int64_t line_no,
                                 const std::string& timestamp) {
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
    Launch& launch = start_marker(kVersion, line_no, timestamp);
    launch.engine = hit.engine->engine;
    launch.engine_version = word_after(hit.text("engine_version").value_or(""), "");
    return;
  }
  const engines::EngineModel& engine = *hit.engine;
  if (kind == LogKind::engine_config) {
    Launch& launch = start_marker(kEngineInit, line_no, timestamp);
    if (auto v = hit.text("engine_version")) launch.engine_version = *v;
    apply_args(launch, engine,
               config_line_values(hit.text("engine_config").value_or(""), engine.log_args), true,
               false, true, "engine config", line_no);
    launch.engine = engine.engine;
    return;
  }
  Launch& launch = start_marker(kArgs, line_no, timestamp);
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

}  // namespace kvaudit::logs
