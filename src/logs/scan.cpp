// logs scan: streams a log in blocks and finds the few lines that matter with a
// sampled 4-gram filter (every pattern is at least kMinPattern bytes long, so one
// 4-gram of any occurrence falls on a sampled position; a 64 Kbit table rejects
// almost every sample). Only candidate lines are normalised and parsed. Memory is
// one block plus one line cap, whatever the size of the log.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <sstream>

#include "logs/logs.h"
#include "logs/parse.h"
#include "util/util.h"

namespace kvaudit::logs {

namespace {

constexpr size_t kMinPattern = 7;
constexpr size_t kStride = kMinPattern - 3;
constexpr size_t kBlockBytes = 1 << 20;

uint32_t load32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint32_t hash16(uint32_t w) {
  return (w * 2654435761u) >> 16;
}

}  // namespace

// (Outside the anonymous namespace: LogStream's state, declared in logs.h, holds one.)
class PatternFilter {
 public:
  // Built once per pattern list (shared_filter): the entries (a few thousand 4-grams) are
  // sorted by hash rather than pushed into 65,536 bucket vectors.
  explicit PatternFilter(std::vector<std::string> texts)
      : patterns_(std::move(texts)), bits_(1 << 10, 0), bucket_begin_((1 << 16) + 1, 0) {
    const auto& patterns = patterns_;
    std::vector<std::pair<uint32_t, Entry>> hashed;
    for (size_t p = 0; p < patterns.size(); ++p) {
      const std::string& text = patterns[p];
      max_len_ = std::max(max_len_, text.size());
      for (size_t j = 0; j + 4 <= text.size(); ++j) {
        uint32_t h = hash16(load32(text.data() + j));
        bits_[h >> 6] |= uint64_t{1} << (h & 63);
        hashed.push_back({h, {static_cast<uint16_t>(p), static_cast<uint16_t>(j)}});
      }
    }
    // Stable: within a bucket, entries keep pattern order (the first pattern found wins).
    std::stable_sort(hashed.begin(), hashed.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    entries_.reserve(hashed.size());
    for (const auto& [h, entry] : hashed) {
      ++bucket_begin_[h + 1];
      entries_.push_back(entry);
    }
    for (size_t h = 0; h < (1u << 16); ++h) bucket_begin_[h + 1] += bucket_begin_[h];
  }

  const std::vector<std::string>& patterns() const { return patterns_; }
  size_t max_len() const { return max_len_; }
  // Exact (find() verifies what it samples): one hashed pass, not a search per pattern.
  bool line_matches(std::string_view line) const {
    return line.size() >= 4 && find(line.data(), line.size(), 0).first != std::string::npos;
  }

  // First sample position >= from where a pattern occurrence starting at or after
  // `from` verifies; returns {sample, start} or {npos, npos}.
  std::pair<size_t, size_t> find(const char* data, size_t size, size_t from) const {
    const auto& patterns = patterns_;
    for (size_t i = from; i + 4 <= size; i += kStride) {
      uint32_t h = hash16(load32(data + i));
      if (!(bits_[h >> 6] >> (h & 63) & 1)) continue;
      for (uint32_t k = bucket_begin_[h]; k < bucket_begin_[h + 1]; ++k) {
        const Entry& e = entries_[k];
        if (i < from + e.offset) continue;
        size_t start = i - e.offset;
        const std::string& p = patterns[e.pattern];
        if (start + p.size() <= size && std::memcmp(data + start, p.data(), p.size()) == 0)
          return {i, start};
      }
    }
    return {std::string::npos, std::string::npos};
  }

 private:
  struct Entry {
    uint16_t pattern;
    uint16_t offset;
  };
  std::vector<std::string> patterns_;
  std::vector<uint64_t> bits_;
  std::vector<uint32_t> bucket_begin_;
  std::vector<Entry> entries_;
  size_t max_len_ = 0;
};

namespace {

// The filter for the registry's patterns, built once per process for each pattern list (a
// scan of a short log, as watch and the fuzzer run, spent most of its time building it).
// Keyed by the patterns themselves, not the registry's address: a registry loaded later at
// the same address may hold other templates.
std::shared_ptr<const PatternFilter> shared_filter(const engines::Registry& registry) {
  static std::mutex mutex;
  static std::vector<std::shared_ptr<const PatternFilter>> cache;  // newest last
  constexpr size_t kMaxCached = 4;
  std::vector<std::string> patterns = scan_patterns(registry);
  std::lock_guard lock(mutex);
  for (auto it = cache.begin(); it != cache.end(); ++it)
    if ((*it)->patterns() == patterns) {
      std::shared_ptr<const PatternFilter> found = *it;
      cache.erase(it);
      cache.push_back(found);
      return found;
    }
  if (cache.size() == kMaxCached) cache.erase(cache.begin());
  cache.push_back(std::make_shared<const PatternFilter>(std::move(patterns)));
  return cache.back();
}

// Scans complete lines in [data, data + size) (size ends after a '\n' or at EOF).
class BlockScanner {
 public:
  BlockScanner(const engines::Registry& registry, LaunchBuilder& builder)
      : builder_(builder), filter_(shared_filter(registry)) {}

