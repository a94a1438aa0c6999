// The tokenizer's rules on small hand-built tokenizer.json files, where every expected id
// can be worked out by hand: merge order, both merge formats, added-token flags
// (lstrip, rstrip, single_word, normalized), split behaviours, the GPT-2 style ByteLevel
// pre-tokenizer, the post-processor template, UTF-8 repair and refused inputs.
#include <gtest/gtest.h>

#include <cstdlib>
#include <random>
#include <string>
#include <thread>

#include <utf8proc.h>

#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"
#include "util/util.h"

namespace kvaudit::tokenizer {
namespace {

using nlohmann::json;

// GPT-2's bytes_to_unicode, written again here so the test does not share the library's table.
std::string byte_char(int byte) {
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    int code_point = printable ? b : 256 + extra++;
    if (b != byte) continue;
    std::string out;
    if (code_point < 0x80) {
      out += static_cast<char>(code_point);
    } else {
      out += static_cast<char>(0xC0 | (code_point >> 6));
      out += static_cast<char>(0x80 | (code_point & 0x3F));
    }
    return out;
  }
  return "";
}

// A byte-level BPE whose byte b has id b; merged tokens follow from 256 in merge order.
struct TinyTokenizer {
  json vocab = json::object();
  json merges = json::array();
  json added = json::array();
  json normalizer = nullptr;
  json pre_tokenizer = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}};
  json post_processor = nullptr;
  bool pair_merges = false;
  int next_id = 256;

  TinyTokenizer() {
    for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  }
  // Adds the merge "left right" (ASCII) and returns the merged token's id.
  int merge(const std::string& left, const std::string& right) {
    std::string joined = left + right;
    if (!vocab.contains(joined)) vocab[joined] = next_id++;
    if (pair_merges) {
      merges.push_back(json::array({left, right}));
    } else {
      merges.push_back(left + " " + right);
    }
    return vocab[joined];
  }
  int add_token(const std::string& content, json flags) {
    json token = {{"id", next_id},   {"content", content}, {"single_word", false},
                  {"lstrip", false}, {"rstrip", false},    {"normalized", false},
                  {"special", true}};
    token.update(flags);
    added.push_back(token);
    return next_id++;
  }
  Tokenizer build() const {
    json file = {{"version", "1.0"},
                 {"added_tokens", added},
                 {"normalizer", normalizer},
                 {"pre_tokenizer", pre_tokenizer},
                 {"post_processor", post_processor},
                 {"decoder", {{"type", "ByteLevel"}}},
                 {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}}};
    return Tokenizer::from_json(file.dump(), "", "tiny");
  }
};

std::vector<TokenId> bytes_of(std::string_view text) {
  std::vector<TokenId> ids;
  for (char c : text) ids.push_back(static_cast<unsigned char>(c));
  return ids;
}

std::vector<TokenId> concat(std::initializer_list<std::vector<TokenId>> parts) {
  std::vector<TokenId> out;
  for (const auto& part : parts) out.insert(out.end(), part.begin(), part.end());
  return out;
}

TEST(TokenizerRules, MergesApplyLowestRankFirstThenLeftmost) {
  TinyTokenizer rank_bc_first;
  int bc = rank_bc_first.merge("b", "c");
  rank_bc_first.merge("a", "b");
  EXPECT_EQ(rank_bc_first.build().encode("abc"), (std::vector<TokenId>{'a', bc}));

  TinyTokenizer rank_ab_first;
  int ab = rank_ab_first.merge("a", "b");
  rank_ab_first.merge("b", "c");
  int abab = rank_ab_first.merge("ab", "ab");
  Tokenizer tokenizer = rank_ab_first.build();
  EXPECT_EQ(tokenizer.encode("abc"), (std::vector<TokenId>{ab, 'c'}));
  EXPECT_EQ(tokenizer.encode("ababab"), (std::vector<TokenId>{abab, ab}));

  TinyTokenizer ties;
  int aa = ties.merge("a", "a");
  EXPECT_EQ(ties.build().encode("aaa"), (std::vector<TokenId>{aa, 'a'}));
  EXPECT_EQ(ties.build().encode("aaaa"), (std::vector<TokenId>{aa, aa}));
}

