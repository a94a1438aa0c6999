// Scalar reference conversions for every element type, and the traits table. These are the
// definitions the SIMD kernels are tested against, so they favour obviously-correct
// arithmetic (exact power-of-two scaling and rint) over bit tricks.
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>

#include "numerics/numerics.h"

namespace kvaudit::numerics {
namespace {

// A small IEEE-like binary float: sign, exponent_bits, mantissa_bits, bias, and which top
// codes are special. Covers FP16, FP8 E4M3 / E4M3 FNUZ / E5M2 and FP4 E2M1.
struct MiniFloat {
  int exponent_bits;
  int mantissa_bits;
  int bias;
  enum class Top { ieee, e4m3fn, none } top;  // ieee: exp all-ones = inf/NaN; e4m3fn: S.1111.111
  bool fnuz;                                  // 0x80 is the only NaN, no -0, no inf
};

constexpr MiniFloat kFp16{5, 10, 15, MiniFloat::Top::ieee, false};
constexpr MiniFloat kE4M3{4, 3, 7, MiniFloat::Top::e4m3fn, false};
constexpr MiniFloat kE4M3Fnuz{4, 3, 8, MiniFloat::Top::none, true};
constexpr MiniFloat kE5M2{5, 2, 15, MiniFloat::Top::ieee, false};
constexpr MiniFloat kE2M1{2, 1, 1, MiniFloat::Top::none, false};

int sign_shift(const MiniFloat& f) {
  return f.exponent_bits + f.mantissa_bits;
}

double max_finite_of(const MiniFloat& f) {
  int max_exponent_field = (1 << f.exponent_bits) - 1;
  int max_mantissa = (1 << f.mantissa_bits) - 1;
  if (f.top == MiniFloat::Top::ieee) max_exponent_field -= 1;
  if (f.top == MiniFloat::Top::e4m3fn) max_mantissa -= 1;
  return std::ldexp(1.0 + max_mantissa / double(1 << f.mantissa_bits), max_exponent_field - f.bias);
}

float decode_mini(const MiniFloat& f, uint32_t code) {
  uint32_t sign = (code >> sign_shift(f)) & 1u;
  uint32_t exponent = (code >> f.mantissa_bits) & ((1u << f.exponent_bits) - 1);
  uint32_t mantissa = code & ((1u << f.mantissa_bits) - 1);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  if (f.fnuz && sign == 1 && exponent == 0 && mantissa == 0) return nan;
  if (f.top == MiniFloat::Top::e4m3fn && exponent == (1u << f.exponent_bits) - 1 &&
      mantissa == (1u << f.mantissa_bits) - 1)
    return nan;
  if (f.top == MiniFloat::Top::ieee && exponent == (1u << f.exponent_bits) - 1) {
    if (mantissa != 0) return nan;
    return sign ? -std::numeric_limits<float>::infinity() : std::numeric_limits<float>::infinity();
  }
  double magnitude;
  if (exponent == 0) {
    magnitude = std::ldexp(double(mantissa), 1 - f.bias - f.mantissa_bits);
  } else {
    magnitude = std::ldexp(double(mantissa + (1u << f.mantissa_bits)),
                           int(exponent) - f.bias - f.mantissa_bits);
  }
  return float(sign ? -magnitude : magnitude);
}

uint32_t nan_code(const MiniFloat& f) {
  if (f.fnuz) return 1u << sign_shift(f);
  if (f.top == MiniFloat::Top::e4m3fn) return (1u << sign_shift(f)) - 1;  // 0x7F
  if (f.top == MiniFloat::Top::ieee)  // exponent all ones, top mantissa bit set (quiet)
    return (((1u << f.exponent_bits) - 1) << f.mantissa_bits) | (1u << (f.mantissa_bits - 1));
  return 0;  // no NaN: FP4
}

// Encodes |value| (finite, already rounded onto the format's grid and <= max finite).
uint32_t pack_magnitude(const MiniFloat& f, double magnitude) {
  if (magnitude == 0.0) return 0;
  const int min_exponent = 1 - f.bias;
  int exponent = std::ilogb(magnitude);
  if (exponent < min_exponent) {
    return uint32_t(std::ldexp(magnitude, f.mantissa_bits - min_exponent));
  }
  uint32_t mantissa =
      uint32_t(std::ldexp(magnitude, f.mantissa_bits - exponent)) - (1u << f.mantissa_bits);
  return (uint32_t(exponent + f.bias) << f.mantissa_bits) | mantissa;
}

uint32_t encode_mini(const MiniFloat& f, float value, Overflow overflow) {
  const uint32_t sign = std::signbit(value) ? 1u << sign_shift(f) : 0u;
  const double max_finite = max_finite_of(f);
  const bool has_inf = f.top == MiniFloat::Top::ieee;
  const uint32_t inf_code = ((1u << f.exponent_bits) - 1) << f.mantissa_bits;
  // NaN input: PyTorch's casts give 0x7F | sign for E4M3 and E5M2, 0x80 for FNUZ.
  if (std::isnan(value)) {
    if (f.fnuz) return nan_code(f);
    if (f.top == MiniFloat::Top::none) return 0;
    return sign | ((1u << sign_shift(f)) - 1);
  }
  auto overflowed = [&]() -> uint32_t {
    if (overflow == Overflow::saturate || (f.top == MiniFloat::Top::none && !f.fnuz)) {
      return sign | pack_magnitude(f, max_finite);
    }
    if (has_inf) return sign | inf_code;
    return nan_code(f);  // e4m3fn keeps the sign of the input NaN code: 0x7F / 0xFF
  };
  if (std::isinf(value)) {
    if (overflow == Overflow::nan_inf && f.top == MiniFloat::Top::e4m3fn) return sign | 0x7Fu;
    return overflowed();
  }
  double magnitude = std::fabs(double(value));
  // The spacing of representable values around `magnitude` (subnormal spacing below the
  // smallest normal); rint on the scaled value rounds to nearest, ties to even.
  const int min_exponent = 1 - f.bias;
  int exponent = magnitude == 0.0 ? min_exponent : std::max(std::ilogb(magnitude), min_exponent);
  double quantum_exponent = exponent - f.mantissa_bits;
  double rounded = std::ldexp(std::nearbyint(std::ldexp(magnitude, -int(quantum_exponent))),
                              int(quantum_exponent));
  if (rounded > max_finite) {
    if (overflow == Overflow::nan_inf && f.top == MiniFloat::Top::e4m3fn) return sign | 0x7Fu;
    return overflowed();
  }
  uint32_t code = pack_magnitude(f, rounded);
  if (f.fnuz && code == 0) return 0;  // FNUZ has no -0: 0x80 is NaN
  return sign | code;
}

// Decode tables for the 8-bit formats, built once.
struct Fp8Tables {
  std::array<float, 256> e4m3, e4m3fnuz, e5m2;
  std::array<float, 16> e2m1;
  Fp8Tables() {
    for (uint32_t c = 0; c < 256; ++c) {
      e4m3[c] = decode_mini(kE4M3, c);
      e4m3fnuz[c] = decode_mini(kE4M3Fnuz, c);
      e5m2[c] = decode_mini(kE5M2, c);
    }
    for (uint32_t c = 0; c < 16; ++c) e2m1[c] = decode_mini(kE2M1, c);
  }
};
const Fp8Tables& tables() {
  static const Fp8Tables instance;
  return instance;
}

constexpr double kInf = std::numeric_limits<double>::infinity();

}  // namespace

float bf16_to_float(uint16_t bits) {
  return std::bit_cast<float>(uint32_t(bits) << 16);
}
float fp16_to_float(uint16_t bits) {
  return decode_mini(kFp16, bits);
}
float fp8_e4m3_to_float(uint8_t code) {
  return tables().e4m3[code];
}
float fp8_e4m3fnuz_to_float(uint8_t code) {
  return tables().e4m3fnuz[code];
}
float fp8_e5m2_to_float(uint8_t code) {
  return tables().e5m2[code];
}
float fp4_e2m1_to_float(uint8_t nibble) {
  return tables().e2m1[nibble & 0xF];
}
float e8m0_to_float(uint8_t code) {
  if (code == 0xFF) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.0f, int(code) - 127);  // 2^-127 is a float subnormal, still exact
}

