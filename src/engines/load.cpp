// Loading the engine model: data/engines/<engine>.json and capacity/<engine>.json into
// typed rules, with the lint that makes a data mistake a one-line error instead of a
// silently disabled rule (unknown keys, malformed version ranges, dtypes a version does
// not have, unknown scale conventions, log templates that do not compile, gaps in the
// per-version tables).
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <mutex>
#include <set>

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
  static const std::vector<std::string> kinds = {"generated_tokens", "cached_tokens",
                                                 "spec_accept_rate", "spec_accept_length"};
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

VersionRange read_range(JsonReader& r, std::string_view key) {
  std::string text = r.string(key);
  auto range = parse_version_range(text);
  if (!range)
    r.fail(key, fmt::format("cannot read version range '{}' (expected e.g. \">=0.5.10 <0.5.20\" "
                            "with full x.y.z bounds, or \"*\")",
                            text));
  return *range;
}

template <typename Enum>
Enum read_enum(JsonReader& r, std::string_view key,
               std::initializer_list<std::pair<const char*, Enum>> names,
               std::optional<Enum> fallback = std::nullopt) {
  if (!r.has(key) && fallback) {
    r.raw(key);
    return *fallback;
  }
  std::string text = r.string(key);
  std::string known;
  for (const auto& [name, value] : names) {
    if (text == name) return value;
    known += (known.empty() ? "" : ", ") + std::string(name);
  }
  r.fail(key, fmt::format("'{}' is not one of {}", text, known));
}

// "audit": {"verdict", "checked", "read", "source", "release", "note"}: required on every
// rule. The lint refuses an open PR as the source of a behaviour, a date that is not
// YYYY-MM-DD, and a corrected, stale or added rule that does not say what changed.
RuleAudit read_audit(JsonReader& rule) {
  if (!rule.has("audit"))
    rule.fail("audit",
              "every rule needs an audit record: {\"verdict\", \"checked\", \"read\", "
              "\"source\"} (re-read it at its source first)");
  JsonReader r = rule.object("audit");
  RuleAudit audit;
  audit.verdict = read_enum<AuditVerdict>(r, "verdict",
                                          {{"confirmed", AuditVerdict::confirmed},
                                           {"corrected", AuditVerdict::corrected},
                                           {"stale", AuditVerdict::stale},
                                           {"unverifiable", AuditVerdict::unverifiable},
                                           {"added", AuditVerdict::added}});
  audit.checked = r.string("checked");
  const bool date = audit.checked.size() == 10 && audit.checked[4] == '-' &&
                    audit.checked[7] == '-' &&
                    std::all_of(audit.checked.begin(), audit.checked.end(),
                                [](char c) { return c == '-' || (c >= '0' && c <= '9'); });
  if (!date) r.fail("checked", fmt::format("'{}' is not a YYYY-MM-DD date", audit.checked));
  audit.read = r.string("read");
  if (audit.read.empty()) r.fail("read", "say what was read: path@commit function, or a PR");
  const std::string source = r.string("source");
  if (source == "open_pr")
    r.fail("source",
           "an open PR is a lead, not the source of a behaviour: cite the released "
           "code (or a merged PR, or an issue reporting released code)");
  audit.source = read_enum<SourceKind>(r, "source",
                                       {{"release_code", SourceKind::release_code},
                                        {"merged_pr", SourceKind::merged_pr},
                                        {"issue_report", SourceKind::issue_report},
                                        {"release_log", SourceKind::release_log},
                                        {"docs", SourceKind::docs}});
  audit.release = r.string_or("release", "");
  audit.note = r.string_or("note", "");
  if (audit.verdict != AuditVerdict::confirmed && audit.verdict != AuditVerdict::unverifiable &&
      audit.note.empty())
    r.fail("note", fmt::format("{} {} rule must say what the audit changed",
                               audit.verdict == AuditVerdict::added ? "an" : "a",
                               audit_verdict_name(audit.verdict)));
  r.finish();
  return audit;
}

