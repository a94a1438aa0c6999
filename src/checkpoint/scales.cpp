// KV-scale tensor naming conventions and their classification; the per-head key norms
// whose weights bound the cached keys.
#include <algorithm>

#include "checkpoint/checkpoint.h"
#include "checkpoint/internal.h"
#include "util/util.h"

namespace kvaudit::checkpoint {

const std::vector<ScaleConvention>& scale_conventions() {
  static const std::vector<ScaleConvention> conventions = {
      {"modelopt_proj",
       R"(layers\.(\d+)\.(?:self_attn|mixer|attention)\.(k_proj\.k_scale|v_proj\.v_scale)$)",
       "ModelOpt: self_attn.k_proj.k_scale / v_proj.v_scale (NemotronH: mixer.*)"},
      {"fused_qkv", R"(layers\.(\d+)\.self_attn\.(?:qkv_proj|qkqkv_proj)\.(k_scale|v_scale)$)",
       "fused QKV projection: self_attn.qkv_proj.k_scale (Qwen3-Next qkqkv_proj)"},
      {"runtime_attn",
       R"(layers\.(\d+)\.(?:self_attn|mla_attn)\.(?:mla_attn\.|attn\.)(k_scale|v_scale)$)",
       "already in the engines' runtime form: self_attn.attn.k_scale"},
      {"ct_attn", R"(layers\.(\d+)\.self_attn\.(k_scale|v_scale)$)",
       "compressed-tensors (since Aug 2024): self_attn.k_scale / v_scale"},
      {"ct_output_scale",
       R"(layers\.(\d+)\.self_attn\.(k_proj\.output_scale|v_proj\.output_scale)$)",
       "compressed-tensors (old): self_attn.k_proj.output_scale"},
      {"kv_scale", R"(layers\.(\d+)\.self_attn\.(kv_scale)$)",
       "AutoFP8 / old exports: one self_attn.kv_scale for both K and V (deprecated)"},
      {"ammo", R"(layers\.(\d+)\..*attention\.(kv_cache_scaling_factor)$)",
       "old AMMO: attention.kv_cache_scaling_factor"},
      {"other", R"(layers\.(\d+)\..*\.(k_scale|v_scale|kv_scale)$)",
       "a KV scale under a name no known convention uses"},
  };
  return conventions;
}

namespace {

struct CompiledConvention {
  const ScaleConvention* convention;
  Regex pattern;
};

const std::vector<CompiledConvention>& compiled() {
  static const std::vector<CompiledConvention> list = [] {
    std::vector<CompiledConvention> out;
    for (const auto& convention : scale_conventions())
      out.push_back({&convention, Regex(convention.pattern)});
    return out;
  }();
  return list;
}

bool ends_with(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}

}  // namespace

std::string_view scale_role_name(ScaleRole role) {
  switch (role) {
    case ScaleRole::k:
      return "k";
    case ScaleRole::v:
      return "v";
    case ScaleRole::kv_shared:
      return "kv";
  }
  return "?";
}

// Returns a ScaleTensor (without values) when name is a KV-cache scale. The cheap
// suffix test keeps the regexes off the ~400K weight names of a large checkpoint.
std::optional<ScaleTensor> classify_scale_tensor(std::string_view name) {
  if (!ends_with(name, "k_scale") && !ends_with(name, "v_scale") && !ends_with(name, "kv_scale") &&
      !ends_with(name, "proj.output_scale") && !ends_with(name, "kv_cache_scaling_factor"))
    return std::nullopt;
  if (ends_with(name, "output_scale") && !ends_with(name, "k_proj.output_scale") &&
      !ends_with(name, "v_proj.output_scale"))
    return std::nullopt;
  for (const auto& entry : compiled()) {
    auto match = entry.pattern.search(name);
    if (!match) continue;
    ScaleTensor scale;
    scale.name = std::string(name);
    scale.convention = std::string(entry.convention->id);
    std::string layer_digits(match->at(1).value_or(""));
    if (layer_digits.size() > 6) return std::nullopt;  // not a real layer index
    scale.layer = std::stoi(layer_digits);
    std::string which(match->at(2).value_or(""));
    if (which.find("kv") != std::string::npos)
      scale.role = ScaleRole::kv_shared;
    else if (which.find("k_") == 0 || which.find("k_proj") != std::string::npos ||
             which == "k_scale")
      scale.role = ScaleRole::k;
    else
      scale.role = ScaleRole::v;
    return scale;
  }
  return std::nullopt;
}

std::optional<int> classify_k_norm_tensor(std::string_view name) {
  constexpr std::string_view suffix = ".self_attn.k_norm.weight";
  if (!ends_with(name, suffix)) return std::nullopt;
  // The draft head of Qwen3-Next / Qwen3.5 ("mtp.layers.0...") numbers its layers on its own.
  if (name.starts_with("mtp.") || name.find(".mtp.") != std::string_view::npos) return std::nullopt;
  std::string_view head = name.substr(0, name.size() - suffix.size());
  size_t at = head.rfind("layers.");
  if (at == std::string_view::npos) return std::nullopt;
  std::string_view digits = head.substr(at + 7);
  if (digits.empty() || digits.size() > 6 ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  return std::stoi(std::string(digits));
}

bool reads_tensor_values(std::string_view name) {
  // Nearly every name of a large checkpoint is a weight or a weight's own scale: one look at
  // its last characters turns it away before the suffix tests of the classifiers below.
  if (name.size() < 7) return false;
  switch (name.back()) {
    case 't':  // "...self_attn.k_norm.weight"
      if (!has_suffix(name, "k_norm.weight")) return false;
      break;
    case 'e':  // "k_scale", "v_scale", "kv_scale", "k_proj.output_scale", not "weight_scale"
      if (!has_suffix(name, "_scale")) return false;
      if (char before = name[name.size() - 7];
          before != 'k' && before != 'v' && !(before == 't' && has_suffix(name, "output_scale")))
        return false;
      break;
    case 'r':  // "kv_cache_scaling_factor"
      if (!has_suffix(name, "kv_cache_scaling_factor")) return false;
      break;
    default:
      return false;
  }
  return classify_k_norm_tensor(name).has_value() || classify_scale_tensor(name).has_value();
}

}  // namespace kvaudit::checkpoint
