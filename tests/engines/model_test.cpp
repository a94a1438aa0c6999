// The engine model's loader and lint: the shipped data loads clean; a data file broken
// in each way the lint knows is refused with one line naming the file and the key.
#include <gtest/gtest.h>

#include <fstream>

#include "common/registry.h"
#include "engines/engines.h"
#include "util/json.h"
#include "util/util.h"

namespace kvaudit::engines {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

fs::path data_file(const std::string& name) {
  return fs::path(KVAUDIT_TEST_DIR) / ".." / "data" / "engines" / name;
}

// Writes `document` as <engine>.json in a fresh folder and loads it with the shipped
// capacity file; returns the InputError's text ("" when it loads).
std::string load_error(const std::string& engine, const json& document) {
  const fs::path dir =
      fs::temp_directory_path() / ("kvaudit-lint-" + std::to_string(::getpid()) + "-" + engine);
  fs::create_directories(dir);
  const fs::path file = dir / (engine + ".json");
  std::ofstream(file) << document.dump(1);
  try {
    load_engine_model(file, data_file("capacity/" + engine + ".json"),
                      kvaudit::testing::registry().dtypes());
  } catch (const InputError& error) {
    fs::remove_all(dir);
    return error.what();
  }
  fs::remove_all(dir);
  return "";
}

json shipped(const std::string& engine) {
  return read_json_file(data_file(engine + ".json"));
}

json& rule(json& doc, const std::string& list, const std::string& id) {
  for (auto& entry : doc[list])
    if (entry.value("id", "") == id) return entry;
  throw std::runtime_error("no rule " + id);
}

// The engines known are the files present: a data folder with a third engine file knows
// three engines, one whose file names another engine or lacks its capacity file is refused,
// and an unknown engine's error lists the known ones.
TEST(Registry, TheFilesPresentAreTheEnginesKnown) {
  const fs::path dir =
      fs::temp_directory_path() / ("kvaudit-registry-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "engines" / "capacity");
  fs::copy_file(data_file("dtypes.json"), dir / "engines" / "dtypes.json");
  for (const char* e : {"sglang", "vllm"}) {
    fs::copy_file(data_file(std::string(e) + ".json"),
                  dir / "engines" / (std::string(e) + ".json"));
    fs::copy_file(data_file("capacity/" + std::string(e) + ".json"),
                  dir / "engines" / "capacity" / (std::string(e) + ".json"));
  }
  EXPECT_EQ(Registry::load(dir).names(), (std::vector<std::string>{"sglang", "vllm"}));
  // A copy of vLLM's data under another name is another engine once it says so.
  json other = shipped("vllm");
  other["engine"] = "other";
  std::ofstream(dir / "engines" / "other.json") << other.dump();
  fs::copy_file(data_file("capacity/vllm.json"), dir / "engines" / "capacity" / "other.json");
  json capacity = read_json_file(dir / "engines" / "capacity" / "other.json");
  capacity["engine"] = "other";
  std::ofstream(dir / "engines" / "capacity" / "other.json") << capacity.dump();
  const Registry three = Registry::load(dir);
  EXPECT_EQ(three.names(), (std::vector<std::string>{"other", "sglang", "vllm"}));
  EXPECT_EQ(three.engine("other").engine, "other");
  EXPECT_EQ(three.engine("other").dtypes, &three.dtypes());
  try {
    three.engine("tgi");
    ADD_FAILURE() << "an unknown engine loads";
  } catch (const InputError& error) {
    EXPECT_NE(std::string(error.what()).find("known: other, sglang, vllm"), std::string::npos)
        << error.what();
  }
  // The file's name and the engine it declares must agree.
  other["engine"] = "vllm";
  std::ofstream(dir / "engines" / "other.json") << other.dump();
  try {
    Registry::load(dir);
    ADD_FAILURE() << "other.json that says vllm loads";
  } catch (const InputError& error) {
    EXPECT_NE(std::string(error.what()).find("other.json"), std::string::npos) << error.what();
  }
  // An engine without its capacity file is refused, naming the missing file.
  fs::remove(dir / "engines" / "other.json");
  std::ofstream(dir / "engines" / "lonely.json") << shipped("sglang").dump();
  try {
    Registry::load(dir);
    ADD_FAILURE() << "an engine without capacity data loads";
  } catch (const InputError& error) {
    EXPECT_NE(std::string(error.what()).find("lonely.json"), std::string::npos) << error.what();
  }
  // No engine file at all is an error, not an empty registry.
  fs::remove_all(dir / "engines" / "capacity");
  for (const char* e : {"sglang", "vllm", "lonely"})
    fs::remove(dir / "engines" / (std::string(e) + ".json"));
  EXPECT_THROW(Registry::load(dir), InputError);
  fs::remove_all(dir);
}

TEST(EngineModelLint, ShippedDataLoadsClean) {
  for (const auto& engine : kvaudit::testing::registry().names()) {
    EXPECT_EQ(load_error(engine, shipped(engine)), "") << engine;
    const EngineModel& model = kvaudit::testing::engine(engine);
    EXPECT_FALSE(model.log_templates.empty()) << engine;
    EXPECT_FALSE(model.auto_rules.empty()) << engine;
  }
  EXPECT_EQ(kvaudit::testing::engine("sglang").latest_known_version, "0.5.23");
  EXPECT_EQ(kvaudit::testing::engine("vllm").latest_known_version, "0.33.0");
}

TEST(EngineModelLint, UnknownKeyIsRefusedWithItsPath) {
  json doc = shipped("vllm");
  rule(doc, "auto_resolution", "vllm-auto-modelopt-fp8")["resolve_to"] = "fp8_e4m3";  // typo
  std::string error = load_error("vllm", doc);
  EXPECT_NE(error.find("vllm.json"), std::string::npos) << error;
  EXPECT_NE(error.find("auto_resolution[2].resolve_to: unknown key"), std::string::npos) << error;
  EXPECT_EQ(error.find('\n'), std::string::npos) << "one line";
}

TEST(EngineModelLint, UnparsableVersionRangeIsRefused) {
  for (const char* bad : {">=0.5", "=> 0.5.10", ">=0.5.10 <", "0.5.x", "*  <0.5.1", ""}) {
    json doc = shipped("sglang");
    rule(doc, "scale_drops", "sglang-31220-qwen3.5")["versions"] = bad;
    std::string error = load_error("sglang", doc);
    EXPECT_NE(error.find("cannot read version range"), std::string::npos) << bad << ": " << error;
    EXPECT_NE(error.find("scale_drops["), std::string::npos) << error;
  }
}

TEST(EngineModelLint, ResolvesToADtypeTheVersionDoesNotHave) {
  json doc = shipped("vllm");
  // nvfp4 is a vLLM choice from 0.20.0 only: an auto rule from 0.14.0 cannot produce it.
  rule(doc, "auto_resolution", "vllm-auto-modelopt-nvfp4")["versions"] = ">=0.14.0";
  std::string error = load_error("vllm", doc);
  EXPECT_NE(error.find("auto_resolution.vllm-auto-modelopt-nvfp4: resolves to nvfp4, which vllm"),
            std::string::npos)
      << error;
  json unknown = shipped("sglang");
  rule(unknown, "auto_resolution", "sglang-auto-modelopt-fp8")["resolves_to"] = "fp8";
  EXPECT_NE(load_error("sglang", unknown).find("'fp8' is not a canonical dtype"),
            std::string::npos);
}

TEST(EngineModelLint, UnknownScaleConventionIsRefused) {
  json doc = shipped("sglang");
  rule(doc, "scale_names", "sglang-39943-fused-qkv")["conventions"] = {"fused_qkvv"};
  std::string error = load_error("sglang", doc);
  EXPECT_NE(error.find("'fused_qkvv' is not a scale-name convention the checkpoint reader knows"),
            std::string::npos)
      << error;
}

TEST(EngineModelLint, LogTemplateThatDoesNotCompileIsRefused) {
  json doc = shipped("sglang");
  for (auto& log : doc["log_messages"])
    if (log["id"] == "sglang_kv_pool") log["text"] = "KV Cache is allocated. dtype: {, #tokens: {}";
  std::string error = load_error("sglang", doc);
  EXPECT_NE(error.find("log template does not compile"), std::string::npos) << error;
  // A placeholder count that does not match the field names.
  json fields = shipped("vllm");
  for (auto& log : fields["log_messages"])
    if (log["id"] == "vllm_max_concurrency") log["fields"] = {"concurrency_context"};
  EXPECT_NE(load_error("vllm", fields).find("2 placeholder(s) but 1 field name(s)"),
            std::string::npos);
  // A field the log reader does not know.
  json unknown = shipped("vllm");
  for (auto& log : unknown["log_messages"])
    if (log["id"] == "vllm_kv_cache_size") log["fields"] = {"kv_tokens"};
  EXPECT_NE(load_error("vllm", unknown).find("'kv_tokens' is not a field the log reader knows"),
            std::string::npos);
}

TEST(EngineModelLint, GapsDuplicatesAndDanglingIdsAreRefused) {
  json gap = shipped("vllm");
  gap["kv_cache_dtype_choices"].erase(gap["kv_cache_dtype_choices"].begin() + 3);
  EXPECT_NE(load_error("vllm", gap).find("kv_cache_dtype_choices: 0 entries cover"),
            std::string::npos);
  json overlap = shipped("sglang");
  overlap["defaults"][0]["versions"] = "<0.5.5";
  EXPECT_NE(load_error("sglang", overlap).find("defaults: 2 entries cover"), std::string::npos);
  json dup = shipped("sglang");
  dup["scale_drops"][1]["id"] = dup["scale_drops"][0]["id"];
  EXPECT_NE(load_error("sglang", dup).find("is used twice"), std::string::npos);
  json dangling = shipped("vllm");
  dangling["fallback"][0]["both_missing"]["log_message"] = "vllm_unit_scale_v2";
  EXPECT_NE(load_error("vllm", dangling).find("'vllm_unit_scale_v2' is not a log_messages id"),
            std::string::npos);
  json uncovered = shipped("sglang");
  rule(uncovered, "scale_names", "sglang-unmapped")["conventions"] = {"ammo"};
  EXPECT_NE(load_error("sglang", uncovered).find("loads 'other' scale names"), std::string::npos);
  json no_catch_all = shipped("vllm");
  rule(no_catch_all, "auto_resolution", "vllm-auto-model-dtype")["versions"] = "<0.30.0";
  EXPECT_NE(load_error("vllm", no_catch_all).find("no rule with an empty \"when\""),
            std::string::npos);
}

TEST(EngineModelLint, ProvenanceIsRequiredAndUnverifiedBoundsSayHow) {
  json no_reference = shipped("sglang");
  rule(no_reference, "scale_drops", "sglang-39942-qwen-mixtral").erase("reference");
  EXPECT_NE(load_error("sglang", no_reference).find("reference: missing"), std::string::npos);
  json no_bound = shipped("sglang");
  rule(no_bound, "scale_drops", "sglang-31220-qwen3.5").erase("bound");
  EXPECT_NE(load_error("sglang", no_bound).find("must say how its version bound was inferred"),
            std::string::npos);
  json bad_status = shipped("vllm");
  rule(bad_status, "scale_drops", "vllm-54623-qwen3.5")["status"] = "pending";
  EXPECT_NE(load_error("vllm", bad_status).find("'pending' is not one of"), std::string::npos);
}

// Every rule carries the audit that re-read it at its source; an open PR is a lead, never
// the source of a behaviour; a corrected rule says what changed.
TEST(EngineModelLint, EveryRuleCarriesItsAudit) {
  json no_audit = shipped("sglang");
  rule(no_audit, "scale_drops", "sglang-31220-qwen3.5").erase("audit");
  EXPECT_NE(load_error("sglang", no_audit).find("every rule needs an audit record"),
            std::string::npos);
  json open_pr = shipped("vllm");
  rule(open_pr, "dtype_hazards", "vllm-54338-float16-on-bf16")["audit"]["source"] = "open_pr";
  EXPECT_NE(load_error("vllm", open_pr).find("an open PR is a lead"), std::string::npos);
  json silent = shipped("vllm");
  rule(silent, "scale_drops", "vllm-32199-qwen3-next")["audit"].erase("note");
  EXPECT_NE(load_error("vllm", silent).find("must say what the audit changed"), std::string::npos);
  json undated = shipped("sglang");
  rule(undated, "auto_resolution", "sglang-auto-ct-fp8")["audit"]["checked"] = "Dec 2026";
  EXPECT_NE(load_error("sglang", undated).find("not a YYYY-MM-DD date"), std::string::npos);
  json log_without = shipped("vllm");
  for (auto& log : log_without["log_messages"]) log.erase("audit");
  EXPECT_NE(load_error("vllm", log_without).find("log_messages[0].audit"), std::string::npos);
  // Every rule of the shipped data was re-read on or after the audit of 2026-12-01.
  for (const auto& engine : kvaudit::testing::registry().names()) {
    const EngineModel& model = kvaudit::testing::engine(engine);
    auto checked = [&](const Provenance& p, const std::string& what) {
      EXPECT_GE(p.audit.checked, "2026-12-01") << engine << " " << what;
    };
    for (const auto& r : model.auto_rules) checked(r.provenance, r.id);
    for (const auto& r : model.scale_name_rules) checked(r.provenance, r.id);
    for (const auto& r : model.scale_drop_rules) checked(r.provenance, r.id);
    for (const auto& r : model.fallback_rules) checked(r.provenance, "fallback");
    for (const auto& r : model.known_bad) checked(r.provenance, r.id);
    for (const auto& r : model.log_templates) checked(r.provenance, r.id);
  }
}

TEST(DtypeVocabulary, LintAndQueries) {
  const fs::path dir = fs::temp_directory_path() / ("kvaudit-dtypes-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto error_of = [&](const json& doc) {
    std::ofstream(dir / "dtypes.json") << doc.dump();
    try {
      load_kv_dtypes(dir / "dtypes.json");
    } catch (const InputError& error) {
      return std::string(error.what());
    }
    return std::string();
  };
  json doc = read_json_file(data_file("dtypes.json"));
  EXPECT_EQ(error_of(doc), "");
  json dup = doc;
  dup["dtypes"][1]["spellings"].push_back("fp8");
  EXPECT_NE(error_of(dup).find("spelling 'fp8' names both"), std::string::npos);
  json narrow = doc;
  narrow["dtypes"][3]["quantized"] = false;  // fp8_e4m3
  EXPECT_NE(error_of(narrow).find("quantized must be true"), std::string::npos);
  json element = doc;
  element["dtypes"][3]["element"] = "fp6_e3m2";
  EXPECT_NE(error_of(element).find("unknown element type 'fp6_e3m2'"), std::string::npos);
  fs::remove_all(dir);

  EXPECT_EQ(kvaudit::testing::registry().dtypes().normalise("torch.float8_e4m3fn"), "fp8_e4m3");
  EXPECT_EQ(kvaudit::testing::registry().dtypes().normalise("FP8"), "fp8_e4m3");
  EXPECT_EQ(kvaudit::testing::registry().dtypes().normalise("BF16"), "bf16");
  EXPECT_EQ(kvaudit::testing::registry().dtypes().normalise("NVFP4"), "nvfp4");
  EXPECT_EQ(kvaudit::testing::registry().dtypes().normalise("torch.float4_e2m1fn_x2"), "fp4_e2m1");
  EXPECT_EQ(kvaudit::testing::registry().dtypes().normalise("auto"), "auto");
  EXPECT_EQ(kvaudit::testing::registry().dtypes().normalise("int3"), "");
  EXPECT_TRUE(kvaudit::testing::registry().dtypes().is_quantized("int8_per_token_head"));
  EXPECT_TRUE(kvaudit::testing::registry().dtypes().is_quantized("turboquant_3bit_nc"));
  EXPECT_FALSE(kvaudit::testing::registry().dtypes().is_quantized("bfloat16"));
  EXPECT_FALSE(kvaudit::testing::registry().dtypes().is_quantized("auto"));
  // Exact storage: NVFP4 head_size/2 + head_size/16 bytes per side (vLLM
  // nvfp4_kv_cache_full_dim); per-token-head INT8 one FP32 scale per side.
  EXPECT_EQ(kv_bits_per_head(*kvaudit::testing::registry().dtypes().find("nvfp4"), 128, 128),
            8 * 2 * (64 + 8));
  EXPECT_EQ(kv_bits_per_head(*kvaudit::testing::registry().dtypes().find("int8_per_token_head"),
                             128, 128),
            8 * 2 * (128 + 4));
  EXPECT_EQ(kv_bits_per_head(*kvaudit::testing::registry().dtypes().find("mxfp8"), 128, 128),
            8 * 2 * (128 + 4));
  EXPECT_EQ(kv_bits_per_head(*kvaudit::testing::registry().dtypes().find("bf16"), 128, 128),
            16 * 256);
}

TEST(Versions, RangesAndBoundaries) {
  auto range = parse_version_range(">=0.5.10 <0.5.19");
  ASSERT_TRUE(range);
  EXPECT_TRUE(range->contains(*parse_version("0.5.15")));
  EXPECT_FALSE(range->contains(*parse_version("0.5.19")));
  EXPECT_FALSE(range->contains(*parse_version("latest")));
  EXPECT_TRUE(parse_version_range("*")->contains(*parse_version("latest")));
  EXPECT_FALSE(parse_version_range("<0.5.x"));
  EXPECT_FALSE(parse_version_range(">= 0.5.10"));
  EXPECT_TRUE(newer_than_known(kvaudit::testing::engine("vllm"), *parse_version("0.34.0")));
  EXPECT_FALSE(newer_than_known(kvaudit::testing::engine("vllm"), *parse_version("0.33.0")));
  EXPECT_FALSE(newer_than_known(kvaudit::testing::engine("vllm"), *parse_version("")));
  auto bounds = boundary_versions(kvaudit::testing::engine("sglang"));
  auto has = [&](const char* v) {
    return std::any_of(bounds.begin(), bounds.end(),
                       [&](const Version& b) { return version_text(b) == v; });
  };
  EXPECT_TRUE(has("0.5.18"));  // a bound
  EXPECT_TRUE(has("0.5.17"));  // the release just below it
  EXPECT_TRUE(has("latest"));
}

TEST(LogTemplates, MatchTheEnginesOwnLines) {
  const EngineModel& sglang = kvaudit::testing::engine("sglang");
  const LogTemplate* pool = sglang.log_template("sglang_kv_pool");
  ASSERT_TRUE(pool);
  auto got = match_log_template(*pool,
                                "KV Cache is allocated. dtype: torch.bfloat16, #tokens: "
                                "1573854, K size: 11.26 GB, V size: 11.26 GB");
  ASSERT_TRUE(got);
  EXPECT_EQ(*got, (std::vector<std::string>{"torch.bfloat16", "1573854", "11.26", "11.26"}));
  EXPECT_FALSE(match_log_template(*pool,
                                  "KV Cache is allocated. #tokens: 183133, K size: 11.18 "
                                  "GB, V size: 11.18 GB"));
  const LogTemplate* old_pool = sglang.log_template("sglang_kv_pool_old");
  EXPECT_TRUE(match_log_template(*old_pool,
                                 "KV Cache is allocated. #tokens: 183133, K size: "
                                 "11.18 GB, V size: 11.18 GB"));
  const EngineModel& vllm = kvaudit::testing::engine("vllm");
  const LogTemplate* size = vllm.log_template("vllm_kv_cache_size");
  const LogTemplate* concurrency = vllm.log_template("vllm_max_concurrency");
  // The newer one-line report matches both templates; commas stay in the capture.
  const std::string line =
      "GPU KV cache size: 567,978 tokens, Maximum concurrency for 131,072 tokens per request: "
      "4.33x";
  EXPECT_EQ(match_log_template(*size, line)->at(0), "567,978");
  EXPECT_EQ(*match_log_template(*concurrency, line), (std::vector<std::string>{"131,072", "4.33"}));
  const LogTemplate* percent = vllm.log_template("vllm_v0_profile");
  auto v0 =
      match_log_template(*percent,
                         "model weights take 1.12GiB; non_torch_memory takes 0.16GiB; PyTorch "
                         "activation peak memory takes 0.23GiB; the rest of the memory "
                         "reserved for KV Cache is -1.05GiB.");
  ASSERT_TRUE(v0);
  EXPECT_EQ(v0->back(), "-1.05");
  // Log lines are bytes, not validated UTF-8: a bad byte is just a byte (in a text field;
  // a count field matches numbers only).
  const LogTemplate* dtype_line =
      kvaudit::testing::engine("sglang").log_template("sglang_kv_dtype_line");
  auto bad = match_log_template(*dtype_line, std::string("Using KV cache dtype: \xff\xfe"));
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->at(0), "\xff\xfe");
  EXPECT_FALSE(match_log_template(*size, std::string("GPU KV cache size: \xff\xfe tokens")));
}

}  // namespace
}  // namespace kvaudit::engines
