// KV format specs ("fp8_e4m3:tensor+nan", "int4:kivi", "nvfp4+hadamard"): parsing, storage
// cost, and static scales from calibrated amax. The codecs that use them are in codec.cpp.
#include <algorithm>
#include <cmath>
#include <string>

#include <fmt/format.h>

#include "numerics/numerics.h"
#include "util/util.h"

namespace kvaudit::numerics {
namespace {

constexpr int kKiviGroupTokens = 32;      // KIVI paper: G = 32
constexpr int kKiviGroupChannels = 32;    // value groups along channels
constexpr int kKiviResidualTokens = 128;  // KIVI paper: R = 128
constexpr int kNvfp4Block = 16;
constexpr int kMxfp4Block = 32;

[[noreturn]] void bad_spec(std::string_view spec, const std::string& problem) {
  throw InputError("--formats", fmt::format("'{}': {}", spec, problem));
}

bool is_int(ElementType type) {
  return type == ElementType::int8 || type == ElementType::int4;
}

bool is_static(ScaleStrategy strategy) {
  return strategy == ScaleStrategy::tensor || strategy == ScaleStrategy::head ||
         strategy == ScaleStrategy::channel;
}

}  // namespace

bool is_fp8(ElementType type) {
  return type == ElementType::fp8_e4m3 || type == ElementType::fp8_e4m3fnuz ||
         type == ElementType::fp8_e5m2;
}

std::string_view scale_strategy_name(ScaleStrategy strategy) {
  switch (strategy) {
    case ScaleStrategy::none:
      return "none";
    case ScaleStrategy::tensor:
      return "tensor";
    case ScaleStrategy::head:
      return "head";
    case ScaleStrategy::channel:
      return "channel";
    case ScaleStrategy::token:
      return "token";
    case ScaleStrategy::token_head:
      return "token_head";
    case ScaleStrategy::group:
      return "group";
    case ScaleStrategy::kivi:
      return "kivi";
    case ScaleStrategy::block:
      return "block";
  }
  return "?";
}

std::string_view kv_role_name(KvRole role) {
  return role == KvRole::key ? "K" : "V";
}

namespace {

// The element type (and for nvfp4/mxfp4 the block kind) a spec's base names.
void set_element(const std::string& base, const std::string& spec, KvFormat& format) {
  if (base == "bf16" || base == "bfloat16") {
    format.element = ElementType::bf16;
  } else if (base == "f16" || base == "fp16" || base == "float16") {
    format.element = ElementType::f16;
  } else if (base == "f32" || base == "fp32" || base == "float32") {
    format.element = ElementType::f32;
  } else if (base == "fp8_e4m3" || base == "fp8" || base == "e4m3") {
    format.element = ElementType::fp8_e4m3;
  } else if (base == "fp8_e4m3fnuz" || base == "e4m3fnuz") {
    format.element = ElementType::fp8_e4m3fnuz;
  } else if (base == "fp8_e5m2" || base == "e5m2") {
    format.element = ElementType::fp8_e5m2;
  } else if (base == "int8") {
    format.element = ElementType::int8;
  } else if (base == "int4") {
    format.element = ElementType::int4;
  } else if (base == "nvfp4") {
    format.kind = KvFormatKind::nvfp4;
    format.element = ElementType::fp4_e2m1;
  } else if (base == "mxfp4") {
    format.kind = KvFormatKind::mxfp4;
    format.element = ElementType::fp4_e2m1;
  } else {
    bad_spec(spec,
             "unknown element type (bf16, f16, f32, fp8_e4m3, fp8_e4m3fnuz, fp8_e5m2, int8, int4, "
             "nvfp4, mxfp4)");
  }
}

// The canonical spelling of a parsed format (what reports print as its spec).
std::string canonical_spec(const KvFormat& format, bool plain_float) {
  std::string canonical(element_traits(format.element).name);
  if (format.kind == KvFormatKind::nvfp4) canonical = "nvfp4";
  if (format.kind == KvFormatKind::mxfp4) canonical = "mxfp4";
  if (format.kind == KvFormatKind::plain && !plain_float) {
    canonical += ":";
    if (format.strategy == ScaleStrategy::group) {
      canonical += fmt::format("g{}", format.group_size);
    } else {
      canonical += scale_strategy_name(format.strategy);
    }
  }
  if (format.asymmetric && format.strategy != ScaleStrategy::kivi) canonical += "+asym";
  if (format.overflow == Overflow::nan_inf) canonical += "+nan";
  if (format.hadamard) canonical += "+hadamard";
  return canonical;
}

}  // namespace

KvFormat parse_kv_format(std::string_view spec_text) {
  std::string spec(spec_text);
  KvFormat format;
  std::vector<std::string> parts = split_list(spec, '+');
  if (parts.empty()) bad_spec(spec, "empty format");
  std::string base = parts[0];
  std::string strategy_text;
  if (size_t colon = base.find(':'); colon != std::string::npos) {
    strategy_text = base.substr(colon + 1);
    base = base.substr(0, colon);
  }
  for (char& c : base) c = char(std::tolower(static_cast<unsigned char>(c)));

  set_element(base, spec, format);

  // Scale strategy.
  const bool plain_float = format.element == ElementType::bf16 ||
                           format.element == ElementType::f16 || format.element == ElementType::f32;
  if (format.kind != KvFormatKind::plain) {
    if (!strategy_text.empty() && strategy_text != "block" && strategy_text != "tensor")
      bad_spec(spec, "nvfp4/mxfp4 have a fixed block layout; no scale strategy to choose");
    format.strategy = ScaleStrategy::block;
    format.group_size = format.kind == KvFormatKind::nvfp4 ? kNvfp4Block : kMxfp4Block;
  } else if (plain_float) {
    if (!strategy_text.empty() && strategy_text != "none")
      bad_spec(spec, "bf16/f16/f32 are stored unscaled");
    format.strategy = ScaleStrategy::none;
  } else if (strategy_text.empty()) {
    format.strategy = is_int(format.element) ? ScaleStrategy::token : ScaleStrategy::none;
  } else if (strategy_text == "none") {
    format.strategy = ScaleStrategy::none;
  } else if (strategy_text == "tensor") {
    format.strategy = ScaleStrategy::tensor;
  } else if (strategy_text == "head") {
    format.strategy = ScaleStrategy::head;
  } else if (strategy_text == "channel") {
    format.strategy = ScaleStrategy::channel;
  } else if (strategy_text == "token") {
    format.strategy = ScaleStrategy::token;
  } else if (strategy_text == "token_head") {
    format.strategy = ScaleStrategy::token_head;
  } else if (strategy_text == "kivi") {
    if (!is_int(format.element)) bad_spec(spec, "kivi applies to int8/int4");
    format.strategy = ScaleStrategy::kivi;
    format.asymmetric = true;
    format.group_size = kKiviGroupChannels;
    format.group_tokens = kKiviGroupTokens;
    format.residual_tokens = kKiviResidualTokens;
  } else if (strategy_text.size() > 1 && strategy_text[0] == 'g') {
    std::optional<int64_t> size = parse_token_count(strategy_text.substr(1));
    if (!size || *size < 1 || *size > 65536) bad_spec(spec, "group size must be 1..65536");
    format.strategy = ScaleStrategy::group;
    format.group_size = int(*size);
  } else {
    bad_spec(spec, fmt::format("unknown scale strategy '{}' (none, tensor, head, channel, token, "
                               "token_head, gN, kivi)",
                               strategy_text));
  }
  if (is_int(format.element) && format.strategy == ScaleStrategy::none)
    bad_spec(spec, "integer formats need a scale");

  for (size_t i = 1; i < parts.size(); ++i) {
    const std::string& modifier = parts[i];
    if (modifier == "hadamard") {
      format.hadamard = true;
    } else if (modifier == "nan" || modifier == "inf" || modifier == "torch") {
      if (!is_fp8(format.element) && format.element != ElementType::f16)
        bad_spec(spec, "only fp8 and f16 have a non-saturating overflow mode");
      format.overflow = Overflow::nan_inf;
    } else if (modifier == "sat" || modifier == "saturate") {
      format.overflow = Overflow::saturate;
    } else if (modifier == "asym" || modifier == "sym") {
      if (!is_int(format.element)) bad_spec(spec, "asym/sym apply to int8/int4");
      if (format.strategy != ScaleStrategy::token && format.strategy != ScaleStrategy::token_head &&
          format.strategy != ScaleStrategy::group && format.strategy != ScaleStrategy::kivi)
        bad_spec(spec, "asymmetric ints need a dynamic scale (token, token_head, gN, kivi)");
      format.asymmetric = modifier == "asym";
      if (format.strategy == ScaleStrategy::kivi && !format.asymmetric)
        bad_spec(spec, "kivi is asymmetric by definition");
    } else {
      bad_spec(spec,
               fmt::format("unknown modifier '+{}' (hadamard, sat, nan, asym, sym)", modifier));
    }
  }

  format.spec = canonical_spec(format, plain_float);
  return format;
}

std::vector<KvFormat> parse_kv_formats(std::string_view comma_separated) {
  std::vector<KvFormat> formats;
  for (const std::string& spec : split_list(comma_separated))
    formats.push_back(parse_kv_format(spec));
  if (formats.empty()) throw InputError("--formats", "no format given");
  return formats;
}

int64_t row_bytes(const KvFormat& format, const KvLayout& layout, KvRole role) {
  const int64_t n = layout.row_elements();
  const int bits = element_traits(format.element).bits;
  const int64_t code_bytes = (n * bits + 7) / 8;
  // Dynamic scales are stored as FP32 (and a FP32 minimum for asymmetric ints).
  const int64_t per_scale = format.asymmetric ? 8 : 4;
  switch (format.strategy) {
    case ScaleStrategy::none:
    case ScaleStrategy::tensor:
    case ScaleStrategy::head:
    case ScaleStrategy::channel:
      return code_bytes;
    case ScaleStrategy::token:
      return code_bytes + per_scale;
    case ScaleStrategy::token_head:
      return code_bytes + per_scale * layout.kv_heads;
    case ScaleStrategy::group:
      return code_bytes + per_scale * ((n + format.group_size - 1) / format.group_size);
    case ScaleStrategy::kivi:
      if (role == KvRole::key) return code_bytes;  // scales live per token group
      return code_bytes + per_scale * ((n + format.group_size - 1) / format.group_size);
    case ScaleStrategy::block:
      return code_bytes + (n + format.group_size - 1) / format.group_size;  // 1-byte scales
  }
  return code_bytes;
}

double stored_bits_per_element(const KvFormat& format, const KvLayout& layout, KvRole role) {
  const double n = layout.row_elements();
  double bits = 8.0 * double(row_bytes(format, layout, role)) / n;
  if (format.strategy == ScaleStrategy::kivi && role == KvRole::key) {
    // One FP32 scale and one FP32 minimum per channel per group of tokens.
    bits += 64.0 / format.group_tokens;
  }
  return bits;
}

StaticAmax calibrate_amax(const KvFormat& format, const KvLayout& layout,
                          std::span<const float> rows) {
  validate_kv_layout(format, layout);
  StaticAmax result;
  const int64_t n = layout.row_elements();
  size_t shape = 0;
  if (format.strategy == ScaleStrategy::tensor || format.kind == KvFormatKind::nvfp4) shape = 1;
  if (format.strategy == ScaleStrategy::head) shape = size_t(layout.kv_heads);
  if (format.strategy == ScaleStrategy::channel) shape = size_t(n);
  if (shape == 0 || n == 0) return result;
  result.amax.assign(shape, 0.0f);
  std::vector<float> row(static_cast<size_t>(n));
  const int64_t tokens = int64_t(rows.size()) / n;
  for (int64_t t = 0; t < tokens; ++t) {
    const float* source = rows.data() + t * n;
    if (format.hadamard) {
      std::copy_n(source, n, row.begin());
      hadamard_rows(row, layout.head_dim);
      source = row.data();
    }
    // NaN and inf in the sample must not poison the scale: they count as 0.
    if (shape == 1) {
      result.amax[0] = std::max(result.amax[0], finite_abs_max({source, size_t(n)}));
    } else if (shape == size_t(n)) {
      finite_abs_max_into({source, size_t(n)}, result.amax);
    } else {
      for (int h = 0; h < layout.kv_heads; ++h) {
        result.amax[size_t(h)] = std::max(
            result.amax[size_t(h)],
            finite_abs_max({source + int64_t(h) * layout.head_dim, size_t(layout.head_dim)}));
      }
    }
  }
  return result;
}

std::vector<float> static_scales(const KvFormat& format, const KvLayout& layout,
                                 const StaticAmax& calibration) {
  size_t shape = 1;
  if (format.strategy == ScaleStrategy::head) shape = size_t(layout.kv_heads);
  if (format.strategy == ScaleStrategy::channel) shape = size_t(layout.row_elements());
  std::vector<float> scales(shape, 1.0f);
  const bool uses_calibration = is_static(format.strategy) || format.kind == KvFormatKind::nvfp4;
  if (!uses_calibration) return scales;
  if (!calibration.scales.empty()) {
    if (calibration.scales.size() != shape) {
      throw InputError("scales", fmt::format("{} needs {} scales, got {}", format.spec, shape,
                                             calibration.scales.size()));
    }
    for (float scale : calibration.scales) {
      if (!std::isfinite(scale) || scale <= 0.0f) {
        throw InputError("scales", fmt::format("{}: scale {} is not a positive finite number",
                                               format.spec, scale));
      }
    }
    return calibration.scales;
  }
  if (calibration.amax.empty()) return scales;
  if (calibration.amax.size() != shape) {
    throw InputError("calibration", fmt::format("{} needs {} amax values, got {}", format.spec,
                                                shape, calibration.amax.size()));
  }
  // NVFP4's tensor scale maps the amax onto the largest block scale times the largest FP4.
  const double target =
      format.kind == KvFormatKind::nvfp4 ? 448.0 * 6.0 : element_traits(format.element).max_finite;
  for (size_t i = 0; i < shape; ++i) {
    const double amax = calibration.amax[i];
    // A zero or broken amax leaves the scale at 1.0 rather than dividing by zero later.
    if (std::isfinite(amax) && amax > 0.0) scales[i] = float(amax * format.margin / target);
  }
  return scales;
}

int64_t quantized_tokens(const KvFormat& format, int64_t tokens) {
  if (format.strategy != ScaleStrategy::kivi) return tokens;
  if (tokens < format.residual_tokens) return 0;
  return (tokens - format.residual_tokens) / format.group_tokens * format.group_tokens;
}

}  // namespace kvaudit::numerics
