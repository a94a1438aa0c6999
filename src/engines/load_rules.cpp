// The KV rule sections of an engine file: how a launch sets the KV dtype, the dtypes each
// release accepts and resolves, the checkpoint scales it loads or drops, the scale fallback
// and warnings, flag life cycles, what stops start-up, and known-bad combinations.

#include <fmt/format.h>

#include <algorithm>

#include "engines/internal.h"
#include "util/util.h"

namespace kvaudit::engines {

namespace {

// "kv_dtype_setting": how a launch sets the KV dtype (default: the launch's kv_cache_dtype
// flag in every release), and the 16-bit overlay where no value gives a 16-bit cache.
void read_kv_dtype_setting(JsonReader& top, EngineModel& model) {
  KvDtypeSetting& setting = model.kv_dtype_setting;
  auto flags = model.launch.flags.find("kv_cache_dtype");
  auto r = top.optional_object("kv_dtype_setting");
  if (!r) {
    if (flags == model.launch.flags.end() || flags->second.empty())
      top.fail("kv_dtype_setting", "needed when launch.flags has no kv_cache_dtype");
    setting.flag = flags->second.front();
    setting.flag_versions = *parse_version_range("*");
    return;
  }
  setting.flag = r->string_or("flag", "");
  setting.flag_versions =
      r->has("flag_versions") ? read_range(*r, "flag_versions") : *parse_version_range("*");
  setting.config_key = r->string_or("config_key", "");
  setting.logged = r->boolean_or("logged", true);
  if (setting.flag.empty() && setting.config_key.empty())
    r->fail("flag", "name the flag or the config key that sets the KV dtype");
  if (!setting.flag.empty() &&
      (flags == model.launch.flags.end() ||
       std::find(flags->second.begin(), flags->second.end(), setting.flag) == flags->second.end()))
    r->fail("flag",
            fmt::format("'{}' is not a spelling of launch.flags.kv_cache_dtype", setting.flag));
  if (auto overlay = r->optional_object("sixteen_bit_overlay")) {
    KvDtypeSetting::Overlay o;
    o.file = overlay->string("file");
    o.key = overlay->string("key");
    o.inline_key = overlay->string_or("inline_key", "");
    o.reason = overlay->string("reason");
    overlay->finish();
    setting.sixteen_bit_overlay = o;
  }
  setting.provenance = read_provenance(*r);
  r->finish();
}

void read_dtype_choices(JsonReader& top, EngineModel& model) {
  for (JsonReader& r : top.objects("kv_cache_dtype_choices")) {
    DtypeChoices choices;
    choices.versions = read_range(r, "versions");
    JsonReader accepted = r.object("accepted");
    for (const std::string& value : accepted.keys()) {
      std::string dtype = accepted.string(value);
      check_dtype(model, accepted, value, dtype, true);
      choices.accepted.push_back({value, dtype});
    }
    accepted.finish();
    if (auto aborts = r.optional_object("aborts")) {
      for (const std::string& value : aborts->keys()) {
        JsonReader abort = aborts->object(value);
        StartupAbort a{abort.string("id"), abort.string("message"), read_provenance(abort)};
        abort.finish();
        choices.aborts[value] = a;
      }
      aborts->finish();
    }
    choices.provenance = read_provenance(r);
    r.finish();
    model.dtype_choices.push_back(std::move(choices));
  }
}

void read_auto_resolution(JsonReader& top, EngineModel& model) {
  for (JsonReader& r : top.objects("auto_resolution")) {
    AutoRule rule;
    rule.id = r.string("id");
    rule.versions = read_range(r, "versions");
    rule.applies = read_enum<AutoApplies>(
        r, "applies",
        {{"auto_only", AutoApplies::auto_only}, {"any_request", AutoApplies::any_request}},
        AutoApplies::auto_only);
    rule.when = read_match(r, "when");
    rule.resolves_to = r.string("resolves_to");
    if (rule.resolves_to != "model_dtype")
      check_dtype(model, r, "resolves_to", rule.resolves_to, false);
    rule.reason = r.string("reason");
    rule.log_message = r.string_or("log_message", "");
    rule.provenance = read_provenance(r);
    r.finish();
    model.auto_rules.push_back(std::move(rule));
  }
}

void read_kv_method_rules(JsonReader& top, EngineModel& model) {
  for (JsonReader& r : top.objects("kv_cache_methods")) {
    KvMethodRule rule{r.string("id"), read_range(r, "versions"), r.strings("quant_methods"),
                      r.string("reason"), read_provenance(r)};
    r.finish();
    model.kv_method_rules.push_back(std::move(rule));
  }
}

void read_scale_name_rules(JsonReader& top, EngineModel& model) {
  auto read_scale_rules = [&](const char* key, bool drops) {
    std::vector<ScaleNameRule> rules;
    for (JsonReader& r : top.objects(key)) {
      ScaleNameRule rule;
      rule.id = r.string("id");
      rule.versions = read_range(r, "versions");
      rule.conventions = r.strings("conventions");
      rule.loaded = drops ? false : r.boolean_or("loaded", true);
      rule.when = read_match(r, "when");
      rule.dtypes = r.strings_or_empty("dtypes");
      for (const std::string& dtype : rule.dtypes) check_dtype(model, r, "dtypes", dtype, false);
      rule.reason = r.string("reason");
      rule.log_message = r.string_or("log_message", "");
      rule.provenance = read_provenance(r);
      r.finish();
      for (const std::string& id : rule.conventions) {
        bool known = id == "*" && drops;
        for (const auto& c : checkpoint::scale_conventions()) known |= c.id == id;
        if (!known)
          r.fail(
              "conventions",
              fmt::format("'{}' is not a scale-name convention the checkpoint reader knows", id));
      }
      rules.push_back(std::move(rule));
    }
    return rules;
  };
  model.scale_name_rules = read_scale_rules("scale_names", false);
  model.scale_drop_rules = read_scale_rules("scale_drops", true);
}

void read_fallback_rules(JsonReader& top, EngineModel& model) {
  for (JsonReader& r : top.objects("fallback")) {
    FallbackRule rule;
    rule.versions = read_range(r, "versions");
    rule.when = read_match(r, "when");
    JsonReader both = r.object("both_missing");
    rule.both_missing_scale = both.number("scale");
    rule.both_missing_message = both.string_or("log_message", "");
    both.finish();
    const std::initializer_list<std::pair<const char*, OneScaleRule>> one = {
        {"present_for_both", OneScaleRule::present_for_both},
        {"startup_error", OneScaleRule::startup_error},
        {"other_side_unit", OneScaleRule::other_side_unit}};
    rule.k_only = read_enum<OneScaleRule>(r, "k_only", one);
    rule.v_only = read_enum<OneScaleRule>(r, "v_only", one);
    rule.one_missing_error = r.string_or("one_missing_error", "");
    rule.zero = read_enum<ZeroScaleRule>(r, "zero",
                                         {{"missing", ZeroScaleRule::missing},
                                          {"startup_error", ZeroScaleRule::startup_error},
                                          {"used_as_is", ZeroScaleRule::used_as_is}});
    rule.zero_error = r.string_or("zero_error", "");
    rule.non_scalar = read_enum<NonScalarRule>(
        r, "non_scalar",
        {{"startup_error", NonScalarRule::startup_error},
         {"per_head_for_ct_attn_head", NonScalarRule::per_head_for_ct_attn_head}});
    rule.non_scalar_error = r.string("non_scalar_error");
    rule.provenance = read_provenance(r);
    r.finish();
    if ((rule.k_only == OneScaleRule::startup_error ||
         rule.v_only == OneScaleRule::startup_error) &&
        rule.one_missing_error.empty())
      r.fail("one_missing_error", "a start-up error needs the engine's message");
    if (rule.zero == ZeroScaleRule::startup_error && rule.zero_error.empty())
      r.fail("zero_error", "a start-up error needs the engine's message");
    model.fallback_rules.push_back(std::move(rule));
  }
}

void read_scale_warnings(JsonReader& top, EngineModel& model) {
  for (JsonReader& r : top.objects_or_empty("scale_warnings")) {
    ScaleWarningRule rule;
    rule.id = r.string("id");
    rule.versions = read_range(r, "versions");
    rule.dtypes = r.strings("dtypes");
    for (const auto& d : rule.dtypes) check_dtype(model, r, "dtypes", d, false);
    rule.when = read_match(r, "when");
    rule.when_requested_explicitly = r.boolean_or("when_requested_explicitly", false);
    rule.when_no_quantization_param_path = r.boolean_or("when_no_quantization_param_path", false);
    rule.when_unit_scale = r.boolean_or("when_unit_scale", false);
    rule.log_message = r.string("log_message");
    rule.meaning = r.string("meaning");
    rule.provenance = read_provenance(r);
    r.finish();
    model.scale_warnings.push_back(std::move(rule));
  }
}

void read_flag_lifecycle(JsonReader& top, EngineModel& model) {
  for (JsonReader& r : top.objects_or_empty("flag_lifecycle")) {
    FlagRule rule;
    rule.id = r.string("id");
    rule.flag = r.string("flag");
    rule.exists = read_range(r, "exists");
    rule.deprecated =
        r.has("deprecated") ? read_range(r, "deprecated") : *parse_version_range("<0.0.0");
    rule.disabled_for_hybrid = r.has("disabled_for_hybrid") ? read_range(r, "disabled_for_hybrid")
                                                            : *parse_version_range("<0.0.0");
    rule.hybrid_hazard = r.string_or("hybrid_hazard", "");
    rule.removed_error = r.string("removed_error");
    rule.meaning = r.string("meaning");
    rule.provenance = read_provenance(r);
    r.finish();
    bool parsed = false;
    for (const auto& [field, spellings] : model.launch.flags)
      parsed |= std::find(spellings.begin(), spellings.end(), rule.flag) != spellings.end();
    if (!parsed) r.fail("flag", fmt::format("{} is not among launch.flags", rule.flag));
    model.flag_rules.push_back(std::move(rule));
  }
}

void read_param_path_rules(JsonReader& top, EngineModel& model) {
  for (JsonReader& r : top.objects_or_empty("quantization_param_path")) {
    ParamPathRule rule;
    rule.id = r.string("id");
    rule.versions = read_range(r, "versions");
    rule.effect = read_enum<ParamPathRule::Effect>(
        r, "effect",
        {{"not_applied", ParamPathRule::Effect::not_applied},
         {"startup_error_without_loader", ParamPathRule::Effect::startup_error_without_loader}});
    rule.dtypes = r.strings_or_empty("dtypes");
    for (const auto& d : rule.dtypes) check_dtype(model, r, "dtypes", d, false);
    rule.architectures_with_loader = r.strings_or_empty("architectures_with_loader");
    rule.message = r.string_or("message", "");
    rule.reason = r.string("reason");
    rule.provenance = read_provenance(r);
    r.finish();
    if (rule.effect == ParamPathRule::Effect::startup_error_without_loader &&
        (rule.message.empty() || rule.architectures_with_loader.empty()))
      r.fail("message", "a start-up error needs the engine's message and the loaders' list");
    model.param_path_rules.push_back(std::move(rule));
  }
  model.has_quantization_param_path = model.launch.flags.count("quantization_param_path") > 0;
  model.has_dynamic_scales_flag = model.launch.flags.count("calculate_kv_scales") > 0;
}

void read_checkpoint_aborts(JsonReader& top, EngineModel& model) {
  for (JsonReader& r : top.objects_or_empty("checkpoint_aborts")) {
    CheckpointAbort rule;
    rule.id = r.string("id");
    rule.versions = read_range(r, "versions");
    rule.requested = r.strings_or_empty("requested");
    for (const auto& d : rule.requested) check_dtype(model, r, "requested", d, false);
    rule.requires_scale_tensors = r.boolean_or("requires_scale_tensors", false);
    rule.when = read_match(r, "when");
    rule.message = r.string("message");
    rule.provenance = read_provenance(r);
    r.finish();
    model.checkpoint_aborts.push_back(std::move(rule));
  }
}

void read_known_bad(JsonReader& top, EngineModel& model) {
  for (JsonReader& r : top.objects_or_empty("known_bad")) {
    KnownBad rule;
    rule.id = r.string("id");
    rule.versions = read_range(r, "versions");
    rule.kv_dtypes = r.strings_or_empty("kv_dtypes");
    for (const auto& d : rule.kv_dtypes) check_dtype(model, r, "kv_dtypes", d, false);
    rule.backends = r.strings_or_empty("backends");
    for (auto& b : rule.backends) b = ascii_lower(b);
    rule.gpu_archs = r.strings_or_empty("gpu_archs");
    rule.when = read_match(r, "when");
    rule.requires_scale_tensors = r.boolean_or("requires_scale_tensors", false);
    rule.consequence = r.string("consequence");
    rule.fixed_in = r.string_or("fixed_in", "");
    if (!rule.fixed_in.empty() && !parse_version(rule.fixed_in))
      r.fail("fixed_in", fmt::format("'{}' is not a version", rule.fixed_in));
    rule.provenance = read_provenance(r);
    r.finish();
    model.known_bad.push_back(std::move(rule));
  }
  for (JsonReader& r : top.objects_or_empty("default_backends")) {
    DefaultBackend rule;
    rule.versions = read_range(r, "versions");
    rule.gpu_archs = r.strings("gpu_archs");
    rule.kv_dtypes = r.strings_or_empty("kv_dtypes");
    for (const auto& d : rule.kv_dtypes) check_dtype(model, r, "kv_dtypes", d, false);
    if (r.has("mla")) rule.mla = r.boolean_or("mla", false);
    rule.backend = ascii_lower(r.string("backend"));
    rule.provenance = read_provenance(r);
    r.finish();
    model.default_backends.push_back(std::move(rule));
  }
}

void read_platform_substitutions(JsonReader& top, EngineModel& model) {
  for (JsonReader& r : top.objects_or_empty("platform_substitutions")) {
    PlatformSubstitution rule;
    rule.id = r.string("id");
    rule.versions = read_range(r, "versions");
    rule.platform = r.string("platform");
    if (rule.platform != "cuda" && rule.platform != "rocm")
      r.fail("platform", "expected cuda or rocm");
    rule.gpu_archs = r.strings_or_empty("gpu_archs");
    rule.requested = r.strings("requested");
    for (const auto& d : rule.requested) check_dtype(model, r, "requested", d, false);
    rule.becomes = r.string("becomes");
    check_dtype(model, r, "becomes", rule.becomes, false);
    rule.silent = r.boolean_or("silent", true);
    rule.consequence = r.string("consequence");
    rule.provenance = read_provenance(r);
    r.finish();
    model.platform_substitutions.push_back(std::move(rule));
  }
}

void read_state_and_draft(JsonReader& top, EngineModel& model) {
  for (JsonReader& r : top.objects_or_empty("state_dtypes")) {
    StateDtypeRule rule;
    rule.id = r.string("id");
    rule.versions = read_range(r, "versions");
    rule.when = read_match(r, "when");
    if (rule.when.empty()) r.fail("when", "name the model family the rule is for");
    rule.ssm_dtype = r.string("ssm_dtype");
    rule.ssm_fallback = r.string_or("ssm_fallback", "");
    rule.conv_dtype = r.string_or("conv_dtype", "");
    for (const std::string* d : {&rule.ssm_dtype, &rule.conv_dtype, &rule.ssm_fallback})
      if (!d->empty() && *d != "from_model_config" && *d != "model_dtype" &&
          !model.dtypes->find(*d))
        r.fail("ssm_dtype", fmt::format("'{}' is not a dtype", *d));
    rule.provenance = read_provenance(r);
    r.finish();
    model.state_dtypes.push_back(std::move(rule));
  }
  for (JsonReader& r : top.objects_or_empty("draft_kv")) {
    DraftKvRule rule;
    rule.id = r.string("id");
    rule.versions = read_range(r, "versions");
    rule.follows_target = r.boolean_or("follows_target", true);
    rule.override_flag = r.string_or("override_flag", "");
    rule.consequence = r.string("consequence");
    rule.provenance = read_provenance(r);
    r.finish();
    model.draft_kv.push_back(std::move(rule));
  }
}

void read_dtype_hazards(JsonReader& top, EngineModel& model) {
  for (JsonReader& r : top.objects_or_empty("dtype_hazards")) {
    DtypeHazard rule;
    rule.id = r.string("id");
    rule.versions = read_range(r, "versions");
    rule.dtypes = r.strings("dtypes");
    for (const auto& d : rule.dtypes) check_dtype(model, r, "dtypes", d, false);
    rule.model_dtypes = r.strings("model_dtypes");
    for (const auto& d : rule.model_dtypes) check_dtype(model, r, "model_dtypes", d, false);
    rule.consequence = r.string("consequence");
    rule.provenance = read_provenance(r);
    r.finish();
    model.dtype_hazards.push_back(std::move(rule));
  }
}

}  // namespace

// Every rule section of an engine file, in file order.
void read_rules(JsonReader& top, EngineModel& model) {
  read_kv_dtype_setting(top, model);
  read_dtype_choices(top, model);
  read_auto_resolution(top, model);
  read_kv_method_rules(top, model);
  read_scale_name_rules(top, model);
  read_fallback_rules(top, model);
  read_scale_warnings(top, model);
  read_flag_lifecycle(top, model);
  read_param_path_rules(top, model);
  read_checkpoint_aborts(top, model);
  read_dtype_hazards(top, model);
  read_known_bad(top, model);
  read_tier_data(top, model);
  read_platform_substitutions(top, model);
  read_state_and_draft(top, model);
  read_serving_rules(top, model);
}

}  // namespace kvaudit::engines
