// Byte-level BPE: turns one pre-tokenized piece into ids by applying merges lowest rank
// first (leftmost on ties), the order Hugging Face's Word::merge_all uses, with a linked
// list of symbols and a min-heap of candidate merges: O(n log n) per piece instead of
// rescanning all pairs after every merge. Results are cached per piece.
#include <fmt/format.h>

#include <queue>

#include "tokenizer/internal.h"
#include "util/util.h"

namespace kvaudit::tokenizer::detail {

BpeModel::BpeModel(Vocab vocab,
                   const std::vector<std::pair<std::string_view, std::string_view>>& merges,
                   bool ignore_merges, std::string_view where)
    : vocab_(std::move(vocab)), ignore_merges_(ignore_merges) {
  TokenId max_id = -1;
  for (const auto& [token, id] : vocab_) {
    if (id < 0)
      throw InputError(std::string(where), fmt::format("token '{}' has a negative id", token));
    max_id = std::max(max_id, id);
  }
  id_to_token_.assign(static_cast<size_t>(max_id + 1), std::string());
  for (const auto& [token, id] : vocab_) id_to_token_[static_cast<size_t>(id)] = token;

  const auto& chars = byte_level_chars();
  for (int byte = 0; byte < 256; ++byte) {
    auto it = vocab_.find(chars[byte]);
    byte_ids_[byte] = it == vocab_.end() ? -1 : it->second;
  }

  merges_.reserve(merges.size());
  std::string joined;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [left, right] = merges[rank];
    joined.assign(left);
    joined.append(right);
    auto left_it = vocab_.find(left);
    auto right_it = vocab_.find(right);
    auto merged_it = vocab_.find(joined);
    if (left_it == vocab_.end() || right_it == vocab_.end() || merged_it == vocab_.end()) {
      throw InputError(std::string(where),
                       fmt::format("merge #{} ('{} {}') uses a token missing from model.vocab",
                                   rank, left, right));
    }
    // A repeated pair keeps its last rank, as tokenizers' HashMap collect does.
    merges_.insert_or_assign(pair_key(left_it->second, right_it->second),
                             MergeTarget{static_cast<uint32_t>(rank), merged_it->second});
  }
}

void BpeModel::merge(std::string_view piece_bytes, std::vector<TokenId>& ids) const {
  struct Symbol {
    TokenId id;
    int32_t prev;
    int32_t next;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(piece_bytes.size());
  for (char c : piece_bytes) {
    TokenId id = byte_ids_[static_cast<unsigned char>(c)];
    // A byte without a token (only in a damaged vocabulary) is dropped, as HF does when
    // there is no unk_token.
    if (id < 0) continue;
    int32_t index = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, index - 1, -1});
    if (index > 0) symbols[static_cast<size_t>(index - 1)].next = index;
  }
  if (symbols.empty()) return;

  struct Candidate {
    uint32_t rank;
    int32_t position;  // index of the left symbol
    TokenId merged_id;
    bool operator>(const Candidate& other) const {
      return rank != other.rank ? rank > other.rank : position > other.position;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  auto consider = [&](int32_t left) {
    int32_t right = symbols[static_cast<size_t>(left)].next;
    if (right < 0) return;
    auto it = merges_.find(
        pair_key(symbols[static_cast<size_t>(left)].id, symbols[static_cast<size_t>(right)].id));
    if (it != merges_.end()) queue.push({it->second.rank, left, it->second.id});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(symbols.size()); ++i) consider(i);

  constexpr TokenId kRemoved = -1;
  while (!queue.empty()) {
    Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[static_cast<size_t>(top.position)];
    if (left.id == kRemoved || left.next < 0) continue;
    Symbol& right = symbols[static_cast<size_t>(left.next)];
    // Stale candidate: a neighbour merged since. HF compares the resulting id only.
    auto it = merges_.find(pair_key(left.id, right.id));
    if (it == merges_.end() || it->second.id != top.merged_id) continue;
    left.id = top.merged_id;
    right.id = kRemoved;
    left.next = right.next;
    if (right.next >= 0) symbols[static_cast<size_t>(right.next)].prev = top.position;
    if (left.prev >= 0) consider(left.prev);
    consider(top.position);
  }
  for (int32_t i = 0; i >= 0; i = symbols[static_cast<size_t>(i)].next) {
    ids.push_back(symbols[static_cast<size_t>(i)].id);
  }
}

void BpeModel::encode_piece(std::string_view piece_bytes, std::vector<TokenId>& ids) const {
  if (piece_bytes.empty()) return;
  if (piece_bytes.size() == 1) {
    TokenId id = byte_ids_[static_cast<unsigned char>(piece_bytes[0])];
    if (id >= 0) ids.push_back(id);
    return;
  }
  if (ignore_merges_) {
    std::string mapped;
    for (char c : piece_bytes) mapped += byte_level_chars()[static_cast<unsigned char>(c)];
    auto it = vocab_.find(mapped);
    if (it != vocab_.end()) {
      ids.push_back(it->second);
      return;
    }
  }
  bool cacheable = piece_bytes.size() <= kCacheMaxPieceBytes;
  if (cacheable) {
    std::lock_guard lock(cache_mutex_);
    auto it = cache_.find(piece_bytes);
    if (it != cache_.end()) {
      ids.insert(ids.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  size_t first = ids.size();
  merge(piece_bytes, ids);
  if (cacheable) {
    std::lock_guard lock(cache_mutex_);
    // Once full the cache stops growing (HF does the same): old entries stay valid.
    if (cache_.size() < kCacheMaxEntries) {
      cache_.emplace(
          std::string(piece_bytes),
          std::vector<TokenId>(ids.begin() + static_cast<std::ptrdiff_t>(first), ids.end()));
    }
  }
}

}  // namespace kvaudit::tokenizer::detail
