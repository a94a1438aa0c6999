// Safetensors header parsing and validation, and reading of small tensors. The DOM parser
// here is the reference: it words every error, and the fast On-Demand reader (scan.cpp)
// hands it whatever it does not accept.
#include <fcntl.h>
#include <fmt/format.h>
#include <simdjson.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>

#include "checkpoint/checkpoint.h"
#include "checkpoint/internal.h"
#include "numerics/numerics.h"
#include "util/util.h"

namespace kvaudit::checkpoint {

namespace {

// A dtype's name (at most 7 characters) and its length packed into one word, so that matching
// a header's dtype against the table is a word compare per row, not a memcmp call.
constexpr uint64_t dtype_word(std::string_view name) {
  uint64_t word = uint64_t{name.size()} << 56;
  for (size_t i = 0; i < name.size() && i < 7; ++i)
    word |= uint64_t{static_cast<unsigned char>(name[i])} << (8 * i);
  return word;
}

struct DTypeRow {
  TensorDType dtype;
  std::string_view name;
  uint32_t bits;
  uint64_t word = dtype_word(name);
};
constexpr DTypeRow kDTypes[] = {
    {TensorDType::F64, "F64", 64},        {TensorDType::F32, "F32", 32},
    {TensorDType::F16, "F16", 16},        {TensorDType::BF16, "BF16", 16},
    {TensorDType::F8_E4M3, "F8_E4M3", 8}, {TensorDType::F8_E5M2, "F8_E5M2", 8},
    {TensorDType::F8_E8M0, "F8_E8M0", 8}, {TensorDType::F4, "F4", 4},
    {TensorDType::I64, "I64", 64},        {TensorDType::I32, "I32", 32},
    {TensorDType::I16, "I16", 16},        {TensorDType::I8, "I8", 8},
    {TensorDType::U64, "U64", 64},        {TensorDType::U32, "U32", 32},
    {TensorDType::U16, "U16", 16},        {TensorDType::U8, "U8", 8},
    {TensorDType::BOOL, "BOOL", 8},
};

class FileHandle {
 public:
  explicit FileHandle(const std::filesystem::path& path) : fd_(::open(path.c_str(), O_RDONLY)) {}
  ~FileHandle() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileHandle(const FileHandle&) = delete;
  FileHandle& operator=(const FileHandle&) = delete;
  int fd() const { return fd_; }

  // Reads exactly size bytes at offset or returns false.
  bool read_at(uint64_t offset, char* out, uint64_t size) const {
    uint64_t done = 0;
    while (done < size) {
      ssize_t got = ::pread(fd_, out + done, size - done, static_cast<off_t>(offset + done));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) return false;
      done += static_cast<uint64_t>(got);
    }
    return true;
  }

 private:
  int fd_;
};

[[noreturn]] void fail(const std::string& label, const std::string& problem) {
  throw InputError(label, problem);
}

}  // namespace

std::string_view dtype_name(TensorDType dtype) {
  for (const auto& row : kDTypes)
    if (row.dtype == dtype) return row.name;
  return "?";
}

namespace {

// The header walk looks up a dtype per tensor (~400K times for a large checkpoint), and the
// dtypes of neighbouring tensors differ (U8, F8_E4M3, F32, ...): a search whose length depends
// on the name mispredicted a branch or two per tensor. Instead a packed name finds its row
// through a multiplicative hash into 64 slots, the multiplier searched for at compile time so
// that no two rows share a slot.
constexpr size_t dtype_slot(uint64_t word, uint64_t multiplier) {
  return static_cast<size_t>((word * multiplier) >> 58);
}
constexpr uint64_t kDTypeHashMultiplier = [] {
  for (uint64_t multiplier = 0x9E3779B97F4A7C15ull;; multiplier += 2) {
    bool used[64] = {};
    bool distinct = true;
    for (const auto& row : kDTypes) {
      size_t slot = dtype_slot(row.word, multiplier);
      distinct = distinct && !used[slot];
      used[slot] = true;
    }
    if (distinct) return multiplier;
  }
}();
constexpr std::array<uint8_t, 64> kDTypeSlots = [] {
  std::array<uint8_t, 64> slots{};
  slots.fill(0);  // row 0 unless a row hashes there: the word compare rejects it
  for (size_t i = 0; i < std::size(kDTypes); ++i)
    slots[dtype_slot(kDTypes[i].word, kDTypeHashMultiplier)] = static_cast<uint8_t>(i);
  return slots;
}();

}  // namespace

