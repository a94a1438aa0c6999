// Added-token splitting, after tokenizers' AddedVocabulary::find_matches: a leftmost-
// longest search (a byte trie here, Aho-Corasick there; both report the same matches),
// resuming after each match even when a flag rejects it, then single_word, lstrip and
// rstrip exactly as the Rust code applies them.
#include <algorithm>

#include "tokenizer/internal.h"

namespace kvaudit::tokenizer::detail {

AddedTokenMatcher::AddedTokenMatcher(const std::vector<AddedToken>& tokens,
                                     const std::vector<std::string>& patterns,
                                     const std::vector<int>& indices)
    : tokens_(tokens) {
  nodes_.emplace_back();
  for (int index : indices) {
    const std::string& pattern = patterns[static_cast<size_t>(index)];
    if (pattern.empty()) continue;
    first_byte_[static_cast<unsigned char>(pattern[0])] = true;
    int32_t node = 0;
    for (char c : pattern) {
      auto byte = static_cast<unsigned char>(c);
      auto& children = nodes_[static_cast<size_t>(node)].children;
      auto it =
          std::lower_bound(children.begin(), children.end(), byte,
                           [](const auto& child, unsigned char b) { return child.first < b; });
      if (it != children.end() && it->first == byte) {
        node = it->second;
      } else {
        int32_t created = static_cast<int32_t>(nodes_.size());
        children.insert(it, {byte, created});
        nodes_.emplace_back();  // invalidates `children`; not used again this iteration
        node = created;
      }
    }
    // Two tokens with the same text: the first one listed wins, as in the Aho-Corasick
    // automaton (lowest pattern id).
    if (nodes_[static_cast<size_t>(node)].token_index < 0) {
      nodes_[static_cast<size_t>(node)].token_index = index;
    }
  }
}

namespace {

size_t leading_white_space_bytes(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t next = pos;
    if (!is_white_space(next_code_point(text, next))) break;
    pos = next;
  }
  return pos;
}

// Start of the whitespace run that ends `text` (text.size() when there is none).
size_t trailing_white_space_start(std::string_view text) {
  size_t start = text.size();
  while (start > 0) {
    size_t begin = start - 1;
    while (begin > 0 && (static_cast<unsigned char>(text[begin]) & 0xC0) == 0x80) --begin;
    size_t pos = begin;
    if (!is_white_space(next_code_point(text, pos))) break;
    start = begin;
  }
  return start;
}

}  // namespace

void AddedTokenMatcher::split(std::string_view text, std::vector<Segment>& segments) const {
  const size_t length = text.size();
  if (empty()) {
    if (length > 0) segments.push_back({text, -1});
    return;
  }
  size_t start_offset = 0;  // end of the last emitted segment
  size_t pos = 0;
  while (pos < length) {
    if (!first_byte_[static_cast<unsigned char>(text[pos])]) {
      ++pos;
      continue;
    }
    // Longest pattern starting at pos.
    int32_t node = 0;
    int token_index = -1;
    size_t match_end = 0;
    for (size_t j = pos; j < length; ++j) {
      const auto& children = nodes_[static_cast<size_t>(node)].children;
      auto byte = static_cast<unsigned char>(text[j]);
      auto it =
          std::lower_bound(children.begin(), children.end(), byte,
                           [](const auto& child, unsigned char b) { return child.first < b; });
      if (it == children.end() || it->first != byte) break;
      node = it->second;
      if (nodes_[static_cast<size_t>(node)].token_index >= 0) {
        token_index = nodes_[static_cast<size_t>(node)].token_index;
        match_end = j + 1;
      }
    }
    if (token_index < 0) {
      ++pos;
      continue;
    }
    const AddedToken& token = tokens_[static_cast<size_t>(token_index)];
    size_t start = pos, stop = match_end;
    pos = match_end;  // the search resumes here whatever the flags decide
    if (token.single_word) {
      bool space_before = start == 0 || !is_word_char(last_code_point(text.substr(0, start)));
      size_t after = stop;
      bool space_after = stop == length || !is_word_char(next_code_point(text, after));
      if (!space_before || !space_after) continue;
    }
    if (token.lstrip) {
      start = std::max(trailing_white_space_start(text.substr(0, start)), start_offset);
    }
    if (token.rstrip) stop += leading_white_space_bytes(text.substr(stop));
    if (start_offset < start)
      segments.push_back({text.substr(start_offset, start - start_offset), -1});
    segments.push_back({text.substr(start, stop - start), token_index});
    start_offset = stop;
  }
  if (start_offset < length) segments.push_back({text.substr(start_offset), -1});
}

}  // namespace kvaudit::tokenizer::detail
