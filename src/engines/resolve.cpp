// resolve_kv: applies an engine's model to a checkpoint and launch flags. In data-flow
// order: the requested dtype, the dtype the engine allocates, the layers it keeps in the
// model dtype, which checkpoint scales reach the attention layers and where the scales in
// effect come from (resolve_scales.cpp), and what stops the server from starting. Also the
// fix that sets a KV dtype in a launch.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>

#include "engines/internal.h"
#include "util/util.h"

namespace kvaudit::engines {

namespace {

using checkpoint::ModelFacts;

std::string upper(std::string text) {
  for (auto& c : text) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return text;
}

// ---------------------------------------------------------------- the dtype

struct RequestedDtype {
  std::string dtype;  // canonical, or the raw value when unknown
  bool accepted = true;
  const StartupAbort* abort = nullptr;
};

RequestedDtype read_request(const EngineModel& engine, const Version& version,
                            const std::string& value) {
  RequestedDtype out;
  const DtypeChoices* choices = engine.choices_for(version);
  out.dtype = cli_dtype(engine, version, value);
  if (!out.dtype.empty()) return out;
  out.accepted = false;
  if (choices)
    if (auto it = choices->aborts.find(value); it != choices->aborts.end()) out.abort = &it->second;
  std::string canonical = engine.dtypes->normalise(value);
  out.dtype = canonical.empty() ? value : canonical;
  return out;
}

const AutoRule* pick_auto_rule(const EngineModel& engine, const Version& version,
                               const ModelFacts& model, bool requested_auto) {
  for (const AutoRule& rule : engine.auto_rules) {
    if (!rule.versions.contains(version)) continue;
    if (rule.applies == AutoApplies::auto_only && !requested_auto) continue;
    if (!rule.when.matches(model)) continue;
    return &rule;
  }
  return nullptr;
}

// vLLM --kv-cache-dtype-skip-layers: "sliding_window" and/or layer indices.
std::vector<int> skipped_layers(const ModelFacts& model, const std::string& spec) {
  std::vector<int> out;
  if (spec.empty()) return out;
  std::vector<std::string> items = split_list(spec, ',');
  for (const auto& layer : model.layers) {
    if (!checkpoint::holds_kv_cache(layer.kind)) continue;
    bool skip = false;
    for (const std::string& item : items) {
      if (item == "sliding_window")
        skip |= layer.kind == checkpoint::LayerKind::sliding_attention;
      else if (item == std::to_string(layer.index))
        skip = true;
    }
    if (skip) out.push_back(layer.index);
  }
  return out;
}

}  // namespace

bool any_glob(const std::vector<std::string>& patterns, const std::string& value) {
  if (patterns.empty()) return true;
  return std::any_of(patterns.begin(), patterns.end(),
                     [&](const std::string& p) { return glob_match(p, value); });
}

bool flag_given(const EngineModel& engine, const LaunchFlags& flags, std::string_view flag) {
  for (const auto& [field, spellings] : engine.launch.flags) {
    if (std::find(spellings.begin(), spellings.end(), flag) == spellings.end()) continue;
    if (field == "calculate_kv_scales") return flags.calculate_kv_scales;
    if (field == "kv_cache_dtype_skip_layers") return !flags.kv_cache_dtype_skip_layers.empty();
    if (field == "quantization_param_path") return !flags.quantization_param_path.empty();
    if (field == "mamba_ssm_dtype") return !flags.mamba_ssm_dtype.empty();
    if (field == "dp_attention") return flags.dp_attention;
    if (field == "speculative_algorithm") return !flags.speculative_algorithm.empty();
  }
  return false;
}

bool QuantMatch::matches(const ModelFacts& model) const {
  const checkpoint::QuantFacts* quant = model.quant ? &*model.quant : nullptr;
  if (!quant_methods.empty()) {
    std::string method = quant ? quant->method : "none";
    if (method.empty()) method = "none";
    if (!any_glob(quant_methods, method)) return false;
  }
  if (!kv_cache_quant_algos.empty()) {
    if (!quant || quant->kv_cache_quant_algo.empty()) return false;
    bool hit = false;
    for (const auto& algo : kv_cache_quant_algos)
      hit |= algo == "*" || upper(algo) == upper(quant->kv_cache_quant_algo);
    if (!hit) return false;
  }
  if (kv_cache_scheme && (quant && quant->has_kv_cache_scheme) != *kv_cache_scheme) return false;
  if (scheme_bits && (!quant || quant->kv_scheme_bits != *scheme_bits)) return false;
  if (scheme_dynamic && (!quant || quant->kv_scheme_dynamic != scheme_dynamic)) return false;
  if (!scheme_type.empty() && (!quant || quant->kv_scheme_type != scheme_type)) return false;
  if (!scheme_strategies.empty() &&
      (!quant || !any_glob(scheme_strategies, quant->kv_scheme_strategy)))
    return false;
  if (!architectures.empty() && !any_glob(architectures, model.architecture)) return false;
  if (!weight_algos.empty() && (!quant || !any_glob(weight_algos, quant->weight_algo)))
    return false;
  if (hybrid && model.linear_attention.has_value() != *hybrid) return false;
  return true;
}

std::string_view scale_source_name(ScaleSource source) {
  switch (source) {
    case ScaleSource::not_applicable:
      return "not_applicable";
    case ScaleSource::checkpoint:
      return "checkpoint";
    case ScaleSource::quantization_param_path:
      return "quantization_param_path";
    case ScaleSource::calculated:
      return "calculated";
    case ScaleSource::dynamic_by_design:
      return "dynamic_by_design";
    case ScaleSource::unit_default:
      return "unit_default";
    case ScaleSource::unknown:
      return "unknown";
  }
  return "?";
}

std::string served_model_dtype(const DtypeVocabulary& dtypes, const ModelFacts& model,
                               const LaunchFlags& flags) {
  const bool automatic = flags.dtype.empty() || flags.dtype == "auto";
  std::string dtype = dtypes.normalise(automatic ? model.torch_dtype : flags.dtype);
  // Both engines serve float32 checkpoints in bfloat16 under --dtype auto, and a
  // config without a dtype in bfloat16.
  if (dtype.empty() || dtype == "auto") return "bf16";
  if (dtype == "fp32" && automatic) return "bf16";
  return dtype;
}

namespace {

// The request as this version's argument parser reads it: the dtype asked for, whether the
// parser knows it, and the start-up stop a known-but-refused value leads to.
RequestedDtype record_request(const EngineModel& engine, const Version& version,
                              const LaunchFlags& flags, ResolvedKv& resolved) {
  RequestedDtype request = read_request(engine, version, flags.kv_cache_dtype);
  resolved.requested = request.dtype;
  resolved.requested_known = request.accepted;
  if (request.abort)
    resolved.startup_failures.push_back(
        {request.abort->id, request.abort->message,
         fmt::format("--kv-cache-dtype {} passes argument parsing, then start-up stops",
                     flags.kv_cache_dtype),
         request.abort->provenance});
  return request;
}

// The dtype the engine allocates: the version's auto rule that matches the checkpoint, the
// model dtype under a plain auto, or the explicit request; and the layers it skips.
void resolve_allocated_dtype(const EngineModel& engine, const Version& version,
                             const ModelFacts& model, const LaunchFlags& flags,
                             ResolvedKv& resolved) {
  const bool requested_auto = resolved.requested == "auto";
  if (const AutoRule* rule = pick_auto_rule(engine, version, model, requested_auto)) {
    resolved.kv_cache_dtype =
        rule->resolves_to == "model_dtype" ? resolved.model_dtype : rule->resolves_to;
    resolved.rule_id = rule->id;
    resolved.reason = rule->reason;
    resolved.rule_provenance = rule->provenance;
  } else if (requested_auto) {
    resolved.kv_cache_dtype = resolved.model_dtype;
    resolved.rule_id = "auto-model-dtype";
    resolved.reason = "under --kv-cache-dtype auto the KV cache follows the model dtype";
  } else {
    resolved.kv_cache_dtype = resolved.requested;
    resolved.rule_id = "explicit";
    resolved.reason = fmt::format("--kv-cache-dtype {} was given explicitly", flags.kv_cache_dtype);
  }
  resolved.dtype = engine.dtypes->find(resolved.kv_cache_dtype);
  resolved.quantized = resolved.dtype && resolved.dtype->quantized;
  if (resolved.quantized)
    resolved.skipped_layers = skipped_layers(model, flags.kv_cache_dtype_skip_layers);
}

// A --kv-cache-dtype the version's parser does not know: argparse's invalid choice.
void add_rejected_dtype(const EngineModel& engine, const Version& version, const LaunchFlags& flags,
                        ResolvedKv& resolved) {
  std::vector<std::string> choices = kv_cache_dtype_choices(engine, version);
  resolved.startup_failures.push_back(
      {"kv-dtype-rejected",
       fmt::format("argument --kv-cache-dtype: invalid choice: '{}' (choose from {})",
                   flags.kv_cache_dtype, fmt::join(choices, ", ")),
       fmt::format("{} {} does not accept --kv-cache-dtype {}", engine.engine,
                   version_text(version), flags.kv_cache_dtype),
       engine.choices_for(version) ? engine.choices_for(version)->provenance : Provenance{}});
}

// Flags given that this version no longer (or does not yet) accept.
void add_removed_flags(const EngineModel& engine, const Version& version, const LaunchFlags& flags,
                       ResolvedKv& resolved) {
  for (const FlagRule& rule : engine.flag_rules) {
    if (flag_given(engine, flags, rule.flag) && !rule.exists.contains(version))
      resolved.startup_failures.push_back({"flag-removed-" + rule.id, rule.removed_error,
                                           fmt::format("{} is not an argument of {} {}", rule.flag,
                                                       engine.engine, version_text(version)),
                                           rule.provenance});
  }
}

// A --mamba-ssm-dtype outside the version's choices.
void add_rejected_mamba_dtype(const EngineModel& engine, const Version& version,
                              const LaunchFlags& flags, ResolvedKv& resolved) {
  if (flags.mamba_ssm_dtype.empty() || flags.mamba_ssm_dtype == "auto") return;
  const EngineDefaults& defaults = engine.defaults_for(version);
  const auto& choices = defaults.mamba_ssm_dtype_choices;
  if (choices.empty() ||
      std::find(choices.begin(), choices.end(), flags.mamba_ssm_dtype) != choices.end())
    return;
  std::string flag = engine.launch.flags.count("mamba_ssm_dtype")
                         ? engine.launch.flags.at("mamba_ssm_dtype").front()
                         : "--mamba-ssm-dtype";
  resolved.startup_failures.push_back(
      {"mamba-ssm-dtype-rejected",
       fmt::format("argument {}: invalid choice: '{}' (choose from {})", flag,
                   flags.mamba_ssm_dtype, fmt::join(choices, ", ")),
       fmt::format("{} {} does not accept {} {}", engine.engine, version_text(version), flag,
                   flags.mamba_ssm_dtype),
       defaults.provenance});
}

// Checkpoints this version refuses to start with (for some requested dtypes, or when the
// checkpoint has KV scale tensors).
void add_checkpoint_aborts(const EngineModel& engine, const Version& version,
                           const ModelFacts& model, const LaunchFlags& flags,
                           ResolvedKv& resolved) {
  const bool requested_auto = resolved.requested == "auto";
  for (const CheckpointAbort& rule : engine.checkpoint_aborts) {
    if (!rule.versions.contains(version) || !rule.when.matches(model)) continue;
    if (!rule.requested.empty() &&
        (requested_auto || std::find(rule.requested.begin(), rule.requested.end(),
                                     resolved.requested) == rule.requested.end()))
      continue;
    if (rule.requires_scale_tensors && model.kv_scales.empty()) continue;
    resolved.startup_failures.push_back(
        {rule.id, rule.message,
         rule.requested.empty()
             ? fmt::format("{} with KV scale tensors in the checkpoint", model.architecture)
             : fmt::format("--kv-cache-dtype {} with this checkpoint's quantization config",
                           flags.kv_cache_dtype),
         rule.provenance});
  }
}

// --quantization-param-path on a quantized cache whose model class cannot load it.
void add_param_path_failures(const EngineModel& engine, const Version& version,
                             const ModelFacts& model, const LaunchFlags& flags,
                             ResolvedKv& resolved) {
  if (flags.quantization_param_path.empty() || !resolved.quantized) return;
  for (const ParamPathRule& rule : engine.param_path_rules) {
    if (!rule.versions.contains(version) ||
        rule.effect != ParamPathRule::Effect::startup_error_without_loader)
      continue;
    if (!rule.dtypes.empty() && std::find(rule.dtypes.begin(), rule.dtypes.end(),
                                          resolved.kv_cache_dtype) == rule.dtypes.end())
      continue;
    if (any_glob(rule.architectures_with_loader, model.architecture)) continue;
    resolved.startup_failures.push_back(
        {rule.id, fmt::format(fmt::runtime(rule.message), model.architecture),
         fmt::format("--quantization-param-path with {}, whose model class has no "
                     "load_kv_cache_scales",
                     model.architecture),
         rule.provenance});
  }
}

// The scale warning the engine will print (what a user greps for): the first rule that
// applies.
void pick_scale_warning(const EngineModel& engine, const Version& version, const ModelFacts& model,
                        const LaunchFlags& flags, ResolvedKv& resolved) {
  for (const ScaleWarningRule& rule : engine.scale_warnings) {
    if (!rule.versions.contains(version)) continue;
    if (std::find(rule.dtypes.begin(), rule.dtypes.end(), resolved.kv_cache_dtype) ==
        rule.dtypes.end())
      continue;
    if (rule.when_no_quantization_param_path && !flags.quantization_param_path.empty()) continue;
    if (!rule.when.matches(model)) continue;
    if (rule.when_requested_explicitly && resolved.requested != resolved.kv_cache_dtype) continue;
    if (rule.when_unit_scale && resolved.scale_source != ScaleSource::unit_default) continue;
    resolved.scale_warning_text = engine.log_template(rule.log_message)->text;
    resolved.scale_warning_id = rule.id;
    resolved.scale_warning_meaning = rule.meaning;
    resolved.scale_warning_provenance = rule.provenance;
    return;
  }
}

// The platform's own dtype for what was resolved (ROCm MI300: FP8 is E4M3FNUZ).
void substitute_for_platform(const EngineModel& engine, const Version& version,
                             const LaunchFlags& flags, ResolvedKv& resolved) {
  if (flags.platform.empty()) return;
  for (const PlatformSubstitution& rule : engine.platform_substitutions) {
    if (!rule.versions.contains(version) || rule.platform != flags.platform) continue;
    if (!rule.gpu_archs.empty() && !any_glob(rule.gpu_archs, flags.gpu_arch)) continue;
    if (std::find(rule.requested.begin(), rule.requested.end(), resolved.kv_cache_dtype) ==
        rule.requested.end())
      continue;
    resolved.substituted_from = resolved.kv_cache_dtype;
    resolved.substitution = &rule;
    resolved.kv_cache_dtype = rule.becomes;
    resolved.dtype = engine.dtypes->find(rule.becomes);
    resolved.quantized = resolved.dtype && resolved.dtype->quantized;
    return;
  }
}

// The attention backend the launch runs: its flag, else the release's default for the GPU.
struct Backend {
  std::string name, origin;
  const DefaultBackend* rule = nullptr;
};
Backend attention_backend(const EngineModel& engine, const Version& version,
                          const ModelFacts& model, const LaunchFlags& flags,
                          const std::string& kv_dtype) {
  if (!flags.attention_backend.empty()) return {flags.attention_backend, "--attention-backend"};
  if (flags.gpu_arch.empty()) return {};
  for (const DefaultBackend& rule : engine.default_backends) {
    if (!rule.versions.contains(version) || !any_glob(rule.gpu_archs, flags.gpu_arch)) continue;
    if (!rule.kv_dtypes.empty() &&
        std::find(rule.kv_dtypes.begin(), rule.kv_dtypes.end(), kv_dtype) == rule.kv_dtypes.end())
      continue;
    if (rule.mla && *rule.mla != model.mla.has_value()) continue;
    return {rule.backend, "the release's default on " + flags.gpu_arch, &rule};
  }
  return {};
}

// Known-bad combinations: certain when every dimension is known to match, possible when the
// GPU or the backend is not given; skipped when one is known not to match.
void find_known_bad(const EngineModel& engine, const Version& version, const ModelFacts& model,
                    const LaunchFlags& flags, ResolvedKv& resolved) {
  for (const KnownBad& rule : engine.known_bad) {
    if (!rule.versions.contains(version) || !rule.when.matches(model)) continue;
    if (rule.kv_dtypes.empty() ? !resolved.quantized
                               : std::find(rule.kv_dtypes.begin(), rule.kv_dtypes.end(),
                                           resolved.kv_cache_dtype) == rule.kv_dtypes.end())
      continue;
    if (rule.requires_scale_tensors && model.kv_scales.empty()) continue;
    ResolvedKv::KnownBadHit hit;
    hit.rule = &rule;
    if (!rule.gpu_archs.empty()) {
      if (flags.gpu_arch.empty())
        hit.unknown.push_back("GPU");
      else if (!any_glob(rule.gpu_archs, flags.gpu_arch))
        continue;
    }
    if (!rule.backends.empty()) {
      const Backend backend =
          attention_backend(engine, version, model, flags, resolved.kv_cache_dtype);
      if (backend.name.empty())
        hit.unknown.push_back("attention backend");
      else if (!any_glob(rule.backends, backend.name))
        continue;
      hit.backend = backend.name;
      hit.backend_origin = backend.origin;
      hit.default_backend = backend.rule;
    }
    hit.certain = hit.unknown.empty();
    resolved.known_bad.push_back(std::move(hit));
  }
}

// Every attention layer's stored dtype: skipped layers keep the model dtype.
void record_layer_dtypes(const ModelFacts& model, ResolvedKv& resolved) {
  for (const auto& layer : model.layers) {
    if (!checkpoint::holds_kv_cache(layer.kind)) continue;
    const bool skipped = std::find(resolved.skipped_layers.begin(), resolved.skipped_layers.end(),
                                   layer.index) != resolved.skipped_layers.end();
    resolved.layer_dtypes.push_back({layer.index,
                                     skipped ? resolved.model_dtype : resolved.kv_cache_dtype,
                                     skipped ? "--kv-cache-dtype-skip-layers" : ""});
  }
}

// The draft model's cache under speculative decoding.
void resolve_draft(const EngineModel& engine, const Version& version, const LaunchFlags& flags,
                   ResolvedKv& resolved) {
  if (flags.speculative_algorithm.empty()) return;
  for (const DraftKvRule& rule : engine.draft_kv) {
    if (!rule.versions.contains(version)) continue;
    resolved.draft_rule = &rule;
    if (!rule.override_flag.empty() && !flags.speculative_draft_kv_cache_dtype.empty()) {
      const std::string own = engine.dtypes->normalise(flags.speculative_draft_kv_cache_dtype);
      resolved.draft_kv_cache_dtype = own.empty() ? flags.speculative_draft_kv_cache_dtype : own;
    } else if (rule.follows_target) {
      resolved.draft_kv_cache_dtype = resolved.kv_cache_dtype;
    }
    return;
  }
}

}  // namespace

ResolvedKv resolve_kv(const ModelFacts& model, const LaunchFlags& flags,
                      const EngineModel& engine) {
  ResolvedKv resolved;
  resolved.engine = engine.engine;
  auto version = parse_version(flags.engine_version);
  if (!version)
    throw InputError("--engine-version",
                     fmt::format("cannot read version '{}'", flags.engine_version));
  resolved.version = *version;
  resolved.version_newer_than_known = newer_than_known(engine, *version);
  resolved.model_dtype = served_model_dtype(*engine.dtypes, model, flags);

  // 1. The request, as this version's argument parser reads it.
  const RequestedDtype request = record_request(engine, *version, flags, resolved);
  // 2. The dtype the engine allocates, and what the platform stores instead.
  resolve_allocated_dtype(engine, *version, model, flags, resolved);
  substitute_for_platform(engine, *version, flags, resolved);
  // 3. Which checkpoint scales reach the attention layers, and where those in effect come
  // from.
  resolve_scales(engine, *version, model, flags, resolved);
  // 4. What else stops start-up.
  if (resolved.requested != "auto" && !request.accepted && !request.abort)
    add_rejected_dtype(engine, *version, flags, resolved);
  add_removed_flags(engine, *version, flags, resolved);
  add_rejected_mamba_dtype(engine, *version, flags, resolved);
  add_checkpoint_aborts(engine, *version, model, flags, resolved);
  add_param_path_failures(engine, *version, model, flags, resolved);
  // 5. The scale warning the engine will print.
  pick_scale_warning(engine, *version, model, flags, resolved);
  // 6. The combinations known to break, the per-layer dtypes, and the draft model's cache.
  find_known_bad(engine, *version, model, flags, resolved);
  resolved.tier_hazards =
      find_tier_hazards(engine, *version, model, flags, resolved.kv_cache_dtype);
  record_layer_dtypes(model, resolved);
  resolve_draft(engine, *version, flags, resolved);
  return resolved;
}

std::string kv_dtype_setting_name(const EngineModel& engine, const Version& version) {
  const KvDtypeSetting& setting = engine.kv_dtype_setting;
  if (!setting.flag.empty() && setting.flag_versions.contains(version)) return setting.flag;
  return setting.config_key.empty() ? setting.flag : setting.config_key;
}

KvDtypeFix kv_dtype_fix(const EngineModel& engine, const Version& version,
                        const std::string& dtype) {
  const KvDtypeSetting& setting = engine.kv_dtype_setting;
  KvDtypeFix fix;
  const std::string spelling = cli_spelling(engine, version, dtype);
  const KvDtype* kv = engine.dtypes->find(dtype);
  if (spelling.empty() && kv && !kv->quantized && setting.sixteen_bit_overlay) {
    const auto& overlay = *setting.sixteen_bit_overlay;
    fix.overlay = true;
    fix.setting = overlay.file + " " + overlay.key;
    fix.value = "null";
    fix.text = fmt::format(
        "serve a checkpoint overlay whose {} sets {} to null{} (kvaudit check --write-overlay "
        "DIR writes it: config files copied, weights linked, the original untouched), with {} "
        "auto. Why an overlay: {}",
        overlay.file, overlay.key,
        overlay.inline_key.empty() ? "" : fmt::format(" (and config.json {})", overlay.inline_key),
        kv_dtype_setting_name(engine, version), overlay.reason);
    fix.reference = setting.provenance.reference;
    return fix;
  }
  fix.value = spelling.empty() ? dtype : spelling;
  fix.reference = setting.provenance.reference;
  // The config key where this release does not take the flag; else the flag (also when
  // there is no config key to set instead).
  const bool flag_applies = !setting.flag.empty() && setting.flag_versions.contains(version);
  if (!flag_applies && !setting.config_key.empty()) {
    fix.setting = setting.config_key;
    const std::string file_flags =
        fmt::format("{}", fmt::join(engine.launch.config_file_flags, " / "));
    fix.text = fmt::format("set {}: {} in the launch's config file{}", setting.config_key,
                           fix.value, file_flags.empty() ? "" : " (" + file_flags + ")");
    if (!setting.flag.empty())
      fix.text +=
          fmt::format(" (from {} also {} {})", setting.flag_versions.text, setting.flag, fix.value);
  } else {
    fix.setting = setting.flag;
    fix.text = fmt::format("launch with {} {}", setting.flag, fix.value);
  }
  return fix;
}

}  // namespace kvaudit::engines
