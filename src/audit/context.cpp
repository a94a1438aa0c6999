// What every check rule reads through its Context (the engine, the launch's settings and
// where each is written), and the helpers the rule families share.
#include <fmt/format.h>

#include <cmath>

#include "audit/internal.h"
#include "numerics/numerics.h"

namespace kvaudit::audit {

using report::Evidence;

std::string Context::engine_label() const {
  return fmt::format("{} {}", input.engine->engine,
                     input.version_given
                         ? input.flags.engine_version
                         : "(latest known: " + input.engine->latest_known_version + ")");
}

std::string Context::fix_flag(const std::string& dtype) const {
  return engines::kv_dtype_fix(engine(), resolved.version, dtype).text;
}

std::string Context::keep_quantized_text(const std::string& dtype) const {
  if (const engines::ScaleNameRule* rule =
          engines::scales_ignored_for(engine(), resolved.version, input.model, dtype))
    return fmt::format(
        "keeping {} runs it at scale 1.0 whatever scales the checkpoint ships, so "
        "calibrating is no fix on {} ({}: {})",
        dtype, engine_label(), rule->id, rule->reason);
  return fmt::format("keep {} only with calibrated scales (kvaudit calibrate)", dtype);
}

std::string Context::setting_name() const {
  return engines::kv_dtype_setting_name(engine(), resolved.version);
}

Evidence Context::launch_evidence(const std::string& field, const std::string& key,
                                  const std::string& value) const {
  const engines::LaunchFlags& f = flags();
  const std::string document = f.workload.empty() ? "" : f.workload + ": ";
  if (auto site = f.sites.find(field); site != f.sites.end() && !site->second.file.empty()) {
    const std::string& path = site->second.key_path;
    return Evidence{site->second.file,
                    document + (path.empty() || path == key ? key : path + " (" + key + ")"), value,
                    site->second.line};
  }
  if (!f.command_site.file.empty()) {
    // The setting is absent: the command that leaves it to its default is the cause.
    auto spellings = engine().launch.flags.find(field);
    const std::string flag = spellings == engine().launch.flags.end() || spellings->second.empty()
                                 ? field
                                 : spellings->second.front();
    const std::string absent = fmt::format("{}; the launch sets no {}", key, flag);
    return Evidence{f.command_site.file,
                    document + (f.command_site.key_path.empty()
                                    ? absent
                                    : f.command_site.key_path + " (" + absent + ")"),
                    value, f.command_site.line};
  }
  return Evidence{launch_label(), key, value};
}

std::optional<FormatLimits> limits_of(const engines::KvDtype* dtype) {
  if (!dtype || !dtype->quantized) return std::nullopt;
  const numerics::ElementTraits& traits = numerics::element_traits(dtype->element);
  if (!traits.is_float) return std::nullopt;
  return FormatLimits{traits.max_finite, traits.torch_overflow_from, traits.min_normal,
                      traits.min_subnormal / 2, !traits.has_inf};
}

std::string float_text(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  return fmt::format("{:g}", value);
}

std::string names_preview(const std::vector<std::string>& names, size_t shown) {
  std::string text;
  for (size_t i = 0; i < names.size() && i < shown; ++i) text += (i ? ", " : "") + names[i];
  if (names.size() > shown) text += fmt::format(" (+{} more)", names.size() - shown);
  return text;
}

std::vector<int> attention_layers(const checkpoint::ModelFacts& model) {
  std::vector<int> indices;
  for (const auto& layer : model.layers)
    if (holds_kv_cache(layer.kind)) indices.push_back(layer.index);
  return indices;
}

std::string reference_text(const engines::Provenance& provenance) {
  if (provenance.status == engines::RuleStatus::code || provenance.reference.empty())
    return provenance.reference;
  return fmt::format("{} [{}]", provenance.reference, engines::rule_status_name(provenance.status));
}

void add_provenance(const Context& ctx, const engines::Provenance& provenance,
                    std::vector<Evidence>& evidence) {
  if (!provenance.verified)
    evidence.push_back(
        {ctx.data_file(), "version bound (inferred, not read in a release)", provenance.bound});
}

}  // namespace kvaudit::audit
