// watch follow: lines from a growing file, through rotation and truncation, with one
// partial line held between reads and over-long lines cut.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

#include "watch/watch.h"

namespace kvaudit::watch {

void LineSplitter::feed(std::string_view bytes,
                        const std::function<void(std::string_view)>& on_line) {
  while (!bytes.empty()) {
    const size_t nl = bytes.find('\n');
    const std::string_view piece = bytes.substr(0, nl);
    if (skipping_) {
      if (nl == std::string_view::npos) return;
      skipping_ = false;
    } else if (partial_.size() + piece.size() > max_line_bytes_) {
      // Keep the line's first max_line_bytes (where the facts are) and drop the rest.
      partial_.append(piece.substr(0, max_line_bytes_ - partial_.size()));
      on_line(partial_);
      partial_.clear();
      skipping_ = nl == std::string_view::npos;
    } else if (nl == std::string_view::npos) {
      partial_.append(piece);
      return;
    } else if (partial_.empty()) {
      on_line(piece);
    } else {
      partial_.append(piece);
      on_line(partial_);
      partial_.clear();
    }
    if (nl == std::string_view::npos) return;
    bytes.remove_prefix(nl + 1);
  }
}

void LineSplitter::flush(const std::function<void(std::string_view)>& on_line) {
  if (!partial_.empty()) on_line(partial_);
  clear();
}

void LineSplitter::clear() {
  partial_.clear();
  skipping_ = false;
}

FileFollower::FileFollower(std::filesystem::path path, size_t max_line_bytes)
    : path_(std::move(path)), splitter_(max_line_bytes) {}

FileFollower::~FileFollower() {
  if (fd_ >= 0) ::close(fd_);
}

FileFollower::Poll FileFollower::poll(const std::function<void(std::string_view)>& on_line,
                                      size_t max_bytes) {
  Poll result;
  auto counted = [&](std::string_view line) {
    ++result.lines;
    on_line(line);
  };
  std::vector<char> buffer(1 << 16);
  size_t budget = max_bytes;
  auto drain = [&] {
    while (budget > 0) {
      const ssize_t n = ::read(fd_, buffer.data(), std::min(buffer.size(), budget));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;
      offset_ += static_cast<uint64_t>(n);
      budget -= static_cast<size_t>(n);
      splitter_.feed(std::string_view(buffer.data(), static_cast<size_t>(n)), counted);
    }
  };
  auto open_path = [&]() -> bool {
    const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      return false;
    }
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
    offset_ = 0;
    device_ = st.st_dev;
    inode_ = st.st_ino;
    return true;
  };

  if (fd_ < 0 && !open_path()) return result;
  // Truncated in place (logrotate's copytruncate): start again from the top.
  struct stat open_st {};
  if (::fstat(fd_, &open_st) == 0 && static_cast<uint64_t>(open_st.st_size) < offset_) {
    ::lseek(fd_, 0, SEEK_SET);
    offset_ = 0;
    splitter_.clear();
    result.truncated = true;
  }
  drain();
  // Renamed or deleted and created again: the old file is read to its end (a writer may
  // have added lines before it moved to the new one), then the new one from its start.
  struct stat path_st {};
  if (::stat(path_.c_str(), &path_st) == 0) {
    result.present = true;
    if (static_cast<uint64_t>(path_st.st_dev) != device_ ||
        static_cast<uint64_t>(path_st.st_ino) != inode_) {
      splitter_.flush(counted);
      if (open_path()) {
        result.rotated = true;
        drain();
      }
    }
  }
  return result;
}

}  // namespace kvaudit::watch
