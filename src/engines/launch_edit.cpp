// Where a launch file takes its KV dtype: the bytes of the value it sets, or where a new
// flag or key goes, as the edit --write-unit applies.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "engines/internal.h"
#include "util/util.h"

namespace kvaudit::engines {

namespace {

// Byte span of a word's value text at or after `from` in `text`, past blanks, quotes and
// line continuations; npos when the text there does not spell it.
std::optional<std::pair<size_t, size_t>> find_value(std::string_view text, size_t from,
                                                    const std::string& value) {
  if (from >= text.size() || value.empty()) return std::nullopt;
  const size_t at = text.find(value, from);
  if (at == std::string_view::npos) return std::nullopt;
  // Only blanks, quotes, '=' and continuations may lie between `from` and the value.
  for (size_t k = from; k < at; ++k)
    if (!std::isspace(static_cast<unsigned char>(text[k])) && text[k] != '"' && text[k] != '\'' &&
        text[k] != '\\' && text[k] != '-' && text[k] != '=')
      return std::nullopt;
  return std::make_pair(at, value.size());
}

}  // namespace

// Where a launch file takes its KV dtype: the present value's bytes, or where a new flag
// goes (after the last argument of a list, after the entry point in a command string, or at
// the end of an engine's --config file).
std::optional<TextEdit> kv_dtype_edit(const LaunchFlags& flags, const LaunchSpec& launch,
                                      const std::string& file, std::string_view text,
                                      const std::vector<LaunchWord>& words,
                                      const std::map<std::string, FieldOrigin>& origins) {
  auto spelled = launch.flags.find("kv_cache_dtype");
  if (spelled == launch.flags.end() || spelled->second.empty()) return std::nullopt;
  const std::string& flag = spelled->second.front();
  if (auto origin = origins.find("kv_cache_dtype"); origin != origins.end()) {
    const FieldOrigin& o = origin->second;
    const std::string& value = flags.kv_cache_dtype;
    std::string owner = o.value.site.file;
    std::string owner_text;
    std::string_view in = text;
    if (owner != file) {  // a --config file's key
      owner_text = read_text_file(owner, 1 << 20);
      in = owner_text;
    }
    if (o.value.offset == std::string::npos) return std::nullopt;
    size_t from = o.value.offset;
    if (o.inline_value || o.value.offset == o.flag.offset) {
      // "--kv-cache-dtype=fp8" or a flag and its value inside one string: past the flag.
      const std::string name = o.flag.text.substr(0, o.flag.text.find('='));
      const size_t at = in.find(name, from);
      if (at == std::string_view::npos) return std::nullopt;
      from = at + name.size();
    }
    auto span = find_value(in, from, value);
    if (!span) return std::nullopt;
    return TextEdit{owner, span->first, span->second, "", ""};
  }
  if (!flags.config_file.empty() && launch.config_keys_are_flags) {
    // The launch reads a --config file: the setting goes there, in its key style.
    const std::string config_text = read_text_file(flags.config_file, 1 << 20);
    const bool underscores =
        config_text.find('_') != std::string::npos && config_text.find('-') == std::string::npos;
    std::string key = flag.substr(2);
    if (underscores) std::replace(key.begin(), key.end(), '-', '_');
    const bool ends_in_newline = config_text.empty() || config_text.back() == '\n';
    return TextEdit{flags.config_file, config_text.size(), 0,
                    fmt::format("{}{}: ", ends_in_newline ? "" : "\n", key), "\n"};
  }
  if (words.empty()) return std::nullopt;
  const LaunchWord& last = words.back();
  if (last.site.file != file || last.offset == std::string::npos) return std::nullopt;
  // A script (`sh -c "..."`): right after the entry point's last word.
  if (last.text.find_first_of(" \t\n") != std::string::npos) {
    for (const std::string& entry : launch.entry_points) {
      const std::string tail = split_list(entry, ' ').back();
      for (size_t at = text.find(tail, last.offset); at != std::string_view::npos;
           at = text.find(tail, at + 1)) {
        const size_t end = at + tail.size();
        if (end < text.size() && !std::isspace(static_cast<unsigned char>(text[end])) &&
            text[end] != '"' && text[end] != '\'' && text[end] != '\\')
          continue;
        return TextEdit{file, end, 0, fmt::format(" {} ", flag), ""};
      }
    }
    return std::nullopt;
  }
  const bool shares_scalar = words.size() >= 2 && words[words.size() - 2].offset == last.offset;
  if (!shares_scalar && last.site.key_path.back() == ']') {
    // A list item of its own: a new item after it, in the list's style.
    size_t line_start = text.rfind('\n', last.offset);
    line_start = line_start == std::string_view::npos ? 0 : line_start + 1;
    const std::string_view before = text.substr(line_start, last.offset - line_start);
    const size_t dash = before.find_last_not_of(" \t");
    if (dash != std::string_view::npos && before[dash] == '-' &&
        before.substr(0, dash).find_first_not_of(" \t") == std::string_view::npos) {
      size_t line_end = text.find('\n', last.offset);
      if (line_end == std::string_view::npos) line_end = text.size();
      return TextEdit{file, line_end, 0, fmt::format("\n{}- {}=", std::string(dash, ' '), flag),
                      ""};
    }
    // A flow list: after the item, before the ',' or ']' that ends it.
    size_t end = last.offset;
    if (text[end] == '"' || text[end] == '\'') {
      const char quote = text[end];
      end = text.find(quote, end + 1);
      if (end == std::string_view::npos) return std::nullopt;
      ++end;
    } else {
      while (end < text.size() && text[end] != ',' && text[end] != ']' && text[end] != '\n') ++end;
      while (end > last.offset && std::isspace(static_cast<unsigned char>(text[end - 1]))) --end;
    }
    return TextEdit{file, end, 0, fmt::format(", \"{}=", flag), "\""};
  }
  // Words split out of one string (compose's command: >): after the last of them, found in
  // order from where the string starts.
  size_t at = last.offset;
  for (const LaunchWord& word : words) {
    if (word.offset != last.offset) continue;
    const size_t found = text.find(word.text, at);
    if (found == std::string_view::npos) return std::nullopt;
    at = found + word.text.size();
  }
  return TextEdit{file, at, 0, fmt::format(" {} ", flag), ""};
}

}  // namespace kvaudit::engines
