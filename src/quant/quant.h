// quant: what a KV format does to real or synthetic attention inputs. From tensor-level
// damage (relative RMSE, SNR, saturation, NaN, flush to zero, subnormals, bits/element) up
// to attention itself (score error, softmax KL, top-k key agreement, output error) as a
// function of context length. Inputs: Q/K/V from .safetensors / .npy files, or synthetic
// generators with the statistics that break FP8 at scale 1.0 (outlier key channels, RoPE,
// small values, an attention sink). Not here: the codecs (numerics/), running a model
// (model/, eval/).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "numerics/numerics.h"
#include "report/report.h"

namespace kvaudit::quant {

struct AttentionShape {
  int q_heads = 32;  // query heads (GQA: a multiple of kv_heads)
  int kv_heads = 8;
  int head_dim = 128;
  numerics::KvLayout kv_layout() const { return {kv_heads, head_dim}; }
};

// Where Q, K and V rows come from. Rows are head-major: K/V [kv_heads * head_dim] per
// token, Q [q_heads * head_dim] per query position. Implementations are deterministic and
// safe to call from several threads at once.
class QkvSource {
 public:
  virtual ~QkvSource() = default;
  virtual AttentionShape shape() const = 0;
  virtual int64_t tokens() const = 0;  // K/V tokens available
  virtual void keys(int64_t first, int64_t count, std::span<float> out) const = 0;
  virtual void values(int64_t first, int64_t count, std::span<float> out) const = 0;
  // One KV head's part of those rows, [count, head_dim]: out[t * head_dim + c] =
  // keys(first + t)[head * head_dim + c]. The defaults read whole rows; sources override
  // them to produce only that head.
  virtual void head_keys(int64_t first, int64_t count, int head, std::span<float> out) const;
  virtual void head_values(int64_t first, int64_t count, int head, std::span<float> out) const;
  // Queries for the decode steps right after a context of `context_tokens` tokens.
  virtual void queries(int64_t context_tokens, int count, std::span<float> out) const = 0;
  virtual std::string description() const = 0;
};

// ---------------------------------------------------------------- synthetic inputs
// "outlier-keys": key channels whose magnitude is 10-100x the median (a few per head, on
//   low-frequency RoPE pairs, some beyond E4M3's 448), RoPE applied (theta 1e6), values
//   ~N(0, 0.02), token 0 an attention sink; queries aligned with the outlier channels.
// "gaussian": unit Gaussian K, V and Q (a control: no outliers, no small values).
// "small-values": K ~N(0, 1), V ~N(0, 0.002) (what FP8 at scale 1.0 flushes).
std::vector<std::string> synthetic_profiles();
// Throws InputError("--synthetic", ...) for an unknown profile.
std::unique_ptr<QkvSource> make_synthetic(std::string_view profile, const AttentionShape& shape,
                                          int64_t tokens, uint64_t seed = 1);

// ---------------------------------------------------------------- file inputs
// A .safetensors file with tensors named k/v/q (or key/value/query), or a folder holding
// k.npy, v.npy and optionally q.npy. K and V are [tokens, kv_heads, head_dim]; Q is
// [positions, q_heads, head_dim] and optional (the queries then are the keys just before
// each context end). dtypes: F32, F16, BF16 (safetensors) or <f4, <f2 (npy). Throws
// InputError on anything malformed (file, header, shape, dtype, byte count).
std::unique_ptr<QkvSource> load_qkv(const std::filesystem::path& path);

// ---------------------------------------------------------------- analysis
struct TensorMetrics {
  std::string format;  // canonical spec
  numerics::KvRole role = numerics::KvRole::key;
  numerics::ErrorStats error;
  numerics::EncodeCounts counts;
  double bits_per_element = 0.0;  // stored, scales included
  std::vector<float> scales;      // static scales used (1.0 when none / uncalibrated)
};

struct AttentionPoint {
  std::string format;
  int64_t context_tokens = 0;
  int64_t queries = 0;            // query vectors (heads x positions)
  int64_t nonfinite_queries = 0;  // queries whose output became NaN/inf
  double score_rel_rmse = 0.0;    // sqrt(sum (s' - s)^2 / sum s^2) over finite scores
  double kl_mean = 0.0;           // mean over finite queries of KL(p_ref || p_format), nats
  double kl_max = 0.0;
  double topk_agreement = 1.0;    // mean |topk_ref & topk_format| / k
  double output_rel_error = 0.0;  // sqrt(sum |o' - o|^2 / sum |o|^2) over finite queries
};

struct AnalysisOptions {
  std::vector<int64_t> contexts = {1024, 4096, 16384};  // ascending, <= source tokens
  int query_positions = 16;                             // decode steps after each context
  int top_k = 32;
  // Tokens a head's task reads, round-trips and folds at a time (rounded up to whole
  // KIVI groups): its buffers stay in L2. Results depend on it only through the order of
  // float sums.
  int64_t step_tokens = 128;
  // "calibrated" static scales come from the amax over all analysed K (V) tokens.
  bool calibrate = true;
};

struct QuantAnalysis {
  std::string source;
  AttentionShape shape;
  std::vector<numerics::KvFormat> formats;
  int64_t tokens = 0;                     // tokens analysed (the largest context)
  std::vector<TensorMetrics> tensors;     // per format, K then V
  std::vector<AttentionPoint> attention;  // per format x context, context ascending
  double attention_flops = 0.0;           // multiply-adds x 2 in the Q K^T and P V products
  // Time of each part. The analysis pass runs its parts in every head's task, so those
  // are their tasks' thread time divided by the thread count; the calibration pass
  // (reading every K/V token, amax) runs alone and is wall time.
  double attention_seconds = 0.0;
  double calibration_seconds = 0.0, load_seconds = 0.0, codec_seconds = 0.0,
         tensor_error_seconds = 0.0;
  double total_seconds = 0.0;
};

// Throws InputError for contexts larger than the source or shapes the formats cannot take.
QuantAnalysis analyze(const QkvSource& source, const std::vector<numerics::KvFormat>& formats,
                      const AnalysisOptions& options, ThreadPool& pool);

// The report `kvaudit quant` prints: tensor table, attention table, error-vs-context chart.
report::Report to_report(const QuantAnalysis& analysis);

}  // namespace kvaudit::quant
