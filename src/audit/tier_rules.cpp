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
    const std::string value = ctx.flags().tier_settings.at(setting);
    const bool derived = engines::is_derived_tier_setting(setting);
    evidence.push_back({ctx.launch_label(),
                        derived ? setting + " (from --kv-transfer-config)" : setting,
                        value.size() > 160 ? value.substr(0, 157) + "..." : value});
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

}  // namespace kvaudit::audit
