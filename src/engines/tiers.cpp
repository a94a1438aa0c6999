// KV tiers: the engine data's tier flags and tier hazards (kv_tier_flags, tier_hazards), the
// settings a launch gives them, and which hazards a launch meets.
#include <fmt/format.h>

#include <algorithm>

#include "engines/internal.h"
#include "util/util.h"

namespace kvaudit::engines {

namespace {

constexpr std::array kSeverities = {"critical", "warning", "info"};

// What vLLM reads out of --kv-transfer-config (vllm/config/kv_transfer.py KVTransferConfig:
// kv_connector, kv_connector_extra_config), as tier settings of their own.
void read_transfer_config(const std::string& value, std::map<std::string, std::string>& settings) {
  const nlohmann::json config = nlohmann::json::parse(value, nullptr, false);
  if (!config.is_object()) return;
  if (auto connector = config.find("kv_connector");
      connector != config.end() && connector->is_string())
    settings["kv_connector"] = connector->get<std::string>();
  // kv_producer / kv_consumer: the prefill and decode sides of disaggregation (kv_both: one
  // server that does both, as offloading connectors run).
  if (auto role = config.find("kv_role"); role != config.end() && role->is_string())
    settings["kv_role"] = role->get<std::string>();
  auto extra = config.find("kv_connector_extra_config");
  if (extra == config.end() || !extra->is_object()) return;
  if (auto spec = extra->find("spec_name"); spec != extra->end() && spec->is_string())
    settings["offloading_spec"] = spec->get<std::string>();
  if (auto tiers = extra->find("secondary_tiers"); tiers != extra->end() && tiers->is_array()) {
    std::vector<std::string> types;
    for (const auto& tier : *tiers)
      if (tier.is_object() && tier.contains("type") && tier["type"].is_string())
        types.push_back(tier["type"].get<std::string>());
    if (!types.empty()) settings["secondary_tiers"] = fmt::format("{}", fmt::join(types, ","));
  }
}

// The value a hazard's setting is matched against ("" when neither the launch nor the
// engine's default gives it).
std::string setting_value(const EngineModel& engine, const LaunchFlags& flags,
                          const std::string& setting) {
  if (setting == "speculative_algorithm") return flags.speculative_algorithm;
  if (setting == "kv_cache_dtype_requested") return flags.kv_cache_dtype;
  return tier_setting_value(engine, flags, setting);
}

// kv_tier_flags.config_keys and .defaults: settings a config file gives by dotted key, and the
// engine's value for a setting no launch names.
void read_tier_config_keys(JsonReader& flags, EngineModel& model) {
  if (auto keys = flags.optional_object("config_keys")) {
    if (model.launch.config_file_flags.empty() || model.launch.config_keys_are_flags)
      flags.fail("config_keys", "needs a launch.config_file read by key (keys_are_flags false)");
    for (const std::string& setting : keys->keys())
      model.tier_config_keys[setting] = keys->strings(setting);
    keys->finish();
  }
  if (auto defaults = flags.optional_object("defaults")) {
    for (const std::string& setting : defaults->keys()) {
      if (!model.tier_flags.count(setting) && !model.tier_config_keys.count(setting))
        defaults->fail(setting, "is not a tier setting of this engine (kv_tier_flags)");
      model.tier_defaults[setting] = defaults->string(setting);
    }
    defaults->finish();
  }
}

// A comma-joined value (secondary_tiers) matches when one of its items does.
bool value_matches(const std::vector<std::string>& globs, const std::string& value) {
  if (value.empty()) return false;
  for (const std::string& item : split_list(value))
    for (const std::string& glob : globs)
      if (glob == "*" || glob_match(glob, item)) return true;
  return false;
}

}  // namespace

void read_tier_data(JsonReader& top, EngineModel& model) {
  if (auto flags = top.optional_object("kv_tier_flags")) {
    for (const std::string& setting : flags->keys()) {
      if (setting == "boolean" || setting == "notes" || setting == "config_keys" ||
          setting == "defaults")
        continue;
      model.tier_flags[setting] = flags->strings(setting);
    }
    for (const std::string& flag : flags->strings_or_empty("boolean"))
      model.tier_boolean_flags.insert(flag);
    read_tier_config_keys(*flags, model);
    flags->allow_descriptive({"notes"});
    flags->finish();
  }
  for (JsonReader& r : top.objects_or_empty("tier_hazards")) {
    TierHazard rule;
    rule.id = r.string("id");
    rule.versions = read_range(r, "versions");
    rule.tier = r.string("tier");
    JsonReader settings = r.object("settings");
    for (const std::string& setting : settings.keys()) {
      if (setting != "speculative_algorithm" && setting != "kv_cache_dtype_requested" &&
          !model.tier_flags.count(setting) && !model.tier_config_keys.count(setting) &&
          !is_derived_tier_setting(setting))
        settings.fail(setting, "is not a tier setting of this engine (kv_tier_flags)");
      rule.settings[setting] = settings.strings(setting);
    }
    rule.kv_dtypes = r.strings_or_empty("kv_dtypes");
    for (const auto& dtype : rule.kv_dtypes) check_dtype(model, r, "kv_dtypes", dtype, false);
    if (r.has("hybrid")) rule.hybrid = r.boolean_or("hybrid", false);
    rule.severity = r.string("severity");
    if (std::find(kSeverities.begin(), kSeverities.end(), rule.severity) == kSeverities.end())
      r.fail("severity", fmt::format("'{}' is not critical, warning or info", rule.severity));
    rule.consequence = r.string("consequence");
    rule.fix = r.string("fix");
    rule.fixed_in = r.string_or("fixed_in", "");
    if (!rule.fixed_in.empty() && !parse_version(rule.fixed_in))
      r.fail("fixed_in", fmt::format("'{}' is not a version", rule.fixed_in));
    rule.provenance = read_provenance(r);
    r.finish();
    model.tier_hazards.push_back(std::move(rule));
  }
}

bool is_derived_tier_setting(std::string_view setting) {
  return setting == "kv_connector" || setting == "offloading_spec" ||
         setting == "secondary_tiers" || setting == "kv_role";
}

std::string tier_setting_value(const EngineModel& engine, const LaunchFlags& flags,
                               std::string_view setting) {
  const std::string key(setting);
  if (auto it = flags.tier_settings.find(key); it != flags.tier_settings.end()) return it->second;
  auto fallback = engine.tier_defaults.find(key);
  return fallback == engine.tier_defaults.end() ? "" : fallback->second;
}

void record_tier_setting(std::string_view setting, const std::string& value,
                         std::map<std::string, std::string>& settings) {
  settings[std::string(setting)] = value;
  if (setting == "kv_transfer_config") read_transfer_config(value, settings);
}

void record_tier_setting(std::string_view setting, const std::string& value, LaunchFlags& flags) {
  record_tier_setting(setting, value, flags.tier_settings);
}

std::vector<const TierHazard*> find_tier_hazards(const EngineModel& engine, const Version& version,
                                                 const checkpoint::ModelFacts& model,
                                                 const LaunchFlags& flags,
                                                 std::string_view resolved_kv_dtype) {
  std::vector<const TierHazard*> hits;
  const bool hybrid = model.linear_attention.has_value();
  for (const TierHazard& rule : engine.tier_hazards) {
    if (!rule.versions.contains(version)) continue;
    if (rule.hybrid && *rule.hybrid != hybrid) continue;
    if (!rule.kv_dtypes.empty() && std::find(rule.kv_dtypes.begin(), rule.kv_dtypes.end(),
                                             resolved_kv_dtype) == rule.kv_dtypes.end())
      continue;
    const bool settings_match =
        std::all_of(rule.settings.begin(), rule.settings.end(), [&](const auto& entry) {
          return value_matches(entry.second, setting_value(engine, flags, entry.first));
        });
    if (settings_match) hits.push_back(&rule);
  }
  return hits;
}

}  // namespace kvaudit::engines
