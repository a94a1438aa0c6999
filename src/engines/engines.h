// engines: the one model of what SGLang and vLLM do with the KV cache, read from
// data/engines/ (dtypes.json: the KV dtype vocabulary; <engine>.json: per version
// range, dtype choices, auto resolution, scale names loaded or dropped, fallback
// semantics and start-up aborts, removed flags, defaults, the engine's own log
// messages; capacity/<engine>.json: sizing constants). Every file is linted when it
// loads (unknown keys, bad version ranges, unknown dtypes or conventions, log
// templates that do not compile are one-line errors). The small generic code that
// applies it lives here too: launch-command parsing, version ranges, dtype
// resolution, which scales load, what aborts start-up. Knows engines, not findings.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "numerics/numerics.h"

namespace kvaudit::engines {

// ---------------------------------------------------------------- versions

struct Version {
  static constexpr int kFinal = 1 << 20;  // `pre` of a final release: after its candidates
  int major = 0, minor = 0, patch = 0;
  bool latest = false;  // "latest" / unspecified: newer than every known release
  int pre = kFinal;     // release candidate N ("1.3.0rc7": 7), which sorts before 1.3.0
  auto operator<=>(const Version&) const = default;
};
// "0.5.9", "v0.5.9", "0.5.9.post1", "1.3.0rc7", "0.5" and "0.5.x" (= highest 0.5), "latest"
// or "".
std::optional<Version> parse_version(std::string_view text);
std::string version_text(const Version& version);

// ">=0.4.0 <0.5.10", "*", "<0.11.0": space-separated comparisons, all must hold.
struct VersionRange {
  enum class Op { ge, gt, le, lt, eq };
  struct Clause {
    Op op = Op::eq;
    Version bound;
  };
  std::string text = "*";
  std::vector<Clause> clauses;  // empty: every version
  bool contains(const Version& version) const;
};
std::optional<VersionRange> parse_version_range(std::string_view text);  // nullopt: malformed
// Convenience for one-off checks; a malformed range contains nothing.
bool version_in_range(const Version& version, std::string_view range);

// ---------------------------------------------------------------- provenance

// Where a rule comes from. `verified` is false when its version bound was inferred
// (from merge or release dates) rather than read in a release; findings say so.
enum class RuleStatus { code, merged, open, closed_unmerged };
std::string_view rule_status_name(RuleStatus status);  // for people: "read in the engine's source"
std::string_view rule_status_id(RuleStatus status);    // in the data and JSON: "code", "merged"
// The audit of one rule: re-read at its source, and what that found. Every rule carries
// one (the loader refuses a rule without), so a reader sees when a fact was last checked
// and where. A behaviour rests on released code, a merged PR, an issue that reports a bug
// in released code, or a real log of a release; an open PR is a lead, never a source.
enum class AuditVerdict { confirmed, corrected, stale, unverifiable, added };
std::string_view audit_verdict_name(AuditVerdict verdict);
enum class SourceKind { release_code, merged_pr, issue_report, release_log, docs };
std::string_view source_kind_name(SourceKind kind);
struct RuleAudit {
  AuditVerdict verdict = AuditVerdict::confirmed;
  std::string checked;  // the date it was last re-read, "2026-12-01"
  std::string read;     // "path@commit function: fact", "PR #N (merged ...)", "issue #N"
  SourceKind source = SourceKind::release_code;
  std::string release;  // why what was read is on the release line ("" when not shown)
  std::string note;     // what the audit changed, for corrected / stale / added rules
};

struct Provenance {
  std::string reference;  // source path + function, PR or issue
  RuleStatus status = RuleStatus::code;
  bool verified = true;
  std::string bound;  // how the version bound is known, when it is not verified
  RuleAudit audit;
};

// ---------------------------------------------------------------- dtype vocabulary

// How a KV dtype gets its scales.
enum class ScaleSemantics {
  none,                    // 16/32-bit: no scales
  static_per_tensor,       // one k and one v scale per layer, from the checkpoint (else 1.0)
  nvfp4_global,            // NVFP4: checkpoint k/v scale is a global second level; blocks dynamic
  dynamic_block,           // block scales computed at cache write (MX, SGLang FP4 block16)
  dynamic_per_token_head,  // a scale per (token, head), computed at cache write, stored inline
  packed_dynamic,          // packed layouts with their own dynamic scales (TurboQuant, DS MLA)
};
std::string_view scale_semantics_name(ScaleSemantics semantics);

// One KV dtype: its canonical name (used across kvaudit), every other spelling it goes
// by (CLI values, torch names, log spellings), and its storage layout.
struct KvDtype {
  std::string name;                    // "bf16", "fp8_e4m3", "nvfp4", "int8_per_token_head"
  std::vector<std::string> spellings;  // "bfloat16", "torch.bfloat16", "float8_e4m3fn", ...
  std::string torch_dtype;             // storage dtype as torch names it
  numerics::ElementType element = numerics::ElementType::bf16;  // K element (V unless v_element)
  std::optional<numerics::ElementType> v_element;               // when V is stored differently
  int key_bits = 16;         // storage bits per K element (packed layouts: their effective bits)
  int value_bits = 16;       // storage bits per V element
  int block_elements = 0;    // one block scale per this many elements (0: none)
  int block_scale_bits = 0;  // bits of each block scale
  std::string block_scale_format;           // how a block scale is encoded ("ue8m0", "fp8_e4m3")
  int scale_bytes_per_token_head = 0;       // inline per-(token, head) scales, K and V each
  int fixed_mla_bytes_per_token_layer = 0;  // packed MLA layouts (fp8_ds_mla: 656)
  bool mla_only = false;  // a layout of the MLA latent: not offered for other attention
  ScaleSemantics scales = ScaleSemantics::none;
  bool quantized = false;  // narrower than 16 bits: accuracy depends on scales or layout
  std::string description;
  std::string reference;  // where its layout was read
};

// The vocabulary of data/engines/dtypes.json (linted when loaded): every module that
// names a dtype asks here, through the registry it was given.
class DtypeVocabulary {
 public:
  DtypeVocabulary() = default;
  explicit DtypeVocabulary(std::vector<KvDtype> dtypes) : dtypes_(std::move(dtypes)) {}
  const std::vector<KvDtype>& all() const { return dtypes_; }
  // By canonical name or any spelling, case-insensitively, "torch." prefix optional.
  const KvDtype* find(std::string_view spelling) const;
  // Canonical name of a spelling; "auto" stays "auto"; "" when unknown.
  std::string normalise(std::string_view spelling) const;
  // True for a quantized KV dtype (false for 16/32-bit, "auto" and unknown spellings).
  bool is_quantized(std::string_view spelling) const;

