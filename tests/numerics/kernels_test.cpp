// SIMD kernels against the scalar references, bit for bit: sizes 0..2N+, misaligned
// pointers, zeros, +-0, subnormals, inf, NaN, every FP8 code, for each type, mode and scale.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/counts.h"
#include "hwy/targets.h"
#include "numerics/numerics.h"

namespace kvaudit::numerics {
namespace {

using testing::expect_same_counts;

const ElementType kFp8Types[] = {ElementType::fp8_e4m3, ElementType::fp8_e4m3fnuz,
                                 ElementType::fp8_e5m2};

// Inputs that exercise every branch: specials, boundaries, every decoded FP8 value times a
// few scales, and random values over many binades.
std::vector<float> nasty_values(size_t count, uint32_t seed) {
  std::vector<float> values = {0.0f,   -0.0f,   INFINITY,      -INFINITY,   NAN,    -NAN,
                               1e-45f, -1e-45f, 1e-40f,        448.0f,      464.0f, 465.0f,
                               480.0f, -480.0f, 57344.0f,      61440.0f,    240.0f, 248.0f,
                               1e38f,  3.4e38f, 0.0009765625f, 0.001953125f};
  for (ElementType type : kFp8Types) {
    for (uint32_t code = 0; code < 256; ++code) values.push_back(decode_element(type, code));
  }
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> exponent(-30.0f, 20.0f);
  std::normal_distribution<float> normal;
  while (values.size() < count) values.push_back(normal(rng) * std::exp2(exponent(rng)));
  values.resize(count);
  std::shuffle(values.begin(), values.end(), rng);
  return values;
}

// Runs body once for every SIMD target compiled in and supported here (AVX3, AVX2, SSE4,
// ..., EMU128), so each dispatch path is compared with the scalar reference.
template <class Body>
void ForEachTarget(const Body& body) {
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(simd_target_name());
    body();
  }
  hwy::SetSupportedTargetsForTest(0);
}

bool same_bits(float a, float b) {
  if (std::isnan(a) && std::isnan(b)) return true;
  return std::memcmp(&a, &b, 4) == 0;
}

TEST(Kernels, ReportsATarget) {
  EXPECT_FALSE(simd_target_name().empty());
#ifndef HWY_COMPILE_ONLY_STATIC  // sanitizer builds compile the baseline target only
  EXPECT_GE(hwy::SupportedAndGeneratedTargets().size(), 2u);
#endif
  // The per-target loop really switches the dispatched code.
  std::set<std::string> names;
  ForEachTarget([&] { names.insert(simd_target_name()); });
  EXPECT_EQ(names.size(), hwy::SupportedAndGeneratedTargets().size());
}

TEST(Kernels, Fp8EncodeDecodeMatchScalarForAllSizesAndOffsets) {
  ForEachTarget([&] {
    const std::vector<float> values = nasty_values(4096, 1);
    for (ElementType type : kFp8Types) {
      for (Overflow overflow : {Overflow::saturate, Overflow::nan_inf}) {
        for (float scale : {1.0f, 0.37f, 3.0f}) {
          // Sizes 0..40 (beyond 2 x 16 lanes) at every offset 0..3, then one long run.
          for (size_t size = 0; size <= 41; ++size) {
            for (size_t offset = 0; offset < 4; ++offset) {
              std::span<const float> input(values.data() + offset * 13 + size, size);
              std::vector<uint8_t> codes(size + 1, 0xAA);
              encode_fp8(type, overflow, scale, input, std::span<uint8_t>(codes).subspan(1, size));
              for (size_t i = 0; i < size; ++i) {
                ASSERT_EQ(codes[i + 1], encode_element(type, input[i] / scale, overflow))
                    << element_traits(type).name << " x=" << input[i] << " scale=" << scale;
              }
              EXPECT_EQ(codes[0], 0xAA);  // nothing written outside
              std::vector<float> decoded(size);
              decode_fp8(type, scale, std::span<const uint8_t>(codes).subspan(1, size), decoded);
              for (size_t i = 0; i < size; ++i) {
                ASSERT_TRUE(same_bits(decoded[i], decode_element(type, codes[i + 1]) * scale));
              }
            }
          }
          std::vector<uint8_t> codes(values.size());
          encode_fp8(type, overflow, scale, values, codes);
          for (size_t i = 0; i < values.size(); ++i) {
            ASSERT_EQ(codes[i], encode_element(type, values[i] / scale, overflow))
                << element_traits(type).name << " x=" << values[i] << " scale=" << scale;
          }
        }
      }
    }
  });
}

TEST(Kernels, Fp8DecodeEveryCode) {
  ForEachTarget([&] {
    std::vector<uint8_t> codes(256 + 3);
    for (size_t i = 0; i < codes.size(); ++i) codes[i] = uint8_t(i);
    // Scales where the kernel folds the scale into its exponent-rebias multiply and ones
    // where it cannot (overflow, subnormal, negative, non-finite).
    const float kDecodeScales[] = {1.0f,    2.0f,
                                   0.37f,   3.0f,
                                   1e-30f,  1e-40f,
                                   300.0f,  3e38f,
                                   -0.625f, std::numeric_limits<float>::infinity(),
                                   0.0f,    std::numeric_limits<float>::quiet_NaN()};
    for (ElementType type : kFp8Types) {
      for (float scale : kDecodeScales) {
        std::vector<float> out(codes.size());
        decode_fp8(type, scale, codes, out);
        std::vector<uint16_t> out16(codes.size());
        decode_fp8_to_bf16(type, scale, codes, out16);
        for (size_t i = 0; i < codes.size(); ++i) {
          const float expected = decode_element(type, codes[i]) * scale;
          EXPECT_TRUE(same_bits(out[i], expected))
              << element_traits(type).name << " code " << int(codes[i]) << " scale " << scale;
          EXPECT_EQ(out16[i], float_to_bf16(expected))
              << element_traits(type).name << " code " << int(codes[i]) << " scale " << scale;
        }
      }
    }
  });
}

// Bulk FP8 -> BF16 calls (4096 codes and more) take the table path, whose identity holds
// only for some scales: every code, for each type, over scales from 2^-140 to 2^130 (ones
// where the table is used and ones where its self-check must send the call to the float
// path), plus the specials.
TEST(Kernels, Fp8Bf16BulkDecodeEveryCodeEveryScale) {
  ForEachTarget([&] {
    const size_t n = 4096 + 256 + 5;
    std::vector<uint8_t> codes(n + 1);
    for (size_t i = 0; i < codes.size(); ++i) codes[i] = uint8_t(i * 7 + i / 256);
    std::vector<float> scales = {1.0f,
                                 0.37f,
                                 -0.625f,
                                 0.0f,
                                 -0.0f,
                                 std::numeric_limits<float>::infinity(),
                                 std::numeric_limits<float>::quiet_NaN(),
                                 1e-45f,
                                 std::numeric_limits<float>::max()};
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> exponent(-140.0f, 130.0f);
    for (int i = 0; i < 120; ++i) scales.push_back(std::exp2(exponent(rng)) * 1.2345f);
    std::vector<uint16_t> out(n + 1);
    for (ElementType type : kFp8Types) {
      for (float scale : scales) {
        std::fill(out.begin(), out.end(), uint16_t{0xAAAA});
        decode_fp8_to_bf16(type, scale, std::span<const uint8_t>(codes).subspan(1, n),
                           std::span<uint16_t>(out).subspan(1, n));
        ASSERT_EQ(out[0], 0xAAAA);
        for (size_t i = 1; i <= n; ++i) {
          ASSERT_EQ(out[i], float_to_bf16(decode_element(type, codes[i]) * scale))
              << element_traits(type).name << " code " << int(codes[i]) << " scale " << scale;
        }
      }
    }
  });
}

// Outputs of 4 MiB and more take the streaming-store path: misaligned start, every bit
// pattern many times over, odd length.
TEST(Kernels, Fp8Bf16StreamingPathMatchesScalar) {
  ForEachTarget([&] {
    const size_t n = (size_t(4) << 20) + 37;
    std::vector<uint16_t> input(n + 1);
    for (size_t i = 0; i < input.size(); ++i) input[i] = uint16_t(i * 40503u);
    std::vector<uint8_t> codes(n + 1, 0xAA);
    std::vector<uint16_t> output(n + 1, 0xAAAA);
    const float scale = 0.37f;
    encode_fp8_from_bf16(ElementType::fp8_e4m3, Overflow::saturate, scale,
                         std::span<const uint16_t>(input).subspan(1, n),
                         std::span<uint8_t>(codes).subspan(1, n));
    decode_fp8_to_bf16(ElementType::fp8_e4m3, scale, std::span<const uint8_t>(codes).subspan(1, n),
                       std::span<uint16_t>(output).subspan(1, n));
    EXPECT_EQ(codes[0], 0xAA);
    EXPECT_EQ(output[0], 0xAAAA);
    for (size_t i = 1; i <= n; ++i) {
      const uint8_t code = uint8_t(encode_element(
          ElementType::fp8_e4m3, bf16_to_float(input[i]) / scale, Overflow::saturate));
      ASSERT_EQ(codes[i], code) << i;
      ASSERT_EQ(output[i], float_to_bf16(decode_element(ElementType::fp8_e4m3, code) * scale)) << i;
    }
  });
}

// Scales whose reciprocal is inexact (so an encoder that multiplied by 1/scale instead of
// dividing would round some quotients differently), tiny and huge scales, and random ones.
std::vector<float> encode_scales() {
  std::vector<float> scales = {
      0.5f,    40.0f / 448.0f,  1.0f / 3.0f,    0.0175f,         3.0f,           1e-7f,  0x1p-30f,
      0x1p30f, 0x1.000002p-30f, 0x1.fffffep29f, 0x1.fffffep-31f, 0x1.000002p30f, 1e-38f, 1e-42f,
      3e37f};
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> exponent(-32.0f, 32.0f);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  for (int i = 0; i < 9; ++i)
    scales.push_back(mantissa(rng) * std::exp2(std::round(exponent(rng))));
  return scales;
}

TEST(Kernels, Fp8FromBf16MatchesScalar) {
  ForEachTarget([&] {
    std::vector<uint16_t> input(65536 + 5);
    for (size_t i = 0; i < input.size(); ++i) input[i] = uint16_t(i * 40503u);  // all patterns
    for (float scale : encode_scales()) {
      for (ElementType type : kFp8Types) {
        for (Overflow overflow : {Overflow::saturate, Overflow::nan_inf}) {
          std::vector<uint8_t> codes(input.size());
          encode_fp8_from_bf16(type, overflow, scale, input, codes);
          for (size_t i = 0; i < input.size(); ++i) {
            ASSERT_EQ(codes[i], encode_element(type, bf16_to_float(input[i]) / scale, overflow))
                << "bf16 " << input[i] << " scale " << scale;
          }
        }
      }
    }
  });
}

// The float encoder on every float that lies on or next to an FP8 rounding boundary of
// several binades (ties, one ulp either side), divided by inexact scales.
TEST(Kernels, Fp8EncodeRoundingBoundariesUnderInexactScales) {
  ForEachTarget([&] {
    for (float scale : encode_scales()) {
      for (ElementType type : kFp8Types) {
        std::vector<float> values;
        for (uint32_t code = 0; code < 255; ++code) {
          const float low = decode_element(type, code), high = decode_element(type, code + 1);
          if (!std::isfinite(low) || !std::isfinite(high) ||
              std::signbit(low) != std::signbit(high))
            continue;
          const float tie = (low + high) / 2 * scale;
          float below = tie, above = tie;
          values.insert(values.end(), {tie, -tie});
          for (int k = 0; k < 3; ++k) {
            below = std::nextafter(below, 0.0f);
            above = std::nextafter(above, INFINITY);
            values.insert(values.end(), {below, above, -below, -above});
          }
        }
        for (Overflow overflow : {Overflow::saturate, Overflow::nan_inf}) {
          std::vector<uint8_t> codes(values.size());
          encode_fp8(type, overflow, scale, values, codes);
          for (size_t i = 0; i < values.size(); ++i) {
            ASSERT_EQ(codes[i], encode_element(type, values[i] / scale, overflow))
                << values[i] << " scale " << scale;
          }
        }
      }
    }
  });
}

// ErrorStats' block kernel against a plain double loop: counts and the maximum exactly, the
// sums to rounding, on every target, for sizes around the block and lane boundaries.
TEST(Kernels, ErrorStatsMatchPlainSums) {
  ForEachTarget([&] {
    for (size_t size : {0, 1, 3, 4, 7, 255, 256, 257, 1000, 4099}) {
      std::vector<float> reference = nasty_values(size, uint32_t(size) + 7);
      std::vector<float> decoded = nasty_values(size, uint32_t(size) + 8);
      for (size_t i = 0; i < size; i += 3) decoded[i] = reference[i] * 1.01f;
      double error_sq = 0, reference_sq = 0, max_error = 0;
      int64_t finite = 0;
      for (size_t i = 0; i < size; ++i) {
        const double r = reference[i], x = decoded[i];
        if (!std::isfinite(r) || !std::isfinite(x)) continue;
        ++finite;
        error_sq += (x - r) * (x - r);
        reference_sq += r * r;
        max_error = std::max(max_error, std::fabs(x - r));
      }
      ErrorStats stats;
      stats.add(reference, decoded);
      EXPECT_EQ(stats.count, finite) << size;
      EXPECT_EQ(stats.nonfinite, int64_t(size) - finite) << size;
      EXPECT_EQ(stats.max_abs_error, max_error) << size;
      EXPECT_NEAR(stats.sum_squared_error.value(), error_sq, 1e-12 * error_sq) << size;
      EXPECT_NEAR(stats.sum_squared_reference.value(), reference_sq, 1e-12 * reference_sq) << size;
    }
  });
}

TEST(Kernels, Bf16BulkMatchesScalar) {
  ForEachTarget([&] {
    const std::vector<float> values = nasty_values(1031, 2);
    std::vector<uint16_t> bf16(values.size());
    float_to_bf16_bulk(values, bf16);
    std::vector<float> back(values.size());
    bf16_to_float_bulk(bf16, back);
    for (size_t i = 0; i < values.size(); ++i) {
      ASSERT_EQ(bf16[i], float_to_bf16(values[i])) << values[i];
      ASSERT_TRUE(same_bits(back[i], bf16_to_float(bf16[i])));
    }
  });
}

TEST(Kernels, Nvfp4MatchesReference) {
  ForEachTarget([&] {
    std::vector<float> values = nasty_values(16 * 64, 3);
    // Add ordinary blocks too: Gaussian, an all-zero block, a block with one huge outlier.
    std::mt19937 rng(4);
    std::normal_distribution<float> normal;
    for (int i = 0; i < 16 * 32; ++i) values.push_back(normal(rng));
    for (int i = 0; i < 16; ++i) values.push_back(0.0f);
    for (int i = 0; i < 16; ++i) values.push_back(i == 5 ? 1e4f : normal(rng) * 0.01f);
    // Blocks whose amax / 6 is an E4M3 value with an inexact reciprocal (0.8125, 1.375), and
    // elements at and one ulp around each FP4 rounding boundary times that block scale.
    for (float block_scale : {0.8125f, 1.375f, 1.625f, 1.75f, 0.6875f, 3.25f, 0.40625f, 13.0f}) {
      std::vector<float> boundary;
      for (float midpoint : {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f}) {
        float below = midpoint * block_scale, above = below;
        boundary.insert(boundary.end(), {below, -below});
        for (int k = 0; k < 4; ++k) {
          below = std::nextafter(below, 0.0f);
          above = std::nextafter(above, INFINITY);
          boundary.insert(boundary.end(), {below, above, -below, -above});
        }
      }
      for (size_t at = 0; at < boundary.size(); at += 15) {
        values.push_back(6.0f * block_scale);
        for (size_t j = at; j < at + 15; ++j)
          values.push_back(j < boundary.size() ? boundary[j] : 0.0f);
      }
    }
    // Tensor scales the block-scale decode can fold into its rebias multiply, and ones it cannot.
    for (float tensor_scale : {1.0f, 0.01f, 37.0f, 300.0f, 1e30f, 1e-39f}) {
      const size_t n = values.size();
      std::vector<uint8_t> packed(n / 2), scales(n / 16), packed_ref(n / 2), scales_ref(n / 16);
      encode_nvfp4(tensor_scale, values, packed, scales);
      encode_nvfp4_reference(tensor_scale, values, packed_ref, scales_ref);
      ASSERT_EQ(packed, packed_ref);
      ASSERT_EQ(scales, scales_ref);
      std::vector<float> out(n), out_ref(n);
      decode_nvfp4(tensor_scale, packed, scales, out);
      decode_nvfp4_reference(tensor_scale, packed_ref, scales_ref, out_ref);
      for (size_t i = 0; i < n; ++i) ASSERT_TRUE(same_bits(out[i], out_ref[i])) << i;
    }
    // A plain Gaussian block comes back within NVFP4's resolution.
    std::vector<float> block(16);
    for (float& v : block) v = normal(rng);
    std::vector<uint8_t> packed(8), scales(1);
    encode_nvfp4(1.0f, block, packed, scales);
    std::vector<float> out(16);
    decode_nvfp4(1.0f, packed, scales, out);
    float amax = 0;
    for (float v : block) amax = std::max(amax, std::fabs(v));
    for (size_t i = 0; i < 16; ++i) EXPECT_NEAR(out[i], block[i], amax / 6.0f * 1.01f);
  });
}

// The BF16 entry points equal the float path on the widened values, bit for bit: every
// BF16 pattern, Gaussian blocks, blocks of zeros, NaN and inf, block counts that leave
// leftovers, misaligned spans, tensor scales whose block scales are zero, huge, negative
// or NaN, and an output large enough to take the streaming stores.
TEST(Kernels, Nvfp4Bf16MatchesFloatPath) {
  ForEachTarget([&] {
    std::vector<uint16_t> input;
    for (uint32_t bits = 0; bits < 65536; ++bits) input.push_back(uint16_t(bits));
    std::mt19937 rng(9);
    std::shuffle(input.begin(), input.end(), rng);
    std::normal_distribution<float> normal;
    for (int i = 0; i < 16 * 40; ++i) input.push_back(float_to_bf16(normal(rng)));
    for (int i = 0; i < 16; ++i) input.push_back(0);
    for (int i = 0; i < 16; ++i) input.push_back(i == 3 ? 0x7FC0 : float_to_bf16(normal(rng)));
    for (int i = 0; i < 16; ++i) input.push_back(i == 9 ? 0xFF80 : float_to_bf16(normal(rng)));
    for (int i = 0; i < 16 * 5; ++i) input.push_back(float_to_bf16(normal(rng) * 1e-3f));
    auto check = [&](float tensor_scale, std::span<const uint16_t> bf16) {
      const size_t n = bf16.size();
      std::vector<float> widened(n);
      bf16_to_float_bulk(bf16, widened);
      std::vector<uint8_t> packed(n / 2 + 1, 0xAA), scales(n / 16 + 1, 0xAA);
      std::vector<uint8_t> packed_ref(n / 2), scales_ref(n / 16);
      encode_nvfp4_from_bf16(tensor_scale, bf16, std::span(packed).subspan(1, n / 2),
                             std::span(scales).subspan(1, n / 16));
      encode_nvfp4_reference(tensor_scale, widened, packed_ref, scales_ref);
      ASSERT_EQ(packed[0], 0xAA);
      ASSERT_EQ(scales[0], 0xAA);
      ASSERT_TRUE(std::equal(packed_ref.begin(), packed_ref.end(), packed.begin() + 1))
          << "tensor scale " << tensor_scale;
      ASSERT_TRUE(std::equal(scales_ref.begin(), scales_ref.end(), scales.begin() + 1))
          << "tensor scale " << tensor_scale;
      std::vector<uint16_t> out(n + 1, 0xAAAA);
      decode_nvfp4_to_bf16(tensor_scale, std::span<const uint8_t>(packed).subspan(1, n / 2),
                           std::span<const uint8_t>(scales).subspan(1, n / 16),
                           std::span(out).subspan(1, n));
      std::vector<float> decoded_ref(n);
      decode_nvfp4_reference(tensor_scale, packed_ref, scales_ref, decoded_ref);
      ASSERT_EQ(out[0], 0xAAAA);
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(out[i + 1], float_to_bf16(decoded_ref[i]))
            << "tensor scale " << tensor_scale << " element " << i;
      }
    };
    for (float tensor_scale : {1.0f, 0.01f, 37.0f, 1e30f, 1e-39f, -0.5f, 0.0f,
                               std::numeric_limits<float>::quiet_NaN()}) {
      check(tensor_scale, input);
      check(tensor_scale, std::span<const uint16_t>(input).subspan(16 * 3, 16 * 13));
    }
    // Block scales decoded from arbitrary bytes: every E4M3 code, NaN and negative included.
    std::vector<uint8_t> packed(256 * 8), scales(256);
    for (size_t i = 0; i < packed.size(); ++i) packed[i] = uint8_t(i * 37 + 11);
    for (size_t i = 0; i < scales.size(); ++i) scales[i] = uint8_t(i);
    std::vector<uint16_t> out(256 * 16);
    std::vector<float> decoded_ref(256 * 16);
    decode_nvfp4_to_bf16(0.75f, packed, scales, out);
    decode_nvfp4_reference(0.75f, packed, scales, decoded_ref);
    for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], float_to_bf16(decoded_ref[i])) << i;
    // Outputs of 4 MiB and more are streamed.
    std::vector<uint16_t> large(size_t(4) << 20);
    for (size_t i = 0; i < large.size(); ++i) large[i] = float_to_bf16(normal(rng));
    check(0.02f, large);
  });
}

