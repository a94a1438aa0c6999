// The corpus of real start-up logs (tests/fixtures/logs/real/<engine>/, each with its
// source in SOURCES.md): every log is read and every fact its EXPECTED.json entry states
// (what a careful person reads in the lines, written down before kvaudit read them) is
// compared with what `logs` reports for the file's last launch. A fact kvaudit does not
// read as stated must be listed in KNOWN_GAPS.json with why; a listed gap that starts to
// read right fails too, so the list only shrinks.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <map>
#include <set>

#include "common/registry.h"
#include "logs/logs.h"
#include "util/json.h"
#include "util/util.h"

namespace kvaudit::logs {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

fs::path corpus_dir() {
  return fs::path(KVAUDIT_TEST_DIR) / "fixtures" / "logs" / "real";
}

std::string shown(const json& v) {
  return v.is_string() ? v.get<std::string>() : v.dump();
}

// What the report says for one EXPECTED key, as JSON (null: the report does not say).
json actual_fact(const Launch& l, const std::string& key) {
  auto opt = [](const auto& v) -> json { return v ? json(*v) : json(); };
  const plan::LoggedMemory& m = l.memory;
  if (key == "tp") return l.tp > 0 ? json(l.tp) : l.tp_at_least > 0 ? json(l.tp_at_least) : json();
  if (key == "dp") {
    if (l.dp > 0) return l.dp;
    return l.dp_ranks_seen.empty() ? json() : json(*l.dp_ranks_seen.rbegin() + 1);
  }
  if (key == "kv_cache_dtype_requested")
    return l.kv_cache_dtype_requested.empty() ? json() : json(l.kv_cache_dtype_requested);
  if (key == "kv_cache_dtype_resolved")
    return l.kv_cache_dtype_resolved.empty() ? json() : json(l.kv_cache_dtype_resolved);
  if (key == "model_dtype") return l.model_dtype.empty() ? json() : json(l.model_dtype);
  if (key == "max_total_tokens")
    return opt(m.max_total_num_tokens ? m.max_total_num_tokens : l.max_total_tokens);
  if (key == "pool_tokens") return opt(m.pool_tokens);
  if (key == "k_gib") return opt(m.k_gib);
  if (key == "v_gib") return opt(m.v_gib);
  if (key == "kv_gib") return opt(m.kv_gib);
  if (key == "mamba_slots") return opt(m.mamba_slots);
  if (key == "context_length") return opt(l.context_length);
  if (key == "max_running_requests") return opt(l.max_running_requests);
  // A line where the engine lowered max_running_requests, and why.
  const auto& cap = l.running_requests_cap;
  if (key == "running_requests_capped_by") return cap ? json(cap->by) : json();
  if (key == "running_requests_requested") return cap ? opt(cap->requested) : json();
  if (key == "state_slots_per_request") return cap ? opt(cap->slots_per_request) : json();
  if (key == "mem_fraction_static") return opt(m.mem_fraction_static);
  if (key == "avail_after_weights_gib") return opt(m.avail_after_weights_gib);
  if (key == "available_kv_gib") return opt(m.available_kv_gib);
  if (key == "gpu_kv_cache_tokens") return opt(m.gpu_kv_cache_tokens);
  if (key == "num_gpu_blocks") return opt(m.num_gpu_blocks);
  if (key == "concurrency_context") return opt(m.concurrency_context);
  if (key == "concurrency_x") return opt(m.concurrency_x);
  if (key == "weights_gib") return opt(l.weights_gib);
  if (key == "ready") return l.ready;
  if (key == "engine") return l.engine.empty() ? json() : json(l.engine);
  if (key == "engine_version") return l.engine_version.empty() ? json() : json(l.engine_version);
  // TensorRT-LLM's profile line and block size.
  if (key == "kv_bytes_per_token") return opt(m.kv_bytes_per_token);
  if (key == "peak_gib") return opt(m.peak_gib);
  if (key == "total_gpu_gib") return opt(m.total_gpu_gib);
  if (key == "tmp_kv_gib") return opt(m.tmp_kv_gib);
  if (key == "printed_fraction") return opt(m.printed_fraction);
  if (key == "tokens_per_block") return opt(m.block_size);
  if (key == "scale_fallback") return opt(l.scale_fallback);
  if (key == "server_args_cut") return !l.server_args_complete;
  if (key == "failure") {
    // "oom" when any failure is an OOM, "traceback" for any other start-up failure.
    bool oom = false, other = false;
    for (const auto& f : l.failures) (f.kind == "oom" ? oom : other) = true;
    return oom ? json("oom") : other ? json("traceback") : json();
  }
  return "(kvaudit has no such fact)";
}

bool same_fact(const std::string& key, const json& expected, const json& actual) {
  if (expected.is_number() && actual.is_number())
    return std::abs(expected.get<double>() - actual.get<double>()) < 1e-9;
  if ((key == "kv_cache_dtype_resolved" || key == "kv_cache_dtype_requested" ||
       key == "model_dtype") &&
      expected.is_string() && actual.is_string())
    return kvaudit::testing::registry().dtypes().normalise(expected.get<std::string>()) ==
           kvaudit::testing::registry().dtypes().normalise(actual.get<std::string>());
  return expected == actual;
}

struct CorpusEntry {
  std::string engine;  // the folder: sglang, vllm, trtllm
  json entry;          // its EXPECTED.json object
  std::string label() const { return engine + "/" + entry.at("file").get<std::string>(); }
};

void PrintTo(const CorpusEntry& c, std::ostream* os) {
  *os << c.label();
}

std::vector<CorpusEntry> corpus_entries() {
  std::vector<CorpusEntry> out;
  for (const auto& dir : fs::directory_iterator(corpus_dir())) {
    if (!dir.is_directory()) continue;
    for (const auto& entry : read_json_file(dir.path() / "EXPECTED.json"))
      out.push_back({dir.path().filename().string(), entry});
  }
  std::sort(out.begin(), out.end(),
            [](const CorpusEntry& a, const CorpusEntry& b) { return a.label() < b.label(); });
  return out;
}

std::map<std::string, std::string> known_gaps() {  // "engine/file key" -> why
  std::map<std::string, std::string> known;
  const fs::path gaps_file = corpus_dir() / "KNOWN_GAPS.json";
  if (fs::exists(gaps_file))
    for (const auto& gap : read_json_file(gaps_file))
      known[gap.at("file").get<std::string>() + " " + gap.at("key").get<std::string>()] =
          gap.at("why").get<std::string>();
  return known;
}

// Every fact of one artifact that reads differently: key -> what differs.
std::map<std::string, std::string> mismatches(const CorpusEntry& c) {
  std::map<std::string, std::string> out;
  const json& entry = c.entry;
  LogScan scan = scan_log_file(kvaudit::testing::registry(),
                               corpus_dir() / c.engine / entry.at("file").get<std::string>());
  if (entry.contains("launches") && scan.launches.size() != entry["launches"].get<size_t>())
    out["launches"] =
        fmt::format("launches expected {} got {}", entry["launches"].dump(), scan.launches.size());
  if (scan.launches.empty()) {
    out["launches"] = "no launch recognised";
    return out;
  }
  const Launch& last = scan.launches.back();
  for (const auto& [key, value] : entry.at("expect").items()) {
    json got = actual_fact(last, key);
    if (!same_fact(key, value, got))
      out[key] = fmt::format("{} expected {} got {}", key, shown(value), shown(got));
  }
  return out;
}

class RealLog : public ::testing::TestWithParam<CorpusEntry> {};

// One test per artifact: every stated fact reads as stated, or is a listed gap.
TEST_P(RealLog, ReadsAsAPersonReadsIt) {
  const CorpusEntry& c = GetParam();
  ASSERT_TRUE(c.entry.contains("source") && !c.entry["source"].get<std::string>().empty())
      << c.label() << " has no source";
  ASSERT_TRUE(c.entry.contains("expect") && !c.entry["expect"].empty());
  const auto known = known_gaps();
  for (const auto& [key, what] : mismatches(c))
    EXPECT_TRUE(known.count(c.label() + " " + key)) << c.label() << ": " << what;
}

std::string test_name(const ::testing::TestParamInfo<CorpusEntry>& info) {
  std::string name = info.param.label();
  for (char& ch : name)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return name;
}

INSTANTIATE_TEST_SUITE_P(Corpus, RealLog, ::testing::ValuesIn(corpus_entries()), test_name);

// The corpus as a whole: its size, the figures for the record, and no stale gap.
TEST(RealLogCorpus, SizeFiguresAndNoStaleGap) {
  const auto entries = corpus_entries();
  const auto known = known_gaps();
  std::set<std::string> mismatched;
  std::map<std::string, std::pair<int, int>> per_engine;  // logs, read exactly
  int facts = 0;
  for (const auto& c : entries) {
    auto m = mismatches(c);
    facts += static_cast<int>(c.entry.at("expect").size());
    for (const auto& [key, what] : m) mismatched.insert(c.label() + " " + key);
    ++per_engine[c.engine].first;
    per_engine[c.engine].second += m.empty();
  }
  for (const auto& [engine, counts] : per_engine)
    std::cout << fmt::format("  [corpus] {}: {} logs, {} read exactly as stated\n", engine,
                             counts.first, counts.second);
  std::cout << fmt::format("  [corpus] {} logs, {} stated facts, {} known gaps\n", entries.size(),
                           facts, known.size());
  EXPECT_GE(entries.size(), 40u);
  std::vector<std::string> stale;
  for (const auto& [key, why] : known)
    if (!mismatched.count(key)) stale.push_back(key);
  EXPECT_TRUE(stale.empty()) << "listed in KNOWN_GAPS.json but now read right (remove them):\n  "
                             << fmt::format("{}", fmt::join(stale, "\n  "));
}

}  // namespace
}  // namespace kvaudit::logs