  void scan(const char* data, size_t size) {
    const PatternFilter& f = *filter_;
    size_t pos = 0, counted = 0;
    while (pos < size) {
      auto [sample, start] = f.find(data, size, pos);
      if (sample == std::string::npos) break;
      // Any earlier occurrence would have been caught at an earlier sample unless it
      // lies within max_len of this one: recheck those lines exactly.
      size_t back = sample > pos + f.max_len() ? sample - f.max_len() : pos;
      size_t line_begin = back;
      while (line_begin > pos && data[line_begin - 1] != '\n') --line_begin;
      const char* stop_nl = static_cast<const char*>(std::memchr(data + start, '\n', size - start));
      size_t stop = stop_nl ? static_cast<size_t>(stop_nl - data) : size;
      while (line_begin <= stop && line_begin < size) {
        const char* nl =
            static_cast<const char*>(std::memchr(data + line_begin, '\n', size - line_begin));
        size_t line_end = nl ? static_cast<size_t>(nl - data) : size;
        std::string_view line(data + line_begin, line_end - line_begin);
        if (f.line_matches(line)) {
          line_no_ += std::count(data + counted, data + line_begin, '\n');
          counted = line_begin;
          builder_.handle(line, line_no_ + 1);
          ++matched_;
        }
        line_begin = line_end + 1;
      }
      pos = line_begin;
    }
    line_no_ += std::count(data + counted, data + size, '\n');
  }

  void add_lines(int64_t n) { line_no_ += n; }
  int64_t lines() const { return line_no_; }
  int64_t matched() const { return matched_; }

