// bench_logs: how fast `kvaudit logs` streams a large journal, against
// `grep -c -E` with the same patterns on the same file, in the same run.
//   bench_logs --generate FILE SIZE   writes a journal of SIZE bytes (e.g. 1G)
//   bench_logs FILE [RUNS]            times logs::scan_log_file and grep, prints the ratio
// The generated journal is request traffic (decode batches, HTTP access lines) with a
// two-launch start-up block (tests/fixtures/logs/journal_qwen35_fp8_then_bf16.log)
// every ~64 MiB, so the scanner finds real launches among a lot of noise.
#include <fmt/format.h>
#include <sys/wait.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "logs/logs.h"
#include "util/util.h"

namespace {

using Clock = std::chrono::steady_clock;

int generate(const std::string& path, int64_t size) {
  std::string launch_block = kvaudit::read_text_file(
      std::string(KVAUDIT_SOURCE_DIR) + "/tests/fixtures/logs/journal_qwen35_fp8_then_bf16.log");
  std::FILE* out = std::fopen(path.c_str(), "wb");
  if (!out) {
    std::cerr << "cannot write " << path << "\n";
    return 2;
  }
  std::string buffer;
  buffer.reserve(1 << 22);
  int64_t written = 0, next_launch = 0;
  uint64_t state = 88172645463325252ull;
  auto rnd = [&] {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    return state;
  };
  int second = 0;
  while (written < size) {
    if (written >= next_launch) {
      buffer += launch_block;
      next_launch += int64_t{64} << 20;
    }
    ++second;
    int hh = 16 + (second / 3600) % 8, mm = (second / 60) % 60, ss = second % 60;
    std::string ts = fmt::format("Mar 07 {:02d}:{:02d}:{:02d}", hh, mm, ss);
    std::string sg = fmt::format("2026-03-07 {:02d}:{:02d}:{:02d}", hh, mm, ss);
    for (int i = 0; i < 8; ++i) {
      uint64_t r = rnd();
      if (r % 3 == 0) {
        buffer += fmt::format(
            "{} gpu-node-3 python3[90417]: [{} TP0] Decode batch, #running-req: {}, #token: {}, "
            "token "
            "usage: 0.{:02d}, cuda graph: True, gen throughput (token/s): {}.{:02d}, #queue-req: "
            "{}, \n",
            ts, sg, r % 97, r % 1500000, r % 100, 900 + r % 1500, r % 100, r % 4);
      } else if (r % 3 == 1) {
        buffer += fmt::format(
            "{} gpu-node-3 python3[90417]: [{}] INFO:     10.0.{}.{}:{} - \"POST "
            "/v1/chat/completions "
            "HTTP/1.1\" 200 OK\n",
            ts, sg, r % 7, r % 250, 40000 + r % 20000);
      } else {
        buffer += fmt::format(
            "{} gpu-node-3 python3[90417]: [{} TP0] Prefill batch, #new-seq: {}, #new-token: {}, "
            "#cached-token: {}, token usage: 0.{:02d}, #running-req: {}, #queue-req: {}, \n",
            ts, sg, 1 + r % 3, r % 8192, r % 120000, r % 100, r % 97, r % 4);
      }
    }
    if (buffer.size() > (1 << 21)) {
      std::fwrite(buffer.data(), 1, buffer.size(), out);
      written += static_cast<int64_t>(buffer.size());
      buffer.clear();
    }
  }
  std::fwrite(buffer.data(), 1, buffer.size(), out);
  std::fclose(out);
  return 0;
}

// POSIX ERE with every metacharacter escaped.
std::string ere_escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (std::string("\\.[]()*+?{}|^$").find(c) != std::string::npos) out += '\\';
    out += c;
  }
  return out;
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 4 && std::string(argv[1]) == "--generate") {
    // SIZE: bytes, or with a binary K/M/G suffix (1G = 2^30 bytes).
    std::string text = argv[3];
    int shift = 0;
    char unit = text.empty() ? '\0' : static_cast<char>(std::toupper(text.back()));
    if (unit == 'K' || unit == 'M' || unit == 'G') {
      shift = unit == 'K' ? 10 : unit == 'M' ? 20 : 30;
      text.pop_back();
    }
    int64_t bytes = std::atoll(text.c_str()) << shift;
    if (bytes <= 0) {
      std::cerr << "bad size: " << argv[3] << "\n";
      return 2;
    }
    return generate(argv[2], bytes);
  }
  if (argc < 2) {
    std::cerr << "usage: bench_logs FILE [RUNS] | bench_logs --generate FILE SIZE\n";
    return 2;
  }
  std::string path = argv[1];
  int runs = argc > 2 ? std::max(1, std::atoi(argv[2])) : 3;

  const kvaudit::engines::Registry registry = kvaudit::engines::Registry::load(kvaudit::data_dir());
  std::string pattern_file = path + ".patterns";  // beside the log, outside the repo
  {
    std::ofstream out(pattern_file);
    for (const auto& p : kvaudit::logs::scan_patterns(registry)) out << ere_escape(p) << "\n";
  }
  double best_scan = 1e9, best_grep = 1e9;
  int64_t matched = 0, grep_count = -1;
  size_t launches = 0;
  uint64_t bytes = 0;
  for (int run = 0; run < runs; ++run) {
    auto start = Clock::now();
    auto scan = kvaudit::logs::scan_log_file(registry, path);
    best_scan = std::min(best_scan, seconds_since(start));
    matched = scan.matched_lines;
    launches = scan.launches.size();
    bytes = scan.bytes;

    start = Clock::now();
    std::string command = "LC_ALL=C grep -c -E -f " + pattern_file + " '" + path + "'";
    std::FILE* pipe = popen(command.c_str(), "r");
    char line[64] = {0};
    if (pipe && std::fgets(line, sizeof line, pipe)) grep_count = std::atoll(line);
    if (pipe) pclose(pipe);
    best_grep = std::min(best_grep, seconds_since(start));
  }
  double gib = static_cast<double>(bytes) / (1 << 30);
  std::cout << fmt::format("file: {} ({:.2f} GiB), best of {} runs\n", path, gib, runs);
  std::cout << fmt::format(
      "kvaudit logs scan: {:.3f} s ({:.2f} GiB/s), {} matching lines, {} launches\n", best_scan,
      gib / best_scan, matched, launches);
  std::cout << fmt::format(
      "grep -c -E (same {} patterns, LC_ALL=C): {:.3f} s ({:.2f} GiB/s), {} matching lines\n",
      kvaudit::logs::scan_patterns(registry).size(), best_grep, gib / best_grep, grep_count);
  std::cout << fmt::format("ratio kvaudit/grep: {:.2f}x (target: within 3x)\n",
                           best_scan / best_grep);
  return best_scan <= 3 * best_grep ? 0 : 1;
}
