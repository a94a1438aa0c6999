// Launch files -> LaunchFlags: Kubernetes manifests (and `helm template` output), docker-compose
// files and the engines' own --config YAML, beside the systemd units launch_unit.cpp reads.
// Each word of a launch keeps the file, line and key path it is written at, so findings and
// SARIF point at the flag or key, and --write-unit can change the KV dtype and keep every other
// byte (launch_edit.cpp finds where).
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <sstream>

#include <yaml-cpp/yaml.h>

#include "engines/engines.h"
#include "engines/internal.h"
#include "util/util.h"

namespace kvaudit::engines {

namespace {

namespace fs = std::filesystem;

size_t offset_of(const YAML::Node& node) {
  return static_cast<size_t>(std::max(0, node.Mark().pos));
}

int64_t line_of(const YAML::Node& node) {
  return node.Mark().line + 1;
}

// node[key] where node may be anything: yaml-cpp's operator[] on a missing key gives a node
// every other call throws on, so chains of lookups go through this.
YAML::Node child(const YAML::Node& node, const std::string& key) {
  if (!node.IsDefined() || !node.IsMap()) return YAML::Node(YAML::NodeType::Undefined);
  const YAML::Node value = node[key];
  return value.IsDefined() ? value : YAML::Node(YAML::NodeType::Undefined);
}

bool is_unit(std::string_view text) {
  std::istringstream lines{std::string(text)};
  std::string line;
  while (std::getline(lines, line)) {
    const size_t start = line.find_first_not_of(" \t");
    if (start != std::string::npos && line.compare(start, 9, "[Service]") == 0) return true;
  }
  return false;
}

// "nvcr.io/nvidia/vllm:25.01", "docker.io/vllm/vllm-openai:v0.10.1@sha256:..." -> the
// repository without registry host, tag or digest: "nvidia/vllm", "vllm/vllm-openai".
std::string image_repository(std::string image) {
  if (const size_t at = image.find('@'); at != std::string::npos) image.resize(at);
  const size_t slash = image.rfind('/');
  if (const size_t colon = image.rfind(':');
      colon != std::string::npos && (slash == std::string::npos || colon > slash))
    image.resize(colon);
  const size_t first = image.find('/');
  if (first != std::string::npos) {
    const std::string host = image.substr(0, first);
    if (host.find('.') != std::string::npos || host.find(':') != std::string::npos ||
        host == "localhost")
      image = image.substr(first + 1);
  }
  if (image.rfind("library/", 0) == 0) image = image.substr(8);
  return image;
}

// The words an image's own ENTRYPOINT runs, when the engine data knows the image.
std::optional<std::vector<std::string>> image_entry_words(const Registry& registry,
                                                          const std::string& image) {
  const std::string repository = image_repository(image);
  for (const std::string& engine : registry.names())
    for (const auto& entry : registry.engine(engine).launch.image_entry_points)
      if (entry.image == repository) return entry.words;
  return std::nullopt;
}

// Kubernetes' $(VAR) expansion in command and args: from the container's env; $$(VAR)
// stays literal as $(VAR); an unknown variable stays as written.
std::string expand_kubernetes(const std::string& word,
                              const std::map<std::string, std::string>& environment) {
  std::string out;
  for (size_t i = 0; i < word.size(); ++i) {
    if (word[i] == '$' && i + 1 < word.size() && word[i + 1] == '$') {
      out.push_back('$');
      ++i;
      continue;
    }
    if (word[i] == '$' && i + 1 < word.size() && word[i + 1] == '(') {
      const size_t close = word.find(')', i + 2);
      if (close != std::string::npos) {
        auto it = environment.find(word.substr(i + 2, close - i - 2));
        if (it != environment.end()) {
          out += it->second;
          i = close;
          continue;
        }
      }
    }
    out.push_back(word[i]);
  }
  return out;
}

// Compose's ${VAR}, ${VAR:-default}, ${VAR-default} and $VAR, from .env beside the file and
// then the environment kvaudit runs in (as `docker compose` reads them); $$ is a dollar.
// Unknown variables become empty, as compose makes them; `unresolved` names them.
std::string expand_compose(const std::string& word, const std::map<std::string, std::string>& vars,
                           std::vector<std::string>& unresolved) {
  auto lookup = [&](const std::string& name) -> std::optional<std::string> {
    if (const char* env = std::getenv(name.c_str())) return std::string(env);
    if (auto it = vars.find(name); it != vars.end()) return it->second;
    return std::nullopt;
  };
  std::string out;
  for (size_t i = 0; i < word.size(); ++i) {
    if (word[i] != '$' || i + 1 >= word.size()) {
      out.push_back(word[i]);
      continue;
    }
    if (word[i + 1] == '$') {
      out.push_back('$');
      ++i;
      continue;
    }
    if (word[i + 1] == '{') {
      const size_t close = word.find('}', i + 2);
      if (close == std::string::npos) {
        out.push_back(word[i]);
        continue;
      }
      std::string inside = word.substr(i + 2, close - i - 2);
      std::optional<std::string> fallback;
      bool empty_counts = false;
      if (size_t op = inside.find(":-"); op != std::string::npos) {
        fallback = inside.substr(op + 2);
        empty_counts = true;
        inside.resize(op);
      } else if (size_t dash = inside.find('-'); dash != std::string::npos) {
        fallback = inside.substr(dash + 1);
        inside.resize(dash);
      }
      auto value = lookup(inside);
      if (value && !(empty_counts && value->empty()))
        out += *value;
      else if (fallback)
        out += *fallback;
      else
        unresolved.push_back(inside);
      i = close;
      continue;
    }
    size_t end = i + 1;
    while (end < word.size() &&
           (std::isalnum(static_cast<unsigned char>(word[end])) || word[end] == '_'))
      ++end;
    if (end == i + 1) {
      out.push_back('$');
      continue;
    }
    const std::string name = word.substr(i + 1, end - i - 1);
    if (auto value = lookup(name))
      out += *value;
    else
      unresolved.push_back(name);
    i = end - 1;
  }
  return out;
}

std::map<std::string, std::string> read_dot_env(const fs::path& compose_file) {
  std::map<std::string, std::string> vars;
  const fs::path env_file = compose_file.parent_path() / ".env";
  std::error_code ec;
  if (!fs::is_regular_file(env_file, ec)) return vars;
  std::istringstream lines(read_text_file(env_file, 1 << 20));
  std::string line;
  while (std::getline(lines, line)) {
    const size_t start = line.find_first_not_of(" \t");
    if (start == std::string::npos || line[start] == '#') continue;
    const size_t eq = line.find('=', start);
    if (eq == std::string::npos) continue;
    std::string value = line.substr(eq + 1);
    if (value.size() >= 2 && (value.front() == '"' || value.front() == '\'') &&
        value.back() == value.front())
      value = value.substr(1, value.size() - 2);
    vars[line.substr(start, eq - start)] = value;
  }
  return vars;
}

// The words of one YAML value that holds a command: a list (one word per item) or a string
// (split as a shell would: compose's string form, a `sh -c` script keeps its own quoting).
void append_words(const YAML::Node& node, const std::string& file, const std::string& key_path,
                  const std::string& where, std::vector<LaunchWord>& words) {
  if (!node.IsDefined() || node.IsNull()) return;
  if (node.IsSequence()) {
    for (size_t i = 0; i < node.size(); ++i) {
      const YAML::Node item = node[i];
      if (!item.IsScalar())
        throw InputError(where, fmt::format("{}[{}] is not a single word", key_path, i));
      words.push_back({item.Scalar(),
                       SettingSite{file, line_of(item), fmt::format("{}[{}]", key_path, i)},
                       offset_of(item)});
    }
  } else if (node.IsScalar()) {
    const SettingSite site{file, line_of(node), key_path};
    for (std::string& word : split_shell_words(node.Scalar(), where))
      words.push_back({std::move(word), site, offset_of(node)});
  } else {
    throw InputError(where, fmt::format("{} is neither a list of words nor a string", key_path));
  }
}

struct Container {
  YAML::Node node;
  std::string key_path;  // "spec.template.spec.containers[0]"
};

// The pod specs a Kubernetes object runs, by kind, with their key paths.
std::vector<std::pair<YAML::Node, std::string>> pod_specs(const YAML::Node& object,
                                                          const std::string& kind) {
  std::vector<std::pair<YAML::Node, std::string>> out;
  const YAML::Node spec = child(object, "spec");
  if (!spec.IsMap()) return out;
  if (kind == "Pod") {
    out.push_back({spec, "spec"});
  } else if (kind == "CronJob") {
    const YAML::Node pod =
        child(child(child(child(spec, "jobTemplate"), "spec"), "template"), "spec");
    if (pod.IsMap()) out.push_back({pod, "spec.jobTemplate.spec.template.spec"});
  } else if (kind == "LeaderWorkerSet") {
    const YAML::Node lws = child(spec, "leaderWorkerTemplate");
    if (lws.IsMap()) {
      if (child(child(lws, "leaderTemplate"), "spec").IsMap())
        out.push_back({child(child(lws, "leaderTemplate"), "spec"),
                       "spec.leaderWorkerTemplate.leaderTemplate.spec"});
      if (child(child(lws, "workerTemplate"), "spec").IsMap())
        out.push_back({child(child(lws, "workerTemplate"), "spec"),
                       "spec.leaderWorkerTemplate.workerTemplate.spec"});
    }
  } else if (child(child(spec, "template"), "spec").IsMap()) {
    // Deployment, StatefulSet, DaemonSet, ReplicaSet, Job and the like.
    out.push_back({child(child(spec, "template"), "spec"), "spec.template.spec"});
  }
  return out;
}

struct FileReader {
  const Registry& registry;
  std::string file;
  std::string text;
  std::string engine_hint;
  std::vector<LaunchFlags> launches;
  std::vector<std::string> seen;  // what was found that runs no engine, for the error

