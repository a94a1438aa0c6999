// eval: measures what a KV-cache format does to a model's predictions, on the reference CPU
// engine (model/). Two instruments:
//  1. llama.cpp-style statistics against a baseline format (`perplexity --kl-divergence`
//     semantics): each chunk of n_ctx tokens is scored at positions [n_ctx/2, n_ctx - 1);
//     PPL ratio, KL divergence percentiles, Delta-p and "same top p", per position bucket.
//  2. A long-range recall probe: synthetic Python source with random functions, then a call
//     that must reproduce a signature defined D tokens earlier; teacher-forced log-prob and
//     exact match over a grid of context lengths x depths. The text generator is
//     engine-independent so probe/ reuses it against live servers.
// Not here: rendering (report/, done by cli/), codecs (numerics/), the forward pass (model/).
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model/model.h"
#include "report/report.h"
#include "tokenizer/tokenizer.h"

namespace kvaudit::eval {

// ---------------------------------------------------------------- statistics

// One scored position of one format against the baseline.
struct TokenComparison {
  int64_t position = 0;   // position within its chunk
  double nll_base = 0.0;  // -log p_base(correct token), nats
  double nll_test = 0.0;  // -log p_test(correct token)
  double kld = 0.0;       // sum_v p_base(v) (log p_base(v) - log p_test(v)), nats
  double delta_p = 0.0;   // p_test(correct) - p_base(correct)
  bool same_top = false;  // argmax agrees
  bool finite = true;     // false when the test logits held NaN/inf
};

// Compares two logit rows for the token `correct`; base_log_probs is the baseline's
// log-softmax (computed once and reused for every format).
TokenComparison compare_logits(std::span<const float> base_log_probs,
                               std::span<const float> test_logits, int32_t correct,
                               int64_t position);
// log-softmax of one row: numerics::log_softmax (eval and serve share it).
using numerics::log_softmax;

// Linear-interpolated percentile of sorted values, as llama.cpp computes them
// (fraction in [0, 1]: 0 = minimum, 1 = maximum).
double percentile_sorted(const std::vector<double>& sorted, double fraction);

struct Percentile {
  double fraction;  // 0.999, 0.99, ...
  double value;
};

struct KldSummary {
  int64_t count = 0;      // finite scored positions
  int64_t nonfinite = 0;  // positions whose test logits held NaN/inf (kept out of the stats)
  double ppl_base = 0.0;  // exp(mean nll_base)
  double ppl_test = 0.0;
  double ppl_ratio = 0.0;        // exp(mean(nll_test - nll_base)) = PPL(Q)/PPL(base)
  double ppl_ratio_error = 0.0;  // ratio * standard error of the mean log difference
  double kld_mean = 0.0;
  double kld_mean_error = 0.0;  // sqrt(var / (N - 1))
  double kld_median = 0.0;
  std::vector<Percentile>
      kld_percentiles;  // 1 (max), 0.999, 0.99, 0.95, 0.9, 0.1, 0.05, 0.01, 0.001, 0 (min)
  double delta_p_mean = 0.0;
  double delta_p_rms = 0.0;
  double delta_p_rms_error = 0.0;
  std::vector<Percentile>
      delta_p_percentiles;  // 1, 0.999, 0.99, 0.95, 0.9, 0.75, 0.5, 0.25, 0.1, 0.05, 0.01, 0.001, 0
  double same_top = 0.0;    // fraction of positions whose argmax agrees
  double same_top_error = 0.0;  // sqrt(p (1 - p) / (N - 1))
};
KldSummary summarize(const std::vector<TokenComparison>& samples);

// ---------------------------------------------------------------- perplexity / KLD run

// Scales an engine would load (e.g. kvaudit calibrate's overlay), per layer {K, V}, as
// explicit StaticAmax::scales. When set, fp8_e4m3 ":tensor" / ":head" formats use them bit for
// bit instead of calibrating on the eval text.
struct LoadedScales {
  std::vector<std::array<numerics::StaticAmax, 2>> layers;
  std::string label;  // where they came from
};
// The loaded scales when they apply to `format` (empty when the format calibrates itself).
// Throws InputError when they cannot apply (per-tensor scales for ":head", layer count).
std::vector<std::array<numerics::StaticAmax, 2>> loaded_scales_for(
    const numerics::KvFormat& format, const LoadedScales& loaded, const model::ModelConfig& config);

struct PerplexityOptions {
  std::vector<std::string> kv_formats;  // first = baseline, e.g. {"bf16", "fp8_e4m3:none"}
  int64_t ctx_tokens = 512;             // n_ctx: tokens per chunk
  int64_t max_chunks = 0;               // 0: as many as the text holds
  int64_t first_scored = -1;            // -1: n_ctx / 2 (llama.cpp)
  int position_buckets = 4;             // over the scored range
  int64_t piece_tokens = 512;           // tokens per forward call (bounds logits memory)
  // Static scales (":tensor", ":head", ":channel", nvfp4 tensor scale) are calibrated from
  // the baseline's K/V on these tokens (empty: on the first chunk of the eval text).
  std::vector<int32_t> calibration_tokens;
  LoadedScales loaded_scales;
  // Hybrid models (Gated DeltaNet layers): the recurrent state precisions to run each KV
  // format with ("fp32", "bf16", "fp16", "int8"; the first with the first KV format is the
  // baseline), and where the state is stored (model::StateFormat::store_every_tokens; 1 =
  // every token, as decode stores it). Empty: fp32 only, and no state column.
  std::vector<std::string> state_formats;
  int64_t state_store_every_tokens = 1;
};

struct PositionBucket {
  int64_t first_position = 0;  // inclusive, within the chunk
  int64_t last_position = 0;   // inclusive
  KldSummary summary;
};

struct FormatResult {
  std::string spec;   // canonical KV format spelling
  std::string state;  // recurrent state precision ("" when the run has no state axis)
  bool baseline = false;
  int64_t state_bytes = 0;  // recurrent + conv state at the end of a chunk (all layers)
  // "fp8_e4m3:tensor", or "fp8_e4m3:tensor, bf16 state" on a state axis.
  std::string label() const { return state.empty() ? spec : spec + ", " + state + " state"; }
  KldSummary summary;  // against the baseline (the baseline against itself)
  std::vector<PositionBucket> buckets;
  int64_t kv_bytes_per_token = 0;  // encoded bytes the cache held, per token (all layers)
  double tokens_per_second = 0.0;  // prefill throughput of this format's runs
  numerics::EncodeCounts counts;   // what happened to the encoded K/V elements
  std::string calibration;         // how static scales were set ("", "calibrated on ...")
};

struct PerplexityResult {
  int64_t chunks = 0;
  int64_t ctx_tokens = 0;
  int64_t first_scored = 0;
  int64_t text_tokens = 0;
  std::vector<FormatResult> formats;
  std::string simd_target;
  // The state axis, when there is one: how often the state was stored (tokens; 0 = at the
  // end of each forward call).
  bool state_axis = false;
  int64_t state_store_every_tokens = 1;
};

// Static scales (":tensor", ":head", ":channel", NVFP4's tensor scale) for `format`: runs
// `tokens` through a session of `capture_format` with K/V maxima capture on and returns
// per-layer {K, V} amax. Empty amax for formats without static scales.
std::vector<std::array<numerics::StaticAmax, 2>> calibrate_static_scales(
    const model::Model& model, const numerics::KvFormat& capture_format,
    const numerics::KvFormat& format, std::span<const int32_t> tokens, ThreadPool& pool);

// The state precisions a run crosses with its KV formats: `specs` parsed (model::
// parse_state_format), or {fp32} when there are none (no state axis). Throws InputError
// when specs are given for a model without recurrent state.
std::vector<model::StateFormat> state_variants(const model::Model& model,
                                               const std::vector<std::string>& specs,
                                               int64_t store_every_tokens);

// Runs every format over the same chunks; the baseline's log-probs are computed once per
// chunk and reused. Throws InputError when the text is shorter than one chunk.
PerplexityResult run_perplexity(const model::Model& model, const std::vector<int32_t>& tokens,
                                const PerplexityOptions& options, ThreadPool& pool);

// ---------------------------------------------------------------- recall probe

// One synthetic source file: `prompt` ends just after "name(" in a call of a function
// defined earlier; `expected` is the argument list the definition fixes ("a, b, c)").
struct RecallCase {
  std::string prompt;
  std::string expected;
  std::string function_name;
  int64_t depth_tokens = 0;   // tokens between the end of the definition and the call
  int64_t prompt_tokens = 0;  // tokens of prompt + expected, as the counter measured
};

// Counts tokens of a text (the model's tokenizer, or an estimate for a live server).
using TokenCounter = std::function<int64_t(std::string_view)>;

struct RecallCaseOptions {
  int64_t ctx_tokens = 512;    // total length to fill (prompt + expected), approximately
  int64_t depth_tokens = 256;  // distance from the target definition to the call
  uint64_t seed = 1;
  // Control case: the target's definition is replaced by an unrelated function, so the
  // expected arguments cannot be copied (the chance baseline of the same prompt).
  bool control = false;
};

// Deterministic for (options, counter): random identifier names and argument lists from a
// fixed word list and a seeded generator; filler functions before and after the target
// until ctx and depth are reached. Throws InputError when depth >= ctx.
RecallCase make_recall_case(const RecallCaseOptions& options, const TokenCounter& count_tokens);

struct RecallOptions {
  std::vector<std::string> kv_formats;
  std::vector<int64_t> ctx_tokens = {256, 512};
  std::vector<int64_t> depth_tokens = {32, 128, 384};  // cells with depth >= ctx are skipped
  int cases_per_cell = 4;
  uint64_t seed = 1;
  bool with_control = true;  // also score control cases (first format only)
  LoadedScales loaded_scales;
  // Hybrids: recurrent state precisions crossed with every KV format, as in
  // PerplexityOptions (empty: fp32 only, no state axis).
  std::vector<std::string> state_formats;
  int64_t state_store_every_tokens = 1;
};

struct RecallCell {
  int64_t ctx_tokens = 0;
  int64_t depth_tokens = 0;
  int cases = 0;
  double mean_logprob_per_token = 0.0;  // teacher-forced, over the expected tokens
  double exact_match = 0.0;             // fraction of cases whose every expected token is argmax
  double control_logprob_per_token = 0.0;
  double control_exact_match = 0.0;
};

struct RecallFormatResult {
  std::string spec;
  std::string state;  // recurrent state precision ("" when the run has no state axis)
  std::string label() const { return state.empty() ? spec : spec + ", " + state + " state"; }
  std::vector<RecallCell> cells;
};

struct RecallResult {
  std::vector<RecallFormatResult> formats;
  std::vector<std::string> notes;  // grid cells skipped, and why
};

// Teacher-forced scoring of recall cases on the reference engine. Static-scale formats
// are calibrated on the first case's baseline K/V.
RecallResult run_recall(const model::Model& model, const tokenizer::Tokenizer& tokenizer,
                        const RecallOptions& options, ThreadPool& pool);

// Teacher-forced score of one case (exposed for tests): tokens of prompt + expected are
// run once; the expected text's tokens are those that end after the prompt's bytes.
struct RecallScore {
  double logprob = 0.0;  // sum over expected tokens, nats
  int64_t expected_tokens = 0;
  bool exact = false;
};
RecallScore score_recall_case(model::Session& session, const tokenizer::Tokenizer& tokenizer,
                              const RecallCase& recall_case);

// ---------------------------------------------------------------- long-context tasks

// A multi-round task over one long context: round r's prompt is the context, the earlier
// rounds' asks with their correct answers, then round r's ask (round_prompt).
struct TaskRound {
  std::string ask;       // e.g. "    second = load_table_index_v3("
  std::string expected;  // the answer that passes, e.g. "raw_node, last_edge, max_frame)"
  std::string after;     // what follows the answer before the next ask ("\n")
};
struct TaskCase {
  std::string kind;     // "mrcr" | "toolcall"
  std::string context;  // everything before the first ask
  std::vector<TaskRound> rounds;
  std::string schema;         // toolcall: the tool's JSON Schema (compact JSON)
  int64_t ctx_tokens = 0;     // the length asked for
  int64_t prompt_tokens = 0;  // context + every round with its answer, as counted
};
struct TaskCaseOptions {
  int64_t ctx_tokens = 4096;
  uint64_t seed = 1;
  int variants = 4;  // near-duplicates of the needle (2..8)
  int rounds = 3;    // rounds asked (1..variants), each a different near-duplicate
};
// MRCR-style: near-duplicate functions (one name stem, suffixes _v1.._vN, identical bodies,
// the first parameter different) spread through generated code; the rounds call them in a
// random order and the answer is the called variant's argument list.
TaskCase make_mrcr_case(const TaskCaseOptions& options, const TokenCounter& count_tokens);
// Tool calls: a registry of near-duplicate tools sharing one JSON Schema, a call log where
// each was called once with distinct arguments and timed out, among other calls; the rounds
// re-issue the timed-out calls ("NAME") and the answer is " " + the compact JSON arguments.
TaskCase make_toolcall_case(const TaskCaseOptions& options, const TokenCounter& count_tokens);
// Generated Python functions (the recall generator's) of about `tokens` tokens, at least one.
std::string make_code(uint64_t seed, int64_t tokens, const TokenCounter& count_tokens);
// A fixed English text of about `tokens` tokens (sentences from templates, seeded), for
// teacher-forced scoring of prose beside code.
std::string make_prose(uint64_t seed, int64_t tokens, const TokenCounter& count_tokens);
// The prompt of round `round` (earlier rounds answered correctly, as MRCR feeds them).
std::string round_prompt(const TaskCase& task, size_t round);

// A tool-call answer: the first JSON object in `output`, validated against the schema
// (valijson), then compared with the expected arguments.
struct ToolCallCheck {
  bool parsed = false;        // a JSON object was found and parsed
  bool schema_valid = false;  // it satisfies the tool's schema
  bool exact = false;         // it equals the expected arguments
  std::string problem;        // why not ("" when exact)
};
ToolCallCheck check_tool_call(const std::string& schema, const std::string& expected,
                              const std::string& output);

struct TaskOptions {
  std::vector<std::string> kv_formats;
  std::vector<std::string> kinds = {"mrcr", "toolcall"};
  std::vector<int64_t> ctx_tokens = {1024, 4096};
  int cases_per_cell = 4;
  int variants = 4, rounds = 3;
  uint64_t seed = 1;
  LoadedScales loaded_scales;
};
struct TaskCell {
  std::string kind;
  int64_t ctx_tokens = 0;
  int cases = 0;
  int64_t rounds = 0, rounds_exact = 0;            // rounds greedy decoding answers exactly
  double accuracy = 0.0;                           // rounds_exact / rounds
  double accuracy_low = 0.0, accuracy_high = 1.0;  // Wilson 95% interval
  double mean_logprob_per_token = 0.0;             // teacher-forced, over the answers
};
struct TaskFormatResult {
  std::string spec;
  std::vector<TaskCell> cells;
};
struct TaskResult {
  std::vector<TaskFormatResult> formats;
  std::vector<std::string> notes;
};
// Teacher-forced scoring on the reference engine: one forward pass over the context and
// every round with its correct answer; a round is exact when each of its answer tokens is the
// argmax (what greedy decoding would write).
TaskResult run_tasks(const model::Model& model, const tokenizer::Tokenizer& tokenizer,
                     const TaskOptions& options, ThreadPool& pool);

// ---------------------------------------------------------------- report

// Appends facts, tables (formats, KLD and Delta-p percentiles, by position, encode counts),
// the KLD-by-position chart and the JSON payload ("perplexity").
void add_to_report(const PerplexityResult& result, report::Report& out);
// Appends the recall table, one exact-match heatmap per format, and the payload ("recall").
void add_to_report(const RecallResult& result, report::Report& out);
// Appends the task table (accuracy per kind x context with its interval) and the payload
// ("tasks").
void add_to_report(const TaskResult& result, report::Report& out);
// What an eval report's title and facts say about the run.
struct EvalSummary {
  std::string model_dir;
  int num_layers = 0, num_kv_heads = 0, head_dim = 0;
  std::string weight_type;  // "bf16", ...
  std::string baseline;     // the first --kv format
  int threads = 0;
  // Hybrids: "24 Gated DeltaNet + 8 full attention" ("" for attention-only models).
  std::string layer_mix;
  std::vector<std::string> notes;  // what of the checkpoint the engine did not run
};
// The whole eval report: title and facts, then the perplexity and recall parts present,
// then the verdict. Either result may be null.
report::Report to_report(const EvalSummary& summary, const PerplexityResult* perplexity,
                         const RecallResult* recall, const TaskResult* tasks = nullptr);

// The one-line verdict on the worst format. Critical: NaN/inf logits, PPL ratio >= 1.05 or
// top-1 agreement < 90%; warning: PPL ratio >= 1.01, mean KLD >= 0.01, or recall exact match
// 20 points below the baseline in some cell; info otherwise. Either input may be null.
void set_eval_verdict(const PerplexityResult* perplexity, const RecallResult* recall,
                      report::Report& out, const TaskResult* tasks = nullptr);

}  // namespace kvaudit::eval
