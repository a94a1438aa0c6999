// Every behavioural key of the engine data is read by some code path. The test mutates
// each key of each data file (every entry that has it at once) and requires that either
// the loader refuses the result (its lint read the key) or the output of some command
// changes: check (resolve + findings) over fixtures x releases x requests, logs over
// the fixture logs and one line per log template, plan over several architectures, the
// launch parser, and probe's server findings. A key whose mutation changes nothing is
// data no code reads (or a rule no scenario can reach): the test names it.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <set>

#include "../plan/plan_models.h"
#include "audit/audit.h"
#include "common/fixtures.h"
#include "common/registry.h"
#include "decide/decide.h"
#include "engines/engines.h"
#include "logs/logs.h"
#include "plan/plan.h"
#include "probe/probe.h"
#include "util/json.h"
#include "util/util.h"

namespace kvaudit {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// ---------------------------------------------------------------- the data as documents

struct Docs {
  json dtypes;
  std::map<std::string, json> engine, capacity;
};

fs::path source_engines() {
  return fs::path(KVAUDIT_TEST_DIR) / ".." / "data" / "engines";
}

Docs read_docs() {
  Docs docs;
  docs.dtypes = read_json_file(source_engines() / "dtypes.json");
  for (const auto& e : kvaudit::testing::registry().names()) {
    docs.engine[e] = read_json_file(source_engines() / (e + ".json"));
    docs.capacity[e] = read_json_file(source_engines() / "capacity" / (e + ".json"));
  }
  return docs;
}

void write_docs(const Docs& docs, const fs::path& dir) {
  fs::create_directories(dir / "engines" / "capacity");
  std::ofstream(dir / "engines" / "dtypes.json") << docs.dtypes.dump();
  for (const auto& [e, doc] : docs.engine)
    std::ofstream(dir / "engines" / (e + ".json")) << doc.dump();
  for (const auto& [e, doc] : docs.capacity)
    std::ofstream(dir / "engines" / "capacity" / (e + ".json")) << doc.dump();
}

// ---------------------------------------------------------------- scenarios

// Every finding id the battery produced, when a test collects them (see below).
std::set<std::string>* g_finding_ids = nullptr;

std::string text_of(const report::Finding& f) {
  if (g_finding_ids) g_finding_ids->insert(f.id);
  std::string out = fmt::format("{}|{}|{}|{}|{}|{}", f.id, report::severity_name(f.severity),
                                f.title, f.consequence, f.fix, f.reference);
  for (const auto& e : f.evidence) out += fmt::format("|{}:{}={}", e.file, e.key, e.value);
  return out;
}

std::string provenance_text(const engines::Provenance& p) {
  return fmt::format("{}/{}/{}/{}", p.reference, engines::rule_status_name(p.status), p.verified,
                     p.bound);
}

std::string fingerprint(const audit::CheckResult& r) {
  const auto& k = r.resolved;
  std::string out =
      fmt::format("{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}", k.requested, k.requested_known,
                  k.kv_cache_dtype, k.rule_id, k.reason, provenance_text(k.rule_provenance),
                  k.model_dtype, engines::scale_source_name(k.scale_source),
                  fmt::join(k.loaded_scale_names, ","), fmt::join(k.skipped_layers, ","),
                  k.scale_warning_text.value_or("-"), k.scale_warning_id + k.scale_warning_meaning);
  for (const auto& d : k.dropped)
    out += fmt::format("|drop {} {} {} {}", d.rule_id, d.reason, provenance_text(d.provenance),
                       d.tensor_names.size());
  for (const auto& f : k.startup_failures)
    out +=
        fmt::format("|fail {} {} {} {}", f.id, f.message, f.cause, provenance_text(f.provenance));
  // fmt, not `"\n" + std::string`: GCC 12 reports a false -Wrestrict on that concatenation.
  for (const auto& f : r.findings) out += fmt::format("\n{}", text_of(f));
  return out;
}

// A model derived from a rule's `when`, so rules no fixture triggers are reached too.
std::optional<checkpoint::ModelFacts> model_for(const json& when,
                                                const checkpoint::ModelFacts& base,
                                                const checkpoint::ModelFacts& hybrid) {
  if (!when.is_object() || when.empty()) return std::nullopt;
  checkpoint::ModelFacts model = when.value("hybrid", false) ? hybrid : base;
  if (!model.quant) model.quant = checkpoint::QuantFacts{};
  // Only what the rule asks for: the base's own KV declaration would decide first.
  model.quant->kv_cache_quant_algo.clear();
  model.quant->kv_scheme_dynamic.reset();
  model.quant->has_kv_cache_scheme = false;
  model.quant->kv_scheme_bits = 0;
  model.quant->kv_scheme_type.clear();
  auto first = [&](const char* key) -> std::string {
    if (!when.contains(key) || !when[key].is_array() || when[key].empty()) return "";
    std::string v = when[key][0].get<std::string>();
    for (char& c : v)
      if (c == '*') c = 'X';
    return v;
  };
  if (auto a = first("architectures"); !a.empty()) model.architecture = a;
  if (auto m = first("quant_methods"); !m.empty()) model.quant->method = m == "none" ? "" : m;
  if (auto k = first("kv_cache_quant_algos"); !k.empty())
    model.quant->kv_cache_quant_algo = k == "X" ? "FP6" : k;
  if (when.contains("kv_cache_scheme")) model.quant->has_kv_cache_scheme = when["kv_cache_scheme"];
  if (when.contains("scheme_bits")) model.quant->kv_scheme_bits = when["scheme_bits"];
  if (when.contains("scheme_dynamic")) model.quant->kv_scheme_dynamic = when["scheme_dynamic"];
  if (when.contains("scheme_type")) model.quant->kv_scheme_type = when["scheme_type"];
  if (auto s = first("scheme_strategies"); !s.empty()) model.quant->kv_scheme_strategy = s;
  if (auto w = first("weight_algos"); !w.empty()) model.quant->weight_algo = w;
  return model;
}

struct Battery {
  std::vector<checkpoint::ModelFacts> models;
  // Models the where-it-runs variants (GPU, backend, draft) are tried on: a few fixtures and
  // those built from the known-bad combinations' model families.
  std::set<size_t> where_models;
  std::map<std::string, std::vector<std::string>> versions;  // engine -> representatives
  std::map<std::string, std::map<std::string, std::vector<std::string>>> requests;  // per version
  std::vector<std::string> log_texts;  // one log per template line, plus fixture logs
  std::vector<checkpoint::ModelFacts> plan_models;
  std::vector<std::pair<std::string, checkpoint::ModelFacts>> from_logs;  // log text, its model
  std::map<std::string, std::vector<std::string>> launches;               // engine -> command lines
  // Launches that meet each tier hazard (built from the data as read, then checked under
  // each mutation): engine, release, model, flags.
  struct TierLaunch {
    std::string engine, version;
    size_t model = 0;
    engines::LaunchFlags flags;
  };
  std::vector<TierLaunch> tier_launches;
};

// One representative release per distinct set of matching rules.
std::vector<std::string> representatives(const engines::EngineModel& engine) {
  std::map<std::string, std::string> by_signature;
  for (const auto& v : engines::boundary_versions(engine)) {
    std::string signature;
    auto add = [&](const auto& rules) {
      for (const auto& r : rules) signature.push_back(r.versions.contains(v) ? '1' : '0');
    };
    add(engine.dtype_choices), add(engine.auto_rules), add(engine.kv_method_rules);
    add(engine.scale_name_rules), add(engine.scale_drop_rules), add(engine.fallback_rules);
    add(engine.scale_warnings), add(engine.param_path_rules), add(engine.checkpoint_aborts);
    add(engine.dtype_hazards), add(engine.defaults), add(engine.log_templates);
    add(engine.known_bad), add(engine.default_backends), add(engine.platform_substitutions);
    add(engine.tier_hazards);
    add(engine.state_dtypes), add(engine.draft_kv);
    for (const auto& r : engine.flag_rules)
      signature += fmt::format("{}{}{}", r.exists.contains(v), r.deprecated.contains(v),
                               r.disabled_for_hybrid.contains(v));
    by_signature.emplace(signature, engines::version_text(v));
  }
  std::vector<std::string> out;
  for (const auto& [signature, version] : by_signature)
    out.push_back(version == "latest" ? "" : version);
  return out;
}

// A sample value for a log template's placeholder, by the field it fills.
// A value for an args-line field, as the engines print it.
std::string arg_sample(const std::string& field, bool python_literal) {
  if (field == "tp" || field == "pp" || field == "dp") return "2";
  if (field == "dp_attention") return python_literal ? "True" : "true";
  if (field == "memory_fraction" || field == "mamba_full_memory_ratio") return "0.8";
  if (field == "page_size") return "16";
  if (field == "max_total_tokens" || field == "context_length") return "4096";
  if (field == "kv_cache_dtype") return "'fp8_e4m3'";
  if (field == "dtype") return "'bfloat16'";
  if (field == "mamba_ssm_dtype") return "'float32'";
  if (field == "quantization") return "'fp8'";
  return "'/m'";
}

bool is_args_field(const std::string& field) {
  return field == "server_args_repr" || field == "non_default_args_repr" ||
         field == "engine_config";
}

// Args lines carry every argument name the engine data lists, or only `only_key` (a field
// with several names needs each alone: a misspelt one is then missed).
std::string sample_for(const std::string& field, const engines::EngineModel& engine,
                       const std::string& only_key = "") {
  if (is_args_field(field)) {
    std::vector<std::string> parts;
    for (const auto& [f, keys] : engine.log_args.keys)
      for (const auto& key : keys)
        if (only_key.empty() || key == only_key)
          parts.push_back(field == "non_default_args_repr"
                              ? fmt::format("'{}': {}", key, arg_sample(f, true))
                              : fmt::format("{}={}", key, arg_sample(f, true)));
    const std::string joined = fmt::format("{}", fmt::join(parts, ", "));
    if (field == "server_args_repr") return "ServerArgs(" + joined + ")";
    if (field == "non_default_args_repr") return "{" + joined + "}";
    return joined;
  }
  if (field == "engine_version") return "0.20.1";
  if (field == "kv_dtype") return "fp8_e4m3";
  if (field == "model_dtype") return "torch.bfloat16";
  if (field == "load_details") return "dtype=torch.bfloat16, ";
  for (const char* gib : {"avail_mem_gib", "mem_usage_gib", "k_gib", "v_gib", "kv_gib", "conv_gib",
                          "ssm_gib", "available_kv_gib", "weights_gib"})
    if (field == gib) return "12.34";
  if (field == "concurrency_x") return "4.25";
  for (const char* count : {"pool_tokens", "mamba_slots", "full_tokens", "swa_tokens",
                            "max_total_num_tokens", "max_running_requests", "context_len",
                            "kv_cache_tokens", "concurrency_context", "gpu_blocks", "cpu_blocks"})
    if (field == count) return "123,456";
  return "x";
}

// The template with each placeholder replaced (printf or Python style, as the loader reads).
std::string sample_line(const engines::LogTemplate& log, const engines::EngineModel& engine,
                        const std::string& only_key = "") {
  std::string out;
  size_t field = 0;
  const std::string& t = log.text;
  const bool python = t.find('{') != std::string::npos;
  for (size_t i = 0; i < t.size(); ++i) {
    if (python && t[i] == '{' && i + 1 < t.size() && t[i + 1] != '{') {
      i = t.find('}', i);
      out += sample_for(field < log.fields.size() ? log.fields[field] : "", engine, only_key);
      ++field;
    } else if (!python && t[i] == '%' && i + 1 < t.size() && t[i + 1] != '%') {
      size_t j = i + 1;
      while (j < t.size() &&
             std::string_view("0123456789.-+ #").find(t[j]) != std::string_view::npos)
        ++j;
      i = j;
      out += sample_for(field < log.fields.size() ? log.fields[field] : "", engine, only_key);
      ++field;
    } else if ((t[i] == '%' || t[i] == '{' || t[i] == '}') && i + 1 < t.size() &&
               t[i + 1] == t[i]) {
      out += t[i++];
    } else {
      out += t[i];
    }
  }
  return out;
}

Battery build_battery() {
  Battery b;
  using testing::fixture_checkpoint;
  for (const char* name :
       {"llama-bf16-plain", "llama-modelopt-bf16-scales", "llama-modelopt-kv-no-scales",
        "llama-modelopt-unit-scales", "llama-modelopt-k-only", "llama-modelopt-v-only",
        "llama-modelopt-zero-kv", "llama-modelopt-nan-scales", "llama-ct-fp8-kv",
        "llama-ct-fp8-per-head", "llama-ct-fused-qkv-scales", "qwen3-moe-modelopt-fp8",
        "qwen3-next-80b", "qwen35-modelopt-fp8-kv-scales", "qwen35-modelopt-nvfp4-kv",
        "deepseek-v3-mla", "gpt-oss-20b", "gemma3-4b"})
    b.models.push_back(checkpoint::read_checkpoint(fixture_checkpoint(name)));
  const fs::path configs = fs::path(KVAUDIT_TEST_DIR) / "fixtures" / "configs";
  for (const char* name : {"nvidia-qwen3.6-35b-a3b-nvfp4", "kimi-k2.5", "deepseek-v3.2"})
    b.models.push_back(checkpoint::read_checkpoint(configs / name));
  b.models.emplace_back();  // a live server without a checkpoint
  // Models that meet each rule's `when` (Mixtral, Gemma 3 ModelOpt, ...).
  const checkpoint::ModelFacts base = b.models[1], hybrid = b.models[12];
  const Docs docs = read_docs();
  auto dedupe_key = [](const checkpoint::ModelFacts& m) {
    std::string key =
        m.config_file + "|" + m.architecture + "|" + std::to_string(m.kv_scales.size());
    if (m.quant)
      key += fmt::format("|{}|{}|{}|{}|{}|{}|{}|{}", m.quant->method, m.quant->kv_cache_quant_algo,
                         m.quant->has_kv_cache_scheme, m.quant->kv_scheme_bits,
                         m.quant->kv_scheme_type, m.quant->kv_scheme_strategy, m.quant->weight_algo,
                         !m.quant->kv_scheme_dynamic   ? '-'
                         : *m.quant->kv_scheme_dynamic ? '1'
                                                       : '0');
    for (const auto& s : m.kv_scales) key += fmt::format("|{}{}", s.convention, s.values.size());
    return key;
  };
  std::set<std::string> where_keys;
  for (size_t i : {0, 1, 14}) where_keys.insert(dedupe_key(b.models[i]));
  for (const auto& [engine, doc] : docs.engine)
    for (const auto& [key, value] : doc.items())
      if (value.is_array())
        for (const auto& entry : value)
          if (entry.is_object())
            if (auto m = model_for(entry.value("when", json::object()), base, hybrid)) {
              const bool where = key == "known_bad";
              b.models.push_back(*m);
              if (where) where_keys.insert(dedupe_key(*m));
              m->kv_scales.clear();  // and the same checkpoint without scale tensors
              b.models.push_back(*m);
              if (where) where_keys.insert(dedupe_key(*m));
            }
  // The param-path rule's loaders: one model per listed architecture.
  for (const auto& entry : docs.engine.at("sglang")["quantization_param_path"])
    for (const auto& a : entry.value("architectures_with_loader", json::array())) {
      checkpoint::ModelFacts m = base;
      m.architecture = a.get<std::string>();
      for (char& c : m.architecture)
        if (c == '*') c = 'X';
      b.models.push_back(m);
    }
  // The base's scales under every naming convention the reader knows, as vectors, and
  // behind no KV-capable quantization config.
  for (const auto& convention : checkpoint::scale_conventions()) {
    checkpoint::ModelFacts m = base;
    for (auto& scale : m.kv_scales) scale.convention = std::string(convention.id);
    b.models.push_back(m);
  }
  checkpoint::ModelFacts vectors = base;
  for (auto& scale : vectors.kv_scales) scale.values.assign(8, 0.05f);
  b.models.push_back(vectors);
  checkpoint::ModelFacts unquantized = base;
  unquantized.quant.reset();
  b.models.push_back(unquantized);
  checkpoint::ModelFacts gptq = base;
  gptq.quant->method = "gptq";
  b.models.push_back(gptq);
  // A compressed-tensors checkpoint with a lone v_scale: the methods' fallbacks differ there.
  checkpoint::ModelFacts ct_v_only = b.models[8];
  std::erase_if(ct_v_only.kv_scales, [](const checkpoint::ScaleTensor& t) {
    return t.role == checkpoint::ScaleRole::k;
  });
  b.models.push_back(ct_v_only);
  // Models that differ in nothing a rule reads are one model.
  std::set<std::string> seen;
  std::erase_if(b.models, [&](const checkpoint::ModelFacts& m) {
    return !seen.insert(dedupe_key(m)).second;
  });
  for (size_t i = 0; i < b.models.size(); ++i)
    if (where_keys.count(dedupe_key(b.models[i]))) b.where_models.insert(i);
  for (const auto& e : kvaudit::testing::registry().names()) {
    const auto& engine = kvaudit::testing::engine(e);
    b.versions[e] = representatives(engine);
    for (const auto& v : b.versions[e]) {
      auto version = *engines::parse_version(v);
      std::vector<std::string> requests = {"auto", "int3"};
      if (const auto* choices = engine.choices_for(version)) {
        std::set<std::string> dtypes;
        for (const auto& c : choices->accepted)
          if (dtypes.insert(c.dtype).second && c.value != "auto") requests.push_back(c.value);
        for (const auto& [value, abort] : choices->aborts) requests.push_back(value);
      }
      b.requests[e][v] = requests;
    }
    for (const auto& log : engine.log_templates) {
      b.log_texts.push_back(sample_line(log, engine) + "\n");
      if (std::any_of(log.fields.begin(), log.fields.end(), is_args_field))
        for (const auto& [field, keys] : engine.log_args.keys)
          for (const auto& key : keys)
            if (keys.size() > 1) b.log_texts.push_back(sample_line(log, engine, key) + "\n");
    }
    // Launch commands: every entry point with every flag, then each other spelling alone.
    for (const auto& entry : engine.launch.entry_points) {
      std::string prefix = (entry.rfind("-m ", 0) == 0 ? "python3 " : "") + entry + " /models/m";
      std::string all = prefix;
      for (const auto& [field, spellings] : engine.launch.flags) {
        const bool boolean =
            std::find(engine.launch.boolean_flags.begin(), engine.launch.boolean_flags.end(),
                      spellings[0]) != engine.launch.boolean_flags.end();
        std::string value = field == "kv_cache_dtype"               ? "fp8_e5m2"
                            : field == "context_length"             ? "32k"
                            : field == "memory_fraction"            ? "0.8"
                            : field == "kv_cache_dtype_skip_layers" ? "sliding_window"
                                                                    : "2";
        for (size_t i = 0; i < spellings.size(); ++i) {
          std::string arg = boolean ? " " + spellings[i] : " " + spellings[i] + " " + value;
          if (i == 0) all += arg;
          // A word after a boolean flag is an argument of its own, not the flag's value.
          b.launches[e].push_back(prefix + arg + (boolean ? " trailing" : ""));
        }
      }
      b.launches[e].push_back(all);
      // Each flag with underscores for dashes (vLLM's parser reads both).
      for (const auto& [field, spellings] : engine.launch.flags) {
        std::string underscored = spellings[0];
        if (underscored.rfind("--", 0) != 0 || underscored.find('-', 2) == std::string::npos)
          continue;
        std::replace(underscored.begin() + 2, underscored.end(), '-', '_');
        b.launches[e].push_back(prefix + " " + underscored + " 2");
      }
      // Flags that take no value: the word after one is an argument of its own.
      for (const auto& flag : engine.launch.boolean_flags)
        b.launches[e].push_back(prefix + " " + flag + " trailing");
      // Tier flags (booleans among them), and a --kv-transfer-config JSON with a connector, an
      // offloading spec and a secondary tier.
      for (const auto& [setting, spellings] : engine.tier_flags)
        for (const auto& spelling : spellings)
          b.launches[e].push_back(prefix + " " + spelling +
                                  (engine.tier_boolean_flags.count(spelling)
                                       ? " trailing"
                                       : " '{\"kv_connector\":"
                                         "\"C\",\"kv_connector_extra_config\":"
                                         "{\"spec_name\":\"S\","
                                         "\"secondary_tiers\":[{\"type\":"
                                         "\"fs\"}]}}'"));
      // A config file that sets every field its keys name, and a key the engine refuses;
      // beside a flag for the same field (which one wins is data).
      if (!engine.launch.config_file_flags.empty()) {
        const fs::path yaml = fs::temp_directory_path() / ("kvaudit-coverage-" + e + ".yaml");
        std::ofstream out(yaml);
        for (const auto& [field, keys] : engine.launch.config_keys) {
          const std::vector<std::string> parts = split_list(keys.front(), '.');
          const std::string value = field == "kv_cache_dtype"      ? "nvfp4"
                                    : field == "memory_fraction"   ? "0.7"
                                    : field == "attention_backend" ? "FLASHINFER"
                                                                   : "3";
          for (size_t i = 0; i < parts.size(); ++i)
            out << std::string(2 * i, ' ') << parts[i] << ":"
                << (i + 1 == parts.size() ? " " + value : "") << "\n";
        }
        for (const auto& [key, error] : engine.launch.config_rejected_keys) out << key << ": x\n";

        // Engines whose config keys are flag names (vLLM, SGLang --config).
        if (engine.launch.config_keys_are_flags)
          for (const char* field : {"kv_cache_dtype", "memory_fraction"})
            if (auto spelled = engine.launch.flags.find(field);
                spelled != engine.launch.flags.end())
              out << spelled->second.front().substr(2) << ": "
                  << (std::string(field) == "kv_cache_dtype" ? "nvfp4" : "0.7") << "\n";
        out.close();
        for (const auto& flag : engine.launch.config_file_flags)
          b.launches[e].push_back(all + " " + flag + " " + yaml.string());
        // A file with only the tier settings the data reads by key (a host tier).
        if (!engine.tier_config_keys.empty()) {
          const fs::path tiers =
              fs::temp_directory_path() / ("kvaudit-coverage-" + e + "-tiers.yaml");
          std::map<std::string, std::vector<std::string>> by_parent;  // YAML keys stay unique
          for (const auto& [setting, keys] : engine.tier_config_keys) {
            const std::vector<std::string> parts = split_list(keys.front(), '.');
            by_parent[parts.size() == 2 ? parts[0] : ""].push_back(parts.back());
          }
          std::ofstream tier_out(tiers);
          for (const auto& [parent, leaves] : by_parent)
            for (size_t i = 0; i < leaves.size(); ++i)
              tier_out << (parent.empty() ? "" : (i == 0 ? parent + ":\n" : "") + "  ") << leaves[i]
                       << ": 7\n";
          tier_out.close();
          b.launches[e].push_back(prefix + " " + engine.launch.config_file_flags.front() + " " +
                                  tiers.string());
        }
      }
      // Fields the engine reads from its environment (a NAME=VALUE word before the program).
      for (const auto& [field, names] : engine.launch.environment)
        for (const auto& name : names) b.launches[e].push_back(name + "=FLASHINFER " + prefix);
    }
  }
  // Tier hazards: a launch that meets each one, on a model with recurrent layers and on one
  // without, at every representative release.
  size_t hybrid_model = 0, dense_model = 0;
  for (size_t m = 0; m < b.models.size(); ++m)
    (b.models[m].linear_attention ? hybrid_model : dense_model) = m;
  for (const auto& e : kvaudit::testing::registry().names()) {
    const engines::EngineModel& engine = kvaudit::testing::registry().engine(e);
    for (const engines::TierHazard& hazard : engine.tier_hazards)
      for (const auto& v : b.versions.at(e)) {
        engines::LaunchFlags flags;
        flags.engine = e;
        flags.engine_version = v;
        for (const auto& [setting, globs] : hazard.settings) {
          // A setting the engine's default meets is left out, so the default is what matches.
          if (auto fallback = engine.tier_defaults.find(setting);
              fallback != engine.tier_defaults.end() && glob_match(globs.front(), fallback->second))
            continue;
          const std::string value = globs.front() == "*" ? "EAGLE" : globs.front();
          if (setting == "speculative_algorithm")
            flags.speculative_algorithm = value;
          else if (setting == "kv_cache_dtype_requested")
            flags.kv_cache_dtype = value;
          else
            flags.tier_settings[setting] = value;
        }
        const auto version = engines::parse_version(v);
        if (!hazard.kv_dtypes.empty() && version) {
          flags.kv_cache_dtype = engines::cli_spelling(engine, *version, hazard.kv_dtypes.front());
          flags.kv_cache_dtype_flag = "--kv-cache-dtype";
        }
        for (size_t m : {hybrid_model, dense_model}) b.tier_launches.push_back({e, v, m, flags});
      }
  }
  for (const auto& entry : fs::directory_iterator(fs::path(KVAUDIT_TEST_DIR) / "fixtures" / "logs"))
    if (entry.path().extension() == ".log") b.log_texts.push_back(read_text_file(entry.path()));
  b.log_texts.push_back(read_text_file(fs::path(KVAUDIT_TEST_DIR) / "fixtures" / "logs" / "real" /
                                       "trtllm" / "gpt-oss-120b-tp1-dgxspark-1.1.0rc3.log"));
  const fs::path logs_dir = fs::path(KVAUDIT_TEST_DIR) / "fixtures" / "logs";
  b.from_logs = {{read_text_file(logs_dir / "journal_qwen35_fp8_then_bf16.log"),
                  plan::test_models::qwen35_397b()},
                 {read_text_file(logs_dir / "sglang_qwen35_397b_tp2_mamba.log"),
                  plan::test_models::qwen35_397b()},
                 {read_text_file(logs_dir / "sglang_llama8b_single_gpu.log"),
                  plan::test_models::llama31_8b()}};
  b.plan_models = {b.models[0],
                   b.models[13],
                   b.models[15],
                   b.models[16],
                   b.models[17],
                   checkpoint::read_checkpoint(configs / "qwen3.5-397b-a17b"),
                   checkpoint::read_checkpoint(configs / "deepseek-v3.2")};
  return b;
}

// The battery as probes: each runs one input through one command and returns what it
// printed. Probes reference the battery (which outlives them) and look the engine model up
// when run, so each sees the data set in force.
using Probe = std::function<std::string(const engines::Registry&)>;

// Each probe with the engine whose data it reads ("" for every engine's: log and launch
// readers try all of them), so a mutation of one engine's file runs only what can see it.
struct TaggedProbes {
  std::vector<Probe> probes;
  std::vector<std::string> engine;
  std::vector<std::string> kind;  // the command section each probe belongs to
  std::string current = "check";
  void section(std::string name) { current = std::move(name); }
  void push_back(Probe probe, std::string of = "") {
    probes.push_back(std::move(probe));
    engine.push_back(std::move(of));
    kind.push_back(current);
  }
};

// The probe sections that see a key first (a log template is seen by the log probes, a
// launch spelling by the launch probes): scanned before the rest, so a key only a late
// section sees does not cost the ~100k check probes in front of it.
std::vector<std::string> likely_sections(const std::string& label) {
  auto has = [&](const char* part) { return label.find(part) != std::string::npos; };
  if (has("log_messages") || has("log_args")) return {"logs", "from_log"};
  if (has(" launch.")) return {"launch", "address"};
  if (has("server_info")) return {"probe"};
  if (label.rfind("capacity/", 0) == 0 || has(" defaults")) return {"plan", "from_log"};
  return {};
}

TaggedProbes battery_probes(const Battery& b) {
  TaggedProbes out;
  auto guarded = [](auto body) {
    return [body](const engines::Registry& registry) -> std::string {
      try {
        return body(registry);
      } catch (const InputError& error) {
        return std::string("error ") + error.what();
      }
    };
  };
  // check
  for (const auto& e : kvaudit::testing::registry().names())
    for (const auto& v : b.versions.at(e))
      for (const auto& request : b.requests.at(e).at(v))
        for (size_t m = 0; m < b.models.size(); ++m)
          for (int variant = 0; variant < 12; ++variant) {
            // Launch variants for auto and FP8 requests; where it runs (GPU, backend, draft)
            // for the dtypes the platform and known-bad rules name.
            if (variant > 0 && variant < 6 && request != "auto" && request.rfind("fp8", 0) != 0)
              continue;
            if (variant >= 6) {
              if (!b.where_models.count(m)) continue;
              const std::string canonical =
                  kvaudit::testing::registry().dtypes().normalise(request);
              if (canonical != "auto" && canonical != "fp8_e4m3" && canonical != "fp8_e5m2" &&
                  canonical != "nvfp4" && canonical != "bf16")
                continue;
            }
            out.push_back(
                guarded([&b, e, v, request, m, variant](const engines::Registry& registry) {
                  audit::CheckInput input;
                  input.model = b.models[m];
                  input.flags.engine = e;
                  input.flags.engine_version = v;
                  input.flags.kv_cache_dtype = request;
                  input.flags.kv_cache_dtype_flag = request == "auto" ? "" : "--kv-cache-dtype";
                  if (variant == 1) input.flags.quantization_param_path = "/s.json";
                  if (variant == 2) input.flags.calculate_kv_scales = true;
                  if (variant == 3) input.flags.kv_cache_dtype_skip_layers = "sliding_window";
                  if (variant == 4)
                    input.flags.mamba_ssm_dtype = "float32", input.flags.dtype = "float16";
                  if (variant == 5) input.flags.mamba_ssm_dtype = "float16";
                  // Where it runs: GPU architecture and platform, attention backend, a draft.
                  const char* archs[] = {"sm100", "gfx942", "sm120", "sm90", "sm80", "sm103"};
                  if (variant >= 6) {
                    input.flags.gpu_arch = archs[variant - 6];
                    input.flags.platform = variant == 7 ? "rocm" : "cuda";
                  }
                  if (variant == 10) input.flags.attention_backend = "trtllm_mha";
                  if (variant == 11) input.flags.attention_backend = "trtllm_mla";
                  if (variant >= 10) input.flags.speculative_algorithm = "EAGLE";
                  if (variant == 11) input.flags.speculative_draft_kv_cache_dtype = "bf16";
                  input.engine = &registry.engine(e);
                  input.version_given = !v.empty();
                  audit::CheckResult result = audit::run_check(input);
                  return fmt::format("{}\n{}", fingerprint(result),
                                     audit::to_report(input, result).payload["resolved_kv"].dump());
                }),
                e);
          }
  // check on the launches that meet the tier hazards
  out.section("tiers");
  for (const auto& launch : b.tier_launches)
    out.push_back(guarded([&b, &launch](const engines::Registry& registry) {
      audit::CheckInput input;
      input.model = b.models[launch.model];
      input.flags = launch.flags;
      input.engine = &registry.engine(launch.engine);
      input.version_given = !launch.version.empty();
      return fingerprint(audit::run_check(input));
    }));
  // logs
  out.section("logs");
  for (const auto& text : b.log_texts)
    out.push_back(guarded([&text](const engines::Registry& registry) {
      logs::LogScan scan = logs::scan_log_text(registry, text, "log");
      std::string printed = logs::to_report(scan, true, {}).payload.dump();
      for (const auto& launch : scan.launches)
        for (const auto& f : launch.findings) printed += fmt::format("\n{}", text_of(f));
      return printed;
    }));
  // plan (an H100's driver-reported memory, so fractions do not come out round)
  out.section("plan");
  for (const auto& e : kvaudit::testing::registry().names())
    for (const auto& v : b.versions.at(e))
      for (const auto& model : b.plan_models)
        for (int layout = 0; layout < 3; ++layout)
          out.push_back(guarded([e, v, &model, layout](const engines::Registry& registry) {
                          plan::PlanOptions options;
                          options.engine = e;
                          options.engine_version = v;
                          options.parallel.tp = layout == 0 ? 1 : 4;
                          options.parallel.dp = layout == 2 ? 2 : 1;
                          options.parallel.dp_attention = layout == 2;
                          options.gpu_memory_bytes = int64_t{81559} << 20;
                          options.weight_bytes_per_gpu = int64_t{20} << 30;
                          // A host tier at the engine's default ratio (SGLang HiCache).
                          if (layout == 1) options.tier_settings["hierarchical_cache"] = "true";
                          plan::CapacityPlan capacity =
                              plan::plan_capacity(registry, model, options);
                          return plan::to_report(model, capacity, nullptr, true).payload.dump();
                        }),
                        e);
  // plan's requests at once on the hybrids, per mamba radix-cache strategy and the
  // conditions that change its state slots per request (a strategy a release lacks: refused)
  out.section("plan_state_slots");
  // (hybrids only: no other model has a state pool)
  std::vector<const checkpoint::ModelFacts*> hybrids;
  for (const auto& model : b.plan_models)
    if (std::any_of(model.layers.begin(), model.layers.end(), [](const auto& layer) {
          return layer.kind == checkpoint::LayerKind::linear_attention;
        }))
      hybrids.push_back(&model);
  // One release per state-slot rule (the rest of the battery's releases do not separate them).
  std::vector<std::string> slot_versions;
  {
    const engines::EngineModel& sglang = kvaudit::testing::registry().engine("sglang");
    const auto boundaries = engines::boundary_versions(sglang);
    for (const auto& rules : sglang.mamba_slots)
      for (const auto& version : boundaries)
        if (rules.versions.contains(version)) {
          const std::string text = engines::version_text(version);
          slot_versions.push_back(text == "latest" ? "" : text);
          break;
        }
  }
  for (const auto& v : slot_versions)
    for (const checkpoint::ModelFacts* hybrid : hybrids)
      for (int variant = 0; variant < 6; ++variant)
        out.push_back(
            guarded([v, &model = *hybrid, variant](const engines::Registry& registry) {
              plan::PlanOptions options;
              options.engine_version = v;
              options.gpu_memory_bytes = int64_t{81559} << 20;
              options.weight_bytes_per_gpu = int64_t{20} << 30;
              options.contexts = {1024};
              static const char* strategies[] = {"",
                                                 "extra_buffer",
                                                 "extra_buffer",
                                                 "extra_buffer_lazy",
                                                 "extra_buffer",
                                                 "extra_buffer"};
              options.mamba_radix_cache_strategy = strategies[variant];
              options.disable_overlap_schedule = variant == 2;
              if (variant == 4) options.speculative_draft_layers = 1;
              options.mamba_skip_decode_lock = variant == 3 || variant == 5;
              try {
                plan::CapacityPlan capacity = plan::plan_capacity(registry, model, options);
                std::string printed;
                for (const auto& row : capacity.rows)
                  for (const auto& point : row.concurrency)
                    printed += fmt::format("{} {} {};", row.kv_cache_dtype, point.requests,
                                           point.limited_by);
                return printed + fmt::format("{}", fmt::join(capacity.rows.empty()
                                                                 ? std::vector<std::string>{}
                                                                 : capacity.rows[0].derivation,
                                                             "\n"));
              } catch (const InputError& error) {
                return fmt::format("refused {}", error.what());
              }
            }),
            "sglang");
  // plan --from-log on the real logs whose model is known
  out.section("from_log");
  for (const auto& from_log : b.from_logs)  // named: clang 14 cannot capture bindings
    out.push_back(guarded([&file = from_log.first,
                           &model = from_log.second](const engines::Registry& registry) {
      std::string printed;
      logs::LogScan scan = logs::scan_log_text(registry, file, "log");
      for (const auto& launch : scan.launches) {
        plan::PlanOptions options;
        options.memory_fraction = 0.851;  // the L40S default of sglang_llama8b_single_gpu.log
        try {
          plan::LogPrediction p = plan::predict_from_log(registry, model, launch.memory, options);
          for (const auto& c : p.checks)
            printed += fmt::format("\n{} {} {} {} {}", c.id, c.printed, c.predicted.lo,
                                   c.predicted.hi, c.derivation);
          for (const auto& n : p.notes) printed += fmt::format("\n{}", n);
        } catch (const InputError& error) {
          printed += fmt::format("\nerror {}", error.what());
        }
      }
      return printed;
    }));
  // launch commands
  out.section("launch");
  for (const auto& [e, commands] : b.launches)
    for (const auto& command : commands)
      out.push_back(guarded([&command, &b](const engines::Registry& registry) {
        engines::LaunchFlags f = engines::parse_launch_command(registry, command, "--launch");
        std::string refused;  // what check says of a config file the engine refuses
        if (!f.config_errors.empty()) {
          audit::CheckInput input;
          input.model = b.models[0];
          input.flags = f;
          input.engine = &registry.engine(f.engine);
          refused = fingerprint(audit::run_check(input));
        }
        return refused +
               fmt::format(
                   "{} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {}",
                   fmt::join(f.config_errors, ";"), fmt::join(f.fields_from_config, ","), f.host,
                   f.port.value_or(-1), f.engine, f.kv_cache_dtype, f.model_path, f.tp, f.pp, f.dp,
                   f.dcp, f.dp_attention, f.quantization_param_path, f.quantization, f.dtype,
                   f.context_length.value_or(-1), f.memory_fraction.value_or(-1), f.mamba_ssm_dtype,
                   f.calculate_kv_scales, f.kv_cache_dtype_skip_layers, f.attention_backend,
                   f.speculative_draft_kv_cache_dtype, fmt::join(f.ignored_arguments, ",")) +
               fmt::format(" {}", fmt::join(f.tier_settings, ","));
      }));
  // launch files: a compose service that runs an image with only its arguments
  out.section("launch files");
  for (const auto& [e, commands] : b.launches)
    for (const auto& image : kvaudit::testing::registry().engine(e).launch.image_entry_points)
      out.push_back(guarded([image](const engines::Registry& registry) {
        const fs::path file = fs::temp_directory_path() / "kvaudit-coverage-compose.yaml";
        std::ofstream(file) << "services:\n  engine:\n    image: registry.example.com/"
                            << image.image << ":v1\n    command: --model /models/m --port 7\n";
        const auto launches = engines::read_launch_file(registry, file);
        return fmt::format("{} {} {}", launches.front().engine, launches.front().model_path,
                           launches.front().port.value_or(-1));
      }));
  // where check's verification commands reach the restarted server
  out.section("address");
  for (const auto& [e, commands] : b.launches)
    for (const auto& command : commands)
      out.push_back(guarded([&command](const engines::Registry& registry) {
        engines::LaunchFlags f = engines::parse_launch_command(registry, command, "--launch");
        const decide::ServerAddress address = decide::server_address(f, registry.engine(f.engine));
        return address.url + " " + address.port_source;
      }));
  out.section("probe");
  // probe: which server answers are whose (the adapters read the engine data's endpoints,
  // owned_by, version and stats endpoints)
  struct Answers : probe::ServerAnswers {
    std::map<std::string, std::string> bodies;
    std::string where(const std::string& path) const override { return "http://s" + path; }
    std::optional<std::string> get(const std::string& path) override {
      auto it = bodies.find(path);
      return it == bodies.end() ? std::nullopt : std::optional<std::string>(it->second);
    }
  };
  const std::vector<std::map<std::string, std::string>> servers = {
      {{"/v1/models", R"({"data":[{"id":"m","owned_by":"tensorrt_llm"}]})"},
       {"/version", R"({"version":"1.2.0"})"},
       {"/metrics", R"([{"kvCacheStats":{"maxNumBlocks":10,"tokensPerBlock":32}}])"}},
      {{"/v1/models", R"({"data":[{"id":"m","owned_by":"tensorrt_llm"}]})"}, {"/metrics", "[]"}},
      {{"/metrics", "vllm:cache_config_info{cache_dtype=\"fp8\",block_size=\"16\"} 1\n"},
       {"/version", R"({"version":"0.9.0"})"}},
      {{"/server_info", R"({"model_path":"/m","kv_cache_dtype":"auto","version":"0.5.9"})"},
       {"/get_server_info", R"({"model_path":"/old","kv_cache_dtype":"fp8_e4m3"})"}}};
  for (const auto& bodies : servers)
    out.push_back([bodies](const engines::Registry& registry) {
      Answers answers;
      answers.bodies = bodies;
      probe::ServerFacts facts;
      facts.url = "http://s";
      probe::identify_server(registry, answers, facts);
      std::string printed = fmt::format("{} {} {} {} {}", facts.engine, facts.engine_version,
                                        facts.capacity_tokens.value_or(-1), facts.kv_cache_dtype,
                                        fmt::join(facts.notes, ";"));
      if (facts.engine != "generic")
        for (const auto& f : probe::server_findings(registry, facts, nullptr))
          printed += fmt::format("\n{}", text_of(f));
      return printed;
    });
  // probe --load: what each engine's completion requests add
  out.push_back([](const engines::Registry& registry) {
    std::string printed;
    for (const auto& e : registry.names())
      printed += e + " " + probe::completion_extra_fields(registry, e).dump() + " " +
                 nlohmann::json(probe::load_counter_names(registry, e)).dump() + " " +
                 (decide::log_names_kv_dtype(registry.engine(e)) ? "logged" : "not logged") + "\n";
    return printed;
  });
  // probe: what a live server's report means
  out.push_back([](const engines::Registry& registry) {
    probe::ServerFacts generic;
    generic.url = "http://s";
    std::string printed;
    for (const auto& f : probe::server_findings(registry, generic, nullptr))
      printed += fmt::format("\n{}", text_of(f));
    return printed;
  });
  for (const auto& e : kvaudit::testing::registry().names())
    for (const char* reported : {"auto", "fp8_e4m3", "fp8", "bf16", ""})
      out.push_back(
          [e, reported](const engines::Registry& registry) {
            probe::ServerFacts facts;
            facts.url = "http://s";
            facts.engine = e;
            facts.kv_cache_dtype = reported;
            std::string printed;
            for (const auto& f : probe::server_findings(registry, facts, nullptr))
              printed += fmt::format("\n{}", text_of(f));
            return printed;
          },
          e);
  return out;
}

// ---------------------------------------------------------------- mutations

struct Mutation {
  std::string label;  // "sglang.json auto_resolution[].reason"
  std::function<void(Docs&)> apply;
};

void mutate_value(json& v) {
  if (v.is_string()) {
    v = v.get<std::string>() + "~";
  } else if (v.is_boolean()) {
    v = !v.get<bool>();
  } else if (v.is_number_integer()) {
    const int64_t n = v.get<int64_t>();
    v = n == -1 ? int64_t{1} : n * 2 + 1;  // -1 is 2n + 1's fixed point (a delta of -1)
  } else if (v.is_number()) {
    v = v.get<double>() * 1.5 + 0.125;
  } else if (v.is_array()) {
    if (v.empty())
      v.push_back("~");
    else if (v[0].is_string())
      v[0] = v[0].get<std::string>() + "~";
    else
      mutate_value(v[0]);
  } else if (v.is_object()) {
    for (auto& [key, member] : v.items()) mutate_value(member);
  } else if (v.is_null()) {
    v = "~";
  }
}

// Keys the loader allows as descriptive (JsonReader::allow_descriptive), and each rule's
// audit record (where and when it was re-read: provenance, linted, steering nothing).
const std::set<std::string> kDescriptive = {"notes", "release_evidence", "audit"};

// One mutation per key of the objects in `list` (every entry that has the key), recursing
// into nested objects and lists of objects.
void list_mutations(const std::string& label, const json& list,
                    const std::function<json&(Docs&)>& locate, std::vector<Mutation>& out) {
  std::set<std::string> keys;
  for (const auto& entry : list)
    if (entry.is_object())
      for (const auto& [key, value] : entry.items()) keys.insert(key);
  for (const std::string& key : keys) {
    if (kDescriptive.count(key)) continue;
    bool nested_objects = false, nested_list = false;
    for (const auto& entry : list)
      if (entry.is_object() && entry.contains(key)) {
        nested_objects |= entry[key].is_object() && !entry[key].empty() &&
                          std::all_of(entry[key].begin(), entry[key].end(),
                                      [](const json& m) { return !m.is_object(); }) &&
                          key != "accepted" && key != "aborts";
        nested_list |= entry[key].is_array() && !entry[key].empty() && entry[key][0].is_object();
      }
    if (nested_objects) {  // "when", "both_missing", "block": one mutation per inner key
      std::set<std::string> inner_keys;
      for (const auto& entry : list)
        if (entry.is_object() && entry.contains(key) && entry[key].is_object())
          for (const auto& [k, v] : entry[key].items()) inner_keys.insert(k);
      for (const std::string& inner_key : inner_keys)
        out.push_back({label + "." + key + "." + inner_key, [locate, key, inner_key](Docs& d) {
                         for (auto& entry : locate(d))
                           if (entry.is_object() && entry.contains(key) && entry[key].is_object() &&
                               entry[key].contains(inner_key))
                             mutate_value(entry[key][inner_key]);
                       }});
      continue;
    }
    if (nested_list) {
      for (const auto& entry : list)
        if (entry.is_object() && entry.contains(key)) {
          list_mutations(
              label + "." + key + "[]", entry[key],
              [locate, key](Docs& d) -> json& {
                for (auto& e : locate(d))
                  if (e.is_object() && e.contains(key)) return e[key];
                throw std::runtime_error("vanished");
              },
              out);
          break;
        }
      continue;
    }
    out.push_back({label + "." + key, [locate, key](Docs& d) {
                     for (auto& entry : locate(d))
                       if (entry.is_object() && entry.contains(key)) mutate_value(entry[key]);
                   }});
  }
}

std::vector<Mutation> all_mutations(const Docs& docs) {
  std::vector<Mutation> out;
  auto document_mutations = [&](const std::string& file, const json& doc,
                                std::function<json&(Docs&)> get) {
    for (const auto& item : doc.items()) {
      const std::string key = item.key();  // a named copy: lambdas below capture it
      const json& value = item.value();
      if (kDescriptive.count(key)) continue;
      if (value.is_array() && !value.empty() && value[0].is_object()) {
        list_mutations(
            file + " " + key + "[]", value, [get, key](Docs& d) -> json& { return get(d)[key]; },
            out);
      } else if (value.is_object()) {
        for (const auto& member : value.items()) {
          const std::string inner = member.key();
          if (kDescriptive.count(inner)) continue;
          out.push_back({file + " " + key + "." + inner,
                         [get, key, inner](Docs& d) { mutate_value(get(d)[key][inner]); }});
        }
      } else {
        out.push_back({file + " " + key, [get, key](Docs& d) { mutate_value(get(d)[key]); }});
      }
    }
  };
  document_mutations("dtypes.json", docs.dtypes, [](Docs& d) -> json& { return d.dtypes; });
  for (const auto& [name, doc] : docs.engine)
    document_mutations(name + ".json", doc, [e = name](Docs& d) -> json& { return d.engine[e]; });
  for (const auto& [name, doc] : docs.capacity)
    document_mutations("capacity/" + name + ".json", doc,
                       [e = name](Docs& d) -> json& { return d.capacity[e]; });
  return out;
}

TEST(EngineDataCoverage, EveryBehaviouralKeyIsReadBySomeCodePath) {
  const Battery battery = build_battery();
  const Docs docs = read_docs();
  const fs::path root =
      fs::temp_directory_path() / ("kvaudit-coverage-" + std::to_string(::getpid()));
  // Every variant is written to the same folder, so file names in evidence do not differ.
  const fs::path dir = root / "data";
  const TaggedProbes tagged = battery_probes(battery);
  const std::vector<Probe>& probes = tagged.probes;
  std::vector<std::string> baseline;
  {
    write_docs(docs, dir);
    const engines::Registry registry = engines::Registry::load(dir);
    for (const auto& probe : probes) baseline.push_back(probe(registry));
  }
  ASSERT_GT(baseline.size(), 10000u);
  std::cout << "  [coverage] battery of " << baseline.size() << " probes" << std::endl;
  std::vector<std::string> unread;
  int refused = 0, changed = 0;
  // Probes that told a mutation apart, tried first on the next: most keys are seen by the
  // same few inputs, so a changed key costs a handful of probes, not the whole battery. A
  // key that changes nothing still runs every probe.
  std::vector<size_t> detectors;
  // Read by code, but no input can observe a change with the shipped constants: not run
  // (each would cost the whole battery).
  const std::map<std::string, std::string> inert = {
      {"capacity/sglang.json mem_fraction_static_default[].activation_min_tokens",
       "max(chunked_prefill_size, 2048): every tier's chunked prefill is at least 2048"},
      {"capacity/sglang.json mem_fraction_static_default[].large_gpu_threshold_mib",
       "the 10 GiB floor above 60 GiB never binds: those tiers reserve 12.5 GiB or more"}};
  const std::vector<Mutation> mutations = all_mutations(docs);
  for (size_t i = 0; i < mutations.size(); ++i) {
    if (inert.count(mutations[i].label)) continue;
    Docs mutated = docs;
    mutations[i].apply(mutated);
    write_docs(mutated, dir);
    try {
      const engines::Registry registry = engines::Registry::load(dir);
      // A key of one engine's file can only change what reads that engine's data.
      const std::string& label = mutations[i].label;
      std::string engine;  // the engine whose file (or capacity file) the mutation changed
      for (const auto& e : registry.names())
        if (label.rfind(e + ".json", 0) == 0 || label.rfind("capacity/" + e + ".json", 0) == 0)
          engine = e;
      auto sees = [&](size_t p) {
        return engine.empty() || tagged.engine[p].empty() || tagged.engine[p] == engine;
      };
      bool differs = false;
      for (size_t d = 0; d < detectors.size() && !differs; ++d)
        differs = sees(detectors[d]) && probes[detectors[d]](registry) != baseline[detectors[d]];
      const std::vector<std::string> first = likely_sections(label);
      auto likely = [&](size_t p) {
        return std::find(first.begin(), first.end(), tagged.kind[p]) != first.end();
      };
      for (int pass = 0; pass < 2 && !differs; ++pass)
        for (size_t p = 0; p < probes.size() && !differs; ++p)
          if (likely(p) == (pass == 0) && sees(p) && probes[p](registry) != baseline[p])
            differs = true, detectors.push_back(p);
      if (differs)
        ++changed;
      else
        unread.push_back(mutations[i].label);
    } catch (const InputError&) {
      ++refused;  // the lint read the key and refused the mutated value
    }
  }
  fs::remove_all(root);
  std::cout << "  [coverage] battery of " << baseline.size() << " probes; " << mutations.size()
            << " keys mutated: " << refused << " refused by the lint, " << changed
            << " changed an output, " << unread.size() << " changed nothing\n";
  EXPECT_GT(mutations.size(), 100u);
  EXPECT_TRUE(unread.empty()) << "keys no code path reads:\n  "
                              << fmt::format("{}", fmt::join(unread, "\n  "));
}

// The finding catalogue: every id check, logs, plan --from-log and probe emit across the
// battery (every release x request x model x flag variant, every log template and fixture
// log) is documented in docs/findings.md with its severity, and every id documented there
// exists in the source. A new finding without a line in the catalogue fails here.
TEST(EngineDataCatalogue, EveryFindingIdIsInTheCatalogue) {
  const Battery battery = build_battery();
  std::set<std::string> emitted;
  g_finding_ids = &emitted;
  for (const auto& probe : battery_probes(battery).probes) probe(kvaudit::testing::registry());
  g_finding_ids = nullptr;
  ASSERT_GT(emitted.size(), 20u);
  // | `id` | severity | command | meaning |
  const std::string doc =
      read_text_file(fs::path(KVAUDIT_TEST_DIR) / ".." / "docs" / "findings.md");
  std::map<std::string, std::string> documented;
  std::istringstream lines(doc);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("| `", 0) != 0) continue;
    const size_t end = line.find('`', 3);
    const size_t bar = line.find('|', end);
    const size_t bar2 = line.find('|', bar + 1);
    ASSERT_NE(bar2, std::string::npos) << line;
    std::string severity = line.substr(bar + 1, bar2 - bar - 1);
    severity.erase(0, severity.find_first_not_of(' '));
    severity.erase(severity.find_last_not_of(' ') + 1);
    documented[line.substr(3, end - 3)] = severity;
  }
  for (const auto& id : emitted)
    EXPECT_TRUE(documented.count(id)) << "finding id '" << id << "' is not in docs/findings.md";
  // Documented ids exist in the code (a literal in some module).
  std::string sources;
  for (const auto& entry :
       fs::recursive_directory_iterator(fs::path(KVAUDIT_TEST_DIR) / ".." / "src"))
    if (entry.is_regular_file()) sources += read_text_file(entry.path());
  for (const auto& [id, severity] : documented) {
    EXPECT_NE(sources.find('"' + id + '"'), std::string::npos)
        << "docs/findings.md lists '" << id << "', which no source file names";
    EXPECT_TRUE(severity == "critical" || severity == "warning" || severity == "info" ||
                severity == "varies" || severity == "policy")
        << id << ": severity '" << severity << "'";
  }
  std::string all;
  for (const auto& id : emitted) all += id + " ";
  std::cout << "  [catalogue] " << emitted.size() << " ids emitted: " << all << "\n";
}

}  // namespace
}  // namespace kvaudit
