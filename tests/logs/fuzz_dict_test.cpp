// The fuzzers' dictionaries (fuzz/<target>.dict, libFuzzer's -dict) hold what the readers
// look for: a dictionary that lost a pattern the engine data added leaves that template to
// luck. Checked against the shipped engine data, not a copy of it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <string>

#include "common/registry.h"
#include "engines/engines.h"
#include "logs/logs.h"
#include "util/util.h"

namespace {

namespace fs = std::filesystem;

const fs::path kFuzzDir = fs::path(KVAUDIT_TEST_DIR).parent_path() / "fuzz";

// Entries of a libFuzzer dictionary: `name="value"` or `"value"` lines, with \\, \" and \xNN
// escapes; '#' starts a comment line. A malformed line fails the test.
std::set<std::string> read_dictionary(const fs::path& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in) << path;
  std::set<std::string> entries;
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.empty() || line[0] == '#') continue;
    const size_t open = line.find('"');
    if (open == std::string::npos || line.back() != '"' || open + 1 >= line.size()) {
      ADD_FAILURE() << path << ":" << number << ": not a dictionary entry: " << line;
      continue;
    }
    std::string value;
    for (size_t i = open + 1; i + 1 < line.size(); ++i) {
      if (line[i] != '\\') {
        value += line[i];
        continue;
      }
      if (i + 2 < line.size() && (line[i + 1] == '\\' || line[i + 1] == '"')) {
        value += line[++i];
      } else if (i + 4 < line.size() && line[i + 1] == 'x') {
        value += static_cast<char>(std::stoi(line.substr(i + 2, 2), nullptr, 16));
        i += 3;
      } else {
        ADD_FAILURE() << path << ":" << number << ": bad escape: " << line;
      }
    }
    entries.insert(value);
  }
  return entries;
}

// libFuzzer drops dictionary entries over 64 bytes (FuzzerDictionary.h: Word is FixedWord<64>);
// a longer pattern is kept as its first 64.
constexpr size_t kMostEntryBytes = 64;

TEST(FuzzDictionaries, LogsHoldEveryScanPattern) {
  const auto& registry = kvaudit::testing::registry();
  for (const char* target : {"logs.dict", "log_stream.dict"}) {
    const std::set<std::string> entries = read_dictionary(kFuzzDir / target);
    for (const std::string& pattern : kvaudit::logs::scan_patterns(registry))
      EXPECT_TRUE(entries.count(pattern.substr(0, kMostEntryBytes)))
          << target << " lacks the scan pattern \"" << pattern << "\"";
  }
}

TEST(FuzzDictionaries, LaunchHoldsEveryFlagAndEntryPoint) {
  const auto& registry = kvaudit::testing::registry();
  const std::set<std::string> entries = read_dictionary(kFuzzDir / "launch.dict");
  for (const std::string& engine : registry.names()) {
    const kvaudit::engines::LaunchSpec& launch = registry.engine(engine).launch;
    for (const std::string& entry : launch.entry_points)
      for (const std::string& word : kvaudit::split_list(entry, ' '))
        EXPECT_TRUE(entries.count(word))
            << "launch.dict lacks " << engine << "'s \"" << word << "\"";
    for (const auto& [field, spellings] : launch.flags)
      for (const std::string& flag : spellings)
        EXPECT_TRUE(entries.count(flag))
            << "launch.dict lacks " << engine << "'s " << field << " flag \"" << flag << "\"";
  }
}

// libFuzzer stops at a malformed line ("ParseDictionaryFile: error in line N") and the
// target does not run at all: every dictionary must parse, and hold something.
TEST(FuzzDictionaries, EveryDictionaryParses) {
  int dictionaries = 0;
  for (const auto& entry : fs::directory_iterator(kFuzzDir)) {
    if (entry.path().extension() != ".dict") continue;
    ++dictionaries;
    SCOPED_TRACE(entry.path().string());
    EXPECT_FALSE(read_dictionary(entry.path()).empty());
    EXPECT_TRUE(fs::exists(kFuzzDir / ("fuzz_" + entry.path().stem().string() + ".cpp")))
        << "a dictionary for no fuzz target";
  }
  EXPECT_GE(dictionaries, 10);
}

// The committed log corpus, replayed as fuzz_logs feeds it, in the test suites (the sanitizer
// build runs this file too): the regression inputs the campaigns found (an uncaught
// nlohmann type_error in a repr, a signed overflow sizing the pool) stay fixed even when
// make test's few seconds of fuzzing never reach them.
TEST(FuzzCorpus, LogInputsReadWithoutAnythingButInputErrors) {
  const auto& registry = kvaudit::testing::registry();
  int inputs = 0;
  for (const auto& entry : fs::directory_iterator(kFuzzDir / "corpus" / "logs")) {
    std::ifstream in(entry.path(), std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (bytes.empty()) continue;
    ++inputs;
    SCOPED_TRACE(entry.path().filename().string());
    const std::string_view text = std::string_view(bytes).substr(1);
    if (bytes[0] & 1) {
      EXPECT_NO_THROW((void)kvaudit::logs::parse_python_repr(text));
      continue;
    }
    try {
      (void)kvaudit::logs::scan_log_text(registry, text, "corpus");
    } catch (const kvaudit::InputError&) {
    }
  }
  EXPECT_GE(inputs, 100);
}

}  // namespace
