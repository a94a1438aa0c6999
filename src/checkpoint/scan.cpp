// The fast readers of a checkpoint's JSON: safetensors headers and the index, parsed with
// simdjson On-Demand straight from read-only mappings of the files, with no copy of the text,
// no DOM and no allocation per tensor. A 400B MoE's headers hold ~400K entries and its index
// ~40 MB. Each reader hands any input it does not accept to the DOM reference reader
// (safetensors.cpp, checkpoint.cpp), which then decides and words the error: the two accept
// the same inputs and report the same problems, and the error paths stay in one place.
#include <fcntl.h>
#include <fmt/format.h>
#include <simdjson.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>
#include <utility>

#include "checkpoint/internal.h"
#include "util/util.h"

namespace kvaudit::checkpoint {

namespace ondemand = simdjson::ondemand;

MappedPrefix::MappedPrefix(int fd, uint64_t bytes, uint64_t file_bytes, const std::string& label)
    : bytes_(bytes) {
  const uint64_t wanted = bytes + kHeaderPaddingBytes;
  // MAP_POPULATE: every page of the text is read, so map them in one call rather than
  // taking a fault per page (or per fault-around block).
  if (file_bytes >= wanted) {
    mapped_bytes_ = wanted;
    void* at = ::mmap(nullptr, wanted, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
    if (at == MAP_FAILED)
      throw InputError(label, fmt::format("cannot map: {}", std::strerror(errno)));
    base_ = static_cast<char*>(at);
    return;
  }
  // The file ends inside the padding: reserve zeroed anonymous pages for text and padding,
  // then map the file over their start. The rest of the file's last page reads as zeros.
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  mapped_bytes_ = (wanted + page - 1) / page * page;
  void* at = ::mmap(nullptr, mapped_bytes_, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (at == MAP_FAILED)
    throw InputError(label, fmt::format("cannot map: {}", std::strerror(errno)));
  base_ = static_cast<char*>(at);
  if (file_bytes > 0 && ::mmap(at, file_bytes, PROT_READ, MAP_PRIVATE | MAP_FIXED | MAP_POPULATE,
                               fd, 0) == MAP_FAILED) {
    int error = errno;
    ::munmap(base_, mapped_bytes_);
    throw InputError(label, fmt::format("cannot map: {}", std::strerror(error)));
  }
}

MappedPrefix::~MappedPrefix() {
  ::munmap(base_, mapped_bytes_);
}

MappedHeader::MappedHeader(const std::filesystem::path& file) : file_(file), label_(file.string()) {
  std::error_code ec;
  if (!std::filesystem::exists(file, ec)) throw InputError(label_, "no such file");
  if (std::filesystem::is_directory(file, ec))
    throw InputError(label_, "is a directory, expected a file");
  fd_ = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw InputError(label_, fmt::format("cannot open: {}", std::strerror(errno)));
  struct stat status {};
  if (::fstat(fd_, &status) != 0) throw InputError(label_, "cannot read file size");
  file_bytes_ = static_cast<uint64_t>(status.st_size);
  if (file_bytes_ < 8)
    throw InputError(label_, fmt::format("truncated: {} bytes, a safetensors file starts with "
                                         "an 8-byte header length",
                                         file_bytes_));
  unsigned char prefix[8];
  if (::pread(fd_, prefix, 8, 0) != 8) throw InputError(label_, "cannot read header length");
  for (int i = 7; i >= 0; --i) header_bytes_ = (header_bytes_ << 8) | prefix[i];  // little-endian
  if (header_bytes_ == 0) throw InputError(label_, "safetensors header length is 0");
  if (header_bytes_ > kMaxHeaderBytes)
    throw InputError(label_, fmt::format("safetensors header length {} exceeds the format's 100 "
                                         "MB limit (not a safetensors file?)",
                                         header_bytes_));
  if (header_bytes_ > file_bytes_ - 8)
    throw InputError(
        label_, fmt::format("truncated: header length {} runs past the end of the {}-byte file",
                            header_bytes_, file_bytes_));
  mapping_ = std::make_unique<MappedPrefix>(fd_, 8 + header_bytes_, file_bytes_, label_);
}

MappedHeader::~MappedHeader() {
  mapping_.reset();
  if (fd_ >= 0) ::close(fd_);
}

SafetensorsHeader MappedHeader::sizes() const {
  SafetensorsHeader header;
  header.file = file_;
  header.file_bytes = file_bytes_;
  header.header_bytes = header_bytes_;
  return header;
}

void MappedHeader::visit(HeaderVisitor& visitor) const {
  visit_safetensors_header(json(), file_bytes_ - 8 - header_bytes_, label_, visitor);
}

namespace {

// True when nothing follows the root value (the DOM rejects trailing content).
bool at_end(ondemand::document& doc) {
  return doc.current_location().error() == simdjson::OUT_OF_BOUNDS;
}

// A key read in place, without a copy: the common layout `"name":{` with no escape in the
// name. False for anything else (the caller unescapes).
bool raw_key(ondemand::field& field, std::string_view& name) {
  const char* begin = field.key().raw();
  const char* value = field.value().raw_json_token().data();
  if (value - begin < 2 || value[-1] != ':' || value[-2] != '"') return false;
  name = std::string_view(begin, static_cast<size_t>(value - 2 - begin));
  return std::memchr(name.data(), '\\', name.size()) == nullptr;
}

struct ByteSpan {
  uint64_t begin, end;
};

// One entry's "shape": non-negative integers, at most TensorShape::kMaxRank of them.
bool read_shape(ondemand::value value, TensorShape& shape) {
  ondemand::array dims;
  if (value.get_array().get(dims) != simdjson::SUCCESS) return false;
  for (auto dim_result : dims) {
    uint64_t dim;
    if (dim_result.get_uint64().get(dim) != simdjson::SUCCESS || shape.full()) return false;
    shape.push_back(dim);
  }
  return true;
}

bool read_offsets(ondemand::value value, uint64_t& begin, uint64_t& end) {
  ondemand::array offsets;
  if (value.get_array().get(offsets) != simdjson::SUCCESS) return false;
  size_t count = 0;
  for (auto offset_result : offsets) {
    uint64_t offset;
    if (offset_result.get_uint64().get(offset) != simdjson::SUCCESS || count == 2) return false;
    (count++ == 0 ? begin : end) = offset;
  }
  return count == 2;
}

// The checks parse_safetensors_header_reference makes on one entry, as a yes or no.
bool entry_is_valid(const TensorView& tensor, uint64_t data_bytes) {
  if (tensor.data_begin > tensor.data_end || tensor.data_end > data_bytes) return false;
  uint64_t elements = 1;
  for (uint64_t dim : tensor.shape)
    if (__builtin_mul_overflow(elements, dim, &elements)) return false;
  uint64_t bits;
  if (__builtin_mul_overflow(elements, uint64_t{dtype_bits(tensor.dtype)}, &bits)) return false;
  return bits % 8 == 0 && bits / 8 == tensor.data_end - tensor.data_begin;
}

// One tensor entry's object: exactly the members dtype, shape and data_offsets (a key spelt
// with escapes is left to the reference reader).
bool read_entry(ondemand::object entry, TensorView& tensor) {
  bool have_dtype = false, have_shape = false, have_offsets = false;
  for (auto member_result : entry) {
    ondemand::field member;
    if (std::move(member_result).get(member) != simdjson::SUCCESS) return false;
    ondemand::raw_json_string key = member.key();
    if (key == "dtype") {
      std::string_view text;
      if (member.value().get_string().get(text) != simdjson::SUCCESS) return false;
      // simdjson's string buffer has its padding after every string it holds.
      if (!find_dtype_padded(text.data(), text.size(), tensor.dtype)) return false;
      have_dtype = true;
    } else if (key == "shape") {  // a repeated "shape" appends, as in the reference
      if (!read_shape(member.value(), tensor.shape)) return false;
      have_shape = true;
    } else if (key == "data_offsets") {
      if (!read_offsets(member.value(), tensor.data_begin, tensor.data_end)) return false;
      have_offsets = true;
    } else {
      return false;
    }
  }
  return have_dtype && have_shape && have_offsets;
}

bool spans_disjoint(std::vector<ByteSpan>& spans) {
  if (!std::is_sorted(spans.begin(), spans.end(),
                      [](const ByteSpan& a, const ByteSpan& b) { return a.begin < b.begin; }))
    std::sort(spans.begin(), spans.end(), [](const ByteSpan& a, const ByteSpan& b) {
      return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
  for (size_t i = 1; i < spans.size(); ++i)
    if (spans[i].begin < spans[i - 1].end && spans[i].end > spans[i].begin) return false;
  return true;
}

// Starts On-Demand over `padded` (followed by kHeaderPaddingBytes readable bytes) and opens
// its top-level object; false when it is not one (the reference parser then says why).
bool open_root_object(ondemand::parser& parser, std::string_view padded, ondemand::document& doc,
                      ondemand::object& root) {
  return parser.iterate(padded.data(), padded.size(), padded.size() + kHeaderPaddingBytes)
                 .get(doc) == simdjson::SUCCESS &&
         doc.get_object().get(root) == simdjson::SUCCESS;
}

// The fast reader: true when the header is valid and every entry was visited; false when it
// gives up (the reference reader then decides). One parser and one span list per thread
// keep their buffers across the shards of a checkpoint.
bool visit_fast(std::string_view padded_json, uint64_t data_bytes, HeaderVisitor& visitor) {
  thread_local ondemand::parser parser;
  thread_local std::vector<ByteSpan> spans;
  spans.clear();
  // Shards' headers differ by a few bytes, and simdjson reallocates (fresh pages, faulted in
  // again) whenever one is longer than the last: grow in whole MiB instead.
  if (parser.capacity() < padded_json.size()) {
    constexpr size_t kStep = size_t{1} << 20;
    if (parser.allocate((padded_json.size() + kStep - 1) / kStep * kStep) != simdjson::SUCCESS)
      return false;
  }
  ondemand::document doc;
  ondemand::object root;
  if (!open_root_object(parser, padded_json, doc, root)) return false;
  TensorView tensor;  // one for every entry: constructing a TensorShape zeroes 64 bytes
  for (auto field_result : root) {
    ondemand::field field;
    std::string_view name;
    ondemand::object entry;
    if (std::move(field_result).get(field) != simdjson::SUCCESS) return false;
    if (!raw_key(field, name) && field.unescaped_key().get(name) != simdjson::SUCCESS) return false;
    if (field.value().get_object().get(entry) != simdjson::SUCCESS) return false;
    if (name == "__metadata__") {
      for (auto meta_result : entry) {
        ondemand::field meta;
        std::string_view key, value;
        if (std::move(meta_result).get(meta) != simdjson::SUCCESS ||
            meta.unescaped_key().get(key) != simdjson::SUCCESS ||
            meta.value().get_string().get(value) != simdjson::SUCCESS)
          return false;
        visitor.metadata(key, value);
      }
      continue;
    }
    tensor.name = name;
    tensor.shape.clear();
    if (!read_entry(entry, tensor) || !entry_is_valid(tensor, data_bytes)) return false;
    spans.push_back({tensor.data_begin, tensor.data_end});
    visitor.tensor(tensor);
  }
  return at_end(doc) && spans_disjoint(spans);
}

}  // namespace

void visit_safetensors_header(std::string_view padded_json, uint64_t data_bytes,
                              const std::string& label, HeaderVisitor& visitor) {
  visitor.begin();
  if (visit_fast(padded_json, data_bytes, visitor)) return;
  // Throws the reference's error; when it accepts what the fast reader would not (an escaped
  // member key, "-0" as a dimension), its entries are visited instead.
  SafetensorsHeader header =
      parse_safetensors_header_reference(padded_json, data_bytes, label, true);
  visitor.begin();
  for (const auto& [key, value] : header.metadata) visitor.metadata(key, value);
  for (const TensorInfo& info : header.tensors)
    visitor.tensor({info.name, info.dtype, info.shape, info.data_begin, info.data_end});
}

namespace {

// Validates a value the index reader does not use (its "metadata", other members) as fully as
// the DOM parser would, so that both accept the same files; depth bounded like the DOM's.
bool validate_value(ondemand::value value, int depth) {
  if (depth > 1024) return false;
  ondemand::json_type type;
  if (value.type().get(type) != simdjson::SUCCESS) return false;
  switch (type) {
    case ondemand::json_type::object: {
      ondemand::object object;
      if (value.get_object().get(object) != simdjson::SUCCESS) return false;
      for (auto field_result : object) {
        ondemand::field field;
        std::string_view key;
        if (std::move(field_result).get(field) != simdjson::SUCCESS ||
            field.unescaped_key().get(key) != simdjson::SUCCESS ||
            !validate_value(field.value(), depth + 1))
          return false;
      }
      return true;
    }
    case ondemand::json_type::array: {
      ondemand::array array;
      if (value.get_array().get(array) != simdjson::SUCCESS) return false;
      for (auto element : array)
        if (element.error() != simdjson::SUCCESS ||
            !validate_value(element.value_unsafe(), depth + 1))
          return false;
      return true;
    }
    case ondemand::json_type::string: {
      std::string_view text;
      return value.get_string().get(text) == simdjson::SUCCESS;
    }
    case ondemand::json_type::number: {
      ondemand::number number;
      return value.get_number().get(number) == simdjson::SUCCESS;
    }
    case ondemand::json_type::boolean: {
      bool flag;
      return value.get_bool().get(flag) == simdjson::SUCCESS;
    }
    case ondemand::json_type::null: {
      bool null = false;
      return value.is_null().get(null) == simdjson::SUCCESS && null;
    }
  }
  return false;
}

// The weight_map: its values are the shard names, and neighbours usually share one, so a
// value whose raw text repeats the previous one is neither unescaped nor copied.
bool read_weight_map(ondemand::value value, std::set<std::string, std::less<>>& shards) {
  ondemand::object map;
  if (value.get_object().get(map) != simdjson::SUCCESS) return false;
  std::string_view last_token;
  for (auto entry_result : map) {
    ondemand::field entry;
    if (std::move(entry_result).get(entry) != simdjson::SUCCESS) return false;
    const char* key_begin = entry.key().raw();
    std::string_view token = entry.value().raw_json_token();
    // The tensor name is not used, but an escape in it must be valid for the DOM to accept it.
    std::string_view key_text(key_begin, static_cast<size_t>(token.data() - key_begin));
    if (key_text.find('\\') != std::string_view::npos) {
      std::string_view key;
      if (entry.unescaped_key().get(key) != simdjson::SUCCESS) return false;
    }
    while (!token.empty() && (token.back() == ' ' || token.back() == '\n' || token.back() == '\r' ||
                              token.back() == '\t'))
      token.remove_suffix(1);
    if (!last_token.empty() && token == last_token) continue;  // a string already validated
    std::string_view shard;
    if (entry.value().get_string().get(shard) != simdjson::SUCCESS) return false;
    if (shard.find('/') != std::string_view::npos || shard == ".." || shard.empty()) return false;
    if (shards.find(shard) == shards.end()) shards.emplace(shard);
    last_token = token;
  }
  return true;
}

bool index_shards_fast(std::string_view padded_text, std::set<std::string, std::less<>>& shards) {
  ondemand::parser parser;
  ondemand::document doc;
  ondemand::object root;
  if (!open_root_object(parser, padded_text, doc, root)) return false;
  bool have_map = false;
  for (auto field_result : root) {
    ondemand::field field;
    std::string_view key;
    if (std::move(field_result).get(field) != simdjson::SUCCESS ||
        field.unescaped_key().get(key) != simdjson::SUCCESS)
      return false;
    // The DOM reader takes the first weight_map, as a lookup by key does.
    if (key == "weight_map" && !have_map) {
      if (!read_weight_map(field.value(), shards)) return false;
      have_map = true;
    } else if (!validate_value(field.value(), 1)) {
      return false;
    }
  }
  return have_map && at_end(doc);
}

}  // namespace

std::vector<std::string> index_shard_names(std::string_view padded_text, const std::string& where) {
  std::set<std::string, std::less<>> shards;
  if (!index_shards_fast(padded_text, shards)) {
    // The reference reader throws the error; when it accepts, its names are the answer.
    shards.clear();
    read_safetensors_index(padded_text, where, [&](std::string_view, std::string_view shard) {
      if (shards.find(shard) == shards.end()) shards.emplace(shard);
    });
  }
  return {shards.begin(), shards.end()};
}

std::vector<std::string> read_index_shard_names(const std::filesystem::path& index) {
  // The checks and messages of read_text_file, which read the index before it was mapped.
  const std::string label = index.string();
  std::error_code ec;
  auto status = std::filesystem::status(index, ec);
  if (ec || !std::filesystem::exists(status)) throw InputError(label, "no such file");
  if (std::filesystem::is_directory(status))
    throw InputError(label, "is a directory, expected a file");
  int fd = ::open(index.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw InputError(label, fmt::format("cannot open: {}", std::strerror(errno)));
  struct stat file_status {};
  if (::fstat(fd, &file_status) != 0) {
    ::close(fd);
    throw InputError(label, "cannot read file size");
  }
  const uint64_t bytes = static_cast<uint64_t>(file_status.st_size);
  if (bytes > kMaxIndexBytes) {
    ::close(fd);
    throw InputError(label, fmt::format("file is {} bytes, more than the {} this reader accepts",
                                        bytes, kMaxIndexBytes));
  }
  std::unique_ptr<MappedPrefix> mapping;
  try {
    mapping = std::make_unique<MappedPrefix>(fd, bytes, bytes, label);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);  // the mapping keeps the file
  return index_shard_names(mapping->text(), label);
}

}  // namespace kvaudit::checkpoint