Provenance read_provenance(JsonReader& r) {
  Provenance p;
  p.reference = r.string("reference");
  std::string status = r.string_or("status", "code");
  bool known = false;
  for (RuleStatus s :
       {RuleStatus::code, RuleStatus::merged, RuleStatus::open, RuleStatus::closed_unmerged}) {
    if (status == rule_status_id(s)) p.status = s, known = true;
  }
  if (!known)
    r.fail("status", fmt::format("'{}' is not one of code, merged, open, closed_unmerged", status));
  p.verified = r.boolean_or("verified", true);
  p.bound = r.string_or("bound", "");
  if (!p.verified && p.bound.empty())
    r.fail("bound", "a rule with \"verified\": false must say how its version bound was inferred");
  r.allow_descriptive({"notes"});
  p.audit = read_audit(r);
  return p;
}

QuantMatch read_match(JsonReader& parent, std::string_view key) {
  QuantMatch match;
  auto r = parent.optional_object(key);
  if (!r) return match;
  match.quant_methods = r->strings_or_empty("quant_methods");
  match.kv_cache_quant_algos = r->strings_or_empty("kv_cache_quant_algos");
  if (r->has("kv_cache_scheme")) match.kv_cache_scheme = r->boolean_or("kv_cache_scheme", false);
  if (auto bits = r->optional_integer("scheme_bits")) match.scheme_bits = static_cast<int>(*bits);
  if (r->has("scheme_dynamic")) match.scheme_dynamic = r->boolean_or("scheme_dynamic", false);
  match.scheme_type = r->string_or("scheme_type", "");
  match.scheme_strategies = r->strings_or_empty("scheme_strategies");
  match.architectures = r->strings_or_empty("architectures");
  match.weight_algos = r->strings_or_empty("weight_algos");
  if (r->has("hybrid")) match.hybrid = r->boolean_or("hybrid", false);
  r->finish();
  return match;
}

void check_dtype(const EngineModel& model, JsonReader& r, std::string_view key,
                 const std::string& dtype, bool allow_auto) {
  if (allow_auto && dtype == "auto") return;
  if (!model.dtypes->find(dtype) || model.dtypes->normalise(dtype) != dtype)
    r.fail(key, fmt::format("'{}' is not a canonical dtype of data/engines/dtypes.json", dtype));
}

LogKind read_log_kind(JsonReader& r) {
  std::string text = r.string("kind");
  for (int k = 0; k <= static_cast<int>(LogKind::launch_setting); ++k)
    if (log_kind_name(static_cast<LogKind>(k)) == text) return static_cast<LogKind>(k);
  r.fail("kind", fmt::format("unknown log message kind '{}'", text));
}

}  // namespace

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

