// Codec throughput vs memcpy, measured in the same process on the same bytes and threads:
// 1 GiB of BF16 K/V goes through FP8 E4M3 per-tensor (encode to codes, decode back to BF16)
// and NVFP4 (BF16 -> packed FP4 + E4M3 block scales -> BF16); the ratio is memcpy time of
// the 1 GiB over codec time. Targets: FP8 >= 0.60, NVFP4 >= 0.30.
// usage: bench_codecs [GiB=1] [threads=2] [repeats=3]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "numerics/numerics.h"

using namespace kvaudit::numerics;

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

template <class Body>
double best_of(int repeats, const Body& body) {
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const double start = now_seconds();
    body();
    best = std::min(best, now_seconds() - start);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const double gib = argc > 1 ? std::atof(argv[1]) : 1.0;
  const int threads = argc > 2 ? std::atoi(argv[2]) : 2;
  const int repeats = argc > 3 ? std::atoi(argv[3]) : 3;
  const size_t bytes = size_t(gib * double(1ull << 30)) / 64 * 64;
  const size_t n = bytes / 2;  // BF16 elements
  kvaudit::ThreadPool pool(threads);
  const int tasks = threads * 8;
  std::printf("SIMD target %s, %d threads, %.2f GiB of BF16 (%zu elements)\n",
              simd_target_name().c_str(), threads, gib, n);

  // K-like data: Gaussian-ish magnitudes over several binades, as BF16 bits.
  std::vector<uint16_t> input(n), output(n);
  std::vector<uint8_t> codes(n);
  pool.parallel_for(int64_t(n), tasks, [&](int, int64_t b, int64_t e) {
    uint64_t state = 0x9E3779B97F4A7C15ull ^ uint64_t(b);
    for (int64_t i = b; i < e; ++i) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      const float u = float(int32_t(state >> 33) - (1 << 30)) / float(1 << 30);
      input[size_t(i)] = float_to_bf16(u * u * u * 40.0f);
    }
  });
  // Touch the outputs once so page faults are not timed.
  std::memset(output.data(), 0, bytes);
  std::memset(codes.data(), 0, n);

  const double memcpy_s = best_of(repeats, [&] {
    pool.parallel_for(int64_t(n), tasks, [&](int, int64_t b, int64_t e) {
      std::memcpy(output.data() + b, input.data() + b, size_t(e - b) * 2);
    });
  });
  const float scale = 40.0f / 448.0f;  // calibrated per-tensor: amax / max finite
  double encode_s = 0, decode_s = 0;
  const double fp8_s = best_of(repeats, [&] {
    const double t0 = now_seconds();
    pool.parallel_for(int64_t(n), tasks, [&](int, int64_t b, int64_t e) {
      encode_fp8_from_bf16(ElementType::fp8_e4m3, Overflow::saturate, scale,
                           {input.data() + b, size_t(e - b)}, {codes.data() + b, size_t(e - b)});
    });
    const double t1 = now_seconds();
    pool.parallel_for(int64_t(n), tasks, [&](int, int64_t b, int64_t e) {
      decode_fp8_to_bf16(ElementType::fp8_e4m3, scale, {codes.data() + b, size_t(e - b)},
                         {output.data() + b, size_t(e - b)});
    });
    encode_s = t1 - t0;
    decode_s = now_seconds() - t1;
  });
  // Spot-check the result against the scalar reference.
  size_t mismatches = 0;
  for (size_t i = 0; i < n; i += 9973) {
    const uint8_t c = float_to_fp8_e4m3(bf16_to_float(input[i]) / scale, Overflow::saturate);
    if (output[i] != float_to_bf16(fp8_e4m3_to_float(c) * scale)) ++mismatches;
  }

  // NVFP4: packed codes and block scales live in memory.
  std::vector<uint8_t> packed(n / 2), block_scales(n / 16);
  std::memset(packed.data(), 0, packed.size());
  std::memset(block_scales.data(), 0, block_scales.size());
  const float tensor_scale = 40.0f / (448.0f * 6.0f);
  const int64_t blocks = int64_t(n / 16);
  double nvfp4_encode_s = 0, nvfp4_decode_s = 0;
  const double nvfp4_s = best_of(repeats, [&] {
    const double t0 = now_seconds();
    pool.parallel_for(blocks, tasks, [&](int, int64_t b, int64_t e) {
      const size_t first = size_t(b) * 16, count = size_t(e - b) * 16;
      encode_nvfp4_from_bf16(tensor_scale, {input.data() + first, count},
                             {packed.data() + first / 2, count / 2},
                             {block_scales.data() + first / 16, count / 16});
    });
    const double t1 = now_seconds();
    pool.parallel_for(blocks, tasks, [&](int, int64_t b, int64_t e) {
      const size_t first = size_t(b) * 16, count = size_t(e - b) * 16;
      decode_nvfp4_to_bf16(tensor_scale, {packed.data() + first / 2, count / 2},
                           {block_scales.data() + first / 16, count / 16},
                           {output.data() + first, count});
    });
    nvfp4_encode_s = t1 - t0;
    nvfp4_decode_s = now_seconds() - t1;
  });
  // Spot-check NVFP4 against the scalar references.
  for (size_t block = 0; block < n / 16; block += 99991) {
    float widened[16], decoded[16];
    uint8_t block_packed[8], block_scale[1];
    for (size_t j = 0; j < 16; ++j) widened[j] = bf16_to_float(input[block * 16 + j]);
    encode_nvfp4_reference(tensor_scale, widened, block_packed, block_scale);
    decode_nvfp4_reference(tensor_scale, block_packed, block_scale, decoded);
    for (size_t j = 0; j < 16; ++j) {
      if (output[block * 16 + j] != float_to_bf16(decoded[j])) ++mismatches;
    }
  }

  const double gb = double(bytes) / 1e9;
  std::printf("memcpy          %.3f s  %6.2f GB/s\n", memcpy_s, gb / memcpy_s);
  std::printf(
      "fp8 per-tensor  %.3f s  %6.2f GB/s (encode %.3f s, decode %.3f s)  ratio %.2f "
      "(target >= 0.60)\n",
      fp8_s, gb / fp8_s, encode_s, decode_s, memcpy_s / fp8_s);
  std::printf(
      "nvfp4           %.3f s  %6.2f GB/s (encode %.3f s, decode %.3f s)  ratio %.2f "
      "(target >= 0.30)\n",
      nvfp4_s, gb / nvfp4_s, nvfp4_encode_s, nvfp4_decode_s, memcpy_s / nvfp4_s);
  std::printf("spot-check mismatches (FP8 and NVFP4) %zu\n", mismatches);
  return mismatches == 0 ? 0 : 1;
}
