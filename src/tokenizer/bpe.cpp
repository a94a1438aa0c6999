// Byte-level BPE: turns one pre-tokenized piece into ids by applying merges lowest rank
// first (leftmost on ties), the order Hugging Face's Word::merge_all uses, with a linked
// list of symbols and a min-heap of candidate merges: O(n log n) per piece instead of
// rescanning all pairs after every merge. Results are cached per piece.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <queue>

#include "tokenizer/internal.h"
#include "util/util.h"

namespace kvaudit::tokenizer::detail {

namespace {

// Table sizes: a power of two at least twice the entry count keeps probe runs short.
size_t table_size_for(size_t entries) {
  size_t size = 16;
  while (size < entries * 2) size *= 2;
  return size;
}

uint64_t mix_key(uint64_t key) {
  return (key ^ (key >> 29)) * 0x9E3779B97F4A7C15ull;
}

}  // namespace

Vocabulary::Vocabulary(const std::vector<std::pair<std::string_view, TokenId>>& entries) {
  TokenId max_id = -1;
  size_t text_bytes = 0;
  for (const auto& [token, id] : entries) {
    max_id = std::max(max_id, id);
    text_bytes += token.size();
  }
  spans_.assign(static_cast<size_t>(max_id) + 1, {0, 0});
  arena_.reserve(text_bytes);
  slots_.assign(table_size_for(entries.size()), -1);
  const size_t mask = slots_.size() - 1;
  for (const auto& [token, id] : entries) {
    size_t slot = std::hash<std::string_view>{}(token)&mask;
    while (slots_[slot] >= 0 && text(slots_[slot]) != token) slot = (slot + 1) & mask;
    if (slots_[slot] >= 0)
      spans_[static_cast<size_t>(slots_[slot])] = {0, 0};  // re-listed
    else
      ++entry_count_;
    spans_[static_cast<size_t>(id)] = {static_cast<uint32_t>(arena_.size()),
                                       static_cast<uint32_t>(token.size())};
    arena_.append(token);
    slots_[slot] = id;
  }
}

std::optional<TokenId> Vocabulary::find(std::string_view token) const {
  const size_t mask = slots_.size() - 1;
  for (size_t slot = std::hash<std::string_view>{}(token)&mask; slots_[slot] >= 0;
       slot = (slot + 1) & mask) {
    if (text(slots_[slot]) == token) return slots_[slot];
  }
  return std::nullopt;
}

std::string_view Vocabulary::text(TokenId id) const {
  if (id < 0 || static_cast<size_t>(id) >= spans_.size()) return {};
  auto [offset, length] = spans_[static_cast<size_t>(id)];
  return std::string_view(arena_).substr(offset, length);
}

BpeModel::BpeModel(Vocabulary vocab,
                   const std::vector<std::pair<std::string_view, std::string_view>>& merges,
                   bool ignore_merges, std::string_view where)
    : vocab_(std::move(vocab)), ignore_merges_(ignore_merges) {
  const auto& chars = byte_level_chars();
  for (int byte = 0; byte < 256; ++byte) byte_ids_[byte] = vocab_.find(chars[byte]).value_or(-1);

  merge_keys_.assign(table_size_for(merges.size()), kNoMerge);
  merge_targets_.assign(merge_keys_.size(), MergeTarget{0, -1});
  const size_t mask = merge_keys_.size() - 1;
  std::string joined;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [left, right] = merges[rank];
    joined.assign(left);
    joined.append(right);
    auto left_id = vocab_.find(left), right_id = vocab_.find(right),
         merged_id = vocab_.find(joined);
    if (!left_id || !right_id || !merged_id) {
      throw InputError(std::string(where),
                       fmt::format("merge #{} ('{} {}') uses a token missing from model.vocab",
                                   rank, left, right));
    }
    uint64_t key = pair_key(*left_id, *right_id);
    size_t slot = mix_key(key) & mask;
    while (merge_keys_[slot] != kNoMerge && merge_keys_[slot] != key) slot = (slot + 1) & mask;
    // A repeated pair keeps its last rank, as tokenizers' HashMap collect does.
    merge_keys_[slot] = key;
    merge_targets_[slot] = MergeTarget{static_cast<uint32_t>(rank), *merged_id};
  }
}

