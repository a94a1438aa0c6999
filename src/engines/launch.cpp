// Launch commands -> LaunchFlags: the engine whose entry point the words start, then each
// flag into its launch field. Flag spellings are engine data (launch.flags in
// data/engines/<engine>.json); this file only tokenises. systemd units: launch_unit.cpp;
// the config files a launch names: launch_config.cpp.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <set>

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
// `base`: words[i] without its directory ("/usr/bin/vllm" -> "vllm").
std::optional<size_t> match_entry_point(const std::vector<std::string>& words, size_t i,
                                        std::string_view base,
                                        const std::vector<std::string>& parts) {
  if (parts.empty() || i + parts.size() > words.size()) return std::nullopt;
  if (parts[0] == "-m") {
    if (words[i] != "-m" || parts.size() != 2) return std::nullopt;
    const std::string& module = words[i + 1];
    if (module == parts[1] ||
        (module.size() > parts[1].size() && module.compare(0, parts[1].size(), parts[1]) == 0 &&
         module[parts[1].size()] == '.'))
      return i + 2;
    return std::nullopt;
  }
  if (base != parts[0]) return std::nullopt;
  for (size_t k = 1; k < parts.size(); ++k)
    if (words[i + k] != parts[k]) return std::nullopt;
  return i + parts.size();
}

// Finds which engine a word list starts and where its arguments begin. The entry points are
// split once, not once per word (a long command line made that quadratic).
std::optional<std::pair<std::string, size_t>> find_entry_point(
    const Registry& registry, const std::vector<std::string>& words) {
  std::vector<std::pair<std::string, std::vector<std::string>>> entries;
  for (const std::string& engine : registry.names())
    for (const std::string& entry : registry.engine(engine).launch.entry_points)
      entries.emplace_back(engine, split_list(entry, ' '));
  for (size_t i = 0; i < words.size(); ++i) {
    const std::string_view word = words[i];
    const size_t slash = word.find_last_of('/');
    const std::string_view base = slash == std::string_view::npos ? word : word.substr(slash + 1);
    for (const auto& [engine, parts] : entries)
      if (auto next = match_entry_point(words, i, base, parts)) return std::pair{engine, *next};
  }
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

}  // namespace

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

