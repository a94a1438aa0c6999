// KvStream (the cache of one layer's K or V in some format) and round_trip (the same thing
// for a whole tensor at once, in parallel). Both store exactly the bytes RowCodec produces;
// KIVI keeps its newest tokens as BF16 (the model dtype) until a whole group of
// group_tokens has left the residual window of residual_tokens.
#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>
#include <stdexcept>

#include <fmt/format.h>

#include "numerics/row_codec.h"
#include "util/util.h"

namespace kvaudit::numerics {

void validate_kv_layout(const KvFormat& format, const KvLayout& layout) {
  if (layout.kv_heads < 1 || layout.head_dim < 1)
    throw InputError("kv layout", "kv_heads and head_dim must be positive");
  const int n = layout.row_elements();
  if (format.hadamard && (layout.head_dim & (layout.head_dim - 1)) != 0)
    throw InputError(format.spec, fmt::format("+hadamard needs a power-of-two head_dim, got {}",
                                              layout.head_dim));
  if (format.kind == KvFormatKind::nvfp4 && n % 16 != 0)
    throw InputError(format.spec, fmt::format("nvfp4 needs rows of a multiple of 16, got {}", n));
}

namespace {

bool is_kivi(const KvFormat& format) {
  return format.strategy == ScaleStrategy::kivi;
}

// Runs body(counts, begin, end) over [0, units) in `tasks` contiguous parts, on the pool
// when there is one, each part with its own counts; returns their sum (in task order, so
// it does not depend on the threads).
template <class Body>
EncodeCounts run_counted(ThreadPool* pool, int64_t units, int tasks, const Body& body) {
  std::vector<EncodeCounts> task_counts(static_cast<size_t>(tasks));
  const auto part = [&](int task, int64_t begin, int64_t end) {
    body(task_counts[size_t(task)], begin, end);
  };
  if (pool) {
    pool->parallel_for(units, tasks, part);
  } else {
    for (int task = 0; task < tasks; ++task)
      part(task, units * task / tasks, units * (task + 1) / tasks);
  }
  EncodeCounts total;
  for (const EncodeCounts& counts : task_counts) total.merge(counts);
  return total;
}

// Formats with one scale for every element (FP8 with no scale or a per-tensor one, or a
// per-head one when there is one head; NVFP4, whose blocks of 16 tile the rows): a run of
// rows codes and counts like one long row, so round_trip sends batches of rows through the
// bulk kernels whole instead of row by row (same decoded bits and counts as the row codec;
// tests hold them to it). nullopt for every other format.
std::optional<EncodeCounts> round_trip_one_scale(const KvFormat& format, const KvLayout& layout,
                                                 const StaticAmax& calibration,
                                                 std::span<const float> rows,
                                                 std::span<float> decoded, ThreadPool* pool) {
  const bool nvfp4 = format.kind == KvFormatKind::nvfp4;
  const bool fp8 =
      format.kind == KvFormatKind::plain && is_fp8(format.element) &&
      (format.strategy == ScaleStrategy::none || format.strategy == ScaleStrategy::tensor ||
       (format.strategy == ScaleStrategy::head && layout.kv_heads == 1));
  if (!nvfp4 && !fp8) return std::nullopt;
  const float scale = format.strategy == ScaleStrategy::none
                          ? 1.0f
                          : static_scales(format, layout, calibration).at(0);
  if (fp8 && !(scale > 0.0f)) return std::nullopt;  // the row codec's all-zero path
  // Batches: whole NVFP4 blocks and Hadamard segments (head_dim is then a power of two).
  constexpr int64_t kBatch = 16384;
  const int64_t total = int64_t(rows.size());
  const int64_t batches = (total + kBatch - 1) / kBatch;
  const int tasks = int(std::clamp<int64_t>(batches / 4, 1, 256));
  return run_counted(pool, batches, tasks, [&](EncodeCounts& counts, int64_t begin, int64_t end) {
    std::vector<uint8_t> codes(static_cast<size_t>(kBatch / 2)),
        block_scales(static_cast<size_t>(kBatch / 16));  // NVFP4's
    std::vector<float> rotated;
    for (int64_t batch = begin; batch < end; ++batch) {
      const int64_t at = batch * kBatch;
      const size_t count = size_t(std::min(kBatch, total - at));
      std::span<const float> input = rows.subspan(size_t(at), count);
      const std::span<float> output = decoded.subspan(size_t(at), count);
      if (format.hadamard) {
        rotated.assign(input.begin(), input.end());
        hadamard_rows(rotated, layout.head_dim);
        input = rotated;
      }
      if (nvfp4) {
        const std::span<uint8_t> packed(codes.data(), count / 2),
            scales(block_scales.data(), count / 16);
        encode_nvfp4(scale, input, packed, scales);
        tally_nvfp4(scale, input, packed, scales, counts);
        decode_nvfp4(scale, packed, scales, output);
      } else {
        round_trip_fp8(format.element, format.overflow, scale, input, output, counts);
      }
      if (format.hadamard) hadamard_rows(output, layout.head_dim);
    }
  });
}

}  // namespace

struct KvStream::Impl {
  KvFormat format;
  KvLayout layout;
  KvRole role;
  StaticAmax calibration;
  RowCodec codec;
  int64_t n;
  int64_t quantized_tokens = 0;
  std::vector<uint8_t> bytes;        // [quantized_tokens, row_bytes]
  std::vector<float> group_scale;    // KIVI keys: [groups, n]
  std::vector<float> group_minimum;  // KIVI keys: [groups, n]
  std::vector<uint16_t> residual;    // KIVI: BF16 [tokens - quantized_tokens, n]
  std::vector<float> scratch;

