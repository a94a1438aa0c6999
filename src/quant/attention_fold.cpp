// The quant analysis' attention: the fold of one key block of one KV head into the online
// softmax of the reference and of every format, for every context that covers it, with the
// KL and score-error terms and each query's top k. KL divergence is accumulated online too:
// KL = sum p (s - t) - logsumexp(s) + logsumexp(t), with s/t reference/format logits.
#include <algorithm>
#include <cmath>
#include <limits>

#include "quant/internal.h"

namespace kvaudit::quant {

namespace {

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

}  // namespace

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

}  // namespace kvaudit::quant