  // `as_written`: the words before variables were expanded, where the file spells them
  // (for where a new setting goes); empty when they are `words`.
  void add_launch(const std::vector<LaunchWord>& words,
                  const std::map<std::string, std::string>& environment, const std::string& kind,
                  const std::string& workload, const std::vector<LaunchWord>& as_written = {}) {
    std::vector<std::string> texts;
    texts.reserve(words.size());
    for (const LaunchWord& word : words) texts.push_back(word.text);
    const std::string where = fmt::format("{} ({})", file, workload);
    auto engine = engine_started_by(registry, texts, where);
    if (!engine) {
      seen.push_back(fmt::format(
          "{}: {}", workload,
          texts.empty() ? std::string("no command") : fmt::format("runs {}", texts.front())));
      return;
    }
    std::map<std::string, FieldOrigin> origins;
    LaunchFlags flags = flags_from_launch_words(registry, words, where, environment, &origins);
    flags.source = fmt::format("{} {}", file, workload);
    flags.launch_file = file;
    flags.launch_file_kind = kind;
    flags.workload = workload;
    site_lines_from_text(file, text, flags, origins);
    flags.kv_dtype_edit = kv_dtype_edit(flags, registry.engine(flags.engine).launch, file, text,
                                        as_written.empty() ? words : as_written, origins);
    launches.push_back(std::move(flags));
  }

