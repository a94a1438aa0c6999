// bench_check CHECKPOINT_DIR: parses every safetensors header of a checkpoint with
// kvaudit's reader and with Python's json module (the baseline, on the same header
// bytes, in the same run) and prints the ratio; then times a whole read_checkpoint.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "util/util.h"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

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

// CPU time of this process: the machine is shared, and CPU time is far less
// sensitive to other jobs than wall time. Python's side uses time.process_time().
double cpu_seconds() {
  timespec now;
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return double(now.tv_sec) + double(now.tv_nsec) * 1e-9;
}

template <typename F>
double best_of(int repeats, F&& body) {
  double best = 1e30;
  for (int i = 0; i < repeats; ++i) {
    double start = cpu_seconds();
    body();
    best = std::min(best, cpu_seconds() - start);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: bench_check CHECKPOINT_DIR [REPEATS]\n";
    return 2;
  }
  fs::path dir = argv[1];
  int repeats = argc > 2 ? std::max(1, std::atoi(argv[2])) : 5;
  std::vector<fs::path> shards;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().extension() == ".safetensors") shards.push_back(entry.path());
  std::sort(shards.begin(), shards.end());
  std::vector<std::string> headers;
  uint64_t header_bytes = 0;
  fs::path scratch = fs::temp_directory_path() / fmt::format("kvaudit-bench-{}", ::getpid());
  fs::create_directories(scratch);
  std::string python_files;
  for (size_t i = 0; i < shards.size(); ++i) {
    headers.push_back(read_header_bytes(shards[i]));
    header_bytes += headers.back().size();

    fs::path copy = scratch / fmt::format("h{}.json", i);
    std::ofstream(copy, std::ios::binary) << headers.back();
    // Padded like read_safetensors_header's buffer, so kvaudit parses in place.
    headers.back().append(kvaudit::checkpoint::kHeaderPaddingBytes, ' ');
    python_files += " '" + copy.string() + "'";
  }

  uint64_t tensors = 0;
  double ours = best_of(repeats, [&] {
    tensors = 0;
    for (const auto& header : headers)
      tensors += kvaudit::checkpoint::parse_safetensors_header(
                     std::string_view(header.data(),
                                      header.size() - kvaudit::checkpoint::kHeaderPaddingBytes),
                     ~0ull >> 1, "bench", true)
                     .tensors.size();
  });

  // Baseline: json.loads over the same bytes (already in memory), best of N, in Python.
  std::string script = fmt::format(
      "import json,sys,time\n"
      "data=[open(p,'rb').read() for p in sys.argv[1:]]\n"
      "best=1e30\n"
      "for _ in range({}):\n"
      "  t=time.process_time()\n"
      "  n=sum(len(json.loads(d)) for d in data)\n"
      "  best=min(best,time.process_time()-t)\n"
      "print(best)\n",
      repeats);
  fs::path script_path = scratch / "baseline.py";
  std::ofstream(script_path) << script;
  std::string command = "/usr/bin/python3 '" + script_path.string() + "'" + python_files;
  FILE* pipe = ::popen(command.c_str(), "r");
  double python_seconds = 0;
  if (!pipe || std::fscanf(pipe, "%lf", &python_seconds) != 1) {
    std::cerr << "bench_check: could not run the Python baseline\n";
    return 1;
  }
  ::pclose(pipe);

  double full =
      best_of(std::max(1, repeats / 2), [&] { kvaudit::checkpoint::read_checkpoint(dir); });
  fs::remove_all(scratch);

  fmt::print("checkpoint: {} ({} shards, {} tensors, {:.1f} MB of headers)\n", dir.string(),
             shards.size(), tensors, header_bytes / 1e6);
  fmt::print("kvaudit header parse+validate: {:.1f} ms ({:.0f} MB/s)\n", ours * 1e3,
             header_bytes / ours / 1e6);
  fmt::print("python json.loads (baseline):  {:.1f} ms ({:.0f} MB/s)\n", python_seconds * 1e3,
             header_bytes / python_seconds / 1e6);
  fmt::print("ratio (python / kvaudit): {:.1f}x  (target >= 10x)\n", python_seconds / ours);
  fmt::print("read_checkpoint end to end (configs, headers, scale scan, index): {:.1f} ms\n",
             full * 1e3);
  return 0;
}
