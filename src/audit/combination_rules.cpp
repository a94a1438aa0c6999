// The check rules about where the cache runs rather than what the checkpoint says:
// combinations the engines' trackers report as broken (release x attention backend x GPU x
// KV dtype x model family), a dtype the platform substitutes, and the draft model's cache.
#include <fmt/format.h>

#include <algorithm>

#include "audit/internal.h"

namespace kvaudit::audit {

using report::Evidence;
using report::Finding;
using report::Severity;

void rule_known_bad(Context& ctx) {
  for (const auto& hit : ctx.resolved.known_bad) {
    const engines::KnownBad& rule = *hit.rule;
    std::vector<Evidence> evidence = {
        ctx.launch_evidence("kv_cache_dtype", "resolved kv_cache_dtype",
                            ctx.resolved.kv_cache_dtype),
        {ctx.data_file(), "known_bad." + rule.id, rule.consequence}};
    if (!rule.gpu_archs.empty())
      evidence.push_back({ctx.flags().gpu_arch.empty() ? "--gpu" : "--gpu " + ctx.input.gpu_name,
                          "GPU architecture (the combination: " +
                              fmt::format("{}", fmt::join(rule.gpu_archs, ", ")) + ")",
                          ctx.flags().gpu_arch.empty() ? "not given" : ctx.flags().gpu_arch});
    if (!rule.backends.empty())
      evidence.push_back(
          {ctx.launch_label(),
           "attention backend (the combination: " +
               fmt::format("{}", fmt::join(rule.backends, ", ")) + ")",
           hit.backend.empty() ? "not known" : hit.backend + " (" + hit.backend_origin + ")"});
    if (hit.default_backend) {
      evidence.push_back({ctx.data_file(), "default_backends (" + hit.backend_origin + ")",
                          hit.default_backend->provenance.reference});
      add_provenance(ctx, hit.default_backend->provenance, evidence);
    }
    if (!rule.when.architectures.empty())
      evidence.push_back({ctx.model().config_file, "architectures[0]", ctx.model().architecture});
    add_provenance(ctx, rule.provenance, evidence);
    const std::string fix =
        rule.fixed_in.empty()
            ? fmt::format("{} (no fixed release is known)",
                          ctx.fix_flag(ctx.resolved.model_dtype == "fp16" ? "fp16" : "bf16"))
            : fmt::format("upgrade {} to {} or later, or {}", ctx.engine().engine, rule.fixed_in,
                          ctx.fix_flag(ctx.resolved.model_dtype == "fp16" ? "fp16" : "bf16"));
    Finding finding{
        "known-bad-combination",
        Severity::critical,
        hit.certain
            ? fmt::format("{} with a {} KV cache is a combination known to break: {}",
                          ctx.engine_label(), ctx.resolved.kv_cache_dtype, rule.id)
            : fmt::format("{} with a {} KV cache may be a combination known to break ({}): it "
                          "depends on the {} not given",
                          ctx.engine_label(), ctx.resolved.kv_cache_dtype, rule.id,
                          fmt::join(hit.unknown, " and ")),
        rule.consequence + ".",
        evidence,
        hit.certain ? fix
                    : fmt::format("say where it runs (--gpu, the launch's --attention-backend) so "
                                  "kvaudit can tell; if it matches: {}",
                                  fix),
        reference_text(rule.provenance)};
    finding.judged_on = engine_basis_text(rule.provenance);
    if (hit.certain) {
      judge(ctx, Category::broken, finding);
    } else {
      // Not proven to apply: a warning when only the backend is unknown on a GPU it names,
      // a note when the GPU itself is not given (most launches are checked without one).
      const bool gpu_unknown =
          std::find(hit.unknown.begin(), hit.unknown.end(), "GPU") != hit.unknown.end();
      finding.severity = gpu_unknown ? Severity::info : Severity::warning;
      finding.basis = "engine";
      finding.judged_on += fmt::format("; unknown here: {}", fmt::join(hit.unknown, ", "));
    }
    ctx.findings.push_back(std::move(finding));
  }
}

void rule_platform_substitution(Context& ctx) {
  const engines::PlatformSubstitution* rule = ctx.resolved.substitution;
  if (!rule) return;
  const auto limits = limits_of(ctx.resolved.dtype);
  std::vector<Evidence> evidence = {
      ctx.launch_evidence("kv_cache_dtype", "resolved kv_cache_dtype",
                          ctx.resolved.substituted_from),
      {"--gpu " + ctx.input.gpu_name, "platform / architecture",
       ctx.flags().platform + " / " + ctx.flags().gpu_arch},
      {ctx.data_file(), "platform_substitutions." + rule->id,
       fmt::format("{} -> {}{}", ctx.resolved.substituted_from, rule->becomes,
                   rule->silent ? ", no log line" : "")}};
  add_provenance(ctx, rule->provenance, evidence);
  Finding finding{
      "kv-dtype-substituted",
      Severity::critical,
      fmt::format(
          "{} on {} stores the {} KV cache as {}{}", ctx.engine_label(), ctx.flags().gpu_arch,
          ctx.resolved.substituted_from, rule->becomes,
          limits ? fmt::format(" (largest value {} at scale 1.0)", float_text(limits->max_finite))
                 : ""),
      rule->consequence + ".",
      evidence,
      fmt::format("{}, or serve calibrated scales (the engine doubles loaded scales for {})",
                  ctx.fix_flag("bf16"), rule->becomes),
      reference_text(rule->provenance)};
  finding.judged_on = engine_basis_text(rule->provenance);
  judge(ctx, Category::scales_not_as_shipped, finding);
  ctx.findings.push_back(std::move(finding));
}

void rule_draft_kv(Context& ctx) {
  const engines::DraftKvRule* rule = ctx.resolved.draft_rule;
  if (!rule || ctx.resolved.draft_kv_cache_dtype.empty()) return;
  if (!ctx.engine().dtypes->is_quantized(ctx.resolved.draft_kv_cache_dtype)) return;
  std::vector<Evidence> evidence = {
      ctx.launch_evidence("speculative_algorithm", "speculative algorithm",
                          ctx.flags().speculative_algorithm),
      ctx.launch_evidence("speculative_draft_kv_cache_dtype", "draft KV cache dtype",
                          ctx.resolved.draft_kv_cache_dtype),
      {ctx.data_file(), "draft_kv." + rule->id, rule->consequence}};
  add_provenance(ctx, rule->provenance, evidence);
  // Speculative decoding verifies every draft token with the target, so the draft cache
  // changes throughput (acceptance), not the output distribution.
  Finding finding{
      "draft-kv-quantized",
      Severity::info,
      fmt::format("The speculative draft model's KV cache is {} too",
                  ctx.resolved.draft_kv_cache_dtype),
      "The target verifies every draft token, so accuracy is unchanged; a quantized draft cache "
      "lowers acceptance (fewer tokens per step) and with it the speed-up.",
      evidence,
      rule->override_flag.empty()
          ? std::string("none in this release: the drafter follows --kv-cache-dtype")
          : fmt::format("give the drafter its own 16-bit cache with {} bf16", rule->override_flag),
      reference_text(rule->provenance)};
  finding.basis = "engine";
  finding.judged_on = engine_basis_text(rule->provenance);
  ctx.findings.push_back(std::move(finding));
}

}  // namespace kvaudit::audit