  // YAML aliases let a few lines name a List of Lists of ... items (9 aliases per level, 8
  // levels: 43 million pods): nesting and the containers visited are bounded.
  static constexpr int kMaxListDepth = 4;
  static constexpr size_t kMaxContainers = 1024;
  size_t containers_seen = 0;

  void kubernetes(const YAML::Node& object, int document, int list_depth = 0) {
    const std::string kind = child(object, "kind").IsScalar() ? child(object, "kind").Scalar() : "";
    if (kind == "List") {
      if (list_depth >= kMaxListDepth)
        throw InputError(file, fmt::format("document {}: Lists nested more than {} deep", document,
                                           kMaxListDepth));
      const YAML::Node items = child(object, "items");
      if (items.IsSequence())
        for (const auto& item : items)
          if (item.IsMap()) kubernetes(item, document, list_depth + 1);
      return;
    }
    const std::string name = child(child(object, "metadata"), "name").IsScalar()
                                 ? child(child(object, "metadata"), "name").Scalar()
                                 : std::string("(no name)");
    for (const auto& [pod, pod_path] : pod_specs(object, kind)) {
      const YAML::Node containers = child(pod, "containers");
      if (!containers.IsSequence()) continue;
      for (size_t c = 0; c < containers.size(); ++c) {
        const YAML::Node container = containers[c];
        if (!container.IsMap()) continue;
        if (++containers_seen > kMaxContainers)
          throw InputError(file, fmt::format("more than {} containers", kMaxContainers));
        const std::string path = fmt::format("{}.containers[{}]", pod_path, c);
        const std::string container_name = child(container, "name").IsScalar()
                                               ? child(container, "name").Scalar()
                                               : std::to_string(c);
        std::string workload = fmt::format("{}/{} container {}", kind, name, container_name);
        if (pod_path.find("workerTemplate") != std::string::npos) workload += " (worker)";
        if (pod_path.find("leaderTemplate") != std::string::npos) workload += " (leader)";
        workload += fmt::format(", document {}", document);
        const std::string where = fmt::format("{} ({})", file, workload);
        std::map<std::string, std::string> environment;
        if (child(container, "env").IsSequence())
          for (const auto& variable : child(container, "env"))
            if (child(variable, "name").IsScalar() && child(variable, "value").IsScalar())
              environment[child(variable, "name").Scalar()] = child(variable, "value").Scalar();
        std::vector<LaunchWord> words;
        if (child(container, "command").IsDefined() && !child(container, "command").IsNull()) {
          append_words(child(container, "command"), file, path + ".command", where, words);
        } else if (child(container, "image").IsScalar()) {
          // No command: the image's ENTRYPOINT runs, with args after it.
          if (auto entry = image_entry_words(registry, child(container, "image").Scalar()))
            for (const std::string& word : *entry)
              words.push_back(
                  {word, SettingSite{file, line_of(child(container, "image")), path + ".image"},
                   offset_of(child(container, "image"))});
        }
        append_words(child(container, "args"), file, path + ".args", where, words);
        for (LaunchWord& word : words) word.text = expand_kubernetes(word.text, environment);
        add_launch(words, environment, "Kubernetes " + kind, workload);
      }
    }
  }