std::vector<Version> boundary_versions(const EngineModel& model) {
  std::set<std::tuple<int, int, int, bool, int>> seen;
  std::vector<Version> out;
  auto add = [&](Version v) {
    if (seen.insert({v.major, v.minor, v.patch, v.latest, v.pre}).second) out.push_back(v);
  };
  auto add_range = [&](const VersionRange& range) {
    for (const auto& clause : range.clauses) {
      Version b = clause.bound;
      add(b);
      if (b.pre < Version::kFinal) {  // a release candidate: the candidates beside it
        Version before = b, after = b;
        if (before.pre > 0) --before.pre, add(before);
        ++after.pre;
        add(after);
        continue;
      }
      Version below = b;  // the release just before b (its series' top when patch is 0)
      if (below.patch > 0) {
        --below.patch;
      } else if (below.minor > 0) {
        --below.minor;
        below.patch = 1 << 20;
      } else if (below.major > 0) {
        --below.major;
        below.minor = below.patch = 1 << 20;
      }
      add(below);
      Version above = b;
      ++above.patch;
      add(above);
    }
  };
  add(Version{0, 0, 0, false});
  if (auto latest = parse_version(model.latest_known_version)) add(*latest);
  Version newest;
  newest.latest = true;
  add(newest);
  for (const auto& r : model.dtype_choices) add_range(r.versions);
  for (const auto& r : model.auto_rules) add_range(r.versions);
  for (const auto& r : model.kv_method_rules) add_range(r.versions);
  for (const auto& r : model.scale_name_rules) add_range(r.versions);
  for (const auto& r : model.scale_drop_rules) add_range(r.versions);
  for (const auto& r : model.fallback_rules) add_range(r.versions);
  for (const auto& r : model.scale_warnings) add_range(r.versions);
  for (const auto& r : model.flag_rules)
    add_range(r.exists), add_range(r.deprecated), add_range(r.disabled_for_hybrid);
  for (const auto& r : model.param_path_rules) add_range(r.versions);
  for (const auto& r : model.checkpoint_aborts) add_range(r.versions);
  for (const auto& r : model.dtype_hazards) add_range(r.versions);
  for (const auto& r : model.defaults) add_range(r.versions);
  for (const auto& r : model.log_templates) add_range(r.versions);
  for (const auto& r : model.capacity.mem_fraction_tables) add_range(r.versions);
  std::sort(out.begin(), out.end(), [](const Version& a, const Version& b) {
    return VersionRange{"", {{VersionRange::Op::lt, b}}}.contains(a);
  });
  return out;
}