// The encode tallies against a per-element loop over the scalar code classes: every code
// with finite, zero, huge and non-finite inputs, for each FP8 type and for NVFP4 blocks.
EncodeCounts tally_reference(ElementType type, std::span<const float> values,
                             const std::vector<uint32_t>& codes, const std::vector<float>& limits) {
  EncodeCounts counts;
  for (size_t i = 0; i < values.size(); ++i) {
    ++counts.elements;
    const float v = values[i];
    if (!std::isfinite(v)) {
      ++counts.nonfinite_input;
      continue;
    }
    const CodeClass c = classify_code(type, codes[i]);
    counts.became_nan += c == CodeClass::nan;
    counts.became_inf += c == CodeClass::inf;
    counts.flushed_to_zero += c == CodeClass::zero && v != 0.0f;
    counts.subnormal += c == CodeClass::subnormal;
    counts.saturated += c == CodeClass::max_finite && std::fabs(v) > limits[i];
  }
  return counts;
}

// round_trip_fp8 (one fused pass) against encode_fp8, tally_fp8 and decode_fp8 in turn:
// every flavour and overflow mode, values from subnormal to past the limit, NaN and inf,
// lengths that leave scalar tails.
TEST(Kernels, FusedFp8RoundTripMatchesEncodeTallyDecode) {
  ForEachTarget([&] {
    std::mt19937 rng(17);
    std::normal_distribution<float> normal;
    std::uniform_real_distribution<float> exponent(-12.0f, 6.0f);
    std::vector<float> values(4099);
    for (float& v : values) v = normal(rng) * std::pow(2.0f, exponent(rng));
    for (size_t i = 0; i < values.size(); i += 97) values[i] = i % 2 ? INFINITY : NAN;
    values[1] = -INFINITY;
    values[2] = 0.0f;
    values[3] = -0.0f;
    for (ElementType type : kFp8Types) {
      for (Overflow overflow : {Overflow::saturate, Overflow::nan_inf}) {
        for (float scale : {1.0f, 0.37f, 3.5f}) {
          for (size_t length : {values.size(), size_t{7}, size_t{0}}) {
            const std::span<const float> input(values.data(), length);
            std::vector<uint8_t> codes(length);
            std::vector<float> separate(length), fused(length);
            EncodeCounts separate_counts, fused_counts;
            encode_fp8(type, overflow, scale, input, codes);
            tally_fp8(type, scale, input, codes, separate_counts);
            decode_fp8(type, scale, codes, separate);
            round_trip_fp8(type, overflow, scale, input, fused, fused_counts);
            const std::string what =
                fmt::format("{} overflow {} scale {} length {}", element_traits(type).name,
                            int(overflow), scale, length);
            // (memcmp may not be given the null data() of empty vectors.)
            ASSERT_TRUE(length == 0 ||
                        std::memcmp(separate.data(), fused.data(), length * sizeof(float)) == 0)
                << what;
            expect_same_counts(fused_counts, separate_counts, what);
          }
        }
      }
    }
  });
}