uint16_t float_to_bf16(float value) {
  // PyTorch c10::BFloat16 round_to_nearest_even: NaN becomes 0x7FC0.
  if (std::isnan(value)) return 0x7FC0;
  uint32_t bits = std::bit_cast<uint32_t>(value);
  uint32_t rounding_bias = 0x7FFFu + ((bits >> 16) & 1u);
  return uint16_t((bits + rounding_bias) >> 16);
}
uint16_t float_to_fp16(float value, Overflow overflow) {
  // numpy and torch keep the sign of a NaN and make it quiet: 0x7E00 | sign.
  if (std::isnan(value)) return std::signbit(value) ? 0xFE00 : 0x7E00;
  return uint16_t(encode_mini(kFp16, value, overflow));
}
namespace {
// The integer round-to-nearest-even of PyTorch's c10 casts, on one float: the same
// arithmetic as the SIMD lanes in fp8-inl.h, and fast enough for per-block scales. The
// brute-force tests check it against the decoded code tables.
uint8_t fp8_from_bits(float value, int mantissa_bits, int bias, uint32_t max_code,
                      uint32_t overflow_code, uint32_t nan_code, bool fnuz) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint32_t sign = bits & 0x80000000u;
  const uint32_t magnitude = bits ^ sign;
  uint32_t code;
  if (magnitude > 0x7F800000u) {
    code = nan_code;
  } else if (magnitude < uint32_t(1 - bias + 127) << 23) {
    const float magic = std::ldexp(1.0f, 1 - bias - mantissa_bits + 23);
    code = std::bit_cast<uint32_t>(std::bit_cast<float>(magnitude) + magic) -
           std::bit_cast<uint32_t>(magic);
  } else {
    const uint32_t odd = (magnitude >> (23 - mantissa_bits)) & 1u;
    code = (magnitude + (uint32_t(bias - 127) << 23) + (1u << (22 - mantissa_bits)) - 1 + odd) >>
           (23 - mantissa_bits);
  }
  if (code > max_code && magnitude <= 0x7F800000u) code = overflow_code;
  if (fnuz && (code == 0 || code == 0x80)) return uint8_t(code);
  return uint8_t(code | (sign >> 24));
}
}  // namespace

