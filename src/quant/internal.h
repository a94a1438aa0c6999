// quant internals: what the analysis' passes share (analysis.cpp runs them, head_pass.cpp
// holds pass 2's head tasks, attention_fold.cpp the fold of a key block). Private to
// src/quant/.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <utility>
#include <vector>

#include "quant/quant.h"
#include "util/util.h"

namespace kvaudit::quant {

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

// Folds keys [first, first + count) of one KV head into the rows of contexts
// [shape.context_begin, shape.context_end), which all cover these keys. `keys[f]` and
// `values[f]` point at the head's slice of token `first` (row stride `stride`); index 0 is
// the reference. Scores are [key][column] (score_block_transposed), so the per-query
// bookkeeping runs down columns, a vector of queries at a time. Every column's figures are
// those of a fold of its context alone.
void fold_block(HeadAccumulator& acc, const FoldShape& shape, int64_t stride,
                const std::vector<const float*>& keys, const std::vector<const float*>& values,
                int64_t first, int64_t count);

// How pass 2 round-trips each format one KV head at a time: on the head's own rows; on
// them with each row's whole-row range (a scale per token over every head); or, for
// scales that span heads any other way, on whole rows, cut.
enum class HeadPath { own_rows, token_ranges, whole_rows };

// The checked inputs and what every pass shares.
struct Setup {
  Setup(const QkvSource& source_, const std::vector<numerics::KvFormat>& formats_,
        const AnalysisOptions& options_)
      : source(source_), formats(formats_), options(options_), shape(source_.shape()) {}
  const QkvSource& source;
  const std::vector<numerics::KvFormat>& formats;
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

  void read_rows(numerics::KvRole role, int64_t first, int64_t count, std::span<float> out) const {
    if (role == numerics::KvRole::key) {
      source.keys(first, count, out);
    } else {
      source.values(first, count, out);
    }
  }
};

// Pass 1's results: per format and role, the static calibration (amax over every analysed
// token) and, for per-token formats, every token's whole-row range.
struct Calibration {
  std::vector<std::array<numerics::StaticAmax, 2>> amax;        // [format][role]
  std::vector<std::array<std::vector<float>, 2>> token_ranges;  // [format][role]
  std::vector<std::array<numerics::StaticAmax, 2>> head_amax;   // [format * heads + head]
};

// What one head's pass-2 work adds up to (merged in head order).
struct HeadResult {
  std::vector<numerics::EncodeCounts> counts;  // [format * 2 + role]
  std::vector<numerics::ErrorStats> errors;    // [format * 2 + role]
  double load_seconds = 0, codec_seconds = 0, error_seconds = 0, attention_seconds = 0;
};

// Pass 2 (head_pass.cpp): every KV head's K and V through every format, each key block
// folded into the accumulators of the contexts that cover it; one result per head.
std::vector<HeadResult> head_pass(const Setup& s, const Calibration& c,
                                  std::vector<HeadAccumulator>& heads, ThreadPool& pool);

}  // namespace kvaudit::quant