TEST(Kernels, EncodeTalliesMatchCodeClasses) {
  ForEachTarget([&] {
    std::mt19937 rng(5);
    const std::vector<float> specials = {0.0f,   -0.0f, 1.0f,     -3.0f,     1e-30f,
                                         500.0f, -1e6f, INFINITY, -INFINITY, NAN};
    for (ElementType type : kFp8Types) {
      for (float scale : {1.0f, 0.37f}) {
        std::vector<float> values;
        std::vector<uint8_t> codes;
        for (uint32_t code = 0; code < 256; ++code) {
          for (float v : specials) {
            values.push_back(v);
            codes.push_back(uint8_t(code));
          }
          // Just past and just inside the saturation limit.
          const float limit = float(element_traits(type).max_finite) * scale;
          for (float v :
               {limit, std::nextafter(limit, INFINITY), -std::nextafter(limit, INFINITY)}) {
            values.push_back(v);
            codes.push_back(uint8_t(code));
          }
        }
        std::vector<size_t> order(values.size());
        std::iota(order.begin(), order.end(), size_t{0});
        std::shuffle(order.begin(), order.end(), rng);
        std::vector<float> shuffled_values;
        std::vector<uint8_t> shuffled_codes;
        for (size_t i : order) {
          shuffled_values.push_back(values[i]);
          shuffled_codes.push_back(codes[i]);
        }
        for (size_t begin : {size_t{0}, size_t{3}}) {
          const std::span<const float> v = std::span<const float>(shuffled_values).subspan(begin);
          const std::span<const uint8_t> c =
              std::span<const uint8_t>(shuffled_codes).subspan(begin);
          EncodeCounts counts;
          tally_fp8(type, scale, v, c, counts);
          const std::vector<uint32_t> wide(c.begin(), c.end());
          const std::vector<float> limits(v.size(), float(element_traits(type).max_finite) * scale);
          expect_same_counts(counts, tally_reference(type, v, wide, limits),
                             std::string(element_traits(type).name));
        }
      }
    }
    // NVFP4: blocks of mixed inputs, arbitrary nibbles and every E4M3 block-scale byte.
    const size_t blocks = 256;
    std::vector<float> values(blocks * 16);
    std::vector<uint8_t> packed(blocks * 8), scales(blocks);
    std::uniform_int_distribution<int> pick(0, int(specials.size()) - 1);
    std::normal_distribution<float> normal;
    for (size_t i = 0; i < values.size(); ++i) {
      values[i] = i % 3 == 0 ? specials[size_t(pick(rng))] : normal(rng) * 100.0f;
    }
    for (size_t i = 0; i < packed.size(); ++i) packed[i] = uint8_t(rng());
    for (size_t b = 0; b < blocks; ++b) scales[b] = uint8_t(b);
    const float tensor_scale = 0.75f;
    std::vector<uint32_t> nibbles(values.size());
    std::vector<float> limits(values.size());
    for (size_t i = 0; i < values.size(); ++i) {
      nibbles[i] = i % 2 == 0 ? packed[i / 2] & 0xF : packed[i / 2] >> 4;
      limits[i] = 6.0f * (fp8_e4m3_to_float(scales[i / 16]) * tensor_scale);
    }
    EncodeCounts counts;
    tally_nvfp4(tensor_scale, values, packed, scales, counts);
    expect_same_counts(counts, tally_reference(ElementType::fp4_e2m1, values, nibbles, limits),
                       "nvfp4");
  });
}

