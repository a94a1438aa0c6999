// probe: verifies a live OpenAI-compatible server (SGLang, vLLM, `kvaudit serve`, or any
// other) over HTTP: what it really runs (engine, model, resolved KV dtype, capacity) and
// the `check` findings that apply; a smoke test; the long-context code-recall probe of
// eval/ over a grid of context lengths x depths; and an A/B comparison of two deployments
// on the identical probe set against a same-deployment control arm (A measured twice, or a
// second replica), with paired statistics per metric (KL from the largest top-k log-probs
// each server allows, teacher-forced log-prob per token, task accuracy), the effect with its
// interval, a p-value, the probes a verdict would need, and acceptance gates. Finished probes are
// appended to a JSON-lines results file so a killed run resumes. Not here: HTTP and the OpenAI
// protocol (net/), rendering (report/, via cli/), engine rules (engines/, audit/), the load
// bench (loadbench/, which detects its servers with this module).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "audit/audit.h"
#include "checkpoint/checkpoint.h"
#include "net/net.h"
#include "report/report.h"
#include "stats/stats.h"

namespace kvaudit::probe {

// ---------------------------------------------------------------- detection

struct ServerFacts {
  std::string url;
  std::string engine = "generic";  // an adapter's engine (registry or llama.cpp, tgi), or generic
  std::string engine_version;      // as reported ("" unknown)
  std::string detected_by;         // endpoint that identified the engine
  std::string model_id;            // served model name (/v1/models), sent as "model"
  std::string model_path;          // checkpoint path the server loaded, when it says
  std::string kv_cache_dtype;      // as reported ("auto", "fp8_e4m3", "fp8", ""= unknown)
  std::string kv_cache_dtype_source;
  std::optional<int64_t> capacity_tokens;  // KV cache size in tokens
  std::string capacity_source;
  std::optional<int64_t> context_length;  // max tokens per request
  // SGLang: max_running_requests as launched (the top level of /get_server_info) and as the
  // scheduler runs it (internal_states[].effective_max_running_requests_per_dp x DP ranks).
  std::optional<int64_t> running_requests_launched;
  std::optional<int64_t> running_requests_effective;
  std::string running_requests_source;
  std::optional<int64_t> page_size;  // SGLang page_size / vLLM block_size
  int tp = 1;
  std::string dtype;  // model dtype flag ("auto", "bfloat16")
  std::string quantization;
  std::string quantization_param_path;
  bool calculate_kv_scales = false;  // vLLM
  bool has_tokenize = false;
  std::string tokenize_dialect;   // the request form /tokenize answered ("POST /tokenize {...}")
  std::optional<int64_t> slots;   // llama-server's parallel slots (each holds n_ctx / slots)
  std::string attention_backend;  // SGLang server args attention_backend ("" unknown)
  // Log-probs as the server grants them (negotiate_logprobs): the most alternatives per
  // token it accepted (0: not asked), whether /v1/completions with echo returns the prompt's
  // log-probs (teacher-forced scoring), and what it said.
  int top_logprobs_granted = 0;
  std::optional<bool> prompt_logprobs;
  std::string logprobs_note;
  std::vector<report::Evidence> evidence;  // what each endpoint said
  std::vector<std::string> notes;
};

// Reads SGLang's /get_server_info (server args flattened, scheduler info, and
// internal_states[] which may hold max_total_num_tokens) into facts.
void read_sglang_server_info(const nlohmann::json& info, ServerFacts& facts,
                             const std::string& path = "/get_server_info");
// Reads vLLM's vllm:cache_config_info gauge (labels: cache_dtype, block_size,
// num_gpu_blocks, calculate_kv_scales, ...); false when the metrics lack it.
bool read_vllm_metrics(const std::vector<net::MetricSample>& samples, ServerFacts& facts);

// Reads llama.cpp's llama-server /props (default_generation_settings.n_ctx, total_slots,
// model_path, build_info); false when the answer is not llama-server's.
bool read_llamacpp_props(const nlohmann::json& props, ServerFacts& facts);
// Reads Hugging Face TGI's /info (version, model_id, model_dtype, max_total_tokens per
// request, max_batch_total_tokens); false when the answer is not TGI's.
bool read_tgi_info(const nlohmann::json& info, ServerFacts& facts);

// TensorRT-LLM's /metrics: a JSON array of iteration stats, drained by each read (an idle
// server answers []). The newest entry's kvCacheStats gives the pool: maxNumBlocks x
// tokensPerBlock tokens. False when no entry carries them.
bool read_trtllm_iteration_stats(const nlohmann::json& stats, ServerFacts& facts,
                                 const std::string& where);

// A server's answers to GET requests, each path fetched once (a second read of TensorRT-LLM's
// /metrics would find it drained). probe reads them over HTTP; tests from recorded answers.
class ServerAnswers {
 public:
  virtual ~ServerAnswers() = default;
  virtual std::string where(const std::string& path) const = 0;  // URL, for evidence
  // The body when the server answered 200, else nullopt.
  virtual std::optional<std::string> get(const std::string& path) = 0;
  std::optional<nlohmann::json> get_json(const std::string& path);  // nullopt: absent or not JSON
};

// One server's grammar that cannot be data: which answer names it, how its reports and
// counters read. One per engine of the registry (tests check every engine has one), plus the
// servers kvaudit recognises without engine data (llama.cpp, TGI). `engine` is the registry's
// model of it (null for those); true when the answers are this server's.
struct ServerAdapter {
  std::string_view engine;
  bool (*read)(const engines::EngineModel* engine, ServerAnswers& answers, ServerFacts& facts);
};
// In the order probe asks them: the ones whose own endpoints name them first.
const std::vector<ServerAdapter>& server_adapters();
// Runs the adapters in order until one recognises the server (facts.engine stays "generic"
// when none does).
void identify_server(const engines::Registry& registry, ServerAnswers& answers, ServerFacts& facts);

// The fields a completion request to this engine adds for its per-request counters (engine
// data server_info.completion_extra; {} for engines without).
nlohmann::json completion_extra_fields(const engines::Registry& registry,
                                       const std::string& engine);

// The Prometheus counters the load bench (loadbench/, probe --load) reads from this engine's
// /metrics, by kind (engine data server_info.counters: generated_tokens, cached_tokens,
// spec_accept_rate, ...).
std::map<std::string, std::vector<std::string>> load_counter_names(
    const engines::Registry& registry, const std::string& engine);

// The counters read from /metrics, summed over label sets. Figures a server reports as NaN,
// infinite or negative are left out.
struct ServerCounters {
  double draft = 0.0, accepted = 0.0, drafts = 0.0;  // speculative decoding, cumulative
  bool seen = false;
  // SGLang's gauges (last logging interval), averaged over label sets; -1: absent.
  double accept_rate = -1.0, accept_length = -1.0;
  double cached = 0.0;  // sglang:cached_tokens_total (prompt tokens served from its cache)
  bool cached_seen = false;
  double generated = 0.0;  // the server's own count of generated tokens
  bool generated_seen = false;
  // Prompt tokens served from a cache, by counter kind (prefix_hit_tokens: the device pool;
  // tier_hit_tokens: a tier behind it; cached_tokens: any); a kind is absent when no counter
  // of it was exported.
  std::map<std::string, double> hits;
};
using CounterNames = std::map<std::string, std::vector<std::string>>;
// vLLM's vllm:spec_decode_* and llama-server's llamacpp:spec_decode_* (the same suffixes),
// and the counters `names` gives (load_counter_names); none when /metrics is absent,
// unreadable or unanswered.
ServerCounters read_server_counters(net::Client& client, const CounterNames& names);

// Asks the server: each adapter's endpoints (/server_info, /metrics, /version, /props, /info),
// /v1/models, /tokenize (+ /detokenize to check the round trip).
// Transport failures propagate as net::RequestError; missing endpoints do not.
ServerFacts detect_server(const engines::Registry& registry, net::Client& client);

// The `check` findings that apply. With the checkpoint's facts (a local copy, or the
// server's model_path when readable here) the full audit runs on flags taken from the
// server; without, only what the server's own answers establish.
// Where the servers run and how findings are judged (probe --gpu, --kv-policy): what a
// server does not report about itself.
struct Deployment {
  audit::KvPolicy policy = audit::KvPolicy::evidence;
  std::string gpu_name, gpu_arch, platform;
};
std::vector<report::Finding> server_findings(const engines::Registry& registry,
                                             const ServerFacts& facts,
                                             const checkpoint::ModelFacts* model,
                                             const Deployment& deployment = {});

// ---------------------------------------------------------------- probes

struct ProbeOptions {
  bool smoke = false;
  bool recall = false;
  std::vector<int64_t> ctx_tokens = {1024, 4096};
  std::vector<int64_t> depth_tokens = {256, 2048};  // cells with depth >= ctx are skipped
  int cases_per_cell = 2;
  uint64_t seed = 1;
  // Teacher-forced fixed sequences (synthetic code and prose), scored token by token.
  bool forced = false;
  int forced_cases = 8;
  // Long-context tasks ("mrcr", "toolcall": eval's generators) per context length.
  std::vector<std::string> tasks;
  std::vector<int64_t> task_ctx_tokens = {4096};
  // Cases per task and context length; 0: 4, or in an A/B twice the fewest paired probes
  // that can reach p < alpha, over the context lengths (16 at alpha 0.01), if more.
  int task_cases = 0;
  // Alternatives per token for the KL estimate: asked for, and lowered to what each server
  // grants (vLLM --max-logprobs, 20 by default; the smallest of the servers is used).
  int top_logprobs = 20;
  // The control arm of an A/B: a second replica of A ("" : A itself, a second time, with
  // the probes in another order so each has other batch neighbours); off with control=false.
  std::string control_url;
  bool control = true;
  double alpha = 0.01;  // error rate of the verdict (Holm over the metrics)
  double power = 0.8;   // for the probes a verdict would need
  std::vector<struct Gate> gates;
  std::string model;         // "" : each server's first /v1/models id
  std::string results_path;  // "" : no results file (a killed run starts over)
  int concurrency = 2;       // probes in flight per run
  Deployment deployment;     // where the servers run, the policy their findings follow
  // Called after each finished probe (from worker threads, serialised).
  std::function<void(int64_t done, int64_t total, const std::string& label)> on_progress;
};

struct TopEntry {
  std::string token;
  double logprob = 0.0;
};

// An acceptance limit for CI, e.g. "kl<=0.01" or "mrcr_drop<=2pt": a metric's difference
// from the control (B's excess over A's own floor) must not exceed the limit.
struct Gate {
  std::string text;    // as given
  std::string metric;  // "kl", "logprob_drop", "recall_drop", "mrcr_drop", "toolcall_drop"
  double limit = 0.0;  // nats (kl, logprob_drop) or a fraction (accuracy drops; 2pt = 0.02)
};
// Parses "kl<=0.01,mrcr_drop<=2pt" (comma-separated; accuracy limits in points, "pt" or
// "%"). Throws InputError("--gate", ...) naming the part it cannot read.
std::vector<Gate> parse_gates(const std::string& text);

// One scored position: the token there (generated, or the teacher-forced text's) and
// the server's top alternatives.
struct Position {
  std::string token;
  std::optional<double> logprob;
  std::vector<TopEntry> top;
};

// One finished probe on one server: what was asked, what came back, how it scored.
struct ProbeRecord {
  std::string server;  // URL
  std::string id;      // "smoke/arithmetic", "recall/ctx=4096/depth=256/case=0"
  std::string kind;    // "smoke" | "recall" | "forced" | "mrcr" | "toolcall"
  std::string endpoint;
  std::string expected;  // text that passes (recall: the argument list)
  std::string output;    // greedy completion
  bool passed = false;   // smoke: check passed; recall: exact match
  std::string error;     // the server refused this probe (4xx): its message
  int64_t ctx_tokens = 0;
  int64_t depth_tokens = 0;
  int64_t prompt_tokens = 0;  // as the server's usage says (else the counter)
  // Teacher-forced log-prob of the expected text (echo + logprobs), when available.
  std::optional<double> expected_logprob;
  int64_t expected_tokens = 0;
  std::vector<Position> generated;  // greedy tokens with top-k
  std::vector<Position> forced;     // teacher-forced window: last prompt tokens + expected
  std::string forced_note;          // why there is no teacher-forced score ("" if scored)
  // Multi-round tasks: rounds asked and answered exactly (passed: all of them); tool calls
  // whose answer satisfied the schema.
  int64_t rounds = 0, rounds_passed = 0, schema_valid = 0;
  // Teacher-forced positions: the mean probability mass the listed top-k leaves out (the
  // tail the KL estimate cannot see), and the top-k asked.
  std::optional<double> tail_mass;
  int top_k = 0;
  double seconds = 0.0;
};
// The record as JSON. The results file keeps every position's top-k (a resumed run compares
// from them); a report keeps per position only the token and its log-prob (with_top false),
// which keeps a 20-alternative A/B's --json at a few MB instead of tens.
nlohmann::json to_json(const ProbeRecord& record, bool with_top = true);
ProbeRecord record_from_json(const nlohmann::json& doc, const std::string& where);

// A JSON-lines results file: one {"key", "record"} per finished probe, appended and
// flushed as each finishes. Loading skips a torn last line (a killed writer).
struct ResultsFile {
  std::vector<std::pair<std::string, ProbeRecord>> records;  // key -> record, file order
  int64_t skipped_lines = 0;
};
ResultsFile load_results(const std::string& path);

// ---------------------------------------------------------------- compare

struct ProbeComparison {
  std::string id;
  std::string kind;
  int64_t first_divergence = -1;     // index of the first differing generated token; -1 none
  std::string token_a, token_b;      // the tokens there
  std::optional<double> kl;          // mean KL(a || b) per position, nats
  std::optional<double> kl_control;  // mean KL(a || control) over the same basis
  int64_t kl_positions = 0;
  std::string kl_basis;  // "teacher-forced", "greedy prefix", ""
  bool passed_a = false, passed_b = false, passed_control = false;
  std::optional<double> accuracy_a, accuracy_b, accuracy_control;  // task rounds right
  std::optional<double> logprob_a, logprob_b, logprob_control;     // per scored token
};

// One metric of an A/B, paired per probe against the control arm.
struct MetricTest {
  std::string metric;  // "kl", "logprob", "recall", "mrcr", "toolcall", "smoke"
  std::string label;   // what is measured, for reports
  std::string unit;    // "nats", "nats/token", "points"
  int64_t probes = 0;  // probes with a value on every arm
  // B against A (KL(A||B); B - A), the control against A, and B's excess over the control
  // per probe (the tested quantity), each with its bootstrap interval. Accuracies in [-1, 1].
  double effect = 0.0, floor = 0.0, excess = 0.0;
  stats::Interval effect_interval, floor_interval, excess_interval;
  stats::TestResult test;   // sign-flip on the per-probe excess
  double p_adjusted = 1.0;  // Holm over the metrics of this comparison
  std::string verdict;      // "different" | "no difference detectable" | "inconclusive"
  // The effect a verdict is sized for (the gate's limit, else the metric's default) and the
  // paired probes that would detect it at options.alpha with options.power.
  double detectable = 0.0;
  int64_t probes_needed = 0;
  std::string sentence;  // the verdict for this metric, one line
};

struct GateResult {
  Gate gate;
  std::string status;           // "passed" | "failed" (JUnit's words)
  std::optional<double> value;  // the metric's excess over the control, in the gate's unit
  stats::Interval interval;
  bool settled = false;  // the whole interval lies on the reported side of the limit
  std::string message;
};

struct CompareSummary {
  std::vector<ProbeComparison> probes;
  int64_t diverged = 0;
  std::optional<double> mean_kl;  // over probes with a KL estimate
  std::optional<double> max_kl;
  double recall_exact_a = 0.0, recall_exact_b = 0.0;         // fractions over recall probes
  std::optional<double> recall_logprob_a, recall_logprob_b;  // mean per expected token
  int64_t recall_probes = 0;
  bool control = false;       // a control arm was measured
  std::string control_label;  // "A again (other batch neighbours)" or the replica's URL
  double alpha = 0.01;
  std::vector<MetricTest> metrics;
  std::vector<GateResult> gates;
  std::string
      verdict;         // "different" | "no difference detectable" | "inconclusive" | "not compared"
  std::string better;  // "a" | "b" | "" (tie)
  std::string reason;  // why this verdict, with the figures
};

// KL(p || q) from two top-k lists. The distributions are coarsened to the union of the
// listed tokens plus one bucket for everything else: a token listed on one side only gets,
// on the other side, an equal share of that side's unlisted mass (capped at its smallest
// listed probability); the rest of the unlisted mass forms the bucket. Coarsening can only
// lose divergence, so this tends to understate the full-vocabulary KL.
double kl_from_top(const std::vector<TopEntry>& p, const std::vector<TopEntry>& q);

// The effect sizes a verdict is sized for when no gate names the metric: KL 0.01 nats per
// position (eval's warning threshold; llama.cpp measures q8_0 KV near 0.001), 0.05 nats per
// token of log-prob, 10 points of task accuracy.
inline constexpr double kDifferentKl = 0.01;
inline constexpr double kDetectableLogprob = 0.05;
inline constexpr double kDetectableAccuracy = 0.10;

struct CompareOptions {
  double alpha = 0.01;
  double power = 0.8;
  std::vector<Gate> gates;
  std::string control_label;
};
// Pairs the probes of A, B and the control by id. Without control records (empty) the floor
// is taken as 0 and the verdict says so.
CompareSummary compare_records(const std::vector<ProbeRecord>& a, const std::vector<ProbeRecord>& b,
                               const std::vector<ProbeRecord>& control = {},
                               const CompareOptions& options = {});

// ---------------------------------------------------------------- a run

struct ServerRun {
  ServerFacts facts;
  std::vector<report::Finding> findings;
  std::vector<ProbeRecord> records;  // in probe order
  int64_t resumed = 0;               // records taken from the results file
  net::ClientStats client_stats;
};

struct RunResult {
  std::vector<ServerRun> servers;    // 1, or 2 with --compare
  std::optional<ServerRun> control;  // the control arm's run (A again, or --control's replica)
  std::optional<CompareSummary> compare;
  std::string token_counting;  // how prompt lengths were measured
  std::vector<std::string> notes;
};

// Detects each server, then runs the probes the options ask for (interleaving the two
// sides). A server that becomes unreachable, answers garbage or refuses auth stops the
// run: InputError naming it and how many probes finished (kept in the results file).
// `checkpoint_dir`: optional local copy of the served checkpoint for the findings.
RunResult run_probes(const engines::Registry& registry, const std::vector<std::string>& urls,
                     const net::ClientOptions& client, const ProbeOptions& options,
                     const std::string& checkpoint_dir = "");

// Asks the server, with one small completion each (no retries), for `wanted` log-probs per
// token with echo: lowers the count to the limit an error names (vLLM "max allowed: N",
// V0 "Cannot request more than N"), else halves it; records whether the prompt's log-probs
// came back. A server that refuses every try keeps top_logprobs_granted 0.
void negotiate_logprobs(net::Client& client, const std::string& model, int wanted,
                        ServerFacts& facts);

report::Report to_report(const RunResult& result, const ProbeOptions& options);

// Exit gate: a smoke probe failed, a --gate failed, or (without gates) the comparison
// verdict is "different".
bool probe_failed(const RunResult& result);
// The same gate as checks, one per smoke probe of each server, per --gate limit (or, without
// gates, one for the comparison's verdict): JUnit's test cases. probe_failed is "one failed".
std::vector<report::GateCheck> gate_checks(const RunResult& result);

// ---------------------------------------------------------------- round trip (KV tiers)

// probe --roundtrip: whether a prompt's KV comes back from the server's cache tiers as it
// went in. The same prompts (a nonce first, so no earlier request shares them) are scored
// greedily with top-k log-probs four times: cold; again at once (the device prefix cache);
// again (the floor: the same path twice); and after filler traffic has overrun the device
// pool, so that whatever tier kept them (host memory, disk, a connector) serves them. The
// answers' cached-token counts and the server's tier counters say which tier served each
// pass. Each tier is compared per prompt (KL over the greedy prefix) and its excess over the
// floor tested across prompts.
struct RoundTripOptions {
  int prompts = 10;                       // 10 lets a sign-flip test reach p < 0.005 per check
  int64_t prompt_tokens = 384;            // each prompt, about (counted by the server's /tokenize)
  int64_t generate_tokens = 16;           // greedy tokens scored per pass
  int top_logprobs = 5;                   // lowered to what the server grants
  double overrun = 1.5;                   // filler sent: this many times the device pool's tokens
  int64_t filler_prompt_tokens = 0;       // each filler request; 0: min(context / 2, 2048)
  int64_t max_filler_tokens = 4'000'000;  // a pool larger than this / overrun is not overrun
  int max_requests = 4000;                // every request of the run, filler included
  double time_limit_seconds = 900;        // the run stops here, keeping what it measured
  double alpha = 0.01;                    // error rate per verdict (Holm over the checks)
  double tolerance_kl = kDifferentKl;     // nats per position a tier may add to the floor
  int concurrency = 4;                    // filler requests in flight
  uint64_t seed = 1;                      // the prompts' nonce and text
  std::string model;                      // "" : the server's first /v1/models id
  std::function<void(const std::string& stage, int64_t done, int64_t total)> on_progress;
};

struct RoundTripPass {
  std::string name;                  // "cold", "device", "device again", "after eviction"
  std::vector<ProbeRecord> records;  // one per prompt answered ("roundtrip/N")
  std::vector<std::optional<int64_t>> cached_tokens;  // per record, as the answer said
  std::string cached_field;                           // the answer field that said it ("" none)
  int64_t prompt_tokens = 0, cached = 0;              // sums over records whose count was stated
  std::map<std::string, double> counter_delta;        // counter kind -> rise over this pass
  std::vector<std::map<std::string, double>> record_counter_delta;  // the same, per record
  // What served each record: "computed", "device prefix cache", "a tier behind the device
  // pool" or "unknown"; the pass's is the most common, its evidence counts them all.
  std::vector<std::string> record_served_by;
  std::string served_by;
  std::string served_by_evidence;
};

struct RoundTripEviction {
  bool attempted = false;
  bool forced = false;  // the filler overran the pool (and nothing says it still holds them)
  std::optional<int64_t> pool_tokens;
  std::string pool_source;
  int64_t filler_requests = 0, filler_tokens = 0;
  std::string note;  // why the eviction could not be forced, or how it was
};

// One tier compared with the pass before it, per prompt, against the floor.
struct TierCheck {
  std::string name;  // "device prefix cache", "tier behind the device pool"
  std::string pass, against;
  std::vector<double> kl, floor;      // per prompt the tier served: nats per position
  int64_t prompts = 0, diverged = 0;  // prompts compared; whose greedy text differs
  int64_t prompts_needed = 0;         // the fewest a verdict at alpha needs
  double excess = 0.0;                // mean of kl - floor
  stats::Interval excess_interval;
  stats::TestResult test;
  double p_adjusted = 1.0;
  // The earliest divergence: prompt index, generated token index, absolute position.
  int64_t first_prompt = -1, first_token = -1, first_position = -1;
  std::string token_expected, token_served;
  std::string verdict;  // "agrees" | "changed" | "inconclusive" | "not exercised"
  std::string sentence;
};

struct RoundTripResult {
  ServerFacts facts;
  std::vector<RoundTripPass> passes;  // in order; fewer when the run stopped early
  RoundTripEviction eviction;
  std::vector<TierCheck> checks;
  bool counts_trusted = true;  // the cached-token counts pass their consistency checks
  std::string counts_note;
  std::string stopped;  // why the run ended early ("" : it finished)
  std::string verdict;  // "tiers agree", "a tier changed the answers", "no cache served",
                        // "not established"
  std::string reason;
  std::vector<std::string> notes;
  int64_t requests = 0;
  double seconds = 0.0;
};

// Runs the round trip against one server. Detection failures and a server that is gone
// before the first pass throw (InputError / net::RequestError); a failure later ends the run
// with what it measured and `stopped` saying why.
RoundTripResult run_roundtrip(const engines::Registry& registry, const std::string& url,
                              const net::ClientOptions& client, const RoundTripOptions& options);
// The checks and verdict from the passes (run_roundtrip calls it; tests call it on passes
// they built).
void judge_roundtrip(const RoundTripOptions& options, RoundTripResult& result);
report::Report to_report(const RoundTripResult& result, const RoundTripOptions& options);
// Exit gate: anything but "tiers agree" or "no cache served".
bool roundtrip_failed(const RoundTripResult& result);

}  // namespace kvaudit::probe