TEST(TokenizerRules, StringAndPairMergeFormatsAgree) {
  for (bool pair_merges : {false, true}) {
    TinyTokenizer tiny;
    tiny.pair_merges = pair_merges;
    int he = tiny.merge("h", "e");
    int ll = tiny.merge("l", "l");
    int hell = tiny.merge("he", "ll");
    Tokenizer tokenizer = tiny.build();
    EXPECT_EQ(tokenizer.encode("hello"), (std::vector<TokenId>{hell, 'o'})) << pair_merges;
    EXPECT_EQ(tokenizer.encode("hexll"), (std::vector<TokenId>{he, 'x', ll})) << pair_merges;
    EXPECT_EQ(tokenizer.decode(tokenizer.encode("hello")), "hello");
  }
}

TEST(TokenizerRules, AddedTokenFlagsFollowHuggingFace) {
  TinyTokenizer tiny;
  tiny.normalizer = {{"type", "NFC"}};
  int left = tiny.add_token("<x>", {{"lstrip", true}});
  int right = tiny.add_token("<y>", {{"rstrip", true}, {"special", false}});
  int word = tiny.add_token("tok", {{"single_word", true}, {"special", false}});
  int plain = tiny.add_token("<z>", json::object());
  int double_plain = tiny.add_token("<z><z>", json::object());
  // Matched after NFC, and its own content is normalized first: NFD text in the file.
  int accent = tiny.add_token("e\xCC\x81", {{"normalized", true}, {"special", false}});
  Tokenizer tokenizer = tiny.build();

  EXPECT_EQ(tokenizer.encode("a  <x>b"), (std::vector<TokenId>{'a', left, 'b'}));
  EXPECT_EQ(tokenizer.encode("a\xE3\x80\x80<x>"), (std::vector<TokenId>{'a', left}));  // U+3000
  EXPECT_EQ(tokenizer.encode("a<y> \t b"), (std::vector<TokenId>{'a', right, 'b'}));
  // rstrip took the spaces, so lstrip has none left to take.
  EXPECT_EQ(tokenizer.encode("<y>  <x>"), (std::vector<TokenId>{right, left}));
  EXPECT_EQ(tokenizer.encode("tok tokx xtok tok"),
            concat({{word, ' '}, bytes_of("tokx xtok "), {word}}));
  EXPECT_EQ(tokenizer.encode("(tok)"), (std::vector<TokenId>{'(', word, ')'}));
  EXPECT_EQ(tokenizer.encode("a<z>b<z><z><z>"),
            (std::vector<TokenId>{'a', plain, 'b', double_plain, plain}));
  EXPECT_EQ(tokenizer.encode("caf\xC3\xA9"), concat({bytes_of("caf"), {accent}}));
  EXPECT_EQ(tokenizer.encode("cafe\xCC\x81"), concat({bytes_of("caf"), {accent}}));
  // Non-normalized tokens are matched before normalization; NFC never touches them.
  EXPECT_EQ(tokenizer.encode("<z>\xCC\x81"), concat({{plain}, bytes_of("\xCC\x81")}));

  std::vector<TokenId> ids = {'a', left, right, plain, 'b'};
  EXPECT_EQ(tokenizer.decode(ids), "a<x><y><z>b");
  EXPECT_EQ(tokenizer.decode(ids, {.skip_special_tokens = true}), "a<y>b");
  EXPECT_EQ(tokenizer.token_to_id("<y>"), right);
  EXPECT_EQ(tokenizer.id_to_token(accent), "e\xCC\x81");
  EXPECT_EQ(tokenizer.vocab_size(), static_cast<size_t>(accent + 1));
}

