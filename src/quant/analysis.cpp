// The quant analysis: one streaming pass over the K/V tokens in chunks. Each chunk is
// encoded and decoded in every format (round_trip, exactly as a cache stores it), the
// tensor error is accumulated, and every requested context length whose range covers the
// chunk folds it into online-softmax states for the reference and for each format, so a
// 128K-token sweep never materialises a whole tensor. KL divergence is accumulated online
// too: KL = sum p (s - t) - logsumexp(s) + logsumexp(t), with s/t reference/format logits.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <iterator>
#include <limits>

#include <fmt/format.h>

#include "quant/quant.h"
#include "util/util.h"

namespace kvaudit::quant {
namespace {

using numerics::KvFormat;
using numerics::KvRole;
using numerics::ScaleStrategy;

constexpr int64_t kKeyBlock = 256;  // keys per score block (fits L2 with 64 queries)

int64_t kivi_quantized_tokens(const KvFormat& format, int64_t tokens) {
  if (format.strategy != ScaleStrategy::kivi || tokens < format.residual_tokens) {
    return format.strategy == ScaleStrategy::kivi ? 0 : tokens;
  }
  return (tokens - format.residual_tokens) / format.group_tokens * format.group_tokens;
}

// Keeps the k largest (score, index) pairs seen so far, cheaply: candidates above the
// current threshold go into a buffer that is pruned back to k when it grows to 4k.
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
  // block_max: the largest non-NaN score of the block (-inf if none). Once k items are
  // kept, a block whose maximum is not above the threshold adds nothing: skipped whole.
  // Otherwise the scores above the threshold are picked without a branch per score (they
  // are few, and a branch on each mispredicted); the threshold used is the one at the
  // block's start, so the candidates are a superset of what an exact scan keeps, and
  // pruning gives the same top k.
  void add(const float* scores, int64_t count, int64_t first_index, float block_max) {
    if (int(items.size()) >= k && !(block_max > threshold)) return;
    int64_t j = 0;
    for (; j < count && int(items.size()) < k; ++j) {  // filling up: NaN left out
      if (!std::isnan(scores[j])) items.push_back({scores[j], first_index + j});
    }
    if (j == count) return;
    thread_local std::vector<int32_t> above;
    above.resize(size_t(count));
    const float t = threshold;
    int64_t n = 0;
    for (; j < count; ++j) {
      above[size_t(n)] = int32_t(j);
      n += scores[j] > t;
    }
    for (int64_t i = 0; i < n; ++i) {
      const int32_t at = above[size_t(i)];
      items.push_back({scores[at], first_index + at});
      if (int(items.size()) >= 4 * k) prune();
    }
  }
  std::vector<int64_t> indices() {
    prune();
    std::vector<int64_t> out;
    for (auto& item : items) out.push_back(item.second);
    std::sort(out.begin(), out.end());
    return out;
  }
};

// Online softmax over keys for nq queries of one KV head.
struct SoftmaxState {
  std::vector<float> max_logit, sum_exp, output;  // [nq], [nq], [nq * dim]
  std::vector<double> kl_partial;                 // [nq] sum exp(s - m_s) (s - t) (formats)
  std::vector<TopK> top;
  void init(int64_t nq, int64_t dim, int k) {
    max_logit.assign(size_t(nq), -std::numeric_limits<float>::infinity());
    sum_exp.assign(size_t(nq), 0.0f);
    output.assign(size_t(nq * dim), 0.0f);
    kl_partial.assign(size_t(nq), 0.0);
    top.assign(size_t(nq), TopK{k, -std::numeric_limits<float>::infinity(), {}});
  }
};

// Everything one (context, KV head) accumulates: the reference and one state per format.
struct HeadAccumulator {
  std::vector<float> queries;  // [nq, dim] (query heads of this KV head x positions)
  SoftmaxState reference;
  std::vector<SoftmaxState> formats;
  std::vector<double> score_error_sq, score_ref_sq;  // per format
};

// Folds keys [first, first + count) of one KV head into an accumulator. `keys[f]` and
// `values[f]` point at the head's slice of token `first` (row stride `stride`); index 0 is
// the reference. Score buffers are per call (thread-local).
void fold_block(HeadAccumulator& acc, int64_t nq, int64_t dim, int64_t stride,
                const std::vector<const float*>& keys, const std::vector<const float*>& values,
                int64_t first, int64_t count) {
  const size_t streams = keys.size();
  const float inv_sqrt_dim = float(1.0 / std::sqrt(double(dim)));
  thread_local std::vector<float> scores, ref_scores, probabilities;
  scores.resize(size_t(nq * count));
  ref_scores.resize(size_t(nq * count));
  probabilities.resize(size_t(nq * count));
  numerics::score_block(acc.queries.data(), nq, dim, keys[0], count, stride, dim, inv_sqrt_dim,
                        ref_scores.data());
  // Reference softmax update; keep exp(s - m_new) for the KL terms.
  SoftmaxState& ref = acc.reference;
  std::vector<float> rescale(static_cast<size_t>(nq));
  for (int64_t q = 0; q < nq; ++q) {
    const float* s = ref_scores.data() + q * count;
    const float block_max = numerics::max_ignoring_nan({s, size_t(count)});
    const float m = std::max(ref.max_logit[size_t(q)], block_max);
    rescale[size_t(q)] = std::exp(ref.max_logit[size_t(q)] - m);
    ref.max_logit[size_t(q)] = m;
    const float block_sum = numerics::exp_and_sum(
        {s, size_t(count)}, m, {probabilities.data() + q * count, size_t(count)});
    ref.sum_exp[size_t(q)] = ref.sum_exp[size_t(q)] * rescale[size_t(q)] + block_sum;
    for (int64_t c = 0; c < dim; ++c) ref.output[size_t(q * dim + c)] *= rescale[size_t(q)];
    ref.top[size_t(q)].add(s, count, first, block_max);
  }
  numerics::accumulate_weighted(probabilities.data(), nq, count, values[0], stride, dim,
                                ref.output.data(), dim);
  for (size_t f = 1; f < streams; ++f) {
    SoftmaxState& state = acc.formats[f - 1];
    numerics::score_block(acc.queries.data(), nq, dim, keys[f], count, stride, dim, inv_sqrt_dim,
                          scores.data());
    double error_sq = 0, ref_sq = 0;
    for (int64_t q = 0; q < nq; ++q) {
      const float* s = ref_scores.data() + q * count;
      const float* t = scores.data() + q * count;
      const float* p = probabilities.data() + q * count;
      double kl = 0;  // NaN/inf in t propagate: the query is then non-finite
      numerics::score_divergence(s, t, p, count, &kl, &error_sq, &ref_sq);
      state.kl_partial[size_t(q)] = state.kl_partial[size_t(q)] * rescale[size_t(q)] + kl;
      const float block_max = numerics::max_ignoring_nan({t, size_t(count)});
      state.top[size_t(q)].add(t, count, first, block_max);
      const float m = std::max(state.max_logit[size_t(q)], block_max);
      const float r = std::exp(state.max_logit[size_t(q)] - m);
      state.max_logit[size_t(q)] = m;
      const float block_sum =
          numerics::exp_and_sum({t, size_t(count)}, m, {scores.data() + q * count, size_t(count)});
      state.sum_exp[size_t(q)] = state.sum_exp[size_t(q)] * r + block_sum;
      for (int64_t c = 0; c < dim; ++c) state.output[size_t(q * dim + c)] *= r;
    }
    acc.score_error_sq[f - 1] += error_sq;
    acc.score_ref_sq[f - 1] += ref_sq;
    numerics::accumulate_weighted(scores.data(), nq, count, values[f], stride, dim,
                                  state.output.data(), dim);
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
  if (options.top_k < 1) throw InputError("--top-k", "must be at least 1");
  const int64_t total = contexts.back();
  result.tokens = total;
  const int64_t chunk = std::max<int64_t>(64, options.chunk_tokens / 64 * 64);
  const int64_t chunks = (total + chunk - 1) / chunk;
  const int tasks_per_chunk = std::max(2, pool.threads() * 2);

  auto load = [&](KvRole role, int64_t first, int64_t count, std::vector<float>& out) {
    out.resize(size_t(count * n));
    pool.parallel_for(count, tasks_per_chunk, [&](int, int64_t b, int64_t e) {
      std::span<float> part(out.data() + b * n, size_t((e - b) * n));
      if (role == KvRole::key) {
        source.keys(first + b, e - b, part);
      } else {
        source.values(first + b, e - b, part);
      }
    });
  };

  // Pass 1: calibration (amax over every analysed token) for static scales.
  const auto calibration_start = std::chrono::steady_clock::now();
  std::vector<std::array<numerics::StaticAmax, 2>> calibration(formats.size());
  if (options.calibrate) {
    std::vector<float> rows;
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t first = c * chunk, count = std::min(chunk, total - first);
      for (KvRole role : {KvRole::key, KvRole::value}) {
        load(role, first, count, rows);
        // One task per format (merged in format order below): amax is a maximum, so the
        // result does not depend on the split.
        std::vector<numerics::StaticAmax> parts(formats.size());
        pool.parallel_for(
            int64_t(formats.size()), int(formats.size()), [&](int task, int64_t, int64_t) {
              parts[size_t(task)] = numerics::calibrate_amax(formats[size_t(task)], layout, rows);
            });
        for (size_t f = 0; f < formats.size(); ++f) {
          const numerics::StaticAmax& part = parts[f];
          auto& amax = calibration[f][size_t(role)].amax;
          if (amax.empty()) amax = part.amax;
          for (size_t i = 0; i < part.amax.size(); ++i) amax[i] = std::max(amax[i], part.amax[i]);
        }
      }
    }
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

  // Attention accumulators: [context][kv head].
  const int64_t nq = int64_t(group) * options.query_positions;
  std::vector<std::vector<HeadAccumulator>> heads(contexts.size());
  {
    std::vector<float> q_rows(size_t(options.query_positions * shape.q_heads * dim));
    for (size_t ci = 0; ci < contexts.size(); ++ci) {
      source.queries(contexts[ci], options.query_positions, q_rows);
      heads[ci].resize(size_t(shape.kv_heads));
      for (int h = 0; h < shape.kv_heads; ++h) {
        HeadAccumulator& acc = heads[ci][size_t(h)];
        acc.queries.resize(size_t(nq * dim));
        for (int p = 0; p < options.query_positions; ++p) {
          for (int g = 0; g < group; ++g) {
            const float* src = q_rows.data() + (int64_t(p) * shape.q_heads + h * group + g) * dim;
            std::copy_n(src, dim, acc.queries.data() + (int64_t(p) * group + g) * dim);
          }
        }
        acc.reference.init(nq, dim, options.top_k);
        acc.formats.resize(formats.size());
        for (SoftmaxState& s : acc.formats) s.init(nq, dim, options.top_k);
        acc.score_error_sq.assign(formats.size(), 0.0);
        acc.score_ref_sq.assign(formats.size(), 0.0);
      }
    }
  }

  result.calibration_seconds = seconds_since(calibration_start);

  // Pass 2: stream the chunks.
  double attention_seconds = 0.0, flops = 0.0;
  std::vector<float> ref_k, ref_v;
  std::vector<std::vector<float>> dec_k(formats.size()), dec_v(formats.size());
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t first = c * chunk, count = std::min(chunk, total - first);
    const auto load_start = std::chrono::steady_clock::now();
    load(KvRole::key, first, count, ref_k);
    load(KvRole::value, first, count, ref_v);
    result.load_seconds += seconds_since(load_start);
    const auto codec_start = std::chrono::steady_clock::now();
    for (size_t f = 0; f < formats.size(); ++f) {
      for (KvRole role : {KvRole::key, KvRole::value}) {
        const std::vector<float>& ref = role == KvRole::key ? ref_k : ref_v;
        std::vector<float>& dec = role == KvRole::key ? dec_k[f] : dec_v[f];
        // KIVI: tokens from the residual window of the largest context on stay BF16 (they
        // are BF16 for every smaller context too); the rest is quantised group by group.
        KvFormat format = formats[f];
        const int64_t quantized_end =
            std::clamp(kivi_quantized_tokens(format, total) - first, int64_t(0), count);
        format.residual_tokens = 0;
        dec.resize(ref.size());  // reused chunk after chunk: no allocation, no zero fill
        const numerics::EncodeCounts counts = numerics::round_trip_into(
            format, layout, role, calibration[f][size_t(role)],
            std::span<const float>(ref).subspan(0, size_t(quantized_end * n)), dec, &pool);
        // The quantised rows come first; the BF16 tail follows.
        const size_t tail = size_t(quantized_end * n);
        std::vector<uint16_t> as_bf16(ref.size() - tail);
        numerics::float_to_bf16_bulk(std::span<const float>(ref).subspan(tail), as_bf16);
        numerics::bf16_to_float_bulk(as_bf16, std::span<float>(dec).subspan(tail));
        TensorMetrics& m = result.tensors[f * 2 + size_t(role)];
        m.counts.merge(counts);
      }
    }
    result.codec_seconds += seconds_since(codec_start);
    // Tensor error, in parallel over (format, role), merged in a fixed order.
    const auto error_start = std::chrono::steady_clock::now();
    pool.parallel_for(
        int64_t(formats.size() * 2), int(formats.size() * 2), [&](int task, int64_t, int64_t) {
          const size_t f = size_t(task) / 2;
          const bool key = task % 2 == 0;
          result.tensors[size_t(task)].error.add(key ? ref_k : ref_v, key ? dec_k[f] : dec_v[f]);
        });
    result.tensor_error_seconds += seconds_since(error_start);
    // Attention: every context that reaches into this chunk.
    const auto attention_start = std::chrono::steady_clock::now();
    for (size_t ci = 0; ci < contexts.size(); ++ci) {
      const int64_t context = contexts[ci];
      if (first >= context) continue;
      const int64_t usable = std::min(count, context - first);
      // KIVI at this context: tokens at and past its quantised prefix are BF16.
      std::vector<std::vector<float>> kivi_k(formats.size()), kivi_v(formats.size());
      for (size_t f = 0; f < formats.size(); ++f) {
        const int64_t q_end = kivi_quantized_tokens(formats[f], context) - first;
        if (formats[f].strategy != ScaleStrategy::kivi || q_end >= usable) continue;
        kivi_k[f] = dec_k[f];
        kivi_v[f] = dec_v[f];
        const size_t begin = size_t(std::max<int64_t>(0, q_end) * n), end = size_t(usable * n);
        std::vector<uint16_t> tmp(end - begin);
        for (auto [src, dst] : {std::pair{&ref_k, &kivi_k[f]}, std::pair{&ref_v, &kivi_v[f]}}) {
          numerics::float_to_bf16_bulk(std::span<const float>(*src).subspan(begin, end - begin),
                                       tmp);
          numerics::bf16_to_float_bulk(tmp, std::span<float>(*dst).subspan(begin, end - begin));
        }
      }
      pool.parallel_for(shape.kv_heads, shape.kv_heads, [&](int task, int64_t, int64_t) {
        const int h = task;
        HeadAccumulator& acc = heads[ci][size_t(h)];
        for (int64_t b = 0; b < usable; b += kKeyBlock) {
          const int64_t block = std::min(kKeyBlock, usable - b);
          const int64_t offset = b * n + int64_t(h) * dim;
          std::vector<const float*> keys = {ref_k.data() + offset};
          std::vector<const float*> values = {ref_v.data() + offset};
          for (size_t f = 0; f < formats.size(); ++f) {
            const bool patched = !kivi_k[f].empty();
            keys.push_back((patched ? kivi_k[f] : dec_k[f]).data() + offset);
            values.push_back((patched ? kivi_v[f] : dec_v[f]).data() + offset);
          }
          fold_block(acc, nq, dim, n, keys, values, first + b, block);
        }
      });
      flops += 4.0 * double(nq) * double(usable) * double(dim) * double(shape.kv_heads) *
               double(formats.size() + 1);
    }
    attention_seconds += seconds_since(attention_start);
  }

  // Final metrics per (format, context).
  for (size_t f = 0; f < formats.size(); ++f) {
    for (size_t ci = 0; ci < contexts.size(); ++ci) {
      AttentionPoint point;
      point.format = formats[f].spec;
      point.context_tokens = contexts[ci];
      double kl_sum = 0, out_err = 0, out_ref = 0, agree = 0, err_sq = 0, ref_sq = 0;
      int64_t finite = 0;
      for (HeadAccumulator& acc : heads[ci]) {
        err_sq += acc.score_error_sq[f];
        ref_sq += acc.score_ref_sq[f];
        SoftmaxState& ref = acc.reference;
        SoftmaxState& st = acc.formats[f];
        for (int64_t q = 0; q < nq; ++q) {
          ++point.queries;
          const double log_z_ref =
              ref.max_logit[size_t(q)] + std::log(double(ref.sum_exp[size_t(q)]));
          const double log_z = st.max_logit[size_t(q)] + std::log(double(st.sum_exp[size_t(q)]));
          const double kl = st.kl_partial[size_t(q)] / ref.sum_exp[size_t(q)] - log_z_ref + log_z;
          double e = 0, r = 0;
          bool ok = std::isfinite(kl);
          for (int64_t c = 0; c < dim && ok; ++c) {
            const double o_ref = ref.output[size_t(q * dim + c)] / ref.sum_exp[size_t(q)];
            const double o = st.output[size_t(q * dim + c)] / st.sum_exp[size_t(q)];
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
          const std::vector<int64_t> a = ref.top[size_t(q)].indices();
          const std::vector<int64_t> b = st.top[size_t(q)].indices();
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
