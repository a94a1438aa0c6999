// The fast readers (On-Demand over mapped files) against the DOM reference readers: the same
// answer or the same one-line error for hand-picked edge cases and for seeded mutations of a
// real header and index; and the mappings' padding where a file ends right after its text.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>

#include "checkpoint/checkpoint.h"
#include "checkpoint/internal.h"
#include "util/util.h"

namespace kvaudit::checkpoint {
namespace {

namespace fs = std::filesystem;

// What a header read gives: the tensors and metadata, or the error's problem.
std::string outcome(const std::function<SafetensorsHeader()>& parse) {
  try {
    SafetensorsHeader header = parse();
    std::string out = "ok";
    for (const auto& [key, value] : header.metadata) out += fmt::format(" meta {}={}", key, value);
    for (const TensorInfo& tensor : header.tensors)
      out += fmt::format(" {}:{}[{}]{}-{}", tensor.name, dtype_name(tensor.dtype),
                         fmt::join(tensor.shape, ","), tensor.data_begin, tensor.data_end);
    return out;
  } catch (const InputError& error) {
    return "error " + error.where() + ": " + error.problem();
  }
}

void expect_same(const std::string& json, uint64_t data_bytes) {
  std::string fast = outcome([&] { return parse_safetensors_header(json, data_bytes, "h"); });
  std::string reference =
      outcome([&] { return parse_safetensors_header_reference(json, data_bytes, "h"); });
  EXPECT_EQ(fast, reference) << "header: " << json;
}

constexpr const char* kEntry = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";

TEST(FastHeader, AgreesWithTheReferenceOnEdgeCases) {
  const std::vector<std::string> headers = {
      "{}",
      std::string("{") + kEntry + "}",
      std::string(R"({"__metadata__":{"format":"pt","k":"v"},)") + kEntry + "}",
      R"({"__metadata__":{"format":1}})",
      R"({"__metadata__":[]})",
      R"({"__metadata__":{"a":"1","a":"2"}})",
      R"({"a":{"dt\u0079pe":"F32","shape":[2],"data_offsets":[0,8]}})",    // escaped key
      R"({"a\u002eb":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",  // escaped name
      R"({"a":{"dtype":"F32","shape":[-0],"data_offsets":[0,0]}})",
      R"({"a":{"dtype":"F32","shape":[1],"shape":[2],"data_offsets":[0,8]}})",
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"dtype":"U8"}})",
      R"({"a":{"dtype":"F32\u0000","shape":[2],"data_offsets":[0,8]}})",
      R"({"a":{"dtype":"F3","shape":[2],"data_offsets":[0,8]}})",
      R"({"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})",
      R"({"a":{"dtype":"F32","shape":[1e1],"data_offsets":[0,40]}})",
      R"({"a":{"dtype":"F32","shape":[02],"data_offsets":[0,8]}})",
      R"({"a":{"dtype":"F32","shape":[18446744073709551616],"data_offsets":[0,8]}})",
      R"({"a":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,4]}})",
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8,8]}})",
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})",
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})",
      R"({"a":{"dtype":"F32","shape":[2]}})",
      R"({"a":{"dtype":"F4","shape":[3],"data_offsets":[0,1]}})",
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})",
      R"({"b":{"dtype":"U8","shape":[4],"data_offsets":[8,12]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
      std::string("{") + kEntry + "} x",
      std::string("{") + kEntry + "}}",
      std::string("{") + kEntry,
      std::string("{") + kEntry + ",}",
      std::string(" \n{ ") + kEntry + " }\t",
      "[]",
      "null",
      "",
      "   ",
      R"({"a":"b"})",
      "{\"a\xff\":{}}",
      "{\"a\x01\":{}}",
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})",
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"bad\q":1}})",
  };
  for (const std::string& header : headers) {
    expect_same(header, 16);
    expect_same(header, 8);
  }
}