const BpeModel::MergeTarget* BpeModel::find_merge(TokenId left, TokenId right) const {
  const uint64_t key = pair_key(left, right);
  const size_t mask = merge_keys_.size() - 1;
  for (size_t slot = mix_key(key) & mask; merge_keys_[slot] != kNoMerge; slot = (slot + 1) & mask) {
    if (merge_keys_[slot] == key) return &merge_targets_[slot];
  }
  return nullptr;
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
    const MergeTarget* target =
        find_merge(symbols[static_cast<size_t>(left)].id, symbols[static_cast<size_t>(right)].id);
    if (target != nullptr) queue.push({target->rank, left, target->id});
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
    const MergeTarget* target = find_merge(left.id, right.id);
    if (target == nullptr || target->id != top.merged_id) continue;
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
    if (auto id = vocab_.find(mapped)) {
      ids.push_back(*id);
      return;
    }
  }
  bool cacheable = piece_bytes.size() <= kCacheMaxPieceBytes;
  // Forced non-zero: zero marks an empty cache slot.
  uint64_t hash = std::hash<std::string_view>{}(piece_bytes) | 1;
  if (cacheable) {
    std::lock_guard lock(cache_mutex_);
    if (cache_.find(piece_bytes, hash, ids)) return;
  }
  size_t first = ids.size();
  merge(piece_bytes, ids);
  if (cacheable) {
    std::lock_guard lock(cache_mutex_);
    cache_.insert(piece_bytes, hash, ids.data() + first, ids.size() - first);
  }
}

PieceCache::PieceCache() : slots_(2 * kMaxEntries) {}

std::string_view PieceCache::key_of(const Slot& slot) const {
  if (slot.key_length <= kInlineKeyBytes) return std::string_view(slot.inline_key, slot.key_length);
  return std::string_view(keys_).substr(slot.key_offset, slot.key_length);
}

bool PieceCache::find(std::string_view piece, uint64_t hash, std::vector<TokenId>& ids) const {
  const size_t mask = slots_.size() - 1;
  for (size_t index = hash & mask; slots_[index].hash != 0; index = (index + 1) & mask) {
    const Slot& slot = slots_[index];
    if (slot.hash != hash || slot.key_length != piece.size() || key_of(slot) != piece) continue;
    const TokenId* begin =
        slot.id_count <= kInlineIds ? slot.inline_ids : ids_.data() + slot.id_offset;
    ids.insert(ids.end(), begin, begin + slot.id_count);
    return true;
  }
  return false;
}

void PieceCache::insert(std::string_view piece, uint64_t hash, const TokenId* ids,
                        size_t id_count) {
  if (entries_ >= kMaxEntries) return;
  const size_t mask = slots_.size() - 1;
  size_t index = hash & mask;
  for (; slots_[index].hash != 0; index = (index + 1) & mask) {
    const Slot& slot = slots_[index];
    if (slot.hash == hash && key_of(slot) == piece) return;  // another thread got here first
  }
  Slot& slot = slots_[index];
  slot.hash = hash;
  slot.key_length = static_cast<uint32_t>(piece.size());
  if (piece.size() <= kInlineKeyBytes) {
    std::memcpy(slot.inline_key, piece.data(), piece.size());
  } else {
    slot.key_offset = static_cast<uint32_t>(keys_.size());
    keys_.append(piece);
  }
  slot.id_count = static_cast<uint32_t>(id_count);
  if (id_count <= kInlineIds) {
    std::copy(ids, ids + id_count, slot.inline_ids);
  } else {
    slot.id_offset = static_cast<uint32_t>(ids_.size());
    ids_.insert(ids_.end(), ids, ids + id_count);
  }
  ++entries_;
}

}  // namespace kvaudit::tokenizer::detail
