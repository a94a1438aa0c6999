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

}  // namespace

QuantAnalysis analyze(const QkvSource& source, const std::vector<KvFormat>& formats,
                      const AnalysisOptions& options, numerics::ThreadPool& pool) {
  const auto start = std::chrono::steady_clock::now();
  QuantAnalysis result;
  result.source = source.description();
  result.shape = source.shape();
  result.formats = formats;
  const AttentionShape shape = source.shape();
  const numerics::KvLayout layout = shape.kv_layout();
  const int64_t n = layout.row_elements(), dim = shape.head_dim;
  const int group = shape.q_heads / shape.kv_heads;
  std::vector<int64_t> contexts = options.contexts;
  std::sort(contexts.begin(), contexts.end());
  contexts.erase(std::unique(contexts.begin(), contexts.end()), contexts.end());
  if (contexts.empty()) throw InputError("--ctx", "no context length given");
  if (contexts.front() < 1) throw InputError("--ctx", "context lengths must be positive");
  if (contexts.back() > source.tokens()) {
    throw InputError("--ctx", fmt::format("context {} is longer than the input ({} tokens)",
                                          contexts.back(), source.tokens()));
  }
  if (formats.empty()) throw InputError("--formats", "no format given");
  for (const KvFormat& format : formats) numerics::validate_kv_layout(format, layout);
  if (options.top_k < 1) throw InputError("--top-k", "must be at least 1");
  const int64_t total = contexts.back();
  result.tokens = total;
  // A step: the tokens a head task reads, round-trips and folds at a time, whole KIVI
  // groups (a step's quantised rows are whole groups).
  int64_t groups = 1;
  for (const KvFormat& format : formats) {
    if (format.strategy == ScaleStrategy::kivi)
      groups = std::lcm(groups, int64_t(format.group_tokens));
  }
  if (options.step_tokens < 1) throw InputError("step", "must be at least one token");
  const int64_t step = (options.step_tokens + groups - 1) / groups * groups;
  // The calibration pass reads spans of whole steps.
  const int64_t span = step;
  const auto read_rows = [&](KvRole role, int64_t first, int64_t count, std::span<float> out) {
    if (role == KvRole::key) {
      source.keys(first, count, out);
    } else {
      source.values(first, count, out);
    }
  };

  // How pass 2 round-trips each format one KV head at a time: on the head's own rows; on
  // them with each row's whole-row range (a scale per token over every head); or, for
  // scales that span heads any other way, on whole rows, cut.
  enum class HeadPath { own_rows, token_ranges, whole_rows };
  std::vector<HeadPath> head_path(formats.size());
  bool whole_rows = false, any_token_ranges = false;
  // [format][role]: every token's whole-row range, for the token_ranges formats.
  std::vector<std::array<std::vector<float>, 2>> token_ranges(formats.size());
  for (size_t f = 0; f < formats.size(); ++f) {
    head_path[f] = head_separable(formats[f], layout)            ? HeadPath::own_rows
                   : formats[f].strategy == ScaleStrategy::token ? HeadPath::token_ranges
                                                                 : HeadPath::whole_rows;
    whole_rows = whole_rows || head_path[f] == HeadPath::whole_rows;
    if (head_path[f] == HeadPath::token_ranges) {
      any_token_ranges = true;
      for (auto& ranges : token_ranges[f]) ranges.resize(size_t(2 * total));
    }
  }

  // Pass 1: calibration (amax over every analysed token) for static scales, and the
  // whole-row ranges of per-token formats. Each task reads its spans and takes every
  // format's amax of them while they are in cache; maxima merge in any order to the same
  // result.
  const auto calibration_start = std::chrono::steady_clock::now();
  std::vector<std::array<numerics::StaticAmax, 2>> calibration(formats.size());
  if (options.calibrate || any_token_ranges) {
    std::mutex merge_mutex;
    const int64_t spans = (total + span - 1) / span;
    pool.parallel_for(spans, int(std::min<int64_t>(spans, 256)), [&](int, int64_t b, int64_t e) {
      std::vector<std::array<numerics::StaticAmax, 2>> local(formats.size());
      std::vector<float> rows;
      for (int64_t s = b; s < e; ++s) {
        const int64_t first = s * span, count = std::min(span, total - first);
        rows.resize(size_t(count * n));
        for (KvRole role : {KvRole::key, KvRole::value}) {
          read_rows(role, first, count, rows);
          for (size_t f = 0; f < formats.size(); ++f) {
            if (head_path[f] == HeadPath::token_ranges) {
              numerics::token_row_ranges(formats[f], layout, rows,
                                         std::span(token_ranges[f][size_t(role)])
                                             .subspan(size_t(2 * first), size_t(2 * count)));
            }
            if (!options.calibrate) continue;
            const numerics::StaticAmax part = numerics::calibrate_amax(formats[f], layout, rows);
            auto& amax = local[f][size_t(role)].amax;
            if (amax.empty()) amax.assign(part.amax.size(), 0.0f);
            for (size_t i = 0; i < part.amax.size(); ++i) amax[i] = std::max(amax[i], part.amax[i]);
          }
        }
      }
      const std::lock_guard<std::mutex> lock(merge_mutex);
      for (size_t f = 0; f < formats.size(); ++f) {
        for (size_t role = 0; role < 2; ++role) {
          auto& amax = calibration[f][role].amax;
          const auto& part = local[f][role].amax;
          if (amax.empty()) amax.assign(part.size(), 0.0f);
          for (size_t i = 0; i < part.size(); ++i) amax[i] = std::max(amax[i], part[i]);
        }
      }
    });
  }

  // Tensor metric accumulators: [format][role].
  result.tensors.resize(formats.size() * 2);
  for (size_t f = 0; f < formats.size(); ++f) {
    for (KvRole role : {KvRole::key, KvRole::value}) {
      TensorMetrics& m = result.tensors[f * 2 + size_t(role)];
      m.format = formats[f].spec;
      m.role = role;
      m.bits_per_element = numerics::stored_bits_per_element(formats[f], layout, role);
      m.scales = numerics::static_scales(formats[f], layout, calibration[f][size_t(role)]);
    }
  }

  // Attention accumulators: [kv head], rows [context][position x query head of the group].
  const int64_t nq = int64_t(group) * options.query_positions;
  const int64_t context_pitch = numerics::column_pitch(nq);
  // Padded by 8 floats: a row length of a multiple of 4 cache lines (5 contexts of 64
  // queries) puts a query tile's rows in a quarter of L1's sets, and it no longer stays
  // in L1 while the keys stream past.
  const int64_t queries_pitch = context_pitch * int64_t(contexts.size()) + 8;
  const int64_t all_rows = nq * int64_t(contexts.size());
  std::vector<HeadAccumulator> heads(static_cast<size_t>(shape.kv_heads));
  for (HeadAccumulator& acc : heads) {
    acc.queries_t.assign(size_t(dim * queries_pitch), 0.0f);
    acc.reference.init(all_rows, dim, options.top_k);
    acc.formats.resize(formats.size());
    for (SoftmaxState& s : acc.formats) s.init(all_rows, dim, options.top_k);
    acc.score_error_sq.assign(contexts.size() * formats.size(), 0.0);
    acc.score_ref_sq.assign(contexts.size() * formats.size(), 0.0);
  }
  {
    std::vector<float> q_rows(size_t(options.query_positions * shape.q_heads * dim));
    for (size_t ci = 0; ci < contexts.size(); ++ci) {
      source.queries(contexts[ci], options.query_positions, q_rows);
      for (int h = 0; h < shape.kv_heads; ++h) {
        std::vector<float>& queries_t = heads[size_t(h)].queries_t;
        for (int p = 0; p < options.query_positions; ++p) {
          for (int g = 0; g < group; ++g) {
            const float* src = q_rows.data() + (int64_t(p) * shape.q_heads + h * group + g) * dim;
            const int64_t column = int64_t(ci) * context_pitch + int64_t(p) * group + g;
            for (int64_t c = 0; c < dim; ++c)
              queries_t[size_t(c * queries_pitch + column)] = src[c];
          }
        }
      }
    }
  }

  result.calibration_seconds = seconds_since(calibration_start);

  // Pass 2: a task per KV head walks the tokens a step at a time: it reads the head's K
  // and V, round-trips them through every format, tallies them and adds the tensor error,
  // then folds each key block into every context that covers it. What a step touches is
  // the head's own and small (a few hundred KB: it stays in L2, where the GEMMs run at
  // full speed; a pipeline of shared whole-row chunks ran them from memory at half). The
  // per-head results merge in head order, so the figures do not depend on the thread
  // count. A scale per token over every head is taken from the row's range (pass 1);
  // formats whose scales span heads any other way (groups wider than a head) are
  // round-tripped on whole rows and cut, their counts taken once, by head 0's task.
  const numerics::KvLayout head_layout{1, int(dim)};
  std::vector<std::array<numerics::StaticAmax, 2>> head_calibration(formats.size() *
                                                                    size_t(shape.kv_heads));
  for (size_t f = 0; f < formats.size(); ++f) {
    for (int h = 0; h < shape.kv_heads; ++h) {
      for (size_t role = 0; role < 2; ++role) {
        head_calibration[f * size_t(shape.kv_heads) + size_t(h)][role] =
            calibration_of_head(formats[f], layout, calibration[f][role], h);
      }
    }
  }
  struct HeadResult {
    std::vector<numerics::EncodeCounts> counts;  // [format * 2 + role]
    std::vector<numerics::ErrorStats> errors;    // [format * 2 + role]
    double load_seconds = 0, codec_seconds = 0, error_seconds = 0, attention_seconds = 0;
  };
  std::vector<HeadResult> head_results(static_cast<size_t>(shape.kv_heads));
  // A run of contexts folded together over `usable` keys of a block: contexts that cover
  // the whole block with the shared decoded K/V go in runs; one that ends in the block, or
  // that sees KIVI-patched K/V, goes alone.
  struct ContextRun {
    size_t context_begin, context_end;
    int64_t usable;
    bool shared;  // may take more contexts
  };
  const size_t format_count = formats.size();
  // Tasks: a KV head each; when a format needs whole rows, a run of heads per thread, so
  // whole rows are read and round-tripped once per step per thread rather than per head.
  const int tasks = whole_rows ? std::clamp(pool.threads(), 1, shape.kv_heads) : shape.kv_heads;
  pool.parallel_for(shape.kv_heads, tasks, [&](int, int64_t head_begin, int64_t head_end) {
    for (int64_t h = head_begin; h < head_end; ++h) {
      head_results[size_t(h)].counts.assign(format_count * 2, numerics::EncodeCounts{});
      head_results[size_t(h)].errors.assign(format_count * 2, numerics::ErrorStats{});
    }
    // The task's time, by part, is kept with its first head.
    HeadResult& timing = head_results[size_t(head_begin)];
    auto clock = std::chrono::steady_clock::now();
    const auto lap = [&](double& seconds) {
      const auto now = std::chrono::steady_clock::now();
      seconds += std::chrono::duration<double>(now - clock).count();
      clock = now;
    };
    // One head's rows of a step, [step, dim]: the reference and each format's decoded K
    // and V, and KIVI-patched copies of a block for a context that ends inside it. Whole
    // rows [step, n] of the step and, for each format that needs them, their round trips.
    std::vector<float> ref_k(size_t(step * dim)), ref_v(size_t(step * dim));
    std::vector<std::vector<float>> dec_k(format_count, std::vector<float>(size_t(step * dim)));
    std::vector<std::vector<float>> dec_v = dec_k, patched_k = dec_k, patched_v = dec_k;
    std::vector<float> rows_k, rows_v;
    std::vector<std::array<std::vector<float>, 2>> rows_decoded(format_count);  // [format][role]
    std::vector<uint16_t> as_bf16;
    const auto cut_head = [&](const std::vector<float>& rows, int64_t h, int64_t count,
                              float* head_rows) {
      for (int64_t t = 0; t < count; ++t)
        std::copy_n(rows.data() + t * n + h * dim, dim, head_rows + t * dim);
    };
    // dst[i] = bf16(src[i]) widened back, for i < count.
    const auto to_bf16 = [&](const float* src, float* dst, size_t count) {
      as_bf16.resize(count);
      numerics::float_to_bf16_bulk({src, count}, as_bf16);
      numerics::bf16_to_float_bulk(as_bf16, {dst, count});
    };
    // KIVI: tokens from the residual window of the largest context on stay BF16 (they are
    // BF16 for every smaller context too); the rest is quantised group by group. Returns
    // the format as round-tripped and the step's quantised token count.
    const auto step_format = [&](size_t f, int64_t first, int64_t count) {
      KvFormat format = formats[f];
      const int64_t quantized_end =
          std::clamp(numerics::quantized_tokens(format, total) - first, int64_t(0), count);
      format.residual_tokens = 0;
      return std::pair{format, quantized_end};
    };
    std::vector<ContextRun> runs;
    std::vector<char> patched(contexts.size());
    std::vector<const float*> keys(format_count + 1), values(format_count + 1);
    for (int64_t first = 0; first < total; first += step) {
      const int64_t count = std::min(step, total - first);
      const size_t size = size_t(count * dim);
      if (whole_rows) {
        rows_k.resize(size_t(count * n));
        rows_v.resize(size_t(count * n));
        read_rows(KvRole::key, first, count, rows_k);
        read_rows(KvRole::value, first, count, rows_v);
        lap(timing.load_seconds);
        for (size_t f = 0; f < format_count; ++f) {
          if (head_path[f] != HeadPath::whole_rows) continue;
          const auto [format, quantized_end] = step_format(f, first, count);
          for (KvRole role : {KvRole::key, KvRole::value}) {
            const std::vector<float>& rows = role == KvRole::key ? rows_k : rows_v;
            std::vector<float>& decoded = rows_decoded[f][size_t(role)];
            decoded.resize(rows.size());
            const numerics::EncodeCounts counts = numerics::round_trip_into(
                format, layout, role, calibration[f][size_t(role)],
                std::span(rows).first(size_t(quantized_end * n)), decoded);
            // Every task round-trips the whole rows: the task of head 0 counts them.
            if (head_begin == 0) head_results[0].counts[f * 2 + size_t(role)].merge(counts);
          }
        }
        lap(timing.codec_seconds);
      }
      for (int64_t h = head_begin; h < head_end; ++h) {
        HeadResult& out = head_results[size_t(h)];
        HeadAccumulator& acc = heads[size_t(h)];
        if (whole_rows) {
          cut_head(rows_k, h, count, ref_k.data());
          cut_head(rows_v, h, count, ref_v.data());
        } else {
          source.head_keys(first, count, int(h), std::span(ref_k).first(size));
          source.head_values(first, count, int(h), std::span(ref_v).first(size));
        }
        lap(timing.load_seconds);
        for (size_t f = 0; f < format_count; ++f) {
          const auto [format, quantized_end] = step_format(f, first, count);
          for (KvRole role : {KvRole::key, KvRole::value}) {
            const bool key = role == KvRole::key;
            const std::span<const float> ref =
                std::span<const float>(key ? ref_k : ref_v).first(size);
            std::vector<float>& decoded = key ? dec_k[f] : dec_v[f];
            const size_t index = f * 2 + size_t(role);
            if (head_path[f] == HeadPath::own_rows) {
              out.counts[index].merge(numerics::round_trip_into(
                  format, head_layout, role,
                  head_calibration[f * size_t(shape.kv_heads) + size_t(h)][size_t(role)],
                  ref.first(size_t(quantized_end * dim)), decoded));
            } else if (head_path[f] == HeadPath::token_ranges) {
              out.counts[index].merge(numerics::round_trip_head_rows(
                  format, int(dim), role, ref.first(size_t(quantized_end * dim)),
                  std::span<const float>(token_ranges[f][size_t(role)])
                      .subspan(size_t(2 * first), size_t(2 * quantized_end)),
                  decoded));
            } else {
              cut_head(rows_decoded[f][size_t(role)], h, quantized_end, decoded.data());
            }
            if (quantized_end < count) {  // the BF16 tail
              to_bf16(ref.data() + quantized_end * dim, decoded.data() + quantized_end * dim,
                      size_t((count - quantized_end) * dim));
            }
            lap(timing.codec_seconds);
            out.errors[index].add(ref, std::span<const float>(decoded).first(size));
            lap(timing.error_seconds);
          }
        }
        for (int64_t b = 0; b < count; b += kKeyBlock) {
          const int64_t block = std::min(kKeyBlock, count - b), block_first = first + b;
          runs.clear();
          for (size_t ci = 0; ci < contexts.size(); ++ci) {
            const int64_t context = contexts[ci];
            patched[ci] = false;
            if (block_first >= context) continue;
            const int64_t usable = std::min(block, context - block_first);
            for (const KvFormat& format : formats) {
              patched[ci] =
                  patched[ci] || (format.strategy == ScaleStrategy::kivi &&
                                  numerics::quantized_tokens(format, context) - block_first < usable);
            }
            const bool shared = !patched[ci] && usable == block;
            if (shared && !runs.empty() && runs.back().shared && runs.back().context_end == ci) {
              runs.back().context_end = ci + 1;
            } else {
              runs.push_back({ci, ci + 1, usable, shared});
            }
          }
          for (const ContextRun& run : runs) {
            const size_t ci = run.context_begin;
            keys[0] = ref_k.data() + b * dim;
            values[0] = ref_v.data() + b * dim;
            for (size_t f = 0; f < format_count; ++f) {
              keys[f + 1] = dec_k[f].data() + b * dim;
              values[f + 1] = dec_v[f].data() + b * dim;
              const int64_t quantized =
                  numerics::quantized_tokens(formats[f], contexts[ci]) - block_first;
              if (!patched[ci] || formats[f].strategy != ScaleStrategy::kivi ||
                  quantized >= run.usable)
                continue;
              // KIVI at a context that ends in this block: its tokens at and past the
              // context's quantised prefix are BF16.
              const size_t kept = size_t(std::max<int64_t>(0, quantized) * dim);
              const size_t used = size_t(run.usable * dim);
              for (auto [decoded, copy, reference] :
                   {std::tuple{keys[f + 1], &patched_k[f], keys[0]},
                    std::tuple{values[f + 1], &patched_v[f], values[0]}}) {
                std::copy_n(decoded, kept, copy->data());
                to_bf16(reference + kept, copy->data() + kept, used - kept);
              }
              keys[f + 1] = patched_k[f].data();
              values[f + 1] = patched_v[f].data();
            }
            const FoldShape fold{nq,  context_pitch,     queries_pitch,
                                 dim, run.context_begin, run.context_end};
            fold_block(acc, fold, dim, keys, values, block_first, run.usable);
          }
        }
        lap(timing.attention_seconds);
      }
    }
  });
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
  for (int64_t context : contexts) {
    flops += 4.0 * double(nq) * double(context) * double(dim) * double(shape.kv_heads) *
             double(format_count + 1);
  }
  // Parts overlap in time: each is reported as its tasks' thread time over the threads.
  const double threads = pool.threads();
  result.load_seconds = load_thread_seconds / threads;
  result.codec_seconds = codec_thread_seconds / threads;
  result.tensor_error_seconds = error_thread_seconds / threads;
  const double attention_seconds = attention_thread_seconds / threads;

  // Final metrics per (format, context).
  for (size_t f = 0; f < formats.size(); ++f) {
    for (size_t ci = 0; ci < contexts.size(); ++ci) {
      AttentionPoint point;
      point.format = formats[f].spec;
      point.context_tokens = contexts[ci];
      double kl_sum = 0, out_err = 0, out_ref = 0, agree = 0, err_sq = 0, ref_sq = 0;
      int64_t finite = 0;
      for (HeadAccumulator& acc : heads) {
        err_sq += acc.score_error_sq[ci * formats.size() + f];
        ref_sq += acc.score_ref_sq[ci * formats.size() + f];
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
          for (int64_t c = 0; c < dim && ok; ++c) {
            const double o_ref = ref.output[q * size_t(dim) + size_t(c)] / ref.sum_exp[q];
            const double o = st.output[q * size_t(dim) + size_t(c)] / st.sum_exp[q];
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
      result.attention.push_back(point);
    }
  }
  result.attention_flops = flops;
  result.attention_seconds = attention_seconds;
  result.total_seconds = seconds_since(start);
  return result;
}

}  // namespace kvaudit::quant
