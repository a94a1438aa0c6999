// bench_model MODEL_DIR [--prompt N] [--gen N] [--threads N] [--repeats N] [--kv FORMAT]
//                       [--batch N]
// Prefill and decode tokens/s of the reference engine, measured the way llama.cpp's
// llama-bench measures pp512 / tg128, so the two can be compared on the same weights
// (tools/make_bench_model.py writes a random model of Qwen2.5-0.5B shape as safetensors
// and as GGUF):
//   prefill: an empty cache, then N prompt tokens in one forward call, logits of the last
//            token only (llama-bench's prompt test asks for the last token's logits);
//   decode:  an empty cache, then N single-token steps, each with full-vocabulary logits.
// Wall time (llama-bench reports wall time), every repeat printed, then mean and best. The
// token ids are fixed pseudo-random ids: with random weights the text does not matter.
// The comparison as run for issue 5 (llama.cpp and the model live outside the repository):
//   /usr/bin/python3 tools/make_bench_model.py --out /work/peer/bench-model/qwen25-05b-f16
//       --dtype f16 --gguf /work/peer/bench-model/qwen25-05b-f16.gguf
//       --gguf-py /work/peer/llama.cpp/gguf-py
//   llama-bench -m /work/peer/bench-model/qwen25-05b-f16.gguf -t 2 -p 512 -n 128 -r 3
//   bench_model /work/peer/bench-model/qwen25-05b-f16 --prompt 512 --gen 128 --repeats 3 --profile
// --profile also times the public matmul kernel alone on each of layer 0's matrices (x the
// layer count) and on the LM head, at 1 token and at the prompt length, and prints what the
// projections take of a prefill and of a decode step; the rest is attention, norms, RoPE,
// the KV cache and SiLU.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "model/model.h"
#include "numerics/numerics.h"
#include "util/util.h"

using Clock = std::chrono::steady_clock;

namespace {

struct Options {
  std::string model_dir;
  int64_t prompt_tokens = 512;
  int64_t gen_tokens = 128;
  int threads = 2;
  int repeats = 3;
  int64_t batch_tokens = 512;  // llama-bench's default micro-batch (n_ubatch) is 512
  std::string kv = "bf16";     // llama.cpp's default cache is F16: same 2 bytes per value
  bool profile = false;
};

Options parse(int argc, char** argv) {
  Options o;
  if (argc < 2)
    throw std::runtime_error(
        "usage: bench_model MODEL_DIR [--prompt N] [--gen N] "
        "[--threads N] [--repeats N] [--kv FORMAT] [--batch N]");
  o.model_dir = argv[1];
  for (int i = 2; i < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--profile") {
      o.profile = true;
      --i;
      continue;
    }
    if (i + 1 >= argc) throw std::runtime_error("missing value for " + flag);
    std::string value = argv[i + 1];
    if (flag == "--prompt")
      o.prompt_tokens = std::stoll(value);
    else if (flag == "--gen")
      o.gen_tokens = std::stoll(value);
    else if (flag == "--threads")
      o.threads = std::stoi(value);
    else if (flag == "--repeats")
      o.repeats = std::stoi(value);
    else if (flag == "--batch")
      o.batch_tokens = std::stoll(value);
    else if (flag == "--kv")
      o.kv = value;
    else
      throw std::runtime_error("unknown flag " + flag);
  }
  return o;
}

std::vector<int32_t> pseudo_random_ids(int64_t count, int64_t vocab) {
  std::vector<int32_t> ids(count);
  uint64_t state = 0x9E3779B97F4A7C15ull;
  for (auto& id : ids) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    id = static_cast<int32_t>((state >> 33) % static_cast<uint64_t>(vocab));
  }
  return ids;
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

void summarize(const char* what, int64_t tokens, const std::vector<double>& seconds) {
  double sum = 0.0, best = 1e30;
  for (double s : seconds) {
    sum += s;
    best = std::min(best, s);
  }
  const double mean = sum / static_cast<double>(seconds.size());
  fmt::print("{}: {:.2f} tokens/s mean, {:.2f} best ({} tokens, {} repeats)\n", what,
             static_cast<double>(tokens) / mean, static_cast<double>(tokens) / best, tokens,
             seconds.size());
}

