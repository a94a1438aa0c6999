// audit: turns what the checkpoint says (ModelFacts), what the launch asks for
// (LaunchFlags) and what the engine will do (ResolvedKv) into findings with
// evidence, consequence, fix and reference; and builds the `check` report.
// It decides nothing about engines itself: that is engines/ and its data.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "engines/engines.h"
#include "report/report.h"

namespace kvaudit::audit {

// ---------------------------------------------------------------- intent and evidence

// What the user wants from the KV cache (--kv-policy).
//   lossless:   any quantized KV cache is critical, whatever the evidence ("context should
//               use no quantization").
//   evidence:   (the default) critical when scales the checkpoint ships are not applied as
//               shipped, when the evidence shows damage beyond the data's threshold, or when
//               a known-bad combination applies; a quantized cache with no evidence either
//               way is a warning that says what would settle it, one with evidence of no
//               damage is a note.
//   permissive: critical only for broken combinations and start-up failures.
enum class KvPolicy { lossless, evidence, permissive };
std::string_view kv_policy_name(KvPolicy policy);
std::optional<KvPolicy> parse_kv_policy(std::string_view text);

// K/V maxima measured on this model (calibrate --stats-out, or the same format written by
// a collection on the serving GPUs): absolute maxima of K as cached (after QK-norm and
// RoPE) and of V, per attention layer.
struct MeasuredKvRange {
  std::string source;  // the statistics file
  int64_t tokens = 0;  // tokens the maxima were taken over (0: not stated)
  struct Layer {
    int layer = 0;
    float k_amax = 0, v_amax = 0;
  };
  std::vector<Layer> layers;
};

// Published damage of a KV format on a model family (data/evidence/kv_damage.json).
enum class Damage { none, minor, damaging, catastrophic };
std::string_view damage_name(Damage damage);
struct PublishedMeasurement {
  std::string id;
  std::vector<std::string> model_types;  // config model_type globs ("qwen3_moe", "qwen2*")
  std::vector<std::string> models;       // the models measured, for people
  std::string kv_dtype;                  // canonical dtype measured
  std::string scales;                    // "unit" | "calibrated" | "dynamic" | "any"
  std::string engine;                    // where it was measured
  std::string measured_on;               // GPU and backend, as published, for people
  // Set when the result belongs to one GPU architecture or attention backend: the row then
  // applies only to launches known to run there ("" = not specific).
  std::string only_gpu_arch, only_backend;
  int64_t context_tokens = 0;  // measured at this context: applies to launches this long (0: any)
  std::string metric;
  std::optional<double> baseline, quantized, recovery;  // recovery = quantized / baseline
  Damage damage = Damage::none;
  bool within_noise = false;  // below the threshold, but the source puts it within its noise
  std::string damage_basis;   // why the damage call, where no recovery figure gives it
  std::string reference, date;
  std::string cite;  // the reference in a few words, for sentences ("vLLM FP8 KV blog, 2026-04-22")
  std::string note;
};
struct PublishedEvidence {
  std::string file;
  double recovery_threshold = 0.95;  // below: damaging
  std::string threshold_reference, threshold_cite;
  std::vector<PublishedMeasurement> measurements;
};
// Loads and lints the published-damage table (InputError naming the file and key).
// The dtypes it names must be canonical in `dtypes`.
PublishedEvidence load_published_evidence(const std::filesystem::path& file,
                                          const engines::DtypeVocabulary& dtypes);

struct CheckInput {
  checkpoint::ModelFacts model;
  engines::LaunchFlags flags;
  const engines::EngineModel* engine = nullptr;  // the registry's model of flags.engine
  bool version_given = false;                    // false: judged against the latest known behaviour
  double read_seconds = 0;                       // time spent reading the checkpoint
  KvPolicy policy = KvPolicy::evidence;
  std::optional<MeasuredKvRange> measured;       // --kv-stats
  const PublishedEvidence* published = nullptr;  // data/evidence/kv_damage.json
  std::string gpu_name;  // --gpu, for the report (its arch and platform are in flags)
  // The checkpoint's scale tensors are stand-ins (decide's preview of a calibration), not
  // evidence of this model's range.
  bool scales_are_stand_ins = false;
};

struct CheckResult {
  engines::ResolvedKv resolved;
  std::vector<report::Finding> findings;  // most severe first
};

// Every rule, in a fixed order. Each rule is a plain function of the inputs.
CheckResult run_check(const CheckInput& input);

// Rule ids, so tests can assert that each rule fires and does not fire.
std::vector<std::string> rule_ids();

// The fp8-unit-scale finding's consequence, fix and reference for a release and dtype:
// check and logs report the same finding with the same words (logs adds its own title
// and evidence: the lines that prove the fallback).
struct UnitScaleText {
  std::string consequence;
  std::string fix;
  std::string reference;
};
// The fix text reads the model when given (an engine that never uses checkpoint scales for
// this dtype gets no "calibrate" advice).
UnitScaleText unit_scale_text(const engines::EngineModel& engine, const engines::Version& version,
                              const std::string& kv_cache_dtype,
                              const checkpoint::ModelFacts* model = nullptr);

enum class FailOn { critical, warning, never };
// True when some finding is at or above the gate.
bool fails_gate(const std::vector<report::Finding>& findings, FailOn fail_on);

report::Report to_report(const CheckInput& input, const CheckResult& result);

// ---------------------------------------------------------------- a disaggregated pair

// The side a launch plays in prefill/decode disaggregation: "prefill", "decode" or ""
// (SGLang's --disaggregation-mode; vLLM's --kv-transfer-config kv_role kv_producer /
// kv_consumer).
std::string transfer_role(const engines::LaunchFlags& flags);

// One launch of a file (a manifest, a compose file) as check resolved it.
struct TransferSide {
  std::string workload;  // which launch of the file
  std::string engine;
  std::string role;            // transfer_role
  std::string kv_cache_dtype;  // resolved
  std::string dtype;           // the model --dtype as launched ("" auto)
};
// The prefill and decode launches of one file compared: pages move between them as raw
// bytes, so a pair that runs different KV dtypes (or model dtypes) corrupts what it
// transfers. A finding per mismatched pair (`kv-transfer-dtype-mismatch`; critical for SGLang,
// whose transfer path converts nothing and checks nothing, sglang PR #19398; a warning for
// engines whose connector's check was not read), and a note per matched one.
struct TransferPairCheck {
  std::vector<report::Finding> findings;
  std::vector<std::string> notes;
};
TransferPairCheck check_transfer_pairs(const std::vector<TransferSide>& sides,
                                       const std::string& file);

}  // namespace kvaudit::audit