 private:
  std::vector<KvDtype> dtypes_;
};
// Storage bits of one token's K and V for one head: data, block scales and inline
// per-(token, head) scales. Exact (an integer count of bits).
int64_t kv_bits_per_head(const KvDtype& dtype, int64_t k_head_dim, int64_t v_head_dim);

// ---------------------------------------------------------------- engine model

// What the checkpoint must look like for a rule to apply. Empty lists match anything.
struct QuantMatch {
  std::vector<std::string> quant_methods;  // globs: "modelopt*"; "none": no quantization config
  std::vector<std::string> kv_cache_quant_algos;  // compared upper-case; "*": any declared
  std::optional<bool> kv_cache_scheme;            // a compressed-tensors kv_cache_scheme present
  std::optional<int> scheme_bits;
  std::optional<bool> scheme_dynamic;          // the scheme's "dynamic" is exactly this
  std::string scheme_type;                     // "float" / "int"
  std::vector<std::string> scheme_strategies;  // "tensor", "attn_head"
  std::vector<std::string> architectures;      // architectures[0], globs
  std::vector<std::string> weight_algos;
  std::optional<bool> hybrid;  // has linear-attention (GDN/Mamba) layers
  bool matches(const checkpoint::ModelFacts& model) const;
  bool empty() const {
    return quant_methods.empty() && kv_cache_quant_algos.empty() && !kv_cache_scheme &&
           !scheme_bits && !scheme_dynamic && scheme_type.empty() && scheme_strategies.empty() &&
           architectures.empty() && weight_algos.empty() && !hybrid;
  }
};

struct DtypeChoice {
  std::string value;  // as typed on the CLI
  std::string dtype;  // canonical dtype, or "auto"
};
struct StartupAbort {
  std::string id;
  std::string message;  // the engine's error, verbatim
  Provenance provenance;
};
struct DtypeChoices {
  VersionRange versions;
  std::vector<DtypeChoice> accepted;
  // Values argparse accepts that then stop start-up (value -> error).
  std::map<std::string, StartupAbort> aborts;
  Provenance provenance;
};

enum class AutoApplies { auto_only, any_request };
struct AutoRule {
  std::string id;
  VersionRange versions;
  AutoApplies applies = AutoApplies::auto_only;
  QuantMatch when;
  std::string resolves_to;  // canonical dtype, or "model_dtype"
  std::string reason;
  std::string log_message;  // template id the engine logs when this rule applies ("" none)
  Provenance provenance;
};

// Which scale tensors of a naming convention (checkpoint::scale_conventions) an
// engine's loaders map onto the attention layers.
struct ScaleNameRule {
  std::string id;
  VersionRange versions;
  std::vector<std::string> conventions;
  bool loaded = true;
  QuantMatch when;  // narrows to some checkpoints (architectures, methods)
  // Only for these resolved KV dtypes (empty: any): TensorRT-LLM's PyTorch backend loads
  // ModelOpt scales for NVFP4 and leaves FP8 layers at 1.0.
  std::vector<std::string> dtypes;
  std::string reason;
  std::string log_message;  // template id the engine logs when it drops them
  Provenance provenance;
};

// Scale parameters exist only when the quantization config creates a KV-cache method.
struct KvMethodRule {
  std::string id;
  VersionRange versions;
  std::vector<std::string> quant_methods;  // methods that create one (globs)
  std::string reason;
  Provenance provenance;
};

// A lone k (or v) scale: used for both (BaseKVCacheMethod's max(k, v)), a start-up
// assertion, or kept for its side only while the other stays at its initial 1.0
// (vLLM CompressedTensorsKVCacheMethod copies loaded values verbatim).
enum class OneScaleRule { present_for_both, startup_error, other_side_unit };
// An exact 0.0 scale: read as missing (SGLang's <= 0 test), a start-up assertion (vLLM
// base: neither present nor missing), or copied as is (the cache then divides by zero).
enum class ZeroScaleRule { missing, startup_error, used_as_is };
enum class NonScalarRule { startup_error, per_head_for_ct_attn_head };
struct FallbackRule {
  VersionRange versions;
  QuantMatch when;  // the quantization method whose KV-cache method this is (empty: the rest)
  double both_missing_scale = 1.0;
  std::string both_missing_message;  // template id logged when both fall back ("" silent)
  OneScaleRule k_only = OneScaleRule::present_for_both;
  OneScaleRule v_only = OneScaleRule::startup_error;
  std::string one_missing_error;  // verbatim, for the startup_error cases
  ZeroScaleRule zero = ZeroScaleRule::missing;
  std::string zero_error;
  NonScalarRule non_scalar = NonScalarRule::startup_error;
  std::string non_scalar_error;
  Provenance provenance;
};

// A warning the engine prints about scales, predicted from the resolution.
struct ScaleWarningRule {
  std::string id;
  VersionRange versions;
  std::vector<std::string> dtypes;  // resolved canonical dtypes it fires for
  QuantMatch when;                  // the checkpoints whose KV method prints it (empty: any)
  // The engine tests the requested string, not the resolved dtype (an auto-enabled cache
  // does not trigger it).
  bool when_requested_explicitly = false;
  bool when_no_quantization_param_path = false;
  bool when_unit_scale = false;  // only when the scales in effect are 1.0
  std::string log_message;       // template id
  std::string meaning;
  Provenance provenance;
};

struct FlagRule {  // a launch flag with a life cycle
  std::string id;
  std::string flag;                  // "--calculate-kv-scales"
  VersionRange exists;               // releases that accept it
  VersionRange deprecated;           // subset of exists that warns
  VersionRange disabled_for_hybrid;  // releases that ignore it on GDN/Mamba hybrids
  std::string hybrid_hazard;         // what it does to hybrids where it is not disabled
  std::string removed_error;         // what a release without it says
  std::string meaning;
  Provenance provenance;
};

struct ParamPathRule {  // SGLang --quantization-param-path
  std::string id;
  VersionRange versions;
  enum class Effect { not_applied, startup_error_without_loader } effect = Effect::not_applied;
  std::vector<std::string> dtypes;  // resolved dtypes it applies to (empty: every quantized)
  std::vector<std::string> architectures_with_loader;  // for startup_error_without_loader
  std::string message;
  std::string reason;
  Provenance provenance;
};

// Start-up aborts that depend on the checkpoint (and, when given, the requested dtype).
struct CheckpointAbort {
  std::string id;
  VersionRange versions;
  std::vector<std::string> requested;   // canonical dtypes requested explicitly; empty: any
  bool requires_scale_tensors = false;  // only when the checkpoint ships KV scale tensors
  QuantMatch when;
  std::string message;
  Provenance provenance;
};

// A dtype that is accepted but known to corrupt on some models.
struct DtypeHazard {
  std::string id;
  VersionRange versions;
  std::vector<std::string> dtypes;
  std::vector<std::string> model_dtypes;  // the served model dtype it bites
  std::string consequence;
  Provenance provenance;
};

// A combination the engines' trackers report as broken, which no scale rule can see: the
// kernels, layouts or scale delivery are wrong there. Engine release x attention backend x
// GPU architecture x KV dtype x model family -> consequence.
struct KnownBad {
  std::string id;
  VersionRange versions;
  std::vector<std::string> kv_dtypes;   // canonical dtypes it hits (empty: any quantized)
  std::vector<std::string> backends;    // attention backends, globs (empty: any)
  std::vector<std::string> gpu_archs;   // "sm100", "sm12*", "gfx942" (empty: any)
  QuantMatch when;                      // the model family and checkpoint it hits
  bool requires_scale_tensors = false;  // only when the checkpoint ships KV scale tensors
  std::string consequence;              // what it does, with the figures measured
  std::string fixed_in;                 // the first release with the fix ("" when open)
  Provenance provenance;
};

// The attention backend a release picks when the launch names none (for known-bad
// combinations that need one).
struct DefaultBackend {
  VersionRange versions;
  std::vector<std::string> gpu_archs;  // globs
  std::vector<std::string> kv_dtypes;  // empty: any
  std::optional<bool> mla;             // the model's attention is MLA
  std::string backend;
  Provenance provenance;
};

// A KV dtype the platform replaces by another (SGLang on ROCm turns fp8_e5m2 into the
// platform FP8; MI300-class parts store E4M3 as E4M3FNUZ, max 240).
struct PlatformSubstitution {
  std::string id;
  VersionRange versions;
  std::string platform;                // "rocm"
  std::vector<std::string> gpu_archs;  // globs (empty: every GPU of the platform)
  std::vector<std::string> requested;  // canonical dtypes it replaces
  std::string becomes;                 // canonical dtype stored instead
  bool silent = true;                  // no log line says so
  std::string consequence;
  Provenance provenance;
};

// The recurrent-state dtype a release gives a model family under the default (vLLM's
// per-model hooks: Qwen3-Next BF16, NemotronH float32, Qwen3.5 from its config).
struct StateDtypeRule {
  std::string id;
  VersionRange versions;
  QuantMatch when;           // architectures
  std::string ssm_dtype;     // a dtype, "from_model_config" or "model_dtype"
  std::string ssm_fallback;  // from_model_config without one in the config ("": release's)
  std::string conv_dtype;    // "" keeps the release default
  Provenance provenance;
};

// What KV dtype a speculative draft model's cache runs.
struct DraftKvRule {
  std::string id;
  VersionRange versions;
  bool follows_target = true;  // the drafter uses the target's --kv-cache-dtype
  std::string override_flag;   // the flag that gives the drafter its own ("" none)
  std::string consequence;
  Provenance provenance;
};

// How many mamba state slots SGLang holds per running request (its "mamba ratio"), which
// caps max_running_requests at max_mamba_cache_size / slots. Per strategy with the radix
// cache on ("radix_off": --disable-radix-cache), adjusted by the deltas under the launch's
// conditions: overlap scheduling off, speculative decoding, SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK.
struct MambaSlotRules {
  VersionRange versions;
  std::string default_strategy;      // "no_buffer", "auto", ...
  std::map<std::string, int> slots;  // strategy -> slots per request
  std::map<std::string, int> no_overlap_delta, spec_delta, skip_decode_lock_delta;
  Provenance provenance;
};

// What decided the slots per request of one launch.
struct MambaSlotInputs {
  std::string strategy;  // as given ("" : the release's default)
  bool disable_radix_cache = false;
  bool disable_overlap_schedule = false;
  bool speculative = false;
  bool skip_decode_lock = false;  // SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK=1
};
struct MambaSlotsPerRequest {
  int slots = 1;
  std::string strategy;    // after resolving "auto" and the default
  std::string derivation;  // one line: which rule and which deltas applied
};
// Throws InputError("--mamba-radix-cache-strategy") for a strategy the release lacks.
MambaSlotsPerRequest resolve_mamba_slots(const MambaSlotRules& rules, const MambaSlotInputs& in);

// Engine defaults per version range (absent optional: no default, or computed).
struct EngineDefaults {
  VersionRange versions;
  std::optional<double> memory_fraction;  // vLLM gpu_memory_utilization; SGLang: computed
  std::optional<double> mamba_full_memory_ratio;
  std::string mamba_ssm_dtype;  // "from_model_config" or a dtype ("float32")
  std::string mamba_ssm_dtype_fallback = "float32";
  std::string mamba_conv_dtype;  // "bfloat16"
  std::vector<std::string> mamba_ssm_dtype_choices;
  std::optional<int> page_size;
  // SGLang sets this page size for DeepSeek DSA/NSA models (a lightning indexer) on CUDA,
  // whatever --page-size said ("Setting page size to 64 for DeepSeek NSA/DSA.").
  std::optional<int> dsa_page_size;
  std::optional<double> swa_full_tokens_ratio;
  bool fp4_dequant_workspace = false;  // SGLang FP4 prefill: one shared FP8 dequant buffer
  double mm_reservation_mib = 0;       // SGLang: KV budget held back for multimodal models
  Provenance provenance;
};

// The recurrent-state dtype a release runs a hybrid with: the launch flag, else the
// release's default, which may be "read it from the model config" (then the config's
// mamba_ssm_dtype, else the release's fallback).
struct MambaSsmDtype {
  std::string dtype;   // as spelled by its source ("float32", "bfloat16")
  std::string origin;  // "launch flag" | "model config" | "engine fallback" | "engine default"
};
MambaSsmDtype resolve_mamba_ssm_dtype(const EngineDefaults& defaults, const std::string& flag,
                                      const std::string& config_dtype);

// ---------------------------------------------------------------- log messages

// What a recognised line tells about its launch (logs/ decides what to do with it).
enum class LogKind {
  launch_args,           // server_args=ServerArgs(...) / non-default args
  engine_version,        // vLLM API server version
  engine_config,         // vLLM "Initializing ... engine (v...) with config: ..."
  load_begin,            // memory before weights
  load_end,              // memory after weights, model dtype
  weights_loaded,        // vLLM weight memory
  kv_dtype_used,         // the KV dtype the engine stores
  kv_pool_allocated,     // SGLang pool: dtype, tokens, sizes
  state_pool_allocated,  // Mamba/GDN state pool
  swa_pool,              // sliding-window pool split
  token_summary,         // SGLang max_total_num_tokens=...
  memory_pool_end,
  available_kv_memory,  // vLLM
  kv_cache_size,        // vLLM GPU KV cache size / max concurrency
  max_concurrency,
  gpu_blocks,           // vLLM V0
  scale_unit_fallback,  // the engine says it uses 1.0 (definitive)
  scale_warning,        // a scale warning that does not prove a fallback (SGLang #31224)
  scale_not_loaded,     // checkpoint scale names dropped
  scales_loaded,        // scales loaded from a file
  nvfp4_unit_global,    // NVFP4 global scale 1.0
  ready,
  startup_error,  // the engine's own error text
  deprecation,
  flag_ignored,    // a flag the engine disables for this model
  dtype_fallback,  // the engine fell back to auto for a declaration it does not know
  // A start-up line that marks progress (CUDA graph capture, distributed init): it shows
  // which ranks are alive and may name a launch setting (fields named like the setting).
  startup_progress,
  // The KV dtype the launch asked for, named by the engine (TensorRT-LLM "Validating KV
  // Cache config against kv_cache_dtype=...": it never names the resolved one).
  kv_dtype_requested,
  // The engine lowered max_running_requests (SGLang: by the mamba state cache, or by the
  // KV cache): the cap in effect, what it was asked, the state slots and slots per request.
  running_requests_capped,
  // A configuration line that names a launch setting, printed before anything loads (vLLM's
  // "Chunked prefill is enabled with max_num_batched_tokens=N"): read, with no stage, so it
  // never opens a launch of its own.
  launch_setting,
  // A KV tier the launch set up besides the GPU pool: SGLang's HiCache host pool (its size
  // per rank), vLLM's KV connector (its class). No stage: a tier is built while loading.
  kv_tier,
};
std::string_view log_kind_name(LogKind kind);

// One log message as the engine writes it: its format string verbatim (printf `%s`,
// `%d`, `%.2f` or Python `{}`, `{name}`, `{x:.2f}`, `{n:,}` placeholders), the fields
// its placeholders carry, and the releases that print it.
struct LogTemplate {
  std::string id;
  VersionRange versions;
  LogKind kind = LogKind::ready;
  std::string text;
  std::vector<std::string> fields;  // one per placeholder, in order ("" to ignore one)
  Provenance provenance;
  // The engine prints this line more than once per launch and the last one holds
  // (TensorRT-LLM allocates a small estimation cache, profiles, then the real one).
  bool last_wins = false;
  std::string anchor;  // longest literal run, for the line pre-filter
  std::shared_ptr<const struct CompiledTemplate> compiled;
};
// Captured placeholder texts, in template order, when `message` contains the template.
std::optional<std::vector<std::string>> match_log_template(const LogTemplate& log,
                                                           std::string_view message);
// The field names log templates may carry (the logs module reads each).
const std::vector<std::string>& log_field_names();
// Fields that hold a number (GiB, counts, fractions): their placeholders match numbers only.
bool is_numeric_log_field(std::string_view name);

// ---------------------------------------------------------------- capacity

// SGLang's default --mem-fraction-static (server_args.py _handle_gpu_memory_settings).
struct MemFractionTier {
  double below_mib = 0;
  int chunked_prefill_size = 0;
  int cuda_graph_bs_tp_lt4 = 0;
  int cuda_graph_bs_tp_ge4 = 0;
};
struct MemFractionTable {
  VersionRange versions;
  std::vector<MemFractionTier> tiers;
  double reserved_constant_mib = 0;
  double activation_mib_per_prefill_token = 0;
  int activation_min_tokens = 0;
  double cuda_graph_mib_per_batch = 0;
  double parallel_mib_per_rank_over_8 = 0;
  double dp_attention_mib_per_batch_per_dp = 0;
  double large_gpu_threshold_mib = 0;
  double large_gpu_min_reserved_mib = 0;
  int round_decimals = 3;
  std::string caveats;
  Provenance provenance;
};

struct CapacityData {
  // Which pool model plan applies (a name of plan's pool-model table, checked there:
  // "sglang_token_pool", "vllm_block_pool", "trtllm_fraction_pool"), not an engine name.
  std::string model;
  std::string file;
  std::vector<std::string> plan_default_dtypes;
  std::vector<MemFractionTable> mem_fraction_tables;
  int mamba_pool_padding_slots = 0;  // SGLang MambaPool allocates slots + this
  int kv_buffer_padding_pages = 0;   // SGLang KV buffers hold size + page_size rows
  // SGLang's HiCache host pool (0: the engine has none plan sizes): the --hicache-ratio
  // default, and the host memory the engine keeps free when it checks the pool fits.
  double host_pool_default_ratio = 0;
  int64_t host_pool_reserve_bytes = 0;
  std::map<std::string, std::string> references;
  const MemFractionTable* mem_fraction_for(const Version& version) const;
};

// ---------------------------------------------------------------- the model

struct LaunchSpec {
  std::vector<std::string> entry_points;  // "sglang serve", "-m sglang.launch_server", ...
  bool positional_model = false;
  std::map<std::string, std::vector<std::string>> flags;  // field -> spellings
  // field -> environment variables that set it (VLLM_ATTENTION_BACKEND); a flag wins.
  std::map<std::string, std::vector<std::string>> environment;
  std::vector<std::string> boolean_flags;
  int default_port = 0;             // the server's port when --port is not given
  std::string default_port_source;  // where in the engine's source that default is
  // A YAML file named by a flag that sets launch fields (TensorRT-LLM --config /
  // --extra_llm_api_options): field -> dotted keys, first present wins.
  std::vector<std::string> config_file_flags;
  std::map<std::string, std::vector<std::string>> config_keys;
  bool config_overrides_flags = false;  // the file's values win over the command line's
  std::string config_source;            // where the engine reads and merges it
  // Top-level keys the engine refuses in that file (extra="forbid"), with the error.
  std::map<std::string, std::string> config_rejected_keys;
  // vLLM's and SGLang's --config: every top-level key is a flag name ("kv-cache-dtype: fp8"
  // is --kv-cache-dtype fp8), spliced before the command line's own arguments, so a flag on
  // the command line wins. config_keys is unused then.
  bool config_keys_are_flags = false;
  // The engine's argument parser reads --kv_cache_dtype as --kv-cache-dtype (vLLM's
  // FlexibleArgumentParser), in config keys too.
  bool underscores_are_dashes = false;
  std::string underscores_source;
  // Container images whose own ENTRYPOINT starts the engine: a manifest that runs them
  // with only arguments (Kubernetes args:, compose command:) launches the engine.
  struct ImageEntryPoint {
    std::string image;               // repository, without tag or registry host: "vllm/vllm-openai"
    std::vector<std::string> words;  // "vllm", "serve"
    std::string reference;
  };
  std::vector<ImageEntryPoint> image_entry_points;
};

// How a launch sets the KV dtype, and what a 16-bit cache takes, for fixes.
struct KvDtypeSetting {
  // The flag and the releases that have it ("" none; the config key then).
  std::string flag;
  VersionRange flag_versions;
  std::string config_key;  // "kv_cache_config.dtype" in the config file ("" none)
  // The start-up log names the KV dtype a launch runs (TensorRT-LLM's never does under auto:
  // checks of a fixed launch then read the served checkpoint and the printed sizes).
  bool logged = true;
  // A 16-bit cache where no value of the setting gives one: a checkpoint-config overlay that
  // removes the checkpoint's KV quantization (the engine's auto then stays 16-bit).
  struct Overlay {
    std::string file;        // "hf_quant_config.json"
    std::string key;         // "quantization.kv_cache_quant_algo"
    std::string inline_key;  // the same in config.json ("quantization_config.kv_cache_quant_algo")
    std::string reason;
  };
  std::optional<Overlay> sixteen_bit_overlay;
  Provenance provenance;
};

struct ServerInfoSpec {                  // how a live server reports itself
  std::vector<std::string> endpoints;    // "/server_info", "/get_server_info", "/metrics"
  bool reports_requested_dtype = false;  // true: "auto" may stand for a resolved FP8
  std::string version_endpoint;          // GET answering {"version": ...} ("" none)
  std::string owned_by;                  // the /v1/models owned_by that names this engine ("" none)
  std::string stats_endpoint;            // a JSON array of iteration stats ("" none)
  bool stats_drain_on_read = false;  // reading the stats consumes them (other readers miss them)
  // Fields a completion request adds to get the engine's per-request counters (SGLang's
  // speculative counts come in meta_info only with return_meta_info): a JSON object.
  std::string completion_extra_json = "{}";
  // The Prometheus counters probe --load reads, by what they count (server_counter_kinds()).
  std::map<std::string, std::vector<std::string>> counters;
  Provenance provenance;
};

// How the engine's own start-up lines print its arguments (SGLang's ServerArgs(...) repr,
// vLLM's non-default args and engine config): for each launch field, the argument names that
// carry it, first present wins. Which line is an args line is the log templates' business.
struct LogArgs {
  std::map<std::string, std::vector<std::string>> keys;  // field -> argument names
  // A repr that lists only the non-default arguments leaves these out when they hold their
  // default (vLLM's kv_cache_dtype 'auto').
  std::map<std::string, std::string> omitted_defaults;
  Provenance provenance;
};
// What server_info.counters may name: "generated_tokens", "cached_tokens",
// "spec_accept_rate", "spec_accept_length".
const std::vector<std::string>& server_counter_kinds();

// The fields log_args.keys may name: the launch fields, plus the memory settings plan reads.
const std::vector<std::string>& log_arg_fields();

// ---------------------------------------------------------------- KV tiers

// A place the KV cache travels besides the GPU pool (a host tier, a connector, a persistent
// store, a disaggregated transfer) in a combination the engine's or the tier's own tracker
// reports to corrupt it, or to lose what a tier must keep. Matched on the launch's tier
// settings (LaunchFlags::tier_settings), the resolved KV dtype and the model.
struct TierHazard {
  std::string id;
  VersionRange versions;
  std::string tier;  // the tier, in words ("HiCache host tier", "LMCache in-process connector")
  // setting -> value globs it takes ("*": the setting is given at all); every one must match.
  std::map<std::string, std::vector<std::string>> settings;
  std::vector<std::string> kv_dtypes;  // resolved KV dtypes it hits (empty: any)
  std::optional<bool> hybrid;          // only models with (or without) recurrent layers
  std::string severity;                // "critical", "warning" or "info"
  std::string consequence;             // what goes wrong, as the source describes it
  std::string fix;                     // what to launch instead
  std::string fixed_in;                // the first release with the fix ("": none known)
  Provenance provenance;
};

struct EngineModel {
  std::string engine;
  std::string file;
  // The registry's dtype vocabulary, which this model's dtypes were linted against (set by
  // load_engine_model; it outlives the model).
  const DtypeVocabulary* dtypes = nullptr;
  std::string latest_known_version;
  LaunchSpec launch;
  KvDtypeSetting kv_dtype_setting;
  std::vector<DtypeChoices> dtype_choices;
  std::vector<AutoRule> auto_rules;  // first match wins
  std::vector<KvMethodRule> kv_method_rules;
  std::vector<ScaleNameRule> scale_name_rules;  // per convention: first match wins
  std::vector<ScaleNameRule> scale_drop_rules;  // per architecture / method, after the names
  std::vector<FallbackRule> fallback_rules;
  std::vector<ScaleWarningRule> scale_warnings;
  std::vector<FlagRule> flag_rules;
  std::vector<ParamPathRule> param_path_rules;
  std::vector<CheckpointAbort> checkpoint_aborts;
  std::vector<DtypeHazard> dtype_hazards;
  std::vector<EngineDefaults> defaults;
  std::vector<MambaSlotRules> mamba_slots;  // SGLang hybrids: state slots per request
  std::vector<KnownBad> known_bad;
  // Tier settings the launch may give: setting -> its flag spellings (data: kv_tier_flags),
  // and which of those flags take no value.
  std::map<std::string, std::vector<std::string>> tier_flags;
  std::set<std::string> tier_boolean_flags;
  // Tier settings read out of the launch's config file by dotted key (TensorRT-LLM has no flag
  // for its host tier: kv_cache_config.host_cache_size sits in the --config YAML), and the
  // value a setting takes when the launch gives none (enable_block_reuse is on by default, so
  // a launch that never names it still offloads reusable blocks).
  std::map<std::string, std::vector<std::string>> tier_config_keys;
  std::map<std::string, std::string> tier_defaults;
  std::vector<TierHazard> tier_hazards;
  std::vector<DefaultBackend> default_backends;
  std::vector<PlatformSubstitution> platform_substitutions;
  std::vector<StateDtypeRule> state_dtypes;
  std::vector<DraftKvRule> draft_kv;
  std::vector<LogTemplate> log_templates;
  LogArgs log_args;
  std::optional<ServerInfoSpec> server_info;
  bool has_quantization_param_path = false;
  bool has_dynamic_scales_flag = false;  // a --calculate-kv-scales in some release
  CapacityData capacity;

