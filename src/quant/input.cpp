// Q/K/V from files: a .safetensors file holding q/k/v tensors, or a folder with q.npy,
// k.npy, v.npy. Both readers validate everything (magic, header, dtype, shape, byte counts)
// before touching data and report problems as InputError(file, problem).
#include <cstring>
#include <fstream>
#include <map>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "quant/quant.h"
#include "util/util.h"

namespace kvaudit::quant {
namespace {

constexpr uint64_t kMaxInputBytes = 16ull << 30;

enum class DType { f32, f16, bf16 };

struct Array {
  std::vector<uint64_t> shape;
  std::vector<float> data;
};

std::vector<float> to_float(DType dtype, const char* bytes, uint64_t count) {
  std::vector<float> out(count);
  for (uint64_t i = 0; i < count; ++i) {
    if (dtype == DType::f32) {
      std::memcpy(&out[i], bytes + i * 4, 4);
    } else {
      uint16_t bits;
      std::memcpy(&bits, bytes + i * 2, 2);
      out[i] = dtype == DType::f16 ? numerics::fp16_to_float(bits) : numerics::bf16_to_float(bits);
    }
  }
  return out;
}

uint64_t element_count(const std::vector<uint64_t>& shape, const std::string& where) {
  uint64_t count = 1;
  for (uint64_t d : shape) {
    if (d != 0 && count > kMaxInputBytes / d) throw InputError(where, "tensor shape too large");
    count *= d;
  }
  return count;
}

std::string read_binary(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    throw InputError(path.string(), "not a readable file");
  const uint64_t size = std::filesystem::file_size(path, ec);
  if (ec) throw InputError(path.string(), "cannot read size");
  if (size > kMaxInputBytes) throw InputError(path.string(), "file larger than 16 GiB");
  std::ifstream in(path, std::ios::binary);
  std::string bytes(size, '\0');
  if (!in.read(bytes.data(), std::streamsize(size))) throw InputError(path.string(), "read failed");
  return bytes;
}

// NumPy .npy v1/v2/v3: magic, version, header length, a Python dict literal header.
Array read_npy(const std::filesystem::path& path) {
  const std::string where = path.string();
  const std::string bytes = read_binary(path);
  if (bytes.size() < 10 || std::memcmp(bytes.data(), "\x93NUMPY", 6) != 0)
    throw InputError(where, "not a .npy file (bad magic)");
  const int major = uint8_t(bytes[6]);
  uint64_t header_len = 0, offset = 0;
  if (major == 1) {
    header_len = uint8_t(bytes[8]) | (uint64_t(uint8_t(bytes[9])) << 8);
    offset = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) throw InputError(where, "truncated header");
    for (int i = 0; i < 4; ++i) header_len |= uint64_t(uint8_t(bytes[8 + i])) << (8 * i);
    offset = 12;
  } else {
    throw InputError(where, fmt::format("unsupported .npy version {}", major));
  }
  if (offset + header_len > bytes.size()) throw InputError(where, "truncated header");
  const std::string header = bytes.substr(offset, header_len);
  static const Regex descr_entry(R"('descr'\s*:\s*'([^']*)')");
  static const Regex fortran_order_entry(R"('fortran_order'\s*:\s*True)");
  static const Regex shape_entry(R"('shape'\s*:\s*\(([^)]*)\))");
  const auto descr_match = descr_entry.search(header);
  if (!descr_match) throw InputError(where, "header has no 'descr'");
  const std::string descr(*descr_match->at(1));
  DType dtype;
  uint64_t item = 0;
  if (descr == "<f4") {
    dtype = DType::f32, item = 4;
  } else if (descr == "<f2") {
    dtype = DType::f16, item = 2;
  } else {
    throw InputError(
        where, fmt::format("dtype '{}' not supported (float32 or float16, little-endian)", descr));
  }
  if (fortran_order_entry.search(header))
    throw InputError(where, "Fortran-ordered arrays are not supported");
  const auto shape_match = shape_entry.search(header);
  if (!shape_match) throw InputError(where, "header has no 'shape'");
  Array array;
  const std::string dims(*shape_match->at(1));
  for (const std::string& part : split_list(dims)) {
    std::optional<int64_t> value = parse_token_count(part);
    if (!value || *value < 0 || part.find_first_not_of("0123456789") != std::string::npos)
      throw InputError(where, fmt::format("bad shape entry '{}'", part));
    array.shape.push_back(uint64_t(*value));
  }
  const uint64_t count = element_count(array.shape, where);
  const uint64_t data_offset = offset + header_len;
  if (bytes.size() - data_offset != count * item) {
    throw InputError(where, fmt::format("data is {} bytes, shape needs {}",
                                        bytes.size() - data_offset, count * item));
  }
  array.data = to_float(dtype, bytes.data() + data_offset, count);
  return array;
}

// Header parsing and validation (dtype x shape = span, bounds, overlaps) is the
// checkpoint reader's; this only converts the Q/K/V candidates, read whole.
std::map<std::string, Array> read_safetensors(const std::filesystem::path& path) {
  const std::string where = path.string();
  const checkpoint::SafetensorsHeader header = checkpoint::read_safetensors_header(path);
  const std::string bytes = read_binary(path);
  if (bytes.size() != header.file_bytes) throw InputError(where, "file changed while reading");
  std::map<std::string, Array> tensors;
  for (const checkpoint::TensorInfo& info : header.tensors) {
    DType dtype;
    switch (info.dtype) {
      case checkpoint::TensorDType::F32:
        dtype = DType::f32;
        break;
      case checkpoint::TensorDType::F16:
        dtype = DType::f16;
        break;
      case checkpoint::TensorDType::BF16:
        dtype = DType::bf16;
        break;
      default:
        continue;  // not a Q/K/V candidate; other tensors may sit in the same file
    }
    Array array;
    array.shape = info.shape.to_vector();
    const uint64_t count = element_count(array.shape, where + ": " + info.name);
    array.data = to_float(dtype, bytes.data() + header.data_offset() + info.data_begin, count);
    tensors[info.name] = std::move(array);
  }
  return tensors;
}

class FileSource final : public QkvSource {
 public:
  FileSource(std::string description, Array k, Array v, std::optional<Array> q)
      : description_(std::move(description)), k_(std::move(k)), v_(std::move(v)) {
    auto check3 = [&](const Array& a, const char* name) {
      if (a.shape.size() != 3 || a.shape[0] == 0 || a.shape[1] == 0 || a.shape[2] == 0)
        throw InputError(description_, fmt::format("{} must be [tokens, heads, head_dim]", name));
    };
    check3(k_, "k");
    check3(v_, "v");
    if (k_.shape != v_.shape) throw InputError(description_, "k and v shapes differ");
    shape_.kv_heads = int(k_.shape[1]);
    shape_.head_dim = int(k_.shape[2]);
    shape_.q_heads = shape_.kv_heads;
    if (q) {
      check3(*q, "q");
      if (q->shape[2] != k_.shape[2]) throw InputError(description_, "q head_dim differs from k");
      if (q->shape[1] % k_.shape[1] != 0)
        throw InputError(description_, "q heads must be a multiple of kv heads");
      shape_.q_heads = int(q->shape[1]);
      q_ = std::move(*q);
    }
  }
  AttentionShape shape() const override { return shape_; }
  int64_t tokens() const override { return int64_t(k_.shape[0]); }
  std::string description() const override { return description_; }
  void keys(int64_t first, int64_t count, std::span<float> out) const override {
    copy_rows(k_, first, count, out);
  }
  void values(int64_t first, int64_t count, std::span<float> out) const override {
    copy_rows(v_, first, count, out);
  }
  void head_keys(int64_t first, int64_t count, int head, std::span<float> out) const override {
    copy_head(k_, first, count, head, out);
  }
  void head_values(int64_t first, int64_t count, int head, std::span<float> out) const override {
    copy_head(v_, first, count, head, out);
  }
  void queries(int64_t context_tokens, int count, std::span<float> out) const override {
    const int64_t width = int64_t(shape_.q_heads) * shape_.head_dim;
    for (int i = 0; i < count; ++i) {
      float* row = out.data() + i * width;
      if (!q_.data.empty()) {
        // Cycle through the given query positions (the file may hold fewer than asked).
        const int64_t p = (context_tokens + i) % int64_t(q_.shape[0]);
        std::copy_n(q_.data.data() + p * width, width, row);
      } else {
        // No queries: the key just before the context end stands in (self-similar queries).
        const int64_t t = std::max<int64_t>(0, context_tokens - 1 - i);
        for (int h = 0; h < shape_.q_heads; ++h) {
          std::copy_n(k_.data.data() + (t * shape_.kv_heads + h) * shape_.head_dim, shape_.head_dim,
                      row + int64_t(h) * shape_.head_dim);
        }
      }
    }
  }