 private:
  LaunchBuilder& builder_;
  std::shared_ptr<const PatternFilter> filter_;  // from the engine data's log templates
  int64_t line_no_ = 0;
  int64_t matched_ = 0;
};

using ReadFn = std::function<size_t(char*, size_t)>;

// `most_bytes`, when the input's size is known in advance (a text in memory), sizes the buffer
// to it: a short log no longer costs a 2 MiB allocation.
LogScan scan_stream(const engines::Registry& registry, const ReadFn& read, const std::string& label,
                    const ScanOptions& options,
                    size_t most_bytes = std::numeric_limits<size_t>::max()) {
  LaunchBuilder builder(registry, options.max_launches, options.kv_policy);
  BlockScanner scanner(registry, builder);
  LogScan result;
  result.source = label;
  const size_t cap = std::max<size_t>(options.max_line_bytes, 4096);
  // The carry is under `cap` and under the bytes read so far; a read adds at most `block`.
  const size_t block = std::clamp<size_t>(most_bytes, 1, kBlockBytes);
  // Not zeroed: a short log touches a few pages of it, not 2 MiB.
  std::unique_ptr<char[]> buffer(new char[block + std::min(cap, most_bytes) + 1]);
  size_t carry = 0;
  bool skipping = false;  // inside the tail of an over-long line
  bool first = true;
  for (;;) {
    size_t n = read(buffer.get() + carry, block);
    if (first) {
      first = false;
      size_t probe = std::min<size_t>(n, 65536);
      if (std::memchr(buffer.get(), '\0', probe) != nullptr)
        throw InputError(label, "binary data (NUL bytes), not a text log");
    }
    result.bytes += n;
    if (n == 0) break;
    char* data = buffer.get();
    size_t size = carry + n;
    size_t begin = 0;
    if (skipping) {
      const char* nl = static_cast<const char*>(std::memchr(data, '\n', size));
      if (!nl) {
        carry = 0;
        continue;
      }
      begin = static_cast<size_t>(nl - data) + 1;
      scanner.add_lines(1);
      skipping = false;
    }
    const char* last_nl =
        size > begin ? static_cast<const char*>(::memrchr(data + begin, '\n', size - begin))
                     : nullptr;
    if (last_nl) {
      size_t complete = static_cast<size_t>(last_nl - data) + 1;
      scanner.scan(data + begin, complete - begin);
      carry = size - complete;
      std::memmove(data, data + complete, carry);
    } else {
      carry = size - begin;
      if (begin > 0) std::memmove(data, data + begin, carry);
    }
    if (carry >= cap) {
      // A line longer than the cap: read its first `cap` bytes, skip the rest.
      scanner.scan(data, cap);
      ++result.truncated_lines;
      carry = 0;
      skipping = true;
    }
  }
  if (carry > 0 && !skipping) {
    scanner.scan(buffer.get(), carry);
    scanner.add_lines(1);
  }
  result.lines = scanner.lines();
  result.matched_lines = scanner.matched();
  builder.finish(result);
  if (result.bytes == 0) throw InputError(label, "empty log");
  return result;
}

}  // namespace

struct LogStream::State {
  State(const engines::Registry& engines, std::string source, const ScanOptions& options)
      : registry(engines),
        label(std::move(source)),
        max_line_bytes(std::max<size_t>(options.max_line_bytes, 4096)),
        builder(engines, options.max_launches, options.kv_policy),
        filter(shared_filter(engines)) {}
  const engines::Registry& registry;
  std::string label;
  size_t max_line_bytes;
  LaunchBuilder builder;
  std::shared_ptr<const PatternFilter> filter;
  int64_t lines = 0, matched = 0, truncated = 0;
  uint64_t bytes = 0;
};

LogStream::LogStream(const engines::Registry& registry, std::string label,
                     const ScanOptions& options)
    : state_(std::make_unique<State>(registry, std::move(label), options)) {}
LogStream::~LogStream() = default;

bool LogStream::add_line(std::string_view line) {
  State& s = *state_;
  ++s.lines;
  s.bytes += line.size() + 1;
  if (!line.empty() && line.back() == '\n') line.remove_suffix(1);
  if (line.size() > s.max_line_bytes) {
    line = line.substr(0, s.max_line_bytes);
    ++s.truncated;
  }
  // The sampled 4-gram filter verifies what it finds (every pattern is longer than its
  // stride, so one sample falls on any occurrence): a miss means no pattern is in the line.
  if (!s.filter->line_matches(line)) return false;
  s.builder.handle(line, s.lines);
  ++s.matched;
  return true;
}

LogScan LogStream::snapshot() const {
  const State& s = *state_;
  LaunchBuilder builder = s.builder;  // finish() resolves a copy: the stream goes on
  LogScan scan;
  scan.source = s.label;
  scan.bytes = s.bytes;
  scan.lines = s.lines;
  scan.matched_lines = s.matched;
  scan.truncated_lines = s.truncated;
  builder.finish(scan);
  return scan;
}

std::optional<Launch> LogStream::latest() const {
  return state_->builder.latest();
}

int64_t LogStream::lines() const {
  return state_->lines;
}

LogScan scan_log(const engines::Registry& registry, std::istream& in, const std::string& label,
                 const ScanOptions& options) {
  return scan_stream(
      registry,
      [&](char* out, size_t n) {
        in.read(out, static_cast<std::streamsize>(n));
        return static_cast<size_t>(in.gcount());
      },
      label, options);
}

LogScan scan_log_file(const engines::Registry& registry, const std::filesystem::path& path,
                      const ScanOptions& options) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) throw InputError(path.string(), "no such file");
  if (std::filesystem::is_directory(path, ec))
    throw InputError(path.string(), "is a directory, expected a log file");
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (!file) throw InputError(path.string(), std::string("cannot open: ") + std::strerror(errno));
  struct Closer {
    std::FILE* f;
    ~Closer() { std::fclose(f); }
  } closer{file};
  return scan_stream(
      registry, [&](char* out, size_t n) { return std::fread(out, 1, n, file); }, path.string(),
      options);
}

LogScan scan_log_text(const engines::Registry& registry, std::string_view text,
                      const std::string& label) {
  size_t offset = 0;
  return scan_stream(
      registry,
      [&](char* out, size_t n) {
        size_t take = std::min(n, text.size() - offset);
        std::memcpy(out, text.data() + offset, take);
        offset += take;
        return take;
      },
      label, ScanOptions{}, text.size());
}

}  // namespace kvaudit::logs
