// audit internals: the context every rule reads and the helpers they share. Private
// to src/audit/.
#pragma once

#include <fmt/format.h>

#include <optional>
#include <string>
#include <vector>

#include "audit/audit.h"

namespace kvaudit::audit {

// What is known about this model's K/V range under the scales the engine will use, from
// the strongest source available (see audit.h KvPolicy).
enum class RangeVerdict {
  damaging,  // the evidence shows damage beyond the data's threshold
  unknown,   // no evidence either way (or evidence of risk that is not proof)
  safe,      // the evidence shows no damage
};
struct RangeAssessment {
  RangeVerdict verdict = RangeVerdict::unknown;
  std::string basis = "none";  // "measured" | "bounded" | "published" | "none"
  std::string judged_on;       // the evidence and what is not known, with how to settle it
  std::vector<report::Evidence> evidence;
};

// How a finding's severity follows the policy.
enum class Category {
  broken,                 // will not start, corrupts, known-bad: critical under every policy
  scales_not_as_shipped,  // shipped scales dropped, one-sided, invalid, substituted format
  precision,              // a quantized cache whose damage depends on this model's range
};

struct Context {
  const CheckInput& input;
  const engines::ResolvedKv& resolved;
  std::vector<report::Finding>& findings;
  const RangeAssessment& range;
  const checkpoint::ModelFacts& model() const { return input.model; }
  const engines::LaunchFlags& flags() const { return input.flags; }
  const engines::EngineModel& engine() const { return *input.engine; }
  std::string data_file() const { return input.engine->file; }
  std::string engine_label() const;
  std::string launch_label() const { return flags().source.empty() ? "launch" : flags().source; }
  // "launch with --kv-cache-dtype X", spelled as this version's CLI spells the dtype.
  std::string fix_flag(const std::string& dtype) const;
  // "keep X only with calibrated scales", or why calibrating is no fix on this release.
  std::string keep_quantized_text(const std::string& dtype) const;
  // The release's KV dtype setting: "--kv-cache-dtype", or a config key where it has no flag.
  std::string setting_name() const;
  // Evidence for a launch field (engines' field names: "kv_cache_dtype", "dtype"): the file,
  // line and key path that set it when the launch was read from a file; the line of the
  // engine's command when the field was left to its default; else the launch's label.
  report::Evidence launch_evidence(const std::string& field, const std::string& key,
                                   const std::string& value) const;
};

// What a format does to values at scale 1.0: thresholds in real units.
struct FormatLimits {
  double max_finite;     // saturates here (CUDA __NV_SATFINITE)
  double overflow_nan;   // torch cast: NaN (E4M3) or inf (E5M2) from here
  double min_normal;     // below: subnormal, fewer mantissa bits
  double flush_to_zero;  // at or below: stored as 0
  bool nan_not_inf;      // the overflow gives NaN (no inf in the format)
};
std::optional<FormatLimits> limits_of(const engines::KvDtype* dtype);

// The range evidence for the quantized attention layers (evidence.cpp).
RangeAssessment assess_kv_range(const CheckInput& input, const engines::ResolvedKv& resolved);
// The severity of a finding of `category` under the input's policy; precision findings
// follow the range verdict. Also stamps the finding's basis and judged_on.
void judge(const Context& ctx, Category category, report::Finding& finding);
// For a finding that explains the scale-1.0 cache another finding judges: the same
// severity rules, and a judged_on that points there instead of repeating the evidence.
void judge_as_unit_scale(const Context& ctx, report::Finding& finding);
// What the engine's own behaviour (a rule read in its source) rests on, for judged_on.
std::string engine_basis_text(const engines::Provenance& provenance);

std::string float_text(double value);
std::string names_preview(const std::vector<std::string>& names, size_t shown = 3);
std::vector<int> attention_layers(const checkpoint::ModelFacts& model);

// Evidence that a rule's version bound was inferred, and the reference with its status.
void add_provenance(const Context& ctx, const engines::Provenance& provenance,
                    std::vector<report::Evidence>& evidence);
std::string reference_text(const engines::Provenance& provenance);

// The rule families (rules.cpp: dtype and launch; scale_rules.cpp: scales).
void rule_startup_failures(Context& ctx);
void rule_auto_quantized(Context& ctx);
void rule_e5m2(Context& ctx);
void rule_quant_configs_disagree(Context& ctx);
void rule_dtype_hazards(Context& ctx);
void rule_fp16_serving(Context& ctx);
void rule_skip_layers(Context& ctx);
void rule_hybrid_state(Context& ctx);
void rule_context_length(Context& ctx);
void rule_flag_lifecycle(Context& ctx);
void rule_unknown_architecture(Context& ctx);
void rule_version(Context& ctx);
void rule_lossless_policy(Context& ctx);
void rule_known_bad(Context& ctx);
void rule_tier_hazards(Context& ctx);  // tier_rules.cpp
void rule_platform_substitution(Context& ctx);
void rule_draft_kv(Context& ctx);
void rule_unit_scale(Context& ctx);
void rule_nvfp4_global_scale(Context& ctx);
void rule_dropped_scales(Context& ctx);
void rule_scales_ignored(Context& ctx);
void rule_scale_values(Context& ctx);
void rule_one_sided(Context& ctx);
void rule_param_path(Context& ctx);
void rule_misleading_warning(Context& ctx);
void rule_modelopt_kv_cast(Context& ctx);

}  // namespace kvaudit::audit
