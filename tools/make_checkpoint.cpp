// kvaudit_make_checkpoint MANIFEST.json OUT_DIR
// Builds a test checkpoint from a compact manifest: config files copied verbatim,
// safetensors shards with real headers, the weights left as holes (sparse files),
// and only the listed small tensors (KV scales) written with real values.
//
// Manifest:
//  {"copy": ["config.json", ...],            files next to the manifest, copied as is
//   "shards": 8,                              number of shard files (1: model.safetensors)
//   "tensors": [{"name": "model.layers.{L}.self_attn.k_proj.k_scale", "dtype": "F32",
//                "shape": [], "for": {"L": "3..60:4"}, "values": [0.05]}, ...]}
// "for" ranges are "start..end[:step]" (end exclusive) or lists; names substitute {VAR}.
// "values" fills every instance; "values_per_instance" gives one list per instance.
// Raw "data_hex" writes bytes as is (for malformed fixtures).
// Groups keep a real export's order (layer by layer, expert by expert): an entry with
// "tensors" instead of "name" repeats its children, in order, for every value of its own
// "for" (first variable outermost), the children seeing the group's variables in their
// names. A child (group or tensor) with "if" / "unless" ({"L": "3..60:4"}) is kept only
// where the enclosing variables' values are / are not in those ranges.
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "numerics/numerics.h"

namespace fs = std::filesystem;
using ordered_json = nlohmann::ordered_json;
using kvaudit::checkpoint::TensorDType;