// Counts the visits: a second begin() means the fast reader gave up and the reference read it.
struct CountVisits : HeaderVisitor {
  int begins = 0, tensors = 0;
  void begin() override {
    ++begins;
    tensors = 0;
  }
  void metadata(std::string_view, std::string_view) override {}
  void tensor(const TensorView&) override { ++tensors; }
};

int begins_for(const std::string& json, uint64_t data_bytes) {
  std::string padded = json + std::string(kHeaderPaddingBytes, ' ');
  CountVisits count;
  visit_safetensors_header(std::string_view(padded.data(), json.size()), data_bytes, "h", count);
  return count.begins;
}

TEST(FastHeader, ReadsOrdinaryHeadersItselfAndDefersTheUnusual) {
  EXPECT_EQ(begins_for(std::string(R"({"__metadata__":{"format":"pt"},)") + kEntry + "}", 8), 1);
  EXPECT_EQ(begins_for(std::string(" {\n") + kEntry + "}\n", 8), 1);
  EXPECT_EQ(begins_for(R"({"a":{"dt\u0079pe":"F32","shape":[2],"data_offsets":[0,8]}})", 8), 2);
  EXPECT_EQ(begins_for(R"({"a":{"dtype":"F32","shape":[-0],"data_offsets":[0,0]}})", 8), 2);
}

// A header as the demo's writer lays it out, then every kind of small damage to it.
TEST(FastHeader, AgreesWithTheReferenceOnMutatedHeaders) {
  std::string header = R"({"__metadata__":{"format":"pt"})";
  uint64_t offset = 0;
  for (int i = 0; i < 6; ++i) {
    uint64_t bytes = 4 * 16 * (i + 1);
    header += fmt::format(
        R"(,"model.layers.{}.self_attn.k_proj.weight":{{"dtype":"{}","shape":[16,{}],"data_offsets":[{},{}]}})",
        i, i % 2 ? "F32" : "BF16", i % 2 ? 4 * (i + 1) : 8 * (i + 1), offset, offset + bytes);
    offset += bytes;
  }
  header += "}";
  expect_same(header, offset);
  const std::string alphabet =
      "{}[]:,\"\\0123456789-.eE ntfu\x01\xff"
      "aF";
  SplitMix64 random{20261205};
  for (int trial = 0; trial < 20000; ++trial) {
    std::string mutated = header;
    for (int edits = 1 + static_cast<int>(random.below(3)); edits > 0; --edits) {
      size_t at = random.below(mutated.size());
      switch (random.below(3)) {
        case 0:
          mutated[at] = alphabet[random.below(alphabet.size())];
          break;
        case 1:
          mutated.erase(at, 1);
          break;
        default:
          mutated.insert(at, 1, alphabet[random.below(alphabet.size())]);
      }
    }
    expect_same(mutated, offset - random.below(2) * 8);
    if (::testing::Test::HasFailure()) return;  // one counterexample is enough
  }
}

std::string index_outcome(const std::function<std::vector<std::string>()>& read) {
  try {
    return "ok " + fmt::format("{}", fmt::join(read(), " "));
  } catch (const InputError& error) {
    return "error " + error.problem();
  }
}

void expect_same_index(const std::string& text) {
  std::string padded = text + std::string(kHeaderPaddingBytes, ' ');
  std::string fast = index_outcome(
      [&] { return index_shard_names(std::string_view(padded.data(), text.size()), "i"); });
  std::string reference = index_outcome([&] {
    std::set<std::string> names;
    read_safetensors_index(text, "i",
                           [&](std::string_view, std::string_view shard) { names.emplace(shard); });
    return std::vector<std::string>(names.begin(), names.end());
  });
  EXPECT_EQ(fast, reference) << "index: " << text;
}