// The amax kernels against plain loops: every length up to 3 vectors and a tail, with
// NaN, inf, -0 and subnormals anywhere (they count as 0 or as themselves, as finite).
TEST(Kernels, FiniteAbsMaxMatchesLoop) {
  ForEachTarget([&] {
    const std::vector<float> values = nasty_values(200, 8);
    for (size_t begin : {size_t{0}, size_t{1}}) {
      for (size_t n = 0; n + begin <= 60; ++n) {
        const std::span<const float> x = std::span<const float>(values).subspan(begin, n);
        float expected = 0.0f;
        std::vector<float> into(n, 0.5f), expected_into(n, 0.5f);
        for (size_t i = 0; i < n; ++i) {
          if (!std::isfinite(x[i])) continue;
          expected = std::max(expected, std::fabs(x[i]));
          expected_into[i] = std::max(expected_into[i], std::fabs(x[i]));
        }
        EXPECT_TRUE(same_bits(finite_abs_max(x), expected)) << n;
        finite_abs_max_into(x, into);
        for (size_t i = 0; i < n; ++i) EXPECT_TRUE(same_bits(into[i], expected_into[i])) << i;
      }
    }
  });
}

TEST(Kernels, HadamardIsOrthonormalAndSelfInverse) {
  ForEachTarget([&] {
    for (int width : {1, 2, 4, 8, 16, 64, 128, 256}) {
      std::mt19937 rng{static_cast<uint32_t>(width)};
      std::normal_distribution<float> normal;
      std::vector<float> x(size_t(width) * 3);
      for (float& v : x) v = normal(rng);
      std::vector<float> y = x;
      hadamard_rows(y, width);
      // Against the explicit matrix H[i][j] = (-1)^popcount(i & j) / sqrt(width).
      for (int row = 0; row < 3; ++row) {
        double norm_x = 0, norm_y = 0;
        for (int i = 0; i < width; ++i) {
          double expected = 0;
          for (int j = 0; j < width; ++j) {
            expected +=
                (__builtin_popcount(unsigned(i & j)) % 2 ? -1.0 : 1.0) * x[size_t(row * width + j)];
          }
          expected /= std::sqrt(double(width));
          EXPECT_NEAR(y[size_t(row * width + i)], expected, 1e-4);
          norm_x += double(x[size_t(row * width + i)]) * x[size_t(row * width + i)];
          norm_y += double(y[size_t(row * width + i)]) * y[size_t(row * width + i)];
        }
        EXPECT_NEAR(norm_x, norm_y, 1e-4 * norm_x);
      }
      hadamard_rows(y, width);
      for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], x[i], 1e-5);
    }
    std::vector<float> bad(12);
    EXPECT_THROW(hadamard_rows(bad, 12), std::invalid_argument);
  });
}

}  // namespace
}  // namespace kvaudit::numerics

