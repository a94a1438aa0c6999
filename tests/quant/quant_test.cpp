// quant: the must-show mechanisms on the outlier-keys profile, the streaming attention
// metrics against a brute-force double-precision reference, input readers, the report.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>
#include <utility>

#include <gtest/gtest.h>

#include "common/counts.h"
#include "quant/quant.h"
#include "util/util.h"

namespace kvaudit::quant {
namespace {

using numerics::KvRole;
using numerics::parse_kv_format;

const TensorMetrics& find(const QuantAnalysis& a, const std::string& format, KvRole role) {
  for (const TensorMetrics& m : a.tensors) {
    if (m.format == format && m.role == role) return m;
  }
  throw std::runtime_error("no metrics for " + format);
}

const AttentionPoint& find_point(const QuantAnalysis& a, const std::string& format,
                                 int64_t context) {
  for (const AttentionPoint& p : a.attention) {
    if (p.format == format && p.context_tokens == context) return p;
  }
  throw std::runtime_error("no point for " + format);
}

double fraction(int64_t part, int64_t whole) {
  return double(part) / double(whole);
}

// The motivating case: FP8 E4M3 at scale 1.0 flushes small V to zero and clips (CUDA) or
// NaNs (torch cast) the outlier K channels; a calibrated per-tensor scale removes both.
TEST(Quant, OutlierKeysShowTheUnitScaleMechanismsAndCalibrationRemovesThem) {
  // Small enough for an ASan build (4 KV heads, 1K tokens, 2 decode positions).
  const auto source = make_synthetic("outlier-keys", {16, 4, 128}, 1024);
  AnalysisOptions options;
  options.contexts = {512, 1024};
  options.query_positions = 2;
  ThreadPool pool(2);
  const QuantAnalysis a =
      analyze(*source,
              {parse_kv_format("fp8_e4m3:none"), parse_kv_format("fp8_e4m3:none+nan"),
               parse_kv_format("fp8_e4m3:tensor")},
              options, pool);
  const TensorMetrics& k_none = find(a, "fp8_e4m3:none", KvRole::key);
  const TensorMetrics& v_none = find(a, "fp8_e4m3:none", KvRole::value);
  const TensorMetrics& k_nan = find(a, "fp8_e4m3:none+nan", KvRole::key);
  const TensorMetrics& k_tensor = find(a, "fp8_e4m3:tensor", KvRole::key);
  const TensorMetrics& v_tensor = find(a, "fp8_e4m3:tensor", KvRole::value);
  // Scale 1.0: a measurable fraction of V (sigma 0.02) is below 2^-10 and flushes to zero.
  EXPECT_GT(fraction(v_none.counts.flushed_to_zero, v_none.counts.elements), 0.02);
  EXPECT_GT(fraction(v_none.counts.subnormal, v_none.counts.elements), 0.3);
  // Outlier K channels beyond 448: clamped by the saturating cast, NaN under torch's cast.
  EXPECT_GT(k_none.counts.saturated, 50);
  EXPECT_EQ(k_none.counts.became_nan, 0);
  EXPECT_GT(k_nan.counts.became_nan, 50);
  // ... and one NaN key poisons every query of its head.
  EXPECT_GT(find_point(a, "fp8_e4m3:none+nan", 1024).nonfinite_queries, 0);
  EXPECT_EQ(find_point(a, "fp8_e4m3:none", 1024).nonfinite_queries, 0);
  // Calibrated per-tensor scale: no saturation, no NaN; V flush drops by > 100x.
  EXPECT_EQ(k_tensor.counts.saturated, 0);
  EXPECT_EQ(k_tensor.counts.became_nan, 0);
  EXPECT_LT(v_tensor.counts.flushed_to_zero * 100, v_none.counts.flushed_to_zero);
  EXPECT_GT(v_tensor.error.snr_db(), v_none.error.snr_db() + 1.0);
  EXPECT_GT(k_tensor.error.snr_db(), k_none.error.snr_db() + 1.0);
  EXPECT_LT(find_point(a, "fp8_e4m3:tensor", 1024).kl_mean,
            find_point(a, "fp8_e4m3:none", 1024).kl_mean);
}

// Brute force in double: full softmax per query over the whole context.
struct Reference {
  double kl_mean = 0, output_rel_error = 0, topk = 0, score_rel_rmse = 0;
};
Reference brute_force(const QkvSource& source, const numerics::KvFormat& format, int64_t context,
                      int positions, int top_k) {
  const AttentionShape shape = source.shape();
  const int64_t n = int64_t(shape.kv_heads) * shape.head_dim, d = shape.head_dim;
  std::vector<float> k(static_cast<size_t>(context * n)), v(static_cast<size_t>(context * n));
  source.keys(0, context, k);
  source.values(0, context, v);
  numerics::KvFormat f = format;
  const auto kq = numerics::round_trip(f, shape.kv_layout(), KvRole::key,
                                       numerics::calibrate_amax(f, shape.kv_layout(), k), k);
  const auto vq = numerics::round_trip(f, shape.kv_layout(), KvRole::value,
                                       numerics::calibrate_amax(f, shape.kv_layout(), v), v);
  std::vector<float> q(size_t(positions * shape.q_heads * d));
  source.queries(context, positions, q);
  Reference r;
  double err = 0, ref = 0, out_err = 0, out_ref = 0, s_err = 0, s_ref = 0;
  int count = 0;
  const int group = shape.q_heads / shape.kv_heads;
  for (int p = 0; p < positions; ++p) {
    for (int h = 0; h < shape.q_heads; ++h) {
      const int kvh = h / group;
      const float* qv = q.data() + (int64_t(p) * shape.q_heads + h) * d;
      std::vector<double> s(static_cast<size_t>(context)), t(static_cast<size_t>(context));
      for (int64_t j = 0; j < context; ++j) {
        double a = 0, b = 0;
        for (int64_t c = 0; c < d; ++c) {
          a += double(qv[c]) * k[size_t(j * n + kvh * d + c)];
          b += double(qv[c]) * kq.decoded[size_t(j * n + kvh * d + c)];
        }
        s[size_t(j)] = a / std::sqrt(double(d));
        t[size_t(j)] = b / std::sqrt(double(d));
        s_err += (s[size_t(j)] - t[size_t(j)]) * (s[size_t(j)] - t[size_t(j)]);
        s_ref += s[size_t(j)] * s[size_t(j)];
      }
      const double ms = *std::max_element(s.begin(), s.end());
      const double mt = *std::max_element(t.begin(), t.end());
      double zs = 0, zt = 0;
      for (int64_t j = 0; j < context; ++j)
        zs += std::exp(s[size_t(j)] - ms), zt += std::exp(t[size_t(j)] - mt);
      double kl = 0;
      std::vector<double> o(static_cast<size_t>(d), 0.0), oq(static_cast<size_t>(d), 0.0);
      for (int64_t j = 0; j < context; ++j) {
        const double ps = std::exp(s[size_t(j)] - ms) / zs, pt = std::exp(t[size_t(j)] - mt) / zt;
        kl += ps * (std::log(ps) - std::log(pt));
        for (int64_t c = 0; c < d; ++c) {
          o[size_t(c)] += ps * v[size_t(j * n + kvh * d + c)];
          oq[size_t(c)] += pt * vq.decoded[size_t(j * n + kvh * d + c)];
        }
      }
      for (int64_t c = 0; c < d; ++c) {
        out_err += (oq[size_t(c)] - o[size_t(c)]) * (oq[size_t(c)] - o[size_t(c)]);
        out_ref += o[size_t(c)] * o[size_t(c)];
      }
      std::vector<int64_t> is(static_cast<size_t>(context)), it(static_cast<size_t>(context));
      std::iota(is.begin(), is.end(), 0);
      std::iota(it.begin(), it.end(), 0);
      std::partial_sort(is.begin(), is.begin() + top_k, is.end(),
                        [&](int64_t a, int64_t b) { return s[size_t(a)] > s[size_t(b)]; });
      std::partial_sort(it.begin(), it.begin() + top_k, it.end(),
                        [&](int64_t a, int64_t b) { return t[size_t(a)] > t[size_t(b)]; });
      std::set<int64_t> top_s(is.begin(), is.begin() + top_k);
      int common = 0;
      for (int i = 0; i < top_k; ++i) common += top_s.count(it[size_t(i)]) ? 1 : 0;
      r.topk += double(common) / top_k;
      r.kl_mean += kl;
      ++count;
      (void)err;
      (void)ref;
    }
  }
  r.kl_mean /= count;
  r.topk /= count;
  r.output_rel_error = std::sqrt(out_err / out_ref);
  r.score_rel_rmse = std::sqrt(s_err / s_ref);
  return r;
}

// Options that brute_force(..., 3, 8) reproduces.
AnalysisOptions brute_force_options(std::vector<int64_t> contexts, int64_t step_tokens) {
  AnalysisOptions options;
  options.contexts = std::move(contexts);
  options.query_positions = 3;
  options.top_k = 8;
  options.step_tokens = step_tokens;
  return options;
}

TEST(Quant, StreamingMetricsMatchBruteForce) {
  const auto source = make_synthetic("outlier-keys", {4, 2, 32}, 1500, 3);
  // Steps of 256: several and a partial one.
  const AnalysisOptions options = brute_force_options({200, 1500}, 256);
  ThreadPool pool(2);
  for (const char* spec : {"fp8_e4m3:tensor", "int4:g32", "nvfp4"}) {
    const numerics::KvFormat format = parse_kv_format(spec);
    const QuantAnalysis a = analyze(*source, {format}, options, pool);
    for (int64_t context : options.contexts) {
      // The brute force calibrates on its own context; the analysis on the largest one.
      // Use per-token formats for exact comparisons and give static ones the same data.
      const AttentionPoint& p = find_point(a, format.spec, context);
      const bool calibrated = format.strategy == numerics::ScaleStrategy::tensor ||
                              format.kind == numerics::KvFormatKind::nvfp4;
      if (calibrated && context != 1500) continue;
      const Reference r = brute_force(*source, format, context, 3, 8);
      EXPECT_NEAR(p.kl_mean, r.kl_mean, 1e-3 * r.kl_mean + 1e-7) << spec << " " << context;
      EXPECT_NEAR(p.output_rel_error, r.output_rel_error, 1e-3 * r.output_rel_error + 1e-7) << spec;
      EXPECT_NEAR(p.score_rel_rmse, r.score_rel_rmse, 1e-3 * r.score_rel_rmse + 1e-7) << spec;
      EXPECT_NEAR(p.topk_agreement, r.topk, 1e-9) << spec;
      EXPECT_EQ(p.queries, 3 * 4);
    }
  }
}

// KL near 1e-6 (a fine format on well-behaved data) is the difference of two log-partition
// functions of size ~10, so their sums must be right to ~1e-9: held to 1% of a double
// brute force (the float scores themselves leave ~0.5%).
TEST(Quant, SmallKlMatchesBruteForce) {
  const auto source = make_synthetic("gaussian", {6, 2, 64}, 700, 5);
  const AnalysisOptions options = brute_force_options({129, 700}, 64);
  ThreadPool pool(2);
  for (const char* spec : {"fp8_e5m2:token", "bf16"}) {
    const numerics::KvFormat format = parse_kv_format(spec);
    const QuantAnalysis a = analyze(*source, {format}, options, pool);
    for (int64_t context : options.contexts) {
      const AttentionPoint& p = find_point(a, format.spec, context);
      const Reference r = brute_force(*source, format, context, 3, 8);
      EXPECT_NEAR(p.kl_mean, r.kl_mean, 0.01 * r.kl_mean + 1e-10) << spec << " " << context;
    }
  }
}

TEST(Quant, LosslessFormatHasNoAttentionError) {
  const auto source = make_synthetic("gaussian", {8, 4, 64}, 512);
  AnalysisOptions options;
  options.contexts = {512};
  ThreadPool pool(1);
  const QuantAnalysis a = analyze(*source, {parse_kv_format("f32")}, options, pool);
  const AttentionPoint& p = a.attention.at(0);
  EXPECT_NEAR(p.kl_mean, 0.0, 1e-6);
  EXPECT_EQ(p.topk_agreement, 1.0);
  EXPECT_EQ(p.output_rel_error, 0.0);
  EXPECT_EQ(a.tensors.at(0).error.relative_rmse(), 0.0);
}

TEST(Quant, KiviAttentionUsesTheResidualWindowOfEachContext) {
  // At a context of 150 tokens KIVI (R=128, G=32) has quantised only 0 tokens; at 500, 352.
  const auto source = make_synthetic("gaussian", {4, 2, 32}, 500);
  AnalysisOptions options;
  options.contexts = {100, 500};
  ThreadPool pool(2);
  const QuantAnalysis a = analyze(*source, {parse_kv_format("int4:kivi")}, options, pool);
  const AttentionPoint& short_ctx = find_point(a, "int4:kivi", 100);
  const AttentionPoint& long_ctx = find_point(a, "int4:kivi", 500);
  EXPECT_LT(short_ctx.output_rel_error, 0.01);  // all BF16
  EXPECT_GT(long_ctx.output_rel_error, 0.03);   // mostly 4-bit
}

// One head's rows are the slices of whole rows: the synthetic generator's own head path,
// and QkvSource's default (cut from whole rows) through a source that has only whole rows.
void expect_head_rows_are_slices(const QkvSource& source, int64_t first, int64_t count) {
  const AttentionShape shape = source.shape();
  const int64_t dim = shape.head_dim, n = int64_t(shape.kv_heads) * dim;
  std::vector<float> keys(size_t(count * n)), values(keys.size()), head(size_t(count * dim));
  source.keys(first, count, keys);
  source.values(first, count, values);
  for (int h = 0; h < shape.kv_heads; ++h) {
    for (const auto& [rows, is_key] : {std::pair{&keys, true}, std::pair{&values, false}}) {
      if (is_key) {
        source.head_keys(first, count, h, head);
      } else {
        source.head_values(first, count, h, head);
      }
      for (int64_t t = 0; t < count; ++t) {
        for (int64_t c = 0; c < dim; ++c) {
          ASSERT_EQ(head[size_t(t * dim + c)], (*rows)[size_t(t * n + h * dim + c)])
              << source.description() << " head " << h << " token " << first + t;
        }
      }
    }
  }
}

class WholeRowsOnly final : public QkvSource {
 public:
  explicit WholeRowsOnly(const QkvSource& inner) : inner_(inner) {}
  AttentionShape shape() const override { return inner_.shape(); }
  int64_t tokens() const override { return inner_.tokens(); }
  void keys(int64_t first, int64_t count, std::span<float> out) const override {
    inner_.keys(first, count, out);
  }
  void values(int64_t first, int64_t count, std::span<float> out) const override {
    inner_.values(first, count, out);
  }
  void queries(int64_t context_tokens, int count, std::span<float> out) const override {
    inner_.queries(context_tokens, count, out);
  }
  std::string description() const override { return "whole rows of " + inner_.description(); }

