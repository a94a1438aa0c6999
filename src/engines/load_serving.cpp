// The sections of an engine file about the running server: its launch command, its
// defaults and Mamba state slots, the log messages and args lines it prints, its server info.

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "engines/internal.h"
#include "util/util.h"

namespace kvaudit::engines {

namespace {

using nlohmann::json;

// Fields a launch flag may set (launch.cpp applies each).
const std::vector<std::string>& launch_fields() {
  static const std::vector<std::string> fields = {"kv_cache_dtype",
                                                  "model_path",
                                                  "tp",
                                                  "pp",
                                                  "dp",
                                                  "dcp",
                                                  "dp_attention",
                                                  "quantization_param_path",
                                                  "quantization",
                                                  "dtype",
                                                  "context_length",
                                                  "memory_fraction",
                                                  "mamba_ssm_dtype",
                                                  "calculate_kv_scales",
                                                  "kv_cache_dtype_skip_layers",
                                                  "speculative_algorithm",
                                                  "speculative_draft_layers",
                                                  "max_total_tokens",
                                                  "page_size",
                                                  "host",
                                                  "port",
                                                  "attention_backend",
                                                  "speculative_draft_kv_cache_dtype"};
  return fields;
}

const std::vector<std::string>& server_counter_kinds() {
  // prefix_hit_tokens: hits in the device pool; tier_hit_tokens: in a tier behind it
  // (probe --roundtrip tells which tier served a pass from them).
  static const std::vector<std::string> kinds = {"generated_tokens",  "cached_tokens",
                                                 "spec_accept_rate",  "spec_accept_length",
                                                 "prefix_hit_tokens", "tier_hit_tokens"};
  return kinds;
}

const std::vector<std::string>& log_arg_fields() {
  static const std::vector<std::string> fields = [] {
    std::vector<std::string> out = launch_fields();
    out.push_back("mamba_full_memory_ratio");
    // What decides SGLang's running-request cap for hybrids (state slots per request).
    for (const char* field :
         {"max_running_requests", "mamba_radix_cache_strategy", "disable_radix_cache",
          "disable_overlap_schedule", "speculative_algorithm"})
      out.push_back(field);
    return out;
  }();
  return fields;
}

LogKind read_log_kind(JsonReader& r) {
  std::string text = r.string("kind");
  for (int k = 0; k <= static_cast<int>(LogKind::kv_tier); ++k)
    if (log_kind_name(static_cast<LogKind>(k)) == text) return static_cast<LogKind>(k);
  r.fail("kind", fmt::format("unknown log message kind '{}'", text));
}

std::map<std::string, int> read_slot_map(JsonReader& r, std::string_view key, bool required) {
  std::map<std::string, int> out;
  const nlohmann::json& raw = r.raw(key);
  if (raw.is_null() && !required) return out;
  if (!raw.is_object() || raw.empty()) r.fail(key, "expected an object of strategy: integer");
  for (const auto& [name, value] : raw.items()) {
    if (!value.is_number_integer() || value.get<int64_t>() < -8 || value.get<int64_t>() > 16)
      r.fail(key, fmt::format("'{}': expected a small integer", name));
    out[name] = value.get<int>();
  }
  return out;
}

MambaSlotRules read_mamba_slots(JsonReader& r) {
  MambaSlotRules rules;
  rules.versions = read_range(r, "versions");
  rules.default_strategy = r.string("default_strategy");
  rules.slots = read_slot_map(r, "slots", true);
  rules.no_overlap_delta = read_slot_map(r, "no_overlap_delta", false);
  rules.spec_delta = read_slot_map(r, "spec_delta", false);
  rules.skip_decode_lock_delta = read_slot_map(r, "skip_decode_lock_delta", false);
  rules.provenance = read_provenance(r);
  r.finish();
  if (!rules.slots.count("radix_off")) r.fail("slots", "needs 'radix_off' (--disable-radix-cache)");
  if (rules.default_strategy != "auto" && !rules.slots.count(rules.default_strategy))
    r.fail("default_strategy", fmt::format("'{}' has no slots", rules.default_strategy));
  if (rules.default_strategy == "auto" &&
      (!rules.slots.count("extra_buffer") || !rules.slots.count("no_buffer")))
    r.fail("default_strategy", "'auto' chooses extra_buffer or no_buffer: give both");
  for (const auto* deltas :
       {&rules.no_overlap_delta, &rules.spec_delta, &rules.skip_decode_lock_delta})
    for (const auto& [name, delta] : *deltas)
      if (!rules.slots.count(name))
        r.fail("slots", fmt::format("a delta names '{}', which has no slots", name));
  return rules;
}

void read_defaults(JsonReader& top, EngineModel& model) {
  for (JsonReader& r : top.objects("defaults")) {
    EngineDefaults d;
    d.versions = read_range(r, "versions");
    d.memory_fraction = r.optional_number("memory_fraction");
    d.mamba_full_memory_ratio = r.optional_number("mamba_full_memory_ratio");
    d.mamba_ssm_dtype = r.string("mamba_ssm_dtype");
    d.mamba_ssm_dtype_fallback = r.string_or("mamba_ssm_dtype_fallback", "float32");
    d.mamba_conv_dtype = r.string_or("mamba_conv_dtype", "bfloat16");
    d.mamba_ssm_dtype_choices = r.strings_or_empty("mamba_ssm_dtype_choices");
    if (auto page = r.optional_integer("page_size")) d.page_size = static_cast<int>(*page);
    if (auto page = r.optional_integer("dsa_page_size"); page && *page >= 1 && *page <= 1 << 20)
      d.dsa_page_size = static_cast<int>(*page);
    d.swa_full_tokens_ratio = r.optional_number("swa_full_tokens_ratio");
    d.fp4_dequant_workspace = r.boolean_or("fp4_dequant_workspace", false);
    d.mm_reservation_mib = r.number_or("mm_reservation_mib", 0);
    d.provenance = read_provenance(r);
    r.finish();
    for (const std::string* dtype : {&d.mamba_ssm_dtype_fallback, &d.mamba_conv_dtype})
      if (!model.dtypes->find(*dtype) && *dtype != "model_dtype")
        r.fail("mamba_conv_dtype", fmt::format("unknown dtype '{}'", *dtype));
    if (d.mamba_ssm_dtype != "from_model_config" && d.mamba_ssm_dtype != "auto" &&
        d.mamba_ssm_dtype != "model_dtype" && !model.dtypes->find(d.mamba_ssm_dtype))
      r.fail("mamba_ssm_dtype", fmt::format("unknown dtype '{}'", d.mamba_ssm_dtype));
    model.defaults.push_back(std::move(d));
  }
}

void read_log_templates(JsonReader& top, EngineModel& model) {
  for (JsonReader& r : top.objects("log_messages")) {
    LogTemplate log;
    log.id = r.string("id");
    log.versions = read_range(r, "versions");
    log.kind = read_log_kind(r);
    log.text = r.string("text");
    log.fields = r.strings_or_empty("fields");
    log.last_wins = r.boolean_or("last_wins", false);
    log.provenance = read_provenance(r);
    r.finish();
    for (const std::string& field : log.fields)
      if (std::find(log_field_names().begin(), log_field_names().end(), field) ==
          log_field_names().end())
        r.fail("fields", fmt::format("'{}' is not a field the log reader knows", field));
    try {
      compile_log_template(log);
    } catch (const std::invalid_argument& error) {
      r.fail("text", fmt::format("log template does not compile: {}", error.what()));
    }
    model.log_templates.push_back(std::move(log));
  }
}

void read_log_args(JsonReader& top, EngineModel& model) {
  auto args = top.optional_object("log_args");
  if (!args) return;
  JsonReader keys = args->object("keys");
  for (const std::string& field : keys.keys()) {
    // A tier setting (kv_tier_flags) is read as the launch's own tier flag would be.
    if (std::find(log_arg_fields().begin(), log_arg_fields().end(), field) ==
            log_arg_fields().end() &&
        !model.tier_flags.count(field))
      keys.fail(field, "not a field the log reader fills from an args line");
    model.log_args.keys[field] = keys.strings(field);
  }
  keys.finish();
  if (auto defaults = args->optional_object("omitted_defaults")) {
    for (const std::string& field : defaults->keys()) {
      if (!model.log_args.keys.count(field))
        defaults->fail(field, "a default for a field log_args.keys does not name");
      model.log_args.omitted_defaults[field] = defaults->string(field);
    }
    defaults->finish();
  }
  model.log_args.provenance = read_provenance(*args);
  args->finish();
}

void read_server_info(JsonReader& top, EngineModel& model) {
  if (auto info = top.optional_object("server_info")) {
    ServerInfoSpec spec;
    spec.endpoints = info->strings("endpoints");
    spec.reports_requested_dtype = info->boolean_or("reports_requested_dtype", false);
    spec.version_endpoint = info->string_or("version_endpoint", "");
    spec.owned_by = info->string_or("owned_by", "");
    spec.stats_endpoint = info->string_or("stats_endpoint", "");
    spec.stats_drain_on_read = info->boolean_or("stats_drain_on_read", false);
    if (auto counters = info->optional_object("counters")) {
      for (const std::string& kind : counters->keys()) {
        if (std::find(server_counter_kinds().begin(), server_counter_kinds().end(), kind) ==
            server_counter_kinds().end())
          counters->fail(kind, fmt::format("not a counter probe reads ({})",
                                           fmt::join(server_counter_kinds(), ", ")));
        spec.counters[kind] = counters->strings(kind);
      }
      counters->finish();
    }
    if (info->has("completion_extra")) {
      const json& extra = info->raw("completion_extra");
      if (!extra.is_object()) info->fail("completion_extra", "expected an object");
      spec.completion_extra_json = extra.dump();
    }
    spec.provenance = read_provenance(*info);
    info->finish();
    model.server_info = spec;
  }
}

}  // namespace

void read_launch(JsonReader& top, EngineModel& model) {
  JsonReader launch = top.object("launch");
  model.launch.entry_points = launch.strings("entry_points");
  model.launch.positional_model = launch.boolean_or("positional_model", false);
  JsonReader flags = launch.object("flags");
  for (const std::string& field : flags.keys()) {
    if (std::find(launch_fields().begin(), launch_fields().end(), field) == launch_fields().end())
      flags.fail(field, "not a launch field kvaudit reads");
    model.launch.flags[field] = flags.strings(field);
  }
  flags.finish();
  if (auto env = launch.optional_object("environment")) {
    for (const std::string& field : env->keys()) {
      if (std::find(launch_fields().begin(), launch_fields().end(), field) == launch_fields().end())
        env->fail(field, "not a launch field kvaudit reads");
      model.launch.environment[field] = env->strings(field);
    }
    env->finish();
  }
  model.launch.boolean_flags = launch.strings_or_empty("boolean_flags");
  model.launch.default_port = static_cast<int>(launch.integer("default_port"));
  if (model.launch.default_port <= 0 || model.launch.default_port > 65535)
    launch.fail("default_port", "not a TCP port");
  model.launch.default_port_source = launch.string("default_port_source");
  if (auto underscores = launch.optional_object("underscores_are_dashes")) {
    model.launch.underscores_are_dashes = underscores->boolean_or("value", false);
    model.launch.underscores_source = underscores->string("reference");
    underscores->finish();
  }
  for (JsonReader& image : launch.objects_or_empty("image_entry_points")) {
    LaunchSpec::ImageEntryPoint entry{image.string("image"), image.strings("words"),
                                      image.string("reference")};
    if (entry.words.empty()) image.fail("words", "empty");
    model.launch.image_entry_points.push_back(std::move(entry));
    image.finish();
  }
  if (auto config = launch.optional_object("config_file")) {
    model.launch.config_file_flags = config->strings("flags");
    model.launch.config_keys_are_flags = config->boolean_or("keys_are_flags", false);
    if (auto keys = config->optional_object("keys")) {
      for (const std::string& field : keys->keys()) {
        if (std::find(launch_fields().begin(), launch_fields().end(), field) ==
            launch_fields().end())
          keys->fail(field, "not a launch field kvaudit reads");
        model.launch.config_keys[field] = keys->strings(field);
      }
      keys->finish();
    } else if (!model.launch.config_keys_are_flags) {
      config->fail("keys", "needed unless keys_are_flags");
    }
    if (auto rejected = config->optional_object("rejected_keys")) {
      for (const std::string& key : rejected->keys())
        model.launch.config_rejected_keys[key] = rejected->string(key);
      rejected->finish();
    }
    model.launch.config_overrides_flags = config->boolean_or("overrides_flags", false);
    model.launch.config_source = config->string("reference");
    config->finish();
  }
  launch.finish();
  if (model.launch.entry_points.empty()) launch.fail("entry_points", "empty");
}

// The sections about the running server, in file order (read_rules reads them last).
void read_serving_rules(JsonReader& top, EngineModel& model) {
  read_defaults(top, model);
  for (JsonReader& r : top.objects_or_empty("mamba_state_slots"))
    model.mamba_slots.push_back(read_mamba_slots(r));
  read_log_templates(top, model);
  read_log_args(top, model);
  read_server_info(top, model);
}

}  // namespace kvaudit::engines
