// The hub's file listing taken apart (answers.cpp): real answers of the tree endpoint
// (tests/fixtures/hub/, each with its source in SOURCES.md), the Link to the next page, the
// shards a listing shows, and the malformed pages refused as one-line errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "hub/hub.h"
#include "util/util.h"

namespace kvaudit::hub {
namespace {

using ::testing::HasSubstr;

std::string hub_fixture(const std::string& name) {
  return read_text_file(std::filesystem::path(KVAUDIT_TEST_DIR) / "fixtures" / "hub" / name,
                        1 << 20);
}

std::vector<ListedFile> parse(std::string_view body, ListingLimits limits = {}) {
  std::vector<ListedFile> files;
  size_t seen = 0;
  parse_listing_page(body, "u", limits, seen, files);
  return files;
}

std::vector<std::string> paths(const std::vector<ListedFile>& files) {
  std::vector<std::string> out;
  for (const auto& file : files) out.push_back(file.path);
  return out;
}

TEST(HubListing, RealAnswersOfTheTreeEndpoint) {
  // google/magenta-realtime's top level (huggingface_hub#3329): four folders, three files.
  std::vector<ListedFile> files;
  size_t seen = 0;
  parse_listing_page(hub_fixture("tree-google-magenta-realtime-main.json"), "u", {}, seen, files);
  EXPECT_EQ(seen, 7u);
  EXPECT_EQ(paths(files),
            (std::vector<std::string>{".gitattributes", "README.md", "notebook.ipynb"}));
  EXPECT_EQ(files[0].bytes, 165771u);
  EXPECT_EQ(shards_from_listing(files, "u").why_not,
            "the file listing shows no .safetensors file and no index");
  // bert-base-uncased (huggingface.js list-files.spec.ts): LFS files' size is lfs.size.
  files = parse(hub_fixture("tree-bert-base-uncased-dd4bc8b.json"));
  ASSERT_EQ(files.size(), 5u);
  EXPECT_EQ(files[2].path, "pytorch_model.bin");
  EXPECT_EQ(files[2].bytes, 440473133u);
  EXPECT_EQ(files[3].bytes, 536063208u);
}

TEST(HubListing, LfsSizeIsTakenOverTheTopLevelSize) {
  // Some readers of the listing report a pointer-sized top-level "size" beside the real
  // lfs.size; the LFS object's record wins (a disagreeing file fails its Content-Range check).
  auto files = parse(
      R"([{"type":"file","oid":"a","size":135,"lfs":{"oid":"b","size":24000000000,"pointerSize":135},"path":"m.safetensors"}])");
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(files[0].bytes, 24'000'000'000u);
}

TEST(HubListing, MalformedPagesAreOneLineErrors) {
  ListingLimits small;
  small.max_entries = 2;
  small.max_page_bytes = 256;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"[", "not valid JSON"},
      {R"({"type":"file"})", "not a JSON array"},
      {R"([1])", "entry 0 is not an object"},
      {R"([{"type":"file","size":1}])", "entry 0 is not an object with"},
      {R"([{"type":"file","path":"a"}])", "gives 'a' no byte count"},
      {R"([{"type":"file","path":"a","size":1.5}])", "gives 'a' no byte count"},
      {R"([{"type":"file","path":"a","size":1,"lfs":{"oid":"x"}}])", "no byte count in lfs.size"},
      {R"([{"type":"file","path":"a","size":1125899906842625}])", "more than kvaudit accepts"},
      {R"([{"type":"file","path":"/etc/passwd","size":1}])", "unusable path"},
      {R"([{"type":"file","path":"a/../../b","size":1}])", "unusable path"},
      {R"([{"type":"file","path":"a\u0000b","size":1}])", "unusable path"},
      {R"([{"type":"directory","path":"a"},{"type":"directory","path":"b"},)"
       R"({"type":"directory","path":"c"}])",
       "more than 2 entries"},
      {"[" + std::string(300, ' ') + "]", "more than the 256 kvaudit reads"},
  };
  for (const auto& [body, expected] : cases) {
    SCOPED_TRACE(body);
    try {
      parse(body, small);
      ADD_FAILURE() << "accepted";
    } catch (const InputError& error) {
      EXPECT_THAT(error.what(), HasSubstr(expected));
      EXPECT_EQ(std::string(error.what()).find('\n'), std::string::npos);
    }
  }
  // Entries count over pages: the third entry overall is one too many.
  std::vector<ListedFile> files;
  size_t seen = 0;
  parse_listing_page(R"([{"type":"directory","path":"a"}])", "u", small, seen, files);
  parse_listing_page(R"([{"type":"file","path":"b","size":1}])", "u", small, seen, files);
  EXPECT_THROW(
      parse_listing_page(R"([{"type":"file","path":"c","size":1}])", "u", small, seen, files),
      InputError);
}

TEST(HubListing, NextPageFromTheLinkHeader) {
  const std::string first =
      "https://huggingface.co:443/api/models/org/m/tree/" + std::string(40, 'a');
  // The hub's own form (huggingface.js parseLinkHeader.ts), default port left out.
  const std::string next = "https://huggingface.co/api/models/org/m/tree/" + std::string(40, 'a') +
                           "?cursor=ZXlKbWFXeGw";
  // Returned on the listing's own spelling of its origin, so the fetcher sees one host.
  const std::string on_first = "https://huggingface.co:443" + next.substr(22);
  EXPECT_EQ(listing_next_page("<" + next + ">; rel=\"next\"", first, "u"), on_first);
  EXPECT_EQ(
      listing_next_page("<" + next + ">; rel=\"prev\", <" + next + "2>; rel=\"next\"", first, "u"),
      on_first + "2");
  // Hosts are case-insensitive (found by fuzz_hub_answers: the next page came back as the
  // hub spelled it, "hub.exaMple", not as the listing was asked).
  EXPECT_EQ(listing_next_page("<https://HuggingFace.CO" + next.substr(22) + ">; rel=\"next\"",
                              first, "u"),
            on_first);
  EXPECT_EQ(
      listing_next_page("</api/models/org/m/tree/" + std::string(40, 'a') + "?cursor=2>; rel=next",
                        first, "u"),
      "https://huggingface.co:443/api/models/org/m/tree/" + std::string(40, 'a') + "?cursor=2");
  EXPECT_FALSE(listing_next_page("", first, "u"));
  EXPECT_FALSE(listing_next_page("<" + next + ">; rel=\"prev\"", first, "u"));
  // Another host, repository or commit, or the path with more after it, is not this listing.
  for (const std::string& elsewhere :
       {"https://evil.example/api/models/org/m/tree/" + std::string(40, 'a') + "?cursor=1",
        "https://huggingface.co/api/models/org/other/tree/" + std::string(40, 'a'),
        "https://huggingface.co/api/models/org/m/tree/" + std::string(40, 'b') + "?cursor=1",
        "https://huggingface.co/api/models/org/m/tree/" + std::string(40, 'a') + "/sub",
        "https://huggingface.co/api/models/org/m/tree/" + std::string(40, 'a') + "?c=1 x"}) {
    SCOPED_TRACE(elsewhere);
    EXPECT_THROW(listing_next_page("<" + elsewhere + ">; rel=\"next\"", first, "u"), InputError);
  }
}

ListedFile file(std::string path, uint64_t bytes = 100) {
  return {std::move(path), bytes};
}

TEST(HubListing, ShardsAreWhatTheLocalReaderReads) {
  // No index: every top-level .safetensors, sorted; files in folders are not read.
  ListedShards plain =
      shards_from_listing({file("config.json"), file("b.safetensors"), file("a.safetensors"),
                           file("transformer/x.safetensors")},
                          "u");
  EXPECT_EQ(plain.why_not, "");
  EXPECT_EQ(paths(plain.shards), (std::vector<std::string>{"a.safetensors", "b.safetensors"}));
  // An index beside a complete set and Mistral's consolidated.safetensors: the set.
  ListedShards mistral = shards_from_listing(
      {file("consolidated.safetensors"), file("model-00002-of-00002.safetensors", 7),
       file("model-00001-of-00002.safetensors"), file("model.safetensors.index.json"),
       file("original/consolidated.00.pth")},
      "u");
  EXPECT_EQ(mistral.why_not, "");
  EXPECT_EQ(paths(mistral.shards), (std::vector<std::string>{"model-00001-of-00002.safetensors",
                                                             "model-00002-of-00002.safetensors"}));
  EXPECT_EQ(mistral.shards[1].bytes, 7u);
  // Six-digit counts (DeepSeek's model-00001-of-000163).
  EXPECT_EQ(shards_from_listing(
                {file("model.safetensors.index.json"), file("m-00001-of-000001.safetensors")}, "u")
                .shards.size(),
            1u);
  // An incomplete set, two complete sets, or no set: the index must say.
  for (const auto& files : std::vector<std::vector<ListedFile>>{
           {file("model.safetensors.index.json"), file("model-00001-of-00002.safetensors")},
           {file("model.safetensors.index.json"), file("a-00001-of-00001.safetensors"),
            file("b-00001-of-00001.safetensors")},
           {file("model.safetensors.index.json"), file("model.safetensors")},
           {file("model.safetensors.index.json"), file("model-00001-of-00002.safetensors"),
            file("model-00001-of-00002.safetensors.bak")}}) {
    ListedShards listed = shards_from_listing(files, "u");
    EXPECT_TRUE(listed.shards.empty());
    EXPECT_THAT(listed.why_not, HasSubstr("cannot tell the index's shards"));
  }
  EXPECT_THROW(shards_from_listing({file("a.safetensors"), file("a.safetensors")}, "u"),
               InputError);
}

}  // namespace
}  // namespace kvaudit::hub
