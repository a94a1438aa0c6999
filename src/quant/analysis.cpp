// The quant analysis: one streaming pass over the K/V tokens, a task per KV head. Each
// step of tokens is encoded and decoded in every format (round_trip, exactly as a cache
// stores it), the tensor error is accumulated, and every requested context length whose
// range covers a key block folds it into online-softmax states for the reference and for
// each format, so a 128K-token sweep never materialises a whole tensor. This file holds
// the checks and the passes' frame (pass 1, the accumulators, the merge and the metrics);
// pass 2's head tasks are in head_pass.cpp, the fold of a key block in attention_fold.cpp.
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

#include "quant/internal.h"
#include "util/util.h"

namespace kvaudit::quant {
namespace {

using numerics::KvFormat;
using numerics::KvRole;
using numerics::ScaleStrategy;

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

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

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
  std::vector<float> q_rows(size_t(int64_t(positions) * s.shape.q_heads * s.dim));
  for (size_t ci = 0; ci < s.contexts.size(); ++ci) {
    s.source.queries(s.contexts[ci], positions, q_rows);
    for (int h = 0; h < s.shape.kv_heads; ++h) {
      std::vector<float>& queries_t = heads[size_t(h)].queries_t;
      for (int p = 0; p < positions; ++p) {
        for (int g = 0; g < s.group; ++g) {
          const float* src =
              q_rows.data() + (int64_t(p) * s.shape.q_heads + int64_t(h) * s.group + g) * s.dim;
          const int64_t column = int64_t(ci) * s.context_pitch + int64_t(p) * s.group + g;
          for (int64_t k = 0; k < s.dim; ++k)
            queries_t[size_t(k * s.queries_pitch + column)] = src[k];
        }
      }
    }
  }
  return heads;
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
