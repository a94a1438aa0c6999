// Internal to numerics/: encodes and decodes one token row (or, for KIVI keys, one group of
// token rows) of a KV format into its stored bytes. KvStream and round_trip build on it.
// Rows arrive already rotated when the format uses a Hadamard rotation.
#pragma once

#include <cstdint>
#include <vector>

#include "numerics/numerics.h"

namespace kvaudit::numerics {

class RowCodec {
 public:
  RowCodec(const KvFormat& format, const KvLayout& layout, KvRole role,
           const StaticAmax& calibration);

  // Bytes one encoded row takes (codes plus its dynamic scales).
  int64_t row_bytes() const { return row_bytes_; }
  bool key_groups() const { return key_groups_; }  // KIVI keys: encode whole token groups

  // row: [row_elements] -> out: [row_bytes]. counts may be null. range (a per-token
  // strategy only, else null): the finite {minimum, maximum} the scale is taken from, in
  // place of the row's own: a row that is one head's part of a wider one codes as it does
  // inside the whole.
  void encode_row(const float* row, uint8_t* out, EncodeCounts* counts,
                  const float* range = nullptr) const;
  void decode_row(const uint8_t* in, float* out) const;

  // KIVI keys: rows [tokens, row_elements] quantised per channel over the group.
  // codes: [tokens, row_bytes]; channel_scale / channel_min: [row_elements].
  void encode_key_group(const float* rows, int tokens, uint8_t* codes, float* channel_scale,
                        float* channel_min, EncodeCounts* counts) const;
  void decode_key_row(const uint8_t* codes, const float* channel_scale, const float* channel_min,
                      float* out) const;

 private:
  void encode_segment_scaled(const float* x, int count, float scale, uint8_t* codes,
                             int code_offset, EncodeCounts* counts) const;
  void decode_segment_scaled(const uint8_t* codes, int code_offset, int count, float scale,
                             float* out) const;
  void encode_segment_int(const float* x, int count, uint8_t* codes, int code_offset,
                          float* scale_out, float* min_out, EncodeCounts* counts,
                          const float* range) const;

  KvFormat format_;
  KvLayout layout_;
  int64_t row_elements_ = 0;
  int64_t code_bytes_ = 0;
  int64_t row_bytes_ = 0;
  bool key_groups_ = false;
  int segment_elements_ = 0;         // elements sharing one scale within a row
  std::vector<float> static_scale_;  // per segment (tensor, head) or per element (channel)
};

}  // namespace kvaudit::numerics
