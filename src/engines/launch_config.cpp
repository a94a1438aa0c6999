// A launch's YAML: the config file it names (the engines' --config, spliced in as flag
// words; TensorRT-LLM's --config, read by key), and the bounds every YAML read of a launch
// goes through (nesting depth, document count).
#include <fmt/format.h>

#include <algorithm>
#include <sstream>

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include "engines/internal.h"
#include "util/util.h"

namespace kvaudit::engines {

namespace {

YAML::Node load_yaml(const std::string& text, const std::string& where) {
  refuse_deep_nesting(text, where);
  try {
    return YAML::Load(text);
  } catch (const YAML::Exception& error) {
    throw InputError(where, fmt::format("not YAML: {}", error.what()));
  }
}

// Where a YAML scalar's value starts in `text` (past an opening quote) and its length there,
// when the bytes at its mark spell it unescaped.
std::optional<std::pair<size_t, size_t>> scalar_span(const std::string& text,
                                                     const YAML::Node& node) {
  const YAML::Mark mark = node.Mark();
  if (mark.pos < 0 || static_cast<size_t>(mark.pos) >= text.size()) return std::nullopt;
  size_t at = static_cast<size_t>(mark.pos);
  if (text[at] == '"' || text[at] == '\'') ++at;
  const std::string& value = node.Scalar();
  if (text.compare(at, value.size(), value) != 0) return std::nullopt;
  return std::make_pair(at, value.size());
}

// Counts the documents of a YAML stream from the parser's events, refusing a stream that
// would not end. yaml-cpp 0.7's LoadAll never returns on a document that opens with a flow
// entry (",") outside a flow: its parser reports an empty document without consuming the
// token and is asked for the next one, forever, growing the list until memory runs out
// (fuzz_launch found it; regression input fuzz/corpus/launch/regression-leading-flow-entry).
class DocumentStarts : public YAML::EventHandler {
 public:
  DocumentStarts(const std::string& where, size_t most) : where_(where), most_(most) {}
  void OnDocumentStart(const YAML::Mark& mark) override {
    if (count_ > 0 && mark.pos == last_pos_)
      throw InputError(where_, fmt::format("line {}, column {}: YAML that does not parse (a "
                                           "document cannot start with ',')",
                                           mark.line + 1, mark.column + 1));
    if (++count_ > most_)
      throw InputError(where_, fmt::format("more than {} YAML documents", most_));
    last_pos_ = mark.pos;
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}

