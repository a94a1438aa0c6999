// Severity from evidence and intent: the --kv-policy names, and how the policy turns a
// finding's category, and for a precision finding the range evidence (evidence.cpp), into
// its severity and judged_on.
#include <fmt/format.h>

#include <algorithm>

#include "audit/internal.h"

namespace kvaudit::audit {

using report::Evidence;
using report::Severity;

std::string_view kv_policy_name(KvPolicy policy) {
  switch (policy) {
    case KvPolicy::lossless:
      return "lossless";
    case KvPolicy::evidence:
      return "evidence";
    case KvPolicy::permissive:
      return "permissive";
  }
  return "?";
}

std::optional<KvPolicy> parse_kv_policy(std::string_view text) {
  for (KvPolicy policy : {KvPolicy::lossless, KvPolicy::evidence, KvPolicy::permissive})
    if (kv_policy_name(policy) == text) return policy;
  return std::nullopt;
}

std::string engine_basis_text(const engines::Provenance& provenance) {
  // What kind of source the rule rests on: a report on a tracker is not the engine's code.
  const char* kind = "the engine's source";
  switch (provenance.audit.source) {
    case engines::SourceKind::release_code:
      break;
    case engines::SourceKind::merged_pr:
      kind = "a merged change to the engine";
      break;
    case engines::SourceKind::issue_report:
      kind = "a report on the tracker";
      break;
    case engines::SourceKind::release_log:
      kind = "a released engine's log";
      break;
    case engines::SourceKind::docs:
      kind = "the documentation";
      break;
  }
  std::string text = provenance.reference.empty()
                         ? "the engine data"
                         : fmt::format("{}: {}", kind, provenance.reference);
  if (!provenance.audit.checked.empty())
    text += fmt::format(" ({} {})", engines::audit_verdict_name(provenance.audit.verdict),
                        provenance.audit.checked);
  if (!provenance.verified) text += "; the version bound is inferred: " + provenance.bound;
  return text;
}

void judge(const Context& ctx, Category category, report::Finding& finding) {
  const KvPolicy policy = ctx.input.policy;
  const std::string policy_text = fmt::format("--kv-policy {}", kv_policy_name(policy));
  switch (category) {
    case Category::broken:
      finding.severity = Severity::critical;
      if (finding.basis.empty()) finding.basis = "engine";
      break;
    case Category::scales_not_as_shipped:
      finding.severity = policy == KvPolicy::permissive ? Severity::warning : Severity::critical;
      if (finding.basis.empty()) finding.basis = "engine";
      break;
    case Category::precision: {
      const RangeAssessment& range = ctx.range;
      finding.basis = range.basis;
      if (policy == KvPolicy::lossless) {
        finding.severity = Severity::critical;
        finding.judged_on = fmt::format(
            "{}: any quantized KV cache is critical, whatever the evidence. The evidence, for "
            "the record: {}",
            policy_text, range.judged_on);
        return;
      }
      const Severity when_unknown =
          policy == KvPolicy::permissive ? Severity::info : Severity::warning;
      finding.severity =
          range.verdict == RangeVerdict::damaging
              ? (policy == KvPolicy::permissive ? Severity::warning : Severity::critical)
          : range.verdict == RangeVerdict::safe ? Severity::info
                                                : when_unknown;
      finding.judged_on = range.judged_on;
      for (const auto& item : range.evidence) finding.evidence.push_back(item);
      return;
    }
  }
  if (finding.judged_on.empty())
    finding.judged_on = fmt::format("{}; severity under {}",
                                    finding.reference.empty()
                                        ? "the engine's behaviour"
                                        : "the engine's behaviour (" + finding.reference + ")",
                                    policy_text);
}

void judge_as_unit_scale(const Context& ctx, report::Finding& finding) {
  judge(ctx, Category::precision, finding);
  // The scale finding carries the verdict; this one says why the cache is quantized.
  if (ctx.input.policy != KvPolicy::lossless && finding.severity == Severity::critical)
    finding.severity = Severity::warning;
  if (ctx.resolved.scale_source == engines::ScaleSource::unit_default) {
    finding.judged_on = fmt::format("{}the evidence of the fp8-unit-scale finding ({})",
                                    ctx.input.policy == KvPolicy::lossless
                                        ? "--kv-policy lossless (any quantized KV cache is "
                                          "critical); "
                                        : "",
                                    ctx.range.basis);
    std::erase_if(finding.evidence, [&](const Evidence& e) {
      return std::find_if(ctx.range.evidence.begin(), ctx.range.evidence.end(),
                          [&](const Evidence& r) {
                            return r.file == e.file && r.key == e.key && r.value == e.value;
                          }) != ctx.range.evidence.end();
    });
  }
}

}  // namespace kvaudit::audit
