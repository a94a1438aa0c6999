// The forward pass's ops (matmul, weight widening, softmax) against their scalar references,
// for every stored weight type, on sizes around the vector width (tails), token counts around
// the 4-token tile, and odd row counts.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "numerics/numerics.h"

namespace kvaudit::numerics {
namespace {

uint16_t to_bf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

struct Weights {
  std::vector<float> f32;
  std::vector<uint16_t> bits16;
  Matrix matrix;
};

Weights make_weights(WeightType type, int64_t rows, int64_t cols, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Weights w;
  w.f32.resize(rows * cols + 1);
  for (float& v : w.f32) v = normal(rng);
  w.matrix = {w.f32.data(), WeightType::f32, rows, cols};
  if (type == WeightType::bf16) {
    for (float v : w.f32) w.bits16.push_back(to_bf16(v));
    w.matrix = {w.bits16.data(), type, rows, cols};
  } else if (type == WeightType::f16) {
    // F16 codes of small integers and halves are exact: build them directly.
    for (size_t i = 0; i < w.f32.size(); ++i) {
      int q = static_cast<int>(std::lround(w.f32[i] * 8.0f));  // |q| small, value q/8
      float value = q / 8.0f;
      w.f32[i] = value;
      uint16_t code = 0;
      if (q != 0) {
        int magnitude = std::abs(q);
        int exponent = 0;
        while ((magnitude >> (exponent + 1)) != 0) ++exponent;
        // value = magnitude * 2^-3 = 1.m * 2^(exponent - 3)
        uint16_t mantissa = static_cast<uint16_t>(((magnitude << 10) >> exponent) & 0x3FF);
        code = static_cast<uint16_t>(((exponent - 3 + 15) << 10) | mantissa);
        if (q < 0) code |= 0x8000;
      }
      w.bits16.push_back(code);
    }
    w.matrix = {w.bits16.data(), type, rows, cols};
  }
  return w;
}

class MatmulVsReference : public ::testing::TestWithParam<WeightType> {};

TEST_P(MatmulVsReference, AllShapesAroundTheTiles) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  ThreadPool pool(2);
  // 1100 columns: multi-token matmuls split them into chunks and carry the accumulators.
  for (int64_t cols : {1, 7, 8, 9, 16, 17, 33, 64, 100, 1100}) {
    for (int64_t rows : {1, 3, 5, 16, 17, 37}) {
      for (int64_t tokens : {1, 2, 4, 5, 9}) {
        Weights w = make_weights(GetParam(), rows, cols, rng);
        // Misaligned activations: start one float into the buffer.
        std::vector<float> buffer(tokens * cols + 1);
        for (float& v : buffer) v = normal(rng);
        const float* x = buffer.data() + 1;
        std::vector<float> fast(tokens * rows), slow(tokens * rows);
        matmul(x, tokens, w.matrix, fast.data(), pool);
        matmul_reference(x, tokens, w.matrix, slow.data());
        for (size_t i = 0; i < fast.size(); ++i)
          ASSERT_NEAR(fast[i], slow[i], 1e-5 * (1.0 + std::sqrt(static_cast<double>(cols))))
              << "cols " << cols << " rows " << rows << " tokens " << tokens;
        // Bit-identical to one token at a time (decode's path), whatever the tiling.
        std::vector<float> one(rows);
        for (int64_t t = 0; t < tokens; ++t) {
          matmul(x + t * cols, 1, w.matrix, one.data(), pool);
          for (int64_t r = 0; r < rows; ++r)
            ASSERT_EQ(one[r], fast[t * rows + r])
                << "cols " << cols << " rows " << rows << " token " << t << " row " << r;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, MatmulVsReference,
                         ::testing::Values(WeightType::f32, WeightType::bf16, WeightType::f16));

TEST(Kernels, WidenedWeightsAreExact) {
  std::mt19937 rng(3);
  for (WeightType type : {WeightType::bf16, WeightType::f16}) {
    Weights w = make_weights(type, 4, 9, rng);
    for (int64_t i = 0; i < 36; ++i) {
      if (type == WeightType::f16) {
        EXPECT_EQ(weight_at(w.matrix, i), w.f32[i]);
      } else {
        uint32_t bits = static_cast<uint32_t>(w.bits16[i]) << 16;
        float expected;
        std::memcpy(&expected, &bits, sizeof(expected));
        EXPECT_EQ(weight_at(w.matrix, i), expected);
      }
    }
  }
  // F16 specials: subnormal, max, infinity, negative zero.
  uint16_t codes[] = {0x0001, 0x7BFF, 0x7C00, 0x8000};
  Matrix m{codes, WeightType::f16, 1, 4};
  EXPECT_EQ(weight_at(m, 0), std::ldexp(1.0f, -24));
  EXPECT_EQ(weight_at(m, 1), 65504.0f);
  EXPECT_TRUE(std::isinf(weight_at(m, 2)));
  EXPECT_TRUE(std::signbit(weight_at(m, 3)));
}

TEST(Kernels, SoftmaxMatchesDoubleReference) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  for (int64_t n = 1; n <= 40; ++n) {
    std::vector<float> x(n + 1);
    for (float& v : x) v = normal(rng);
    x[n / 2] = -1e30f;  // far below the rest: weight 0, not NaN
    const float past_end = x[n];
    std::vector<double> want(n);
    double max_score = -INFINITY, sum = 0.0;
    for (int64_t i = 0; i < n; ++i) max_score = std::max(max_score, double(x[i]));
    for (int64_t i = 0; i < n; ++i) sum += want[i] = std::exp(double(x[i]) - max_score);
    softmax(x.data(), n);
    double total = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_NEAR(x[i], want[i] / sum, 1e-6) << "n " << n << " i " << i;
      total += x[i];
    }
    EXPECT_NEAR(total, 1.0, 1e-5);
    EXPECT_EQ(x[n], past_end);  // untouched past n
  }
  // As torch.softmax: a NaN or +inf anywhere makes the whole row NaN; -inf alone weighs 0.
  for (float poison : {NAN, INFINITY}) {
    for (int64_t at : {0, 5, 16}) {
      std::vector<float> row(17, 1.0f);
      row[at] = poison;
      softmax(row.data(), 17);
      for (float v : row) EXPECT_TRUE(std::isnan(v)) << poison << " at " << at;
    }
  }
  std::vector<float> row = {-INFINITY, 0.0f, 0.0f};
  softmax(row.data(), 3);
  EXPECT_EQ(row[0], 0.0f);
  EXPECT_FLOAT_EQ(row[1], 0.5f);
  EXPECT_FALSE(simd_target_name().empty());
}

TEST(Kernels, SiluTimesMatchesDoubleReferenceAtAnyPositionOrLength) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  const int64_t n = 75;  // several vectors and a tail on every target
  std::vector<float> gate(n), up(n);
  for (int64_t i = 0; i < n; ++i) {
    gate[i] = normal(rng);
    up[i] = normal(rng);
  }
  gate[3] = 0.0f;
  gate[4] = -90.0f;  // exp(90) overflows to inf: SiLU is -0, times up
  gate[5] = 90.0f;
  std::vector<float> whole = gate;
  silu_times(whole.data(), up.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    const double g = gate[i];
    const double expected = g / (1.0 + std::exp(-g)) * up[i];
    EXPECT_NEAR(whole[i], expected, 4e-7 * std::fabs(expected) + 1e-30) << i;
  }
  // The same value whether an element sits in a full vector or the padded tail.
  for (int64_t length : {1, 7, 16, 17, 33}) {
    std::vector<float> part(gate.begin(), gate.begin() + length);
    silu_times(part.data(), up.data(), length);
    for (int64_t i = 0; i < length; ++i) EXPECT_EQ(part[i], whole[i]) << length << " " << i;
  }
}

TEST(Kernels, DeltaRuleStepMatchesDoubleReference) {
  // Several tokens of the gated delta rule on a [dk, dv] state, dv with a vector tail on
  // every target, against the definition in double.
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  const int64_t dk = 8, dv = 21;
  std::vector<float> state(dk * dv, 0.0f), out(dv);
  std::vector<double> reference(dk * dv, 0.0);
  for (int step = 0; step < 5; ++step) {
    std::vector<float> q(dk), k(dk), v(dv);
    for (auto* x : {&q, &k})
      for (float& e : *x) e = normal(rng);
    for (float& e : v) e = normal(rng);
    const float decay = 0.9f - 0.1f * step, beta = 0.3f + 0.1f * step;
    delta_rule_step(state.data(), dk, dv, q.data(), k.data(), v.data(), decay, beta, out.data());
    for (double& e : reference) e *= decay;
    for (int64_t j = 0; j < dv; ++j) {
      double memory = 0.0;
      for (int64_t i = 0; i < dk; ++i) memory += reference[i * dv + j] * k[i];
      const double delta = beta * (v[j] - memory);
      double expected = 0.0;
      for (int64_t i = 0; i < dk; ++i) {
        reference[i * dv + j] += k[i] * delta;
        expected += reference[i * dv + j] * q[i];
      }
      EXPECT_NEAR(out[j], expected, 1e-5) << "step " << step << " column " << j;
    }
  }
  for (size_t i = 0; i < state.size(); ++i) EXPECT_NEAR(state[i], reference[i], 1e-5) << i;
}

}  // namespace
}  // namespace kvaudit::numerics