// Seconds of numerics::matmul over every projection of a forward pass (each kind of layer's
// first instance stands for all layers of that kind: they have the same shapes; a hybrid has
// two kinds) plus the LM head for `head_tokens`.
double projection_seconds(const kvaudit::model::Model& model, int64_t tokens, int64_t head_tokens,
                          kvaudit::ThreadPool& pool) {
  const auto& c = model.config();
  int64_t widest = model.lm_head().rows;
  for (const auto& w : model.layers())
    for (const auto* m : {&w.q, &w.k, &w.v, &w.o, &w.gate, &w.up, &w.down, &w.in_qkv, &w.in_z,
                          &w.in_b, &w.in_a, &w.delta_out})
      widest = std::max({widest, m->rows, m->cols});
  std::vector<float> x(static_cast<size_t>(tokens * widest), 0.01f), out(x.size() * 1);
  std::vector<float> head_out(static_cast<size_t>(head_tokens * model.lm_head().rows));
  double total = 0.0;
  for (auto mixer : {kvaudit::model::Mixer::attention, kvaudit::model::Mixer::gated_delta_net}) {
    const int layers = static_cast<int>(std::count(c.mixers.begin(), c.mixers.end(), mixer));
    if (layers == 0) continue;
    const auto& w =
        model.layers()[std::find(c.mixers.begin(), c.mixers.end(), mixer) - c.mixers.begin()];
    double layer_seconds = 0.0;
    for (const auto* m : {&w.q, &w.k, &w.v, &w.o, &w.gate, &w.up, &w.down, &w.in_qkv, &w.in_z,
                          &w.in_b, &w.in_a, &w.delta_out}) {
      if (m->empty()) continue;
      auto start = Clock::now();
      kvaudit::numerics::matmul(x.data(), tokens, *m, out.data(), pool);
      layer_seconds += seconds_since(start);
    }
    total += layer_seconds * layers;
  }
  auto start = Clock::now();
  if (head_tokens > 0)
    kvaudit::numerics::matmul(x.data(), head_tokens, model.lm_head(), head_out.data(), pool);
  return total + seconds_since(start);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    auto model = kvaudit::model::Model::load(o.model_dir);
    const auto& c = model->config();
    kvaudit::ThreadPool pool(o.threads);
    const auto format = kvaudit::numerics::parse_kv_format(o.kv);
    fmt::print(
        "model {}: {} layers, hidden {}, vocab {}, {} weights ({:.0f} MB); kv {}; {} "
        "threads; kernels {}\n",
        o.model_dir, c.num_layers, c.hidden_size, c.vocab_size,
        kvaudit::model::weight_type_name(model->weight_type()),
        static_cast<double>(model->weight_bytes()) / 1e6, o.kv, o.threads,
        kvaudit::numerics::simd_target_name());
    kvaudit::model::Session session(*model, format, pool);
    session.max_batch_tokens = o.batch_tokens;
    std::vector<float> logits;

    // Warm-up: pages the mapped weights in and sizes the scratch buffers.
    const std::vector<int32_t> prompt = pseudo_random_ids(o.prompt_tokens, c.vocab_size);
    session.forward(prompt, o.prompt_tokens - 1, logits);

    std::vector<double> prefill, decode;
    for (int r = 0; r < o.repeats; ++r) {
      session.reset();
      auto start = Clock::now();
      session.forward(prompt, o.prompt_tokens - 1, logits);
      prefill.push_back(seconds_since(start));
      fmt::print("  prefill repeat {}: {:.2f} tokens/s\n", r,
                 static_cast<double>(o.prompt_tokens) / prefill.back());
      std::fflush(stdout);
    }
    const std::vector<int32_t> generated = pseudo_random_ids(o.gen_tokens, c.vocab_size);
    for (int r = 0; r < o.repeats; ++r) {
      session.reset();
      auto start = Clock::now();
      for (int32_t id : generated) session.decode(id, logits);
      decode.push_back(seconds_since(start));
      fmt::print("  decode repeat {}: {:.2f} tokens/s\n", r,
                 static_cast<double>(o.gen_tokens) / decode.back());
      std::fflush(stdout);
    }
    summarize(fmt::format("pp{}", o.prompt_tokens).c_str(), o.prompt_tokens, prefill);
    summarize(fmt::format("tg{}", o.gen_tokens).c_str(), o.gen_tokens, decode);
    if (o.profile) {
      const double prefill_best = *std::min_element(prefill.begin(), prefill.end());
      const double decode_best = *std::min_element(decode.begin(), decode.end()) /
                                 static_cast<double>(std::max<int64_t>(1, o.gen_tokens));
      // A prompt runs in batches of batch_tokens; the projections see those batch sizes.
      double prefill_projections = 0.0;
      for (int64_t begin = 0; begin < o.prompt_tokens; begin += o.batch_tokens) {
        const int64_t n = std::min(o.batch_tokens, o.prompt_tokens - begin);
        prefill_projections +=
            projection_seconds(*model, n, begin + n == o.prompt_tokens ? 1 : 0, pool);
      }
      const double decode_projections = projection_seconds(*model, 1, 1, pool);
      fmt::print(
          "profile prefill: {:.3f} s best, projections alone {:.3f} s ({:.0f}%), the rest "
          "{:.3f} s\n",
          prefill_best, prefill_projections, 100.0 * prefill_projections / prefill_best,
          prefill_best - prefill_projections);
      fmt::print(
          "profile decode step: {:.2f} ms best, projections alone {:.2f} ms ({:.0f}%; "
          "{:.1f} GB/s of weights), the rest {:.2f} ms\n",
          decode_best * 1e3, decode_projections * 1e3, 100.0 * decode_projections / decode_best,
          static_cast<double>(model->weight_bytes()) / decode_projections / 1e9,
          (decode_best - decode_projections) * 1e3);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_model: %s\n", e.what());
    return 2;
  }
}
