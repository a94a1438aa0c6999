// engines internals shared by the module's files. Private to src/engines/.
#pragma once

#include <fmt/format.h>

#include <initializer_list>
#include <map>
#include <optional>
#include <string_view>
#include <utility>

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

// ---- Reading an engine file (load.cpp and the load_*.cpp beside it)

// The fields every rule carries (load_fields.cpp). Each fails through the reader, which names
// the file and key: a version range with full x.y.z bounds, the provenance with its audit
// record, the model facts a rule matches, and a canonical dtype (or "auto" when allowed).
VersionRange read_range(JsonReader& r, std::string_view key);
Provenance read_provenance(JsonReader& r);
QuantMatch read_match(JsonReader& parent, std::string_view key);
void check_dtype(const EngineModel& model, JsonReader& r, std::string_view key,
                 const std::string& dtype, bool allow_auto);
// An enum field: one of `names`, or `fallback` when the key is absent and there is one.
template <typename Enum>
Enum read_enum(JsonReader& r, std::string_view key,
               std::initializer_list<std::pair<const char*, Enum>> names,
               std::optional<Enum> fallback = std::nullopt) {
  if (!r.has(key) && fallback) {
    r.raw(key);
    return *fallback;
  }
  std::string text = r.string(key);
  std::string known;
  for (const auto& [name, value] : names) {
    if (text == name) return value;
    known += (known.empty() ? "" : ", ") + std::string(name);
  }
  r.fail(key, fmt::format("'{}' is not one of {}", text, known));
}
// The launch section (load_serving.cpp).
void read_launch(JsonReader& top, EngineModel& model);
// Every rule section, in file order (load_rules.cpp); the sections about the running server
// come last (read_serving_rules, load_serving.cpp).
void read_rules(JsonReader& top, EngineModel& model);
void read_serving_rules(JsonReader& top, EngineModel& model);
// kv_tier_flags and tier_hazards (tiers.cpp); after the launch section and the dtypes.
void read_tier_data(JsonReader& top, EngineModel& model);
// Cross-rule checks: what no single object can see (load_lint.cpp).
void lint_model(EngineModel& model);

// ---- Resolving a launch (resolve.cpp, resolve_scales.cpp)

// Whether `value` matches one of the globs (any value, when there are none).
bool any_glob(const std::vector<std::string>& patterns, const std::string& value);
// Which checkpoint scales reach the attention layers, where the scales in effect come from,
// and what the engine does with the loaded values (resolve_scales.cpp).
void resolve_scales(const EngineModel& engine, const Version& version,
                    const checkpoint::ModelFacts& model, const LaunchFlags& flags,
                    ResolvedKv& resolved);

// ---- Reading a launch (launch.cpp, launch_config.cpp, launch_edit.cpp)

// Sets one launch field from its text, as a flag (`word`) or a config key gave it.
void set_launch_field(LaunchFlags& flags, const std::string& field, const std::string& value,
                      const std::string& word, bool on, const std::string& label);
// The text of the config file the launch names (flags.config_file); InputError(where), saying
// why kvaudit needs it, when it cannot be read.
std::string read_config_text(const LaunchFlags& flags, const std::string& where);
// Sets the launch fields and tier settings the YAML file a launch names (TensorRT-LLM
// --config) holds, under the keys the engine data lists (launch_config.cpp).
void apply_config_file(const EngineModel& engine, LaunchFlags& flags, const std::string& label);
// Where a launch file takes its KV dtype: the present value's bytes, or where a new flag
// goes (launch_edit.cpp).
std::optional<TextEdit> kv_dtype_edit(const LaunchFlags& flags, const LaunchSpec& launch,
                                      const std::string& file, std::string_view text,
                                      const std::vector<LaunchWord>& words,
                                      const std::map<std::string, FieldOrigin>& origins);

}  // namespace kvaudit::engines
