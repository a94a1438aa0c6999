// systemd units -> LaunchFlags: the [Service] section's last ExecStart=, its continuation
// lines joined and $VAR from Environment= expanded as systemd does, read as a command.
#include <cctype>
#include <map>
#include <sstream>

#include "engines/internal.h"
#include "util/util.h"

namespace kvaudit::engines {

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
