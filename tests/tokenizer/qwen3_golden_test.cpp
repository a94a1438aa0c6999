// The tokenizer against Hugging Face on the real Qwen3 tokenizer: every golden in
// tests/fixtures/tokenizer/golden.json (made by tools/goldens/ with @lenml/tokenizers and
// HF's Rust tokenizers) must come out id for id, and decode must give back what HF's
// decode gives. Each TEST loads the 11 MB tokenizer.json once, so there are few of them.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"
#include "util/util.h"

namespace kvaudit::tokenizer {
namespace {

namespace fs = std::filesystem;

fs::path qwen3_dir() {
  if (const char* dir = std::getenv("KVAUDIT_QWEN3_TOKENIZER")) return dir;
  return fs::path(KVAUDIT_QWEN3_TOKENIZER_DIR);
}

const Tokenizer& qwen3() {
  static const Tokenizer tokenizer = Tokenizer::load(qwen3_dir());
  return tokenizer;
}

nlohmann::json goldens() {
  return nlohmann::json::parse(
      read_text_file(fs::path(KVAUDIT_TEST_DIR) / "fixtures" / "tokenizer" / "golden.json"));
}

std::string show(const std::vector<TokenId>& ids) {
  std::string out;
  for (TokenId id : ids) out += std::to_string(id) + " ";
  return out;
}

TEST(Qwen3Tokenizer, EncodesEveryGoldenExactlyAndDecodesAsHuggingFace) {
  const Tokenizer& tokenizer = qwen3();
  nlohmann::json golden = goldens();
  const auto& cases = golden.at("cases");
  ASSERT_GE(cases.size(), 60u);
  size_t disagreements = 0;
  for (const auto& entry : cases) {
    std::string name = entry.at("name");
    std::string text = entry.at("text");
    // Where the JavaScript port and HF's Rust library disagree, HF itself is the reference.
    std::vector<TokenId> expected =
        entry.contains("hf_rust_ids") ? entry.at("hf_rust_ids") : entry.at("ids");
    if (entry.contains("hf_rust_ids")) ++disagreements;
    std::vector<TokenId> ids = tokenizer.encode(text);
    EXPECT_EQ(ids, expected) << name << "\n got      " << show(ids) << "\n expected "
                             << show(expected);
    EXPECT_EQ(tokenizer.decode(ids), entry.at("nfc").get<std::string>()) << name;
    EXPECT_EQ(tokenizer.decode(ids), entry.at("decoded").get<std::string>()) << name;
    EXPECT_EQ(tokenizer.decode(ids, {.skip_special_tokens = true}),
              entry.at("decoded_skip_special").get<std::string>())
        << name;
  }
  // The oracles differ only where JavaScript's \s differs from Oniguruma's (U+0085, U+FEFF)
  // and where ICU's NFC knows combining marks that HF's normalization tables predate.
  EXPECT_EQ(disagreements, 2u);
}

TEST(Qwen3Tokenizer, ExposesConfigAddedTokensAndVocabulary) {
  const Tokenizer& tokenizer = qwen3();
  const TokenizerConfig& config = tokenizer.config();
  EXPECT_EQ(config.eos_token, "<|im_end|>");
  EXPECT_EQ(config.eos_token_id, 151645);
  EXPECT_EQ(config.pad_token, "<|endoftext|>");
  EXPECT_EQ(config.pad_token_id, 151643);
  EXPECT_FALSE(config.bos_token.has_value());
  EXPECT_FALSE(config.add_bos_token);
  EXPECT_EQ(config.model_max_length_tokens, 131072);
  EXPECT_NE(config.chat_template.find("<|im_start|>assistant"), std::string::npos);

  EXPECT_EQ(tokenizer.vocab_size(), 151669u);
  ASSERT_EQ(tokenizer.added_tokens().size(), 26u);
  // HF assigns added-token ids on load; for Qwen3 they agree with the ids the files list
  // (tokenizer_config.json's added_tokens_decoder repeats them and is quick to parse).
  nlohmann::json config_file =
      nlohmann::json::parse(read_text_file(qwen3_dir() / "tokenizer_config.json"));
  const auto& listed = config_file.at("added_tokens_decoder");
  ASSERT_EQ(listed.size(), 26u);
  for (const AddedToken& token : tokenizer.added_tokens()) {
    const auto& entry = listed.at(std::to_string(token.id));
    EXPECT_EQ(entry.at("content").get<std::string>(), token.content);
    EXPECT_EQ(entry.at("special").get<bool>(), token.special) << token.content;
    EXPECT_FALSE(token.normalized || token.lstrip || token.rstrip || token.single_word);
  }
  EXPECT_EQ(tokenizer.token_to_id("<think>"), 151667);
  EXPECT_EQ(tokenizer.token_to_id("Ġthe"), 279);
  EXPECT_EQ(tokenizer.id_to_token(279), "Ġthe");
  EXPECT_EQ(tokenizer.token_bytes(279), " the");
  EXPECT_EQ(tokenizer.token_bytes(151645), "<|im_end|>");
  EXPECT_FALSE(tokenizer.token_bytes(151669).has_value());
  EXPECT_FALSE(tokenizer.token_to_id("no such token").has_value());
  // Qwen3's post-processor adds nothing, with or without add_special_tokens.
  EXPECT_EQ(tokenizer.encode("hi", {.add_special_tokens = true}), tokenizer.encode("hi"));
}

TEST(Qwen3Tokenizer, InvalidUtf8BecomesReplacementCharactersNeverACrash) {
  const Tokenizer& tokenizer = qwen3();
  const std::string replacement = "\xEF\xBF\xBD";
  // Truncated sequence, lone continuation, surrogate, overlong, beyond U+10FFFF, 0xFF.
  std::string bad = "ok \xE4\xB8 x\x80y\xED\xA0\x80z\xC0\xAF\xF4\x90\x80\x80\xFF end";
  std::string repaired = to_valid_utf8(bad);
  EXPECT_EQ(repaired, "ok " + replacement + " x" + replacement + "y" + replacement + replacement +
                          replacement + "z" + replacement + replacement + replacement +
                          replacement + replacement + replacement + replacement + " end");
  EXPECT_EQ(tokenizer.encode(bad), tokenizer.encode(repaired));
  EXPECT_EQ(tokenizer.decode(tokenizer.encode(bad)), repaired);
  // A token that is half a character decodes to U+FFFD, as HF's from_utf8_lossy does.
  std::vector<TokenId> half = {*tokenizer.token_to_id("ä"), 9707};  // byte 0xE4, then "Hello"
  EXPECT_EQ(tokenizer.decode(half), replacement + "Hello");
  // Unknown and negative ids are skipped, as HF does.
  std::vector<TokenId> unknown = {9707, -5, 1 << 28, 1879};
  EXPECT_EQ(tokenizer.decode(unknown), "Hello world");
  // Any id sequence decodes to valid UTF-8.
  std::mt19937 random(99);
  std::uniform_int_distribution<TokenId> any_id(-10, 151700);
  for (int trial = 0; trial < 500; ++trial) {
    std::vector<TokenId> ids(static_cast<size_t>(trial % 17));
    for (TokenId& id : ids) id = any_id(random);
    std::string text = tokenizer.decode(ids, {.skip_special_tokens = trial % 2 == 0});
    EXPECT_EQ(to_valid_utf8(text), text) << "trial " << trial;
  }
}

TEST(Qwen3Tokenizer, RandomBytesRoundTripToTheirNormalizedText) {
  const Tokenizer& tokenizer = qwen3();
  std::mt19937 random(20251129);
  // Bytes drawn to hit ASCII, whitespace, multibyte sequences and broken ones.
  const std::string alphabet_pieces[] = {"a",
                                         "Z",
                                         "0",
                                         "7",
                                         " ",
                                         "  ",
                                         "\t",
                                         "\n",
                                         "\r\n",
                                         "'s",
                                         "'",
                                         ".",
                                         "\xC3\xA9",
                                         "e\xCC\x81",
                                         "\xE4\xB8\xAD",
                                         "\xF0\x9F\x98\x80",
                                         "\xE2\x80\x8D",
                                         "\xC2\x85",
                                         "\xEF\xBB\xBF",
                                         "\xE3\x80\x80",
                                         "\x80",
                                         "\xE4",
                                         "\xFF",
                                         "<|im_end|>",
                                         "<think>",
                                         "<|im_"};
  std::uniform_int_distribution<size_t> pick(0, std::size(alphabet_pieces) - 1);
  std::uniform_int_distribution<size_t> length(0, 40);
  for (int trial = 0; trial < 3000; ++trial) {
    std::string text;
    for (size_t i = length(random); i > 0; --i) text += alphabet_pieces[pick(random)];
    std::vector<TokenId> ids = tokenizer.encode(text);
    // Normalizing the whole text equals normalizing each section here: no piece starts
    // with a combining mark right after a special token.
    EXPECT_EQ(tokenizer.decode(ids), tokenizer.normalize(text)) << "trial " << trial;
  }
}

TEST(Qwen3Tokenizer, LongPathologicalInputsStayLinear) {
  const Tokenizer& tokenizer = qwen3();
  // Each of the first four is one long piece for BPE (HF does O(n log n) work there too).
  const std::string inputs[] = {std::string(1 << 17, ' '), std::string(1 << 17, 'a'),
                                std::string(200000, '7'), std::string(1 << 17, '\n') + "x", [] {
                                  std::string mixed;
                                  for (int i = 0; i < 50000; ++i) mixed += " \t\r\n !?\xE3\x80\x80";
                                  return mixed;
                                }()};
  for (const std::string& text : inputs) {
    std::vector<TokenId> ids = tokenizer.encode(text);
    EXPECT_FALSE(ids.empty());
    EXPECT_EQ(tokenizer.decode(ids), text);
  }
  // Qwen splits digits one by one.
  EXPECT_EQ(tokenizer.encode(std::string(200000, '7')).size(), 200000u);
}

}  // namespace
}  // namespace kvaudit::tokenizer
