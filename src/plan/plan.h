// plan: KV-cache capacity as SGLang and vLLM compute it. Bytes per token per GPU
// (head replication when kv_heads < TP, MLA latent, FP4 block scales, sliding-window
// pools, hybrid GDN/Mamba state), the pool each engine carves out of GPU memory, the
// tokens and concurrent requests that pool holds, and the same arithmetic run
// backwards from the memory figures a real launch printed (with the printed figures'
// rounding carried as an interval). Every number comes with its derivation.
// Not a simulator of the engines' memory profiler: where an input is unknown (CUDA
// context, activations), plan says what it assumed.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "engines/engines.h"
#include "report/report.h"

namespace kvaudit::plan {

inline constexpr int64_t kGiB = int64_t{1} << 30;
inline constexpr int64_t kMiB = int64_t{1} << 20;

// ---------------------------------------------------------------- data

// The KV dtype `name` (any spelling, or a canonical name) as the engine model knows it;
// InputError naming the dtypes this engine version accepts when it is not one of them.
const engines::KvDtype& plan_dtype(const engines::EngineModel& engine,
                                   const engines::Version& version, std::string_view name);

struct GpuPreset {
  std::string name;
  std::vector<std::string> aliases;
  double memory_gb = 0;    // as the vendor states it
  int64_t memory_mib = 0;  // as the driver reports it (what the engines read)
  std::string mib_source;
  // The architecture known-bad combinations name ("sm80", "sm89", "sm90", "sm100", "sm120",
  // "gfx942") and the platform whose dtypes the engines use ("cuda", "rocm").
  std::string arch, platform, arch_source;
};
std::vector<GpuPreset> load_gpu_presets();  // data_dir()/gpus.json
GpuPreset find_gpu(std::string_view name);  // by name or alias, case-insensitive

// SGLang's default --mem-fraction-static for a GPU of gpu_mem_mib (server_args.py
// _handle_gpu_memory_settings), with the reserved-memory sum spelled out.
struct MemFractionDefault {
  double mem_fraction_static = 0.88;
  double reserved_mib = 0;
  std::string derivation;
};
MemFractionDefault sglang_default_mem_fraction(const engines::MemFractionTable& rule,
                                               int64_t gpu_mem_mib, int tp, int pp,
                                               bool dp_attention, int dp);

// ---------------------------------------------------------------- per-token sizes

struct Parallelism {
  int tp = 1;
  int pp = 1;
  int dp = 1;
  bool dp_attention = false;
  int dcp = 1;  // decode context parallel: tokens spread over dcp ranks of the TP group
  int attention_tp() const { return dp_attention && dp > 0 ? tp / dp : tp; }
};

// The version-dependent sizing choices of one engine release (its defaults and
// formula changes), and the launch's own choices that change per-token bytes.
struct SizingRules {
  bool fp4_dequant_workspace = false;  // SGLang FP4: + one shared FP8 dequant row per token
  int speculative_draft_layers = 0;    // EAGLE/MTP draft layers sharing the pool
  std::string ssm_dtype = "fp32";      // recurrent state (canonical dtype)
  std::string conv_dtype = "bf16";
  int ssm_bytes = 4;  // bytes per element of each (from the dtype vocabulary)
  int conv_bytes = 2;
  std::string ssm_dtype_origin;      // "model config", "engine default", "--mamba-ssm-dtype"
  int64_t mm_reservation_bytes = 0;  // SGLang multimodal reservation
};

// SGLang get_cell_size_per_token, for the KV layers one GPU holds.
struct CellSize {
  int64_t bytes_per_token = 0;  // per GPU, every KV layer on the rank
  int full_layers = 0;          // layers with a full-length pool (full attention or MLA)
  int swa_layers = 0;           // sliding-window layers (separate SGLang pool)
  int kv_heads_per_rank = 0;    // max(1, kv_heads // attention_tp); 1 for MLA
  int64_t full_bytes_per_token_per_layer = 0;
  int64_t swa_bytes_per_token_per_layer = 0;
  int swa_window = 0;
  std::vector<std::string> derivation;
};
CellSize sglang_cell_size(const checkpoint::ModelFacts& model, const engines::KvDtype& dtype,
                          const Parallelism& parallel, const SizingRules& rules);

// Per-request recurrent state of hybrid GDN/Mamba models (SGLang Mamba2StateShape).
struct MambaState {
  int linear_layers = 0;
  int64_t conv_bytes_per_layer = 0;
  int64_t ssm_bytes_per_layer = 0;
  int64_t bytes_per_request = 0;  // (conv + ssm) x linear layers
  std::vector<std::string> derivation;
};
std::optional<MambaState> sglang_mamba_state(const checkpoint::ModelFacts& model,
                                             const Parallelism& parallel, const SizingRules& rules);

// vLLM V1 KV cache groups for one GPU: every group has the same page size per
// layer and group_size layers; num_blocks = available // page // group_size.
struct VllmLayout {
  int block_size = 16;
  int64_t page_bytes_per_layer = 0;  // block_size x heads x (k+v dim) x bytes
  int group_size = 0;                // layers per group (tensors sharing a block id)
  int num_groups = 0;
  int sliding_window = 0;                   // tokens, when a group is sliding-window
  int full_groups = 0, sliding_groups = 0;  // of num_groups: groups of each kind
  int64_t bytes_per_token = 0;              // all KV layers of the rank
  std::vector<std::string> derivation;
};
VllmLayout vllm_layout(const checkpoint::ModelFacts& model, const engines::KvDtype& dtype,
                       const Parallelism& parallel, int block_size);
// Blocks one request of `context` tokens is admitted against, summed over the groups (all
// groups share one block pool): a full-attention group cdiv(context, block); a sliding-window
// group cdiv(min(window - 1 + max_num_batched_tokens, context), block) + 1 (the window need not
// start on a block). vLLM's max concurrency is num_blocks over this (kv_cache_interface.py
// SlidingWindowSpec.max_memory_usage_bytes, kv_cache_utils.py
// get_max_concurrency_for_kv_cache_config). Without max_num_batched_tokens the window alone
// is counted: the fewest blocks, the most requests.
int64_t vllm_blocks_per_request(const VllmLayout& layout, int64_t context,
                                std::optional<int64_t> max_num_batched_tokens);

// ---------------------------------------------------------------- plan

struct PlanOptions {
  std::string engine = "sglang";
  std::string engine_version;  // "" = the newest known release
  Parallelism parallel;
  std::vector<std::string> kv_cache_dtypes;     // empty: every dtype the engine accepts
  std::optional<int64_t> gpu_memory_bytes;      // per GPU, as the driver reports it
  std::string gpu_name;                         // preset name, for the report
  std::optional<double> memory_fraction;        // mem_fraction_static / gpu_memory_utilization
  std::optional<int64_t> weight_bytes_per_gpu;  // default: checkpoint bytes / (tp x pp)
  std::vector<int64_t> contexts = {8192, 32768, 131072};
  std::optional<int64_t> max_running_requests;
  std::optional<int> page_size;                   // SGLang page size / vLLM block size
  std::optional<int64_t> max_total_tokens;        // SGLang --max-total-tokens
  std::optional<double> mamba_full_memory_ratio;  // SGLang, default per version
  std::string mamba_ssm_dtype;                    // --mamba-ssm-dtype / --mamba-ssm-cache-dtype
  std::optional<int> speculative_draft_layers;    // EAGLE/MTP draft layers (SGLang)
  // SGLang hybrids: what decides the state slots each running request holds.
  std::string mamba_radix_cache_strategy;  // "" : the release's default
  bool disable_radix_cache = false;
  bool disable_overlap_schedule = false;
  bool mamba_skip_decode_lock = false;    // SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK=1
  std::optional<int64_t> context_length;  // --context-length (default: the model's)
  // vLLM --max-num-batched-tokens: a sliding-window group holds window - 1 + this many tokens
  // per request while a prefill is chunked (unset: the window alone, an upper bound).
  std::optional<int64_t> max_num_batched_tokens;
  // Where the KV cache travels besides the GPU pool, as a launch sets it (the engine data's
  // kv_tier_flags names: "hierarchical_cache" = "true", "hicache_ratio", "hicache_size_gb");
  // a launch read from a log brings its own (LoggedMemory::tier_settings).
  std::map<std::string, std::string> tier_settings;
};

// The mamba state slots a running request holds at this release under these options
// (1 where the engine has no rule).
engines::MambaSlotsPerRequest mamba_slots_per_request(const engines::EngineModel& engine,
                                                      const engines::Version& version,
                                                      const PlanOptions& options);

// The sizing rules of options.engine at options.engine_version for this model.
SizingRules sizing_rules(const checkpoint::ModelFacts& model, const engines::EngineModel& engine,
                         const engines::Version& version, const PlanOptions& options);

struct ConcurrencyPoint {
  int64_t context_tokens = 0;
  int64_t requests = 0;
  std::string limited_by;  // "kv pool", "mamba state pool", "--max-running-requests", ...
  // Each limit considered: what it is and the requests it allows (the least wins).
  std::vector<std::pair<std::string, int64_t>> limits;
};

// Adds a limit on requests running at once; the point keeps the least and names it.
void limit_requests(ConcurrencyPoint& point, std::string what, int64_t requests);
// Replaces (or adds) the limit named `what` and takes the least again.
void relimit_requests(ConcurrencyPoint& point, const std::string& what, int64_t requests);

struct PlanRow {
  std::string kv_cache_dtype;
  int64_t cell_bytes_per_token_per_gpu = 0;
  int64_t kv_pool_bytes = 0;
  int64_t max_total_tokens = 0;
  int64_t swa_tokens = 0;  // SGLang sliding-window pool, 0 if none
  int64_t mamba_state_bytes_per_request = 0;
  int64_t mamba_slots = 0;
  int64_t mamba_pool_bytes = 0;
  int64_t num_blocks = 0;  // vLLM
  // SGLang HiCache: the host pool of one rank (0 when the launch sets up none).
  int64_t host_pool_tokens = 0;
  int64_t host_pool_bytes = 0;
  std::vector<ConcurrencyPoint> concurrency;
  std::vector<std::string> derivation;
};

struct CapacityPlan {
  std::string engine;
  std::string engine_version;  // the release whose rules applied
  Parallelism parallel;
  std::string gpu_name;
  int64_t gpu_memory_bytes = 0;
  double memory_fraction = 0;
  std::string memory_fraction_source;  // "--mem-fraction", "SGLang default for ...", ...
  int64_t weight_bytes_per_gpu = 0;
  int64_t budget_bytes = 0;  // SGLang rest memory / vLLM available KV memory
  std::string budget_label;  // what the budget is, in the engine's terms ("Rest memory ...")
  std::map<std::string, std::string> sources;  // the capacity data's references
  std::vector<PlanRow> rows;
  std::vector<std::string> derivation;    // shared steps (memory budget)
  std::vector<std::string> notes;         // assumptions
  std::vector<report::Finding> findings;  // launches the engine would refuse or weaken
};

CapacityPlan plan_capacity(const engines::Registry& registry, const checkpoint::ModelFacts& model,
                           const PlanOptions& options);

// SGLang HiCache: each row's host pool per rank, from options.tier_settings (hicache_size
// GB, else hicache_ratio x the device pool; the ratio's default is capacity data), with the
// engine's refusal when it is not larger than the device pool and the host RAM it needs.
// Nothing when the launch sets up no host tier or the engine has no host pool data.
void add_host_tier(const engines::EngineModel& engine, const PlanOptions& options,
                   CapacityPlan& plan);

// SGLang: from the rest memory (bytes left for KV + Mamba after the fraction is
// applied) to the pools. Mamba slots are set aside first (mamba_full_memory_ratio),
// then tokens = rest // cell, --max-total-tokens cap, page-size floor, SWA split.
struct SglangPools {
  int64_t rest_bytes = 0;
  int64_t mamba_slots = 0;
  int64_t mamba_pool_bytes = 0;
  int64_t kv_budget_bytes = 0;  // rest - mamba
  int64_t max_total_tokens = 0;
  int64_t swa_tokens = 0;
  std::vector<std::string> derivation;
};
SglangPools sglang_pools(int64_t rest_bytes, const CellSize& cell,
                         const std::optional<MambaState>& mamba, double mamba_full_memory_ratio,
                         int page_size, std::optional<int64_t> max_total_tokens,
                         std::optional<int64_t> fixed_mamba_slots, double swa_full_tokens_ratio);

// ---------------------------------------------------------------- from a log

// The memory figures one launch printed. GiB values carry the log's decimals
// (two, as both engines print them); intervals widen each by half a unit.
struct LoggedMemory {
  std::string engine;                // an engine of engines::known_engines()
  std::string engine_version;        // as the log printed it ("" when it did not)
  std::string kv_cache_dtype;        // canonical dtype the launch used
  int tp = 0;                        // 0: the log does not print it
  int tp_at_least = 0;               // from the rank prefixes seen, when tp is not printed
  bool tp_ranks_contiguous = false;  // every rank below tp_at_least printed a line
  std::string tp_source;             // where tp came from ("log:2 server_args tp_size")
  int pp = 0;                        // 0: not printed
  std::optional<int> dp;             // SGLang dp_size / vLLM data_parallel_size
  std::optional<bool> dp_attention;
  std::string mamba_ssm_dtype;  // SGLang server_args mamba_ssm_dtype ("" not printed)
  // SGLang
  std::optional<double> total_before_load_gib;  // min over ranks, "Load weight begin. avail mem="
  std::optional<double>
      avail_after_weights_gib;                // min over ranks, "Load weight end. ... avail mem="
  std::optional<double> mem_fraction_static;  // server_args
  std::optional<int> page_size;
  std::optional<double> mamba_full_memory_ratio;
  std::optional<int64_t> max_total_tokens_arg;
  std::optional<int64_t> pool_tokens;          // "KV Cache is allocated. #tokens: N"
  std::optional<double> k_gib, v_gib, kv_gib;  // "K size", "V size", "KV size"
  std::optional<int64_t> mamba_slots;          // "max_mamba_cache_size: N"
  std::optional<double> conv_gib, ssm_gib;
  std::optional<int64_t> max_total_num_tokens;     // "max_total_num_tokens=N"
  std::optional<int64_t> full_tokens, swa_tokens;  // "Use sliding window memory pool. ..."
  // Requests at once: the value in effect (summary or "capped to" line), what the launch
  // asked, the slots per request the engine printed, and what decides them.
  std::optional<int64_t> max_running_requests;
  std::optional<int64_t> requested_running_requests;
  std::optional<int64_t> state_slots_per_request;
  std::optional<int64_t> context_len;
  std::string mamba_radix_cache_strategy;
  bool disable_radix_cache = false;
  bool disable_overlap_schedule = false;
  bool speculative = false;
  // vLLM
  bool vllm_v0 = false;
  std::optional<double> available_kv_gib;      // min over ranks
  std::optional<int64_t> gpu_kv_cache_tokens;  // V1 "GPU KV cache size: N tokens"
  std::optional<int64_t> num_gpu_blocks;       // "# GPU blocks: N" / "# cuda blocks: N"
  std::optional<int> block_size;
  std::optional<int64_t> max_num_batched_tokens;  // "Chunked prefill is enabled with ..."
  std::optional<int64_t> concurrency_context;     // "Maximum concurrency for L tokens ..."
  std::optional<double> concurrency_x;
  // TensorRT-LLM's profile line ("Peak memory during memory usage profiling ...") and its
  // final allocation (pool_tokens, kv_gib: the last "Allocated X GiB ... (N)").
  std::optional<double> peak_gib, total_gpu_gib, tmp_kv_gib;
  std::optional<double> printed_fraction;     // "fraction is set F"
  std::optional<int64_t> kv_bytes_per_token;  // "kv size is N" / "kv size per token is N"
  // The tier settings the launch's args line gave (engines' kv_tier_flags names).
  std::map<std::string, std::string> tier_settings;
};

struct TokenInterval {
  int64_t lo = 0;
  int64_t hi = 0;
  bool contains(int64_t value) const { return lo <= value && value <= hi; }
  // No whole count maps to the printed figure: the model of the engine is off (a wrong
  // dtype, TP or release), not the rounding.
  bool empty() const { return lo > hi; }
};
// "[lo, hi]", or "none" with why, for derivations and findings.
std::string interval_text(const TokenInterval& interval);

struct LogCheck {
  std::string id;    // "sglang_max_total_num_tokens", "sglang_k_size", ...
  std::string what;  // one line for people
  int64_t printed = 0;
  TokenInterval predicted;
  bool inside = false;
  std::string derivation;
};

struct LogPredictionRow {
  std::string kv_cache_dtype;
  int64_t cell_bytes_per_token_per_gpu = 0;
  TokenInterval max_total_tokens;
  bool launch_dtype = false;
};

struct LogPrediction {
  std::vector<LogCheck> checks;
  std::vector<LogPredictionRow> rows;  // every dtype, from the same memory budget
  std::vector<std::string> notes;
  std::vector<report::Finding> findings;  // flags that disagree with the log, facts unknown
  // A page size the log did not print, taken from an engine rule (SGLang's DSA page), for the
  // plan that follows the prediction.
  std::optional<int> assumed_page_size;
};

// What the user passed beside --from-log; unset when not given.
struct LogFlagOverrides {
  std::optional<std::string> engine, engine_version, kv_cache_dtype;
  std::optional<int> tp, pp, dp;
  std::optional<bool> dp_attention;
  std::optional<double> memory_fraction;
};

// The launch a from-log prediction runs: the log's figures, every gap filled from a flag
// (or a stated default), every flag checked against what the log printed. A conflict is a
// finding and the log's value is used (it is what the engine ran).
struct LogSetup {
  LoggedMemory memory;
  PlanOptions options;
  std::vector<report::Finding> findings;
  std::vector<std::string> notes;  // where each value not printed in the log came from
};
LogSetup reconcile_log_flags(const engines::Registry& registry, const LoggedMemory& logged,
                             const PlanOptions& base, const LogFlagOverrides& given);

// Reproduces the engine's token count from the printed memory figures, checks the
// printed per-token sizes exactly, and predicts the other dtypes. Throws InputError
// when the log has no memory figures plan can use.
LogPrediction predict_from_log(const engines::Registry& registry,
                               const checkpoint::ModelFacts& model, const LoggedMemory& logged,
                               const PlanOptions& options);
// The same, on a reconciled launch: its findings and notes come first.
LogPrediction predict_from_log(const engines::Registry& registry,
                               const checkpoint::ModelFacts& model, const LogSetup& setup);

// ---------------------------------------------------------------- report

report::Report to_report(const checkpoint::ModelFacts& model, const CapacityPlan& plan,
                         const LogPrediction* from_log, bool explain);

}  // namespace kvaudit::plan