uint8_t float_to_fp8_e4m3(float value, Overflow overflow) {
  return fp8_from_bits(value, 3, 7, 0x7E, overflow == Overflow::saturate ? 0x7E : 0x7F, 0x7F,
                       false);
}
uint8_t float_to_fp8_e4m3fnuz(float value, Overflow overflow) {
  return fp8_from_bits(value, 3, 8, 0x7F, overflow == Overflow::saturate ? 0x7F : 0x80, 0x80, true);
}
uint8_t float_to_fp8_e5m2(float value, Overflow overflow) {
  return fp8_from_bits(value, 2, 15, 0x7B, overflow == Overflow::saturate ? 0x7B : 0x7C, 0x7F,
                       false);
}
// The generic minifloat encoder stays as a second, independent implementation for tests.
uint32_t encode_minifloat_reference(ElementType type, float value, Overflow overflow) {
  switch (type) {
    case ElementType::fp8_e4m3:
      return encode_mini(kE4M3, value, overflow);
    case ElementType::fp8_e4m3fnuz:
      return encode_mini(kE4M3Fnuz, value, overflow);
    case ElementType::fp8_e5m2:
      return encode_mini(kE5M2, value, overflow);
    case ElementType::f16:
      return encode_mini(kFp16, value, overflow);
    case ElementType::fp4_e2m1:
      return encode_mini(kE2M1, value, Overflow::saturate);
    default:
      return encode_element(type, value, overflow);
  }
}
uint8_t float_to_fp4_e2m1(float value) {
  if (std::isnan(value)) return 0;
  return uint8_t(encode_mini(kE2M1, value, Overflow::saturate));
}

uint8_t e8m0_for_block_amax(float amax, int emax_element) {
  if (!(amax > 0.0f) || std::isnan(amax)) return 0;  // 2^-127: the block is all zeros
  if (std::isinf(amax)) return 0xFE;
  int shared_exponent = std::ilogb(amax) - emax_element;
  shared_exponent = std::clamp(shared_exponent, -127, 127);
  return uint8_t(shared_exponent + 127);
}

