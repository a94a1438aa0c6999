// Synthetic Q/K/V with the statistics that matter for KV quantisation. Every row is a pure
// function of (seed, tensor, token), so any token range can be produced on demand, in any
// order, from any thread: a 128K-token analysis never holds the whole tensor.
// Gaussian draws come from a fixed bank of normals indexed by a hash of the row; cheap,
// deterministic, and statistically adequate for error measurement.
#include <cmath>
#include <numbers>
#include <random>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "quant/quant.h"
#include "util/util.h"

namespace kvaudit::quant {
namespace {

constexpr size_t kBankSize = size_t(1) << 20;
constexpr double kRopeTheta = 1e6;  // Qwen3's rope_theta

enum class Tensor : uint64_t { key = 1, value = 2, query = 3 };
enum class Profile { outlier_keys, gaussian, small_values };

class SyntheticSource final : public QkvSource {
 public:
  SyntheticSource(Profile profile, std::string name, const AttentionShape& shape, int64_t tokens,
                  uint64_t seed)
      : profile_(profile), name_(std::move(name)), shape_(shape), tokens_(tokens), seed_(seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal;
    bank_.resize(kBankSize);
    for (float& z : bank_) z = normal(rng);
    const int d = shape.head_dim, kv = shape.kv_heads;
    for (int i = 0; i < d / 2; ++i) {
      inverse_frequency_.push_back(std::pow(kRopeTheta, -2.0 * i / d));
      step_cosines_.push_back(std::cos(inverse_frequency_.back()));
      step_sines_.push_back(std::sin(inverse_frequency_.back()));
    }
    key_mean_.assign(size_t(kv) * size_t(d), 0.0f);
    key_std_.assign(size_t(kv) * size_t(d), 1.0f);
    sink_direction_.assign(size_t(kv) * size_t(d), 0.0f);
    if (profile == Profile::outlier_keys) {
      for (int h = 0; h < kv; ++h) {
        const size_t head = size_t(h) * size_t(d);  // the head's first channel
        for (int c = 0; c < d; ++c) key_std_[head + size_t(c)] = 4.0f;
        // Outlier channels on low-frequency RoPE pairs (they keep their magnitude over
        // long distances, as in real models). Amplitude grows with the head index so some
        // heads cross E4M3's 448 and some do not; 10-100x the median |k| (~2.7).
        const float amplitude = 180.0f + 30.0f * float(h) * 7.0f / float(std::max(1, kv - 1));
        const int half = d / 2;
        const int channels[4] = {half - 1, half - 2, half - 4, half - 7};
        const float factors[4] = {1.0f, 0.45f, 0.2f, 0.1f};
        for (int i = 0; i < 4; ++i) {
          if (channels[i] < 0) continue;
          key_mean_[head + size_t(channels[i])] = amplitude * factors[i];
          key_std_[head + size_t(channels[i])] = 0.2f * amplitude * factors[i];
        }
        // The attention sink's key and the queries' mean share a direction on the lowest-
        // frequency pairs, so the sink wins a large share of attention at any distance.
        std::normal_distribution<float> dir;
        double norm = 0;
        for (int i = half - 8; i < half; ++i) {
          for (int c : {i, i + half}) {
            if (c < 0 || c >= d) continue;
            sink_direction_[head + size_t(c)] = dir(rng);
            norm += double(sink_direction_[head + size_t(c)]) * sink_direction_[head + size_t(c)];
          }
        }
        for (int c = 0; c < d; ++c) sink_direction_[head + size_t(c)] /= float(std::sqrt(norm));
      }
    }
  }

  AttentionShape shape() const override { return shape_; }
  int64_t tokens() const override { return tokens_; }
  std::string description() const override {
    return fmt::format("synthetic '{}' (seed {}, {} q heads, {} kv heads, head_dim {})", name_,
                       seed_, shape_.q_heads, shape_.kv_heads, shape_.head_dim);
  }

  void keys(int64_t first, int64_t count, std::span<float> out) const override {
    generate(&SyntheticSource::key_heads, first, count, 0, shape_.kv_heads, out);
  }
  void head_keys(int64_t first, int64_t count, int head, std::span<float> out) const override {
    generate(&SyntheticSource::key_heads, first, count, head, head + 1, out);
  }
  void values(int64_t first, int64_t count, std::span<float> out) const override {
    generate(&SyntheticSource::value_heads, first, count, 0, shape_.kv_heads, out);
  }
  void head_values(int64_t first, int64_t count, int head, std::span<float> out) const override {
    generate(&SyntheticSource::value_heads, first, count, head, head + 1, out);
  }

