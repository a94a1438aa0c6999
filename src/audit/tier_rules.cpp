// The check rule about where the KV cache travels: a host tier, a connector, a persistent
// store or a disaggregated transfer this launch uses, in a combination the engine data's
// tier_hazards name (each with its source, release range and what to launch instead).
#include <fmt/format.h>

#include "audit/internal.h"

namespace kvaudit::audit {

using report::Evidence;
using report::Finding;
using report::Severity;

namespace {

Severity severity_of(const std::string& name) {
  if (name == "critical") return Severity::critical;
  if (name == "warning") return Severity::warning;
  return Severity::info;
}

// "--enable-hierarchical-cache", "kv_connector = LMCacheConnectorV1 (--kv-transfer-config)":
// the launch's settings the hazard matched, as evidence.
std::vector<Evidence> settings_evidence(const Context& ctx, const engines::TierHazard& rule) {
  std::vector<Evidence> evidence;
  for (const auto& [setting, globs] : rule.settings) {
    if (setting == "speculative_algorithm") {
      evidence.push_back(ctx.launch_evidence("speculative_algorithm", "speculative algorithm",
                                             ctx.flags().speculative_algorithm));
      continue;
    }
    if (setting == "kv_cache_dtype_requested") {
      evidence.push_back(ctx.launch_evidence("kv_cache_dtype", "requested kv_cache_dtype",
                                             ctx.flags().kv_cache_dtype));
      continue;
    }
    // A setting the launch leaves out matched through the engine's default: say so, since
    // nothing in the launch shows it.
    const bool given = ctx.flags().tier_settings.count(setting) > 0;
    const std::string value = engines::tier_setting_value(ctx.engine(), ctx.flags(), setting);
    std::string key = setting;
    if (!given)
      key += " (not set: the engine's default)";
    else if (engines::is_derived_tier_setting(setting))
      key += " (from --kv-transfer-config)";
    else if (ctx.engine().tier_config_keys.count(setting))
      key += fmt::format(" ({} in {})", ctx.engine().tier_config_keys.at(setting).front(),
                         ctx.flags().config_file);
    evidence.push_back(
        {ctx.launch_label(), key, value.size() > 160 ? value.substr(0, 157) + "..." : value});
  }
  return evidence;
}

}  // namespace

void rule_tier_hazards(Context& ctx) {
  for (const engines::TierHazard* hit : ctx.resolved.tier_hazards) {
    const engines::TierHazard& rule = *hit;
    std::vector<Evidence> evidence = settings_evidence(ctx, rule);
    if (!rule.kv_dtypes.empty())
      evidence.push_back(ctx.launch_evidence("kv_cache_dtype", "resolved kv_cache_dtype",
                                             ctx.resolved.kv_cache_dtype));
    if (rule.hybrid)
      evidence.push_back({ctx.model().config_file, "recurrent (linear-attention) layers",
                          *rule.hybrid ? "present" : "absent"});
    evidence.push_back({ctx.data_file(), "tier_hazards." + rule.id, rule.consequence});
    add_provenance(ctx, rule.provenance, evidence);
    const std::string fix = rule.fixed_in.empty()
                                ? rule.fix
                                : fmt::format("upgrade {} to {} or later; or {}",
                                              ctx.engine().engine, rule.fixed_in, rule.fix);
    Finding finding{"kv-tier-hazard",
                    severity_of(rule.severity),
                    fmt::format("{}: {} ({})", ctx.engine_label(), rule.tier, rule.id),
                    rule.consequence + ".",
                    std::move(evidence),
                    fix,
                    reference_text(rule.provenance)};
    finding.judged_on = engine_basis_text(rule.provenance);
    if (finding.severity == Severity::critical) {
      judge(ctx, Category::broken, finding);  // corrupts answers: critical under every policy
    } else {
      finding.basis = "engine";
    }
    ctx.findings.push_back(std::move(finding));
  }
}

std::string transfer_role(const engines::LaunchFlags& flags) {
  auto setting = [&](const char* key) {
    auto it = flags.tier_settings.find(key);
    return it == flags.tier_settings.end() ? std::string() : it->second;
  };
  std::string mode = setting("disaggregation_mode");  // not const: returning it moves it
  if (mode == "prefill" || mode == "decode") return mode;
  const std::string role = setting("kv_role");
  if (role == "kv_producer") return "prefill";
  if (role == "kv_consumer") return "decode";
  return "";
}

TransferPairCheck check_transfer_pairs(const std::vector<TransferSide>& sides,
                                       const std::string& file) {
  TransferPairCheck out;
  for (const TransferSide& prefill : sides) {
    if (prefill.role != "prefill") continue;
    for (const TransferSide& decode : sides) {
      if (decode.role != "decode" || decode.engine != prefill.engine) continue;
      const bool kv_same = prefill.kv_cache_dtype == decode.kv_cache_dtype;
      const bool dtype_same = prefill.dtype == decode.dtype;
      if (kv_same && dtype_same) {
        out.notes.push_back(fmt::format(
            "{}: the prefill launch ({}) and the decode launch ({}) run the same KV cache dtype "
            "({}), so the pages they transfer mean the same on both sides",
            file, prefill.workload, decode.workload, prefill.kv_cache_dtype));
        continue;
      }
      const bool sglang = prefill.engine == "sglang";
      Finding f;
      f.id = "kv-transfer-dtype-mismatch";
      f.severity = sglang ? Severity::critical : Severity::warning;
      f.title = fmt::format(
          "The prefill and decode launches run different {}: {} against {}",
          kv_same ? "model dtypes" : "KV cache dtypes",
          kv_same ? (prefill.dtype.empty() ? "auto" : prefill.dtype) : prefill.kv_cache_dtype,
          kv_same ? (decode.dtype.empty() ? "auto" : decode.dtype) : decode.kv_cache_dtype);
      f.consequence =
          sglang ? "SGLang moves the prefill's KV pages to the decode server as raw bytes, with "
                   "no dtype conversion and no check that both sides agree: the decode server "
                   "reads them as its own dtype, which \"silently produces corrupted data at low "
                   "concurrency and crashes at high concurrency\""
                 : "the connector moves KV pages between the two servers; whether it checks that "
                   "both sides run the same dtype was not read here, and pages read as another "
                   "dtype are garbage";
      f.fix = fmt::format("launch both sides with the same --kv-cache-dtype ({}) and --dtype",
                          prefill.kv_cache_dtype);
      f.reference = sglang ? "sgl-project/sglang PR #19398 \"Add kv_cache_dtype consistency check "
                             "between prefill and decode\" (closed unmerged): \"There is no dtype "
                             "conversion in the transfer path\""
                           : "";
      f.evidence = {{file, prefill.workload + " (prefill) kv_cache_dtype", prefill.kv_cache_dtype},
                    {file, decode.workload + " (decode) kv_cache_dtype", decode.kv_cache_dtype}};
      if (!dtype_same)
        f.evidence.push_back({file, "model dtype (prefill / decode)",
                              (prefill.dtype.empty() ? "auto" : prefill.dtype) + " / " +
                                  (decode.dtype.empty() ? "auto" : decode.dtype)});
      f.judged_on = sglang ? "both launches of the file as resolved, and a report on the tracker "
                             "(the check that would refuse the pair was never merged)"
                           : "both launches of the file as resolved";
      out.findings.push_back(std::move(f));
    }
  }
  return out;
}

}  // namespace kvaudit::audit
