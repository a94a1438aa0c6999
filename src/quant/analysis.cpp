// The quant analysis: one streaming pass over the K/V tokens, a task per KV head. Each
// step of tokens is encoded and decoded in every format (round_trip, exactly as a cache
// stores it), the tensor error is accumulated, and every requested context length whose
// range covers a key block folds it into online-softmax states for the reference and for
// each format, so a 128K-token sweep never materialises a whole tensor. KL divergence is
// accumulated online too: KL = sum p (s - t) - logsumexp(s) + logsumexp(t), with s/t
// reference/format logits.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <iterator>
#include <limits>
#include <mutex>
#include <numeric>
#include <tuple>

#include <fmt/format.h>

#include "quant/quant.h"
#include "util/util.h"

namespace kvaudit::quant {
namespace {

using numerics::KvFormat;
using numerics::KvRole;
using numerics::ScaleStrategy;

// Keys per score block: a block's scores ([key][column], three of them), its packed values
// and the keys stay in L2 with several contexts' queries.
constexpr int64_t kKeyBlock = 128;

// Whether the round trip of one head's part of each row gives the bits of that head's
// part of the whole-row round trip: when every scale the format uses lies within one head
// (static per tensor, head or channel; per token-head; groups and blocks that tile a head).
// A per-token scale spans the whole row.
bool head_separable(const KvFormat& format, const numerics::KvLayout& layout) {
  if (layout.kv_heads == 1) return true;
  switch (format.strategy) {
    case ScaleStrategy::token:
      return false;
    case ScaleStrategy::group:
    case ScaleStrategy::kivi:
    case ScaleStrategy::block:
      return format.group_size > 0 && layout.head_dim % format.group_size == 0;
    default:
      return true;
  }
}

// Head h's share of a (layer, role)'s static calibration, for a one-head layout.
numerics::StaticAmax calibration_of_head(const KvFormat& format, const numerics::KvLayout& layout,
                                         const numerics::StaticAmax& calibration, int h) {
  const auto slice = [&](const std::vector<float>& all) -> std::vector<float> {
    if (all.empty()) return all;
    if (format.strategy == ScaleStrategy::head) return {all.at(size_t(h))};
    if (format.strategy == ScaleStrategy::channel) {
      const auto begin = all.begin() + int64_t(h) * layout.head_dim;
      return {begin, begin + layout.head_dim};
    }
    return all;  // one per tensor
  };
  return {slice(calibration.amax), slice(calibration.scales)};
}

// Keeps the k largest (score, index) pairs seen so far (NaN never; ties to the lower
// index), cheaply: candidates go into a buffer that is pruned back to k when it reaches
// 4k. Candidates may be a superset of what an exact scan keeps (pruning sorts that out):
// the scan offers every non-NaN score until k are kept, then those above the threshold.
struct TopK {
  int k = 0;
  float threshold = -std::numeric_limits<float>::infinity();
  std::vector<std::pair<float, int64_t>> items;
  void prune() {
    if (int(items.size()) <= k) return;
    std::nth_element(items.begin(), items.begin() + (k - 1), items.end(), [](auto& a, auto& b) {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    });
    items.resize(size_t(k));
    threshold = std::min_element(items.begin(), items.end())->first;
  }
  bool full() const { return int(items.size()) >= k; }
  // The lowest score still worth offering (the scan keeps scores >= it).
  float scan_threshold() const {
    return full() ? std::nextafter(threshold, std::numeric_limits<float>::infinity())
                  : -std::numeric_limits<float>::infinity();
  }
  void offer(float score, int64_t index) {
    items.push_back({score, index});
    if (int(items.size()) >= 4 * k) prune();
  }
  std::vector<int64_t> indices() {
    prune();
    std::vector<int64_t> out;
    for (auto& item : items) out.push_back(item.second);
    std::sort(out.begin(), out.end());
    return out;
  }
};

// Online softmax over keys for the query rows of one KV head, one stream (the reference or
// a format). Rows are [context][position x query head of the group].
struct SoftmaxState {
  std::vector<float> max_logit, output;  // [rows], [rows * dim]
  // [rows] sum exp(s - max_logit), and (formats) sum exp(s - m_s) (s - t): in double, as
  // KL subtracts the logarithms of two such sums that are nearly equal.
  std::vector<double> sum_exp, kl_partial;
  std::vector<TopK> top;
  void init(int64_t rows, int64_t dim, int k) {
    max_logit.assign(size_t(rows), -std::numeric_limits<float>::infinity());
    sum_exp.assign(size_t(rows), 0.0);
    output.assign(size_t(rows * dim), 0.0f);
    kl_partial.assign(size_t(rows), 0.0);
    top.assign(size_t(rows), TopK{k, -std::numeric_limits<float>::infinity(), {}});
  }
};

// Everything one KV head accumulates, for every context: the queries, the reference and
// one state per format. The queries are columns, context after context (`context_pitch`
// columns each, zero padding after the nq real ones), so the contexts that all cover a
// key block are one matrix: the block's keys and values are read once for all of them.
struct HeadAccumulator {
  std::vector<float> queries_t;  // [dim][contexts * context_pitch]
  SoftmaxState reference;
  std::vector<SoftmaxState> formats;
  std::vector<double> score_error_sq, score_ref_sq;  // [context * formats + format]
};

// The layout of a fold: contexts [context_begin, context_end) of one head.
struct FoldShape {
  int64_t nq = 0;             // queries (rows) per context
  int64_t context_pitch = 0;  // columns per context
  int64_t queries_pitch = 0;  // row length of queries_t
  int64_t dim = 0;
  size_t context_begin = 0, context_end = 0;
  int64_t columns() const { return int64_t(context_end - context_begin) * context_pitch; }
  // Calls visit(column, row) for every real query of the fold.
  template <class Visit>
  void for_each_query(const Visit& visit) const {
    for (size_t ci = context_begin; ci < context_end; ++ci) {
      const int64_t column = int64_t(ci - context_begin) * context_pitch;
      for (int64_t q = 0; q < nq; ++q) visit(size_t(column + q), size_t(int64_t(ci) * nq + q));
    }
  }
};

// Per-block scratch of one thread: [key][column] arrays and per-column values.
struct FoldScratch {
  std::vector<float> ref_scores, probabilities, scores;  // [count, columns]
  std::vector<float> block_max, shift, sums, kl, error_sq, ref_sq, thresholds,
      output_rescale;                           // [columns]
  std::vector<double> rescale, format_rescale;  // [columns]
  std::vector<int32_t> candidates;              // [count * columns]
  std::vector<float> packed_values;             // [count, value_pitch]
  std::vector<TopK*> column_top;                // [columns]
  void size(int64_t count, int64_t columns, int64_t value_pitch) {
    for (auto* v : {&ref_scores, &probabilities, &scores}) v->resize(size_t(count * columns));
    for (auto* v :
         {&block_max, &shift, &sums, &kl, &error_sq, &ref_sq, &thresholds, &output_rescale}) {
      v->assign(size_t(columns), 0.0f);
    }
    rescale.resize(size_t(columns));
    format_rescale.resize(size_t(columns));
    candidates.resize(size_t(count * columns));
    packed_values.resize(size_t(count * value_pitch));
    column_top.assign(size_t(columns), nullptr);
  }
};

// Offers a block's scores ([count][columns], keys from `first`) to the queries' top k.
// Skipped whole when no query's block maximum reaches its threshold (the common case).
void offer_block(std::vector<TopK>& top, const float* scores_t, int64_t count,
                 const FoldShape& shape, int64_t first, FoldScratch& scratch) {
  const int64_t columns = shape.columns();
  bool any = false;
  // Padding columns: a threshold nothing reaches but +inf (which padding never holds:
  // its scores are 0 or NaN).
  std::fill(scratch.thresholds.begin(), scratch.thresholds.end(),
            std::numeric_limits<float>::infinity());
  shape.for_each_query([&](size_t column, size_t row) {
    TopK& t = top[row];
    scratch.column_top[column] = &t;
    scratch.thresholds[column] = t.scan_threshold();
    any = any || !t.full() || scratch.block_max[column] >= scratch.thresholds[column];
  });
  if (!any) return;
  const int64_t found = numerics::column_select_at_least(
      scores_t, count, columns, columns, scratch.thresholds.data(), scratch.candidates.data());
  for (int64_t i = 0; i < found; ++i) {
    const int32_t at = scratch.candidates[size_t(i)];
    TopK* t = scratch.column_top[size_t(at % columns)];
    if (t) t->offer(scores_t[at], first + at / columns);
  }
}

// Folds keys [first, first + count) of one KV head into the rows of contexts
// [shape.context_begin, shape.context_end), which all cover these keys. `keys[f]` and
// `values[f]` point at the head's slice of token `first` (row stride `stride`); index 0 is
// the reference. Scores are [key][column] (score_block_transposed), so the per-query
// bookkeeping runs down columns, a vector of queries at a time. Every column's figures are
// those of a fold of its context alone.
void fold_block(HeadAccumulator& acc, const FoldShape& shape, int64_t stride,
                const std::vector<const float*>& keys, const std::vector<const float*>& values,
                int64_t first, int64_t count) {
  const size_t streams = keys.size();
  const size_t format_count = streams - 1;
  const int64_t dim = shape.dim, columns = shape.columns();
  const int64_t value_pitch = dim + 8;  // off a power of two (see pack_rows)
  const float inv_sqrt_dim = float(1.0 / std::sqrt(double(dim)));
  thread_local FoldScratch scratch;
  scratch.size(count, columns, value_pitch);
  float* const ref_scores = scratch.ref_scores.data();
  float* const probabilities = scratch.probabilities.data();
  float* const scores = scratch.scores.data();
  const float* queries_t =
      acc.queries_t.data() + int64_t(shape.context_begin) * shape.context_pitch;
  // The online-softmax step for one stream: new maxima, rescale of the running sums (the
  // outputs' rescale is left in output_rescale for accumulate), exp of the block (in place
  // into `weights`) and its column sums. Padding columns keep a zero shift; their values
  // are never read.
  const auto softmax_step = [&](SoftmaxState& state, const float* block_scores, float* weights,
                                std::vector<double>& rescale) {
    shape.for_each_query([&](size_t column, size_t row) {
      const float m = std::max(state.max_logit[row], scratch.block_max[column]);
      rescale[column] = std::exp(double(state.max_logit[row]) - double(m));
      state.max_logit[row] = m;
      scratch.shift[column] = m;
    });
    numerics::column_exp_and_sum(block_scores, count, columns, scratch.shift.data(), weights,
                                 scratch.sums.data());
    shape.for_each_query([&](size_t column, size_t row) {
      state.sum_exp[row] = state.sum_exp[row] * rescale[column] + scratch.sums[column];
      scratch.output_rescale[column] = float(rescale[column]);
    });
  };
  // out = out * rescale + weights V for every context of the fold, V packed once.
  const auto accumulate = [&](const float* weights, const float* stream_values,
                              SoftmaxState& state) {
    numerics::pack_rows(stream_values, count, stride, dim, scratch.packed_values.data(),
                        value_pitch);
    for (size_t ci = shape.context_begin; ci < shape.context_end; ++ci) {
      const int64_t column = int64_t(ci - shape.context_begin) * shape.context_pitch;
      numerics::accumulate_weighted_transposed(weights + column, columns, shape.nq, count,
                                               scratch.packed_values.data(), value_pitch, dim,
                                               state.output.data() + int64_t(ci) * shape.nq * dim,
                                               dim, scratch.output_rescale.data() + column);
    }
  };
  numerics::score_block_transposed(queries_t, shape.queries_pitch, columns, dim, keys[0], count,
                                   stride, inv_sqrt_dim, ref_scores);
  numerics::column_max_ignoring_nan(ref_scores, count, columns, scratch.block_max.data());
  SoftmaxState& ref = acc.reference;
  offer_block(ref.top, ref_scores, count, shape, first, scratch);
  // The reference keeps exp(s - m_new) for the KL terms.
  softmax_step(ref, ref_scores, probabilities, scratch.rescale);
  accumulate(probabilities, values[0], ref);
  for (size_t f = 1; f < streams; ++f) {
    SoftmaxState& state = acc.formats[f - 1];
    numerics::score_block_transposed(queries_t, shape.queries_pitch, columns, dim, keys[f], count,
                                     stride, inv_sqrt_dim, scores);
    // NaN/inf in the format's scores propagate into KL: the query is then non-finite.
    numerics::column_divergence(ref_scores, scores, probabilities, count, columns,
                                scratch.kl.data(), scratch.error_sq.data(), scratch.ref_sq.data(),
                                scratch.block_max.data());
    for (size_t ci = shape.context_begin; ci < shape.context_end; ++ci) {
      double error_sq = 0, ref_sq = 0;
      const int64_t column = int64_t(ci - shape.context_begin) * shape.context_pitch;
      for (int64_t q = 0; q < shape.nq; ++q) {
        error_sq += scratch.error_sq[size_t(column + q)];
        ref_sq += scratch.ref_sq[size_t(column + q)];
      }
      acc.score_error_sq[ci * format_count + (f - 1)] += error_sq;
      acc.score_ref_sq[ci * format_count + (f - 1)] += ref_sq;
    }
    shape.for_each_query([&](size_t column, size_t row) {
      state.kl_partial[row] = state.kl_partial[row] * scratch.rescale[column] + scratch.kl[column];
    });
    offer_block(state.top, scores, count, shape, first, scratch);
    softmax_step(state, scores, scores, scratch.format_rescale);
    accumulate(scores, values[f], state);
  }
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// How pass 2 round-trips each format one KV head at a time: on the head's own rows; on
// them with each row's whole-row range (a scale per token over every head); or, for
// scales that span heads any other way, on whole rows, cut.
enum class HeadPath { own_rows, token_ranges, whole_rows };

// The checked inputs and what every pass shares.
struct Setup {
  Setup(const QkvSource& source_, const std::vector<KvFormat>& formats_,
        const AnalysisOptions& options_)
      : source(source_), formats(formats_), options(options_), shape(source_.shape()) {}
  const QkvSource& source;
  const std::vector<KvFormat>& formats;
  const AnalysisOptions& options;
  AttentionShape shape;
  numerics::KvLayout layout;
  int64_t n = 0, dim = 0;           // row elements (every head), head width
  int group = 0;                    // query heads per KV head
  std::vector<int64_t> contexts;    // ascending, unique
  int64_t total = 0;                // tokens analysed: the largest context
  int64_t step = 0;                 // tokens a head task handles at a time (whole KIVI groups)
  std::vector<HeadPath> head_path;  // [format]
  bool whole_rows = false, any_token_ranges = false;
  // The layout of the query columns (see HeadAccumulator).
  int64_t nq = 0, context_pitch = 0, queries_pitch = 0;

  void read_rows(KvRole role, int64_t first, int64_t count, std::span<float> out) const {
    if (role == KvRole::key) {
      source.keys(first, count, out);
    } else {
      source.values(first, count, out);
    }
  }
};

Setup set_up(const QkvSource& source, const std::vector<KvFormat>& formats,
             const AnalysisOptions& options) {
  Setup s(source, formats, options);
  s.layout = s.shape.kv_layout();
  s.n = s.layout.row_elements();
  s.dim = s.shape.head_dim;
  s.group = s.shape.q_heads / s.shape.kv_heads;
  s.contexts = options.contexts;
  std::sort(s.contexts.begin(), s.contexts.end());
  s.contexts.erase(std::unique(s.contexts.begin(), s.contexts.end()), s.contexts.end());
  if (s.contexts.empty()) throw InputError("--ctx", "no context length given");
  if (s.contexts.front() < 1) throw InputError("--ctx", "context lengths must be positive");
  if (s.contexts.back() > source.tokens()) {
    throw InputError("--ctx", fmt::format("context {} is longer than the input ({} tokens)",
                                          s.contexts.back(), source.tokens()));
  }
  if (formats.empty()) throw InputError("--formats", "no format given");
  for (const KvFormat& format : formats) numerics::validate_kv_layout(format, s.layout);
  if (options.top_k < 1) throw InputError("--top-k", "must be at least 1");
  s.total = s.contexts.back();
  // A step: the tokens a head task reads, round-trips and folds at a time, whole KIVI
  // groups (a step's quantised rows are whole groups).
  int64_t groups = 1;
  for (const KvFormat& format : formats) {
    if (format.strategy == ScaleStrategy::kivi)
      groups = std::lcm(groups, int64_t(format.group_tokens));
  }
  if (options.step_tokens < 1) throw InputError("step", "must be at least one token");
  s.step = (options.step_tokens + groups - 1) / groups * groups;
  s.head_path.resize(formats.size());
  for (size_t f = 0; f < formats.size(); ++f) {
    s.head_path[f] = head_separable(formats[f], s.layout)          ? HeadPath::own_rows
                     : formats[f].strategy == ScaleStrategy::token ? HeadPath::token_ranges
                                                                   : HeadPath::whole_rows;
    s.whole_rows = s.whole_rows || s.head_path[f] == HeadPath::whole_rows;
    s.any_token_ranges = s.any_token_ranges || s.head_path[f] == HeadPath::token_ranges;
  }
  s.nq = int64_t(s.group) * options.query_positions;
  s.context_pitch = numerics::column_pitch(s.nq);
  // Padded by 8 floats: a row length of a multiple of 4 cache lines (5 contexts of 64
  // queries) puts a query tile's rows in a quarter of L1's sets, and it no longer stays
  // in L1 while the keys stream past.
  s.queries_pitch = s.context_pitch * int64_t(s.contexts.size()) + 8;
  return s;
}

// Pass 1's results: per format and role, the static calibration (amax over every analysed
// token) and, for per-token formats, every token's whole-row range.
struct Calibration {
  std::vector<std::array<numerics::StaticAmax, 2>> amax;        // [format][role]
  std::vector<std::array<std::vector<float>, 2>> token_ranges;  // [format][role]
  std::vector<std::array<numerics::StaticAmax, 2>> head_amax;   // [format * heads + head]
};

// Pass 1: each task reads its spans of whole steps and takes every format's amax of them
// while they are in cache; maxima merge in any order to the same result.
Calibration calibration_pass(const Setup& s, ThreadPool& pool) {
  const size_t format_count = s.formats.size();
  Calibration c;
  c.amax.resize(format_count);
  c.token_ranges.resize(format_count);
  for (size_t f = 0; f < format_count; ++f)
    if (s.head_path[f] == HeadPath::token_ranges)
      for (auto& ranges : c.token_ranges[f]) ranges.resize(size_t(2 * s.total));
  if (s.options.calibrate || s.any_token_ranges) {
    std::mutex merge_mutex;
    const int64_t span = s.step;
    const int64_t spans = (s.total + span - 1) / span;
    pool.parallel_for(spans, int(std::min<int64_t>(spans, 256)), [&](int, int64_t b, int64_t e) {
      std::vector<std::array<numerics::StaticAmax, 2>> local(format_count);
      std::vector<float> rows;
      for (int64_t i = b; i < e; ++i) {
        const int64_t first = i * span, count = std::min(span, s.total - first);
        rows.resize(size_t(count * s.n));
        for (KvRole role : {KvRole::key, KvRole::value}) {
          s.read_rows(role, first, count, rows);
          for (size_t f = 0; f < format_count; ++f) {
            if (s.head_path[f] == HeadPath::token_ranges) {
              numerics::token_row_ranges(s.formats[f], s.layout, rows,
                                         std::span(c.token_ranges[f][size_t(role)])
                                             .subspan(size_t(2 * first), size_t(2 * count)));
            }
            if (!s.options.calibrate) continue;
            const numerics::StaticAmax part =
                numerics::calibrate_amax(s.formats[f], s.layout, rows);
            auto& amax = local[f][size_t(role)].amax;
            if (amax.empty()) amax.assign(part.amax.size(), 0.0f);
            for (size_t k = 0; k < part.amax.size(); ++k) amax[k] = std::max(amax[k], part.amax[k]);
          }
        }
      }
      const std::lock_guard<std::mutex> lock(merge_mutex);
      for (size_t f = 0; f < format_count; ++f) {
        for (size_t role = 0; role < 2; ++role) {
          auto& amax = c.amax[f][role].amax;
          const auto& part = local[f][role].amax;
          if (amax.empty()) amax.assign(part.size(), 0.0f);
          for (size_t k = 0; k < part.size(); ++k) amax[k] = std::max(amax[k], part[k]);
        }
      }
    });
  }
  const int heads = s.shape.kv_heads;
  c.head_amax.resize(format_count * size_t(heads));
  for (size_t f = 0; f < format_count; ++f)
    for (int h = 0; h < heads; ++h)
      for (size_t role = 0; role < 2; ++role)
        c.head_amax[f * size_t(heads) + size_t(h)][role] =
            calibration_of_head(s.formats[f], s.layout, c.amax[f][role], h);
  return c;
}

// The tensor metrics' fixed parts: [format * 2 + role].
std::vector<TensorMetrics> tensor_metrics(const Setup& s, const Calibration& c) {
  std::vector<TensorMetrics> out(s.formats.size() * 2);
  for (size_t f = 0; f < s.formats.size(); ++f) {
    for (KvRole role : {KvRole::key, KvRole::value}) {
      TensorMetrics& m = out[f * 2 + size_t(role)];
      m.format = s.formats[f].spec;
      m.role = role;
      m.bits_per_element = numerics::stored_bits_per_element(s.formats[f], s.layout, role);
      m.scales = numerics::static_scales(s.formats[f], s.layout, c.amax[f][size_t(role)]);
    }
  }
  return out;
}

// Attention accumulators: [kv head], rows [context][position x query head of the group],
// each head's queries transposed into its columns.
std::vector<HeadAccumulator> head_accumulators(const Setup& s) {
  const int64_t all_rows = s.nq * int64_t(s.contexts.size());
  std::vector<HeadAccumulator> heads(static_cast<size_t>(s.shape.kv_heads));
  for (HeadAccumulator& acc : heads) {
    acc.queries_t.assign(size_t(s.dim * s.queries_pitch), 0.0f);
    acc.reference.init(all_rows, s.dim, s.options.top_k);
    acc.formats.resize(s.formats.size());
    for (SoftmaxState& st : acc.formats) st.init(all_rows, s.dim, s.options.top_k);
    acc.score_error_sq.assign(s.contexts.size() * s.formats.size(), 0.0);
    acc.score_ref_sq.assign(s.contexts.size() * s.formats.size(), 0.0);
  }
  const int positions = s.options.query_positions;
  std::vector<float> q_rows(size_t(positions * s.shape.q_heads * s.dim));
  for (size_t ci = 0; ci < s.contexts.size(); ++ci) {
    s.source.queries(s.contexts[ci], positions, q_rows);
    for (int h = 0; h < s.shape.kv_heads; ++h) {
      std::vector<float>& queries_t = heads[size_t(h)].queries_t;
      for (int p = 0; p < positions; ++p) {
        for (int g = 0; g < s.group; ++g) {
          const float* src =
              q_rows.data() + (int64_t(p) * s.shape.q_heads + h * s.group + g) * s.dim;
          const int64_t column = int64_t(ci) * s.context_pitch + int64_t(p) * s.group + g;
          for (int64_t k = 0; k < s.dim; ++k)
            queries_t[size_t(k * s.queries_pitch + column)] = src[k];
        }
      }
    }
  }
  return heads;
}

// What one head's pass-2 work adds up to (merged in head order).
struct HeadResult {
  std::vector<numerics::EncodeCounts> counts;  // [format * 2 + role]
  std::vector<numerics::ErrorStats> errors;    // [format * 2 + role]
  double load_seconds = 0, codec_seconds = 0, error_seconds = 0, attention_seconds = 0;
};

// A run of contexts folded together over `usable` keys of a block: contexts that cover
// the whole block with the shared decoded K/V go in runs; one that ends in the block, or
// that sees KIVI-patched K/V, goes alone.
struct ContextRun {
  size_t context_begin, context_end;
  int64_t usable;
  bool shared;  // may take more contexts
};

// One pass-2 task: KV heads [head_begin, head_end), the tokens a step at a time. Its
// buffers are one head's rows of a step ([step, dim]: the reference and each format's
// decoded K and V, KIVI-patched copies of a block for a context that ends inside it) and
// the step's whole rows [step, n] with, for formats that need them, their round trips.
class HeadTask {
 public:
  HeadTask(const Setup& s, const Calibration& c, std::vector<HeadAccumulator>& heads,
           std::vector<HeadResult>& results, int64_t head_begin, int64_t head_end)
      : s_(s),
        c_(c),
        heads_(heads),
        results_(results),
        head_begin_(head_begin),
        head_end_(head_end),
        format_count_(s.formats.size()),
        timing_(results[size_t(head_begin)]),  // the task's time, by part, with its first head
        head_layout_{1, int(s.dim)} {
    const size_t rows = size_t(s.step * s.dim);
    ref_k_.resize(rows);
    ref_v_.resize(rows);
    dec_k_.assign(format_count_, std::vector<float>(rows));
    dec_v_ = patched_k_ = patched_v_ = dec_k_;
    rows_decoded_.resize(format_count_);
    patched_.resize(s.contexts.size());
    keys_.resize(format_count_ + 1);
    values_.resize(format_count_ + 1);
    for (int64_t h = head_begin; h < head_end; ++h) {
      results[size_t(h)].counts.assign(format_count_ * 2, numerics::EncodeCounts{});
      results[size_t(h)].errors.assign(format_count_ * 2, numerics::ErrorStats{});
    }
  }

  void run() {
    clock_ = std::chrono::steady_clock::now();
    for (int64_t first = 0; first < s_.total; first += s_.step) {
      const int64_t count = std::min(s_.step, s_.total - first);
      if (s_.whole_rows) round_trip_whole_rows(first, count);
      for (int64_t h = head_begin_; h < head_end_; ++h) {
        round_trip_head(h, first, count);
        fold_step(h, first, count);
        lap(timing_.attention_seconds);
      }
    }
  }

 private:
  void lap(double& seconds) {
    const auto now = std::chrono::steady_clock::now();
    seconds += std::chrono::duration<double>(now - clock_).count();
    clock_ = now;
  }
  void cut_head(const std::vector<float>& rows, int64_t h, int64_t count, float* head_rows) const {
    for (int64_t t = 0; t < count; ++t)
      std::copy_n(rows.data() + t * s_.n + h * s_.dim, s_.dim, head_rows + t * s_.dim);
  }
  // dst[i] = bf16(src[i]) widened back, for i < count.
  void to_bf16(const float* src, float* dst, size_t count) {
    as_bf16_.resize(count);
    numerics::float_to_bf16_bulk({src, count}, as_bf16_);
    numerics::bf16_to_float_bulk(as_bf16_, {dst, count});
  }
  // KIVI: tokens from the residual window of the largest context on stay BF16 (they are
  // BF16 for every smaller context too); the rest is quantised group by group. Returns
  // the format as round-tripped and the step's quantised token count.
  std::pair<KvFormat, int64_t> step_format(size_t f, int64_t first, int64_t count) const {
    KvFormat format = s_.formats[f];
    const int64_t quantized_end =
        std::clamp(numerics::quantized_tokens(format, s_.total) - first, int64_t(0), count);
    format.residual_tokens = 0;
    return {format, quantized_end};
  }

  // The step's whole rows through every format that needs them (scales spanning heads);
  // the task of head 0 counts their codes, as every task round-trips the same rows.
  void round_trip_whole_rows(int64_t first, int64_t count) {
    rows_k_.resize(size_t(count * s_.n));
    rows_v_.resize(size_t(count * s_.n));
    s_.read_rows(KvRole::key, first, count, rows_k_);
    s_.read_rows(KvRole::value, first, count, rows_v_);
    lap(timing_.load_seconds);
    for (size_t f = 0; f < format_count_; ++f) {
      if (s_.head_path[f] != HeadPath::whole_rows) continue;
      const auto [format, quantized_end] = step_format(f, first, count);
      for (KvRole role : {KvRole::key, KvRole::value}) {
        const std::vector<float>& rows = role == KvRole::key ? rows_k_ : rows_v_;
        std::vector<float>& decoded = rows_decoded_[f][size_t(role)];
        decoded.resize(rows.size());
        const numerics::EncodeCounts counts =
            numerics::round_trip_into(format, s_.layout, role, c_.amax[f][size_t(role)],
                                      std::span(rows).first(size_t(quantized_end * s_.n)), decoded);
        if (head_begin_ == 0) results_[0].counts[f * 2 + size_t(role)].merge(counts);
      }
    }
    lap(timing_.codec_seconds);
  }

  // Head h's rows of the step: read (or cut from the whole rows), through every format,
  // the tensor error added.
  void round_trip_head(int64_t h, int64_t first, int64_t count) {
    HeadResult& out = results_[size_t(h)];
    const size_t size = size_t(count * s_.dim);
    if (s_.whole_rows) {
      cut_head(rows_k_, h, count, ref_k_.data());
      cut_head(rows_v_, h, count, ref_v_.data());
    } else {
      s_.source.head_keys(first, count, int(h), std::span(ref_k_).first(size));
      s_.source.head_values(first, count, int(h), std::span(ref_v_).first(size));
    }
    lap(timing_.load_seconds);
    for (size_t f = 0; f < format_count_; ++f) {
      const auto [format, quantized_end] = step_format(f, first, count);
      for (KvRole role : {KvRole::key, KvRole::value}) {
        const bool key = role == KvRole::key;
        const std::span<const float> ref =
            std::span<const float>(key ? ref_k_ : ref_v_).first(size);
        std::vector<float>& decoded = key ? dec_k_[f] : dec_v_[f];
        const size_t index = f * 2 + size_t(role);
        if (s_.head_path[f] == HeadPath::own_rows) {
          out.counts[index].merge(numerics::round_trip_into(
              format, head_layout_, role,
              c_.head_amax[f * size_t(s_.shape.kv_heads) + size_t(h)][size_t(role)],
              ref.first(size_t(quantized_end * s_.dim)), decoded));
        } else if (s_.head_path[f] == HeadPath::token_ranges) {
          out.counts[index].merge(numerics::round_trip_head_rows(
              format, int(s_.dim), role, ref.first(size_t(quantized_end * s_.dim)),
              std::span<const float>(c_.token_ranges[f][size_t(role)])
                  .subspan(size_t(2 * first), size_t(2 * quantized_end)),
              decoded));
        } else {
          cut_head(rows_decoded_[f][size_t(role)], h, quantized_end, decoded.data());
        }
        if (quantized_end < count) {  // the BF16 tail
          to_bf16(ref.data() + quantized_end * s_.dim, decoded.data() + quantized_end * s_.dim,
                  size_t((count - quantized_end) * s_.dim));
        }
        lap(timing_.codec_seconds);
        out.errors[index].add(ref, std::span<const float>(decoded).first(size));
        lap(timing_.error_seconds);
      }
    }
  }

  // Folds each key block of head h's step into every context that covers it.
  void fold_step(int64_t h, int64_t first, int64_t count) {
    HeadAccumulator& acc = heads_[size_t(h)];
    const int64_t dim = s_.dim;
    for (int64_t b = 0; b < count; b += kKeyBlock) {
      const int64_t block = std::min(kKeyBlock, count - b), block_first = first + b;
      runs_.clear();
      for (size_t ci = 0; ci < s_.contexts.size(); ++ci) {
        const int64_t context = s_.contexts[ci];
        patched_[ci] = false;
        if (block_first >= context) continue;
        const int64_t usable = std::min(block, context - block_first);
        for (const KvFormat& format : s_.formats) {
          patched_[ci] =
              patched_[ci] || (format.strategy == ScaleStrategy::kivi &&
                               numerics::quantized_tokens(format, context) - block_first < usable);
        }
        const bool shared = !patched_[ci] && usable == block;
        if (shared && !runs_.empty() && runs_.back().shared && runs_.back().context_end == ci) {
          runs_.back().context_end = ci + 1;
        } else {
          runs_.push_back({ci, ci + 1, usable, shared});
        }
      }
      for (const ContextRun& run : runs_) {
        const size_t ci = run.context_begin;
        keys_[0] = ref_k_.data() + b * dim;
        values_[0] = ref_v_.data() + b * dim;
        for (size_t f = 0; f < format_count_; ++f) {
          keys_[f + 1] = dec_k_[f].data() + b * dim;
          values_[f + 1] = dec_v_[f].data() + b * dim;
          const int64_t quantized =
              numerics::quantized_tokens(s_.formats[f], s_.contexts[ci]) - block_first;
          if (!patched_[ci] || s_.formats[f].strategy != ScaleStrategy::kivi ||
              quantized >= run.usable)
            continue;
          // KIVI at a context that ends in this block: its tokens at and past the
          // context's quantised prefix are BF16.
          const size_t kept = size_t(std::max<int64_t>(0, quantized) * dim);
          const size_t used = size_t(run.usable * dim);
          for (auto [decoded, copy, reference] :
               {std::tuple{keys_[f + 1], &patched_k_[f], keys_[0]},
                std::tuple{values_[f + 1], &patched_v_[f], values_[0]}}) {
            std::copy_n(decoded, kept, copy->data());
            to_bf16(reference + kept, copy->data() + kept, used - kept);
          }
          keys_[f + 1] = patched_k_[f].data();
          values_[f + 1] = patched_v_[f].data();
        }
        const FoldShape fold{s_.nq, s_.context_pitch,  s_.queries_pitch,
                             dim,   run.context_begin, run.context_end};
        fold_block(acc, fold, dim, keys_, values_, block_first, run.usable);
      }
    }
  }

  const Setup& s_;
  const Calibration& c_;
  std::vector<HeadAccumulator>& heads_;
  std::vector<HeadResult>& results_;
  const int64_t head_begin_, head_end_;
  const size_t format_count_;
  HeadResult& timing_;
  const numerics::KvLayout head_layout_;
  std::chrono::steady_clock::time_point clock_;
  std::vector<float> ref_k_, ref_v_, rows_k_, rows_v_;
  std::vector<std::vector<float>> dec_k_, dec_v_, patched_k_, patched_v_;
  std::vector<std::array<std::vector<float>, 2>> rows_decoded_;  // [format][role]
  std::vector<uint16_t> as_bf16_;
  std::vector<ContextRun> runs_;
  std::vector<char> patched_;
  std::vector<const float*> keys_, values_;
};

// Pass 2: a task per KV head walks the tokens a step at a time: it reads the head's K
// and V, round-trips them through every format, tallies them and adds the tensor error,
// then folds each key block into every context that covers it. What a step touches is
// the head's own and small (a few hundred KB: it stays in L2, where the GEMMs run at
// full speed; a pipeline of shared whole-row chunks ran them from memory at half). The
// per-head results merge in head order, so the figures do not depend on the thread
// count. A scale per token over every head is taken from the row's range (pass 1);
// formats whose scales span heads any other way (groups wider than a head) are
// round-tripped on whole rows and cut, their counts taken once, by head 0's task.
std::vector<HeadResult> head_pass(const Setup& s, const Calibration& c,
                                  std::vector<HeadAccumulator>& heads, ThreadPool& pool) {
  std::vector<HeadResult> results(static_cast<size_t>(s.shape.kv_heads));
  // Tasks: a KV head each; when a format needs whole rows, a run of heads per thread, so
  // whole rows are read and round-tripped once per step per thread rather than per head.
  const int tasks =
      s.whole_rows ? std::clamp(pool.threads(), 1, s.shape.kv_heads) : s.shape.kv_heads;
  pool.parallel_for(s.shape.kv_heads, tasks, [&](int, int64_t head_begin, int64_t head_end) {
    HeadTask(s, c, heads, results, head_begin, head_end).run();
  });
  return results;
}

// The final metrics of one (format, context) from every head's accumulators.
AttentionPoint attention_point(const Setup& s, std::vector<HeadAccumulator>& heads, size_t f,
                               size_t ci) {
  AttentionPoint point;
  point.format = s.formats[f].spec;
  point.context_tokens = s.contexts[ci];
  const int64_t nq = s.nq, dim = s.dim;
  double kl_sum = 0, out_err = 0, out_ref = 0, agree = 0, err_sq = 0, ref_sq = 0;
  int64_t finite = 0;
  for (HeadAccumulator& acc : heads) {
    err_sq += acc.score_error_sq[ci * s.formats.size() + f];
    ref_sq += acc.score_ref_sq[ci * s.formats.size() + f];
    SoftmaxState& ref = acc.reference;
    SoftmaxState& st = acc.formats[f];
    for (int64_t row = int64_t(ci) * nq; row < int64_t(ci + 1) * nq; ++row) {
      const size_t q = size_t(row);
      ++point.queries;
      const double log_z_ref = ref.max_logit[q] + std::log(double(ref.sum_exp[q]));
      const double log_z = st.max_logit[q] + std::log(double(st.sum_exp[q]));
      const double kl = st.kl_partial[q] / ref.sum_exp[q] - log_z_ref + log_z;
      double e = 0, r = 0;
      bool ok = std::isfinite(kl);
      for (int64_t k = 0; k < dim && ok; ++k) {
        const double o_ref = ref.output[q * size_t(dim) + size_t(k)] / ref.sum_exp[q];
        const double o = st.output[q * size_t(dim) + size_t(k)] / st.sum_exp[q];
        ok = std::isfinite(o);
        e += (o - o_ref) * (o - o_ref);
        r += o_ref * o_ref;
      }
      if (!ok) {
        ++point.nonfinite_queries;
        continue;
      }
      ++finite;
      kl_sum += std::max(0.0, kl);
      point.kl_max = std::max(point.kl_max, std::max(0.0, kl));
      out_err += e;
      out_ref += r;
      const std::vector<int64_t> a = ref.top[q].indices();
      const std::vector<int64_t> b = st.top[q].indices();
      std::vector<int64_t> common;
      std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(common));
      agree += a.empty() ? 1.0 : double(common.size()) / double(a.size());
    }
  }
  point.score_rel_rmse = ref_sq > 0 ? std::sqrt(err_sq / ref_sq) : 0.0;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  point.kl_mean = finite ? kl_sum / double(finite) : nan;
  point.topk_agreement = finite ? agree / double(finite) : nan;
  point.output_rel_error = finite && out_ref > 0 ? std::sqrt(out_err / out_ref) : nan;
  if (!finite) point.kl_max = nan;
  return point;
}

}  // namespace

// The passes: set_up (checks, steps, how each format goes through a head), calibration
// (pass 1), the accumulators with their queries, head_pass (pass 2), then the merge in
// head order and the metrics per (format, context).
QuantAnalysis analyze(const QkvSource& source, const std::vector<KvFormat>& formats,
                      const AnalysisOptions& options, ThreadPool& pool) {
  const auto start = std::chrono::steady_clock::now();
  QuantAnalysis result;
  result.source = source.description();
  result.shape = source.shape();
  result.formats = formats;
  const Setup s = set_up(source, formats, options);
  result.tokens = s.total;

  const auto calibration_start = std::chrono::steady_clock::now();
  const Calibration calibration = calibration_pass(s, pool);
  result.tensors = tensor_metrics(s, calibration);
  std::vector<HeadAccumulator> heads = head_accumulators(s);
  result.calibration_seconds = seconds_since(calibration_start);

  const std::vector<HeadResult> head_results = head_pass(s, calibration, heads, pool);
  const size_t format_count = formats.size();
  double attention_thread_seconds = 0.0, flops = 0.0;
  double load_thread_seconds = 0.0, codec_thread_seconds = 0.0, error_thread_seconds = 0.0;
  for (const HeadResult& part : head_results) {
    for (size_t i = 0; i < format_count * 2; ++i) {
      result.tensors[i].counts.merge(part.counts[i]);
      result.tensors[i].error.merge(part.errors[i]);
    }
    load_thread_seconds += part.load_seconds;
    codec_thread_seconds += part.codec_seconds;
    error_thread_seconds += part.error_seconds;
    attention_thread_seconds += part.attention_seconds;
  }
  for (int64_t context : s.contexts) {
    flops += 4.0 * double(s.nq) * double(context) * double(s.dim) * double(s.shape.kv_heads) *
             double(format_count + 1);
  }
  // Parts overlap in time: each is reported as its tasks' thread time over the threads.
  const double threads = pool.threads();
  result.load_seconds = load_thread_seconds / threads;
  result.codec_seconds = codec_thread_seconds / threads;
  result.tensor_error_seconds = error_thread_seconds / threads;

  for (size_t f = 0; f < format_count; ++f)
    for (size_t ci = 0; ci < s.contexts.size(); ++ci)
      result.attention.push_back(attention_point(s, heads, f, ci));
  result.attention_flops = flops;
  result.attention_seconds = attention_thread_seconds / threads;
  result.total_seconds = seconds_since(start);
  return result;
}

}  // namespace kvaudit::quant