  Impl(KvFormat f, KvLayout l, KvRole r, StaticAmax c)
      : format(std::move(f)),
        layout(l),
        role(r),
        calibration(std::move(c)),
        codec(format, layout, role, calibration),
        n(layout.row_elements()) {}

  int64_t residual_count() const { return int64_t(residual.size()) / n; }

  // Quantises the oldest `count` residual rows.
  void flush_residual(int64_t count, EncodeCounts* counts) {
    scratch.resize(size_t(count * n));
    bf16_to_float_bulk({residual.data(), size_t(count * n)}, scratch);
    if (format.hadamard) hadamard_rows(scratch, layout.head_dim);
    const int64_t row_bytes = codec.row_bytes();
    const size_t offset = bytes.size();
    bytes.resize(offset + size_t(count * row_bytes));
    if (codec.key_groups()) {
      const size_t scale_offset = group_scale.size();
      group_scale.resize(scale_offset + size_t(n));
      group_minimum.resize(scale_offset + size_t(n));
      codec.encode_key_group(scratch.data(), int(count), bytes.data() + offset,
                             group_scale.data() + scale_offset, group_minimum.data() + scale_offset,
                             counts);
    } else {
      for (int64_t t = 0; t < count; ++t) {
        codec.encode_row(scratch.data() + t * n, bytes.data() + offset + t * row_bytes, counts);
      }
    }
    residual.erase(residual.begin(), residual.begin() + count * n);
    quantized_tokens += count;
  }
};

KvStream::KvStream(KvFormat format, KvLayout layout, KvRole role, StaticAmax calibration) {
  validate_kv_layout(format, layout);
  impl_ = std::make_unique<Impl>(std::move(format), layout, role, std::move(calibration));
}
KvStream::~KvStream() = default;
KvStream::KvStream(KvStream&&) noexcept = default;
KvStream& KvStream::operator=(KvStream&&) noexcept = default;

KvStream KvStream::Copy() const {
  KvStream copy(impl_->format, impl_->layout, impl_->role, impl_->calibration);
  *copy.impl_ = *impl_;
  return copy;
}

KvStream KvStream::WithCalibration(StaticAmax calibration) const {
  KvStream copy(impl_->format, impl_->layout, impl_->role, std::move(calibration));
  // Everything but the calibration and the codec built from it.
  Impl& c = *copy.impl_;
  c.quantized_tokens = impl_->quantized_tokens;
  c.bytes = impl_->bytes;
  c.group_scale = impl_->group_scale;
  c.group_minimum = impl_->group_minimum;
  c.residual = impl_->residual;
  return copy;
}

const StaticAmax& KvStream::calibration() const {
  return impl_->calibration;
}

void KvStream::append(std::span<const float> row, EncodeCounts* counts) {
  Impl& s = *impl_;
  if (int64_t(row.size()) != s.n) {
    throw std::invalid_argument(
        fmt::format("KvStream::append: row has {} values, layout needs {}", row.size(), s.n));
  }
  if (is_kivi(s.format)) {
    const size_t offset = s.residual.size();
    s.residual.resize(offset + size_t(s.n));
    float_to_bf16_bulk(row, {s.residual.data() + offset, size_t(s.n)});
    if (s.residual_count() >= s.format.residual_tokens + s.format.group_tokens) {
      s.flush_residual(s.format.group_tokens, counts);
    }
    return;
  }
  s.scratch.assign(row.begin(), row.end());
  if (s.format.hadamard) hadamard_rows(s.scratch, s.layout.head_dim);
  const size_t offset = s.bytes.size();
  s.bytes.resize(offset + size_t(s.codec.row_bytes()));
  s.codec.encode_row(s.scratch.data(), s.bytes.data() + offset, counts);
  ++s.quantized_tokens;
}

void KvStream::decode(int64_t first_token, int64_t count, std::span<float> output) const {
  const Impl& s = *impl_;
  if (first_token < 0 || count < 0 || first_token + count > tokens() ||
      int64_t(output.size()) < count * s.n) {
    throw std::out_of_range(fmt::format("KvStream::decode: tokens [{}, {}) of {}", first_token,
                                        first_token + count, tokens()));
  }
  const int64_t row_bytes = s.codec.row_bytes();
  for (int64_t i = 0; i < count; ++i) {
    const int64_t t = first_token + i;
    float* out = output.data() + i * s.n;
    if (t < s.quantized_tokens) {
      const uint8_t* codes = s.bytes.data() + t * row_bytes;
      if (s.codec.key_groups()) {
        const int64_t group = t / s.format.group_tokens;
        s.codec.decode_key_row(codes, s.group_scale.data() + group * s.n,
                               s.group_minimum.data() + group * s.n, out);
      } else {
        s.codec.decode_row(codes, out);
      }
      if (s.format.hadamard) hadamard_rows({out, size_t(s.n)}, s.layout.head_dim);
    } else {
      const int64_t r = t - s.quantized_tokens;
      bf16_to_float_bulk({s.residual.data() + r * s.n, size_t(s.n)}, {out, size_t(s.n)});
    }
  }
}

void KvStream::truncate(int64_t keep_tokens) {
  Impl& s = *impl_;
  if (keep_tokens < 0) throw std::out_of_range("KvStream::truncate: negative token count");
  if (keep_tokens >= tokens()) return;
  if (keep_tokens >= s.quantized_tokens) {
    s.residual.resize(size_t((keep_tokens - s.quantized_tokens) * s.n));
    return;
  }
  if (!is_kivi(s.format)) {
    s.bytes.resize(size_t(keep_tokens * s.codec.row_bytes()));
    s.quantized_tokens = keep_tokens;
    return;
  }
  // KIVI: whole groups stay quantised; the kept part of a cut group returns to the residual
  // window as its decoded values (its full-precision originals are gone).
  const int64_t group_tokens = s.format.group_tokens;
  const int64_t kept_quantized = keep_tokens / group_tokens * group_tokens;
  std::vector<float> reopened(size_t((keep_tokens - kept_quantized) * s.n));
  decode(kept_quantized, keep_tokens - kept_quantized, reopened);
  s.bytes.resize(size_t(kept_quantized * s.codec.row_bytes()));
  if (s.codec.key_groups()) {
    s.group_scale.resize(size_t(kept_quantized / group_tokens * s.n));
    s.group_minimum.resize(s.group_scale.size());
  }
  s.quantized_tokens = kept_quantized;
  s.residual.resize(reopened.size());
  float_to_bf16_bulk(reopened, s.residual);
}

int64_t KvStream::tokens() const {
  return impl_->quantized_tokens + impl_->residual_count();
}
int64_t KvStream::stored_bytes() const {
  const Impl& s = *impl_;
  return int64_t(s.bytes.size() + (s.group_scale.size() + s.group_minimum.size()) * 4 +
                 s.residual.size() * 2);
}
const KvFormat& KvStream::format() const {
  return impl_->format;
}
const KvLayout& KvStream::layout() const {
  return impl_->layout;
}

RoundTripResult round_trip(const KvFormat& format, const KvLayout& layout, KvRole role,
                           const StaticAmax& calibration, std::span<const float> rows,
                           ThreadPool* pool) {
  RoundTripResult result;
  result.decoded.resize(rows.size());
  result.counts = round_trip_into(format, layout, role, calibration, rows, result.decoded, pool);
  return result;
}

EncodeCounts round_trip_into(const KvFormat& format, const KvLayout& layout, KvRole role,
                             const StaticAmax& calibration, std::span<const float> rows,
                             std::span<float> decoded, ThreadPool* pool) {
  validate_kv_layout(format, layout);
  const int64_t n = layout.row_elements();
  if (int64_t(rows.size()) % n != 0 || decoded.size() < rows.size()) {
    throw std::invalid_argument(
        fmt::format("round_trip: {} values is not a whole number of rows of {}, or the output "
                    "({} values) is smaller",
                    rows.size(), n, decoded.size()));
  }
  if (std::optional<EncodeCounts> counts =
          round_trip_one_scale(format, layout, calibration, rows, decoded, pool)) {
    return *counts;
  }
  const int64_t tokens = int64_t(rows.size()) / n;
  const RowCodec codec(format, layout, role, calibration);
  const bool kivi = is_kivi(format);
  const int64_t quantized = quantized_tokens(format, tokens);
  // Work units: single tokens, or whole token groups for KIVI.
  const int64_t unit_tokens = kivi ? format.group_tokens : 1;
  const int64_t units = quantized / unit_tokens;
  const int tasks = int(std::clamp<int64_t>(units / 16, 1, 256));
  const EncodeCounts total =
      run_counted(pool, units, tasks, [&](EncodeCounts& counts, int64_t begin, int64_t end) {
        std::vector<float> input(size_t(unit_tokens * n));
        std::vector<uint8_t> codes(size_t(unit_tokens * codec.row_bytes()));
        std::vector<float> group_scale(static_cast<size_t>(n)),
            group_minimum(static_cast<size_t>(n));
        for (int64_t unit = begin; unit < end; ++unit) {
          const int64_t first = unit * unit_tokens;
          const float* source = rows.data() + first * n;
          if (kivi) {  // KIVI quantises the BF16 values the residual window held
            std::vector<uint16_t> as_bf16(input.size());
            float_to_bf16_bulk({source, input.size()}, as_bf16);
            bf16_to_float_bulk(as_bf16, input);
            source = input.data();
          }
          if (format.hadamard) {
            if (source != input.data()) std::copy_n(source, input.size(), input.begin());
            hadamard_rows(input, layout.head_dim);
            source = input.data();
          }
          float* out = decoded.data() + first * n;
          if (codec.key_groups()) {
            codec.encode_key_group(source, int(unit_tokens), codes.data(), group_scale.data(),
                                   group_minimum.data(), &counts);
            for (int64_t t = 0; t < unit_tokens; ++t) {
              codec.decode_key_row(codes.data() + t * codec.row_bytes(), group_scale.data(),
                                   group_minimum.data(), out + t * n);
            }
          } else {
            for (int64_t t = 0; t < unit_tokens; ++t) {
              codec.encode_row(source + t * n, codes.data() + t * codec.row_bytes(), &counts);
              codec.decode_row(codes.data() + t * codec.row_bytes(), out + t * n);
            }
          }
          if (format.hadamard) hadamard_rows({out, size_t(unit_tokens * n)}, layout.head_dim);
        }
      });
  // The residual window (KIVI only) stays BF16.
  const size_t residual_begin = size_t(quantized * n);
  std::vector<uint16_t> as_bf16(rows.size() - residual_begin);
  float_to_bf16_bulk(rows.subspan(residual_begin), as_bf16);
  bf16_to_float_bulk(as_bf16, decoded.subspan(residual_begin, rows.size() - residual_begin));
  return total;
}

void token_row_ranges(const KvFormat& format, const KvLayout& layout, std::span<const float> rows,
                      std::span<float> ranges) {
  const int64_t n = layout.row_elements();
  const int64_t tokens = int64_t(rows.size()) / n;
  if (format.strategy != ScaleStrategy::token || int64_t(rows.size()) % n != 0 ||
      int64_t(ranges.size()) < 2 * tokens) {
    throw std::invalid_argument("token_row_ranges: not a per-token format, or bad sizes");
  }
  std::vector<float> rotated;
  for (int64_t t = 0; t < tokens; ++t) {
    std::span<const float> row = rows.subspan(size_t(t * n), size_t(n));
    if (format.hadamard) {
      rotated.assign(row.begin(), row.end());
      hadamard_rows(rotated, layout.head_dim);
      row = rotated;
    }
    float lo = std::numeric_limits<float>::infinity(), hi = -lo;
    for (float x : row) {
      if (!std::isfinite(x)) continue;
      lo = std::min(lo, x);
      hi = std::max(hi, x);
    }
    ranges[size_t(2 * t)] = lo;
    ranges[size_t(2 * t + 1)] = hi;
  }
}

EncodeCounts round_trip_head_rows(const KvFormat& format, int head_dim, KvRole role,
                                  std::span<const float> head_rows, std::span<const float> ranges,
                                  std::span<float> decoded) {
  const KvLayout head_layout{1, head_dim};
  validate_kv_layout(format, head_layout);
  const int64_t tokens = int64_t(head_rows.size()) / head_dim;
  if (format.strategy != ScaleStrategy::token || int64_t(head_rows.size()) % head_dim != 0 ||
      int64_t(ranges.size()) < 2 * tokens || decoded.size() < head_rows.size()) {
    throw std::invalid_argument("round_trip_head_rows: not a per-token format, or bad sizes");
  }
  const RowCodec codec(format, head_layout, role, {});
  std::vector<uint8_t> codes(size_t(codec.row_bytes()));
  std::vector<float> rotated(static_cast<size_t>(head_dim));
  EncodeCounts counts;
  for (int64_t t = 0; t < tokens; ++t) {
    const float* row = head_rows.data() + t * head_dim;
    float* out = decoded.data() + t * head_dim;
    if (format.hadamard) {
      std::copy_n(row, head_dim, rotated.begin());
      hadamard_rows(rotated, head_dim);
      row = rotated.data();
    }
    codec.encode_row(row, codes.data(), &counts, ranges.data() + 2 * t);
    codec.decode_row(codes.data(), out);
    if (format.hadamard) hadamard_rows({out, size_t(head_dim)}, head_dim);
  }
  return counts;
}

}  // namespace kvaudit::numerics