  void compose(const YAML::Node& services) {
    const std::map<std::string, std::string> dot_env = read_dot_env(file);
    for (const auto& service : services) {
      if (++containers_seen > kMaxContainers)
        throw InputError(file, fmt::format("more than {} services", kMaxContainers));
      const std::string name = service.first.Scalar();
      const YAML::Node spec = service.second;
      if (!spec.IsMap()) continue;
      const std::string path = "services." + name;
      const std::string workload = "service " + name;
      const std::string where = fmt::format("{} ({})", file, workload);
      std::vector<LaunchWord> words;
      if (child(spec, "entrypoint").IsDefined() && !child(spec, "entrypoint").IsNull()) {
        append_words(child(spec, "entrypoint"), file, path + ".entrypoint", where, words);
      } else if (child(spec, "image").IsScalar()) {
        if (auto entry = image_entry_words(registry, child(spec, "image").Scalar()))
          for (const std::string& word : *entry)
            words.push_back({word,
                             SettingSite{file, line_of(child(spec, "image")), path + ".image"},
                             offset_of(child(spec, "image"))});
      }
      append_words(child(spec, "command"), file, path + ".command", where, words);
      std::map<std::string, std::string> environment;
      std::vector<std::string> unresolved;
      const YAML::Node env = child(spec, "environment");
      if (env.IsMap()) {
        for (const auto& variable : env)
          if (variable.second.IsScalar())
            environment[variable.first.Scalar()] =
                expand_compose(variable.second.Scalar(), dot_env, unresolved);
      } else if (env.IsSequence()) {
        for (const auto& variable : env)
          if (variable.IsScalar()) {
            const std::string assignment = variable.Scalar();
            const size_t eq = assignment.find('=');
            if (eq != std::string::npos)
              environment[assignment.substr(0, eq)] =
                  expand_compose(assignment.substr(eq + 1), dot_env, unresolved);
          }
      }
      // Compose interpolates before it splits a string command; a variable holding several
      // flags ("${EXTRA_ARGS}") splits into them.
      std::vector<LaunchWord> expanded;
      for (const LaunchWord& word : words) {
        const std::string value = expand_compose(word.text, dot_env, unresolved);
        if (value == word.text || word.site.key_path.back() == ']') {
          expanded.push_back({value, word.site, word.offset});
          continue;
        }
        for (std::string& part : split_shell_words(value, where))
          expanded.push_back({std::move(part), word.site, word.offset});
      }
      const size_t before = launches.size();
      add_launch(expanded, environment, "docker-compose file", workload, words);
      if (!unresolved.empty()) {
        std::sort(unresolved.begin(), unresolved.end());
        unresolved.erase(std::unique(unresolved.begin(), unresolved.end()), unresolved.end());
        const std::string note = fmt::format(
            "unset variables ({}) read as empty, as compose does: set them in {} or the "
            "environment kvaudit runs in",
            fmt::join(unresolved, ", "), (fs::path(file).parent_path() / ".env").string());
        if (launches.size() > before)
          launches.back().ignored_arguments.push_back(note);
        else
          seen.back() += "; " + note;
      }
    }
  }