 private:
  const QkvSource& inner_;
};

TEST(Quant, HeadRowsAreSlicesOfWholeRows) {
  for (const char* profile : {"outlier-keys", "gaussian", "small-values"}) {
    const auto source = make_synthetic(profile, {8, 4, 32}, 400, 9);
    expect_head_rows_are_slices(*source, 0, 70);    // the sink, a RoPE anchor crossed
    expect_head_rows_are_slices(*source, 333, 67);  // to the last token
    expect_head_rows_are_slices(WholeRowsOnly(*source), 60, 9);
  }
}

// The analysis round-trips each KV head on its own: with the whole rows' ranges for a
// scale per token, on whole rows cut for groups wider than a head (g64 here). Its tensor
// metrics must be those of round-tripping whole rows, for every kind of scale and with
// the static ones calibrated on all tokens.
TEST(Quant, PerHeadRoundTripsMatchWholeRows) {
  const AttentionShape shape{8, 4, 32};
  const int64_t tokens = 600;
  const auto source = make_synthetic("outlier-keys", shape, tokens, 7);
  std::vector<numerics::KvFormat> formats;
  for (const char* spec : {"fp8_e4m3:tensor", "fp8_e4m3:none+nan", "fp8_e5m2:head",
                           "fp8_e4m3fnuz:channel", "fp8_e4m3:token", "int8:token_head", "int4:g16",
                           "nvfp4", "mxfp4", "fp8_e4m3:tensor+hadamard", "int4:kivi",
                           "int4:token+asym", "int8:token+hadamard", "int4:g64"}) {
    formats.push_back(parse_kv_format(spec));
  }
  AnalysisOptions options;
  options.contexts = {250, tokens};
  options.query_positions = 2;
  options.step_tokens = 64;
  ThreadPool pool(2);
  const QuantAnalysis a = analyze(*source, formats, options, pool);
  const numerics::KvLayout layout = shape.kv_layout();
  std::vector<float> keys(size_t(tokens * layout.row_elements())), values(keys.size());
  source->keys(0, tokens, keys);
  source->values(0, tokens, values);
  for (const numerics::KvFormat& format : formats) {
    for (KvRole role : {KvRole::key, KvRole::value}) {
      const std::vector<float>& rows = role == KvRole::key ? keys : values;
      const numerics::RoundTripResult whole = numerics::round_trip(
          format, layout, role, numerics::calibrate_amax(format, layout, rows), rows);
      numerics::ErrorStats error;
      error.add(rows, whole.decoded);
      const TensorMetrics& m = find(a, format.spec, role);
      const std::string what = format.spec + " " + std::string(numerics::kv_role_name(role));
      testing::expect_same_counts(m.counts, whole.counts, what);
      EXPECT_EQ(m.error.count, error.count) << what;
      EXPECT_EQ(m.error.max_abs_error, error.max_abs_error) << what;
      EXPECT_NEAR(m.error.sum_squared_error.value(), error.sum_squared_error.value(),
                  1e-12 * error.sum_squared_error.value())
          << what;
    }
  }
}

TEST(Quant, RejectsBadRequests) {
  const auto source = make_synthetic("gaussian", {4, 2, 32}, 100);
  ThreadPool pool(1);
  AnalysisOptions options;
  options.contexts = {200};
  EXPECT_THROW(analyze(*source, {parse_kv_format("bf16")}, options, pool), InputError);
  options.contexts = {0};
  EXPECT_THROW(analyze(*source, {parse_kv_format("bf16")}, options, pool), InputError);
  EXPECT_THROW(make_synthetic("nope", {4, 2, 32}, 10), InputError);
  // A Hadamard rotation needs a power-of-two head_dim: a clear error, not a crash.
  const auto odd_heads = make_synthetic("gaussian", {4, 2, 24}, 100);
  options.contexts = {50};
  EXPECT_THROW(analyze(*odd_heads, {parse_kv_format("fp8_e4m3:tensor+hadamard")}, options, pool),
               InputError);
  EXPECT_THROW(analyze(*odd_heads, {parse_kv_format("int8:token+hadamard")}, options, pool),
               InputError);
  EXPECT_THROW(make_synthetic("gaussian", {3, 2, 32}, 10), InputError);
}

// ------------------------------------------------------------------ file input
std::filesystem::path temp_dir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() /
             ("kvaudit_quant_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

void write_npy(const std::filesystem::path& path, const std::vector<uint64_t>& shape,
               const std::vector<float>& data) {
  std::string dims;
  for (uint64_t d : shape) dims += std::to_string(d) + ", ";
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::ofstream out(path, std::ios::binary);
  out.write("\x93NUMPY\x01\x00", 8);
  const uint16_t len = uint16_t(header.size());
  out.write(reinterpret_cast<const char*>(&len), 2);
  out << header;
  out.write(reinterpret_cast<const char*>(data.data()), std::streamsize(data.size() * 4));
}

TEST(QuantInput, ReadsNpyFolderAndSafetensors) {
  const auto dir = temp_dir("npy");
  std::vector<float> k(10 * 2 * 4), v(10 * 2 * 4), q(3 * 4 * 4);
  for (size_t i = 0; i < k.size(); ++i) k[i] = float(i), v[i] = -float(i);
  for (size_t i = 0; i < q.size(); ++i) q[i] = 0.5f * float(i);
  write_npy(dir / "k.npy", {10, 2, 4}, k);
  write_npy(dir / "v.npy", {10, 2, 4}, v);
  write_npy(dir / "q.npy", {3, 4, 4}, q);
  auto source = load_qkv(dir);
  EXPECT_EQ(source->tokens(), 10);
  EXPECT_EQ(source->shape().kv_heads, 2);
  EXPECT_EQ(source->shape().q_heads, 4);
  EXPECT_EQ(source->shape().head_dim, 4);
  std::vector<float> row(8);
  source->keys(3, 1, row);
  EXPECT_EQ(row[0], 24.0f);
  source->values(9, 1, row);
  EXPECT_EQ(row[7], -79.0f);
  std::vector<float> qrow(16);
  source->queries(4, 1, qrow);  // position 4 cycles to stored position 1
  EXPECT_EQ(qrow[0], 8.0f);

  // The same K/V as safetensors (BF16 k, F32 v), no q.
  std::string header = R"({"k":{"dtype":"BF16","shape":[10,2,4],"data_offsets":[0,160]},)"
                       R"("v":{"dtype":"F32","shape":[10,2,4],"data_offsets":[160,480]}})";
  std::string blob(8, '\0');
  const uint64_t len = header.size();
  std::memcpy(blob.data(), &len, 8);
  blob += header;
  for (float x : k) {
    const uint16_t b = numerics::float_to_bf16(x);
    blob.append(reinterpret_cast<const char*>(&b), 2);
  }
  blob.append(reinterpret_cast<const char*>(v.data()), v.size() * 4);
  write_file_atomically(dir / "qkv.safetensors", blob);
  auto st = load_qkv(dir / "qkv.safetensors");
  EXPECT_EQ(st->tokens(), 10);
  EXPECT_EQ(st->shape().q_heads, 2);
  st->keys(3, 1, row);
  EXPECT_EQ(row[0], 24.0f);
  expect_head_rows_are_slices(*source, 2, 8);
  expect_head_rows_are_slices(*st, 0, 10);
  std::filesystem::remove_all(dir);
}

TEST(QuantInput, RejectsMalformedFiles) {
  const auto dir = temp_dir("bad");
  write_file_atomically(dir / "junk.safetensors", "\x05\x00\x00\x00\x00\x00\x00\x00{nope");
  EXPECT_THROW(load_qkv(dir / "junk.safetensors"), InputError);
  write_file_atomically(dir / "short.safetensors", "\x01");
  EXPECT_THROW(load_qkv(dir / "short.safetensors"), InputError);
  std::string overlong(8, '\0');
  overlong[0] = char(200);
  write_file_atomically(dir / "overlong.safetensors", overlong + "{}");
  EXPECT_THROW(load_qkv(dir / "overlong.safetensors"), InputError);
  const std::string bad_offsets =
      R"({"k":{"dtype":"F32","shape":[2,1,2],"data_offsets":[0,99]},"v":{"dtype":"F32","shape":[2,1,2],"data_offsets":[0,16]}})";
  std::string blob(8, '\0');
  const uint64_t len = bad_offsets.size();
  std::memcpy(blob.data(), &len, 8);
  write_file_atomically(dir / "offsets.safetensors", blob + bad_offsets + std::string(16, '\0'));
  EXPECT_THROW(load_qkv(dir / "offsets.safetensors"), InputError);
  EXPECT_THROW(load_qkv(dir / "missing.safetensors"), InputError);
  EXPECT_THROW(load_qkv(dir), InputError);  // folder without k.npy
  write_npy(dir / "k.npy", {2, 2}, {1, 2, 3, 4});
  write_npy(dir / "v.npy", {2, 2}, {1, 2, 3, 4});
  EXPECT_THROW(load_qkv(dir), InputError);  // not [tokens, heads, dim]
  write_file_atomically(dir / "k.npy", "\x93NUMPY\x01\x00\x10\x00{'descr': '<f8'}");
  EXPECT_THROW(load_qkv(dir), InputError);
  std::filesystem::remove_all(dir);
}

TEST(QuantReport, HasTablesChartAndVerdict) {
  const auto source = make_synthetic("outlier-keys", {8, 2, 64}, 1024);
  AnalysisOptions options;
  options.contexts = {512, 1024};
  ThreadPool pool(1);
  const QuantAnalysis a =
      analyze(*source, {parse_kv_format("fp8_e4m3:none"), parse_kv_format("nvfp4")}, options, pool);
  const report::Report r = to_report(a);
  EXPECT_EQ(r.command, "quant");
  ASSERT_EQ(r.tables.size(), 2u);
  EXPECT_EQ(r.tables[0].rows.size(), 4u);  // 2 formats x K, V
  EXPECT_EQ(r.tables[1].rows.size(), 4u);  // 2 formats x 2 contexts
  for (const report::Table& t : r.tables) {
    for (const auto& row : t.rows) EXPECT_EQ(row.size(), t.columns.size());
  }
  ASSERT_FALSE(r.charts.empty());
  EXPECT_EQ(r.charts[0].kind, report::ChartKind::lines);
  EXPECT_EQ(r.charts[0].x_values, (std::vector<double>{512, 1024}));
  EXPECT_EQ(r.charts[0].series.size(), 2u);
  EXPECT_NE(r.verdict.find("flushed to zero"), std::string::npos);
  EXPECT_EQ(r.payload["attention"].size(), 4u);
}

}  // namespace
}  // namespace kvaudit::quant