namespace {

// vLLM's parser reads --kv_cache_dtype as --kv-cache-dtype: the name up to its first '.'.
std::string normalised_flag(const LaunchSpec& launch, std::string flag) {
  if (!launch.underscores_are_dashes || flag.rfind("--", 0) != 0) return flag;
  const size_t dot = flag.find('.');
  std::replace(flag.begin() + 2, dot == std::string::npos ? flag.end() : flag.begin() + dot, '_',
               '-');
  return flag;
}

// Words that start no engine the data knows: the error names every engine's entry points.
[[noreturn]] void throw_no_known_engine(const Registry& registry, const std::string& label) {
  std::vector<std::string> known;
  for (const std::string& engine : registry.names())
    known.push_back(fmt::format("{} ({})", engine,
                                fmt::join(registry.engine(engine).launch.entry_points, ", ")));
  throw InputError(
      label, fmt::format("launch command starts no known engine: {}", fmt::join(known, "; ")));
}

// NAME=VALUE words before the program (`VLLM_ATTENTION_BACKEND=FLASHINFER vllm serve`,
// `env NAME=VALUE ...`, docker's `-e NAME=VALUE`) set the environment it runs with; the
// variables the engine data names set their launch fields.
void read_environment(const LaunchSpec& launch, const std::vector<std::string>& texts,
                      size_t program_end, std::map<std::string, std::string>& environment,
                      LaunchFlags& flags) {
  for (size_t w = 0; w < program_end; ++w) {
    const std::string& word = texts[w];
    const size_t eq = word.find('=');
    if (eq == std::string::npos || eq == 0 || word.rfind('-', 0) == 0) continue;
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
}

// The first flag that names a --config file (vLLM, SGLang): its words replace the flag and
// the file name, after a positional model; `from_config` gets their indices in `arguments`.
void splice_config_file(const LaunchSpec& launch, const std::string& label,
                        std::vector<LaunchWord>& arguments, std::set<size_t>& from_config,
                        LaunchFlags& flags) {
  for (size_t i = 0; i < arguments.size(); ++i) {
    const std::string word = normalised_flag(launch, arguments[i].text);
    const bool names_file =
        std::find(launch.config_file_flags.begin(), launch.config_file_flags.end(), word) !=
        launch.config_file_flags.end();
    if (!names_file) continue;
    if (i + 1 >= arguments.size()) throw InputError(label, word + " needs a file");
    flags.config_file = arguments[i + 1].text;
    flags.config_file_flag = word;
    const std::string where = fmt::format("{} (named by {} in {})", flags.config_file, word, label);
    std::vector<LaunchWord> spliced =
        config_file_words(flags.config_file, read_config_text(flags, where), where);
    std::vector<LaunchWord> merged;
    const bool positional_first = launch.positional_model && !arguments.empty() &&
                                  arguments.front().text.rfind('-', 0) != 0 && i > 0;
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

}  // namespace

namespace {

constexpr int kMostShellWrappers = 16;
// A script that names "$@" twice doubles the words at each wrapper: 16 wrappers made 65,536
// copies of a command line (found by fuzz_launch as a 2.4 s, 150 MB input of 1.7 KB).
constexpr size_t kMostWrappedWords = 4096;

// Flag spelling -> the tier setting it gives (the engine data's kv_tier_flags).
std::map<std::string, std::string> tier_settings_by_flag(const EngineModel& engine) {
  std::map<std::string, std::string> by_flag;
  for (const auto& [setting, spellings] : engine.tier_flags)
    for (const auto& spelling : spellings) by_flag[spelling] = setting;
  return by_flag;
}

// The words of the script a `bash -c '...'` wrapper runs, each sited at the script. The
// words after the script are its $0, $1, ...: a "$@" in it stands for $1 on (a Kubernetes
// `command: [sh, -c, 'exec engine "$@"', --]` with the flags in `args:`).
std::optional<std::vector<LaunchWord>> words_inside_shell_wrapper(
    const std::vector<LaunchWord>& words, const std::vector<std::string>& texts,
    const std::string& label) {
  for (size_t i = 0; i + 2 < words.size(); ++i) {
    if (!is_wrapper_shell(texts[i]) || texts[i + 1] != "-c") continue;
    std::vector<LaunchWord> inner;
    for (std::string& text : split_shell_words(texts[i + 2], label)) {
      if ((text == "$@" || text == "${@}") && i + 3 < words.size()) {
        inner.insert(inner.end(), words.begin() + static_cast<std::ptrdiff_t>(i + 4), words.end());
      } else {
        inner.push_back({std::move(text), words[i + 2].site, words[i + 2].offset});
      }
      if (inner.size() > kMostWrappedWords)
        throw InputError(label, fmt::format("the shell wrapper (sh -c) expands to more than {} "
                                            "words (its script repeats \"$@\")",
                                            kMostWrappedWords));
    }
    return inner;
  }
  return std::nullopt;
}

}  // namespace

LaunchFlags flags_from_launch_words(const Registry& registry, const std::vector<LaunchWord>& words,
                                    const std::string& label,
                                    std::map<std::string, std::string> environment,
                                    std::map<std::string, FieldOrigin>* origins) {
  std::vector<std::string> texts;
  texts.reserve(words.size());
  for (const LaunchWord& word : words) texts.push_back(word.text);
  auto entry = find_entry_point(registry, texts);
  if (!entry) {
    // `bash -c '...'` wrappers: look inside the quoted command. Nesting is bounded: with "$@"
    // a wrapper's arguments can hold the next wrapper, so depth no longer needs longer text.
    if (auto inner = words_inside_shell_wrapper(words, texts, label)) {
      static thread_local int wrapper_depth = 0;
      if (wrapper_depth >= kMostShellWrappers)
        throw InputError(label, fmt::format("shell wrappers (sh -c) nested more than {} deep",
                                            kMostShellWrappers));
      ++wrapper_depth;
      struct Leave {
        ~Leave() { --wrapper_depth; }
      } leave;
      return flags_from_launch_words(registry, *inner, label, environment, origins);
    }
    throw_no_known_engine(registry, label);
  }
  LaunchFlags flags;
  flags.engine = entry->first;
  flags.source = label;
  const EngineModel& engine = registry.engine(flags.engine);
  const LaunchSpec& launch = engine.launch;
  const std::map<std::string, std::string> tier_setting_by_flag = tier_settings_by_flag(engine);
  const size_t entry_word = entry->second == 0 ? 0 : entry->second - 1;
  flags.command_site = words[entry_word].site;
  std::map<std::string, std::string> field_by_flag;
  for (const auto& [field, spellings] : launch.flags)
    for (const auto& spelling : spellings) field_by_flag[spelling] = field;
  const std::vector<std::string>& booleans = launch.boolean_flags;
  auto is_boolean = [&](const std::string& flag) {
    return std::find(booleans.begin(), booleans.end(), flag) != booleans.end();
  };
  read_environment(launch, texts, entry->second, environment, flags);

  // The arguments, with a --config file's keys spliced in before the command line's own
  // (vLLM, SGLang), so a flag on the command line wins.
  std::vector<LaunchWord> arguments(words.begin() + static_cast<std::ptrdiff_t>(entry->second),
                                    words.end());
  std::set<size_t> from_config;  // indices in `arguments` that came from the file
  if (launch.config_keys_are_flags)
    splice_config_file(launch, label, arguments, from_config, flags);

  auto record = [&](const std::string& field, const LaunchWord& flag_word,
                    const LaunchWord& value_word, bool inline_value, bool config) {
    (config ? flags.fields_from_config : flags.fields_from_flags).insert(field);
    if (!config) flags.fields_from_config.erase(field);
    SettingSite site = flag_word.site;
    if (site.key_path.empty())
      site.key_path = normalised_flag(launch, flag_word.text.substr(0, flag_word.text.find('=')));
    flags.sites[field] = site;
    if (origins) (*origins)[field] = FieldOrigin{flag_word, value_word, inline_value};
  };

  size_t i = 0;
  if (launch.positional_model && i < arguments.size() && arguments[i].text.rfind('-', 0) != 0) {
    flags.model_path = arguments[i].text;
    record("model_path", arguments[i], arguments[i], true, from_config.count(i) > 0);
    ++i;
  }
  for (; i < arguments.size(); ++i) {
    const size_t flag_index = i;
    std::string word = arguments[i].text;
    if (word.rfind('-', 0) != 0) {
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
    word = normalised_flag(launch, word);
    auto field_it = field_by_flag.find(word);
    bool boolean = is_boolean(word) || engine.tier_boolean_flags.count(word) > 0;
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
    if (auto tier = tier_setting_by_flag.find(word); tier != tier_setting_by_flag.end()) {
      record_tier_setting(tier->second, boolean && !has_inline_value ? "true" : value, flags);
      continue;
    }
    if (field_it == field_by_flag.end()) {
      flags.ignored_arguments.push_back(
          has_inline_value || !value.empty() ? fmt::format("{}={}", word, value) : word);
      continue;
    }
    const std::string& field = field_it->second;
    bool on = !has_inline_value || (value != "false" && value != "False" && value != "0");
    set_launch_field(flags, field, value, word, on, label);
    record(field, arguments[flag_index], arguments[value_index], has_inline_value,
           from_config.count(flag_index) > 0);
  }
  if (!flags.config_file.empty() && !launch.config_keys_are_flags)
    apply_config_file(engine, flags, label);
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

}  // namespace kvaudit::engines