 private:
  const std::string& where_;
  size_t most_;
  size_t count_ = 0;
  int last_pos_ = -1;
};

}  // namespace

std::string read_config_text(const LaunchFlags& flags, const std::string& where) {
  try {
    return read_text_file(flags.config_file, 1 << 20);
  } catch (const InputError& error) {
    throw InputError(where, fmt::format("{}; kvaudit needs it: the KV cache dtype and the "
                                        "memory fraction may be set there (copy it here)",
                                        error.what()));
  }
}

// The YAML file a launch names (TensorRT-LLM --config / --extra_llm_api_options): each
// launch field's keys as the engine data lists them. The file is read where the command
// names it (relative paths from the current folder); a launch whose file cannot be read
// is refused, since the KV dtype may be set there.
void apply_config_file(const EngineModel& engine, LaunchFlags& flags, const std::string& label) {
  const LaunchSpec& launch = engine.launch;
  const std::string& path = flags.config_file;
  const std::string where =
      fmt::format("{} (named by {} in {})", path, flags.config_file_flag, label);
  const std::string text = read_config_text(flags, where);
  YAML::Node root = load_yaml(text, where);
  if (root.IsNull()) return;  // an empty file sets nothing
  if (!root.IsMap()) throw InputError(where, "not a YAML mapping of settings");
  auto lookup = [&](const std::string& dotted) -> std::optional<YAML::Node> {
    YAML::Node node = root;
    for (const std::string& key : split_list(dotted, '.')) {
      if (!node.IsMap()) return std::nullopt;
      YAML::Node next = node[key];
      if (!next.IsDefined()) return std::nullopt;
      node.reset(next);
    }
    return node;
  };
  for (const auto& [field, keys] : launch.config_keys) {
    if (!launch.config_overrides_flags && flags.fields_from_flags.count(field)) continue;
    for (const std::string& key : keys) {
      auto node = lookup(key);
      if (!node || node->IsNull()) continue;
      if (!node->IsScalar())
        throw InputError(where, fmt::format("{} should be a single value", key));
      const std::string value = node->Scalar();
      const std::string setting = fmt::format("{} in {}", key, path);
      const bool on = value == "true" || value == "True" || value == "1";
      set_launch_field(flags, field, value, setting, on, where);
      flags.fields_from_config.insert(field);
      flags.sites[field] = SettingSite{path, node->Mark().line + 1, key};
      if (field == "kv_cache_dtype")
        if (auto span = scalar_span(text, *node))
          flags.kv_dtype_edit = TextEdit{path, span->first, span->second, "", ""};
      break;
    }
  }
  // The tier settings the file gives (kv_cache_config.host_cache_size, ...): a host tier is
  // set only here on TensorRT-LLM, so a launch read without them would look tier-free.
  for (const auto& [setting, keys] : engine.tier_config_keys)
    for (const std::string& key : keys) {
      auto node = lookup(key);
      if (!node || node->IsNull()) continue;
      if (!node->IsScalar())
        throw InputError(where, fmt::format("{} should be a single value", key));
      record_tier_setting(setting, node->Scalar(), flags);
      break;
    }
  // No KV dtype in the file: where one goes, under the first key the data names.
  auto kv_keys = launch.config_keys.find("kv_cache_dtype");
  if (!flags.fields_from_config.count("kv_cache_dtype") && kv_keys != launch.config_keys.end() &&
      !kv_keys->second.empty()) {
    const std::vector<std::string> parts = split_list(kv_keys->second.front(), '.');
    if (parts.size() == 2) {
      YAML::Node parent = root[parts[0]];
      if (!parent.IsDefined() || parent.IsNull()) {
        const bool ends_in_newline = text.empty() || text.back() == '\n';
        flags.kv_dtype_edit = TextEdit{
            path, text.size(), 0,
            fmt::format("{}{}:\n  {}: ", ends_in_newline ? "" : "\n", parts[0], parts[1]), "\n"};
      } else if (parent.IsMap() && parent.size() > 0 &&
                 parent.Style() == YAML::EmitterStyle::Block) {
        // A new line above the map's first entry, at its indentation.
        const YAML::Mark first = parent.begin()->first.Mark();
        const size_t line_start = text.rfind('\n', static_cast<size_t>(first.pos));
        const size_t at = line_start == std::string::npos ? 0 : line_start + 1;
        flags.kv_dtype_edit = TextEdit{
            path, at, 0, fmt::format("{}{}: ", std::string(first.column, ' '), parts[1]), "\n"};
      }
    }
  }
  for (const auto& [key, error] : launch.config_rejected_keys)
    if (root[key].IsDefined())
      flags.config_errors.push_back(fmt::format("{}: top-level {}: {}", path, key, error));
}

std::vector<YAML::Node> load_yaml_documents(const std::string& text, const std::string& where,
                                            size_t most_documents) {
  refuse_deep_nesting(text, where);
  std::istringstream stream(text);
  YAML::Parser parser(stream);
  DocumentStarts starts(where, most_documents);
  while (parser.HandleNextDocument(starts)) {
  }
  return YAML::LoadAll(text);
}

void refuse_deep_nesting(std::string_view text, const std::string& where) {
  int depth = 0, deepest = 0;
  for (char c : text) {
    if (c == '[' || c == '{') deepest = std::max(deepest, ++depth);
    if ((c == ']' || c == '}') && depth > 0) --depth;
  }
  if (deepest > 64) throw InputError(where, "nested more than 64 levels deep");
}

std::vector<LaunchWord> config_file_words(const std::string& path, const std::string& text,
                                          const std::string& where) {
  YAML::Node root = load_yaml(text, where);
  std::vector<LaunchWord> words;
  if (root.IsNull()) return words;  // an empty file sets nothing
  if (!root.IsMap()) throw InputError(where, "not a YAML mapping of flag names to values");
  for (const auto& entry : root) {
    if (!entry.first.IsScalar()) throw InputError(where, "a key that is not a flag name");
    const std::string key = entry.first.Scalar();
    const SettingSite site{path, entry.first.Mark().line + 1, key};
    const size_t key_offset = static_cast<size_t>(std::max(0, entry.first.Mark().pos));
    const YAML::Node& value = entry.second;
    const std::string flag = "--" + key;
    if (value.IsScalar()) {
      const std::string& text_value = value.Scalar();
      // A YAML boolean: the bare flag when true; false leaves the default (vLLM passes
      // --no-KEY where that option exists, SGLang drops store_true flags).
      if (value.Tag() != "!" && (text_value == "true" || text_value == "True")) {
        words.push_back({flag, site, key_offset});
      } else if (value.Tag() != "!" && (text_value == "false" || text_value == "False")) {
        continue;
      } else {
        words.push_back({flag, site, key_offset});
        words.push_back({text_value, SettingSite{path, value.Mark().line + 1, key},
                         static_cast<size_t>(std::max(0, value.Mark().pos))});
      }
    } else if (value.IsSequence()) {
      if (value.size() == 0) continue;
      words.push_back({flag, site, key_offset});
      for (const auto& item : value) {
        if (!item.IsScalar()) throw InputError(where, fmt::format("{}: a list of lists", key));
        words.push_back({item.Scalar(), SettingSite{path, item.Mark().line + 1, key},
                         static_cast<size_t>(std::max(0, item.Mark().pos))});
      }
    } else if (value.IsMap()) {
      // The engines pass a map as its JSON text; no field kvaudit reads is a map.
      words.push_back({flag, site, key_offset});
      words.push_back({"{...}", site, key_offset});
    }
  }
  return words;
}

}  // namespace kvaudit::engines