  void queries(int64_t context_tokens, int count, std::span<float> out) const override {
    const int d = shape_.head_dim, n = shape_.q_heads * d;
    const int group = shape_.q_heads / shape_.kv_heads;
    for (int i = 0; i < count; ++i) {
      const int64_t position = context_tokens + i;
      const float* z = draw(Tensor::query, position, n);
      float* row = out.data() + int64_t(i) * n;
      for (int h = 0; h < shape_.q_heads; ++h) {
        const int kv_head = h / std::max(1, group);
        const size_t kv_row = size_t(kv_head) * size_t(d);  // its kv head's first channel
        for (int c = 0; c < d; ++c) {
          float q = z[h * d + c];
          if (profile_ == Profile::outlier_keys) {
            q = 0.5f * q + 1.0f * sink_direction_[kv_row + size_t(c)];
            // On the outlier channels queries are small and consistent (as in real models,
            // where those channels act as a per-head bias): 0.03 +- 0.01.
            if (key_mean_[kv_row + size_t(c)] != 0.0f) q = 0.03f + 0.02f * z[h * d + c];
          }
          row[h * d + c] = q;
        }
      }
      if (profile_ == Profile::outlier_keys) rope(row, shape_.q_heads, position);
    }
  }

 private:
  // The bank is larger than L2 and each row a random window of it: fetching the next
  // row's window while this row is computed hides most of the misses.
  static void prefetch_row(const float* z, int n) {
    for (int i = 0; i < n; i += 16) __builtin_prefetch(z + i);
    __builtin_prefetch(z + n - 1);  // windows start anywhere: the last line is a partial one
  }

  static constexpr int kHeadAhead = 4;

  // Tokens [first, first + count) of heads [head_begin, head_end) into out, row after row,
  // by key_heads or value_heads. Whole rows fetch the next row's window of the bank ahead;
  // one head's part, an eighth as long, fetches a few rows ahead (kHeadAhead) to cover the
  // same latency.
  using HeadsOfRow = void (SyntheticSource::*)(int64_t token, int head_begin, int head_end,
                                               float* out, int ahead) const;
  void generate(HeadsOfRow heads_of_row, int64_t first, int64_t count, int head_begin, int head_end,
                std::span<float> out) const {
    const int width = (head_end - head_begin) * shape_.head_dim;
    const int ahead = head_end - head_begin == shape_.kv_heads ? 1 : kHeadAhead;
    for (int64_t t = 0; t < count; ++t) {
      (this->*heads_of_row)(first + t, head_begin, head_end, out.data() + t * width,
                            t + ahead < count ? ahead : 0);
    }
  }

  // Heads [head_begin, head_end) of a token's key row into out; a row's elements do not
  // depend on which heads are asked for. ahead > 0: the row `ahead` tokens on is coming.
  void key_heads(int64_t token, int head_begin, int head_end, float* out, int ahead) const {
    const int d = shape_.head_dim, n = shape_.kv_heads * d;
    const int begin = head_begin * d, width = (head_end - head_begin) * d;
    const float* z = draw(Tensor::key, token, n) + begin;
    if (ahead > 0) prefetch_row(draw(Tensor::key, token + ahead, n) + begin, width);
    const float* mean = key_mean_.data() + begin;
    const float* std = key_std_.data() + begin;
    for (int i = 0; i < width; ++i) out[i] = mean[i] + std[i] * z[i];
    if (profile_ == Profile::outlier_keys) {
      if (token == 0) {  // the sink: a strong component along the queries' direction
        const float* sink = sink_direction_.data() + begin;
        for (int i = 0; i < width; ++i) out[i] += 70.0f * sink[i];
      }
      rope(out, head_end - head_begin, token);
    }
  }

  void value_heads(int64_t token, int head_begin, int head_end, float* out, int ahead) const {
    const int d = shape_.head_dim, n = shape_.kv_heads * d;
    const int begin = head_begin * d, width = (head_end - head_begin) * d;
    float sigma = 1.0f;
    if (profile_ == Profile::outlier_keys) sigma = 0.02f;
    if (profile_ == Profile::small_values) sigma = 0.002f;
    const float* z = draw(Tensor::value, token, n) + begin;
    if (ahead > 0) prefetch_row(draw(Tensor::value, token + ahead, n) + begin, width);
    // Sinks carry little value (their job is to absorb attention).
    const float s = profile_ == Profile::outlier_keys && token == 0 ? sigma * 0.1f : sigma;
    for (int i = 0; i < width; ++i) out[i] = s * z[i];
  }