 private:
  static void copy_rows(const Array& a, int64_t first, int64_t count, std::span<float> out) {
    const int64_t width = int64_t(a.shape[1] * a.shape[2]);
    std::copy_n(a.data.data() + first * width, count * width, out.data());
  }
  static void copy_head(const Array& a, int64_t first, int64_t count, int head,
                        std::span<float> out) {
    const int64_t heads = int64_t(a.shape[1]), dim = int64_t(a.shape[2]);
    for (int64_t t = 0; t < count; ++t) {
      std::copy_n(a.data.data() + ((first + t) * heads + head) * dim, dim, out.data() + t * dim);
    }
  }
  std::string description_;
  Array k_, v_, q_;
  AttentionShape shape_;
};

}  // namespace

std::unique_ptr<QkvSource> load_qkv(const std::filesystem::path& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    const auto k = path / "k.npy", v = path / "v.npy", q = path / "q.npy";
    if (!std::filesystem::exists(k) || !std::filesystem::exists(v))
      throw InputError(path.string(), "folder needs k.npy and v.npy (q.npy optional)");
    std::optional<Array> queries;
    if (std::filesystem::exists(q)) queries = read_npy(q);
    return std::make_unique<FileSource>(path.string(), read_npy(k), read_npy(v),
                                        std::move(queries));
  }
  if (path.extension() == ".npy")
    throw InputError(path.string(), "give the folder holding k.npy, v.npy (and q.npy)");
  std::map<std::string, Array> tensors = read_safetensors(path);
  auto take = [&](std::initializer_list<const char*> names) -> std::optional<Array> {
    for (const char* name : names) {
      auto it = tensors.find(name);
      if (it != tensors.end()) return std::move(it->second);
    }
    return std::nullopt;
  };
  std::optional<Array> k = take({"k", "key", "keys"}), v = take({"v", "value", "values"});
  if (!k || !v) throw InputError(path.string(), "needs tensors named k and v (F32/F16/BF16)");
  return std::make_unique<FileSource>(path.string(), std::move(*k), std::move(*v),
                                      take({"q", "query", "queries"}));
}

}  // namespace kvaudit::quant
