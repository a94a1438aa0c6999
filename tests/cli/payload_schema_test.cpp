// The documented payload objects of docs/json-schema.md ("## Payload object: NAME") against
// real `check` payloads, in both directions: every documented key present with its type,
// no undocumented key. The scenarios are chosen so every documented object appears at least
// once with content (a block-scaled dtype, dropped scales, a start-up failure, an
// unverified bound), so an object the code stopped emitting fails the test too.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <set>

#include "audit/audit.h"
#include "common/fixtures.h"
#include "common/registry.h"
#include "common/schema_doc.h"
#include "decide/decide.h"
#include "engines/engines.h"

namespace kvaudit {
namespace {

using nlohmann::json;
using PayloadSchema = testing::SchemaTables;
using testing::SchemaValidator;

PayloadSchema load_payload_schema() {
  return testing::load_schema_tables("## Payload object: ");
}

json check_payload(const std::string& fixture, const std::string& engine, const std::string& kv,
                   const std::string& version, engines::LaunchFlags flags = {}) {
  audit::CheckInput input;
  input.model = checkpoint::read_checkpoint(testing::fixture_checkpoint(fixture));
  flags.engine = engine;
  flags.kv_cache_dtype = kv;
  flags.kv_cache_dtype_flag = kv == "auto" ? "" : "--kv-cache-dtype";
  flags.engine_version = version;
  input.flags = flags;
  input.engine = &kvaudit::testing::engine(engine);
  input.version_given = !version.empty();
  audit::CheckResult result = audit::run_check(input);
  report::Report report = audit::to_report(input, result);
  decide::DecisionOptions options;
  options.memory.gpu_memory_bytes = int64_t{80} << 30;  // sized: token ranges and concurrency
  options.memory.gpu_name = "80 GiB";
  const decide::Decision decision =
      decide::decide(kvaudit::testing::registry(), input, result, options);
  decide::add_to_report(decision, {"- old", "+ new"}, {"kvaudit probe URL --smoke"}, report);
  return report.payload;
}

TEST(PayloadSchema, CheckPayloadMatchesTheDocumentBothWays) {
  const PayloadSchema schema = load_payload_schema();
  ASSERT_TRUE(schema.count("check.resolved_kv")) << "docs/json-schema.md lost its payload tables";
  SchemaValidator validator(schema);
  engines::LaunchFlags removed_flag;
  removed_flag.calculate_kv_scales = true;
  const std::vector<json> payloads = {
      check_payload("llama-modelopt-unit-scales", "sglang", "fp8_e4m3", "0.5.9"),
      check_payload("qwen35-modelopt-nvfp4-kv", "sglang", "auto", "0.5.23"),
      check_payload("llama-ct-fused-qkv-scales", "sglang", "fp8_e4m3", "0.5.23"),
      check_payload("llama-bf16-plain", "sglang", "fp4_e2m1", "0.5.23"),
      check_payload("llama-bf16-plain", "vllm", "fp8", "0.33.0", removed_flag),
      check_payload("llama-bf16-plain", "vllm", "auto", "")};
  for (size_t i = 0; i < payloads.size(); ++i)
    for (const char* key : {"engine", "model", "resolved_kv", "decision"}) {
      ASSERT_TRUE(payloads[i].contains(key)) << "scenario " << i << " has no " << key;
      validator.validate(payloads[i][key], std::string("check.") + key,
                         "scenario " + std::to_string(i) + " $." + key);
    }
  EXPECT_TRUE(validator.problems.empty()) << fmt::format("{}", fmt::join(validator.problems, "\n"));
  for (const auto& [object, keys] : schema) {
    if (!object.starts_with("check.")) continue;
    EXPECT_TRUE(validator.seen.count(object)) << object << " never appeared with content";
  }
}

}  // namespace
}  // namespace kvaudit
