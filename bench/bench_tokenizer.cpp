// Tokenizer throughput: MB/s of encode() on real source text (the Python standard library's
// .py files, concatenated in path order) with the real Qwen3 tokenizer, single thread.
// Prints load time, a cold pass (empty piece cache) and a warm pass, and checks the
// round trip so a fast but wrong tokenizer cannot report a number.
// usage: bench_tokenizer [TOKENIZER_DIR] [SOURCE_DIR] [MAX_MB]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"
#include "util/util.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// CPU time of this thread: on a shared machine wall time also counts other processes.
double thread_cpu_seconds() {
  timespec now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9;
}

std::string concatenated_sources(const fs::path& root, size_t max_bytes) {
  std::vector<fs::path> files;
  for (const auto& entry :
       fs::recursive_directory_iterator(root, fs::directory_options::skip_permission_denied)) {
    if (entry.is_regular_file() && entry.path().extension() == ".py") files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  std::string text;
  for (const fs::path& file : files) {
    if (text.size() >= max_bytes) break;
    text += kvaudit::read_text_file(file);
  }
  if (text.size() > max_bytes) text.resize(max_bytes);
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  fs::path tokenizer_dir = argc > 1 ? fs::path(argv[1]) : fs::path(KVAUDIT_QWEN3_TOKENIZER_DIR);
  fs::path source_dir = argc > 2 ? fs::path(argv[2]) : fs::path("/usr/lib/python3.11");
  size_t max_bytes = (argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 16) << 20;
  try {
    Clock::time_point start = Clock::now();
    double cpu_start = thread_cpu_seconds();
    auto tokenizer = kvaudit::tokenizer::Tokenizer::load(tokenizer_dir);
    double load_s = seconds_since(start), load_cpu_s = thread_cpu_seconds() - cpu_start;
    std::string text = concatenated_sources(source_dir, max_bytes);
    double mb = static_cast<double>(text.size()) / 1e6;
    std::printf("tokenizer load: %.3f s wall, %.3f s cpu\ntext: %.2f MB from %s\n", load_s,
                load_cpu_s, mb, source_dir.string().c_str());
    size_t token_count = 0;
    for (const char* pass : {"cold", "warm"}) {
      start = Clock::now();
      cpu_start = thread_cpu_seconds();
      std::vector<kvaudit::tokenizer::TokenId> ids = tokenizer.encode(text);
      double encode_s = seconds_since(start), encode_cpu_s = thread_cpu_seconds() - cpu_start;
      token_count = ids.size();
      std::printf(
          "encode (%s cache): %.2f MB/s by cpu time (%.3f s), %.2f MB/s by wall time (%.3f s), "
          "%zu tokens, %.2f bytes/token\n",
          pass, mb / encode_cpu_s, encode_cpu_s, mb / encode_s, encode_s, ids.size(),
          static_cast<double>(text.size()) / static_cast<double>(ids.size()));
      if (std::string(pass) == "warm") {
        cpu_start = thread_cpu_seconds();
        std::string decoded = tokenizer.decode(ids);
        double decode_cpu_s = thread_cpu_seconds() - cpu_start;
        std::printf("decode: %.2f MB/s by cpu time (%.3f s)\n", mb / decode_cpu_s, decode_cpu_s);
        if (decoded != tokenizer.normalize(text)) {
          std::fprintf(stderr, "round trip FAILED: decode(encode(text)) != NFC(text)\n");
          return 1;
        }
      }
    }
    std::printf("round trip: ok (%zu tokens)\n", token_count);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "bench_tokenizer: %s\n", error.what());
    return 2;
  }
  return 0;
}
