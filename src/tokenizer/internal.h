// tokenizer internals shared by the module's .cpp files; not part of its interface
// (other modules include tokenizer.h only). Each stage of the Hugging Face pipeline is a
// small value type: AddedTokenMatcher -> Normalizer -> PreTokenizer -> BpeModel.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace kvaudit::tokenizer::detail {

// ---- Unicode helpers (unicode.cpp) -------------------------------------------------------

bool is_valid_utf8(std::string_view bytes);
// Decodes the code point at `pos` of valid UTF-8 and advances pos past it.
char32_t next_code_point(std::string_view text, size_t& pos);
// The code point that ends `text` (valid UTF-8, non-empty).
char32_t last_code_point(std::string_view text);
// Unicode White_Space: what \s means in Oniguruma and Rust's regex crate (unlike PCRE2's
// \s, it includes U+0085; unlike JavaScript's, it excludes U+FEFF).
bool is_white_space(char32_t cp);
// Rust regex's Unicode \w: Alphabetic, marks, decimal digits, connector punctuation and
// the joiners (Other_Alphabetic symbols are limited to the circled/squared letters).
bool is_word_char(char32_t cp);
// The White_Space set as PCRE2 class items, to put inside [...].
extern const char* const kWhiteSpaceClassItems;
// Letters and numbers that Hugging Face's Oniguruma (Unicode 16) classifies as \p{L} / \p{N}
// and PCRE2 10.42 (Unicode 14) does not, as class items added to those properties.
const std::string& extra_letter_class_items();
const std::string& extra_number_class_items();

// GPT-2's bytes_to_unicode: each byte's stand-in character, UTF-8 encoded.
const std::array<std::string, 256>& byte_level_chars();
// The inverse: the byte a stand-in character means, or -1 for other characters.
int byte_level_byte(char32_t cp);
// What the ByteLevel decoder emits for one vocabulary string: the bytes its characters
// stand for, or the string itself when any character is not a stand-in (as HF does).
std::string byte_level_decode(std::string_view token);

enum class NormalForm { nfc, nfd, nfkc, nfkd };

// A sequence of Unicode normal forms (tokenizer.json "normalizer"). Empty: identity.
struct Normalizer {
  std::vector<NormalForm> forms;
  // Returns `text` unchanged (as a view into it) or a view into `storage`.
  std::string_view apply(std::string_view text, std::string& storage) const;
};

// ---- Pre-tokenization (pretokenize.cpp) -------------------------------------------------

// A compiled PCRE2 pattern (UTF + UCP + JIT), Hugging Face (Oniguruma) flavour.
class Regex {
 public:
  // `pattern` is in tokenizer.json syntax; `literal` compiles it as a plain string.
  Regex(std::string_view pattern, bool literal, std::string_view where);
  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;
  ~Regex();
  // Appends the [begin, end) byte ranges of every non-empty match of `text` to `matches`.
  void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& matches) const;

 private:
  void* code_ = nullptr;  // pcre2_code_8*
};

// Rewrites \s and \S to the White_Space set so PCRE2 matches as Oniguruma does.
std::string oniguruma_to_pcre2(std::string_view pattern, std::string_view where);

enum class SplitBehavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

struct PreTokenizerStep {
  enum class Kind { split, byte_level } kind = Kind::split;
  std::shared_ptr<const Regex> regex;  // split, or byte_level with use_regex
  SplitBehavior behavior = SplitBehavior::isolated;
  bool invert = false;
  bool add_prefix_space = false;  // byte_level only
};

// The pieces BPE sees. Views point into the text given to run() or into owned storage.
struct PreTokenizer {
  std::vector<PreTokenizerStep> steps;
  void run(std::string_view text, std::vector<std::string_view>& pieces,
           std::deque<std::string>& storage) const;
};

// GPT-2's pattern, which ByteLevel{use_regex: true} splits with.
extern const char* const kGpt2SplitPattern;

// ---- BPE model (bpe.cpp) -----------------------------------------------------------------

// Lets unordered_map<std::string, ...> be searched with a string_view without a copy.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view text) const { return std::hash<std::string_view>{}(text); }
};

// The vocabulary as flat tables (one text buffer, open addressing): 150K-entry maps of
// strings would cost a heap node each and most of the load time.
class Vocabulary {
 public:
  // Entries in file order; a repeated string keeps its last id, as serde's HashMap does.
  explicit Vocabulary(const std::vector<std::pair<std::string_view, TokenId>>& entries);
  std::optional<TokenId> find(std::string_view token) const;
  // The string of an id; empty when no entry has that id.
  std::string_view text(TokenId id) const;
  size_t entry_count() const { return entry_count_; }  // HF's get_vocab_size()
  size_t id_limit() const { return spans_.size(); }    // largest id + 1

 private:
  std::string arena_;                                 // every token string, back to back
  std::vector<std::pair<uint32_t, uint32_t>> spans_;  // [id_limit] offset, length in arena_
  std::vector<TokenId> slots_;                        // hash slots: id or -1
  size_t entry_count_ = 0;
};

