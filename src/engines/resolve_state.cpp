// The recurrent state of hybrid models under an engine release: the Mamba state slots a
// running request holds, and the SSM and conv state dtypes.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "engines/internal.h"
#include "util/util.h"

namespace kvaudit::engines {

namespace {

using checkpoint::ModelFacts;

MambaSlotsPerRequest resolve_slots(const MambaSlotRules& rules, const MambaSlotInputs& in) {
  MambaSlotsPerRequest out;
  if (in.disable_radix_cache) {
    out.strategy = "radix_off";
    out.slots = rules.slots.at("radix_off");
    out.derivation = fmt::format("--disable-radix-cache: {} state slot{} per request", out.slots,
                                 out.slots == 1 ? "" : "s");
    return out;
  }
  std::string strategy = in.strategy.empty() ? rules.default_strategy : in.strategy;
  std::string how = in.strategy.empty() ? "the release's default" : "as launched";
  if (strategy == "auto") {
    // auto takes extra_buffer when the overlap scheduler runs (and the architecture has it on
    // the Triton backend, as Qwen3.5 and Qwen3-Next do), else no_buffer.
    strategy = in.disable_overlap_schedule ? "no_buffer" : "extra_buffer";
    how = fmt::format("auto ({}) -> {}", in.disable_overlap_schedule ? "overlap off" : "overlap on",
                      strategy);
  }
  if (strategy == "radix_off" && in.strategy.empty()) {
    out.strategy = strategy;
    out.slots = rules.slots.at("radix_off");
    out.derivation =
        fmt::format("this release runs hybrids without a radix cache: {} state slot{} per request",
                    out.slots, out.slots == 1 ? "" : "s");
    return out;
  }
  auto it = rules.slots.find(strategy);
  if (it == rules.slots.end() || strategy == "radix_off") {
    std::vector<std::string> known;
    for (const auto& [name, n] : rules.slots)
      if (name != "radix_off") known.push_back(name);
    throw InputError("--mamba-radix-cache-strategy",
                     fmt::format("'{}' is not a strategy of this release ({})", strategy,
                                 fmt::join(known, ", ")));
  }
  out.strategy = strategy;
  out.slots = it->second;
  std::string deltas;
  auto apply = [&](bool when, const std::map<std::string, int>& table, const char* what) {
    if (!when) return;
    if (auto d = table.find(strategy); d != table.end() && d->second != 0) {
      out.slots += d->second;
      deltas += fmt::format(", {:+d} with {}", d->second, what);
    }
  };
  apply(in.disable_overlap_schedule, rules.no_overlap_delta, "the overlap scheduler off");
  apply(in.speculative, rules.spec_delta, "speculative decoding");
  apply(in.skip_decode_lock, rules.skip_decode_lock_delta, "SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK");
  out.slots = std::max(1, out.slots);
  out.derivation = fmt::format("mamba radix-cache strategy {} ({}): {} state slots per request{}",
                               strategy, how, it->second, deltas);
  if (!deltas.empty()) out.derivation += fmt::format(" = {}", out.slots);
  return out;
}

}  // namespace

MambaSlotsPerRequest resolve_mamba_slots(const MambaSlotRules& rules, const MambaSlotInputs& in) {
  MambaSlotsPerRequest out = resolve_slots(rules, in);
  out.derivation += fmt::format(" [{}]", rules.provenance.reference);
  return out;
}

MambaSsmDtype resolve_mamba_ssm_dtype(const EngineDefaults& defaults, const std::string& flag,
                                      const std::string& config_dtype) {
  if (!flag.empty() && flag != "auto") return {flag, "launch flag"};
  if (defaults.mamba_ssm_dtype == "from_model_config" || defaults.mamba_ssm_dtype == "auto")
    return config_dtype.empty()
               ? MambaSsmDtype{defaults.mamba_ssm_dtype_fallback, "engine fallback"}
               : MambaSsmDtype{config_dtype, "model config"};
  return {defaults.mamba_ssm_dtype, "engine default"};
}

StateDtypes resolve_state_dtypes(const EngineModel& engine, const Version& version,
                                 const ModelFacts& model, const std::string& ssm_flag,
                                 const std::string& model_dtype) {
  const EngineDefaults& defaults = engine.defaults_for(version);
  const std::string config_dtype = model.linear_attention ? model.linear_attention->ssm_dtype : "";
  StateDtypes out;
  const StateDtypeRule* rule = nullptr;
  for (const StateDtypeRule& r : engine.state_dtypes)
    if (r.versions.contains(version) && r.when.matches(model)) {
      rule = &r;
      break;
    }
  out.rule = rule;
  auto concrete = [&](const std::string& dtype, const std::string& fallback) -> std::string {
    if (dtype == "model_dtype") return model_dtype;
    if (dtype == "from_model_config") return config_dtype.empty() ? fallback : config_dtype;
    return dtype;
  };
  if (!ssm_flag.empty() && ssm_flag != "auto") {
    out.ssm = {ssm_flag, "launch flag"};
  } else if (rule) {
    const std::string fallback =
        rule->ssm_fallback.empty() ? defaults.mamba_ssm_dtype_fallback : rule->ssm_fallback;
    out.ssm = {concrete(rule->ssm_dtype, fallback),
               rule->ssm_dtype == "from_model_config" && !config_dtype.empty()
                   ? "model config"
                   : "engine rule " + rule->id};
  } else if (defaults.mamba_ssm_dtype == "model_dtype") {
    out.ssm = {model_dtype, "model dtype (engine default)"};
  } else {
    out.ssm = resolve_mamba_ssm_dtype(defaults, ssm_flag, config_dtype);
  }
  const std::string conv =
      rule && !rule->conv_dtype.empty() ? rule->conv_dtype : defaults.mamba_conv_dtype;
  out.conv_dtype = engine.dtypes->normalise(concrete(conv, defaults.mamba_ssm_dtype_fallback));
  return out;
}

}  // namespace kvaudit::engines
