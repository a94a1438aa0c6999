// A --results file is outside input: a record whose counts are not integers a record can hold
// (the fuzzer's top_k of 2.1e50, a fractional token count) is refused with the file named,
// never converted (a float outside int's range is undefined behaviour).
#include <gtest/gtest.h>

#include <string>

#include "probe/probe.h"
#include "util/util.h"

namespace kvaudit::probe {
namespace {

nlohmann::json record_with(const std::string& key, const nlohmann::json& value) {
  nlohmann::json doc = {{"server", "http://127.0.0.1:1"},
                        {"id", "mrcr/ctx=4096/case=0"},
                        {"kind", "mrcr"},
                        {"expected", "a, b)"},
                        {"output", "a, b)"},
                        {"passed", true}};
  doc[key] = value;
  return doc;
}

TEST(ProbeRecords, CountsThatAreNotIntegersAreRefusedNamingTheFile) {
  for (const auto& [key, value] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"top_k", 2.1e50}, {"top_k", -1}, {"ctx_tokens", 1e300}, {"rounds", 2.5}}) {
    try {
      (void)record_from_json(record_with(key, value), "results.jsonl");
      FAIL() << key << " = " << value.dump() << " was accepted";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("results.jsonl"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  }
}

TEST(ProbeRecords, IntegerCountsWrittenAsWholeFloatsAreRead) {
  const ProbeRecord record = record_from_json(record_with("ctx_tokens", 4096.0), "r.jsonl");
  EXPECT_EQ(record.ctx_tokens, 4096);
  EXPECT_EQ(record_from_json(record_with("top_k", 20), "r.jsonl").top_k, 20);
}

}  // namespace
}  // namespace kvaudit::probe