// Ids of pieces already merged, in one open-addressing table whose slots hold short pieces
// and short results inline: a hit costs one cache line, not the four pointer hops of an
// unordered_map<string, vector>. Fixed capacity; once full it stops taking entries (HF's
// cache does the same). Not thread-safe: BpeModel guards it with a mutex.
class PieceCache {
 public:
  static constexpr size_t kMaxEntries = size_t{1} << 17;
  PieceCache();
  // Appends the cached ids of `piece` and returns true, or returns false.
  bool find(std::string_view piece, uint64_t hash, std::vector<TokenId>& ids) const;
  void insert(std::string_view piece, uint64_t hash, const TokenId* ids, size_t id_count);

 private:
  static constexpr size_t kInlineKeyBytes = 12;
  static constexpr size_t kInlineIds = 4;
  struct Slot {
    uint64_t hash = 0;  // 0 marks an empty slot (real hashes are forced non-zero)
    uint32_t key_length = 0;
    uint32_t id_count = 0;
    union {
      char inline_key[kInlineKeyBytes];
      uint32_t key_offset;  // into keys_, when key_length > kInlineKeyBytes
    };
    union {
      TokenId inline_ids[kInlineIds];
      uint32_t id_offset;  // into ids_, when id_count > kInlineIds
    };
  };
  std::string_view key_of(const Slot& slot) const;
  std::vector<Slot> slots_;  // [2 * kMaxEntries]
  size_t entries_ = 0;
  std::string keys_;          // long pieces, back to back
  std::vector<TokenId> ids_;  // long results, back to back
};

class BpeModel {
 public:
  // merges: pairs in rank order (first = merged first).
  BpeModel(Vocabulary vocab,
           const std::vector<std::pair<std::string_view, std::string_view>>& merges,
           bool ignore_merges, std::string_view where);

  // Appends the ids of one pre-tokenized piece (raw bytes, byte-level BPE).
  void encode_piece(std::string_view piece_bytes, std::vector<TokenId>& ids) const;

  const Vocabulary& vocab() const { return vocab_; }

 private:
  struct MergeTarget {
    uint32_t rank;
    TokenId id;
  };
  static uint64_t pair_key(TokenId left, TokenId right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }
  const MergeTarget* find_merge(TokenId left, TokenId right) const;
  void merge(std::string_view piece_bytes, std::vector<TokenId>& ids) const;

  Vocabulary vocab_;
  std::array<TokenId, 256> byte_ids_{};  // id of each byte's one-character token, -1 if none
  // Open-addressing table of merges: key (left id, right id), kNoMerge where empty.
  static constexpr uint64_t kNoMerge = ~uint64_t{0};
  std::vector<uint64_t> merge_keys_;
  std::vector<MergeTarget> merge_targets_;
  bool ignore_merges_ = false;

  // Pieces repeat (keywords, indentation); their ids are cached, as HF does, up to a bound.
  static constexpr size_t kCacheMaxPieceBytes = 256;
  mutable std::mutex cache_mutex_;
  mutable PieceCache cache_;
};

// ---- Added tokens (added_tokens.cpp) -----------------------------------------------------

struct Segment {
  std::string_view text;
  int added_index = -1;  // index into the token list, or -1 for ordinary text
};

// Finds added tokens the way HF's AddedVocabulary does: leftmost-longest matches,
// non-overlapping, then the single_word / lstrip / rstrip adjustments.
class AddedTokenMatcher {
 public:
  // patterns[i] is what token i is matched as (its content, normalized for normalized
  // tokens); `indices` are the token-list indices this matcher covers.
  AddedTokenMatcher(const std::vector<AddedToken>& tokens, const std::vector<std::string>& patterns,
                    const std::vector<int>& indices);
  bool empty() const { return nodes_.size() <= 1; }
  void split(std::string_view text, std::vector<Segment>& segments) const;

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> children;  // sorted by byte
    int32_t token_index = -1;                                 // token ending here
  };
  std::vector<AddedToken> tokens_;      // the flags of every token (copied: small)
  std::vector<Node> nodes_;             // nodes_[0] is the root
  std::array<bool, 256> first_byte_{};  // bytes that can start a match
};

// ---- The whole tokenizer (load.cpp builds it, tokenizer.cpp runs it) ----------------------

// One element of a TemplateProcessing "single" template: the text's ids, or fixed ids.
struct TemplateItem {
  bool is_sequence = false;
  std::vector<TokenId> ids;
};

}  // namespace kvaudit::tokenizer::detail

namespace kvaudit::tokenizer {

struct Tokenizer::Impl {
  std::string where;  // the tokenizer's path, for messages
  std::unique_ptr<detail::BpeModel> model;
  std::vector<AddedToken> added;  // in tokenizer.json order, ids as HF assigns them
  std::unordered_map<std::string, int, detail::StringHash, std::equal_to<>> added_by_content;
  std::unordered_map<TokenId, int> added_by_id;
  detail::Normalizer normalizer;
  std::unique_ptr<detail::AddedTokenMatcher> raw_matcher;         // normalized == false
  std::unique_ptr<detail::AddedTokenMatcher> normalized_matcher;  // normalized == true
  detail::PreTokenizer pre_tokenizer;
  std::vector<detail::TemplateItem> single_template;  // empty: the post-processor adds nothing
  std::vector<std::string> token_bytes;               // [vocab_size] what decode emits per id
  std::vector<bool> token_known;                      // [vocab_size] false for ids no token has
  std::vector<bool> token_special;                    // [vocab_size] skipped by skip_special_tokens
  TokenizerConfig config;
};

}  // namespace kvaudit::tokenizer
