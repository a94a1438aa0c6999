// The capacity ledger: kvaudit's capacity model run on every real start-up log of the corpus
// (tests/fixtures/logs/real/<engine>/, with EXPECTED.json and MODELS.json), each against its
// model's real config.json (tests/fixtures/configs/), and the figures the log printed put
// beside the intervals kvaudit predicts. docs/capacity-ledger.md is its Markdown, written by
// tools/capacity_ledger.cpp; a test fails when that file is stale.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "engines/engines.h"

namespace kvaudit::ledger {

// One printed figure checked against its predicted interval.
struct LedgerCheck {
  std::string id;    // the from-log check ("sglang_max_total_num_tokens", ...)
  std::string what;  // in words
  int64_t printed = 0;
  int64_t lo = 0, hi = 0;
  bool inside = false;
  double error_percent = 0.0;  // outside: distance to the nearer bound, % of the printed figure
};

struct LedgerRow {
  std::string engine, file;
  std::string version;  // as the log printed it, else from its source; "" unknown
  std::string model;    // the hub repository ("" unknown)
  std::string config;   // tests/fixtures/configs/ folder ("" none found)
  bool sibling_config = false;
  int tp = 0, dp = 0;
  std::string kv_cache_dtype;
  std::vector<LedgerCheck> tokens;       // token / block counts
  std::vector<LedgerCheck> concurrency;  // requests at once (printed maximum concurrency, caps)
  std::vector<LedgerCheck> sizes;        // other printed sizes (bytes per token, state slots)
  std::string
      status;        // "reproduced", "outside", "no capacity printed", "no config", "not predicted"
  std::string note;  // why not predicted, or what decided a value
};

struct LedgerSummary {
  std::string engine;  // "" all
  int logs = 0, predicted = 0, token_checks = 0, token_inside = 0;
  int concurrency_checks = 0, concurrency_inside = 0;
  double outside_mean_error_percent = 0.0, outside_max_error_percent = 0.0;
};

struct Ledger {
  std::vector<LedgerRow> rows;         // by engine, then file
  std::vector<LedgerSummary> summary;  // per engine, then all
};

// Runs every log of `corpus_dir` (<engine>/EXPECTED.json, MODELS.json) against the configs of
// `configs_dir`. Throws InputError for a missing or malformed corpus file.
Ledger build_ledger(const engines::Registry& registry, const std::filesystem::path& corpus_dir,
                    const std::filesystem::path& configs_dir);

// docs/capacity-ledger.md: deterministic for a given corpus, data and code.
std::string ledger_markdown(const Ledger& ledger);

}  // namespace kvaudit::ledger
