// util/json: reading JSON files we did not write without crashing on them. One bounded
// read-and-parse, and a reader over one object that gives typed fields and turns a
// missing key, a wrong type or (when asked) a key nobody reads into the one-line
// InputError "FILE: KEY.PATH: problem". Not a schema language: callers say what they read.
#pragma once

#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace kvaudit {

// A value as text: a string as it is, null as "", anything else as its JSON ("4", "true",
// "[1,2]"), for fields that hold free-form values (a quantization block's algorithm names, a
// server's answers).
std::string json_text(const nlohmann::json& value);

// Reads and parses a JSON file (InputError naming the file on any problem: missing,
// larger than max_bytes, invalid JSON, a number out of range).
nlohmann::json read_json_file(const std::filesystem::path& path, uint64_t max_bytes = 16u << 20);

// Typed access to the keys of one JSON object. `where` names the file, `path` the
// object inside it ("auto_resolution[2]"). Every accessor marks its key as read;
// finish() refuses keys that were neither read nor allowed as descriptive, so a
// misspelt key in a data file is an error instead of a silently ignored rule.
class JsonReader {
 public:
  JsonReader(const nlohmann::json& object, std::string where, std::string path = "");

  bool has(std::string_view key) const;
  std::string string(std::string_view key);  // required
  std::string string_or(std::string_view key, std::string_view fallback);
  std::optional<std::string> optional_string(std::string_view key);
  int64_t integer(std::string_view key);
  int64_t integer_or(std::string_view key, int64_t fallback);
  std::optional<int64_t> optional_integer(std::string_view key);
  double number(std::string_view key);
  double number_or(std::string_view key, double fallback);
  std::optional<double> optional_number(std::string_view key);
  bool boolean_or(std::string_view key, bool fallback);
  std::vector<std::string> strings(std::string_view key);  // required array of strings
  std::vector<std::string> strings_or_empty(std::string_view key);
  // A nested object, or each object of an array, as readers of their own.
  JsonReader object(std::string_view key);
  std::optional<JsonReader> optional_object(std::string_view key);
  std::vector<JsonReader> objects(std::string_view key);  // required array of objects
  std::vector<JsonReader> objects_or_empty(std::string_view key);
  // The raw value (marked read), for callers with their own structure; null when absent.
  const nlohmann::json& raw(std::string_view key);
  // Keys of this object, in order (nothing is marked read).
  std::vector<std::string> keys() const;

  // Keys that describe a rule for people (reference, notes...) and steer nothing.
  void allow_descriptive(std::initializer_list<std::string_view> keys);
  // Throws for the first key that was neither read nor allowed.
  void finish() const;

  [[noreturn]] void fail(std::string_view key, const std::string& problem) const;
  const std::string& where() const { return where_; }
  std::string path_of(std::string_view key) const;

 private:
  const nlohmann::json& required(std::string_view key);
  const nlohmann::json* find(std::string_view key);
  const nlohmann::json* object_;
  std::string where_;
  std::string path_;
  std::vector<std::string> read_;
};

}  // namespace kvaudit
