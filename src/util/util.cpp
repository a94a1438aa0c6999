#include "util/util.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <system_error>

namespace kvaudit {

namespace fs = std::filesystem;

InputError::InputError(std::string where, std::string problem)
    : std::runtime_error(where.empty() ? problem : where + ": " + problem),
      where_(std::move(where)),
      problem_(std::move(problem)) {}

std::string read_text_file(const fs::path& path, uint64_t max_bytes) {
  std::error_code ec;
  auto status = fs::status(path, ec);
  if (ec || !fs::exists(status)) throw InputError(path.string(), "no such file");
  if (fs::is_directory(status)) throw InputError(path.string(), "is a directory, expected a file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path.string(), fmt::format("cannot open: {}", std::strerror(errno)));
  uint64_t size = fs::file_size(path, ec);
  if (ec) throw InputError(path.string(), "cannot read file size");
  if (size > max_bytes)
    throw InputError(
        path.string(),
        fmt::format("file is {} bytes, more than the {} this reader accepts", size, max_bytes));
  std::string content(size, '\0');
  in.read(content.data(), static_cast<std::streamsize>(size));
  if (static_cast<uint64_t>(in.gcount()) != size)
    throw InputError(path.string(), "short read (file changed or unreadable)");
  return content;
}

void write_file_atomically(const fs::path& path, std::string_view content) {
  fs::path dir = path.parent_path().empty() ? fs::path(".") : path.parent_path();
  std::random_device entropy;
  fs::path temp = dir / fmt::format(".{}.tmp{}", path.filename().string(), entropy());
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    if (!out)
      throw InputError(path.string(), fmt::format("cannot write: {}", std::strerror(errno)));
    out.write(content.data(), static_cast<std::streamsize>(content.size()));
    out.flush();
    if (!out) {
      std::error_code ignored;
      fs::remove(temp, ignored);
      throw InputError(path.string(), "write failed (disk full?)");
    }
  }
  std::error_code ec;
  fs::rename(temp, path, ec);
  if (ec) {
    std::error_code ignored;
    fs::remove(temp, ignored);
    throw InputError(path.string(), "cannot replace file: " + ec.message());
  }
}

namespace {

// Whether `path` lies inside `folder` (both made canonical as far as they exist).
bool lies_within(const fs::path& path, const fs::path& folder) {
  std::error_code ec;
  const fs::path inner = fs::weakly_canonical(path, ec);
  if (ec) return false;
  const fs::path outer = fs::weakly_canonical(folder, ec);
  if (ec) return false;
  const fs::path relative = inner.lexically_relative(outer);
  return !relative.empty() && *relative.begin() != "..";
}

bool holds_engine_data(const fs::path& dir) {
  std::error_code ec;
  return fs::is_directory(dir / "engines", ec);
}

}  // namespace

fs::path data_dir() {
  static constexpr std::string_view kHint =
      "set KVAUDIT_DATA_DIR to the folder holding engines/, gpus.json and evidence/";
  if (const char* env = std::getenv("KVAUDIT_DATA_DIR"); env && *env) {
    // An explicit choice is never second-guessed by looking elsewhere.
    if (!holds_engine_data(env))
      throw InputError(fmt::format("KVAUDIT_DATA_DIR={}", env),
                       "has no engines/ folder (it must name the folder holding engines/, "
                       "gpus.json and evidence/)");
    return fs::path(env);
  }
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (ec)
    throw InputError("/proc/self/exe",
                     fmt::format("cannot locate this binary ({}); {}", ec.message(), kHint));
  fs::path installed = self.parent_path().parent_path() / "share" / "kvaudit";
  if (holds_engine_data(installed)) return installed;
  // The source tree only for a binary still in the build tree it was compiled in: an installed
  // or copied binary that read the build machine's checkout would hide a package without its
  // data (and would break the day that checkout moves).
  fs::path source = fs::path(KVAUDIT_SOURCE_DIR) / "data";
  if (lies_within(self, KVAUDIT_BINARY_DIR)) {
    if (holds_engine_data(source)) return source;
    throw InputError(source.string(), fmt::format("has no engines/ folder (the source tree of "
                                                  "this build binary; {})",
                                                  kHint));
  }
  throw InputError(installed.lexically_normal().string(),
                   fmt::format("has no engines/ folder, and {} is not a build-tree binary ({})",
                               self.string(), kHint));
}

std::string gib_text(double bytes) {
  return fmt::format("{:.2f}", bytes / kBytesPerGiB);
}

std::string display_path(const fs::path& path) {
  std::error_code ec;
  const fs::path cwd = fs::current_path(ec);
  if (ec || !path.is_absolute()) return path.string();
  const fs::path normal = path.lexically_normal();
  const fs::path relative = normal.lexically_relative(cwd);
  if (relative.empty() || *relative.begin() == "..") return normal.string();
  return relative.string();
}

std::optional<int64_t> parse_token_count(std::string_view text) {
  while (!text.empty() && text.front() == ' ') text.remove_prefix(1);
  while (!text.empty() && text.back() == ' ') text.remove_suffix(1);
  if (text.empty()) return std::nullopt;
  int64_t multiplier = 1;
  char last = text.back();
  if (last == 'k' || last == 'K') multiplier = 1024;
  if (last == 'm' || last == 'M') multiplier = int64_t{1024} * 1024;
  if (multiplier != 1) text.remove_suffix(1);
  if (text.empty() || text.size() > 12) return std::nullopt;
  int64_t value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    value = value * 10 + (c - '0');
  }
  return value * multiplier;
}

std::vector<std::string> split_list(std::string_view text, char separator) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(separator, start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view part = text.substr(start, end - start);
    while (!part.empty() && std::isspace(static_cast<unsigned char>(part.front())))
      part.remove_prefix(1);
    while (!part.empty() && std::isspace(static_cast<unsigned char>(part.back())))
      part.remove_suffix(1);
    if (!part.empty()) parts.emplace_back(part);
    start = end + 1;
  }
  return parts;
}

std::string with_thousands(int64_t value) {
  // Via unsigned: negating INT64_MIN would overflow.
  uint64_t magnitude = value < 0 ? 0 - static_cast<uint64_t>(value) : static_cast<uint64_t>(value);
  std::string digits = std::to_string(magnitude);
  std::string out;
  int count = 0;
  for (auto it = digits.rbegin(); it != digits.rend(); ++it) {
    if (count > 0 && count % 3 == 0) out.push_back(',');
    out.push_back(*it);
    ++count;
  }
  if (value < 0) out.push_back('-');
  return {out.rbegin(), out.rend()};
}

std::string ascii_lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool glob_match(std::string_view pattern, std::string_view text) {
  auto lower = [](char c) {
    return static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  };
  // Iterative '*' matcher.
  size_t p = 0, t = 0, star = std::string_view::npos, mark = 0;
  while (t < text.size()) {
    if (p < pattern.size() && pattern[p] != '*' && lower(pattern[p]) == lower(text[t])) {
      ++p, ++t;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++, mark = t;
    } else if (star != std::string_view::npos) {
      p = star + 1, t = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

}  // namespace kvaudit
