// The quant analysis' pass 2: a task per KV head (or run of heads) walks the tokens a step at
// a time: it round-trips the head's K and V through every format, adds the tensor error, and
// folds each key block into every context that covers it (attention_fold.cpp).
#include <algorithm>
#include <array>
#include <chrono>
#include <tuple>

#include "quant/internal.h"

namespace kvaudit::quant {

namespace {

using numerics::KvFormat;
using numerics::KvRole;
using numerics::ScaleStrategy;

// Keys per score block: a block's scores ([key][column], three of them), its packed values
// and the keys stay in L2 with several contexts' queries.
constexpr int64_t kKeyBlock = 128;

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

}  // namespace

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

}  // namespace kvaudit::quant