namespace kvaudit::numerics {
namespace {

TEST(AttentionKernels, ScoresAndWeightedSumsMatchNaiveLoops) {
  ForEachTarget([&] {
    std::mt19937 rng(21);
    std::normal_distribution<float> normal;
    for (auto [nq, nk, dim] : {std::tuple{1, 1, 1}, std::tuple{4, 16, 8}, std::tuple{7, 45, 33},
                               std::tuple{64, 256, 128}, std::tuple{5, 33, 128}}) {
      const int64_t stride = dim + 3;  // rows not packed, as head slices of a KV row
      std::vector<float> q(size_t(nq * dim)), k(size_t(nk * stride)), v(size_t(nk * stride));
      for (float& x : q) x = normal(rng);
      for (float& x : k) x = normal(rng);
      for (float& x : v) x = normal(rng);
      std::vector<float> scores(size_t(nq * nk));
      score_block(q.data(), nq, dim, k.data(), nk, stride, dim, 0.5f, scores.data());
      std::vector<float> out(size_t(nq * dim), 1.0f);
      accumulate_weighted(scores.data(), nq, nk, v.data(), stride, dim, out.data(), dim);
      // Bit-identical whether a query or key falls in a register tile or in the leftovers
      // (callers choose block sizes freely; the model's attention relies on this).
      for (int64_t i : {int64_t{0}, int64_t(nq) - 1}) {
        std::vector<float> row(static_cast<size_t>(nk)), last_key(1);
        score_block(q.data() + i * dim, 1, dim, k.data(), nk, stride, dim, 0.5f, row.data());
        for (int64_t j = 0; j < nk; ++j) ASSERT_EQ(row[size_t(j)], scores[size_t(i * nk + j)]);
        score_block(q.data() + i * dim, 1, dim, k.data() + (nk - 1) * stride, 1, stride, dim, 0.5f,
                    last_key.data());
        ASSERT_EQ(last_key[0], scores[size_t(i * nk + nk - 1)]);
        std::vector<float> one(static_cast<size_t>(dim), 1.0f);
        accumulate_weighted(scores.data() + i * nk, 1, nk, v.data(), stride, dim, one.data(), dim);
        for (int64_t c = 0; c < dim; ++c) ASSERT_EQ(one[size_t(c)], out[size_t(i * dim + c)]);
      }
      // Against numerics' double-precision reference loops.
      std::vector<double> ref_scores(size_t(nq * nk)), ref_out(size_t(nq * dim), 1.0);
      score_block_reference(q.data(), nq, dim, k.data(), nk, stride, dim, 0.5f, ref_scores.data());
      accumulate_weighted_reference(scores.data(), nq, nk, v.data(), stride, dim, ref_out.data(),
                                    dim);
      for (size_t i = 0; i < scores.size(); ++i)
        ASSERT_NEAR(scores[i], ref_scores[i], 2e-4 * (1 + std::fabs(ref_scores[i])));
      for (size_t i = 0; i < out.size(); ++i)
        ASSERT_NEAR(out[i], ref_out[i], 1e-3 * (1 + std::fabs(ref_out[i])));
    }
    EXPECT_GT(fma_probe_flops(10), 0);
    EXPECT_TRUE(std::isfinite(fma_probe(1000)));
  });
}

// The transposed forms give the row forms' bits (the analysis and the model must agree on
// what a score is), for any column offset, tile leftovers and out_scale.
TEST(AttentionKernels, TransposedFormsMatchTheRowForms) {
  ForEachTarget([&] {
    std::mt19937 rng(5);
    std::normal_distribution<float> normal;
    for (auto [nq, nk, dim] : {std::tuple{1, 1, 2}, std::tuple{9, 13, 40}, std::tuple{64, 131, 128},
                               std::tuple{20, 4, 6}, std::tuple{3, 70, 130}}) {
      const int64_t pitch = column_pitch(nq);
      ASSERT_GE(pitch, nq);
      const int64_t wide = pitch * 2, offset = pitch;  // queries in the second half
      const int64_t stride = dim + 5;
      std::vector<float> q(size_t(nq * dim)), k(size_t(nk * stride)), v(size_t(nk * stride));
      for (float& x : q) x = normal(rng);
      for (float& x : k) x = normal(rng);
      for (float& x : v) x = normal(rng);
      std::vector<float> queries_t(size_t(dim * wide), 0.0f);
      for (int64_t i = 0; i < nq; ++i) {
        for (int64_t c = 0; c < dim; ++c)
          queries_t[size_t(c * wide + offset + i)] = q[size_t(i * dim + c)];
      }
      std::vector<float> rows(size_t(nq * nk)), columns(size_t(nk * pitch));
      score_block(q.data(), nq, dim, k.data(), nk, stride, dim, 0.25f, rows.data());
      score_block_transposed(queries_t.data() + offset, wide, pitch, dim, k.data(), nk, stride,
                             0.25f, columns.data());
      for (int64_t i = 0; i < nq; ++i) {
        for (int64_t j = 0; j < nk; ++j) {
          ASSERT_EQ(columns[size_t(j * pitch + i)], rows[size_t(i * nk + j)]) << i << " " << j;
        }
      }
      // Weighted sums: scale then accumulate_weighted, against the fused form.
      std::vector<float> scale(static_cast<size_t>(nq));
      for (float& x : scale) x = std::exp(-std::fabs(normal(rng)));
      std::vector<float> expect(size_t(nq * dim)), got(size_t(nq * dim));
      for (size_t i = 0; i < expect.size(); ++i) expect[i] = got[i] = normal(rng);
      for (int64_t i = 0; i < nq; ++i) {
        for (int64_t c = 0; c < dim; ++c) expect[size_t(i * dim + c)] *= scale[size_t(i)];
      }
      accumulate_weighted(rows.data(), nq, nk, v.data(), stride, dim, expect.data(), dim);
      accumulate_weighted_transposed(columns.data(), pitch, nq, nk, v.data(), stride, dim,
                                     got.data(), dim, scale.data());
      for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], expect[i]) << i;
      // Without a scale the output is only added to.
      std::vector<float> plain(size_t(nq * dim), 1.0f), plain_rows(size_t(nq * dim), 1.0f);
      accumulate_weighted(rows.data(), nq, nk, v.data(), stride, dim, plain_rows.data(), dim);
      accumulate_weighted_transposed(columns.data(), pitch, nq, nk, v.data(), stride, dim,
                                     plain.data(), dim);
      EXPECT_EQ(plain, plain_rows);
      // Packing rows keeps the values and the sums.
      std::vector<float> packed(size_t(nk * (dim + 8)), -1.0f);
      pack_rows(v.data(), nk, stride, dim, packed.data(), dim + 8);
      for (int64_t j = 0; j < nk; ++j) {
        for (int64_t c = 0; c < dim; ++c)
          ASSERT_EQ(packed[size_t(j * (dim + 8) + c)], v[size_t(j * stride + c)]);
        ASSERT_EQ(packed[size_t(j * (dim + 8) + dim)], -1.0f);  // padding untouched
      }
    }
    if (column_pitch(1) > 1) {  // a pitch off the vector length
      EXPECT_THROW(
          score_block_transposed(nullptr, 64, column_pitch(1) + 1, 8, nullptr, 0, 8, 1.0f, nullptr),
          std::invalid_argument);
    }
    EXPECT_THROW(
        score_block_transposed(nullptr, 8, column_pitch(9), 8, nullptr, 0, 8, 1.0f, nullptr),
        std::invalid_argument);  // queries narrower than the columns
    EXPECT_THROW(column_max_ignoring_nan(nullptr, 0, 0, nullptr), std::invalid_argument);
    EXPECT_THROW(pack_rows(nullptr, 1, 8, 8, nullptr, 4), std::invalid_argument);
  });
}

