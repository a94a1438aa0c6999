// The encode and decode pipelines, in the order tokenizers' TokenizerImpl runs them:
// UTF-8 repair -> added tokens on the raw text -> normalize each remaining section ->
// added tokens marked "normalized" -> pre-tokenize -> BPE per piece -> post-process.
#include <deque>

#include "tokenizer/internal.h"
#include "util/util.h"

namespace kvaudit::tokenizer {

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

std::vector<TokenId> Tokenizer::encode(std::string_view text, const EncodeOptions& options) const {
  const Impl& impl = *impl_;
  std::string repaired;
  std::string_view valid = text;
  if (!detail::is_valid_utf8(text)) {
    repaired = to_valid_utf8(text);
    valid = repaired;
  }
  std::vector<TokenId> ids;
  ids.reserve(valid.size() / 3 + 4);

  std::vector<detail::Segment> raw_segments, normalized_segments;
  std::string normalized_storage;
  std::vector<std::string_view> pieces;
  std::deque<std::string> piece_storage;
  impl.raw_matcher->split(valid, raw_segments);
  for (const detail::Segment& raw : raw_segments) {
    if (raw.added_index >= 0) {
      ids.push_back(impl.added[static_cast<size_t>(raw.added_index)].id);
      continue;
    }
    std::string_view normalized = impl.normalizer.apply(raw.text, normalized_storage);
    normalized_segments.clear();
    impl.normalized_matcher->split(normalized, normalized_segments);
    for (const detail::Segment& segment : normalized_segments) {
      if (segment.added_index >= 0) {
        ids.push_back(impl.added[static_cast<size_t>(segment.added_index)].id);
        continue;
      }
      piece_storage.clear();
      impl.pre_tokenizer.run(segment.text, pieces, piece_storage);
      for (std::string_view piece : pieces) impl.model->encode_piece(piece, ids);
    }
  }

  if (options.add_special_tokens && !impl.single_template.empty()) {
    std::vector<TokenId> processed;
    processed.reserve(ids.size() + 4);
    for (const detail::TemplateItem& item : impl.single_template) {
      const auto& source = item.is_sequence ? ids : item.ids;
      processed.insert(processed.end(), source.begin(), source.end());
    }
    ids = std::move(processed);
  }
  return ids;
}

std::string Tokenizer::decode(std::span<const TokenId> ids, const DecodeOptions& options) const {
  const Impl& impl = *impl_;
  std::string bytes;
  for (TokenId id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= impl.token_bytes.size()) continue;
    auto index = static_cast<size_t>(id);
    if (!impl.token_known[index]) continue;
    if (options.skip_special_tokens && impl.token_special[index]) continue;
    bytes += impl.token_bytes[index];
  }
  // Tokens can end inside a character; the joined bytes become text the way
  // String::from_utf8_lossy does it.
  if (detail::is_valid_utf8(bytes)) return bytes;
  return to_valid_utf8(bytes);
}

std::optional<std::string> Tokenizer::token_bytes(TokenId id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->token_bytes.size()) return std::nullopt;
  if (!impl_->token_known[static_cast<size_t>(id)]) return std::nullopt;
  return impl_->token_bytes[static_cast<size_t>(id)];
}

std::optional<std::string> Tokenizer::id_to_token(TokenId id) const {
  if (auto it = impl_->added_by_id.find(id); it != impl_->added_by_id.end()) {
    return impl_->added[static_cast<size_t>(it->second)].content;
  }
  std::string_view token = impl_->model->vocab().text(id);
  if (token.empty()) return std::nullopt;
  return std::string(token);
}

std::optional<TokenId> Tokenizer::token_to_id(std::string_view token) const {
  if (auto it = impl_->added_by_content.find(token); it != impl_->added_by_content.end()) {
    return impl_->added[static_cast<size_t>(it->second)].id;
  }
  return impl_->model->vocab().find(token);
}

size_t Tokenizer::vocab_size() const {
  return impl_->token_bytes.size();
}

const std::vector<AddedToken>& Tokenizer::added_tokens() const {
  return impl_->added;
}

const TokenizerConfig& Tokenizer::config() const {
  return impl_->config;
}

std::string Tokenizer::normalize(std::string_view text) const {
  std::string repaired = to_valid_utf8(text);
  std::string storage;
  return std::string(impl_->normalizer.apply(repaired, storage));
}

}  // namespace kvaudit::tokenizer
