// Launch commands and systemd units -> LaunchFlags. Flag spellings are engine
// data (launch.flags in data/engines/<engine>.json); this file only tokenises.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <set>
#include <sstream>

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include "engines/engines.h"
#include "engines/internal.h"
#include "util/util.h"

namespace kvaudit::engines {

namespace {

bool is_wrapper_shell(const std::string& word) {
  return word == "bash" || word == "sh" || word == "/bin/bash" || word == "/bin/sh" ||
         word == "/usr/bin/bash" || word == "/usr/bin/env";
}

// Whether words[i...] start with an entry point as the engine data spells it:
// "sglang serve" (program basename, then literal words), "-m sglang.launch_server"
// (a module or a submodule of it), "launch_server.py" (a script).
std::optional<size_t> match_entry_point(const std::vector<std::string>& words, size_t i,
                                        const std::string& entry) {
  std::vector<std::string> parts = split_list(entry, ' ');
  if (parts.empty() || i + parts.size() > words.size()) return std::nullopt;
  if (parts[0] == "-m") {
    if (words[i] != "-m" || parts.size() != 2) return std::nullopt;
    const std::string& module = words[i + 1];
    if (module == parts[1] || module.rfind(parts[1] + ".", 0) == 0) return i + 2;
    return std::nullopt;
  }
  const std::string& word = words[i];
  size_t slash = word.find_last_of('/');
  if ((slash == std::string::npos ? word : word.substr(slash + 1)) != parts[0]) return std::nullopt;
  for (size_t k = 1; k < parts.size(); ++k)
    if (words[i + k] != parts[k]) return std::nullopt;
  return i + parts.size();
}

// Finds which engine a word list starts and where its arguments begin.
std::optional<std::pair<std::string, size_t>> find_entry_point(
    const Registry& registry, const std::vector<std::string>& words) {
  for (size_t i = 0; i < words.size(); ++i)
    for (const std::string& engine : registry.names())
      for (const std::string& entry : registry.engine(engine).launch.entry_points)
        if (auto next = match_entry_point(words, i, entry)) return std::pair{engine, *next};
  return std::nullopt;
}

int to_int(const std::string& flag, const std::string& value, const std::string& label) {
  try {
    size_t used = 0;
    long parsed = std::stol(value, &used);
    if (used != value.size() || parsed < 0 || parsed > (1 << 30)) throw std::invalid_argument("");
    return static_cast<int>(parsed);
  } catch (const std::exception&) {
    throw InputError(label,
                     fmt::format("{} expects a non-negative integer, got '{}'", flag, value));
  }
}

// Sets one launch field from its text, as a flag (`word`) or a config key gave it.
void set_launch_field(LaunchFlags& flags, const std::string& field, const std::string& value,
                      const std::string& word, bool on, const std::string& label) {
  if (field == "kv_cache_dtype") {
    if (value.empty()) throw InputError(label, word + " needs a value");
    flags.kv_cache_dtype = value;
    flags.kv_cache_dtype_flag = word;
  } else if (field == "model_path") {
    flags.model_path = value;
  } else if (field == "tp") {
    flags.tp = to_int(word, value, label);
  } else if (field == "pp") {
    flags.pp = to_int(word, value, label);
  } else if (field == "dp") {
    flags.dp = to_int(word, value, label);
  } else if (field == "dcp") {
    flags.dcp = to_int(word, value, label);
  } else if (field == "kv_cache_dtype_skip_layers") {
    flags.kv_cache_dtype_skip_layers = value;
  } else if (field == "speculative_algorithm") {
    flags.speculative_algorithm = value;
  } else if (field == "speculative_draft_layers") {
    flags.speculative_draft_layers = to_int(word, value, label);
  } else if (field == "dp_attention") {
    flags.dp_attention = on;
  } else if (field == "quantization_param_path") {
    flags.quantization_param_path = value;
  } else if (field == "quantization") {
    flags.quantization = value;
  } else if (field == "dtype") {
    flags.dtype = value;
  } else if (field == "context_length") {
    auto tokens = parse_token_count(value);
    if (!tokens)
      throw InputError(label, fmt::format("{} expects a token count, got '{}'", word, value));
    flags.context_length = *tokens;
  } else if (field == "memory_fraction") {
    try {
      flags.memory_fraction = std::stod(value);
    } catch (const std::exception&) {
      throw InputError(label, fmt::format("{} expects a fraction, got '{}'", word, value));
    }
  } else if (field == "mamba_ssm_dtype") {
    flags.mamba_ssm_dtype = value;
  } else if (field == "calculate_kv_scales") {
    flags.calculate_kv_scales = on;
  } else if (field == "max_total_tokens") {
    flags.max_total_tokens = to_int(word, value, label);
  } else if (field == "page_size") {
    flags.page_size = to_int(word, value, label);
  } else if (field == "host") {
    flags.host = value;
  } else if (field == "port") {
    flags.port = to_int(word, value, label);
  } else if (field == "attention_backend") {
    flags.attention_backend = ascii_lower(value);
  } else if (field == "speculative_draft_kv_cache_dtype") {
    flags.speculative_draft_kv_cache_dtype = value;
  }
}

std::string read_config_text(const LaunchFlags& flags, const std::string& where) {
  try {
    return read_text_file(flags.config_file, 1 << 20);
  } catch (const InputError& error) {
    throw InputError(where, fmt::format("{}; kvaudit needs it: the KV cache dtype and the "
                                        "memory fraction may be set there (copy it here)",
                                        error.what()));
  }
}

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

// The YAML file a launch names (TensorRT-LLM --config / --extra_llm_api_options): each
// launch field's keys as the engine data lists them. The file is read where the command
// names it (relative paths from the current folder); a launch whose file cannot be read
// is refused, since the KV dtype may be set there.
void apply_config_file(const LaunchSpec& launch, LaunchFlags& flags, const std::string& label) {
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

}  // namespace

namespace {

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

std::optional<std::string> engine_started_by(const Registry& registry,
                                             const std::vector<std::string>& words,
                                             const std::string& label) {
  if (auto entry = find_entry_point(registry, words)) return entry->first;
  for (size_t i = 0; i + 2 < words.size(); ++i)
    if (is_wrapper_shell(words[i]) && words[i + 1] == "-c")
      return engine_started_by(registry, split_shell_words(words[i + 2], label), label);
  return std::nullopt;
}

int64_t line_at(std::string_view text, size_t offset) {
  offset = std::min(offset, text.size());
  return 1 + std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(offset), '\n');
}

void site_lines_from_text(const std::string& file, std::string_view text, LaunchFlags& flags,
                          const std::map<std::string, FieldOrigin>& origins) {
  for (const auto& [field, origin] : origins) {
    auto site = flags.sites.find(field);
    if (site == flags.sites.end() || site->second.file != file ||
        origin.flag.offset == std::string::npos)
      continue;
    const std::string& word = origin.flag.text;
    const std::string spelled = word.substr(0, word.find('='));
    const size_t at = text.find(spelled, std::min(origin.flag.offset, text.size()));
    if (at != std::string_view::npos) site->second.line = line_at(text, at);
  }
}

std::vector<LaunchWord> unsited_words(const std::vector<std::string>& words) {
  std::vector<LaunchWord> out;
  out.reserve(words.size());
  for (const std::string& word : words) out.push_back(LaunchWord{word, {}, std::string::npos});
  return out;
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

LaunchFlags flags_from_launch_words(const Registry& registry, const std::vector<LaunchWord>& words,
                                    const std::string& label,
                                    std::map<std::string, std::string> environment,
                                    std::map<std::string, FieldOrigin>* origins) {
  std::vector<std::string> texts;
  texts.reserve(words.size());
  for (const LaunchWord& word : words) texts.push_back(word.text);
  auto entry = find_entry_point(registry, texts);
  if (!entry) {
    // `bash -c '...'` wrappers: look inside the quoted command; its words share its site.
    for (size_t i = 0; i + 2 < words.size(); ++i)
      if (is_wrapper_shell(texts[i]) && texts[i + 1] == "-c") {
        std::vector<LaunchWord> inner;
        for (std::string& text : split_shell_words(texts[i + 2], label))
          inner.push_back({std::move(text), words[i + 2].site, words[i + 2].offset});
        return flags_from_launch_words(registry, inner, label, environment, origins);
      }
    std::vector<std::string> known;
    for (const std::string& engine : registry.names())
      known.push_back(fmt::format("{} ({})", engine,
                                  fmt::join(registry.engine(engine).launch.entry_points, ", ")));
    throw InputError(
        label, fmt::format("launch command starts no known engine: {}", fmt::join(known, "; ")));
  }
  LaunchFlags flags;
  flags.engine = entry->first;
  flags.source = label;
  const LaunchSpec& launch = registry.engine(flags.engine).launch;
  const size_t entry_word = entry->second == 0 ? 0 : entry->second - 1;
  flags.command_site = words[entry_word].site;
  std::map<std::string, std::string> field_by_flag;
  for (const auto& [field, spellings] : launch.flags)
    for (const auto& spelling : spellings) field_by_flag[spelling] = field;
  const std::vector<std::string>& booleans = launch.boolean_flags;
  auto is_boolean = [&](const std::string& flag) {
    return std::find(booleans.begin(), booleans.end(), flag) != booleans.end();
  };
  // vLLM's parser reads --kv_cache_dtype as --kv-cache-dtype: the name up to its first '.'.
  auto normalised = [&](std::string flag) {
    if (!launch.underscores_are_dashes || flag.rfind("--", 0) != 0) return flag;
    const size_t dot = flag.find('.');
    std::replace(flag.begin() + 2, dot == std::string::npos ? flag.end() : flag.begin() + dot, '_',
                 '-');
    return flag;
  };

  // NAME=VALUE words before the program (`VLLM_ATTENTION_BACKEND=FLASHINFER vllm serve`,
  // `env NAME=VALUE ...`, docker's `-e NAME=VALUE`) set the environment it runs with.
  for (size_t w = 0; w < entry->second; ++w) {
    const std::string& word = texts[w];
    const size_t eq = word.find('=');
    if (eq == std::string::npos || eq == 0 || word.rfind("-", 0) == 0) continue;
    const std::string name = word.substr(0, eq);
    if (std::all_of(name.begin(), name.end(),
                    [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }))
      environment[name] = word.substr(eq + 1);
  }
  for (const auto& [field, names] : launch.environment)
    for (const auto& name : names)
      if (auto it = environment.find(name); it != environment.end() && !it->second.empty()) {
        if (field == "attention_backend") flags.attention_backend = ascii_lower(it->second);
      }

  // The arguments, with a --config file's keys spliced in before the command line's own
  // (vLLM, SGLang), so a flag on the command line wins.
  std::vector<LaunchWord> arguments(words.begin() + static_cast<std::ptrdiff_t>(entry->second),
                                    words.end());
  std::set<size_t> from_config;  // indices in `arguments` that came from the file
  if (launch.config_keys_are_flags) {
    for (size_t i = 0; i < arguments.size(); ++i) {
      const std::string word = normalised(arguments[i].text);
      const bool names_file =
          std::find(launch.config_file_flags.begin(), launch.config_file_flags.end(), word) !=
          launch.config_file_flags.end();
      if (!names_file) continue;
      if (i + 1 >= arguments.size()) throw InputError(label, word + " needs a file");
      flags.config_file = arguments[i + 1].text;
      flags.config_file_flag = word;
      const std::string where =
          fmt::format("{} (named by {} in {})", flags.config_file, word, label);
      std::vector<LaunchWord> spliced =
          config_file_words(flags.config_file, read_config_text(flags, where), where);
      std::vector<LaunchWord> merged;
      const bool positional_first = launch.positional_model && !arguments.empty() &&
                                    arguments.front().text.rfind("-", 0) != 0 && i > 0;
      if (positional_first) merged.push_back(arguments.front());
      for (LaunchWord& word_from_file : spliced) {
        from_config.insert(merged.size());
        merged.push_back(std::move(word_from_file));
      }
      for (size_t k = positional_first ? 1 : 0; k < arguments.size(); ++k)
        if (k != i && k != i + 1) merged.push_back(arguments[k]);
      arguments = std::move(merged);
      break;
    }
  }

  auto record = [&](const std::string& field, const LaunchWord& flag_word,
                    const LaunchWord& value_word, bool inline_value, bool config) {
    (config ? flags.fields_from_config : flags.fields_from_flags).insert(field);
    if (!config) flags.fields_from_config.erase(field);
    SettingSite site = flag_word.site;
    if (site.key_path.empty())
      site.key_path = normalised(flag_word.text.substr(0, flag_word.text.find('=')));
    flags.sites[field] = site;
    if (origins) (*origins)[field] = FieldOrigin{flag_word, value_word, inline_value};
  };

  size_t i = 0;
  if (launch.positional_model && i < arguments.size() && arguments[i].text.rfind("-", 0) != 0) {
    flags.model_path = arguments[i].text;
    record("model_path", arguments[i], arguments[i], true, from_config.count(i) > 0);
    ++i;
  }
  for (; i < arguments.size(); ++i) {
    const size_t flag_index = i;
    std::string word = arguments[i].text;
    if (word.rfind("-", 0) != 0) {
      flags.ignored_arguments.push_back(word);
      continue;
    }
    std::string value;
    bool has_inline_value = false;
    if (auto eq = word.find('='); eq != std::string::npos) {
      value = word.substr(eq + 1);
      word = word.substr(0, eq);
      has_inline_value = true;
    }
    word = normalised(word);
    auto field_it = field_by_flag.find(word);
    bool boolean = is_boolean(word);
    size_t value_index = flag_index;
    if (!has_inline_value && !boolean) {
      if (i + 1 < arguments.size() && arguments[i + 1].text.rfind("--", 0) != 0) {
        value = arguments[++i].text;
        value_index = i;
      }
    }
    if (std::find(launch.config_file_flags.begin(), launch.config_file_flags.end(), word) !=
        launch.config_file_flags.end()) {
      if (value.empty()) throw InputError(label, word + " needs a file");
      flags.config_file = value;
      flags.config_file_flag = word;
      continue;
    }
    if (field_it == field_by_flag.end()) {
      flags.ignored_arguments.push_back(has_inline_value || !value.empty() ? word + "=" + value
                                                                           : word);
      continue;
    }
    const std::string& field = field_it->second;
    bool on = !has_inline_value || (value != "false" && value != "False" && value != "0");
    set_launch_field(flags, field, value, word, on, label);
    record(field, arguments[flag_index], arguments[value_index], has_inline_value,
           from_config.count(flag_index) > 0);
  }
  if (!flags.config_file.empty() && !launch.config_keys_are_flags)
    apply_config_file(launch, flags, label);
  if (flags.tp == 0 || flags.pp == 0 || flags.dp == 0 || flags.dcp == 0)
    throw InputError(label, "parallel sizes must be at least 1");
  return flags;
}

namespace {

LaunchFlags flags_from_words(const Registry& registry, const std::vector<std::string>& words,
                             const std::string& label,
                             std::map<std::string, std::string> environment) {
  return flags_from_launch_words(registry, unsited_words(words), label, std::move(environment));
}

}  // namespace

std::vector<std::string> split_shell_words(std::string_view line, const std::string& label) {
  std::vector<std::string> words;
  std::string current;
  bool in_word = false;
  char quote = 0;
  for (size_t i = 0; i < line.size(); ++i) {
    char c = line[i];
    if (quote == '\'') {
      if (c == '\'')
        quote = 0;
      else
        current.push_back(c);
      continue;
    }
    if (c == '\\') {
      if (i + 1 < line.size() && (line[i + 1] == '\n' || line[i + 1] == '\r')) {
        ++i;  // line continuation
        if (line[i] == '\r' && i + 1 < line.size() && line[i + 1] == '\n') ++i;
        continue;
      }
      if (i + 1 < line.size()) {
        current.push_back(line[++i]);
        in_word = true;
      }
      continue;
    }
    if (quote == '"') {
      if (c == '"')
        quote = 0;
      else
        current.push_back(c);
      continue;
    }
    if (c == '\'' || c == '"') {
      quote = c;
      in_word = true;
      continue;
    }
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      if (in_word) words.push_back(std::move(current));
      current.clear();
      in_word = false;
      continue;
    }
    current.push_back(c);
    in_word = true;
  }
  if (quote) throw InputError(label, fmt::format("unterminated {} quote in command line", quote));
  if (in_word) words.push_back(std::move(current));
  return words;
}

LaunchFlags parse_launch_command(const Registry& registry, std::string_view command_line,
                                 const std::string& label,
                                 const std::map<std::string, std::string>& environment) {
  return flags_from_words(registry, split_shell_words(command_line, label), label, environment);
}

namespace {

// Where the unit's last ExecStart= line starts (the one Type=simple runs), or npos.
size_t last_exec_start_offset(std::string_view text) {
  size_t found = std::string_view::npos;
  for (size_t at = text.find("ExecStart="); at != std::string_view::npos;
       at = text.find("ExecStart=", at + 1)) {
    size_t line_start = text.rfind('\n', at);
    line_start = line_start == std::string_view::npos ? 0 : line_start + 1;
    const std::string_view before = text.substr(line_start, at - line_start);
    if (before.find_first_not_of(" \t") == std::string_view::npos) found = at;
  }
  return found;
}

}  // namespace

LaunchFlags parse_systemd_unit(const Registry& registry, const std::filesystem::path& unit_file) {
  const std::string label = unit_file.string();
  std::string text = read_text_file(unit_file, 1 << 20);
  // Join continuation lines first, as systemd does.
  std::string joined;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\\' && i + 1 < text.size() && (text[i + 1] == '\n' || text[i + 1] == '\r')) {
      ++i;
      if (text[i] == '\r' && i + 1 < text.size() && text[i + 1] == '\n') ++i;
      joined.push_back(' ');
      continue;
    }
    joined.push_back(text[i]);
  }
  std::map<std::string, std::string> environment;
  std::string exec_start;
  std::string section;
  std::istringstream lines(joined);
  std::string line;
  while (std::getline(lines, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    size_t start = line.find_first_not_of(" \t");
    if (start == std::string::npos || line[start] == '#' || line[start] == ';') continue;
    line = line.substr(start);
    if (line.front() == '[') {
      section = line;
      continue;
    }
    if (section != "[Service]") continue;
    auto eq = line.find('=');
    if (eq == std::string::npos) continue;
    std::string key = line.substr(0, eq);
    while (!key.empty() && (key.back() == ' ' || key.back() == '\t')) key.pop_back();
    std::string value = line.substr(eq + 1);
    if (key == "Environment") {
      for (const auto& assignment : split_shell_words(value, label)) {
        auto pos = assignment.find('=');
        if (pos != std::string::npos)
          environment[assignment.substr(0, pos)] = assignment.substr(pos + 1);
      }
    } else if (key == "ExecStart") {
      exec_start = value;  // the last ExecStart= wins for Type=simple
    }
  }
  if (exec_start.empty()) throw InputError(label, "no ExecStart= in a [Service] section");
  size_t first = exec_start.find_first_not_of(" \t");
  while (first != std::string::npos &&
         std::string("-@+!:").find(exec_start[first]) != std::string::npos)
    ++first;  // systemd's ExecStart prefixes
  exec_start = first == std::string::npos ? "" : exec_start.substr(first);
  // Expand $VAR and ${VAR} from Environment= as systemd does in ExecStart.
  std::string expanded;
  for (size_t i = 0; i < exec_start.size(); ++i) {
    if (exec_start[i] != '$' || i + 1 >= exec_start.size()) {
      expanded.push_back(exec_start[i]);
      continue;
    }
    size_t name_start = i + 1;
    bool braced = exec_start[name_start] == '{';
    if (braced) ++name_start;
    size_t name_end = name_start;
    while (name_end < exec_start.size() &&
           (std::isalnum(static_cast<unsigned char>(exec_start[name_end])) ||
            exec_start[name_end] == '_'))
      ++name_end;
    std::string name = exec_start.substr(name_start, name_end - name_start);
    if (name.empty()) {
      expanded.push_back('$');
      continue;
    }
    auto it = environment.find(name);
    expanded += it == environment.end() ? "" : it->second;
    i = braced && name_end < exec_start.size() && exec_start[name_end] == '}' ? name_end
                                                                              : name_end - 1;
  }
  // Each word sits at the ExecStart line; the flags' own lines are found in the unit text.
  const size_t exec_offset = last_exec_start_offset(text);
  const SettingSite exec_site{label, line_at(text, exec_offset), "ExecStart"};
  std::vector<LaunchWord> words;
  for (std::string& word : split_shell_words(expanded, label))
    words.push_back({std::move(word), exec_site, exec_offset});
  std::map<std::string, FieldOrigin> origins;
  LaunchFlags flags = flags_from_launch_words(registry, words, label, environment, &origins);
  flags.source = "unit " + label;
  flags.launch_file = label;
  flags.launch_file_kind = "systemd unit";
  flags.command_site = exec_site;
  site_lines_from_text(label, text, flags, origins);
  return flags;
}

}  // namespace kvaudit::engines