  const LogTemplate* log_template(std::string_view id) const;
  const DtypeChoices* choices_for(const Version& version) const;
  // The fallback of the KV-cache method this checkpoint's quantization creates.
  const FallbackRule& fallback_for(const Version& version,
                                   const checkpoint::ModelFacts* model = nullptr) const;
  const EngineDefaults& defaults_for(const Version& version) const;
  const MambaSlotRules* mamba_slots_for(const Version& version) const;  // null: none known
};

// Loads and lints one engine's files against a vocabulary (which must outlive the model).
EngineModel load_engine_model(const std::filesystem::path& engine_file,
                              const std::filesystem::path& capacity_file,
                              const DtypeVocabulary& dtypes);
std::vector<KvDtype> load_kv_dtypes(const std::filesystem::path& dtypes_file);

// The engines kvaudit knows: one per <engine>.json in a data folder's engines/ (with its
// capacity/<engine>.json), all linted against that folder's dtypes.json. The files present
// are the engines known; nothing else lists them. The CLI loads one per process and hands
// it down as a const reference; tests load one from another folder.
class Registry {
 public:
  // Reads data_dir/engines/. InputError naming the file and key when the data is wrong.
  static Registry load(const std::filesystem::path& data_dir);
  Registry(Registry&&) = default;
  Registry& operator=(Registry&&) = default;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  const DtypeVocabulary& dtypes() const { return *dtypes_; }
  const std::vector<std::string>& names() const { return names_; }  // sorted
  // InputError("--engine", "unknown engine 'x' (known: ...)") when absent.
  const EngineModel& engine(std::string_view name) const;
  const EngineModel* find(std::string_view name) const;