bool find_dtype_padded(const char* text, size_t size, TensorDType& dtype) {
  if (size == 0 || size > 7) return false;
  uint64_t word;
  std::memcpy(&word, text, 8);  // little-endian: the first character in the low byte
  word = (word & (~0ull >> (64 - 8 * size))) | uint64_t{size} << 56;
  const DTypeRow& row = kDTypes[kDTypeSlots[dtype_slot(word, kDTypeHashMultiplier)]];
  dtype = row.dtype;
  return row.word == word;
}

std::optional<TensorDType> parse_dtype(std::string_view name) {
  char padded[8] = {};
  TensorDType dtype;
  if (name.empty() || name.size() > 7) return std::nullopt;
  std::memcpy(padded, name.data(), name.size());
  if (!find_dtype_padded(padded, name.size(), dtype)) return std::nullopt;
  return dtype;
}

uint32_t dtype_bits(TensorDType dtype) {
  // The table lists the dtypes in enum order.
  const auto index = static_cast<size_t>(dtype);
  return index < std::size(kDTypes) ? kDTypes[index].bits : 0;
}
static_assert([] {
  for (size_t i = 0; i < std::size(kDTypes); ++i)
    if (kDTypes[i].dtype != static_cast<TensorDType>(i) || kDTypes[i].name.size() > 7) return false;
  return true;
}());

uint64_t TensorInfo::element_count() const {
  uint64_t count = 1;
  for (uint64_t dim : shape) count *= dim;
  return count;
}

namespace {

// Spans must not overlap. Writers lay tensors out in header order, so check that first in
// one pass; sort (start, end, index) triples only when it fails.
void check_spans_disjoint(const SafetensorsHeader& header, const std::string& label) {
  struct Span {
    uint64_t begin, end;
    uint32_t index;
  };
  std::vector<Span> spans;
  spans.reserve(header.tensors.size());
  bool ordered = true;
  for (uint32_t i = 0; i < header.tensors.size(); ++i) {
    const auto& tensor = header.tensors[i];
    if (!spans.empty() && tensor.data_begin < spans.back().begin) ordered = false;
    spans.push_back({tensor.data_begin, tensor.data_end, i});
  }
  if (!ordered)
    std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
      return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
  for (size_t i = 1; i < spans.size(); ++i) {
    const Span& previous = spans[i - 1];
    const Span& current = spans[i];
    if (current.begin < previous.end && current.end > current.begin)
      fail(label,
           fmt::format("safetensors header: tensors '{}' and '{}' overlap ([{}, {}) and "
                       "[{}, {}))",
                       header.tensors[previous.index].name, header.tensors[current.index].name,
                       previous.begin, previous.end, current.begin, current.end));
  }
}

}  // namespace

