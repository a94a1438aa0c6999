// numerics: bit-exact number formats for KV caches and the statistics of the error they cause.
// Scalar conversions for every element type (FP8 E4M3 / E4M3 FNUZ / E5M2, FP4 E2M1, E8M0,
// BF16, FP16, INT8/INT4), one traits table, KV formats with their scale strategies (static
// per-tensor / per-head / per-channel, dynamic per-token / per-token-head / groups, KIVI,
// NVFP4, MXFP4, optional Hadamard rotation), a streaming per-(layer, K|V) cache codec, bulk
// SIMD kernels (Highway dynamic dispatch), mergeable error accumulators, and the ops of the
// reference model's forward pass (matmul on F32/BF16/F16 weights, softmax, attention GEMMs).
// Not here: attention-level analysis and file input (quant/), engine behaviour (engines/).
// Nothing in this module prints, exits or starts threads behind the caller's back: parallel
// work runs on a ThreadPool (util/) the caller owns, with reductions in a fixed order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "util/util.h"

namespace kvaudit::numerics {

// ---------------------------------------------------------------- scalar conversions
// Decoders are exact (every code maps to one float; NaN codes give a quiet NaN).
float bf16_to_float(uint16_t bits);
float fp16_to_float(uint16_t bits);
float fp8_e4m3_to_float(uint8_t code);      // OCP "e4m3fn": bias 7, max 448, NaN 0x7F/0xFF
float fp8_e4m3fnuz_to_float(uint8_t code);  // bias 8, max 240, NaN 0x80 only, no -0
float fp8_e5m2_to_float(uint8_t code);      // bias 15, max 57344, inf and NaN
float fp4_e2m1_to_float(uint8_t nibble);    // low 4 bits: S.EE.M, magnitudes {0,.5,1,1.5,2,3,4,6}
float e8m0_to_float(uint8_t code);          // 2^(code-127); 0xFF is NaN

// What an encoder does with a finite value beyond the largest finite code.
//   saturate: clamp to +-max finite (CUDA __NV_SATFINITE, ModelOpt, most kernels).
//   nan_inf:  PyTorch's .to(float8_*) cast: E4M3 |x| >= 480 -> NaN (no inf exists), FNUZ
//             -> NaN, E5M2 -> +-inf, FP16 -> +-inf. Infinite inputs follow the same rule.
enum class Overflow { saturate, nan_inf };

// Encoders round to nearest, ties to even. NaN input gives the format's NaN (or, for
// formats without NaN such as FP4, zero: see element_traits().nan_encodes_as_zero).
uint16_t float_to_bf16(float value);  // overflow to inf as IEEE rounding does
uint16_t float_to_fp16(float value, Overflow overflow = Overflow::nan_inf);
uint8_t float_to_fp8_e4m3(float value, Overflow overflow);
uint8_t float_to_fp8_e4m3fnuz(float value, Overflow overflow);
uint8_t float_to_fp8_e5m2(float value, Overflow overflow);
uint8_t float_to_fp4_e2m1(float value);  // always saturates to +-6 (the format has no NaN/inf)
// E8M0 scale for an MX block whose largest magnitude is amax (OCP MX v1.0 section 6.3):
// 2^(floor(log2(amax)) - emax_element), clamped to [2^-127, 2^127]; amax 0 gives 2^-127.
uint8_t e8m0_for_block_amax(float amax, int emax_element);

// ---------------------------------------------------------------- element traits
enum class ElementType { f32, bf16, f16, fp8_e4m3, fp8_e4m3fnuz, fp8_e5m2, fp4_e2m1, int8, int4 };

// How one encoded element relates to its input (used for the error accounting).
enum class CodeClass { zero, subnormal, normal, max_finite, inf, nan };

struct ElementTraits {
  ElementType type;
  std::string_view name;  // "fp8_e4m3", "int4", ...
  int bits;               // storage bits per element
  bool is_float;          // false for int8 / int4
  double max_finite;      // largest finite magnitude (int: 127 / 7)
  double min_normal;      // smallest normal magnitude (int: 1)
  double min_subnormal;   // smallest nonzero magnitude (int: 1)
  bool has_inf;
  bool has_nan;
  bool nan_encodes_as_zero;    // FP4: NaN input cannot be represented
  double torch_overflow_from;  // PyTorch .to() cast: NaN/inf from this magnitude (0: none)
};
const ElementTraits& element_traits(ElementType type);
// E4M3, E4M3 FNUZ or E5M2.
bool is_fp8(ElementType type);
const std::vector<ElementTraits>& all_element_traits();
// By traits name ("fp8_e4m3", "int4"); nullopt when unknown.
std::optional<ElementType> find_element_type(std::string_view name);

// Scalar reference encode/decode of one element (codes in the low `bits` bits; int codes
// are two's complement). For ints the value is rounded half-to-even and clamped to
// [-max, max] (symmetric) by encode_element; asymmetric ints are handled by the format codec.
uint32_t encode_element(ElementType type, float value, Overflow overflow);
// A second encoder for the minifloat types written independently (exact scaling and rint
// instead of bit arithmetic); tests require both to agree on every input they try.
uint32_t encode_minifloat_reference(ElementType type, float value, Overflow overflow);
float decode_element(ElementType type, uint32_t code);
CodeClass classify_code(ElementType type, uint32_t code);

// ---------------------------------------------------------------- KV formats
// How scales are chosen. "static" scales come from calibrated amax supplied by the caller
// (scale = amax * margin / max_finite); without calibration a static scale is 1.0.
enum class ScaleStrategy {
  none,        // scale 1.0 (what an engine does when it found no scales)
  tensor,      // static, one per (layer, K|V)
  head,        // static, one per KV head
  channel,     // static, one per channel (kv_heads * head_dim)
  token,       // dynamic, one per token row
  token_head,  // dynamic, one per token per head
  group,       // dynamic, one per group_size consecutive elements of a row
  kivi,        // keys: per channel over groups of group_tokens tokens; values: per token in
               // groups of group_size channels; the newest residual_tokens stay full precision
  block,       // fixed by the element layout: NVFP4 (16, E4M3 scale, FP32 tensor scale) and
               // MXFP4 (32, E8M0 scale)
};
std::string_view scale_strategy_name(ScaleStrategy strategy);

enum class KvFormatKind { plain, nvfp4, mxfp4 };

// A parsed KV format: "bf16", "fp8_e4m3:none", "fp8_e4m3:tensor", "fp8_e4m3:head",
// "fp8_e4m3:channel", "fp8_e5m2", "fp8_e4m3fnuz:tensor", "nvfp4", "mxfp4", "int8:token",
// "int8:token_head", "int4:kivi", "int4:g32" (group of 32), "int8:g64", with modifiers after
// '+': "hadamard" (rotate each head by the normalised Walsh-Hadamard matrix before
// quantising), "sat" / "nan" (overflow mode; default sat), "asym" / "sym" (ints; default
// sym, kivi asym). FP8 without a strategy means ":none"; ints without one mean ":token".
struct KvFormat {
  std::string spec;  // canonical spelling, e.g. "fp8_e4m3:tensor+nan"
  KvFormatKind kind = KvFormatKind::plain;
  ElementType element = ElementType::bf16;
  ScaleStrategy strategy = ScaleStrategy::none;
  Overflow overflow = Overflow::saturate;
  bool asymmetric = false;  // ints only: scale + zero point (min/max)
  bool hadamard = false;
  int group_size = 0;       // group (elements along a row) or KIVI value group / block size
  int group_tokens = 0;     // KIVI: tokens per key group
  int residual_tokens = 0;  // KIVI: newest tokens kept in full precision
  float margin = 1.0f;      // static scales: scale = amax * margin / max_finite
};
// Throws InputError("--formats", ...) on an unknown or inconsistent spec.
KvFormat parse_kv_format(std::string_view spec);
std::vector<KvFormat> parse_kv_formats(std::string_view comma_separated);
// Tokens of `tokens` appended ones that the cache holds quantised: all of them, except for
// KIVI, which keeps the newest residual_tokens (and a partial key group) in full
// precision: whole groups of group_tokens that have left the residual window.
int64_t quantized_tokens(const KvFormat& format, int64_t tokens);

enum class KvRole { key, value };
std::string_view kv_role_name(KvRole role);  // "K" | "V"

// One token's row for one layer and role is [kv_heads * head_dim] floats, head-major.
struct KvLayout {
  int kv_heads = 1;
  int head_dim = 128;
  int row_elements() const { return kv_heads * head_dim; }
};
// Throws InputError (naming the format) when a format cannot take this layout: a Hadamard
// rotation needs a power-of-two head_dim, NVFP4 rows of a multiple of 16.
void validate_kv_layout(const KvFormat& format, const KvLayout& layout);

// Calibrated absolute maxima for static scales of one (layer, role), measured on what is
// quantised (after the Hadamard rotation when the format has one; calibrate_amax does this).
// Shape: 1 (tensor), kv_heads (head), kv_heads*head_dim (channel); empty = not calibrated.
// `scales`, when set (same shape), are used as they are, bit for bit, instead of deriving them
// from amax: that is how an engine applies the k_scale / v_scale tensors it loaded.
struct StaticAmax {
  std::vector<float> amax;
  std::vector<float> scales;
};
// Computes the amax a format's static strategy needs from sample rows [tokens, row_elements].
StaticAmax calibrate_amax(const KvFormat& format, const KvLayout& layout,
                          std::span<const float> rows);
// The static scale per element group the codec will use (size 1, kv_heads or row_elements;
// [1.0] for strategies that are not static). For NVFP4 this is the FP32 tensor scale.
std::vector<float> static_scales(const KvFormat& format, const KvLayout& layout,
                                 const StaticAmax& calibration);

// Storage cost. Static scales are per layer, not per token, and are excluded from
// row_bytes; stored_bits_per_element includes every per-token / per-block / per-group
// scale (FP32 scales counted as 32 bits, E4M3/E8M0 as 8) and, for KIVI, amortised per-channel
// scale and zero point rows (FP16 each) but not the full-precision residual window.
// KIVI keys keep their per-channel scales per token group, so the role matters.
int64_t row_bytes(const KvFormat& format, const KvLayout& layout, KvRole role = KvRole::value);
double stored_bits_per_element(const KvFormat& format, const KvLayout& layout,
                               KvRole role = KvRole::value);

// ---------------------------------------------------------------- error accounting
// Counts of what happened to individual elements during encoding, by the element's scaled
// value and the code it got. "saturated": finite input beyond max finite clamped to max;
// "became_nan"/"became_inf": finite input that encoded to NaN/inf; "flushed_to_zero":
// nonzero input that encoded to zero (floats and symmetric ints; asymmetric int grids have
// no zero level and are not counted); "subnormal": nonzero input that encoded to a
// subnormal code (lost relative precision). Inputs that already were NaN/inf are counted in
// "nonfinite_input" only.
struct EncodeCounts {
  int64_t elements = 0;
  int64_t saturated = 0;
  int64_t became_nan = 0;
  int64_t became_inf = 0;
  int64_t flushed_to_zero = 0;
  int64_t subnormal = 0;
  int64_t nonfinite_input = 0;
  void merge(const EncodeCounts& other);
};

// Neumaier-compensated sum: exact enough for 10^9 squared errors of mixed magnitude.
struct CompensatedSum {
  double sum = 0.0;
  double compensation = 0.0;
  void add(double value);
  void merge(const CompensatedSum& other);
  double value() const { return sum + compensation; }
};

// Error of decoded vs reference values. Pairs where either side is NaN/inf are counted in
// `nonfinite` and kept out of the sums (so one NaN does not hide the rest of the statistics).
struct ErrorStats {
  int64_t count = 0;      // finite pairs
  int64_t nonfinite = 0;  // pairs with a NaN or inf on either side
  CompensatedSum sum_squared_error;
  CompensatedSum sum_squared_reference;
  double max_abs_error = 0.0;
  void add(std::span<const float> reference, std::span<const float> decoded);
  void merge(const ErrorStats& other);
  double rmse() const;           // sqrt(sum (d - r)^2 / count)
  double relative_rmse() const;  // sqrt(sum (d - r)^2 / sum r^2); 0 when both are 0
  double snr_db() const;         // 10 log10(sum r^2 / sum (d - r)^2); +inf when exact
};

// ---------------------------------------------------------------- log-probabilities

// log-softmax of one row of logits, accumulated in double, written as float; the one
// implementation eval and serve share. A NaN or +inf logit leaves the distribution
// undefined: every output is NaN (so a NaN-poisoned cache shows as NaN downstream);
// -inf logits get log-probability -inf. log_probs.size() must equal logits.size().
void log_softmax(std::span<const float> logits, std::span<float> log_probs);

// ---------------------------------------------------------------- bulk kernels
// Names the SIMD target chosen at run time ("AVX2", "AVX3", "EMU128", ...).
std::string simd_target_name();

// Bulk conversions (Highway dynamic dispatch; bit-identical to the scalar encoders).
// Encoding divides by `scale` first (x / scale, as the engines' kernels do; scale must be
// > 0), decoding multiplies by it. `type` is one of the three FP8 element types.
void encode_fp8(ElementType type, Overflow overflow, float scale, std::span<const float> input,
                std::span<uint8_t> codes);
void encode_fp8_from_bf16(ElementType type, Overflow overflow, float scale,
                          std::span<const uint16_t> input, std::span<uint8_t> codes);
void decode_fp8(ElementType type, float scale, std::span<const uint8_t> codes,
                std::span<float> output);
void decode_fp8_to_bf16(ElementType type, float scale, std::span<const uint8_t> codes,
                        std::span<uint16_t> output);
void bf16_to_float_bulk(std::span<const uint16_t> input, std::span<float> output);
void float_to_bf16_bulk(std::span<const float> input, std::span<uint16_t> output);

// NVFP4 blocks of 16: packed nibbles (low nibble = even element) [n/2] and one E4M3 block
// scale per block [n/16]; tensor_scale is the FP32 second-level scale. n % 16 == 0.
void encode_nvfp4(float tensor_scale, std::span<const float> input, std::span<uint8_t> packed,
                  std::span<uint8_t> block_scales);
void decode_nvfp4(float tensor_scale, std::span<const uint8_t> packed,
                  std::span<const uint8_t> block_scales, std::span<float> output);
// The same straight from and to BF16 (bit for bit: encode_nvfp4 of the values widened to
// float; decode_nvfp4's output rounded to BF16).
void encode_nvfp4_from_bf16(float tensor_scale, std::span<const uint16_t> input,
                            std::span<uint8_t> packed, std::span<uint8_t> block_scales);
void decode_nvfp4_to_bf16(float tensor_scale, std::span<const uint8_t> packed,
                          std::span<const uint8_t> block_scales, std::span<uint16_t> output);
// Scalar references of encode_nvfp4 and decode_nvfp4 (the fast paths are tested against
// these).
void encode_nvfp4_reference(float tensor_scale, std::span<const float> input,
                            std::span<uint8_t> packed, std::span<uint8_t> block_scales);
void decode_nvfp4_reference(float tensor_scale, std::span<const uint8_t> packed,
                            std::span<const uint8_t> block_scales, std::span<float> output);

// What an encode did, from its inputs and codes, added to counts (every element counted):
// over finite inputs, codes of class NaN / inf / subnormal, zero codes of non-zero inputs,
// and largest-finite codes of inputs past the largest finite value times the scale (6
// times the block's effective scale for NVFP4); plus the non-finite inputs.
void tally_fp8(ElementType type, float scale, std::span<const float> values,
               std::span<const uint8_t> codes, EncodeCounts& counts);
void tally_nvfp4(float tensor_scale, std::span<const float> values, std::span<const uint8_t> packed,
                 std::span<const uint8_t> block_scales, EncodeCounts& counts);
// encode_fp8, tally_fp8 and decode_fp8 in one pass (the codes stay in registers):
// output[i] = decode(encode(input[i] / scale)) * scale, the counts added to `counts`.
void round_trip_fp8(ElementType type, Overflow overflow, float scale, std::span<const float> input,
                    std::span<float> output, EncodeCounts& counts);

// Largest |x| over the finite values (0 if none), and its element-wise form: amax[i] =
// max(amax[i], |values[i]|) where values[i] is finite (amax must hold non-negative values).
float finite_abs_max(std::span<const float> values);
void finite_abs_max_into(std::span<const float> values, std::span<float> amax);

// In-place orthonormal Walsh-Hadamard transform of each `width`-element segment (width a
// power of two); applying it twice restores the input (up to rounding).
void hadamard_rows(std::span<float> data, int width);

// Round trip of whole rows [tokens, row_elements] through a format, as a cache stores and
// reads them, with the per-element counts: the analysis entry point. For KIVI the last
// residual window is left full precision exactly as KvStream does. Parallel over tokens.
struct RoundTripResult {
  std::vector<float> decoded;  // [tokens, row_elements]
  EncodeCounts counts;
};
RoundTripResult round_trip(const KvFormat& format, const KvLayout& layout, KvRole role,
                           const StaticAmax& calibration, std::span<const float> rows,
                           ThreadPool* pool = nullptr);
// The same into a caller's buffer (decoded.size() >= rows.size()), reused across calls.
EncodeCounts round_trip_into(const KvFormat& format, const KvLayout& layout, KvRole role,
                             const StaticAmax& calibration, std::span<const float> rows,
                             std::span<float> decoded, ThreadPool* pool = nullptr);

// A per-token strategy (ScaleStrategy::token) on one KV head's part of each row: the
// scale of a row comes from the whole row, so the whole rows' finite {minimum, maximum}
// (after the Hadamard rotation, when the format has one) are taken first, ranges[2 t]
// and ranges[2 t + 1] for token t ({+inf, -inf} for a row with nothing finite); then
// round_trip_head_rows codes one head's rows [tokens, head_dim] with them, giving that
// head's part of round_trip of the whole rows, bit for bit, and its counts.
void token_row_ranges(const KvFormat& format, const KvLayout& layout, std::span<const float> rows,
                      std::span<float> ranges);
EncodeCounts round_trip_head_rows(const KvFormat& format, int head_dim, KvRole role,
                                  std::span<const float> head_rows, std::span<const float> ranges,
                                  std::span<float> decoded);

// ---------------------------------------------------------------- ops
// The compute ops of the reference model's forward pass (model/): matmul against weights in
// their stored type, softmax, and the attention kernels below. SIMD via Highway dynamic
// dispatch; each has a scalar reference that tests compare with. Every output element is
// computed by one thread with a fixed summation order, so results do not depend on the
// thread count.

// The stored type of a weight tensor (safetensors F32 / BF16 / F16).
enum class WeightType { f32, bf16, f16 };

// A row-major [rows, cols] view into mapped memory (vectors have rows == 1).
struct Matrix {
  const void* data = nullptr;
  WeightType type = WeightType::f32;
  int64_t rows = 0;
  int64_t cols = 0;
  bool empty() const { return data == nullptr; }
};

// out[t, r] = sum_c x[t, c] * w[r, c]   for t < tokens, r < w.rows; x: [tokens, w.cols].
void matmul(const float* x, int64_t tokens, const Matrix& w, float* out, ThreadPool& pool);
void matmul_reference(const float* x, int64_t tokens, const Matrix& w, float* out);
// Reads element i of a weight vector/matrix as float.
float weight_at(const Matrix& w, int64_t index);
// Converts row `row` of w to floats.
void weight_row(const Matrix& w, int64_t row, float* out);
// In-place softmax of one row, as torch.softmax (NaN or +inf anywhere: the row is NaN).
void softmax(float* x, int64_t n);
// In place gate[i] = SiLU(gate[i]) * up[i] = gate[i] / (1 + exp(-gate[i])) * up[i], with
// Highway's vector exp (within 1 ulp of std::exp; the same bits at any position or length).
void silu_times(float* gate, const float* up, int64_t n);
// In place x[i] = SiLU(x[i]), by the same vector code (silu_times with up = 1 exactly).
void silu(float* x, int64_t n);
// One token of the gated delta rule (Gated DeltaNet) on one value head's recurrent state
// [dk, dv], row-major, updated in place: S *= decay; delta = beta (v - S^T k);
// S += k delta^T; out[dv] = S^T q. Sums over the dk rows run in row order, one multiply-add
// per step, for every column.
void delta_rule_step(float* state, int64_t dk, int64_t dv, const float* q, const float* k,
                     const float* v, float decay, float beta, float* out);

// ---------------------------------------------------------------- attention kernels
// Blocked SIMD GEMMs for attention (fixed reduction order; deterministic). Row form, as the
// reference model uses it: scores[q * key_count + j] = scale * dot(queries[q * query_stride ...],
// keys[j * key_stride ...])
void score_block(const float* queries, int64_t query_count, int64_t query_stride, const float* keys,
                 int64_t key_count, int64_t key_stride, int64_t dim, float scale, float* scores);
// out[q * out_stride + c] += sum_j weights[q * key_count + j] * values[j * value_stride + c]
void accumulate_weighted(const float* weights, int64_t query_count, int64_t key_count,
                         const float* values, int64_t value_stride, int64_t dim, float* out,
                         int64_t out_stride);
// Transposed forms for many queries against one key block: scores as [key][query] with
// the queries along the vector lanes, so keys are read in place and the softmax
// bookkeeping runs down whole columns. A pitch (the row length of a [key][query] or
// [dim][query] array) must come from column_pitch: a multiple of the vector length, the
// lanes past the real queries being padding that the kernels compute and callers ignore.
int64_t column_pitch(int64_t columns);
// scores_t[j * columns + q] = scale * dot(keys[j * key_stride ...],
// queries_t[... * queries_pitch + q]) for q < columns (a pitch), bit-identical to
// score_block's scores. queries_t may start at any column of a wider array.
void score_block_transposed(const float* queries_t, int64_t queries_pitch, int64_t columns,
                            int64_t dim, const float* keys, int64_t key_count, int64_t key_stride,
                            float scale, float* scores_t);
// out[q * out_stride + c] = out[...] * out_scale[q] (if out_scale is given, the online
// softmax's rescale) + sum_j weights_t[j * pitch + q] * values[j * value_stride + c] for
// q < query_count, bit-identical to scaling out and then accumulate_weighted. Values are
// read in place: rows a page or a power of two apart are slow to walk down, pack them
// first (pack_rows).
void accumulate_weighted_transposed(const float* weights_t, int64_t pitch, int64_t query_count,
                                    int64_t key_count, const float* values, int64_t value_stride,
                                    int64_t dim, float* out, int64_t out_stride,
                                    const float* out_scale = nullptr);
// dst[j * dst_pitch + c] = src[j * src_stride + c] for c < width, rows fetched ahead.
void pack_rows(const float* src, int64_t rows, int64_t src_stride, int64_t width, float* dst,
               int64_t dst_pitch);
// Column-wise over x[rows][pitch], sums in row order:
// column_max[q] = max_j x[j][q], NaN ignored (-inf when none).
void column_max_ignoring_nan(const float* x, int64_t rows, int64_t pitch, float* column_max);
// out[j][q] = exp(x[j][q] - shift[q]) (out may be x), column_sums[q] = sum_j out[j][q].
void column_exp_and_sum(const float* x, int64_t rows, int64_t pitch, const float* shift, float* out,
                        float* column_sums);
// Per column: weighted_difference[q] = sum_j weights (reference - other) (NaN/inf
// propagate, on purpose) and, over the pairs where reference - other is finite, the sums
// of (reference - other)^2 and reference^2; other_max[q] = max_j other[j][q], NaN ignored.
void column_divergence(const float* reference, const float* other, const float* weights,
                       int64_t rows, int64_t pitch, float* weighted_difference,
                       float* error_squared, float* reference_squared, float* other_max);
// Writes j * pitch + q for every x[j][q] >= threshold[q] with q < columns (never NaN), row
// by row; returns how many (out needs room for rows * columns).
int64_t column_select_at_least(const float* x, int64_t rows, int64_t pitch, int64_t columns,
                               const float* threshold, int32_t* out);
// The reference loops the GEMMs above are checked against: the same arguments, summed in
// double in index order (the kernels sum in float and in their own order, so they agree
// to rounding, not bit for bit).
void score_block_reference(const float* queries, int64_t query_count, int64_t query_stride,
                           const float* keys, int64_t key_count, int64_t key_stride, int64_t dim,
                           float scale, double* scores);
void accumulate_weighted_reference(const float* weights, int64_t query_count, int64_t key_count,
                                   const float* values, int64_t value_stride, int64_t dim,
                                   double* out, int64_t out_stride);
// Peak-FMA probe for benchmarks: runs `iterations` rounds of independent FMA chains;
// fma_probe_flops says how many floating-point operations that was on this target.
float fma_probe(int64_t iterations);
int64_t fma_probe_flops(int64_t iterations);

// ---------------------------------------------------------------- streaming cache codec
// The KV cache of one (layer, role) in a given format: append encoded rows as tokens arrive,
// decode any token range back to floats. Keeps bytes exactly as the format stores them.
// KIVI keys are quantised per channel over groups of tokens, so the newest tokens stay full
// precision until a group is complete and has left the residual window.
class KvStream {
 public:
  KvStream(KvFormat format, KvLayout layout, KvRole role, StaticAmax calibration = {});
  ~KvStream();
  KvStream(KvStream&&) noexcept;
  KvStream& operator=(KvStream&&) noexcept;
  KvStream Copy() const;  // explicit: caches are large
  // The same stored bytes read under another static calibration: what a cache tier that
  // kept the codes but lost (or swapped) the per-layer scales hands back.
  KvStream WithCalibration(StaticAmax calibration) const;
  const StaticAmax& calibration() const;

  // row: [row_elements]. counts (optional) receives what happened to its elements (for KIVI
  // the elements are counted when their group is quantised).
  void append(std::span<const float> row, EncodeCounts* counts = nullptr);
  // output: [count, row_elements] for tokens [first_token, first_token + count).
  void decode(int64_t first_token, int64_t count, std::span<float> output) const;
  // Drops tokens at and after `tokens` (speculative rollback, prompt reuse).
  void truncate(int64_t tokens);

  int64_t tokens() const;
  int64_t stored_bytes() const;  // bytes held now, residual window included
  const KvFormat& format() const;
  const KvLayout& layout() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvaudit::numerics