  // The engine's own config file as the launch: the engine started with --config FILE.
  void engine_config(const std::string& engine) {
    const LaunchSpec& launch = registry.engine(engine).launch;
    if (launch.config_file_flags.empty())
      throw InputError(file, fmt::format("{} reads no config file kvaudit knows", engine));
    const std::vector<std::string> entry = split_list(launch.entry_points.front(), ' ');
    std::vector<LaunchWord> words;
    if (entry.front() == "-m") words.push_back({"python3", {}, std::string::npos});
    for (const std::string& word : entry) words.push_back({word, {}, std::string::npos});
    words.push_back({launch.config_file_flags.front(), {}, std::string::npos});
    words.push_back({file, {}, std::string::npos});
    std::map<std::string, FieldOrigin> origins;
    LaunchFlags flags = flags_from_launch_words(registry, words, file, {}, &origins);
    flags.source = file;
    flags.launch_file = file;
    flags.launch_file_kind = fmt::format("{} {} file", engine, launch.config_file_flags.front());
    flags.command_site = SettingSite{file, 1, ""};
    if (launch.config_keys_are_flags)
      flags.kv_dtype_edit = kv_dtype_edit(flags, launch, file, text, {}, origins);
    launches.push_back(std::move(flags));
  }
};

// `helm template` of a large chart renders a few hundred documents; an endless stream of
// "---" lines (4 bytes each, a million in the 4 MiB a file may hold) is not a launch.
constexpr size_t kMostDocuments = 4096;

}  // namespace

std::vector<LaunchFlags> read_launch_file(const Registry& registry, const fs::path& path,
                                          const std::string& engine) {
  const std::string file = path.string();
  FileReader reader{registry, file, read_text_file(path, 4 << 20), engine, {}, {}};
  if (is_unit(reader.text)) return {parse_systemd_unit(registry, path)};
  const bool templated = reader.text.find("{{") != std::string::npos;
  std::vector<YAML::Node> documents;
  try {
    documents = load_yaml_documents(reader.text, file, kMostDocuments);
  } catch (const YAML::Exception& error) {
    throw InputError(file, templated
                               ? fmt::format("a template, not YAML ({}): render it first "
                                             "(helm template ...) and pass the output",
                                             error.what())
                               : fmt::format("neither a systemd unit nor YAML: {}", error.what()));
  }
  std::vector<std::string> shapes;
  for (size_t d = 0; d < documents.size(); ++d) {
    const YAML::Node& document = documents[d];
    if (document.IsNull()) continue;
    if (document.IsMap() && child(document, "kind").IsScalar() &&
        child(document, "apiVersion").IsScalar()) {
      reader.kubernetes(document, static_cast<int>(d + 1));
      shapes.push_back(child(document, "kind").Scalar());
    } else if (document.IsMap() && child(document, "services").IsMap()) {
      reader.compose(child(document, "services"));
      shapes.push_back("compose services");
    } else if (document.IsMap() && !engine.empty() && documents.size() == 1) {
      reader.engine_config(engine);
      shapes.push_back(engine + " config");
    } else {
      shapes.push_back(document.IsMap() ? "a mapping" : "not a mapping");
    }
  }
  if (reader.launches.empty()) {
    std::string found =
        reader.seen.empty()
            ? fmt::format("found {}", shapes.empty() ? std::string("nothing")
                                                     : fmt::format("{}", fmt::join(shapes, ", ")))
            : fmt::format("found {}", fmt::join(reader.seen, "; "));
    throw InputError(
        file,
        fmt::format("no launch of a known engine ({}): not a systemd unit, Kubernetes "
                    "manifest or compose file that runs one{}; {}",
                    fmt::join(registry.names(), ", "),
                    engine.empty() ? " (an engine's --config file needs --engine)" : "", found));
  }
  return reader.launches;
}

}  // namespace kvaudit::engines
