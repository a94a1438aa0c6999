// Dispatch for the bulk codec kernels: FP8 (from float or BF16, to float or BF16), BF16,
// NVFP4, encode tallies, finite abs-max, the Walsh-Hadamard rotation and error sums.
// Their per-target code is in the -inl.h files included below (one per codec family, as
// gemma.cpp splits its compression/ and ops/); this file compiles them for every Highway
// target, holds the HWY_EXPORT table and the checked span wrappers. The scalar references
// in scalar.cpp (and encode_nvfp4_reference below) define the results, and tests/numerics
// compare every path against them bit for bit.
#include <algorithm>
#include <cmath>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "numerics/kernels.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "hwy/highway.h"
#include "numerics/bf16-inl.h"
#include "numerics/fp8-inl.h"
#include "numerics/numerics.h"
#include "numerics/nvfp4-inl.h"
#include "numerics/pack-inl.h"
#include "numerics/reduce-inl.h"
#include "numerics/tally-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvaudit::numerics::HWY_NAMESPACE {

const char* TargetName() {
  return hwy::TargetName(HWY_TARGET);
}

}  // namespace kvaudit::numerics::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "util/util.h"

namespace kvaudit::numerics {

HWY_EXPORT(EncodeFp8Float);
HWY_EXPORT(EncodeFp8Bf16);
HWY_EXPORT(DecodeFp8Float);
HWY_EXPORT(DecodeFp8Bf16);
HWY_EXPORT(Bf16ToFloat);
HWY_EXPORT(FloatToBf16);
HWY_EXPORT(EncodeNvfp4);
HWY_EXPORT(DecodeNvfp4);
HWY_EXPORT(EncodeNvfp4Bf16);
HWY_EXPORT(DecodeNvfp4Bf16);
HWY_EXPORT(TallyFp8);
HWY_EXPORT(RoundTripFp8Float);
HWY_EXPORT(TallyNvfp4);
HWY_EXPORT(FiniteAbsMax);
HWY_EXPORT(FiniteAbsMaxInto);
HWY_EXPORT(HadamardRows);
HWY_EXPORT(ErrorBlockSums);
HWY_EXPORT(TargetName);

namespace {
void require(bool condition, const char* what) {
  if (!condition) throw std::invalid_argument(std::string("numerics: ") + what);
}
// NVFP4 spans: n elements a multiple of 16, n / 2 packed bytes, n / 16 block scales.
void require_nvfp4_sizes(size_t n, size_t packed_bytes, size_t block_scales, const char* what) {
  if (n % 16 != 0 || packed_bytes < n / 2 || block_scales < n / 16) {
    throw std::invalid_argument(std::string("numerics: ") + what +
                                ": n must be a multiple of 16, with n / 2 packed bytes and "
                                "n / 16 block scales");
  }
}
}  // namespace

std::string simd_target_name() {
  return HWY_DYNAMIC_DISPATCH(TargetName)();
}

void encode_fp8(ElementType type, Overflow overflow, float scale, std::span<const float> input,
                std::span<uint8_t> codes) {
  require(is_fp8(type) && codes.size() >= input.size(), "encode_fp8: bad type or size");
  HWY_DYNAMIC_DISPATCH(EncodeFp8Float)
  (type, overflow, scale, input.data(), codes.data(), input.size());
}
void encode_fp8_from_bf16(ElementType type, Overflow overflow, float scale,
                          std::span<const uint16_t> input, std::span<uint8_t> codes) {
  require(is_fp8(type) && codes.size() >= input.size(), "encode_fp8_from_bf16: bad type or size");
  HWY_DYNAMIC_DISPATCH(EncodeFp8Bf16)
  (type, overflow, scale, input.data(), codes.data(), input.size());
}
void decode_fp8(ElementType type, float scale, std::span<const uint8_t> codes,
                std::span<float> output) {
  require(is_fp8(type) && output.size() >= codes.size(), "decode_fp8: bad type or size");
  HWY_DYNAMIC_DISPATCH(DecodeFp8Float)(type, scale, codes.data(), output.data(), codes.size());
}
void decode_fp8_to_bf16(ElementType type, float scale, std::span<const uint8_t> codes,
                        std::span<uint16_t> output) {
  require(is_fp8(type) && output.size() >= codes.size(), "decode_fp8_to_bf16: bad type or size");
  HWY_DYNAMIC_DISPATCH(DecodeFp8Bf16)(type, scale, codes.data(), output.data(), codes.size());
}
void bf16_to_float_bulk(std::span<const uint16_t> input, std::span<float> output) {
  require(output.size() >= input.size(), "bf16_to_float_bulk: output too small");
  HWY_DYNAMIC_DISPATCH(Bf16ToFloat)(input.data(), output.data(), input.size());
}
void float_to_bf16_bulk(std::span<const float> input, std::span<uint16_t> output) {
  require(output.size() >= input.size(), "float_to_bf16_bulk: output too small");
  HWY_DYNAMIC_DISPATCH(FloatToBf16)(input.data(), output.data(), input.size());
}

void encode_nvfp4(float tensor_scale, std::span<const float> input, std::span<uint8_t> packed,
                  std::span<uint8_t> block_scales) {
  const size_t n = input.size();
  require_nvfp4_sizes(n, packed.size(), block_scales.size(), "encode_nvfp4");
  HWY_DYNAMIC_DISPATCH(EncodeNvfp4)
  (tensor_scale, input.data(), packed.data(), block_scales.data(), n);
}
void decode_nvfp4(float tensor_scale, std::span<const uint8_t> packed,
                  std::span<const uint8_t> block_scales, std::span<float> output) {
  const size_t n = output.size();
  require_nvfp4_sizes(n, packed.size(), block_scales.size(), "decode_nvfp4");
  HWY_DYNAMIC_DISPATCH(DecodeNvfp4)
  (tensor_scale, packed.data(), block_scales.data(), output.data(), n);
}

void encode_nvfp4_from_bf16(float tensor_scale, std::span<const uint16_t> input,
                            std::span<uint8_t> packed, std::span<uint8_t> block_scales) {
  const size_t n = input.size();
  require_nvfp4_sizes(n, packed.size(), block_scales.size(), "encode_nvfp4_from_bf16");
  HWY_DYNAMIC_DISPATCH(EncodeNvfp4Bf16)
  (tensor_scale, input.data(), packed.data(), block_scales.data(), n);
}
void decode_nvfp4_to_bf16(float tensor_scale, std::span<const uint8_t> packed,
                          std::span<const uint8_t> block_scales, std::span<uint16_t> output) {
  const size_t n = output.size();
  require_nvfp4_sizes(n, packed.size(), block_scales.size(), "decode_nvfp4_to_bf16");
  HWY_DYNAMIC_DISPATCH(DecodeNvfp4Bf16)
  (tensor_scale, packed.data(), block_scales.data(), output.data(), n);
}

namespace {
void add_tallies(const int64_t* tallies, int64_t elements, EncodeCounts& counts) {
  counts.elements += elements;
  counts.saturated += tallies[0];
  counts.became_nan += tallies[1];
  counts.became_inf += tallies[2];
  counts.flushed_to_zero += tallies[3];
  counts.subnormal += tallies[4];
  counts.nonfinite_input += tallies[5];
}
}  // namespace

void tally_fp8(ElementType type, float scale, std::span<const float> values,
               std::span<const uint8_t> codes, EncodeCounts& counts) {
  require(is_fp8(type) && codes.size() >= values.size(), "tally_fp8: bad type or size");
  const float limit = float(element_traits(type).max_finite) * scale;
  int64_t tallies[6] = {};
  HWY_DYNAMIC_DISPATCH(TallyFp8)(type, limit, values.data(), codes.data(), values.size(), tallies);
  add_tallies(tallies, int64_t(values.size()), counts);
}

void round_trip_fp8(ElementType type, Overflow overflow, float scale, std::span<const float> input,
                    std::span<float> output, EncodeCounts& counts) {
  require(is_fp8(type) && output.size() >= input.size(), "round_trip_fp8: bad type or size");
  int64_t tallies[6] = {};
  HWY_DYNAMIC_DISPATCH(RoundTripFp8Float)
  (type, overflow, scale, input.data(), output.data(), input.size(), tallies);
  add_tallies(tallies, int64_t(input.size()), counts);
}

void tally_nvfp4(float tensor_scale, std::span<const float> values, std::span<const uint8_t> packed,
                 std::span<const uint8_t> block_scales, EncodeCounts& counts) {
  const size_t n = values.size();
  require_nvfp4_sizes(n, packed.size(), block_scales.size(), "tally_nvfp4");
  int64_t tallies[6] = {};
  HWY_DYNAMIC_DISPATCH(TallyNvfp4)
  (tensor_scale, values.data(), packed.data(), block_scales.data(), n, tallies);
  add_tallies(tallies, int64_t(n), counts);
}

float finite_abs_max(std::span<const float> values) {
  return HWY_DYNAMIC_DISPATCH(FiniteAbsMax)(values.data(), values.size());
}
void finite_abs_max_into(std::span<const float> values, std::span<float> amax) {
  require(amax.size() >= values.size(), "finite_abs_max_into: amax too small");
  HWY_DYNAMIC_DISPATCH(FiniteAbsMaxInto)(values.data(), amax.data(), values.size());
}

void encode_nvfp4_reference(float tensor_scale, std::span<const float> input,
                            std::span<uint8_t> packed, std::span<uint8_t> block_scales) {
  const size_t n = input.size();
  require_nvfp4_sizes(n, packed.size(), block_scales.size(), "encode_nvfp4_reference");
  for (size_t block = 0; block < n / 16; ++block) {
    float amax = 0.0f;
    for (size_t j = 0; j < 16; ++j) amax = std::max(amax, std::fabs(input[block * 16 + j]));
    // Block scale: the block's amax maps onto FP4's largest magnitude (6), stored as E4M3
    // relative to the FP32 tensor scale (NVIDIA's two-level NVFP4 recipe).
    const uint8_t scale_code = float_to_fp8_e4m3(amax / 6.0f / tensor_scale, Overflow::saturate);
    block_scales[block] = scale_code;
    const float effective = fp8_e4m3_to_float(scale_code) * tensor_scale;
    for (size_t j = 0; j < 16; j += 2) {
      uint8_t low = 0, high = 0;
      if (effective > 0.0f && std::isfinite(effective)) {
        low = float_to_fp4_e2m1(input[block * 16 + j] / effective);
        high = float_to_fp4_e2m1(input[block * 16 + j + 1] / effective);
      }
      packed[(block * 16 + j) / 2] = uint8_t(low | (high << 4));
    }
  }
}

void decode_nvfp4_reference(float tensor_scale, std::span<const uint8_t> packed,
                            std::span<const uint8_t> block_scales, std::span<float> output) {
  const size_t n = output.size();
  require_nvfp4_sizes(n, packed.size(), block_scales.size(), "decode_nvfp4_reference");
  for (size_t i = 0; i < n; ++i) {
    const float effective = fp8_e4m3_to_float(block_scales[i / 16]) * tensor_scale;
    const uint8_t byte = packed[i / 2];
    output[i] = fp4_e2m1_to_float(i % 2 == 0 ? byte & 0xF : byte >> 4) * effective;
  }
}

void hadamard_rows(std::span<float> data, int width) {
  require(width > 0 && (width & (width - 1)) == 0, "hadamard_rows: width must be a power of two");
  HWY_DYNAMIC_DISPATCH(HadamardRows)(data.data(), data.size(), size_t(width));
}

void ErrorStats::add(std::span<const float> reference, std::span<const float> decoded) {
  const size_t n = std::min(reference.size(), decoded.size());
  // Plain sums within a block of 256, compensated sums across blocks.
  constexpr size_t kBlock = 256;
  for (size_t begin = 0; begin < n; begin += kBlock) {
    const size_t size = std::min(n - begin, kBlock);
    double sums[4];
    HWY_DYNAMIC_DISPATCH(ErrorBlockSums)
    (reference.data() + begin, decoded.data() + begin, size, sums);
    const auto finite = int64_t(sums[2]);
    sum_squared_error.add(sums[0]);
    sum_squared_reference.add(sums[1]);
    max_abs_error = std::max(max_abs_error, sums[3]);
    count += finite;
    nonfinite += int64_t(size) - finite;
  }
}

}  // namespace kvaudit::numerics
#endif  // HWY_ONCE