SafetensorsHeader parse_safetensors_header_reference(std::string_view header_json,
                                                     uint64_t data_bytes, const std::string& label,
                                                     bool buffer_is_padded) {
  SafetensorsHeader header;
  header.header_bytes = header_json.size();
  // The DOM parser picks the best SIMD kernel at run time (AVX2/AVX-512 here); one
  // parser per thread keeps its buffers across the shards of a checkpoint.
  thread_local simdjson::dom::parser parser;
  simdjson::dom::element root_element;
  if (auto error =
          parser.parse(header_json.data(), header_json.size(), !buffer_is_padded).get(root_element))
    fail(label,
         fmt::format("safetensors header is not valid JSON ({})", simdjson::error_message(error)));
  simdjson::dom::object root;
  if (root_element.get_object().get(root) != simdjson::SUCCESS)
    fail(label, "safetensors header is not a JSON object");

  auto bad = [&](std::string_view tensor, std::string_view what) {
    fail(label, fmt::format("safetensors header: tensor '{}': {}", tensor, what));
  };
  header.tensors.reserve(root.size());
  for (auto [key, value] : root) {
    simdjson::dom::object entry;
    if (value.get_object().get(entry) != simdjson::SUCCESS) {
      if (key == "__metadata__") fail(label, "safetensors __metadata__ is not an object");
      bad(key, "entry is not an object");
    }
    if (key == "__metadata__") {
      for (auto [meta_key, meta_value] : entry) {
        std::string_view text;
        if (meta_value.get_string().get(text) != simdjson::SUCCESS)
          fail(label, "safetensors __metadata__ values must be strings");
        header.metadata.emplace(std::string(meta_key), std::string(text));
      }
      continue;
    }
    TensorInfo tensor;
    tensor.name = std::string(key);
    bool have_dtype = false, have_shape = false, have_offsets = false;
    for (auto [member_key, member] : entry) {
      if (member_key == "dtype") {
        std::string_view dtype_text;
        if (member.get_string().get(dtype_text) != simdjson::SUCCESS)
          bad(tensor.name, "dtype is not a string");
        auto dtype = parse_dtype(dtype_text);
        if (!dtype) bad(tensor.name, fmt::format("unknown dtype '{}'", dtype_text));
        tensor.dtype = *dtype;
        have_dtype = true;
      } else if (member_key == "shape") {
        simdjson::dom::array dims;
        if (member.get_array().get(dims) != simdjson::SUCCESS)
          bad(tensor.name, "shape is not an array");
        for (auto dim_element : dims) {
          uint64_t dim;
          if (dim_element.get_uint64().get(dim) != simdjson::SUCCESS)
            bad(tensor.name, "shape holds a value that is not a non-negative integer");
          if (tensor.shape.full())
            bad(tensor.name,
                fmt::format("shape has more than {} dimensions", TensorShape::kMaxRank));
          tensor.shape.push_back(dim);
        }
        have_shape = true;
      } else if (member_key == "data_offsets") {
        simdjson::dom::array offsets;
        if (member.get_array().get(offsets) != simdjson::SUCCESS || offsets.size() != 2)
          bad(tensor.name, "data_offsets must be two non-negative integers");
        if (offsets.at(0).get_uint64().get(tensor.data_begin) != simdjson::SUCCESS ||
            offsets.at(1).get_uint64().get(tensor.data_end) != simdjson::SUCCESS)
          bad(tensor.name, "data_offsets must be two non-negative integers");
        have_offsets = true;
      } else {
        bad(tensor.name, fmt::format("unexpected key '{}'", member_key));
      }
    }
    if (!have_dtype || !have_shape || !have_offsets)
      bad(tensor.name, "entry needs dtype, shape and data_offsets");
    if (tensor.data_begin > tensor.data_end)
      bad(tensor.name,
          fmt::format("data_offsets [{}, {}] run backwards", tensor.data_begin, tensor.data_end));
    if (tensor.data_end > data_bytes)
      bad(tensor.name, fmt::format("data_offsets end {} lies beyond the data section ({} bytes)",
                                   tensor.data_end, data_bytes));
    uint64_t elements = 1;
    for (uint64_t dim : tensor.shape)
      if (__builtin_mul_overflow(elements, dim, &elements))
        bad(tensor.name, "shape overflows 64 bits");
    uint64_t bits;
    if (__builtin_mul_overflow(elements, uint64_t{dtype_bits(tensor.dtype)}, &bits))
      bad(tensor.name, "shape overflows 64 bits");
    if (bits % 8 != 0) bad(tensor.name, "element count does not fill whole bytes");
    if (bits / 8 != tensor.data_end - tensor.data_begin)
      bad(tensor.name,
          fmt::format("{} x [{}] needs {} bytes but data_offsets span {}", dtype_name(tensor.dtype),
                      fmt::join(tensor.shape, ","), bits / 8, tensor.data_end - tensor.data_begin));
    header.tensors.push_back(std::move(tensor));
  }

  check_spans_disjoint(header, label);
  return header;
}

