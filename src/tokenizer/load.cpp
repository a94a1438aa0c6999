// Loading tokenizer.json and tokenizer_config.json into a Tokenizer. Every part of the
// file this implementation does not reproduce exactly is refused here with an InputError
// naming it, so an unsupported tokenizer fails loudly instead of producing other ids.
#include <fmt/format.h>
#include <simdjson.h>

#include <nlohmann/json.hpp>

#include "tokenizer/internal.h"
#include "util/util.h"

namespace kvaudit::tokenizer {

namespace fs = std::filesystem;
using detail::NormalForm;
using detail::PreTokenizerStep;
using detail::SplitBehavior;
using simdjson::dom::element;

namespace {

// Small readers over simdjson's DOM that turn every type or presence problem into an
// InputError naming the JSON path. Not util's JsonReader (nlohmann): a tokenizer.json runs to
// 11 MB, which simdjson's DOM reads several times faster, and its keys are the Hugging Face
// format's, not ours to refuse when unknown.
struct TokenizerJson {
  std::string where;

  InputError error(std::string_view path, std::string_view problem) const {
    return InputError(where, fmt::format("{}: {}", path, problem));
  }
  std::optional<element> find(element object, std::string_view key) const {
    element value;
    if (object.at_key(key).get(value) != simdjson::SUCCESS || value.is_null()) return std::nullopt;
    return value;
  }
  element require(element object, std::string_view key, std::string_view path) const {
    auto value = find(object, key);
    if (!value) throw error(path, fmt::format("missing \"{}\"", key));
    return *value;
  }
  std::string_view string(element value, std::string_view path) const {
    std::string_view text;
    if (value.get_string().get(text) != simdjson::SUCCESS) throw error(path, "expected a string");
    return text;
  }
  int64_t integer(element value, std::string_view path) const {
    int64_t number = 0;
    if (value.get_int64().get(number) != simdjson::SUCCESS)
      throw error(path, "expected an integer");
    return number;
  }
  bool boolean(element object, std::string_view key, std::string_view path, bool fallback) const {
    auto value = find(object, key);
    if (!value) return fallback;
    bool flag = false;
    if (value->get_bool().get(flag) != simdjson::SUCCESS) {
      throw error(fmt::format("{}.{}", path, key), "expected true or false");
    }
    return flag;
  }
  simdjson::dom::array array(element value, std::string_view path) const {
    simdjson::dom::array items;
    if (value.get_array().get(items) != simdjson::SUCCESS) throw error(path, "expected an array");
    return items;
  }
  std::string_view type_of(element value, std::string_view path) const {
    return string(require(value, "type", path), fmt::format("{}.type", path));
  }
};

TokenId checked_id(const TokenizerJson& json, int64_t id, std::string_view path) {
  if (id < 0 || id > (int64_t{1} << 30))
    throw json.error(path, fmt::format("token id {} out of range", id));
  return static_cast<TokenId>(id);
}

void read_normalizer(const TokenizerJson& json, element value, std::string_view path,
                     detail::Normalizer& normalizer) {
  std::string_view type = json.type_of(value, path);
  if (type == "NFC") {
    normalizer.forms.push_back(NormalForm::nfc);
  } else if (type == "NFD") {
    normalizer.forms.push_back(NormalForm::nfd);
  } else if (type == "NFKC") {
    normalizer.forms.push_back(NormalForm::nfkc);
  } else if (type == "NFKD") {
    normalizer.forms.push_back(NormalForm::nfkd);
  } else if (type == "Sequence") {
    size_t index = 0;
    for (element item : json.array(json.require(value, "normalizers", path), path)) {
      read_normalizer(json, item, fmt::format("{}.normalizers[{}]", path, index++), normalizer);
    }
  } else {
    throw json.error(path, fmt::format("normalizer \"{}\" is not supported (NFC, NFD, NFKC, NFKD, "
                                       "Sequence are)",
                                       type));
  }
}

SplitBehavior split_behavior(const TokenizerJson& json, std::string_view name,
                             std::string_view path) {
  if (name == "Isolated") return SplitBehavior::isolated;
  if (name == "Removed") return SplitBehavior::removed;
  if (name == "MergedWithPrevious") return SplitBehavior::merged_with_previous;
  if (name == "MergedWithNext") return SplitBehavior::merged_with_next;
  if (name == "Contiguous") return SplitBehavior::contiguous;
  throw json.error(path, fmt::format("unknown split behavior \"{}\"", name));
}

void read_pre_tokenizer(const TokenizerJson& json, element value, std::string_view path,
                        detail::PreTokenizer& pre_tokenizer, bool& byte_level_seen) {
  std::string_view type = json.type_of(value, path);
  if (type == "Sequence") {
    size_t index = 0;
    for (element item : json.array(json.require(value, "pretokenizers", path), path)) {
      read_pre_tokenizer(json, item, fmt::format("{}.pretokenizers[{}]", path, index++),
                         pre_tokenizer, byte_level_seen);
    }
    return;
  }
  PreTokenizerStep step;
  if (type == "Split") {
    // After ByteLevel the text is in the byte alphabet; no shipped tokenizer splits it then.
    if (byte_level_seen) throw json.error(path, "a Split after ByteLevel is not supported");
    element pattern = json.require(value, "pattern", path);
    auto regex = json.find(pattern, "Regex");
    auto literal = json.find(pattern, "String");
    if (!regex && !literal) throw json.error(path, "pattern needs \"Regex\" or \"String\"");
    std::string_view text = json.string(regex ? *regex : *literal, fmt::format("{}.pattern", path));
    step.regex = std::make_shared<const detail::Regex>(text, !regex, json.where);
    step.behavior =
        split_behavior(json, json.string(json.require(value, "behavior", path), path), path);
    step.invert = json.boolean(value, "invert", path, false);
  } else if (type == "ByteLevel") {
    byte_level_seen = true;
    step.kind = PreTokenizerStep::Kind::byte_level;
    step.add_prefix_space = json.boolean(value, "add_prefix_space", path, true);
    if (json.boolean(value, "use_regex", path, true)) {
      step.regex =
          std::make_shared<const detail::Regex>(detail::kGpt2SplitPattern, false, json.where);
    }
  } else {
    throw json.error(path, fmt::format("pre-tokenizer \"{}\" is not supported (Split, ByteLevel, "
                                       "Sequence are)",
                                       type));
  }
  pre_tokenizer.steps.push_back(std::move(step));
}

void check_decoder(const TokenizerJson& json, element value, std::string_view path) {
  std::string_view type = json.type_of(value, path);
  if (type == "Sequence") {
    size_t index = 0;
    for (element item : json.array(json.require(value, "decoders", path), path)) {
      check_decoder(json, item, fmt::format("{}.decoders[{}]", path, index++));
    }
    return;
  }
  if (type != "ByteLevel") {
    throw json.error(path, fmt::format("decoder \"{}\" is not supported (ByteLevel is)", type));
  }
}

void read_post_processor(const TokenizerJson& json, element value, std::string_view path,
                         std::vector<detail::TemplateItem>& single_template) {
  std::string_view type = json.type_of(value, path);
  if (type == "ByteLevel") return;  // changes offsets only, never ids
  if (type == "Sequence") {
    size_t index = 0;
    for (element item : json.array(json.require(value, "processors", path), path)) {
      read_post_processor(json, item, fmt::format("{}.processors[{}]", path, index++),
                          single_template);
    }
    return;
  }
  if (type != "TemplateProcessing") {
    throw json.error(path,
                     fmt::format("post-processor \"{}\" is not supported (TemplateProcessing, "
                                 "ByteLevel, Sequence are)",
                                 type));
  }
  element special_tokens = json.require(value, "special_tokens", path);
  size_t index = 0;
  for (element item : json.array(json.require(value, "single", path), path)) {
    std::string item_path = fmt::format("{}.single[{}]", path, index++);
    detail::TemplateItem template_item;
    if (json.find(item, "Sequence")) {
      template_item.is_sequence = true;
    } else {
      element special = json.require(item, "SpecialToken", item_path);
      std::string_view name = json.string(json.require(special, "id", item_path), item_path);
      element entry = json.require(special_tokens, name, fmt::format("{}.special_tokens", path));
      for (element id : json.array(json.require(entry, "ids", item_path), item_path)) {
        template_item.ids.push_back(checked_id(json, json.integer(id, item_path), item_path));
      }
    }
    single_template.push_back(std::move(template_item));
  }
}

std::unique_ptr<detail::BpeModel> read_model(const TokenizerJson& json, element model) {
  auto type = json.find(model, "type");
  if (type && json.string(*type, "model.type") != "BPE") {
    throw json.error("model.type", fmt::format("model \"{}\" is not supported (BPE is)",
                                               json.string(*type, "model.type")));
  }
  if (json.find(model, "dropout")) {
    double dropout = 0;
    if (json.require(model, "dropout", "model").get_double().get(dropout) != simdjson::SUCCESS ||
        dropout != 0.0) {
      throw json.error("model.dropout", "BPE dropout is random and not supported");
    }
  }
  for (std::string_view affix : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    auto value = json.find(model, affix);
    if (value && !json.string(*value, affix).empty()) {
      throw json.error(fmt::format("model.{}", affix), "subword affixes are not supported");
    }
  }
  simdjson::dom::object vocab_object;
  if (json.require(model, "vocab", "model").get_object().get(vocab_object) != simdjson::SUCCESS) {
    throw json.error("model.vocab", "expected an object of token -> id");
  }
  std::vector<std::pair<std::string_view, TokenId>> vocab;
  vocab.reserve(vocab_object.size());
  for (auto [token, id_value] : vocab_object) {
    int64_t id = 0;
    if (id_value.get_int64().get(id) != simdjson::SUCCESS) {
      throw json.error("model.vocab", fmt::format("id of '{}' is not an integer", token));
    }
    vocab.emplace_back(token, checked_id(json, id, "model.vocab"));
  }
  // Views into the parsed document, which outlives the model's construction.
  std::vector<std::pair<std::string_view, std::string_view>> merges;
  auto merge_list = json.array(json.require(model, "merges", "model"), "model.merges");
  merges.reserve(merge_list.size());
  size_t index = 0;
  for (element merge : merge_list) {
    auto path = [&] { return fmt::format("model.merges[{}]", index); };
    std::string_view line;
    if (merge.get_string().get(line) == simdjson::SUCCESS) {  // "a b"
      size_t space = line.find(' ');
      if (space == std::string_view::npos || line.find(' ', space + 1) != std::string_view::npos) {
        throw json.error(path(), "expected two tokens separated by one space");
      }
      merges.emplace_back(line.substr(0, space), line.substr(space + 1));
    } else {  // ["a", "b"]
      simdjson::dom::array pair;
      std::string_view left, right;
      if (merge.get_array().get(pair) != simdjson::SUCCESS || pair.size() != 2 ||
          pair.at(0).get_string().get(left) != simdjson::SUCCESS ||
          pair.at(1).get_string().get(right) != simdjson::SUCCESS) {
        throw json.error(path(), "expected \"a b\" or a pair of token strings");
      }
      merges.emplace_back(left, right);
    }
    ++index;
  }
  return std::make_unique<detail::BpeModel>(detail::Vocabulary(vocab), merges,
                                            json.boolean(model, "ignore_merges", "model", false),
                                            json.where);
}

// tokenizer_config.json token fields: "text", {"content": "text", ...} or null.
std::optional<std::string> config_token(const nlohmann::json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  return std::nullopt;
}

TokenizerConfig read_config(std::string_view text, std::string_view where) {
  TokenizerConfig config;
  if (text.empty()) return config;
  nlohmann::json json = nlohmann::json::parse(text, nullptr, false);
  if (json.is_discarded() || !json.is_object()) {
    throw InputError(std::string(where), "tokenizer_config.json is not a JSON object");
  }
  config.bos_token = config_token(json, "bos_token");
  config.eos_token = config_token(json, "eos_token");
  config.pad_token = config_token(json, "pad_token");
  config.unk_token = config_token(json, "unk_token");
  config.add_bos_token = json.value("add_bos_token", false);
  config.add_eos_token = json.value("add_eos_token", false);
  if (auto it = json.find("model_max_length"); it != json.end() && it->is_number()) {
    double length = it->get<double>();
    if (length > 0 && length < 9.0e15)
      config.model_max_length_tokens = static_cast<int64_t>(length);
  }
  if (auto it = json.find("chat_template"); it != json.end()) {
    if (it->is_string()) {
      config.chat_template = it->get<std::string>();
    } else if (it->is_array()) {  // [{"name": "default", "template": "..."}, ...]
      for (const auto& entry : *it) {
        if (!entry.is_object() || !entry.contains("template") || !entry["template"].is_string())
          continue;
        if (config.chat_template.empty() || entry.value("name", "") == "default") {
          config.chat_template = entry["template"].get<std::string>();
        }
      }
    }
  }
  return config;
}

}  // namespace

Tokenizer Tokenizer::from_json(std::string_view tokenizer_json, std::string_view config_json,
                               std::string_view where) {
  auto impl = std::make_unique<Impl>();
  impl->where = std::string(where);
  TokenizerJson json{impl->where};
  simdjson::dom::parser parser;
  simdjson::padded_string padded(tokenizer_json);
  element root;
  if (auto code = parser.parse(padded).get(root); code != simdjson::SUCCESS) {
    throw InputError(impl->where,
                     fmt::format("not valid JSON ({})", simdjson::error_message(code)));
  }
  if (!root.is_object()) throw InputError(impl->where, "expected a JSON object");

  impl->model = read_model(json, json.require(root, "model", "(root)"));
  if (auto normalizer = json.find(root, "normalizer")) {
    read_normalizer(json, *normalizer, "normalizer", impl->normalizer);
  }
  bool byte_level = false;
  if (auto pre = json.find(root, "pre_tokenizer")) {
    read_pre_tokenizer(json, *pre, "pre_tokenizer", impl->pre_tokenizer, byte_level);
  }
  if (!byte_level) {
    throw json.error("pre_tokenizer", "no ByteLevel step: only byte-level BPE is supported");
  }
  auto decoder = json.find(root, "decoder");
  if (!decoder) throw json.error("decoder", "missing: only the ByteLevel decoder is supported");
  check_decoder(json, *decoder, "decoder");
  if (auto post = json.find(root, "post_processor")) {
    read_post_processor(json, *post, "post_processor", impl->single_template);
  }

  // Added tokens get their ids the way tokenizers' AddedVocabulary::add_tokens assigns them
  // on load: the model's id when the content is in its vocabulary, else the next free id.
  const auto& vocab = impl->model->vocab();
  const TokenId model_size = static_cast<TokenId>(vocab.entry_count());
  TokenId max_added = -1;
  if (auto list = json.find(root, "added_tokens")) {
    size_t index = 0;
    for (element item : json.array(*list, "added_tokens")) {
      std::string path = fmt::format("added_tokens[{}]", index++);
      AddedToken token;
      token.content = std::string(json.string(json.require(item, "content", path), path));
      token.special = json.boolean(item, "special", path, false);
      token.lstrip = json.boolean(item, "lstrip", path, false);
      token.rstrip = json.boolean(item, "rstrip", path, false);
      token.single_word = json.boolean(item, "single_word", path, false);
      token.normalized = json.boolean(item, "normalized", path, !token.special);
      if (token.content.empty() || impl->added_by_content.count(token.content)) continue;
      if (auto in_vocab = vocab.find(token.content)) {
        token.id = *in_vocab;
      } else {
        token.id =
            max_added < 0 ? model_size : (max_added >= model_size ? max_added + 1 : model_size);
      }
      max_added = std::max(max_added, token.id);
      impl->added_by_content.emplace(token.content, static_cast<int>(impl->added.size()));
      impl->added_by_id.emplace(token.id, static_cast<int>(impl->added.size()));
      impl->added.push_back(std::move(token));
    }
  }

  // Matchers: raw-text tokens and normalized-text tokens (their content normalized too).
  std::vector<std::string> patterns;
  std::vector<int> raw_indices, normalized_indices;
  for (size_t i = 0; i < impl->added.size(); ++i) {
    const AddedToken& token = impl->added[i];
    std::string storage;
    patterns.emplace_back(token.normalized ? impl->normalizer.apply(token.content, storage)
                                           : std::string_view(token.content));
    (token.normalized ? normalized_indices : raw_indices).push_back(static_cast<int>(i));
  }
  // Special tokens first, as HF builds its automaton (matters only for duplicate texts).
  for (auto* indices : {&raw_indices, &normalized_indices}) {
    std::stable_partition(indices->begin(), indices->end(),
                          [&](int i) { return impl->added[static_cast<size_t>(i)].special; });
  }
  impl->raw_matcher =
      std::make_unique<detail::AddedTokenMatcher>(impl->added, patterns, raw_indices);
  impl->normalized_matcher =
      std::make_unique<detail::AddedTokenMatcher>(impl->added, patterns, normalized_indices);

  // Per-id decode table: what the ByteLevel decoder emits, and which ids are special.
  size_t vocab_size = std::max(vocab.id_limit(), static_cast<size_t>(max_added + 1));
  impl->token_bytes.assign(vocab_size, std::string());
  impl->token_known.assign(vocab_size, false);
  impl->token_special.assign(vocab_size, false);
  std::unordered_map<std::string_view, bool> special_contents;
  for (const AddedToken& token : impl->added) {
    if (token.special) special_contents.emplace(token.content, true);
  }
  for (size_t id = 0; id < vocab_size; ++id) {
    auto added = impl->added_by_id.find(static_cast<TokenId>(id));
    std::string_view text =
        added != impl->added_by_id.end()
            ? std::string_view(impl->added[static_cast<size_t>(added->second)].content)
            : vocab.text(static_cast<TokenId>(id));
    if (text.empty()) continue;
    impl->token_known[id] = true;
    impl->token_bytes[id] = detail::byte_level_decode(text);
    // HF skips by content: any id whose text is a special token's content.
    impl->token_special[id] = special_contents.count(text) > 0;
  }

  impl->config = read_config(config_json, fmt::format("{} (tokenizer_config.json)", where));
  auto resolve = [&](const std::optional<std::string>& token) -> std::optional<TokenId> {
    if (!token) return std::nullopt;
    if (auto it = impl->added_by_content.find(*token); it != impl->added_by_content.end()) {
      return impl->added[static_cast<size_t>(it->second)].id;
    }
    return vocab.find(*token);
  };
  impl->config.bos_token_id = resolve(impl->config.bos_token);
  impl->config.eos_token_id = resolve(impl->config.eos_token);
  impl->config.pad_token_id = resolve(impl->config.pad_token);
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::load(const fs::path& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    throw InputError(path.string(),
                     "no such folder (expected a Hugging Face tokenizer folder "
                     "holding tokenizer.json)");
  }
  fs::path tokenizer_path = fs::is_directory(path, ec) ? path / "tokenizer.json" : path;
  if (!fs::exists(tokenizer_path, ec)) {
    throw InputError(path.string(), "holds no tokenizer.json");
  }
  std::string tokenizer_json = read_text_file(tokenizer_path, uint64_t{1} << 30);
  fs::path config_path = tokenizer_path.parent_path() / "tokenizer_config.json";
  std::string config_json;
  if (fs::exists(config_path, ec)) config_json = read_text_file(config_path);
  return from_json(tokenizer_json, config_json, tokenizer_path.string());
}

}  // namespace kvaudit::tokenizer