namespace {

struct Tensor {
  std::string name;
  std::string dtype;
  std::vector<uint64_t> shape;
  uint64_t bytes = 0;
  std::vector<unsigned char> data;  // empty: leave a hole
};

std::vector<std::string> expand_values(const ordered_json& spec) {
  std::vector<std::string> out;
  if (spec.is_array()) {
    for (const auto& item : spec)
      out.push_back(item.is_string() ? item.get<std::string>() : item.dump());
    return out;
  }
  std::string text = spec.get<std::string>();
  auto dots = text.find("..");
  if (dots == std::string::npos) return {text};
  long start = std::stol(text.substr(0, dots));
  std::string rest = text.substr(dots + 2);
  long step = 1;
  if (auto colon = rest.find(':'); colon != std::string::npos) {
    step = std::stol(rest.substr(colon + 1));
    rest = rest.substr(0, colon);
  }
  long end = std::stol(rest);
  for (long i = start; i < end; i += step) out.push_back(std::to_string(i));
  return out;
}

void expand(const ordered_json& spec,
            const std::vector<std::pair<std::string, std::vector<std::string>>>& loops,
            size_t depth, std::string name, std::vector<std::string>& names) {
  if (depth == loops.size()) {
    names.push_back(std::move(name));
    return;
  }
  const auto& [var, values] = loops[depth];
  for (const auto& value : values) {
    std::string substituted = name;
    std::string token = "{" + var + "}";
    for (size_t pos; (pos = substituted.find(token)) != std::string::npos;)
      substituted.replace(pos, token.size(), value);
    expand(spec, loops, depth + 1, substituted, names);
  }
}

void encode_values(const std::string& dtype, const ordered_json& values,
                   std::vector<unsigned char>& out) {
  using namespace kvaudit::numerics;
  for (const auto& item : values) {
    float value = item.is_string() ? std::stof(item.get<std::string>()) : item.get<float>();
    if (item.is_string() && item.get<std::string>() == "nan") value = NAN;
    if (item.is_string() && item.get<std::string>() == "inf") value = INFINITY;
    auto put = [&](uint64_t bits, int width) {
      for (int b = 0; b < width; ++b) out.push_back(static_cast<unsigned char>(bits >> (8 * b)));
    };
    if (dtype == "F32") {
      uint32_t bits;
      std::memcpy(&bits, &value, 4);
      put(bits, 4);
    } else if (dtype == "BF16") {
      put(float_to_bf16(value), 2);
    } else if (dtype == "F16") {
      put(float_to_fp16(value), 2);
    } else if (dtype == "F8_E4M3") {
      put(float_to_fp8_e4m3(value, Overflow::saturate), 1);
    } else if (dtype == "F8_E5M2") {
      put(float_to_fp8_e5m2(value, Overflow::saturate), 1);
    } else {
      throw std::runtime_error("values given for unsupported dtype " + dtype);
    }
  }
}

using Bindings = std::vector<std::pair<std::string, std::string>>;

std::string substitute(std::string text, const Bindings& bindings) {
  for (const auto& [var, value] : bindings) {
    std::string token = "{" + var + "}";
    for (size_t pos; (pos = text.find(token)) != std::string::npos;)
      text.replace(pos, token.size(), value);
  }
  return text;
}

// Whether the "if" / "unless" conditions of a spec hold for the enclosing group variables.
bool selected(const ordered_json& spec, const Bindings& bindings) {
  auto holds = [&](const ordered_json& conditions) {
    for (const auto& [var, range] : conditions.items()) {
      const std::string* value = nullptr;
      for (const auto& [name, bound] : bindings)
        if (name == var) value = &bound;
      if (value == nullptr)
        throw std::runtime_error("condition on " + var + ", which no enclosing group binds");
      std::vector<std::string> allowed = expand_values(range);
      if (std::find(allowed.begin(), allowed.end(), *value) == allowed.end()) return false;
    }
    return true;
  };
  if (spec.contains("if") && !holds(spec["if"])) return false;
  if (spec.contains("unless") && holds(spec["unless"])) return false;
  return true;
}

void add_tensors(const ordered_json& spec, const Bindings& bindings, std::vector<Tensor>& tensors,
                 std::map<const ordered_json*, size_t>& instances);

// A group: its children, in order, for every combination of its loop values.
void add_group(const ordered_json& spec, const Bindings& bindings, size_t depth,
               const std::vector<std::pair<std::string, std::vector<std::string>>>& loops,
               std::vector<Tensor>& tensors, std::map<const ordered_json*, size_t>& instances) {
  if (depth == loops.size()) {
    for (const auto& child : spec["tensors"])
      if (selected(child, bindings)) add_tensors(child, bindings, tensors, instances);
    return;
  }
  for (const auto& value : loops[depth].second) {
    Bindings inner = bindings;
    inner.emplace_back(loops[depth].first, value);
    add_group(spec, inner, depth + 1, loops, tensors, instances);
  }
}

void add_tensors(const ordered_json& spec, const Bindings& bindings, std::vector<Tensor>& tensors,
                 std::map<const ordered_json*, size_t>& instances) {
  std::vector<std::pair<std::string, std::vector<std::string>>> loops;
  const ordered_json loop_spec = spec.value("for", ordered_json::object());
  for (const auto& [var, range] : loop_spec.items()) loops.emplace_back(var, expand_values(range));
  if (spec.contains("tensors")) {
    add_group(spec, bindings, 0, loops, tensors, instances);
    return;
  }
  std::vector<std::string> names;
  expand(spec, loops, 0, substitute(spec["name"].get<std::string>(), bindings), names);
  auto dtype = kvaudit::checkpoint::parse_dtype(spec["dtype"].get<std::string>());
  if (!dtype) throw std::runtime_error("unknown dtype in manifest: " + spec["dtype"].dump());
  std::vector<uint64_t> shape = spec["shape"].get<std::vector<uint64_t>>();
  uint64_t elements = 1;
  for (auto dim : shape) elements *= dim;
  uint64_t bytes = elements * kvaudit::checkpoint::dtype_bits(*dtype) / 8;
  for (const auto& name : names) {
    size_t i = instances[&spec]++;  // instance number across every group iteration
    Tensor tensor{name, spec["dtype"].get<std::string>(), shape, bytes, {}};
    if (spec.contains("values_per_instance"))
      encode_values(tensor.dtype, spec["values_per_instance"][i], tensor.data);
    else if (spec.contains("values")) {
      ordered_json values = spec["values"];
      while (values.size() < elements && !values.empty()) values.push_back(values.back());
      encode_values(tensor.dtype, values, tensor.data);
    }
    if (!tensor.data.empty() && tensor.data.size() != bytes)
      throw std::runtime_error(fmt::format("{}: {} value bytes for a {}-byte tensor", tensor.name,
                                           tensor.data.size(), bytes));
    tensors.push_back(std::move(tensor));
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: kvaudit_make_checkpoint MANIFEST.json OUT_DIR\n";
    return 2;
  }
  try {
    fs::path manifest_path = argv[1];
    fs::path out_dir = argv[2];
    std::ifstream in(manifest_path);
    if (!in) throw std::runtime_error("cannot open " + manifest_path.string());
    ordered_json manifest = ordered_json::parse(in);
    fs::create_directories(out_dir);
    for (const auto& file : manifest.value("copy", ordered_json::array()))
      fs::copy_file(manifest_path.parent_path() / file.get<std::string>(),
                    out_dir / file.get<std::string>(), fs::copy_options::overwrite_existing);

    std::vector<Tensor> tensors;
    std::map<const ordered_json*, size_t> instances;
    const ordered_json specs = manifest.value("tensors", ordered_json::array());
    for (const auto& spec : specs)
      if (selected(spec, {})) add_tensors(spec, {}, tensors, instances);

    int shard_count = std::max(1, manifest.value("shards", 1));
    uint64_t total = 0;
    for (const auto& tensor : tensors) total += tensor.bytes;
    uint64_t per_shard = total / shard_count + 1;
    // Headers are built as text: an ordered_json object with ~400K keys is quadratic.
    std::string weight_map;
    size_t next = 0;
    for (int shard = 0; shard < shard_count; ++shard) {
      std::string file = shard_count == 1 ? "model.safetensors"
                                          : fmt::format("model-{:05d}-of-{:05d}.safetensors",
                                                        shard + 1, shard_count);
      std::string header_text = R"({"__metadata__":{"format":"pt"})";
      uint64_t offset = 0;
      size_t first = next;
      while (next < tensors.size() && (offset < per_shard || shard == shard_count - 1)) {
        const Tensor& tensor = tensors[next++];
        std::string name = ordered_json(tensor.name).dump();
        header_text +=
            fmt::format(R"(,{}:{{"dtype":"{}","shape":[{}],"data_offsets":[{},{}]}})", name,
                        tensor.dtype, fmt::join(tensor.shape, ","), offset, offset + tensor.bytes);
        weight_map += fmt::format("{}{}:\"{}\"", weight_map.empty() ? "" : ",\n  ", name, file);
        offset += tensor.bytes;
      }
      header_text += "}";
      while ((header_text.size() % 8) != 0)
        header_text.push_back(' ');  // aligned data, as safetensors pads
      fs::path path = out_dir / file;
      int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
      if (fd < 0) throw std::runtime_error("cannot write " + path.string());
      uint64_t header_len = header_text.size();
      unsigned char prefix[8];
      for (int b = 0; b < 8; ++b) prefix[b] = static_cast<unsigned char>(header_len >> (8 * b));
      bool ok =
          ::write(fd, prefix, 8) == 8 && ::write(fd, header_text.data(), header_text.size()) ==
                                             static_cast<ssize_t>(header_text.size());
      uint64_t data_start = 8 + header_len;
      uint64_t position = 0;
      for (size_t i = first; i < next && ok; ++i) {
        if (!tensors[i].data.empty())
          ok = ::pwrite(fd, tensors[i].data.data(), tensors[i].data.size(),
                        static_cast<off_t>(data_start + position)) ==
               static_cast<ssize_t>(tensors[i].data.size());
        position += tensors[i].bytes;
      }
      ok = ok && ::ftruncate(fd, static_cast<off_t>(data_start + position)) ==
                     0;  // the holes are the weights
      ::close(fd);
      if (!ok) throw std::runtime_error("write failed: " + path.string());
    }
    if (shard_count > 1)
      std::ofstream(out_dir / "model.safetensors.index.json") << fmt::format(
          "{{\"metadata\": {{\"total_size\": {}}},\n \"weight_map\": {{\n  {}\n }}\n}}\n", total,
          weight_map);
    std::cout << fmt::format("{}: {} tensors, {} shard(s), {:.1f} GB of weights as sparse holes\n",
                             out_dir.string(), tensors.size(), shard_count, total / 1e9);
    return 0;
  } catch (const std::exception& error) {
    std::cerr << "kvaudit_make_checkpoint: " << error.what() << '\n';
    return 1;
  }
}