namespace {

// One row per ElementType, in enum order (checked below): the ggml traits-table shape.
// torch_overflow_from: the smallest finite magnitude PyTorch's .to() cast turns into
// NaN/inf (E4M3: c10 fp8e4m3fn_from_fp32_value maps |x| >= 480 to 0x7F); 0 where a cast
// saturates or the format is an integer.
constexpr ElementTraits kElementTraits[] = {
    {.type = ElementType::f32,
     .name = "f32",
     .bits = 32,
     .is_float = true,
     .max_finite = 3.4028234663852886e38,
     .min_normal = 1.1754943508222875e-38,
     .min_subnormal = 1.401298464324817e-45,
     .has_inf = true,
     .has_nan = true,
     .nan_encodes_as_zero = false,
     .torch_overflow_from = 0.0},
    {.type = ElementType::bf16,
     .name = "bf16",
     .bits = 16,
     .is_float = true,
     .max_finite = 3.3895313892515355e38,
     .min_normal = 1.1754943508222875e-38,
     .min_subnormal = 9.183549615799121e-41,
     .has_inf = true,
     .has_nan = true,
     .nan_encodes_as_zero = false,
     .torch_overflow_from = 3.3961776292720116e38},
    {.type = ElementType::f16,
     .name = "f16",
     .bits = 16,
     .is_float = true,
     .max_finite = 65504.0,
     .min_normal = 0.00006103515625,
     .min_subnormal = 5.9604644775390625e-08,
     .has_inf = true,
     .has_nan = true,
     .nan_encodes_as_zero = false,
     .torch_overflow_from = 65520.0},
    {.type = ElementType::fp8_e4m3,
     .name = "fp8_e4m3",
     .bits = 8,
     .is_float = true,
     .max_finite = 448.0,
     .min_normal = 0.015625,
     .min_subnormal = 0.001953125,
     .has_inf = false,
     .has_nan = true,
     .nan_encodes_as_zero = false,
     .torch_overflow_from = 480.0},
    {.type = ElementType::fp8_e4m3fnuz,
     .name = "fp8_e4m3fnuz",
     .bits = 8,
     .is_float = true,
     .max_finite = 240.0,
     .min_normal = 0.0078125,
     .min_subnormal = 0.0009765625,
     .has_inf = false,
     .has_nan = true,
     .nan_encodes_as_zero = false,
     .torch_overflow_from = 248.0},
    {.type = ElementType::fp8_e5m2,
     .name = "fp8_e5m2",
     .bits = 8,
     .is_float = true,
     .max_finite = 57344.0,
     .min_normal = 0.00006103515625,
     .min_subnormal = 0.0000152587890625,
     .has_inf = true,
     .has_nan = true,
     .nan_encodes_as_zero = false,
     .torch_overflow_from = 61440.0},
    {.type = ElementType::fp4_e2m1,
     .name = "fp4_e2m1",
     .bits = 4,
     .is_float = true,
     .max_finite = 6.0,
     .min_normal = 1.0,
     .min_subnormal = 0.5,
     .has_inf = false,
     .has_nan = false,
     .nan_encodes_as_zero = true,
     .torch_overflow_from = 0.0},
    {.type = ElementType::int8,
     .name = "int8",
     .bits = 8,
     .is_float = false,
     .max_finite = 127.0,
     .min_normal = 1.0,
     .min_subnormal = 1.0,
     .has_inf = false,
     .has_nan = false,
     .nan_encodes_as_zero = true,
     .torch_overflow_from = 0.0},
    {.type = ElementType::int4,
     .name = "int4",
     .bits = 4,
     .is_float = false,
     .max_finite = 7.0,
     .min_normal = 1.0,
     .min_subnormal = 1.0,
     .has_inf = false,
     .has_nan = false,
     .nan_encodes_as_zero = true,
     .torch_overflow_from = 0.0},
};

constexpr bool traits_in_enum_order() {
  for (size_t i = 0; i < std::size(kElementTraits); ++i)
    if (static_cast<size_t>(kElementTraits[i].type) != i) return false;
  return true;
}
static_assert(traits_in_enum_order(), "kElementTraits rows must follow ElementType order");
static_assert(std::size(kElementTraits) == static_cast<size_t>(ElementType::int4) + 1,
              "one kElementTraits row per ElementType");

}  // namespace

