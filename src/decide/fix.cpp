// decide fix: --kv-cache-dtype set in a command line or a unit's ExecStart, every other byte
// kept: the flag's value is replaced where it stands, or the flag is appended after the last
// argument (on the last continuation line of a unit).
#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "decide/decide.h"
#include "util/util.h"

namespace kvaudit::decide {

namespace {

// Spellings of --kv-cache-dtype for this engine (from the engine data's launch flags).
std::vector<std::string> spellings(const engines::EngineModel& engine) {
  auto it = engine.launch.flags.find("kv_cache_dtype");
  if (it == engine.launch.flags.end() || it->second.empty()) return {"--kv-cache-dtype"};
  return it->second;
}

bool word_boundary(char c) {
  return std::isspace(static_cast<unsigned char>(c)) || c == '"' || c == '\'' || c == '\\';
}

// In `text`, the [begin, end) of the value of an existing --kv-cache-dtype (inline "=x" or
// the next word), or nullopt.
std::optional<std::pair<size_t, size_t>> existing_value(const std::string& text,
                                                        const std::vector<std::string>& flags) {
  for (const std::string& flag : flags) {
    for (size_t at = text.find(flag); at != std::string::npos; at = text.find(flag, at + 1)) {
      const size_t end = at + flag.size();
      if (at > 0 && !word_boundary(text[at - 1])) continue;
      if (end < text.size() && text[end] == '=') {
        size_t v = end + 1, w = v;
        while (w < text.size() && !word_boundary(text[w])) ++w;
        return std::make_pair(v, w);
      }
      if (end < text.size() && !word_boundary(text[end])) continue;  // --kv-cache-dtype-skip-...
      size_t v = end;
      // The next word, past blanks and line continuations.
      while (v < text.size() && (word_boundary(text[v]) && text[v] != '"' && text[v] != '\'')) ++v;
      size_t w = v;
      while (w < text.size() && !word_boundary(text[w])) ++w;
      if (w > v) return std::make_pair(v, w);
    }
  }
  return std::nullopt;
}

}  // namespace

std::string fix_command(const std::string& command, const engines::EngineModel& engine,
                        const std::string& value) {
  if (auto span = existing_value(command, spellings(engine)))
    return command.substr(0, span->first) + value + command.substr(span->second);
  size_t end = command.size();
  while (end > 0 && std::isspace(static_cast<unsigned char>(command[end - 1]))) --end;
  return command.substr(0, end) + " --kv-cache-dtype " + value + command.substr(end);
}

std::string fix_unit(const std::string& unit_text, const engines::EngineModel& engine,
                     const std::string& value, const std::string& label) {
  // ExecStart= and its continuation lines (each ending in a backslash).
  size_t start = std::string::npos;
  for (size_t at = unit_text.find("ExecStart="); at != std::string::npos;
       at = unit_text.find("ExecStart=", at + 1))
    if (at == 0 || unit_text[at - 1] == '\n') {
      start = at;
      break;
    }
  if (start == std::string::npos) throw InputError(label, "has no ExecStart= line to fix");
  size_t end = start;
  while (true) {
    size_t newline = unit_text.find('\n', end);
    if (newline == std::string::npos) {
      end = unit_text.size();
      break;
    }
    size_t last = newline;
    while (last > end && (unit_text[last - 1] == ' ' || unit_text[last - 1] == '\t' ||
                          unit_text[last - 1] == '\r'))
      --last;
    if (last == end || unit_text[last - 1] != '\\') {
      end = newline;
      break;
    }
    end = newline + 1;
  }
  const std::string exec = unit_text.substr(start, end - start);
  std::string fixed;
  if (auto span = existing_value(exec, spellings(engine))) {
    fixed = exec.substr(0, span->first) + value + exec.substr(span->second);
  } else {
    size_t cut = exec.size();
    while (cut > 0 && (exec[cut - 1] == ' ' || exec[cut - 1] == '\t' || exec[cut - 1] == '\r'))
      --cut;
    fixed = exec.substr(0, cut) + " --kv-cache-dtype " + value + exec.substr(cut);
  }
  return unit_text.substr(0, start) + fixed + unit_text.substr(end);
}

std::string fix_launch_file(const std::string& text, std::vector<engines::TextEdit> edits,
                            const std::string& value, const std::string& label) {
  // Later edits first, so earlier offsets stay valid; the same edit twice (two containers of
  // one list) is applied once.
  std::sort(edits.begin(), edits.end(), [](const auto& a, const auto& b) {
    return a.offset != b.offset ? a.offset > b.offset : a.length > b.length;
  });
  std::string out = text;
  size_t limit = text.size();
  for (size_t i = 0; i < edits.size(); ++i) {
    const engines::TextEdit& edit = edits[i];
    if (i > 0 && edit.offset == edits[i - 1].offset && edit.length == edits[i - 1].length) continue;
    if (edit.offset + edit.length > limit)
      throw InputError(label, "two KV dtype settings overlap; cannot correct the file");
    out.replace(edit.offset, edit.length, edit.prefix + value + edit.suffix);
    limit = edit.offset;
  }
  return out;
}

ServerAddress server_address(const engines::LaunchFlags& flags,
                             const engines::EngineModel& engine) {
  std::string host = flags.host;
  if (host.empty() || host == "0.0.0.0" || host == "::" || host == "[::]") host = "127.0.0.1";
  if (host.find(':') != std::string::npos && host.front() != '[') host = "[" + host + "]";
  ServerAddress out;
  out.url = fmt::format("http://{}:{}", host, flags.port.value_or(engine.launch.default_port));
  if (!flags.port)
    out.port_source =
        fmt::format("{}'s default port, {}", engine.engine, engine.launch.default_port_source);
  return out;
}

}  // namespace kvaudit::decide
