// util: small shared pieces every module needs: the input-error type that the CLI
// turns into a one-line message, bounded file reading, atomic output files, locating
// the data/ folder, and the thread pool callers own and pass down. Not a grab bag:
// anything module-specific lives there.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace kvaudit {

// A problem with something the user gave us (a file, a flag, a server). The CLI
// prints "kvaudit: <where>: <problem>" on one line and exits non-zero.
class InputError : public std::runtime_error {
 public:
  InputError(std::string where, std::string problem);
  const std::string& where() const { return where_; }
  const std::string& problem() const { return problem_; }

 private:
  std::string where_;
  std::string problem_;
};

// Reads a whole file, refusing (InputError) files larger than max_bytes, missing or
// unreadable files, and directories.
std::string read_text_file(const std::filesystem::path& path, uint64_t max_bytes = 64ull << 20);

// Writes content to path via a temporary file in the same folder and a rename, so
// a failure never leaves a partial file behind.
void write_file_atomically(const std::filesystem::path& path, std::string_view content);

// Bytes as GiB with two decimals, no unit ("94.57"): how SGLang prints memory and how
// plan's derivations quote it.
inline constexpr double kBytesPerGiB = 1024.0 * 1024.0 * 1024.0;
std::string gib_text(double bytes);

// Replaces every maximal ill-formed UTF-8 subsequence of `bytes` with U+FFFD (EF BF BD).
// Valid input comes back unchanged.
std::string to_valid_utf8(std::string_view bytes);
bool is_valid_utf8(std::string_view bytes);

// The folder holding engines/, gpus.json and evidence/, the first of:
//  1. $KVAUDIT_DATA_DIR when set and not empty; without engines/ it is an error, never a
//     reason to look elsewhere (an override that is ignored hides a typo);
//  2. <binary's folder>/../share/kvaudit when it holds engines/: cmake --install and the .deb
//     put the data there, so a relocated prefix (~/.local, a DESTDIR) works;
//  3. the source tree's data/ (KVAUDIT_SOURCE_DIR), only when the binary lies inside the build
//     tree it was compiled in (KVAUDIT_BINARY_DIR): the tests, benchmarks and fuzzers there.
// Anything else, an installed or copied binary without its data in particular, is an
// InputError naming the folder looked at and the variable to set (one line, exit 2): falling
// back to the build machine's checkout would hide a package that lost its data.
std::filesystem::path data_dir();
// A path as reports show it: relative to the working directory when it lies inside it
// ("data/engines/sglang.json"), else as given; reports never carry a build machine's root.
std::string display_path(const std::filesystem::path& path);

// "8k" -> 8192, "128K" -> 131072, "1m" -> 1048576, "4096" -> 4096. Binary multipliers,
// as context lengths are quoted (128K context = 131072 tokens).
std::optional<int64_t> parse_token_count(std::string_view text);

// ASCII lower case ("FLASHINFER" -> "flashinfer"); other bytes unchanged.
std::string ascii_lower(std::string_view text);

// Globs with '*' (any run of characters), compared case-insensitively.
bool glob_match(std::string_view pattern, std::string_view text);

// Splits "a,b,,c" on commas, trimming blanks and dropping empty parts.
std::vector<std::string> split_list(std::string_view text, char separator = ',');

// Formats 1234567 as "1,234,567".
std::string with_thousands(int64_t value);

// splitmix64's output function: a well-mixed 64-bit value of x, fixed by its definition.
constexpr uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A splitmix64 sequence: generated probes, cases and resamples are identical on every
// platform for a seed (std distributions are implementation-defined).
struct SplitMix64 {
  uint64_t state = 0;
  uint64_t next() {
    const uint64_t out = splitmix64(state);
    state += 0x9E3779B97F4A7C15ull;
    return out;
  }
  size_t below(size_t n) { return static_cast<size_t>(next() % n); }
  template <class List>
  const auto& pick(const List& list) {
    return list[next() % list.size()];
  }
};

// Runs body(index) for each index in [0, count) on `threads` threads started for the call (the
// caller's among them), each taking the next index from one shared counter; returns when all
// have finished. For waiting work (HTTP requests, downloads), where a thread per request in
// flight is the point; compute goes through ThreadPool. body returns false to stop handing out
// indices: those already running finish, the rest are never started. An exception escaping
// body stops the hand-out too and is rethrown here once every thread has finished.
void run_on_threads(size_t count, int threads, const std::function<bool(size_t index)>& body);

// A fixed pool of worker threads owned by the caller (cli/, tests, benchmarks), who passes it
// down: modules never start compute threads of their own. parallel_for splits [0, count) into
// `tasks` contiguous chunks (independent of the thread count) and runs body(task, begin,
// end); callers reduce per-task results in task order, so results never depend on threads.
class ThreadPool {
 public:
  explicit ThreadPool(int threads);  // threads <= 1: everything runs on the caller
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;
  int threads() const { return thread_count_; }
  void parallel_for(int64_t count, int tasks,
                    const std::function<void(int task, int64_t begin, int64_t end)>& body);

 private:
  struct State;
  int thread_count_ = 1;
  std::unique_ptr<State> state_;
};

// A PCRE2 regular expression: the project's one regex engine (std::regex is slow, recurses
// on long subjects, and its ECMAScript dialect is not the Python `re` dialect the engines'
// own patterns are written in). Byte mode: subjects are not validated as UTF-8; `$` is the
// end of the subject only (not before a final newline). Compiled
// once; JIT-compiled on the first match (an interpreter fallback if JIT is unavailable).
// Thread-safe to share once built.
class Regex {
 public:
  // Throws std::invalid_argument carrying PCRE2's message when the pattern does not compile.
  explicit Regex(std::string_view pattern);
  // Group texts of a match (index 0: the whole match; a group that took no part: nullopt),
  // viewing into the subject.
  using Groups = std::vector<std::optional<std::string_view>>;
  // The first match anywhere in subject.
  std::optional<Groups> search(std::string_view subject) const;
  // A match of the whole subject.
  std::optional<Groups> full_match(std::string_view subject) const;
  size_t group_count() const;

 private:
  std::optional<Groups> match(std::string_view subject, bool whole) const;
  struct Code;
  std::shared_ptr<const Code> code_;
};

}  // namespace kvaudit
