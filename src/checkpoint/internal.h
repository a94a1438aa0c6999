// checkpoint/internal.h: what the module's files share and no other module uses: read-only
// file mappings with simdjson's padding, and the header visitor that the whole-checkpoint
// reader uses instead of building a SafetensorsHeader per shard.
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint/checkpoint.h"

namespace kvaudit::checkpoint {

// text ends with suffix: a compare of constant length that the compiler inlines, where
// string_view::ends_with calls memcmp (a tenth of a 400K-name scan went into those calls).
template <size_t N>
bool has_suffix(std::string_view text, const char (&suffix)[N]) {
  return text.size() >= N - 1 &&
         std::memcmp(text.data() + text.size() - (N - 1), suffix, N - 1) == 0;
}

// parse_dtype for a name with 8 readable bytes at text (a parser buffer or padded text).
bool find_dtype_padded(const char* text, size_t size, TensorDType& dtype);

// The safetensors format caps the header at 100 MB (MAX_HEADER_SIZE in the reference crate).
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// The first `bytes` of a file mapped read-only, followed by at least kHeaderPaddingBytes
// readable bytes (simdjson reads that far past the end of its input): the file's own bytes
// where it is longer, zeros where it ends sooner (the mapping then continues with anonymous
// pages). Nothing is copied; the kernel's page cache backs the text. Unmapped on destruction,
// so the pages stop counting towards the process's resident memory.
class MappedPrefix {
 public:
  // Throws InputError(label, ...) when the file cannot be mapped.
  MappedPrefix(int fd, uint64_t bytes, uint64_t file_bytes, const std::string& label);
  ~MappedPrefix();
  MappedPrefix(const MappedPrefix&) = delete;
  MappedPrefix& operator=(const MappedPrefix&) = delete;
  std::string_view text() const { return {base_, bytes_}; }

 private:
  char* base_ = nullptr;
  uint64_t bytes_ = 0;
  uint64_t mapped_bytes_ = 0;
};

// One validated header entry. name views the header text or the parser's buffer: it is
// valid only while the visitor's tensor() runs.
struct TensorView {
  std::string_view name;
  TensorDType dtype = TensorDType::F32;
  TensorShape shape;
  uint64_t data_begin = 0;
  uint64_t data_end = 0;
};

// Receives a header's entries in file order. begin() comes first and may come a second
// time: the fast reader hands input it does not handle (escaped member keys, "-0", any error)
// to the reference reader, which then visits every entry again from the start.
class HeaderVisitor {
 public:
  virtual ~HeaderVisitor() = default;
  virtual void begin() = 0;
  virtual void metadata(std::string_view key, std::string_view value) = 0;
  virtual void tensor(const TensorView& tensor) = 0;
};

// Validates a header exactly as parse_safetensors_header_reference does (same acceptance,
// same error messages) and visits its entries. padded_json: kHeaderPaddingBytes readable bytes
// follow it. The fast path is simdjson On-Demand with no allocation per tensor.
void visit_safetensors_header(std::string_view padded_json, uint64_t data_bytes,
                              const std::string& label, HeaderVisitor& visitor);

// A .safetensors file opened for a header read: its size, its 8-byte length prefix checked,
// and the header mapped with padding. Throws InputError(label, ...) for the problems
// read_safetensors_header reports (missing, a directory, truncated, a bad length).
class MappedHeader {
 public:
  explicit MappedHeader(const std::filesystem::path& file);
  ~MappedHeader();
  MappedHeader(const MappedHeader&) = delete;
  MappedHeader& operator=(const MappedHeader&) = delete;
  const std::string& label() const { return label_; }
  uint64_t file_bytes() const { return file_bytes_; }
  uint64_t header_bytes() const { return header_bytes_; }
  std::string_view json() const { return mapping_->text().substr(8); }  // padded
  // A SafetensorsHeader with the file's sizes and no tensors: what read_tensor_values needs.
  SafetensorsHeader sizes() const;
  void visit(HeaderVisitor& visitor) const;

 private:
  std::filesystem::path file_;
  std::string label_;
  int fd_ = -1;
  uint64_t file_bytes_ = 0;
  uint64_t header_bytes_ = 0;
  std::unique_ptr<MappedPrefix> mapping_;
};

// The distinct shard files a safetensors index names, sorted; throws exactly what
// read_safetensors_index throws for a bad index. padded_text: kHeaderPaddingBytes readable
// bytes follow it. Reads only the weight_map's values (and validates the rest), so a 400K-entry
// index costs no string copy per entry.
std::vector<std::string> index_shard_names(std::string_view padded_text, const std::string& where);
// The same for an index file, mapped; refuses files over kMaxIndexBytes.
inline constexpr uint64_t kMaxIndexBytes = 512ull << 20;
std::vector<std::string> read_index_shard_names(const std::filesystem::path& index);

}  // namespace kvaudit::checkpoint