namespace {

// Builds a SafetensorsHeader from a visit: what the callers that keep every entry need.
class CollectHeader : public HeaderVisitor {
 public:
  explicit CollectHeader(SafetensorsHeader& header) : header_(header) {}
  void begin() override {
    header_.tensors.clear();
    header_.metadata.clear();
  }
  void metadata(std::string_view key, std::string_view value) override {
    header_.metadata.emplace(key, value);
  }
  void tensor(const TensorView& tensor) override {
    header_.tensors.push_back(
        {std::string(tensor.name), tensor.dtype, tensor.shape, tensor.data_begin, tensor.data_end});
  }

 private:
  SafetensorsHeader& header_;
};

}  // namespace

SafetensorsHeader parse_safetensors_header(std::string_view header_json, uint64_t data_bytes,
                                           const std::string& label, bool buffer_is_padded) {
  static_assert(kHeaderPaddingBytes >= simdjson::SIMDJSON_PADDING);
  SafetensorsHeader header;
  header.header_bytes = header_json.size();
  CollectHeader collect(header);
  if (buffer_is_padded) {
    visit_safetensors_header(header_json, data_bytes, label, collect);
    return header;
  }
  std::string padded(header_json.size() + kHeaderPaddingBytes, ' ');
  std::memcpy(padded.data(), header_json.data(), header_json.size());
  visit_safetensors_header(std::string_view(padded.data(), header_json.size()), data_bytes, label,
                           collect);
  return header;
}

SafetensorsHeader read_safetensors_header(const std::filesystem::path& file) {
  MappedHeader mapped(file);
  SafetensorsHeader header = mapped.sizes();
  CollectHeader collect(header);
  mapped.visit(collect);
  return header;
}

std::vector<float> read_tensor_values(const SafetensorsHeader& header, const TensorInfo& tensor,
                                      uint64_t max_elements) {
  const std::string label = header.file.string();
  uint64_t count = tensor.element_count();
  if (count > max_elements)
    fail(label,
         fmt::format("tensor '{}' has {} elements; refusing to read weights", tensor.name, count));
  uint64_t bytes = tensor.data_end - tensor.data_begin;
  std::string raw(bytes, '\0');
  FileHandle handle(header.file);
  if (handle.fd() < 0) fail(label, fmt::format("cannot open: {}", std::strerror(errno)));
  if (!handle.read_at(header.data_offset() + tensor.data_begin, raw.data(), bytes))
    fail(label, fmt::format("cannot read tensor '{}' (file truncated?)", tensor.name));
  const auto* data = reinterpret_cast<const unsigned char*>(raw.data());
  auto load = [&](uint64_t i, int width) {
    uint64_t value = 0;
    for (int b = width - 1; b >= 0; --b) value = (value << 8) | data[i * width + b];
    return value;
  };
  std::vector<float> values(count);
  for (uint64_t i = 0; i < count; ++i) {
    switch (tensor.dtype) {
      case TensorDType::F32: {
        uint32_t bits = static_cast<uint32_t>(load(i, 4));
        std::memcpy(&values[i], &bits, 4);
        break;
      }
      case TensorDType::F64: {
        uint64_t bits = load(i, 8);
        double value;
        std::memcpy(&value, &bits, 8);
        values[i] = static_cast<float>(value);
        break;
      }
      case TensorDType::BF16:
        values[i] = numerics::bf16_to_float(static_cast<uint16_t>(load(i, 2)));
        break;
      case TensorDType::F16:
        values[i] = numerics::fp16_to_float(static_cast<uint16_t>(load(i, 2)));
        break;
      case TensorDType::F8_E4M3:
        values[i] = numerics::fp8_e4m3_to_float(data[i]);
        break;
      case TensorDType::F8_E5M2:
        values[i] = numerics::fp8_e5m2_to_float(data[i]);
        break;
      case TensorDType::I8:
        values[i] = static_cast<float>(static_cast<int8_t>(data[i]));
        break;
      case TensorDType::U8:
        values[i] = static_cast<float>(data[i]);
        break;
      case TensorDType::I32:
        values[i] = static_cast<float>(static_cast<int32_t>(load(i, 4)));
        break;
      default:
        fail(label, fmt::format("tensor '{}': cannot read values of dtype {}", tensor.name,
                                dtype_name(tensor.dtype)));
    }
  }
  return values;
}

}  // namespace kvaudit::checkpoint
