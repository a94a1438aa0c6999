// resolve_kv: applies an engine's data to a checkpoint and launch flags: which
// KV dtype the engine allocates and where its scales come from.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "engines/engines.h"
#include "util/util.h"

namespace kvaudit::engines {

namespace {

using checkpoint::ModelFacts;
using checkpoint::ScaleTensor;
using nlohmann::json;

std::string upper(std::string text) {
  for (auto& c : text) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return text;
}

bool list_matches(const json& rule, const char* key, const std::string& value) {
  auto it = rule.find(key);
  if (it == rule.end()) return true;  // no constraint
  for (const auto& entry : *it) {
    std::string wanted = entry.get<std::string>();
    if (wanted == "*" || upper(wanted) == upper(value)) return true;
  }
  return false;
}

bool rule_applies(const json& when, const ModelFacts& model) {
  if (auto it = when.find("kv_cache_quant_algo"); it != when.end()) {
    if (!model.quant || upper(model.quant->kv_cache_quant_algo) != upper(it->get<std::string>()))
      return false;
  }
  if (auto it = when.find("kv_cache_scheme"); it != when.end()) {
    bool has = model.quant && model.quant->has_kv_cache_scheme;
    if (has != it->get<bool>()) return false;
  }
  if (auto it = when.find("quant_method"); it != when.end()) {
    if (!model.quant || model.quant->method != it->get<std::string>()) return false;
  }
  return true;
}

std::string model_kv_dtype(const EngineData& data, const ModelFacts& model,
                           const LaunchFlags& flags) {
  const json& aliases = data.document.value("model_dtype_aliases", json::object());
  std::string dtype =
      flags.dtype.empty() || flags.dtype == "auto" ? model.torch_dtype : flags.dtype;
  if (dtype.empty()) return "bf16";
  std::string normalised = aliases.contains(dtype) ? aliases[dtype].get<std::string>() : dtype;
  // Both engines serve float32 checkpoints in bfloat16 under --dtype auto.
  if (normalised == "fp32" && (flags.dtype.empty() || flags.dtype == "auto")) return "bf16";
  return normalised;
}

bool is_quantized(const std::string& dtype) {
  return dtype.rfind("fp8", 0) == 0 || dtype.rfind("fp4", 0) == 0 || dtype == "nvfp4" ||
         dtype == "mxfp8" || dtype.rfind("int", 0) == 0;
}

}  // namespace

ResolvedKv resolve_kv(const ModelFacts& model, const LaunchFlags& flags, const EngineData& data) {
  ResolvedKv resolved;
  resolved.engine = data.engine;
  auto version = parse_version(flags.engine_version);
  if (!version)
    throw InputError("--engine-version",
                     fmt::format("cannot read version '{}'", flags.engine_version));
  resolved.version = *version;
  resolved.requested = normalise_kv_dtype(data, flags.kv_cache_dtype);

  for (const auto& rule : data.document["auto_resolution"]) {
    if (!version_in_range(*version, rule.value("versions", "*"))) continue;
    bool overrides = rule.value("overrides_cli", false);
    if (resolved.requested != "auto" && !overrides) continue;
    if (!rule_applies(rule.value("when", json::object()), model)) continue;
    std::string target = rule["resolves_to"].get<std::string>();
    resolved.kv_cache_dtype = target == "model_dtype" ? model_kv_dtype(data, model, flags) : target;
    resolved.rule_id = rule.value("id", "");
    resolved.rule_reference = rule.value("reference", "");
    resolved.reason = rule.value("reason", "");
    break;
  }
  if (resolved.kv_cache_dtype.empty()) {
    resolved.kv_cache_dtype = resolved.requested;
    resolved.rule_id = "explicit";
    resolved.reason = fmt::format("--kv-cache-dtype {} was given explicitly", flags.kv_cache_dtype);
  }
  resolved.quantized = is_quantized(resolved.kv_cache_dtype);

  // Which checkpoint scales the engine would load (reported even for a 16-bit cache:
  // the drop bites the day FP8 is switched on).
  const json& loading = data.document["scale_loading"];
  std::vector<const ScaleTensor*> candidates;
  for (const auto& scale : model.kv_scales) candidates.push_back(&scale);

  auto ignored = loading.value("ignored_conventions", std::vector<std::string>{});
  DroppedScales unmapped{"unmapped-scale-name", loading.value("ignored_reason", ""), "", "", {}};
  std::vector<const ScaleTensor*> kept;
  for (const ScaleTensor* scale : candidates) {
    if (std::find(ignored.begin(), ignored.end(), scale->convention) != ignored.end())
      unmapped.tensor_names.push_back(scale->name);
    else
      kept.push_back(scale);
  }
  if (!unmapped.tensor_names.empty()) resolved.dropped.push_back(unmapped);

  std::string quant_method = model.quant ? model.quant->method : "";
  std::string weight_algo = model.quant ? model.quant->weight_algo : "";
  // Scale tensors land only in parameters a KV-cache quant method created; without one
  // (no quantization config, or a weight-only method such as GPTQ) they are skipped.
  if (auto need = loading.find("requires_kv_cache_method");
      need != loading.end() && !kept.empty()) {
    auto methods = need->value("quant_methods", std::vector<std::string>{});
    if (std::find(methods.begin(), methods.end(), quant_method) == methods.end()) {
      DroppedScales drop{need->value("id", ""),
                         need->value("reason", ""),
                         need->value("reference", ""),
                         "how the loaders work",
                         {}};
      for (const ScaleTensor* scale : kept) drop.tensor_names.push_back(scale->name);
      kept.clear();
      resolved.dropped.push_back(std::move(drop));
    }
  }
  for (const auto& rule : loading.value("dropped", json::array())) {
    if (!version_in_range(*version, rule.value("versions", "*"))) continue;
    if (!list_matches(rule, "architectures", model.architecture)) continue;
    if (rule.contains("quant_methods") && !list_matches(rule, "quant_methods", quant_method))
      continue;
    if (rule.contains("weight_algos") && !list_matches(rule, "weight_algos", weight_algo)) continue;
    DroppedScales drop{rule.value("id", ""),
                       rule.value("reason", ""),
                       rule.value("reference", ""),
                       rule.value("status", ""),
                       {}};
    std::vector<const ScaleTensor*> still_kept;
    for (const ScaleTensor* scale : kept) {
      if (list_matches(rule, "conventions", scale->convention))
        drop.tensor_names.push_back(scale->name);
      else
        still_kept.push_back(scale);
    }
    kept = std::move(still_kept);
    if (!drop.tensor_names.empty()) resolved.dropped.push_back(std::move(drop));
  }
  for (const ScaleTensor* scale : kept) resolved.loaded_scale_names.push_back(scale->name);
  if (!resolved.quantized) return resolved;

  const json dynamic = data.document.value("dynamic_scales", json::object());
  bool hybrid = model.linear_attention.has_value();
  if (flags.calculate_kv_scales && !dynamic.empty() &&
      !(hybrid && dynamic.value("disabled_for_hybrid", false)))
    resolved.scale_source = "dynamic";
  else if (!flags.quantization_param_path.empty() &&
           data.document.contains("quantization_param_path"))
    resolved.scale_source = "quantization_param_path";
  else if (!kept.empty())
    resolved.scale_source = "checkpoint";
  else
    resolved.scale_source = "unit_default";

  for (const auto& warning : data.document.value("warnings", json::array())) {
    auto dtypes = warning.value("when_kv_cache_dtype", std::vector<std::string>{});
    if (std::find(dtypes.begin(), dtypes.end(), resolved.kv_cache_dtype) == dtypes.end()) continue;
    if (warning.value("when_no_quantization_param_path", false) &&
        !flags.quantization_param_path.empty())
      continue;
    if (warning.value("when_unit_scale", false) && resolved.scale_source != "unit_default")
      continue;
    resolved.scale_warning_logged = true;
    resolved.scale_warning_text = warning.value("text", "");
    break;
  }
  return resolved;
}

}  // namespace kvaudit::engines
