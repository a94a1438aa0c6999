// The lint across a loaded engine model's rules: what no single rule can show (ids used
// twice, log templates that do not exist, per-version tables with gaps or overlaps).

#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "engines/internal.h"
#include "util/util.h"

namespace kvaudit::engines {

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
  for (const auto& r : model.tier_hazards) add_range(r.versions);
  for (const auto& r : model.capacity.mem_fraction_tables) add_range(r.versions);
  std::sort(out.begin(), out.end(), [](const Version& a, const Version& b) {
    return VersionRange{"", {{VersionRange::Op::lt, b}}}.contains(a);
  });
  return out;
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
  for (const auto& r : model.tier_hazards) unique("tier_hazards", r.id);
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

}  // namespace kvaudit::engines
