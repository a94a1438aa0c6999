// KV format specs, storage costs and error statistics.
#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "numerics/numerics.h"
#include "util/util.h"

namespace kvaudit::numerics {
namespace {

TEST(Format, ParsesEverySpecTheEngineNeeds) {
  struct Case {
    const char* spec;
    const char* canonical;
    ElementType element;
    ScaleStrategy strategy;
  };
  const Case cases[] = {
      {"bf16", "bf16", ElementType::bf16, ScaleStrategy::none},
      {"fp8_e4m3", "fp8_e4m3:none", ElementType::fp8_e4m3, ScaleStrategy::none},
      {"fp8_e4m3:none", "fp8_e4m3:none", ElementType::fp8_e4m3, ScaleStrategy::none},
      {"fp8_e4m3:tensor", "fp8_e4m3:tensor", ElementType::fp8_e4m3, ScaleStrategy::tensor},
      {"fp8_e4m3:head", "fp8_e4m3:head", ElementType::fp8_e4m3, ScaleStrategy::head},
      {"fp8_e5m2", "fp8_e5m2:none", ElementType::fp8_e5m2, ScaleStrategy::none},
      {"fp8_e4m3fnuz:tensor", "fp8_e4m3fnuz:tensor", ElementType::fp8_e4m3fnuz,
       ScaleStrategy::tensor},
      {"nvfp4", "nvfp4", ElementType::fp4_e2m1, ScaleStrategy::block},
      {"mxfp4", "mxfp4", ElementType::fp4_e2m1, ScaleStrategy::block},
      {"int8:token", "int8:token", ElementType::int8, ScaleStrategy::token},
      {"int8", "int8:token", ElementType::int8, ScaleStrategy::token},
      {"int4:kivi", "int4:kivi", ElementType::int4, ScaleStrategy::kivi},
      {"int4:g32", "int4:g32", ElementType::int4, ScaleStrategy::group},
      {"fp8_e4m3:tensor+hadamard", "fp8_e4m3:tensor+hadamard", ElementType::fp8_e4m3,
       ScaleStrategy::tensor},
      {"fp8_e4m3:none+nan", "fp8_e4m3:none+nan", ElementType::fp8_e4m3, ScaleStrategy::none},
  };
  for (const Case& c : cases) {
    const KvFormat format = parse_kv_format(c.spec);
    EXPECT_EQ(format.spec, c.canonical) << c.spec;
    EXPECT_EQ(format.element, c.element) << c.spec;
    EXPECT_EQ(format.strategy, c.strategy) << c.spec;
    EXPECT_EQ(parse_kv_format(format.spec).spec, format.spec);  // canonical is a fixed point
  }
  EXPECT_TRUE(parse_kv_format("int4:kivi").asymmetric);
  EXPECT_EQ(parse_kv_format("int4:g32").group_size, 32);
  EXPECT_TRUE(parse_kv_format("int8:g64+asym").asymmetric);
  EXPECT_EQ(parse_kv_format("fp8_e4m3+nan").overflow, Overflow::nan_inf);
  EXPECT_EQ(parse_kv_format("fp8_e4m3").overflow, Overflow::saturate);
  EXPECT_EQ(parse_kv_formats("fp8_e4m3:none, nvfp4,int4:kivi").size(), 3u);
}

TEST(Format, RejectsBadSpecsWithAnInputError) {
  for (const char* bad :
       {"", "fp9", "fp8_e4m3:sideways", "bf16:tensor", "nvfp4:head", "int4:none", "fp8_e4m3+wobble",
        "int8:g0", "fp8_e4m3:kivi", "int8:tensor+asym", "nvfp4+nan", "int4:kivi+sym"}) {
    EXPECT_THROW(parse_kv_format(bad), InputError) << bad;
  }
  EXPECT_THROW(parse_kv_formats(" , "), InputError);
}

TEST(Format, StorageCostIncludesScales) {
  const KvLayout layout{8, 128};  // 1024 elements per row
  EXPECT_EQ(row_bytes(parse_kv_format("bf16"), layout), 2048);
  EXPECT_EQ(row_bytes(parse_kv_format("fp8_e4m3:tensor"), layout), 1024);
  EXPECT_EQ(row_bytes(parse_kv_format("fp8_e4m3:token_head"), layout), 1024 + 8 * 4);
  EXPECT_EQ(row_bytes(parse_kv_format("nvfp4"), layout), 512 + 64);
  EXPECT_EQ(row_bytes(parse_kv_format("mxfp4"), layout), 512 + 32);
  EXPECT_DOUBLE_EQ(stored_bits_per_element(parse_kv_format("nvfp4"), layout), 4.5);
  EXPECT_DOUBLE_EQ(stored_bits_per_element(parse_kv_format("mxfp4"), layout), 4.25);
  EXPECT_DOUBLE_EQ(stored_bits_per_element(parse_kv_format("int4:g32"), layout), 5.0);
  EXPECT_DOUBLE_EQ(stored_bits_per_element(parse_kv_format("int4:g32+asym"), layout), 6.0);
  // KIVI keys: per-channel FP32 scale and minimum per 32-token group = 2 bits/element.
  EXPECT_DOUBLE_EQ(stored_bits_per_element(parse_kv_format("int4:kivi"), layout, KvRole::key), 6.0);
  EXPECT_DOUBLE_EQ(stored_bits_per_element(parse_kv_format("int4:kivi"), layout, KvRole::value),
                   6.0);
}

TEST(Format, StaticScalesFromCalibratedAmax) {
  const KvLayout layout{2, 4};
  const KvFormat tensor = parse_kv_format("fp8_e4m3:tensor");
  EXPECT_EQ(static_scales(tensor, layout, {}), std::vector<float>{1.0f});  // uncalibrated
  const std::vector<float> rows = {1, -2, 3, 0, 0, 0, 0, -896, 5, 5, 5, 5, 1, 1, 1, 1};
  const StaticAmax amax = calibrate_amax(tensor, layout, rows);
  ASSERT_EQ(amax.amax, std::vector<float>{896.0f});
  EXPECT_EQ(static_scales(tensor, layout, amax), std::vector<float>{2.0f});
  const KvFormat head = parse_kv_format("fp8_e4m3:head");
  EXPECT_EQ(calibrate_amax(head, layout, rows).amax, (std::vector<float>{5.0f, 896.0f}));
  const KvFormat channel = parse_kv_format("fp8_e4m3:channel");
  EXPECT_EQ(calibrate_amax(channel, layout, rows).amax,
            (std::vector<float>{5, 5, 5, 5, 1, 1, 1, 896}));
  EXPECT_THROW(static_scales(head, layout, StaticAmax{{1.0f}, {}}), InputError);
  EXPECT_EQ(static_scales(parse_kv_format("nvfp4"), layout, StaticAmax{{2688.0f}, {}}),
            std::vector<float>{1.0f});
  // Zero or NaN amax leaves the scale at 1.0 instead of dividing by zero.
  EXPECT_EQ(static_scales(tensor, layout, StaticAmax{{0.0f}, {}}), std::vector<float>{1.0f});
  EXPECT_EQ(static_scales(tensor, layout, StaticAmax{{NAN}, {}}), std::vector<float>{1.0f});
}

TEST(Format, ExplicitScalesAreUsedBitForBit) {
  const KvLayout layout{2, 4};
  // 0.1f is not amax / 448 for any amax that round-trips; explicit scales must not be derived.
  const float odd_scale = std::nextafter(0.1f, 1.0f);
  const KvFormat head = parse_kv_format("fp8_e4m3:head");
  EXPECT_EQ(static_scales(head, layout, StaticAmax{{}, {odd_scale, 0.5f}}),
            (std::vector<float>{odd_scale, 0.5f}));
  // Explicit scales win over amax.
  EXPECT_EQ(static_scales(head, layout, StaticAmax{{448.0f, 448.0f}, {odd_scale, 0.5f}}),
            (std::vector<float>{odd_scale, 0.5f}));
  EXPECT_THROW(static_scales(head, layout, StaticAmax{{}, {0.5f}}), InputError);  // wrong shape
  EXPECT_THROW(static_scales(head, layout, StaticAmax{{}, {0.5f, NAN}}), InputError);
  EXPECT_THROW(static_scales(head, layout, StaticAmax{{}, {0.5f, 0.0f}}), InputError);
  EXPECT_THROW(static_scales(head, layout, StaticAmax{{}, {-1.0f, 0.5f}}), InputError);
  // Formats without static scales ignore them.
  EXPECT_EQ(static_scales(parse_kv_format("fp8_e4m3:none"), layout, StaticAmax{{}, {0.5f}}),
            std::vector<float>{1.0f});
}

TEST(Stats, MetricsMatchHandComputedValues) {
  ErrorStats stats;
  const std::vector<float> reference = {1, 2, 3, 4};
  const std::vector<float> decoded = {1, 2, 3, 6};
  stats.add(reference, decoded);
  EXPECT_EQ(stats.count, 4);
  EXPECT_DOUBLE_EQ(stats.rmse(), std::sqrt(4.0 / 4.0));            // sqrt(mean e^2), not /sqrt(n)
  EXPECT_DOUBLE_EQ(stats.relative_rmse(), std::sqrt(4.0 / 30.0));  // 1+4+9+16 = 30
  EXPECT_DOUBLE_EQ(stats.snr_db(), 10.0 * std::log10(30.0 / 4.0));
  EXPECT_DOUBLE_EQ(stats.max_abs_error, 2.0);
  ErrorStats with_nan;
  with_nan.add(std::vector<float>{1, NAN, 2}, std::vector<float>{1, 1, INFINITY});
  EXPECT_EQ(with_nan.count, 1);
  EXPECT_EQ(with_nan.nonfinite, 2);
  EXPECT_EQ(with_nan.relative_rmse(), 0.0);
  EXPECT_TRUE(std::isinf(with_nan.snr_db()));
}

TEST(Stats, MergeEqualsOneAccumulatorAndCompensationHelps) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  std::vector<float> reference(100000), decoded(100000);
  for (size_t i = 0; i < reference.size(); ++i) {
    reference[i] = normal(rng) * (i % 7 == 0 ? 1000.0f : 0.001f);
    decoded[i] = reference[i] + normal(rng) * 1e-3f;
  }
  ErrorStats whole;
  whole.add(reference, decoded);
  ErrorStats merged;
  for (size_t begin = 0; begin < reference.size(); begin += 7777) {
    const size_t count = std::min<size_t>(7777, reference.size() - begin);
    ErrorStats part;
    part.add(std::span<const float>(reference).subspan(begin, count),
             std::span<const float>(decoded).subspan(begin, count));
    merged.merge(part);
  }
  EXPECT_EQ(merged.count, whole.count);
  EXPECT_NEAR(merged.relative_rmse(), whole.relative_rmse(), 1e-12 * whole.relative_rmse());
  EXPECT_EQ(merged.max_abs_error, whole.max_abs_error);
  // Neumaier: 1e16 + many ones - 1e16 keeps the ones a naive double sum loses.
  CompensatedSum sum;
  sum.add(1e16);
  for (int i = 0; i < 1000; ++i) sum.add(1.0);
  sum.add(-1e16);
  EXPECT_EQ(sum.value(), 1000.0);
}

}  // namespace
}  // namespace kvaudit::numerics
