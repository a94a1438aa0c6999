// The KV dtype vocabulary (data/engines/dtypes.json): one entry per storage format,
// with every spelling engines, logs and APIs use for it. Every module asks here
// whether a dtype is quantized, how it is spelled and what it costs.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "engines/internal.h"
#include "util/json.h"
#include "util/util.h"

namespace kvaudit::engines {

namespace {

std::string lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (out.rfind("torch.", 0) == 0) out = out.substr(6);
  return out;
}

ScaleSemantics parse_semantics(JsonReader& entry) {
  std::string text = entry.string("scales");
  for (ScaleSemantics s : {ScaleSemantics::none, ScaleSemantics::static_per_tensor,
                           ScaleSemantics::nvfp4_global, ScaleSemantics::dynamic_block,
                           ScaleSemantics::dynamic_per_token_head, ScaleSemantics::packed_dynamic})
    if (scale_semantics_name(s) == text) return s;
  entry.fail("scales", fmt::format("unknown scale semantics '{}'", text));
}

numerics::ElementType parse_element(JsonReader& entry, std::string_view key) {
  std::string name = entry.string(key);
  auto type = numerics::find_element_type(name);
  if (!type)
    entry.fail(key, fmt::format("unknown element type '{}' (numerics has no such codec)", name));
  return *type;
}

}  // namespace

std::string_view scale_semantics_name(ScaleSemantics semantics) {
  switch (semantics) {
    case ScaleSemantics::none:
      return "none";
    case ScaleSemantics::static_per_tensor:
      return "static_per_tensor";
    case ScaleSemantics::nvfp4_global:
      return "nvfp4_global";
    case ScaleSemantics::dynamic_block:
      return "dynamic_block";
    case ScaleSemantics::dynamic_per_token_head:
      return "dynamic_per_token_head";
    case ScaleSemantics::packed_dynamic:
      return "packed_dynamic";
  }
  return "?";
}

std::vector<KvDtype> load_kv_dtypes(const std::filesystem::path& file) {
  const std::string where = file.string();
  nlohmann::json document = read_json_file(file, 1 << 20);
  JsonReader top(document, where);
  if (top.integer("schema_version") != 2) top.fail("schema_version", "expected 2");
  top.allow_descriptive({"notes"});
  std::vector<KvDtype> out;
  for (JsonReader& entry : top.objects("dtypes")) {
    KvDtype dtype;
    dtype.name = entry.string("name");
    dtype.spellings = entry.strings_or_empty("spellings");
    dtype.torch_dtype = entry.string("torch_dtype");
    dtype.element = parse_element(entry, "element");
    if (entry.has("v_element")) dtype.v_element = parse_element(entry, "v_element");
    const int element_bits = numerics::element_traits(dtype.element).bits;
    dtype.key_bits = static_cast<int>(entry.integer_or("key_bits", element_bits));
    dtype.value_bits = static_cast<int>(entry.integer_or(
        "value_bits",
        dtype.v_element ? numerics::element_traits(*dtype.v_element).bits : dtype.key_bits));
    if (auto block = entry.optional_object("block")) {
      dtype.block_elements = static_cast<int>(block->integer("elements"));
      dtype.block_scale_bits = static_cast<int>(block->integer("scale_bits"));
      dtype.block_scale_format = block->string("scale_format");
      block->finish();
      if (dtype.block_elements <= 0 || dtype.block_scale_bits <= 0)
        entry.fail("block", "elements and scale_bits must be positive");
    }
    dtype.scale_bytes_per_token_head =
        static_cast<int>(entry.integer_or("scale_bytes_per_token_head", 0));
    dtype.fixed_mla_bytes_per_token_layer =
        static_cast<int>(entry.integer_or("fixed_mla_bytes_per_token_layer", 0));
    dtype.scales = parse_semantics(entry);
    dtype.quantized = entry.boolean_or("quantized", false);
    dtype.mla_only = entry.boolean_or("mla_only", false);
    dtype.description = entry.string("description");
    dtype.reference = entry.string_or("reference", "");
    entry.allow_descriptive({"notes"});
    entry.finish();
    if (dtype.key_bits <= 0 || dtype.value_bits <= 0 || dtype.key_bits > 32 ||
        dtype.value_bits > 32)
      entry.fail("key_bits", "bits must lie in 1..32");
    const bool narrow = dtype.key_bits < 16 || dtype.value_bits < 16;
    if (narrow != dtype.quantized)
      entry.fail("quantized", fmt::format("{} stores {}/{} bits per element: quantized must be {}",
                                          dtype.name, dtype.key_bits, dtype.value_bits, narrow));
    if (dtype.quantized == (dtype.scales == ScaleSemantics::none))
      entry.fail("scales", "a quantized dtype needs scale semantics, a 16-bit one 'none'");
    out.push_back(std::move(dtype));
  }
  // Every spelling names exactly one dtype.
  std::map<std::string, std::string> owner;
  for (const KvDtype& dtype : out) {
    std::vector<std::string> names = dtype.spellings;
    names.push_back(dtype.name);
    for (const std::string& spelling : names) {
      std::string key = lower(spelling);
      if (key == "auto") throw InputError(where, "'auto' is a request, not a dtype spelling");
      auto [it, inserted] = owner.emplace(key, dtype.name);
      if (!inserted && it->second != dtype.name)
        throw InputError(where, fmt::format("spelling '{}' names both {} and {}", spelling,
                                            it->second, dtype.name));
    }
  }
  if (out.empty()) throw InputError(where, "dtypes: empty");
  return out;
}

const KvDtype* DtypeVocabulary::find(std::string_view spelling) const {
  const std::string wanted = lower(spelling);
  if (wanted.empty()) return nullptr;
  for (const KvDtype& dtype : dtypes_) {
    if (lower(dtype.name) == wanted) return &dtype;
    for (const std::string& other : dtype.spellings)
      if (lower(other) == wanted) return &dtype;
  }
  return nullptr;
}

std::string DtypeVocabulary::normalise(std::string_view spelling) const {
  if (lower(spelling) == "auto") return "auto";
  const KvDtype* dtype = find(spelling);
  return dtype ? dtype->name : "";
}

bool DtypeVocabulary::is_quantized(std::string_view spelling) const {
  const KvDtype* dtype = find(spelling);
  return dtype && dtype->quantized;
}

int64_t kv_bits_per_head(const KvDtype& dtype, int64_t k_head_dim, int64_t v_head_dim) {
  int64_t bits = k_head_dim * dtype.key_bits + v_head_dim * dtype.value_bits;
  if (dtype.block_elements > 0) {
    // Blocks run along the head dimension; a partial block still carries a scale.
    auto blocks = [&](int64_t dim) {
      return (dim + dtype.block_elements - 1) / dtype.block_elements;
    };
    bits +=
        (blocks(k_head_dim) + (v_head_dim > 0 ? blocks(v_head_dim) : 0)) * dtype.block_scale_bits;
  }
  bits += int64_t{8} * dtype.scale_bytes_per_token_head * (v_head_dim > 0 ? 2 : 1);
  return bits;
}

}  // namespace kvaudit::engines