// Column statistics against plain loops in double, with NaN, infinities and -inf shifts.
TEST(AttentionKernels, ColumnStatisticsMatchPlainLoops) {
  ForEachTarget([&] {
    std::mt19937 rng(9);
    std::normal_distribution<float> normal;
    const float inf = std::numeric_limits<float>::infinity();
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (auto [rows, columns] : {std::pair{1, 1}, std::pair{37, 9}, std::pair{256, 64},
                                 std::pair{5, 33}, std::pair{0, 8}}) {
      const int64_t pitch = column_pitch(columns);
      std::vector<float> s(size_t(rows * pitch)), t(size_t(rows * pitch)), p(size_t(rows * pitch));
      for (size_t i = 0; i < s.size(); ++i) {
        s[i] = 4.0f * normal(rng);
        t[i] = s[i] + 0.01f * normal(rng);
        p[i] = std::fabs(normal(rng));
      }
      if (rows > 3 && columns > 2) {  // specials in column 1 and 2
        t[size_t(1 * pitch + 1)] = nan;
        t[size_t(2 * pitch + 1)] = inf;
        s[size_t(3 * pitch + 2)] = -inf;
        t[size_t(0 * pitch + 2)] = -inf;
      }
      std::vector<float> shift(static_cast<size_t>(pitch));
      for (int64_t q = 0; q < pitch; ++q) shift[size_t(q)] = q == 0 ? -inf : float(q % 5);
      std::vector<float> column_max(static_cast<size_t>(pitch)), sums(static_cast<size_t>(pitch));
      std::vector<float> e(s.size()), kl(static_cast<size_t>(pitch)),
          err(static_cast<size_t>(pitch));
      std::vector<float> ref(static_cast<size_t>(pitch)), other_max(static_cast<size_t>(pitch));
      column_max_ignoring_nan(t.data(), rows, pitch, column_max.data());
      column_exp_and_sum(s.data(), rows, pitch, shift.data(), e.data(), sums.data());
      column_divergence(s.data(), t.data(), p.data(), rows, pitch, kl.data(), err.data(),
                        ref.data(), other_max.data());
      for (int64_t q = 0; q < columns; ++q) {
        double m = -inf, sum = 0, kl_sum = 0, err_sum = 0, ref_sum = 0;
        for (int64_t j = 0; j < rows; ++j) {
          const size_t at = size_t(j * pitch + q);
          if (!std::isnan(t[at])) m = std::max(m, double(t[at]));
          const double x = double(s[at]) - double(shift[size_t(q)]);
          // (float: exp(100), for a -inf shift, overflows to inf)
          const double expect_e =
              x < -104.0 || std::isnan(x) ? 0.0 : double(float(std::exp(std::min(x, 100.0))));
          if (std::isinf(expect_e)) {
            ASSERT_EQ(e[at], expect_e) << j << " " << q;
          } else {
            ASSERT_NEAR(e[at], expect_e, 2e-6 * expect_e) << j << " " << q;
          }
          sum += expect_e;
          const double diff = double(s[at]) - double(t[at]);
          kl_sum += double(p[at]) * diff;
          if (std::isfinite(diff)) {
            err_sum += diff * diff;
            ref_sum += double(s[at]) * s[at];
          }
        }
        EXPECT_EQ(column_max[size_t(q)], float(m)) << q;
        EXPECT_EQ(other_max[size_t(q)], float(m)) << q;
        // Compensated: within a few ulps of the exact sum whatever the row count.
        if (std::isinf(sum)) {
          EXPECT_EQ(sums[size_t(q)], sum) << q;
        } else {
          EXPECT_NEAR(sums[size_t(q)], sum, 4e-7 * sum) << q;
        }
        if (std::isnan(kl_sum)) {
          EXPECT_TRUE(std::isnan(kl[size_t(q)])) << q;
        } else if (std::isinf(kl_sum)) {
          EXPECT_EQ(kl[size_t(q)], float(kl_sum)) << q;
        } else {
          EXPECT_NEAR(kl[size_t(q)], kl_sum, 1e-4 * (1 + std::fabs(kl_sum))) << q;
        }
        EXPECT_NEAR(err[size_t(q)], err_sum, 1e-4 * err_sum + 1e-9) << q;
        EXPECT_NEAR(ref[size_t(q)], ref_sum, 1e-4 * ref_sum) << q;
      }
      // Selection: every score >= its column's threshold, row by row, NaN never.
      std::vector<float> threshold(static_cast<size_t>(pitch));
      for (int64_t q = 0; q < pitch; ++q) threshold[size_t(q)] = q % 3 == 0 ? -inf : 2.0f;
      std::vector<int32_t> found(size_t(std::max(1, rows * columns)));
      const int64_t count =
          column_select_at_least(t.data(), rows, pitch, columns, threshold.data(), found.data());
      std::vector<int32_t> expect;
      for (int64_t j = 0; j < rows; ++j) {
        for (int64_t q = 0; q < columns; ++q) {
          if (t[size_t(j * pitch + q)] >= threshold[size_t(q)])
            expect.push_back(int32_t(j * pitch + q));
        }
      }
      ASSERT_EQ(count, int64_t(expect.size()));
      EXPECT_TRUE(std::equal(expect.begin(), expect.end(), found.begin()));
    }
  });
}

}  // namespace
}  // namespace kvaudit::numerics