namespace {

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
    if (std::find(log_arg_fields().begin(), log_arg_fields().end(), field) ==
        log_arg_fields().end())
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
          counters->fail(kind, fmt::format("not a counter probe --load reads ({})",
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
  read_platform_substitutions(top, model);
  read_state_and_draft(top, model);
  read_defaults(top, model);
  for (JsonReader& r : top.objects_or_empty("mamba_state_slots"))
    model.mamba_slots.push_back(read_mamba_slots(r));
  read_log_templates(top, model);
  read_log_args(top, model);
  read_server_info(top, model);
}

// Cross-rule checks: what no single object can see.
void lint_model(EngineModel& model) {
  const std::string& where = model.file;
  std::set<std::string> ids;
  auto unique = [&](const std::string& kind, const std::string& id) {
    if (!ids.insert(id).second)
      throw InputError(where, fmt::format("{} id '{}' is used twice", kind, id));
  };
  for (const auto& r : model.auto_rules) unique("auto_resolution", r.id);
  for (const auto& r : model.kv_method_rules) unique("kv_cache_methods", r.id);
  for (const auto& r : model.scale_name_rules) unique("scale_names", r.id);
  for (const auto& r : model.scale_drop_rules) unique("scale_drops", r.id);
  for (const auto& r : model.scale_warnings) unique("scale_warnings", r.id);
  for (const auto& r : model.flag_rules) unique("flag_lifecycle", r.id);
  for (const auto& r : model.param_path_rules) unique("quantization_param_path", r.id);
  for (const auto& r : model.checkpoint_aborts) unique("checkpoint_aborts", r.id);
  for (const auto& r : model.dtype_hazards) unique("dtype_hazards", r.id);
  for (const auto& r : model.known_bad) unique("known_bad", r.id);
  for (const auto& r : model.platform_substitutions) unique("platform_substitutions", r.id);
  for (const auto& r : model.state_dtypes) unique("state_dtypes", r.id);
  for (const auto& r : model.draft_kv) unique("draft_kv", r.id);
  for (const auto& r : model.log_templates) unique("log_messages", r.id);

  auto template_exists = [&](const std::string& id, const std::string& from) {
    if (!id.empty() && !model.log_template(id))
      throw InputError(where,
                       fmt::format("{}: log_message '{}' is not a log_messages id", from, id));
  };
  for (const auto& r : model.auto_rules) template_exists(r.log_message, "auto_resolution." + r.id);
  for (const auto& r : model.scale_name_rules)
    template_exists(r.log_message, "scale_names." + r.id);
  for (const auto& r : model.scale_drop_rules)
    template_exists(r.log_message, "scale_drops." + r.id);
  for (const auto& r : model.scale_warnings)
    template_exists(r.log_message, "scale_warnings." + r.id);
  for (const auto& r : model.fallback_rules)
    template_exists(r.both_missing_message, "fallback.both_missing");

  if (!parse_version(model.latest_known_version) || model.latest_known_version.empty())
    throw InputError(where, fmt::format("latest_known_version '{}' is not a version",
                                        model.latest_known_version));
  // Per-version tables must cover every release exactly once, and every dtype a rule
  // resolves to must be one the release accepts.
  for (const Version& v : boundary_versions(model)) {
    auto count = [&](const auto& rules) {
      return std::count_if(rules.begin(), rules.end(),
                           [&](const auto& r) { return r.versions.contains(v); });
    };
    const std::string at = version_text(v);
    if (count(model.dtype_choices) != 1)
      throw InputError(where, fmt::format("kv_cache_dtype_choices: {} entries cover {} (need one)",
                                          count(model.dtype_choices), at));
    const auto catch_all_fallbacks = std::count_if(
        model.fallback_rules.begin(), model.fallback_rules.end(),
        [&](const FallbackRule& r) { return r.versions.contains(v) && r.when.empty(); });
    if (catch_all_fallbacks != 1)
      throw InputError(where,
                       fmt::format("fallback: {} entries without \"when\" cover {} (need one)",
                                   catch_all_fallbacks, at));
    if (count(model.defaults) != 1)
      throw InputError(where, fmt::format("defaults: {} entries cover {} (need one)",
                                          count(model.defaults), at));
    bool catch_all =
        std::any_of(model.auto_rules.begin(), model.auto_rules.end(), [&](const AutoRule& r) {
          return r.versions.contains(v) && r.resolves_to == "model_dtype" && r.when.empty();
        });
    if (!catch_all)
      throw InputError(where,
                       fmt::format("auto_resolution: no rule with an empty \"when\" keeps {} {} "
                                   "in the model dtype when nothing else applies",
                                   model.engine, at));
    const DtypeChoices* choices = model.choices_for(v);
    auto accepts = [&](const std::string& dtype) {
      return std::any_of(choices->accepted.begin(), choices->accepted.end(),
                         [&](const DtypeChoice& c) { return c.dtype == dtype; });
    };
    for (const auto& rule : model.auto_rules)
      if (rule.versions.contains(v) && rule.resolves_to != "model_dtype" &&
          !accepts(rule.resolves_to))
        throw InputError(
            where, fmt::format("auto_resolution.{}: resolves to {}, which {} {} does not have "
                               "among its kv_cache_dtype_choices",
                               rule.id, rule.resolves_to, model.engine, at));
    for (const auto& convention : checkpoint::scale_conventions()) {
      bool covered = std::any_of(model.scale_name_rules.begin(), model.scale_name_rules.end(),
                                 [&](const ScaleNameRule& r) {
                                   return r.versions.contains(v) &&
                                          std::find(r.conventions.begin(), r.conventions.end(),
                                                    convention.id) != r.conventions.end();
                                 });
      if (!covered)
        throw InputError(where, fmt::format("scale_names: no rule says whether {} {} loads "
                                            "'{}' scale names",
                                            model.engine, at, convention.id));
    }
  }
  for (const auto& d : model.capacity.plan_default_dtypes)
    if (!model.dtypes->find(d))
      throw InputError(model.capacity.file,
                       fmt::format("plan_default_dtypes: '{}' is not a dtype", d));
}

void read_capacity(const std::filesystem::path& file, EngineModel& model) {
  const std::string where = display_path(file);
  json document = read_json_file(file, 1 << 20);
  JsonReader top(document, where);
  model.capacity.file = where;
  if (top.string("engine") != model.engine)
    top.fail("engine", fmt::format("expected \"{}\"", model.engine));
  if (top.integer("schema_version") != 2) top.fail("schema_version", "expected 2");
  model.capacity.model = top.string("capacity_model");  // plan checks it names a pool model
  model.capacity.plan_default_dtypes = top.strings("plan_default_dtypes");
  for (JsonReader& r : top.objects_or_empty("mem_fraction_static_default")) {
    MemFractionTable t;
    t.versions = read_range(r, "versions");
    for (JsonReader& tier : r.objects("tiers")) {
      t.tiers.push_back({tier.number("below_mib"),
                         static_cast<int>(tier.integer("chunked_prefill_size")),
                         static_cast<int>(tier.integer("cuda_graph_max_bs_tp_lt4")),
                         static_cast<int>(tier.integer("cuda_graph_max_bs_tp_ge4"))});
      tier.finish();
    }
    t.reserved_constant_mib = r.number("reserved_constant_mib");
    t.activation_mib_per_prefill_token = r.number("activation_mib_per_prefill_token");
    t.activation_min_tokens = static_cast<int>(r.integer("activation_min_tokens"));
    t.cuda_graph_mib_per_batch = r.number("cuda_graph_mib_per_batch");
    t.parallel_mib_per_rank_over_8 = r.number("parallel_mib_per_rank_over_8");
    t.dp_attention_mib_per_batch_per_dp = r.number("dp_attention_mib_per_batch_per_dp");
    t.large_gpu_threshold_mib = r.number("large_gpu_threshold_mib");
    t.large_gpu_min_reserved_mib = r.number("large_gpu_min_reserved_mib");
    t.round_decimals = static_cast<int>(r.integer("round_decimals"));
    t.caveats = r.string_or("caveats", "");
    t.provenance = read_provenance(r);
    r.finish();
    model.capacity.mem_fraction_tables.push_back(std::move(t));
  }
  if (auto c = top.optional_object("constants")) {
    model.capacity.mamba_pool_padding_slots =
        static_cast<int>(c->integer_or("mamba_pool_padding_slots", 0));
    model.capacity.kv_buffer_padding_pages =
        static_cast<int>(c->integer_or("kv_buffer_padding_pages", 0));
    c->finish();
  }
  auto references = top.object("references");
  for (const std::string& key : references.keys())
    model.capacity.references[key] = references.string(key);
  references.finish();
  top.allow_descriptive({"notes"});
  top.finish();
}

}  // namespace

EngineModel load_engine_model(const std::filesystem::path& engine_file,
                              const std::filesystem::path& capacity_file,
                              const DtypeVocabulary& dtypes) {
  EngineModel model;
  model.file = display_path(engine_file);
  model.dtypes = &dtypes;
  json document = read_json_file(engine_file, 4 << 20);
  JsonReader top(document, model.file);
  model.engine = top.string("engine");
  if (top.integer("schema_version") != 2) top.fail("schema_version", "expected 2");
  model.latest_known_version = top.string("latest_known_version");
  top.allow_descriptive({"notes", "release_evidence"});
  read_launch(top, model);
  read_rules(top, model);
  top.finish();
  read_capacity(capacity_file, model);
  lint_model(model);
  return model;
}

Registry Registry::load(const std::filesystem::path& data_dir) {
  namespace fs = std::filesystem;
  const fs::path dir = data_dir / "engines";
  Registry registry;
  registry.dtypes_ = std::make_unique<DtypeVocabulary>(load_kv_dtypes(dir / "dtypes.json"));
  std::error_code ec;
  fs::directory_iterator it(dir, ec), end;
  if (ec) throw InputError(display_path(dir), "cannot list the engine data: " + ec.message());
  std::vector<fs::path> files;
  for (; it != end; it.increment(ec)) {
    if (ec) throw InputError(display_path(dir), "cannot list the engine data: " + ec.message());
    const fs::path& path = it->path();
    if (path.extension() == ".json" && path.filename() != "dtypes.json" && it->is_regular_file(ec))
      files.push_back(path);
  }
  std::sort(files.begin(), files.end());
  for (const fs::path& file : files) {
    const std::string name = file.stem().string();
    EngineModel model =
        load_engine_model(file, dir / "capacity" / (name + ".json"), *registry.dtypes_);
    if (model.engine != name)
      throw InputError(model.file, fmt::format("says engine \"{}\"; the file of engine \"{}\" "
                                               "is named {}.json",
                                               model.engine, model.engine, model.engine));
    registry.names_.push_back(name);
    registry.models_.emplace(name, std::move(model));
  }
  if (registry.names_.empty())
    throw InputError(display_path(dir), "holds no engine data (<engine>.json)");
  return registry;
}

const EngineModel* Registry::find(std::string_view name) const {
  auto it = models_.find(name);
  return it == models_.end() ? nullptr : &it->second;
}

const EngineModel& Registry::engine(std::string_view name) const {
  if (const EngineModel* model = find(name)) return *model;
  throw InputError("--engine",
                   fmt::format("unknown engine '{}' (known: {})", name, fmt::join(names_, ", ")));
}

const MemFractionTable* CapacityData::mem_fraction_for(const Version& version) const {
  for (const auto& table : mem_fraction_tables)
    if (table.versions.contains(version)) return &table;
  return nullptr;
}

const LogTemplate* EngineModel::log_template(std::string_view id) const {
  for (const auto& log : log_templates)
    if (log.id == id) return &log;
  return nullptr;
}

const DtypeChoices* EngineModel::choices_for(const Version& version) const {
  for (const auto& entry : dtype_choices)
    if (entry.versions.contains(version)) return &entry;
  return nullptr;
}

const FallbackRule& EngineModel::fallback_for(const Version& version,
                                              const checkpoint::ModelFacts* model) const {
  if (model)
    for (const auto& rule : fallback_rules)
      if (rule.versions.contains(version) && !rule.when.empty() && rule.when.matches(*model))
        return rule;
  for (const auto& rule : fallback_rules)
    if (rule.versions.contains(version) && rule.when.empty()) return rule;
  throw InputError(file, "fallback: no rule covers " + version_text(version));  // lint forbids
}

const EngineDefaults& EngineModel::defaults_for(const Version& version) const {
  for (const auto& d : defaults)
    if (d.versions.contains(version)) return d;
  throw InputError(file, "defaults: no entry covers " + version_text(version));  // lint forbids
}

const MambaSlotRules* EngineModel::mamba_slots_for(const Version& version) const {
  for (const auto& rules : mamba_slots)
    if (rules.versions.contains(version)) return &rules;
  return nullptr;
}

std::vector<std::string> kv_cache_dtype_choices(const EngineModel& model, const Version& version) {
  std::vector<std::string> out;
  if (const DtypeChoices* choices = model.choices_for(version))
    for (const auto& c : choices->accepted) out.push_back(c.value);
  return out;
}

std::string cli_dtype(const EngineModel& model, const Version& version, std::string_view value) {
  if (const DtypeChoices* choices = model.choices_for(version))
    for (const auto& c : choices->accepted)
      if (c.value == value) return c.dtype;
  return "";
}

std::string cli_spelling(const EngineModel& model, const Version& version, std::string_view dtype) {
  if (const DtypeChoices* choices = model.choices_for(version))
    for (const auto& c : choices->accepted)
      if (c.dtype == dtype) return c.value;
  return "";
}

bool newer_than_known(const EngineModel& model, const Version& version) {
  if (version.latest) return false;
  auto latest = parse_version(model.latest_known_version);
  return latest && VersionRange{"", {{VersionRange::Op::gt, *latest}}}.contains(version);
}

}  // namespace kvaudit::engines
