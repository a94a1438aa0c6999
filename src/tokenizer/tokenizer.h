// tokenizer: the Hugging Face byte-level BPE tokenizer (tokenizer.json), exact to the
// ids Hugging Face's own library produces, so that eval and probe feed a model exactly
// the tokens its serving engine would. It covers what byte-level BPE checkpoints ship
// (Qwen2/3, Llama 3, GPT-2 family): added and special tokens with their flags, NFC/NFD/
// NFKC/NFKD normalizers, Split (regex or literal) and ByteLevel pre-tokenizers, BPE
// merges, the ByteLevel decoder and a TemplateProcessing post-processor.
// It is not a chat-template renderer (the template string is only exposed), and it does
// not do SentencePiece/Unigram/WordPiece models: those are refused with an InputError.
//
// Text that is not valid UTF-8 is never rejected: every maximal ill-formed subsequence is
// replaced by U+FFFD first (Unicode's recommended practice, the same as Rust's
// String::from_utf8_lossy, Python's errors="replace" and JavaScript's TextDecoder), which
// is what a Hugging Face tokenizer sees once its caller has turned the bytes into a string.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvaudit::tokenizer {

using TokenId = int32_t;

// An entry of tokenizer.json "added_tokens": matched in the raw text before the model.
struct AddedToken {
  TokenId id = 0;
  std::string content;
  bool special = false;      // skipped by decode(skip_special_tokens)
  bool lstrip = false;       // swallows the whitespace on its left
  bool rstrip = false;       // swallows the whitespace on its right
  bool single_word = false;  // only matches when not inside a word
  bool normalized = false;   // matched against the normalized text instead of the raw text
};

// The fields of tokenizer_config.json a server or an eval needs. Token fields accept the
// plain string form and the {"content": ...} object form; null or absent leaves them empty.
struct TokenizerConfig {
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
  std::optional<std::string> pad_token;
  std::optional<std::string> unk_token;
  std::optional<TokenId> bos_token_id;  // resolved against the vocabulary, when present there
  std::optional<TokenId> eos_token_id;
  std::optional<TokenId> pad_token_id;
  bool add_bos_token = false;
  bool add_eos_token = false;
  std::optional<int64_t> model_max_length_tokens;
  // The Jinja chat template ("default" entry when the file lists several); empty if none.
  std::string chat_template;
};

struct EncodeOptions {
  // Apply the tokenizer.json post-processor (e.g. Llama 3 prepends <|begin_of_text|>).
  // Off by default: callers that build prompts add their own special tokens.
  bool add_special_tokens = false;
};

struct DecodeOptions {
  bool skip_special_tokens = false;
};

class Tokenizer {
 public:
  // Loads PATH/tokenizer.json and, when present, PATH/tokenizer_config.json. PATH may also
  // name tokenizer.json itself. Throws InputError on missing files, malformed JSON or a
  // tokenizer this implementation does not support (naming the unsupported part).
  static Tokenizer load(const std::filesystem::path& path);

  // Same, from the file contents; `where` names the source in error messages.
  static Tokenizer from_json(std::string_view tokenizer_json, std::string_view config_json,
                             std::string_view where);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Text to ids. Never throws on any input bytes (see the note on UTF-8 above). Safe to call
  // from several threads at once.
  std::vector<TokenId> encode(std::string_view text, const EncodeOptions& options = {}) const;

  // Ids to text. Ids outside the vocabulary are skipped, as Hugging Face does; byte
  // sequences that do not form UTF-8 become U+FFFD.
  std::string decode(std::span<const TokenId> ids, const DecodeOptions& options = {}) const;

  // The raw bytes one token stands for (added tokens: their content); nullopt if unknown.
  std::optional<std::string> token_bytes(TokenId id) const;
  // The vocabulary string of a token (byte-level alphabet, e.g. "Ġthe"), as in tokenizer.json.
  std::optional<std::string> id_to_token(TokenId id) const;
  // Looks a vocabulary string or added-token content up.
  std::optional<TokenId> token_to_id(std::string_view token) const;

  // One more than the largest id, added tokens included (the embedding rows it needs).
  size_t vocab_size() const;
  const std::vector<AddedToken>& added_tokens() const;
  const TokenizerConfig& config() const;

  // Normalization alone (NFC for Qwen3), after the U+FFFD replacement: what
  // decode(encode(text)) returns for text without special-token edge cases.
  std::string normalize(std::string_view text) const;

  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvaudit::tokenizer
