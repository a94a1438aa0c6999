// Row codec: what one token's K or V row becomes in each KV format, byte for byte.
// Row layout: [codes][per-segment scales as FP32 (scale, then minimum for asymmetric ints)]
// for dynamic strategies, [codes][one scale byte per block] for NVFP4 (E4M3) and MXFP4
// (E8M0). 4-bit codes pack two per byte, the even element in the low nibble.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "numerics/row_codec.h"

namespace kvaudit::numerics {
namespace {

struct ClassTables {
  std::array<std::array<CodeClass, 256>, 9> by_type{};
  ClassTables() {
    for (const ElementTraits& traits : all_element_traits()) {
      if (traits.bits > 8) continue;
      for (uint32_t code = 0; code < (1u << traits.bits); ++code) {
        by_type[size_t(traits.type)][code] = classify_code(traits.type, code);
      }
    }
  }
};
const ClassTables& class_tables() {
  static const ClassTables tables;
  return tables;
}

CodeClass code_class(ElementType type, uint32_t code) {
  if (element_traits(type).bits <= 8) return class_tables().by_type[size_t(type)][code];
  return classify_code(type, code);
}

// What happened to one element x, encoded (after division by its scale) as `code`.
void count_float_element(ElementType type, float x, float scaled, uint32_t code,
                         EncodeCounts& counts) {
  ++counts.elements;
  if (!std::isfinite(x)) {
    ++counts.nonfinite_input;
    return;
  }
  switch (code_class(type, code)) {
    case CodeClass::nan:
      ++counts.became_nan;
      break;
    case CodeClass::inf:
      ++counts.became_inf;
      break;
    case CodeClass::zero:
      if (x != 0.0f) ++counts.flushed_to_zero;
      break;
    case CodeClass::subnormal:
      ++counts.subnormal;
      break;
    case CodeClass::max_finite:
      if (std::fabs(double(scaled)) > element_traits(type).max_finite) ++counts.saturated;
      break;
    case CodeClass::normal:
      break;
  }
}

void store_code(uint8_t* codes, int64_t index, int bits, uint32_t code) {
  if (bits == 8) {
    codes[index] = uint8_t(code);
  } else if (bits == 4) {
    uint8_t& byte = codes[index / 2];
    byte = index % 2 == 0 ? uint8_t((byte & 0xF0) | (code & 0xF))
                          : uint8_t((byte & 0x0F) | ((code & 0xF) << 4));
  } else if (bits == 16) {
    const uint16_t value = uint16_t(code);
    std::memcpy(codes + index * 2, &value, 2);
  } else {
    std::memcpy(codes + index * 4, &code, 4);
  }
}

uint32_t load_code(const uint8_t* codes, int64_t index, int bits) {
  if (bits == 8) return codes[index];
  if (bits == 4) return index % 2 == 0 ? codes[index / 2] & 0xFu : codes[index / 2] >> 4;
  if (bits == 16) {
    uint16_t value;
    std::memcpy(&value, codes + index * 2, 2);
    return value;
  }
  uint32_t value;
  std::memcpy(&value, codes + index * 4, 4);
  return value;
}

// Largest finite magnitude of a segment; NaN and inf never set a dynamic scale.
float finite_amax(const float* x, int count) {
  return finite_abs_max({x, size_t(count)});
}

// The finite minimum and maximum of x ({+inf, -inf} when nothing is finite).
std::array<float, 2> finite_range(const float* x, int count) {
  float lo = std::numeric_limits<float>::infinity(), hi = -lo;
  for (int i = 0; i < count; ++i) {
    if (!std::isfinite(x[i])) continue;
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  return {lo, hi};
}

// max |x| over the finite x of a finite range, as finite_amax gives it (0 when empty).
float range_amax(const float* range) {
  return range[0] > range[1] ? 0.0f : std::max(std::fabs(range[0]), std::fabs(range[1]));
}

}  // namespace

RowCodec::RowCodec(const KvFormat& format, const KvLayout& layout, KvRole role,
                   const StaticAmax& calibration)
    : format_(format), layout_(layout) {
  row_elements_ = layout.row_elements();
  const int bits = element_traits(format.element).bits;
  code_bytes_ = (row_elements_ * bits + 7) / 8;
  row_bytes_ = numerics::row_bytes(format, layout, role);
  key_groups_ = format.strategy == ScaleStrategy::kivi && role == KvRole::key;
  switch (format.strategy) {
    case ScaleStrategy::none:
    case ScaleStrategy::tensor:
    case ScaleStrategy::token:
      segment_elements_ = int(row_elements_);
      break;
    case ScaleStrategy::head:
    case ScaleStrategy::token_head:
      segment_elements_ = layout.head_dim;
      break;
    case ScaleStrategy::channel:
      segment_elements_ = 1;
      break;
    case ScaleStrategy::group:
    case ScaleStrategy::kivi:
    case ScaleStrategy::block:
      segment_elements_ = format.group_size;
      break;
  }
  static_scale_ = static_scales(format, layout, calibration);
  if (format.strategy == ScaleStrategy::none) static_scale_.assign(1, 1.0f);
}

void RowCodec::encode_segment_scaled(const float* x, int count, float scale, uint8_t* codes,
                                     int code_offset, EncodeCounts* counts) const {
  const ElementType type = format_.element;
  const int bits = element_traits(type).bits;
  if (is_fp8(type) && scale > 0.0f) {
    encode_fp8(type, format_.overflow, scale, {x, size_t(count)},
               {codes + code_offset, size_t(count)});
  } else {
    for (int i = 0; i < count; ++i) {
      const uint32_t code =
          scale > 0.0f ? encode_element(type, x[i] / scale, format_.overflow) : 0u;
      store_code(codes, code_offset + i, bits, code);
    }
  }
  if (counts && is_fp8(type) && scale > 0.0f) {
    tally_fp8(type, scale, {x, size_t(count)}, {codes + code_offset, size_t(count)}, *counts);
  } else if (counts && bits == 8) {
    // INT8 with a static scale (or FP8 with no usable scale: every code 0): the FP8
    // tally's rule over the class table.
    const CodeClass* table = class_tables().by_type[size_t(type)].data();
    const float limit = float(element_traits(type).max_finite) * scale;
    for (int i = 0; i < count; ++i) {
      const float v = x[i];
      const CodeClass c = table[codes[code_offset + i]];
      ++counts->elements;
      if (!std::isfinite(v)) {
        ++counts->nonfinite_input;
        continue;
      }
      counts->flushed_to_zero += (c == CodeClass::zero) & (v != 0.0f);
      counts->saturated += (c == CodeClass::max_finite) & (std::fabs(v) > limit);
    }
  } else if (counts) {
    for (int i = 0; i < count; ++i) {
      const float scaled = scale > 0.0f ? x[i] / scale : 0.0f;
      count_float_element(type, x[i], scaled, load_code(codes, code_offset + i, bits), *counts);
    }
  }
}

void RowCodec::decode_segment_scaled(const uint8_t* codes, int code_offset, int count, float scale,
                                     float* out) const {
  const ElementType type = format_.element;
  if (is_fp8(type)) {
    decode_fp8(type, scale, {codes + code_offset, size_t(count)}, {out, size_t(count)});
    return;
  }
  const int bits = element_traits(type).bits;
  for (int i = 0; i < count; ++i)
    out[i] = decode_element(type, load_code(codes, code_offset + i, bits)) * scale;
}

// Integer segment with a dynamic scale: symmetric q = rint(x / s), s = amax / qmax; or
// asymmetric q = rint((x - min) / s), s = (max - min) / (2^bits - 1), decoded q * s + min.
void RowCodec::encode_segment_int(const float* x, int count, uint8_t* codes, int code_offset,
                                  float* scale_out, float* min_out, EncodeCounts* counts,
                                  const float* range) const {
  const ElementType type = format_.element;
  const int bits = element_traits(type).bits;
  const float qmax = float(element_traits(type).max_finite);
  float scale = 0.0f, minimum = 0.0f;
  if (format_.asymmetric) {
    auto [lo, hi] = range ? std::array<float, 2>{range[0], range[1]} : finite_range(x, count);
    if (lo > hi) lo = hi = 0.0f;  // nothing finite
    minimum = lo;
    scale = (hi - lo) / float((1 << bits) - 1);
  } else {
    scale = (range ? range_amax(range) : finite_amax(x, count)) / qmax;
  }
  const uint32_t mask = (1u << bits) - 1;
  for (int i = 0; i < count; ++i) {
    uint32_t code = 0;
    float decoded = format_.asymmetric ? minimum : 0.0f;
    if (scale > 0.0f && std::isfinite(x[i])) {
      if (format_.asymmetric) {
        const float q = std::clamp(std::nearbyint((x[i] - minimum) / scale), 0.0f, float(mask));
        code = uint32_t(q);
        decoded = q * scale + minimum;
      } else {
        const float q = std::clamp(std::nearbyint(x[i] / scale), -qmax, qmax);
        code = uint32_t(int32_t(q)) & mask;
        decoded = q * scale;
      }
    }
    store_code(codes, code_offset + i, bits, code);
    if (counts) {
      ++counts->elements;
      if (!std::isfinite(x[i])) {
        ++counts->nonfinite_input;
      } else if (!format_.asymmetric && x[i] != 0.0f && decoded == 0.0f) {
        // Symmetric ints underflow like floats: a value under half a step of its group's
        // scale becomes 0. Asymmetric grids have no dedicated zero level, so a decoded 0
        // there is a coincidence of the grid, not an underflow; it is not counted.
        ++counts->flushed_to_zero;
      }
    }
  }
  *scale_out = scale;
  if (min_out) *min_out = minimum;
}

void RowCodec::encode_row(const float* row, uint8_t* out, EncodeCounts* counts,
                          const float* range) const {
  if (range && format_.strategy != ScaleStrategy::token) {
    throw std::invalid_argument("encode_row: a given range needs a per-token strategy");
  }
  const ElementType type = format_.element;
  const int n = int(row_elements_);
  const int bits = element_traits(type).bits;
  std::memset(out, 0, size_t(row_bytes_));
  auto put_float = [&](int slot, float value) {
    std::memcpy(out + code_bytes_ + slot * sizeof(float), &value, sizeof(float));
  };

  if (format_.kind == KvFormatKind::nvfp4) {
    encode_nvfp4(static_scale_[0], {row, size_t(n)}, {out, size_t(code_bytes_)},
                 {out + code_bytes_, size_t(n / 16)});
    if (counts) {
      tally_nvfp4(static_scale_[0], {row, size_t(n)}, {out, size_t(code_bytes_)},
                  {out + code_bytes_, size_t(n / 16)}, *counts);
    }
    return;
  }
  if (format_.kind == KvFormatKind::mxfp4) {
    for (int block = 0; block * 32 < n; ++block) {
      const int count = std::min(32, n - block * 32);
      const uint8_t exponent =
          e8m0_for_block_amax(finite_amax(row + int64_t(block) * 32, count), 2);
      out[code_bytes_ + block] = exponent;
      encode_segment_scaled(row + int64_t(block) * 32, count, e8m0_to_float(exponent), out,
                            block * 32, counts);
    }
    return;
  }
  if (format_.strategy == ScaleStrategy::none && !is_fp8(type) && type != ElementType::int8 &&
      type != ElementType::int4) {
    // Plain BF16 / F16 / F32.
    for (int i = 0; i < n; ++i) {
      const uint32_t code = encode_element(type, row[i], format_.overflow);
      store_code(out, i, bits, code);
      if (counts) count_float_element(type, row[i], row[i], code, *counts);
    }
    return;
  }
  const bool is_int = type == ElementType::int8 || type == ElementType::int4;
  const bool dynamic =
      format_.strategy == ScaleStrategy::token || format_.strategy == ScaleStrategy::token_head ||
      format_.strategy == ScaleStrategy::group || format_.strategy == ScaleStrategy::kivi;
  const int segment = segment_elements_;
  for (int begin = 0, slot = 0; begin < n; begin += segment, ++slot) {
    const int count = std::min(segment, n - begin);
    if (is_int && dynamic) {
      float scale = 0.0f, minimum = 0.0f;
      encode_segment_int(row + begin, count, out, begin, &scale, &minimum, counts, range);
      put_float(format_.asymmetric ? 2 * slot : slot, scale);
      if (format_.asymmetric) put_float(2 * slot + 1, minimum);
    } else if (dynamic) {
      const float amax = range ? range_amax(range) : finite_amax(row + begin, count);
      const float scale = amax / float(element_traits(type).max_finite);
      encode_segment_scaled(row + begin, count, scale, out, begin, counts);
      put_float(slot, scale);
    } else {
      const float scale =
          static_scale_.size() == 1 ? static_scale_[0] : static_scale_[size_t(slot)];
      encode_segment_scaled(row + begin, count, scale, out, begin, counts);
    }
  }
}

void RowCodec::decode_row(const uint8_t* in, float* out) const {
  const ElementType type = format_.element;
  const int n = int(row_elements_);
  const int bits = element_traits(type).bits;
  auto get_float = [&](int slot) {
    float value;
    std::memcpy(&value, in + code_bytes_ + slot * sizeof(float), sizeof(float));
    return value;
  };
  if (format_.kind == KvFormatKind::nvfp4) {
    decode_nvfp4(static_scale_[0], {in, size_t(code_bytes_)}, {in + code_bytes_, size_t(n / 16)},
                 {out, size_t(n)});
    return;
  }
  if (format_.kind == KvFormatKind::mxfp4) {
    for (int block = 0; block * 32 < n; ++block) {
      const int count = std::min(32, n - block * 32);
      decode_segment_scaled(in, block * 32, count, e8m0_to_float(in[code_bytes_ + block]),
                            out + int64_t(block) * 32);
    }
    return;
  }
  const bool is_int = type == ElementType::int8 || type == ElementType::int4;
  if (format_.strategy == ScaleStrategy::none && !is_fp8(type) && !is_int) {
    for (int i = 0; i < n; ++i) out[i] = decode_element(type, load_code(in, i, bits));
    return;
  }
  const bool dynamic =
      format_.strategy == ScaleStrategy::token || format_.strategy == ScaleStrategy::token_head ||
      format_.strategy == ScaleStrategy::group || format_.strategy == ScaleStrategy::kivi;
  const int segment = segment_elements_;
  for (int begin = 0, slot = 0; begin < n; begin += segment, ++slot) {
    const int count = std::min(segment, n - begin);
    if (is_int && format_.asymmetric) {
      const float scale = get_float(2 * slot), minimum = get_float(2 * slot + 1);
      for (int i = 0; i < count; ++i) {
        out[begin + i] = float(load_code(in, begin + i, bits)) * scale + minimum;
      }
    } else if (dynamic) {
      decode_segment_scaled(in, begin, count, get_float(slot), out + begin);
    } else {
      const float scale =
          static_scale_.size() == 1 ? static_scale_[0] : static_scale_[size_t(slot)];
      decode_segment_scaled(in, begin, count, scale, out + begin);
    }
  }
}

void RowCodec::encode_key_group(const float* rows, int tokens, uint8_t* codes, float* channel_scale,
                                float* channel_min, EncodeCounts* counts) const {
  const int n = int(row_elements_);
  const int bits = element_traits(format_.element).bits;
  const uint32_t levels = (1u << bits) - 1;
  std::memset(codes, 0, size_t(tokens * row_bytes_));
  for (int c = 0; c < n; ++c) {
    float lo = std::numeric_limits<float>::infinity(), hi = -lo;
    for (int t = 0; t < tokens; ++t) {
      const float x = rows[int64_t(t) * n + c];
      if (!std::isfinite(x)) continue;
      lo = std::min(lo, x);
      hi = std::max(hi, x);
    }
    if (lo > hi) lo = hi = 0.0f;
    const float scale = (hi - lo) / float(levels);
    channel_scale[c] = scale;
    channel_min[c] = lo;
    for (int t = 0; t < tokens; ++t) {
      const float x = rows[int64_t(t) * n + c];
      float q = 0.0f;
      if (scale > 0.0f && std::isfinite(x)) {
        q = std::clamp(std::nearbyint((x - lo) / scale), 0.0f, float(levels));
      }
      store_code(codes + int64_t(t) * row_bytes_, c, bits, uint32_t(q));
      if (counts) {
        ++counts->elements;
        if (!std::isfinite(x)) {
          ++counts->nonfinite_input;
        }  // asymmetric: no flush-to-zero accounting (see encode_segment_int)
      }
    }
  }
}

void RowCodec::decode_key_row(const uint8_t* codes, const float* channel_scale,
                              const float* channel_min, float* out) const {
  const int bits = element_traits(format_.element).bits;
  for (int64_t c = 0; c < row_elements_; ++c) {
    out[c] = float(load_code(codes, c, bits)) * channel_scale[c] + channel_min[c];
  }
}

}  // namespace kvaudit::numerics
