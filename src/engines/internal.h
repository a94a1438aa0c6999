// engines internals shared by the module's files. Private to src/engines/.
#pragma once

#include "engines/engines.h"
#include "util/json.h"

namespace YAML {
class Node;
}

namespace kvaudit::engines {

// Compiles log.text into log.compiled and sets log.anchor; throws std::invalid_argument
// naming what is wrong with the template.
void compile_log_template(LogTemplate& log);

// One word of a launch, and where it is written: a YAML scalar, a unit line, or nowhere
// (a command line given as text). `offset` is the byte offset in site.file where the scalar
// or line holding the word starts (npos: unknown); a word split out of a longer string
// shares its string's site and offset.
struct LaunchWord {
  std::string text;
  SettingSite site;
  size_t offset = std::string::npos;
};
// Which words set a launch field: the flag and its value (the same word for "--flag=value"
// and for a boolean flag).
struct FieldOrigin {
  LaunchWord flag, value;
  bool inline_value = false;
};
// The launch the words start (the engine's entry point among them), with the fields each
// word set. `environment` holds variables set where the command is written.
LaunchFlags flags_from_launch_words(const Registry& registry, const std::vector<LaunchWord>& words,
                                    const std::string& label,
                                    std::map<std::string, std::string> environment,
                                    std::map<std::string, FieldOrigin>* origins = nullptr);
// Words with no site, for a command line given as text.
std::vector<LaunchWord> unsited_words(const std::vector<std::string>& words);
// The engine's --config YAML (vLLM, SGLang) as the words the engine splices in: each
// top-level key as its flag, each word sited at its key's line in `path`.
std::vector<LaunchWord> config_file_words(const std::string& path, const std::string& text,
                                          const std::string& where);
// The engine whose entry point the words start (inside `bash -c '...'` too), if any.
std::optional<std::string> engine_started_by(const Registry& registry,
                                             const std::vector<std::string>& words,
                                             const std::string& label);
// The 1-based line of `offset` in `text`.
int64_t line_at(std::string_view text, size_t offset);
// Sets the line of each field that `origins` sited in `file`: where its flag's spelling is
// written at or after the offset of the scalar or line that holds it.
void site_lines_from_text(const std::string& file, std::string_view text, LaunchFlags& flags,
                          const std::map<std::string, FieldOrigin>& origins);
// yaml-cpp recurses per nesting level: throws InputError(where) for text nested deeper
// than 64 levels, before it is parsed.
void refuse_deep_nesting(std::string_view text, const std::string& where);
// The documents of a YAML stream (refuse_deep_nesting first): throws InputError(where) for
// a stream of more than `most_documents` documents or one yaml-cpp would read forever, and
// YAML::Exception for text that is not YAML.
std::vector<YAML::Node> load_yaml_documents(const std::string& text, const std::string& where,
                                            size_t most_documents);

}  // namespace kvaudit::engines