TEST(TokenizerRules, SplitBehavioursDecideWhereMergesMayApply) {
  auto encode_with = [](json split, std::string_view text) {
    TinyTokenizer tiny;
    tiny.merge("a", "b");
    tiny.merge("b", "b");
    tiny.pre_tokenizer = {
        {"type", "Sequence"},
        {"pretokenizers",
         json::array(
             {split, {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}};
    return tiny.build().encode(text);
  };
  const int ab = 256, bb = 257;
  json on_b = {{"type", "Split"}, {"pattern", {{"Regex", "b"}}}, {"invert", false}};
  auto with = [&](const char* behavior) {
    json split = on_b;
    split["behavior"] = behavior;
    return split;
  };
  EXPECT_EQ(encode_with(with("Isolated"), "ab"), (std::vector<TokenId>{'a', 'b'}));
  EXPECT_EQ(encode_with(with("MergedWithPrevious"), "ab"), (std::vector<TokenId>{ab}));
  json on_a_merged_with_next = {
      {"type", "Split"}, {"pattern", {{"Regex", "a"}}}, {"behavior", "MergedWithNext"}};
  EXPECT_EQ(encode_with(on_a_merged_with_next, "ab"), (std::vector<TokenId>{ab}));
  on_a_merged_with_next["behavior"] = "Isolated";
  EXPECT_EQ(encode_with(on_a_merged_with_next, "ab"), (std::vector<TokenId>{'a', 'b'}));
  EXPECT_EQ(encode_with(with("Removed"), "abab"), (std::vector<TokenId>{'a', 'a'}));
  EXPECT_EQ(encode_with(with("Contiguous"), "abbb"), (std::vector<TokenId>{'a', bb, 'b'}));
  json inverted = with("Removed");
  inverted["invert"] = true;  // now the non-b text is what gets removed
  EXPECT_EQ(encode_with(inverted, "abcb"), (std::vector<TokenId>{'b', 'b'}));
  json literal = {{"type", "Split"},
                  {"pattern", {{"String", "."}}},
                  {"behavior", "Removed"},
                  {"invert", false}};
  EXPECT_EQ(encode_with(literal, "a.b"), (std::vector<TokenId>{'a', 'b'}));
  EXPECT_EQ(encode_with(literal, "ab"), (std::vector<TokenId>{ab}));  // "." is not a wildcard
}

TEST(TokenizerRules, Gpt2StyleByteLevelAddsPrefixSpaceAndSplits) {
  TinyTokenizer tiny;
  tiny.pre_tokenizer = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
  int space_h = tiny.merge(byte_char(' '), "h");
  int space_hi = tiny.merge(byte_char(' ') + "h", "i");
  Tokenizer tokenizer = tiny.build();
  EXPECT_EQ(tokenizer.encode("hi"), (std::vector<TokenId>{space_hi}));
  EXPECT_EQ(tokenizer.encode(" hi"), (std::vector<TokenId>{space_hi}));
  // "hi's hh": the contraction and the spaces are their own pieces.
  EXPECT_EQ(tokenizer.encode("hi's hh"), (std::vector<TokenId>{space_hi, '\'', 's', space_h, 'h'}));
  EXPECT_EQ(tokenizer.decode(tokenizer.encode("hi")), " hi");
}

TEST(TokenizerRules, TemplatePostProcessorAddsSpecialTokensOnRequest) {
  TinyTokenizer tiny;
  int bos = tiny.add_token("<s>", json::object());
  tiny.post_processor = {
      {"type", "Sequence"},
      {"processors",
       json::array({{{"type", "ByteLevel"}, {"trim_offsets", false}},
                    {{"type", "TemplateProcessing"},
                     {"single", json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                             {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
                     {"pair", json::array()},
                     {"special_tokens",
                      {{"<s>", {{"id", "<s>"}, {"ids", {bos}}, {"tokens", {"<s>"}}}}}}}})}};
  Tokenizer tokenizer = tiny.build();
  EXPECT_EQ(tokenizer.encode("ab", {.add_special_tokens = true}),
            (std::vector<TokenId>{bos, 'a', 'b'}));
  EXPECT_EQ(tokenizer.encode("ab"), (std::vector<TokenId>{'a', 'b'}));
}

TEST(TokenizerRules, Utf8RepairReplacesMaximalSubparts) {
  const std::string r = "\xEF\xBF\xBD";
  // Boundary code points survive untouched.
  std::string valid =
      "\x7F\xC2\x80\xDF\xBF\xE0\xA0\x80\xEF\xBF\xBF\xF0\x90\x80\x80\xF4\x8F\xBF\xBF";
  EXPECT_EQ(to_valid_utf8(valid), valid);
  EXPECT_EQ(to_valid_utf8(std::string("a\0b", 3)), std::string("a\0b", 3));
  EXPECT_EQ(to_valid_utf8("\x80"), r);
  EXPECT_EQ(to_valid_utf8("\xF0\x9F\x98"), r);  // one truncated sequence, one U+FFFD
  EXPECT_EQ(to_valid_utf8("\xF0\x9F\x98"
                          "a"),
            r + "a");
  EXPECT_EQ(to_valid_utf8("\xE0\x80\x80"), r + r + r);  // overlong: E0 needs A0..BF next
  EXPECT_EQ(to_valid_utf8("\xED\xBF\xBF"), r + r + r);  // surrogate
  EXPECT_EQ(to_valid_utf8("\xF5\x80"), r + r);
  EXPECT_EQ(to_valid_utf8("\xC2"), r);
}

// The normalizer only sends the chunks between ASCII characters that need it through
// utf8proc; the result must equal normalizing the whole text at once.
TEST(TokenizerRules, ChunkedNormalizationEqualsWholeTextNfc) {
  TinyTokenizer tiny;
  tiny.normalizer = {{"type", "NFC"}};
  Tokenizer tokenizer = tiny.build();
  const std::string pieces[] = {"a",
                                "e",
                                " ",
                                "<",
                                "=",
                                "\n",
                                "\xCC\x81",
                                "\xCC\xB8",
                                "\xCC\xA3",
                                "\xCC\x82",
                                "\xC3\xA9",
                                "\xE1\x84\x92",
                                "\xE1\x85\xA1",
                                "\xE1\x86\xAB",
                                "\xEA\xB0\x80",
                                "\xE2\x84\xAB",
                                "\xE4\xB8\xAD",
                                "\xF0\x9F\x91\x8D"};
  std::mt19937 random(7);
  std::uniform_int_distribution<size_t> pick(0, std::size(pieces) - 1);
  for (int trial = 0; trial < 2000; ++trial) {
    std::string text;
    for (int i = 0; i < 24; ++i) text += pieces[pick(random)];
    utf8proc_uint8_t* whole = utf8proc_NFC(reinterpret_cast<const utf8proc_uint8_t*>(text.c_str()));
    ASSERT_NE(whole, nullptr);
    std::string expected(reinterpret_cast<const char*>(whole));
    std::free(whole);
    EXPECT_EQ(tokenizer.normalize(text), expected) << "trial " << trial;
  }
  EXPECT_EQ(tokenizer.normalize("a<\xCC\xB8"
                                "b"),
            "a\xE2\x89\xAE"
            "b");  // < + U+0338 = U+226E
}

TEST(TokenizerRules, ConcurrentEncodesAgree) {
  TinyTokenizer tiny;
  tiny.merge("a", "b");
  tiny.merge("ab", "c");
  Tokenizer tokenizer = tiny.build();
  std::string text;
  for (int i = 0; i < 2000; ++i) text += "abc ab" + std::to_string(i % 97) + " ";
  std::vector<TokenId> expected = tokenizer.encode(text);
  std::vector<std::vector<TokenId>> results(4);
  std::vector<std::thread> threads;
  for (auto& result : results) {
    threads.emplace_back([&tokenizer, &text, &result] { result = tokenizer.encode(text); });
  }
  for (auto& thread : threads) thread.join();
  for (const auto& result : results) EXPECT_EQ(result, expected);
}

TEST(TokenizerRules, UnsupportedOrBrokenFilesAreInputErrors) {
  auto fails_with = [](const json& file, const std::string& needle) {
    try {
      Tokenizer::from_json(file.dump(), "", "bad.json");
    } catch (const InputError& error) {
      EXPECT_NE(std::string(error.what()).find(needle), std::string::npos) << error.what();
      return;
    }
    ADD_FAILURE() << "no InputError for " << needle;
  };
  TinyTokenizer tiny;
  json base = {{"added_tokens", json::array()},
               {"normalizer", nullptr},
               {"pre_tokenizer", tiny.pre_tokenizer},
               {"decoder", {{"type", "ByteLevel"}}},
               {"model", {{"type", "BPE"}, {"vocab", tiny.vocab}, {"merges", json::array()}}}};
  json unigram = base;
  unigram["model"]["type"] = "Unigram";
  fails_with(unigram, "Unigram");
  json lowercase = base;
  lowercase["normalizer"] = {{"type", "Lowercase"}};
  fails_with(lowercase, "Lowercase");
  json metaspace = base;
  metaspace["pre_tokenizer"] = {{"type", "Metaspace"}};
  fails_with(metaspace, "Metaspace");
  json no_byte_level = base;
  no_byte_level["pre_tokenizer"] = nullptr;
  fails_with(no_byte_level, "byte-level");
  json bad_merge = base;
  bad_merge["model"]["merges"] = json::array({"a zz"});
  fails_with(bad_merge, "merge #0");
  json nested_class = base;
  nested_class["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       json::array(
           {{{"type", "Split"}, {"pattern", {{"Regex", "[a[b]]"}}}, {"behavior", "Isolated"}},
            tiny.pre_tokenizer})}};
  fails_with(nested_class, "nested character class");
  json broken_regex = nested_class;
  broken_regex["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  fails_with(broken_regex, "does not compile");

  EXPECT_THROW(Tokenizer::from_json("{not json", "", "x"), InputError);
  EXPECT_THROW(Tokenizer::from_json(base.dump(), "[1,2]", "x"), InputError);
  EXPECT_THROW(Tokenizer::load("/nonexistent/kvaudit/tokenizer"), InputError);
}

TEST(TokenizerRules, ConfigAcceptsObjectTokensAndTemplateLists) {
  TinyTokenizer tiny;
  int bos = tiny.add_token("<s>", json::object());
  json file = {{"added_tokens", tiny.added},
               {"pre_tokenizer", tiny.pre_tokenizer},
               {"decoder", {{"type", "ByteLevel"}}},
               {"model", {{"type", "BPE"}, {"vocab", tiny.vocab}, {"merges", json::array()}}}};
  json config = {{"bos_token", {{"content", "<s>"}, {"lstrip", false}}},
                 {"eos_token", "</s>"},
                 {"add_bos_token", true},
                 {"model_max_length", 1e30},
                 {"chat_template", json::array({{{"name", "tool_use"}, {"template", "T"}},
                                                {{"name", "default"}, {"template", "D"}}})}};
  Tokenizer tokenizer = Tokenizer::from_json(file.dump(), config.dump(), "tiny");
  EXPECT_EQ(tokenizer.config().bos_token, "<s>");
  EXPECT_EQ(tokenizer.config().bos_token_id, bos);
  EXPECT_EQ(tokenizer.config().eos_token, "</s>");
  EXPECT_FALSE(tokenizer.config().eos_token_id.has_value());  // not in this vocabulary
  EXPECT_TRUE(tokenizer.config().add_bos_token);
  EXPECT_FALSE(tokenizer.config().model_max_length_tokens.has_value());
  EXPECT_EQ(tokenizer.config().chat_template, "D");
}

}  // namespace
}  // namespace kvaudit::tokenizer
