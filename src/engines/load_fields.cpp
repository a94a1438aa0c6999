// The fields every rule of the engine data carries, read with the lint's checks: version
// ranges, the provenance and its audit record, the model a rule matches, canonical dtypes.

#include <fmt/format.h>

#include <algorithm>

#include "engines/internal.h"
#include "util/util.h"

namespace kvaudit::engines {

namespace {

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

}  // namespace

VersionRange read_range(JsonReader& r, std::string_view key) {
  std::string text = r.string(key);
  auto range = parse_version_range(text);
  if (!range)
    r.fail(key, fmt::format("cannot read version range '{}' (expected e.g. \">=0.5.10 <0.5.20\" "
                            "with full x.y.z bounds, or \"*\")",
                            text));
  return *range;
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

}  // namespace kvaudit::engines
