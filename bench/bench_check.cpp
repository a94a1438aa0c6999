// bench_check CHECKPOINT_DIR [ROUNDS]: parses and validates every safetensors header of a
// checkpoint as `kvaudit check` does (simdjson On-Demand, no allocation per tensor, shards in
// parallel on this machine's cores), against Python's json.loads on the same header bytes (the
// baseline, one interpreter per round, timing only its json.loads). The two alternate round by
// round, so that other work on a shared machine slows both alike; the medians of wall time are
// compared. Then read_checkpoint end to end, and one thread's parse for the per-core rate.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/internal.h"
#include "util/util.h"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
namespace ck = kvaudit::checkpoint;

namespace {

std::string read_header_bytes(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  unsigned char prefix[8];
  in.read(reinterpret_cast<char*>(prefix), 8);
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = length << 8 | prefix[i];
  std::string header(length, '\0');
  in.read(header.data(), static_cast<std::streamsize>(length));
  return header;
}

// What the parse leaves for the caller: the count, so that nothing is optimised away.
struct CountTensors : ck::HeaderVisitor {
  uint64_t tensors = 0;
  void begin() override { tensors = 0; }
  void metadata(std::string_view, std::string_view) override {}
  void tensor(const ck::TensorView&) override { ++tensors; }
};

template <typename F>
double wall_seconds(F&& body) {
  auto start = Clock::now();
  body();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: bench_check CHECKPOINT_DIR [ROUNDS]\n";
    return 2;
  }
  fs::path dir = argv[1];
  int rounds = argc > 2 ? std::max(1, std::atoi(argv[2])) : 7;
  std::vector<fs::path> shards;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().extension() == ".safetensors") shards.push_back(entry.path());
  std::sort(shards.begin(), shards.end());
  std::vector<std::string> headers;  // each followed by simdjson's padding, as when mapped
  uint64_t header_bytes = 0;
  fs::path scratch = fs::temp_directory_path() / fmt::format("kvaudit-bench-{}", ::getpid());
  fs::create_directories(scratch);
  std::string python_files;
  for (size_t i = 0; i < shards.size(); ++i) {
    headers.push_back(read_header_bytes(shards[i]));
    header_bytes += headers.back().size();
    fs::path copy = scratch / fmt::format("h{}.json", i);
    std::ofstream(copy, std::ios::binary) << headers.back();
    headers.back().append(ck::kHeaderPaddingBytes, ' ');
    python_files += " '" + copy.string() + "'";
  }

  // Shards in parallel, as read_checkpoint reads them (one task per shard).
  const int threads = static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 8u));
  uint64_t tensors = 0;
  auto parse_all = [&](int thread_count) {
    std::vector<uint64_t> counts(headers.size());
    kvaudit::run_on_threads(headers.size(), thread_count, [&](size_t i) {
      CountTensors count;
      std::string_view json(headers[i].data(), headers[i].size() - ck::kHeaderPaddingBytes);
      ck::visit_safetensors_header(json, ~0ull >> 1, "bench", count);
      counts[i] = count.tensors;
      return true;
    });
    tensors = 0;
    for (uint64_t count : counts) tensors += count;
  };

  // The baseline: json.loads over the same bytes, already in memory; only the loads is timed.
  fs::path script_path = scratch / "baseline.py";
  std::ofstream(script_path) << "import json,sys,time\n"
                                "data=[open(p,'rb').read() for p in sys.argv[1:]]\n"
                                "t=time.perf_counter()\n"
                                "n=sum(len(json.loads(d)) for d in data)\n"
                                "print(time.perf_counter()-t)\n";
  const std::string command = "/usr/bin/python3 '" + script_path.string() + "'" + python_files;
  auto python_once = [&]() -> double {
    FILE* pipe = ::popen(command.c_str(), "r");
    double seconds = 0;
    bool ok = pipe && std::fscanf(pipe, "%lf", &seconds) == 1;
    if (pipe) ::pclose(pipe);
    if (!ok) {
      std::cerr << "bench_check: could not run the Python baseline\n";
      std::exit(1);
    }
    return seconds;
  };

  parse_all(threads);  // warm: the parsers' buffers, the page cache
  std::vector<double> ours, python, one_thread, full;
  for (int round = 0; round < rounds; ++round) {
    ours.push_back(wall_seconds([&] { parse_all(threads); }));
    python.push_back(python_once());
    one_thread.push_back(wall_seconds([&] { parse_all(1); }));
    full.push_back(wall_seconds([&] { ck::read_checkpoint(dir); }));
  }
  fs::remove_all(scratch);

  const double ours_s = median(ours), python_s = median(python), one_s = median(one_thread);
  fmt::print("checkpoint: {} ({} shards, {} tensors, {:.1f} MB of headers), {} rounds, medians\n",
             dir.string(), shards.size(), tensors, header_bytes / 1e6, rounds);
  fmt::print("kvaudit header parse+validate, {} threads: {:6.1f} ms ({:.0f} MB/s)\n", threads,
             ours_s * 1e3, header_bytes / ours_s / 1e6);
  fmt::print("kvaudit header parse+validate, 1 thread:  {:6.1f} ms ({:.0f} MB/s)\n", one_s * 1e3,
             header_bytes / one_s / 1e6);
  fmt::print("python json.loads (baseline, 1 thread):   {:6.1f} ms ({:.0f} MB/s)\n", python_s * 1e3,
             header_bytes / python_s / 1e6);
  fmt::print("ratio (python / kvaudit, {} threads): {:.1f}x  (target >= 25x); 1 thread: {:.1f}x\n",
             threads, python_s / ours_s, python_s / one_s);
  fmt::print("read_checkpoint end to end (configs, index, headers, key norms): {:.1f} ms\n",
             median(full) * 1e3);
  return 0;
}