const std::vector<ElementTraits>& all_element_traits() {
  static const std::vector<ElementTraits> table(std::begin(kElementTraits),
                                                std::end(kElementTraits));
  return table;
}

std::optional<ElementType> find_element_type(std::string_view name) {
  for (const ElementTraits& traits : kElementTraits)
    if (traits.name == name) return traits.type;
  return std::nullopt;
}

const ElementTraits& element_traits(ElementType type) {
  return all_element_traits()[static_cast<size_t>(type)];
}

uint32_t encode_element(ElementType type, float value, Overflow overflow) {
  switch (type) {
    case ElementType::f32:
      return std::bit_cast<uint32_t>(value);
    case ElementType::bf16:
      return float_to_bf16(value);
    case ElementType::f16:
      return float_to_fp16(value, overflow);
    case ElementType::fp8_e4m3:
      return float_to_fp8_e4m3(value, overflow);
    case ElementType::fp8_e4m3fnuz:
      return float_to_fp8_e4m3fnuz(value, overflow);
    case ElementType::fp8_e5m2:
      return float_to_fp8_e5m2(value, overflow);
    case ElementType::fp4_e2m1:
      return float_to_fp4_e2m1(value);
    case ElementType::int8:
    case ElementType::int4: {
      const float max = type == ElementType::int8 ? 127.0f : 7.0f;
      const uint32_t mask = type == ElementType::int8 ? 0xFFu : 0xFu;
      if (std::isnan(value)) return 0;
      float rounded = std::clamp(std::nearbyint(value), -max, max);
      return uint32_t(int32_t(rounded)) & mask;
    }
  }
  return 0;
}

float decode_element(ElementType type, uint32_t code) {
  switch (type) {
    case ElementType::f32:
      return std::bit_cast<float>(code);
    case ElementType::bf16:
      return bf16_to_float(uint16_t(code));
    case ElementType::f16:
      return fp16_to_float(uint16_t(code));
    case ElementType::fp8_e4m3:
      return fp8_e4m3_to_float(uint8_t(code));
    case ElementType::fp8_e4m3fnuz:
      return fp8_e4m3fnuz_to_float(uint8_t(code));
    case ElementType::fp8_e5m2:
      return fp8_e5m2_to_float(uint8_t(code));
    case ElementType::fp4_e2m1:
      return fp4_e2m1_to_float(uint8_t(code));
    case ElementType::int8:
      return float(int8_t(uint8_t(code)));
    case ElementType::int4:
      return float(int32_t(code << 28) >> 28);
  }
  return 0.0f;
}

CodeClass classify_code(ElementType type, uint32_t code) {
  const ElementTraits& traits = element_traits(type);
  double value = decode_element(type, code);
  if (std::isnan(value)) return CodeClass::nan;
  if (std::isinf(value)) return CodeClass::inf;
  double magnitude = std::fabs(value);
  if (magnitude == 0.0) return CodeClass::zero;
  if (magnitude >= traits.max_finite && magnitude != kInf) return CodeClass::max_finite;
  if (magnitude < traits.min_normal) return CodeClass::subnormal;
  return CodeClass::normal;
}

void score_block_reference(const float* queries, int64_t query_count, int64_t query_stride,
                           const float* keys, int64_t key_count, int64_t key_stride, int64_t dim,
                           float scale, double* scores) {
  for (int64_t q = 0; q < query_count; ++q)
    for (int64_t j = 0; j < key_count; ++j) {
      double s = 0;
      for (int64_t c = 0; c < dim; ++c)
        s += double(queries[q * query_stride + c]) * double(keys[j * key_stride + c]);
      scores[q * key_count + j] = double(scale) * s;
    }
}

void accumulate_weighted_reference(const float* weights, int64_t query_count, int64_t key_count,
                                   const float* values, int64_t value_stride, int64_t dim,
                                   double* out, int64_t out_stride) {
  for (int64_t q = 0; q < query_count; ++q)
    for (int64_t c = 0; c < dim; ++c) {
      double o = out[q * out_stride + c];
      for (int64_t j = 0; j < key_count; ++j)
        o += double(weights[q * key_count + j]) * double(values[j * value_stride + c]);
      out[q * out_stride + c] = o;
    }
}

}  // namespace kvaudit::numerics