  // n consecutive standard normals for one row (a window of the bank chosen by a hash).
  const float* draw(Tensor tensor, int64_t token, int n) const {
    const uint64_t h =
        splitmix64(seed_ * 0x100000001B3ull ^ splitmix64(uint64_t(tensor) << 56 ^ uint64_t(token)));
    return bank_.data() + h % (kBankSize - size_t(n));
  }

  // Rotary embedding of every head of a row at `position` (NeoX layout: pairs (i, i+d/2)).
  // cos and sin of position * frequency come from exact values at the last multiple of 64
  // stepped forward with the angle-addition formula in double precision (under 64 steps:
  // errors near 1e-14, far below a float's half ulp); a sincos per pair per row was most
  // of the generation time. The cursor is per thread; values depend on the position only.
  void rope(float* row, int heads, int64_t position) const {
    const int d = shape_.head_dim, half = d / 2;
    struct Cursor {
      int64_t position = -1;
      std::vector<double> cosines, sines;
    };
    thread_local Cursor cursor;
    constexpr int64_t kAnchorEvery = 64;
    const int64_t anchor = position / kAnchorEvery * kAnchorEvery;
    // (The frequencies depend on head_dim only, so one cursor serves every source.)
    if (cursor.position > position || cursor.position < anchor ||
        int(cursor.cosines.size()) != half) {
      cursor.position = anchor;
      cursor.cosines.resize(size_t(half));
      cursor.sines.resize(size_t(half));
      for (int i = 0; i < half; ++i) {
        const double angle = double(anchor) * inverse_frequency_[size_t(i)];
        cursor.cosines[size_t(i)] = std::cos(angle);
        cursor.sines[size_t(i)] = std::sin(angle);
      }
    }
    for (; cursor.position < position; ++cursor.position) {
      for (int i = 0; i < half; ++i) {
        const double c = cursor.cosines[size_t(i)], s = cursor.sines[size_t(i)];
        cursor.cosines[size_t(i)] = c * step_cosines_[size_t(i)] - s * step_sines_[size_t(i)];
        cursor.sines[size_t(i)] = s * step_cosines_[size_t(i)] + c * step_sines_[size_t(i)];
      }
    }
    thread_local std::vector<float> cosines, sines;
    cosines.resize(size_t(half));
    sines.resize(size_t(half));
    for (int i = 0; i < half; ++i) {
      cosines[size_t(i)] = float(cursor.cosines[size_t(i)]);
      sines[size_t(i)] = float(cursor.sines[size_t(i)]);
    }
    for (int h = 0; h < heads; ++h) {
      float* x = row + int64_t(h) * d;
      for (int i = 0; i < half; ++i) {
        const float a = x[i], b = x[i + half];
        x[i] = a * cosines[size_t(i)] - b * sines[size_t(i)];
        x[i + half] = a * sines[size_t(i)] + b * cosines[size_t(i)];
      }
    }
  }

  Profile profile_;
  std::string name_;
  AttentionShape shape_;
  int64_t tokens_;
  uint64_t seed_;
  std::vector<float> bank_;
  std::vector<float> key_mean_, key_std_, sink_direction_;  // [kv_heads * head_dim]
  std::vector<double> inverse_frequency_;                   // [head_dim / 2]
  std::vector<double> step_cosines_, step_sines_;           // of one position's angle
};

}  // namespace

std::vector<std::string> synthetic_profiles() {
  return {"outlier-keys", "gaussian", "small-values"};
}

std::unique_ptr<QkvSource> make_synthetic(std::string_view profile, const AttentionShape& shape,
                                          int64_t tokens, uint64_t seed) {
  if (shape.kv_heads < 1 || shape.head_dim < 2 || shape.head_dim % 2 != 0 ||
      shape.q_heads < shape.kv_heads || shape.q_heads % shape.kv_heads != 0) {
    throw InputError("--synthetic",
                     "shape needs kv_heads >= 1, an even head_dim, and q_heads a "
                     "multiple of kv_heads");
  }
  if (tokens < 1) throw InputError("--synthetic", "needs at least one token");
  Profile p;
  if (profile == "outlier-keys") {
    p = Profile::outlier_keys;
  } else if (profile == "gaussian") {
    p = Profile::gaussian;
  } else if (profile == "small-values") {
    p = Profile::small_values;
  } else {
    throw InputError("--synthetic", fmt::format("unknown profile '{}' ({})", profile,
                                                fmt::join(synthetic_profiles(), ", ")));
  }
  return std::make_unique<SyntheticSource>(p, std::string(profile), shape, tokens, seed);
}

}  // namespace kvaudit::quant
