// The published table (data/evidence/kv_damage.json): measured damage of quantized KV caches
// per model family, loaded with the lint that keeps each damage call on its threshold.
#include <fmt/format.h>

#include <set>

#include "audit/internal.h"
#include "util/json.h"
#include "util/util.h"

namespace kvaudit::audit {

std::string_view damage_name(Damage damage) {
  switch (damage) {
    case Damage::none:
      return "none";
    case Damage::minor:
      return "minor";
    case Damage::damaging:
      return "damaging";
    case Damage::catastrophic:
      return "catastrophic";
  }
  return "?";
}

PublishedEvidence load_published_evidence(const std::filesystem::path& file,
                                          const engines::DtypeVocabulary& dtypes) {
  PublishedEvidence out;
  out.file = display_path(file);
  nlohmann::json document = read_json_file(file, 1 << 20);
  JsonReader top(document, out.file);
  if (top.integer("schema_version") != 1) top.fail("schema_version", "expected 1");
  top.allow_descriptive({"notes", "checked"});
  JsonReader threshold = top.object("threshold");
  out.recovery_threshold = threshold.number("recovery_below");
  if (!(out.recovery_threshold > 0.5 && out.recovery_threshold <= 1.0))
    threshold.fail("recovery_below", "must lie in (0.5, 1]");
  out.threshold_reference = threshold.string("reference");
  out.threshold_cite = threshold.string("cite");
  threshold.allow_descriptive({"quote"});
  threshold.finish();
  std::set<std::string> ids;
  for (JsonReader& r : top.objects("measurements")) {
    PublishedMeasurement m;
    m.id = r.string("id");
    if (!ids.insert(m.id).second) r.fail("id", "is used twice");
    m.model_types = r.strings("model_types");
    if (m.model_types.empty()) r.fail("model_types", "name at least one config model_type");
    m.models = r.strings("models");
    m.kv_dtype = r.string("kv_dtype");
    if (!dtypes.find(m.kv_dtype) || dtypes.normalise(m.kv_dtype) != m.kv_dtype)
      r.fail("kv_dtype", fmt::format("'{}' is not a canonical dtype of dtypes.json", m.kv_dtype));
    m.scales = r.string("scales");
    if (m.scales != "unit" && m.scales != "calibrated" && m.scales != "dynamic" &&
        m.scales != "any")
      r.fail("scales", "expected unit, calibrated, dynamic or any");
    m.engine = r.string("engine");
    m.measured_on = r.string_or("measured_on", "");
    if (auto only = r.optional_object("platform_specific")) {
      m.only_gpu_arch = only->string_or("gpu_arch", "");
      m.only_backend = only->string_or("backend", "");
      only->finish();
      if (m.only_gpu_arch.empty() && m.only_backend.empty())
        r.fail("platform_specific", "name a gpu_arch or a backend");
    }
    m.context_tokens = r.integer_or("context_tokens", 0);
    m.metric = r.string("metric");
    m.baseline = r.optional_number("baseline");
    m.quantized = r.optional_number("quantized");
    m.recovery = r.optional_number("recovery");
    if (!m.recovery && m.baseline && m.quantized && *m.baseline > 0)
      m.recovery = *m.quantized / *m.baseline;
    const std::string damage = r.string("damage");
    bool known = false;
    for (Damage d : {Damage::none, Damage::minor, Damage::damaging, Damage::catastrophic})
      if (damage_name(d) == damage) m.damage = d, known = true;
    if (!known) r.fail("damage", "expected none, minor, damaging or catastrophic");
    m.within_noise = r.boolean_or("within_noise", false);
    m.damage_basis = r.string_or("damage_basis", "");
    m.note = r.string_or("note", "");
    // The damage call follows the threshold whenever a recovery is given; without one the
    // row must say what the call rests on.
    if (m.recovery) {
      const bool below = *m.recovery < out.recovery_threshold;
      if (below && m.damage <= Damage::minor && !m.within_noise)
        r.fail("damage", fmt::format("recovery {:.3f} is below the threshold {} but the row says "
                                     "{} (set within_noise, with a note, if the source says so)",
                                     *m.recovery, out.recovery_threshold, damage));
      if (!below && m.damage >= Damage::damaging)
        r.fail("damage", fmt::format("recovery {:.3f} keeps the threshold {} but the row says {}",
                                     *m.recovery, out.recovery_threshold, damage));
      if (m.within_noise && m.note.empty())
        r.fail("note", "within_noise needs the source's words in the note");
    } else if (m.damage_basis.empty()) {
      r.fail("damage_basis", "a row without a recovery figure must say what its call rests on");
    }
    m.reference = r.string("reference");
    m.cite = r.string("cite");
    m.date = r.string("date");
    r.finish();
    out.measurements.push_back(std::move(m));
  }
  top.finish();
  return out;
}

}  // namespace kvaudit::audit