TEST(FastIndex, AgreesWithTheReference) {
  const std::string index =
      R"({"metadata": {"total_size": 1234, "format": ["a", 1.5, true, null, {"x": -1e3}]},)"
      "\n"
      R"( "weight_map": {"a": "s-1.safetensors", "b": "s-1.safetensors" , "c":"s-2.safetensors",)"
      R"( "d": "s-1.safetensors", "e\u0066": "s-2.safetensors"}})";
  const std::vector<std::string> cases = {
      index,
      R"({"weight_map": {}})",
      R"({"weight_map": {"a": "x\u002esafetensors"}})",
      R"({"weight_map": {"a": "x", "b": "x", "c": 1}})",
      R"({"weight_map": {"a": "../x"}})",
      R"({"weight_map": {"a": "d/x"}})",
      R"({"weight_map": {"a": ""}})",
      R"({"weight_map": {"a": ".."}})",
      R"({"weight_map": {"a\q": "x"}})",
      R"({"weight_map": {"a": "x"}, "weight_map": {"b": "y"}})",
      R"({"weight_map": {"a": "x"}, "metadata": {"n": 1x}})",
      R"({"weight_map": {"a": "x"}, "metadata": nul})",
      R"({"weight_map": {"a": "x"}, "metadata": 123456789012345678901234567890})",
      R"({"weight_map": {"a": "x"}} [])",
      R"({"weight_map": []})",
      R"({"metadata": {}})",
      R"([1])",
      "",
  };
  for (const std::string& text : cases) expect_same_index(text);
  SplitMix64 random{7};
  const std::string alphabet = "{}[]:,\"\\/.01 ntx";
  for (int trial = 0; trial < 20000; ++trial) {
    std::string mutated = index;
    size_t at = random.below(mutated.size());
    if (random.below(2))
      mutated[at] = alphabet[random.below(alphabet.size())];
    else
      mutated.erase(at, 1);
    expect_same_index(mutated);
    if (::testing::Test::HasFailure()) return;
  }
}

// A header that ends at the end of its file (no data section, or a few bytes of one) is read
// through a mapping padded with anonymous pages; around a page boundary too.
TEST(MappedHeader, PadsFilesThatEndRightAfterTheHeader) {
  const fs::path dir = fs::path(::testing::TempDir()) / "mapped-header";
  fs::create_directories(dir);
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  for (uint64_t header_bytes : {uint64_t{60}, page - 8, page - 7, page - 9, 2 * page - 8 - 30}) {
    for (uint64_t data_bytes : {uint64_t{0}, uint64_t{4}, uint64_t{kHeaderPaddingBytes + 4}}) {
      std::string json = R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}})";
      ASSERT_LE(json.size(), header_bytes);
      json.resize(header_bytes, ' ');
      const fs::path file = dir / fmt::format("h{}-{}.safetensors", header_bytes, data_bytes);
      std::ofstream out(file, std::ios::binary);
      for (int i = 0; i < 8; ++i) out.put(static_cast<char>((header_bytes >> (8 * i)) & 0xff));
      out << json << std::string(data_bytes, 'x');
      out.close();
      SafetensorsHeader header = read_safetensors_header(file);
      ASSERT_EQ(header.tensors.size(), 1u) << file;
      EXPECT_EQ(header.header_bytes, header_bytes);
      EXPECT_EQ(header.file_bytes, 8 + header_bytes + data_bytes);
    }
  }
}

// The hashed dtype lookup finds every row by its name and nothing else.
TEST(DTypes, EveryNameRoundTripsAndNearMissesAreRefused) {
  for (int i = 0; i <= static_cast<int>(TensorDType::BOOL); ++i) {
    auto dtype = static_cast<TensorDType>(i);
    ASSERT_EQ(parse_dtype(dtype_name(dtype)), dtype) << dtype_name(dtype);
  }
  for (std::string_view name : std::initializer_list<std::string_view>{
           "", "F", "F3", "f32", "F32 ", "BF16x", "F8_E4M", "F8_E4M3F",
           std::string_view("F32\0", 4), std::string_view("\0F32", 4), "BOOL\xff", "U88", "I128",
           "E4M3"})
    EXPECT_FALSE(parse_dtype(name).has_value()) << name;
}

}  // namespace
}  // namespace kvaudit::checkpoint