 private:
  Registry() = default;
  std::unique_ptr<DtypeVocabulary> dtypes_;  // on the heap: the models point at it
  std::map<std::string, EngineModel, std::less<>> models_;
  std::vector<std::string> names_;
};

// Every version a rule names as a bound, plus the latest: the points where behaviour
// can change (for tests that sweep releases).
std::vector<Version> boundary_versions(const EngineModel& model);

// The recurrent-state dtypes a release runs this hybrid with: the launch flag, else the
// release's rule for this model family (vLLM's per-model hooks), else its default
// ("model_dtype" and "from_model_config" resolved against the model).
struct StateDtypes {
  MambaSsmDtype ssm;
  std::string conv_dtype;                // canonical
  const StateDtypeRule* rule = nullptr;  // the per-model rule that decided, if any
};
StateDtypes resolve_state_dtypes(const EngineModel& engine, const Version& version,
                                 const checkpoint::ModelFacts& model, const std::string& ssm_flag,
                                 const std::string& model_dtype);

// The --kv-cache-dtype values this version accepts (as spelled on the CLI), in order;
// aborting values are not among them.
std::vector<std::string> kv_cache_dtype_choices(const EngineModel& model, const Version& version);
// CLI value -> canonical dtype for this engine and version ("" when not a choice).
std::string cli_dtype(const EngineModel& model, const Version& version, std::string_view value);
// The CLI spelling this version accepts for a canonical dtype ("" when none).
std::string cli_spelling(const EngineModel& model, const Version& version, std::string_view dtype);
// True when `version` is newer than the newest release the data knows.
bool newer_than_known(const EngineModel& model, const Version& version);

// ---------------------------------------------------------------- launch flags

// Where a launch setting is written, so reports and SARIF can point at it.
struct SettingSite {
  std::string file;      // the file that holds it ("" for a command line given as text)
  int64_t line = 0;      // 1-based line in `file`; 0 unknown
  std::string key_path;  // "spec.template.spec.containers[0].args[2]", "ExecStart", a flag
};

// A change to a launch file: bytes [offset, offset + length) become prefix + value + suffix.
// length 0 inserts. Every other byte of the file is kept.
struct TextEdit {
  std::string file;
  size_t offset = 0, length = 0;
  std::string prefix, suffix;
};

struct LaunchFlags {
  std::string engine;          // an engine of known_engines()
  std::string engine_version;  // as given ("" = latest known behaviour)
  std::string kv_cache_dtype = "auto";
  std::string kv_cache_dtype_flag;  // spelling seen ("--kv-cache-dtype"), empty if defaulted
  std::string model_path;
  int tp = 1;
  int pp = 1;
  int dp = 1;
  int dcp = 1;  // decode context parallel (SGLang --dcp-size / vLLM -dcp)
  bool dp_attention = false;
  std::string quantization_param_path;
  std::string quantization;                // --quantization
  std::string dtype = "auto";              // --dtype
  std::optional<int64_t> context_length;   // --context-length / --max-model-len
  std::optional<double> memory_fraction;   // --mem-fraction-static / --gpu-memory-utilization
  std::string mamba_ssm_dtype;             // --mamba-ssm-dtype / --mamba-ssm-cache-dtype
  std::string kv_cache_dtype_skip_layers;  // vLLM: "sliding_window" or layer indices
  std::string speculative_algorithm;       // EAGLE, NEXTN, ...
  std::optional<int> speculative_draft_layers;
  std::optional<int64_t> max_total_tokens;
  std::optional<int> page_size;
  std::string host;                  // --host ("" not given)
  std::optional<int> port;           // --port
  std::string source;                // "flags", "launch command", "unit FILE"
  bool calculate_kv_scales = false;  // vLLM --calculate-kv-scales (releases that have it)
  std::string attention_backend;     // --attention-backend (or its environment variable)
  // Where it runs (from --gpu; not an engine flag): "sm90", "gfx942"; "cuda" / "rocm".
  std::string gpu_arch, platform;
  std::string speculative_draft_kv_cache_dtype;  // SGLang --speculative-draft-kv-cache-dtype
  std::vector<std::string> ignored_arguments;
  // Where the KV cache travels, as the launch sets it: setting -> value ("true" for a flag
  // without one), from the engine data's kv_tier_flags, plus what the engine reads out of a
  // JSON-valued one (vLLM's --kv-transfer-config: kv_connector, offloading_spec,
  // secondary_tiers). See tier_settings_from_flag.
  std::map<std::string, std::string> tier_settings;
  // The config file the launch names (TensorRT-LLM --config), and what it set.
  std::string config_file, config_file_flag;
  std::set<std::string> fields_from_flags, fields_from_config;
  std::vector<std::string> config_errors;  // keys the engine refuses: it will not start
  // Where the launch was read: the file ("" for --launch text), what kind of file it is
  // ("systemd unit", "Kubernetes Deployment", "docker-compose file", "sglang --config file"),
  // which workload in it ("Deployment/vllm container inference-server, document 1").
  std::string launch_file, launch_file_kind, workload;
  SettingSite command_site;                  // where the engine's command starts
  std::map<std::string, SettingSite> sites;  // launch field -> where it was set
  // Where a launch file takes the KV dtype value (the present value, or where a new setting
  // goes); empty for a command line, a unit (decide::fix_unit edits those) or when unknown.
  std::optional<TextEdit> kv_dtype_edit;
};

// Parses a shell command line (quotes, backslash-newlines, `bash -c '...'`, docker
// wrappers, NAME=VALUE assignments before the program) that starts a known engine. Throws
// InputError(label, ...) otherwise. `environment` holds variables set elsewhere (a unit's
// Environment=); assignments on the line win over it, and a flag over both.
LaunchFlags parse_launch_command(const Registry& registry, std::string_view command_line,
                                 const std::string& label,
                                 const std::map<std::string, std::string>& environment = {});
// Reads a systemd unit: [Service] ExecStart= with continuations, Environment=
// (expanded in ExecStart as systemd does).
LaunchFlags parse_systemd_unit(const Registry& registry, const std::filesystem::path& unit_file);
// Reads the launches a file holds, by its content: a systemd unit; Kubernetes manifests
// (Pod, Deployment, StatefulSet, DaemonSet, ReplicaSet, Job, CronJob, LeaderWorkerSet; one
// launch per container that runs an engine; `helm template` output is such a file);
// a docker-compose file (one per service that runs an engine); an engine's own --config
// YAML (`engine` names which; the file then is the launch). Throws InputError(path, ...)
// when the file holds no launch of a known engine, naming what it found.
std::vector<LaunchFlags> read_launch_file(const Registry& registry,
                                          const std::filesystem::path& path,
                                          const std::string& engine = "");
// Splits a command line into words as a POSIX shell would (no expansion).
std::vector<std::string> split_shell_words(std::string_view command_line, const std::string& label);

// ---------------------------------------------------------------- resolution

// Where the K/V scales in effect come from.
enum class ScaleSource {
  not_applicable,           // 16-bit cache
  checkpoint,               // checkpoint tensors the loader maps
  quantization_param_path,  // SGLang's JSON
  calculated,               // vLLM --calculate-kv-scales (first batch)
  dynamic_by_design,        // the dtype computes its own scales (per-token-head, MX blocks)
  unit_default,             // none usable: 1.0
  unknown,                  // the checkpoint was not read (probe without --checkpoint)
};
std::string_view scale_source_name(ScaleSource source);

struct DroppedScales {
  std::string rule_id;
  std::string reason;
  Provenance provenance;
  std::vector<std::string> tensor_names;
};

// Why the server will not start, predicted from the data.
struct StartupFailure {
  std::string id;
  std::string message;  // the engine's error, verbatim where known
  std::string cause;    // what in the inputs triggers it
  Provenance provenance;
};

struct ResolvedKv {
  std::string engine;
  Version version;
  bool version_newer_than_known = false;
  std::string requested;           // canonical requested dtype ("auto", "bf16", ...)
  bool requested_known = true;     // false: not a --kv-cache-dtype choice of this version
  std::string kv_cache_dtype;      // canonical resolved dtype
  const KvDtype* dtype = nullptr;  // vocabulary entry of kv_cache_dtype (null: unknown)
  bool quantized = false;
  std::string rule_id;  // auto rule that decided, or "explicit"
  std::string reason;   // one sentence: why this dtype
  Provenance rule_provenance;
  std::string model_dtype;  // canonical dtype the model is served in
  ScaleSource scale_source = ScaleSource::not_applicable;
  std::vector<DroppedScales> dropped;  // scales present but not loaded
  std::vector<std::string> loaded_scale_names;
  std::vector<std::string> ignored_by_design;  // scale tensors the dtype does not use
  // Layers kept in the model dtype (vLLM --kv-cache-dtype-skip-layers), by index.
  std::vector<int> skipped_layers;
  std::vector<StartupFailure> startup_failures;
  std::optional<std::string> scale_warning_text;  // the scale warning the engine logs
  std::string scale_warning_id;
  std::string scale_warning_meaning;
  Provenance scale_warning_provenance;
  const FallbackRule* fallback = nullptr;
  // The platform stored another dtype than the one resolved (ROCm): what was resolved
  // before, and the rule. kv_cache_dtype holds what is stored.
  std::string substituted_from;
  const PlatformSubstitution* substitution = nullptr;
  // Known-bad combinations this launch hits (all dimensions known to match) or may hit
  // (a dimension the inputs do not give: GPU or backend).
  struct KnownBadHit {
    const KnownBad* rule = nullptr;
    bool certain = false;
    std::string backend;         // the backend it was matched against ("" unknown)
    std::string backend_origin;  // "--attention-backend", "default for sm100", ""
    const DefaultBackend* default_backend = nullptr;  // the rule that gave it, if a default
    std::vector<std::string> unknown;  // dimensions not given ("GPU", "attention backend")
  };
  std::vector<KnownBadHit> known_bad;
  // Every attention layer's stored dtype (skip layers keep the model dtype).
  struct LayerDtype {
    int layer = 0;
    std::string dtype;
    std::string why;  // "" for the resolved dtype, else the rule that changed it
  };
  std::vector<LayerDtype> layer_dtypes;
  // A speculative draft model's cache (empty when no speculative decoding is launched).
  std::string draft_kv_cache_dtype;
  const DraftKvRule* draft_rule = nullptr;
  // Tier hazards this launch meets (find_tier_hazards).
  std::vector<const TierHazard*> tier_hazards;
};

// Records one tier flag of the launch: `setting` (a key of the engine's tier_flags) = `value`,
// and what the engine itself reads out of a JSON-valued one: vLLM's --kv-transfer-config
// gives kv_connector (its "kv_connector"), offloading_spec (kv_connector_extra_config
// .spec_name) and secondary_tiers (the "type" of each kv_connector_extra_config
// .secondary_tiers entry, comma-joined). A value that is not JSON is kept as given.
void record_tier_setting(std::string_view setting, const std::string& value, LaunchFlags& flags);
// The same into a settings map (a launch read from a log keeps one of its own).
void record_tier_setting(std::string_view setting, const std::string& value,
                         std::map<std::string, std::string>& settings);
// Whether `setting` is one record_tier_setting reads out of a JSON-valued flag (kv_connector,
// offloading_spec, secondary_tiers) rather than one a flag gives directly.
bool is_derived_tier_setting(std::string_view setting);
// The value of a tier setting for this launch: what the launch gives, else the engine's
// default (kv_tier_flags.defaults), else "".
std::string tier_setting_value(const EngineModel& engine, const LaunchFlags& flags,
                               std::string_view setting);
// The tier hazards of `engine` at `version` that this launch (its tier settings, the resolved
// KV dtype, the model) meets. Settings name LaunchFlags::tier_settings keys, plus
// "speculative_algorithm" and "kv_cache_dtype_requested" (the launch's own fields).
std::vector<const TierHazard*> find_tier_hazards(const EngineModel& engine, const Version& version,
                                                 const checkpoint::ModelFacts& model,
                                                 const LaunchFlags& flags,
                                                 std::string_view resolved_kv_dtype);

// Whether the launch sets the field that `flag` (a spelling in the engine's launch data)
// belongs to.
bool flag_given(const EngineModel& engine, const LaunchFlags& flags, std::string_view flag);

// How to run a KV dtype on this release, in the engine's own terms: its flag, the key of
// its config file, or (a 16-bit cache where no value gives one) a checkpoint-config overlay.
struct KvDtypeFix {
  std::string text;       // "launch with --kv-cache-dtype bf16"
  std::string setting;    // "--kv-cache-dtype", "kv_cache_config.dtype", or the overlay's key
  std::string value;      // "bf16"; "null" for an overlay
  bool overlay = false;   // a copy of the checkpoint's config files, not a launch value
  std::string reference;  // where the setting (or the overlay's reason) was read
};
KvDtypeFix kv_dtype_fix(const EngineModel& engine, const Version& version,
                        const std::string& dtype);
// The name a report gives the KV dtype setting of a release ("--kv-cache-dtype", or
// "kv_cache_config.dtype" where the release has no flag).
std::string kv_dtype_setting_name(const EngineModel& engine, const Version& version);
// The rule by which this release never uses a checkpoint's KV scales for `dtype` (null when
// they can load): calibrating scales is then no fix.
const ScaleNameRule* scales_ignored_for(const EngineModel& engine, const Version& version,
                                        const checkpoint::ModelFacts& model,
                                        const std::string& dtype);

ResolvedKv resolve_kv(const checkpoint::ModelFacts& model, const LaunchFlags& flags,
                      const EngineModel& engine);

// What one layer's BaseKVCacheMethod makes of its loaded scalar scales (nullopt: none
// loaded, the engine's -1.0): the k and v scales in effect, or the start-up error.
// Shared by resolve_kv (audit) and serve, so both apply the same fallback semantics.
struct LayerScales {
  float k = 1.0f, v = 1.0f;
  bool from_checkpoint = false;  // a loaded value is in effect
  std::string error_id;          // "" unless start-up stops: scale-v-only, scale-zero, scale-nan
  std::string error;             // the engine's error, verbatim
};
LayerScales apply_fallback(const FallbackRule& fallback, std::optional<float> k,
                           std::optional<float> v);

// The model dtype (canonical) an engine serves this checkpoint in under these flags.
std::string served_model_dtype(const DtypeVocabulary& dtypes, const checkpoint::ModelFacts& model,
                               const LaunchFlags& flags);

// SGLang's --quantization-param-path file, as its loader reads it (kv_cache_scales_loader in
// python/sglang/srt/model_loader/weight_utils.py, a pydantic QuantParamSchema):
// {"model_type": ..., "kv_cache": {"dtype": "float8_e4m3fn", "scaling_factor":
// {"<tp rank>": {"<layer>": scale}}}}. The one reader of the format: serve loads it as SGLang
// does, calibrate reads back what it wrote.
struct QuantParamFile {
  std::string model_type;                                      // "" when absent
  std::map<int64_t, std::map<int64_t, float>> scales_by_rank;  // tp rank -> layer -> scale
};
// Parses the document with the schema's rules: an object with kv_cache.dtype
// "float8_e4m3fn" and a scaling_factor object of objects whose keys are integers as pydantic
// reads them (" 1", "+2") and whose values are numbers. Throws InputError(where, problem)
// for the first thing the loader would refuse.
QuantParamFile parse_quant_param_file(const nlohmann::json& doc, const std::string& where);
// `rank`'s scale for each layer in [0, num_layers): InputError when the rank or a layer is
// missing, the rank lists another layer count, or a scale is not positive and finite (SGLang
// would divide by it; kvaudit refuses it).
std::vector<float> quant_param_layer_scales(const QuantParamFile& file, int64_t rank,
                                            int num_layers, const std::string& where);

}  // namespace kvaudit::engines
