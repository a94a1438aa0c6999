// util/json: bounded JSON file reading and the key-tracking object reader.
#include "util/json.h"

#include <fmt/format.h>

#include <cmath>

#include <algorithm>

#include "util/util.h"

namespace kvaudit {

using nlohmann::json;

json read_json_file(const std::filesystem::path& path, uint64_t max_bytes) {
  std::string text = read_text_file(path, max_bytes);
  try {
    return json::parse(text);
  } catch (const json::exception& error) {  // syntax, or a number out of range
    std::string what = error.what();
    // nlohmann prefixes "[json.exception.parse_error.101] parse error at line 3, ...".
    if (size_t close = what.find("] "); close != std::string::npos) what = what.substr(close + 2);
    throw InputError(path.string(), "invalid JSON: " + what);
  }
}

std::string json_text(const json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_null()) return "";
  return value.dump();
}

namespace {

const char* type_name(const json& value) {
  return value.type_name();
}

}  // namespace

JsonReader::JsonReader(const json& object, std::string where, std::string path)
    : object_(&object), where_(std::move(where)), path_(std::move(path)) {
  if (!object.is_object())
    throw InputError(where_, fmt::format("{}: expected an object, found {}",
                                         path_.empty() ? "top level" : path_, type_name(object)));
}

std::string JsonReader::path_of(std::string_view key) const {
  return path_.empty() ? std::string(key) : fmt::format("{}.{}", path_, key);
}

void JsonReader::fail(std::string_view key, const std::string& problem) const {
  throw InputError(where_, fmt::format("{}: {}", path_of(key), problem));
}

bool JsonReader::has(std::string_view key) const {
  auto it = object_->find(std::string(key));
  return it != object_->end() && !it->is_null();
}

const json* JsonReader::find(std::string_view key) {
  std::string name(key);
  if (std::find(read_.begin(), read_.end(), name) == read_.end()) read_.push_back(name);
  auto it = object_->find(name);
  if (it == object_->end() || it->is_null()) return nullptr;
  return &*it;
}

const json& JsonReader::required(std::string_view key) {
  const json* value = find(key);
  if (!value) fail(key, "missing");
  return *value;
}

std::string JsonReader::string(std::string_view key) {
  const json& value = required(key);
  if (!value.is_string()) fail(key, fmt::format("expected a string, found {}", type_name(value)));
  return value.get<std::string>();
}

std::optional<std::string> JsonReader::optional_string(std::string_view key) {
  if (!find(key)) return std::nullopt;
  return string(key);
}

std::string JsonReader::string_or(std::string_view key, std::string_view fallback) {
  auto value = optional_string(key);
  return value ? *value : std::string(fallback);
}

int64_t JsonReader::integer(std::string_view key) {
  const json& value = required(key);
  if (value.is_number_integer()) return value.get<int64_t>();
  if (value.is_number_float()) {
    // The range first: converting a double outside int64's range is undefined.
    const double number = value.get<double>();
    if (number > -9e18 && number < 9e18 && number == std::trunc(number))
      return static_cast<int64_t>(number);
  }
  fail(key, fmt::format("expected an integer, found {}", value.dump()));
}

std::optional<int64_t> JsonReader::optional_integer(std::string_view key) {
  if (!find(key)) return std::nullopt;
  return integer(key);
}

int64_t JsonReader::integer_or(std::string_view key, int64_t fallback) {
  return optional_integer(key).value_or(fallback);
}

double JsonReader::number(std::string_view key) {
  const json& value = required(key);
  if (!value.is_number()) fail(key, fmt::format("expected a number, found {}", type_name(value)));
  return value.get<double>();
}

std::optional<double> JsonReader::optional_number(std::string_view key) {
  if (!find(key)) return std::nullopt;
  return number(key);
}

double JsonReader::number_or(std::string_view key, double fallback) {
  return optional_number(key).value_or(fallback);
}

bool JsonReader::boolean_or(std::string_view key, bool fallback) {
  const json* value = find(key);
  if (!value) return fallback;
  if (!value->is_boolean())
    fail(key, fmt::format("expected true or false, found {}", type_name(*value)));
  return value->get<bool>();
}

std::vector<std::string> JsonReader::strings(std::string_view key) {
  const json& value = required(key);
  if (!value.is_array())
    fail(key, fmt::format("expected an array of strings, found {}", type_name(value)));
  std::vector<std::string> out;
  for (size_t i = 0; i < value.size(); ++i) {
    if (!value[i].is_string())
      fail(key, fmt::format("[{}]: expected a string, found {}", i, type_name(value[i])));
    out.push_back(value[i].get<std::string>());
  }
  return out;
}

std::vector<std::string> JsonReader::strings_or_empty(std::string_view key) {
  if (!find(key)) return {};
  return strings(key);
}

JsonReader JsonReader::object(std::string_view key) {
  const json& value = required(key);
  if (!value.is_object()) fail(key, fmt::format("expected an object, found {}", type_name(value)));
  return JsonReader(value, where_, path_of(key));
}

std::optional<JsonReader> JsonReader::optional_object(std::string_view key) {
  if (!find(key)) return std::nullopt;
  return object(key);
}

std::vector<JsonReader> JsonReader::objects(std::string_view key) {
  const json& value = required(key);
  if (!value.is_array())
    fail(key, fmt::format("expected an array of objects, found {}", type_name(value)));
  std::vector<JsonReader> out;
  for (size_t i = 0; i < value.size(); ++i) {
    if (!value[i].is_object())
      fail(key, fmt::format("[{}]: expected an object, found {}", i, type_name(value[i])));
    out.emplace_back(value[i], where_, fmt::format("{}[{}]", path_of(key), i));
  }
  return out;
}

std::vector<JsonReader> JsonReader::objects_or_empty(std::string_view key) {
  if (!find(key)) return {};
  return objects(key);
}

const json& JsonReader::raw(std::string_view key) {
  static const json null_value;
  const json* value = find(key);
  return value ? *value : null_value;
}

std::vector<std::string> JsonReader::keys() const {
  std::vector<std::string> out;
  for (const auto& [key, value] : object_->items()) out.push_back(key);
  return out;
}

void JsonReader::allow_descriptive(std::initializer_list<std::string_view> keys) {
  for (std::string_view key : keys)
    if (std::find(read_.begin(), read_.end(), key) == read_.end()) read_.emplace_back(key);
}

void JsonReader::finish() const {
  for (const auto& [key, value] : object_->items())
    if (std::find(read_.begin(), read_.end(), key) == read_.end())
      fail(key, "unknown key (misspelt, or a rule no code reads)");
}

}  // namespace kvaudit
