#include "ledger/ledger.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "checkpoint/checkpoint.h"
#include "logs/logs.h"
#include "plan/plan.h"
#include "util/json.h"
#include "util/util.h"

namespace kvaudit::ledger {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Which from-log checks count as token capacity, as concurrency, or as another size.
enum class CheckKind { tokens, concurrency, size };
CheckKind kind_of(const std::string& id) {
  static const std::set<std::string> tokens = {"sglang_max_total_num_tokens", "sglang_pool_size",
                                               "vllm_num_gpu_blocks", "vllm_gpu_kv_cache_size",
                                               "trtllm_max_tokens"};
  static const std::set<std::string> concurrency = {"vllm_max_concurrency",
                                                    "sglang_running_requests_state_pool"};
  if (tokens.count(id)) return CheckKind::tokens;
  if (concurrency.count(id)) return CheckKind::concurrency;
  return CheckKind::size;
}

LedgerCheck to_check(const plan::LogCheck& c) {
  LedgerCheck out{c.id, c.what, c.printed, c.predicted.lo, c.predicted.hi, c.inside, 0.0};
  if (!c.inside && c.printed != 0) {
    const int64_t distance = c.predicted.empty()          ? 0
                             : c.printed < c.predicted.lo ? c.predicted.lo - c.printed
                                                          : c.printed - c.predicted.hi;
    out.error_percent =
        100.0 * static_cast<double>(distance) / std::abs(static_cast<double>(c.printed));
  }
  return out;
}

struct ModelEntry {
  std::string hf_repo, config;
  bool sibling = false;
};

std::map<std::pair<std::string, std::string>, ModelEntry> read_models(const fs::path& file) {
  std::map<std::pair<std::string, std::string>, ModelEntry> out;
  const json doc = read_json_file(file);
  if (!doc.is_array()) throw InputError(file.string(), "expected an array of log entries");
  for (const json& e : doc) {
    JsonReader r(e, file.string());
    r.allow_descriptive({"confidence", "evidence", "note", "config_note"});
    ModelEntry m;
    const std::string engine = r.string("engine"), log = r.string("file");
    m.hf_repo = r.raw("hf_repo").is_string() ? r.raw("hf_repo").get<std::string>() : "";
    m.config = r.raw("config").is_string() ? r.raw("config").get<std::string>() : "";
    m.sibling =
        r.raw("config_is").is_string() && r.raw("config_is").get<std::string>() == "sibling";
    r.finish();
    out[{engine, log}] = m;
  }
  return out;
}

// One log through logs and plan --from-log, as a user would run them: the log's own figures,
// with the release, TP and DP its source states where the log does not print them.
LedgerRow run_log(const engines::Registry& registry, const fs::path& corpus_dir,
                  const fs::path& configs_dir, const std::string& engine, const json& entry,
                  const ModelEntry* model) {
  LedgerRow row;
  row.engine = engine;
  row.file = entry.at("file").get<std::string>();
  const json& expect = entry.contains("expect") ? entry["expect"] : json::object();
  // The release the source states (its first word; the rest says how it is known).
  std::string stated_version =
      entry.contains("engine_version") && entry["engine_version"].is_string()
          ? entry["engine_version"].get<std::string>()
          : "";
  stated_version = stated_version.substr(0, stated_version.find(' '));
  if (model)
    row.model = model->hf_repo, row.config = model->config, row.sibling_config = model->sibling;
  const logs::LogScan scan = logs::scan_log_file(registry, corpus_dir / engine / row.file);
  if (scan.launches.empty()) {
    row.status = "no launch read";
    return row;
  }
  const logs::Launch& launch = scan.launches.back();
  row.version = launch.engine_version.empty() ? stated_version : launch.engine_version;
  row.tp = launch.tp > 0                                               ? launch.tp
           : expect.contains("tp") && expect["tp"].is_number_integer() ? expect["tp"].get<int>()
                                                                       : 0;
  row.dp = launch.dp > 0                                               ? launch.dp
           : expect.contains("dp") && expect["dp"].is_number_integer() ? expect["dp"].get<int>()
                                                                       : 0;
  row.kv_cache_dtype = launch.kv_cache_dtype_resolved;
  if (row.config.empty()) {
    row.status = "no config";
    row.note = row.model.empty() ? "the model is not named by the log or its source"
                                 : fmt::format("no copy of {}'s config.json found", row.model);
    return row;
  }
  try {
    const checkpoint::ModelFacts facts = checkpoint::read_checkpoint(configs_dir / row.config);
    plan::LogFlagOverrides given;
    if (launch.engine_version.empty() && !stated_version.empty())
      given.engine_version = stated_version;
    if (launch.tp == 0 && row.tp > 0) given.tp = row.tp;
    if (launch.dp == 0 && row.dp > 0) given.dp = row.dp;
    const plan::LogSetup setup =
        plan::reconcile_log_flags(registry, launch.memory, plan::PlanOptions{}, given);
    if (row.kv_cache_dtype.empty()) row.kv_cache_dtype = setup.memory.kv_cache_dtype;
    const plan::LogPrediction prediction = plan::predict_from_log(registry, facts, setup);
    for (const plan::LogCheck& c : prediction.checks) {
      switch (kind_of(c.id)) {
        case CheckKind::tokens:
          row.tokens.push_back(to_check(c));
          break;
        case CheckKind::concurrency:
          row.concurrency.push_back(to_check(c));
          break;
        case CheckKind::size:
          row.sizes.push_back(to_check(c));
          break;
      }
    }
    if (row.tokens.empty() && row.concurrency.empty() && row.sizes.empty()) {
      row.status = "no capacity printed";
      row.note = prediction.notes.empty() ? "" : prediction.notes.back();
    } else {
      bool inside = true;
      for (const auto* list : {&row.tokens, &row.concurrency, &row.sizes})
        for (const LedgerCheck& c : *list) inside = inside && c.inside;
      row.status = inside ? "reproduced" : "outside";
      if (scan.launches.size() > 1)
        row.note = fmt::format("launch {} of {} (the latest; lines {}-{})", launch.index + 1,
                               scan.launches.size(), launch.first_line, launch.last_line);
    }
  } catch (const InputError& error) {
    row.status = "not predicted";
    row.note = error.problem();
  }
  return row;
}

LedgerSummary summarise(const std::string& engine, const std::vector<LedgerRow>& rows) {
  LedgerSummary s;
  s.engine = engine;
  double error_sum = 0.0;
  int outside = 0;
  for (const LedgerRow& row : rows) {
    if (!engine.empty() && row.engine != engine) continue;
    ++s.logs;
    if (row.status == "reproduced" || row.status == "outside") ++s.predicted;
    for (const LedgerCheck& c : row.tokens) {
      ++s.token_checks;
      s.token_inside += c.inside;
      if (!c.inside) {
        ++outside;
        error_sum += c.error_percent;
        s.outside_max_error_percent = std::max(s.outside_max_error_percent, c.error_percent);
      }
    }
    for (const LedgerCheck& c : row.concurrency) {
      ++s.concurrency_checks;
      s.concurrency_inside += c.inside;
    }
  }
  s.outside_mean_error_percent = outside > 0 ? error_sum / outside : 0.0;
  return s;
}

std::string checks_text(const std::vector<LedgerCheck>& checks) {
  std::string out;
  for (const LedgerCheck& c : checks) {
    if (!out.empty()) out += "<br>";
    out += fmt::format("{}: {} in [{}, {}] {}", c.id, with_thousands(c.printed),
                       with_thousands(c.lo), with_thousands(c.hi),
                       c.inside ? "yes" : fmt::format("**no** ({:.2f}%)", c.error_percent));
  }
  return out.empty() ? "-" : out;
}

std::string cell(std::string text) {
  for (size_t at = 0; (at = text.find('|', at)) != std::string::npos; at += 2)
    text.replace(at, 1, "\\|");
  std::replace(text.begin(), text.end(), '\n', ' ');
  return text.empty() ? "-" : text;
}

}  // namespace

Ledger build_ledger(const engines::Registry& registry, const fs::path& corpus_dir,
                    const fs::path& configs_dir) {
  const auto models = read_models(corpus_dir / "MODELS.json");
  Ledger ledger;
  std::vector<std::string> engines;
  for (const auto& dir : fs::directory_iterator(corpus_dir))
    if (dir.is_directory() && fs::exists(dir.path() / "EXPECTED.json"))
      engines.push_back(dir.path().filename().string());
  std::sort(engines.begin(), engines.end());
  for (const std::string& engine : engines) {
    const json expected = read_json_file(corpus_dir / engine / "EXPECTED.json");
    std::vector<const json*> entries;
    for (const json& e : expected) entries.push_back(&e);
    std::sort(entries.begin(), entries.end(), [](const json* a, const json* b) {
      return a->at("file").get<std::string>() < b->at("file").get<std::string>();
    });
    for (const json* e : entries) {
      auto it = models.find({engine, e->at("file").get<std::string>()});
      ledger.rows.push_back(run_log(registry, corpus_dir, configs_dir, engine, *e,
                                    it == models.end() ? nullptr : &it->second));
    }
  }
  for (const std::string& engine : engines)
    ledger.summary.push_back(summarise(engine, ledger.rows));
  ledger.summary.push_back(summarise("", ledger.rows));
  return ledger;
}

std::string ledger_markdown(const Ledger& ledger) {
  std::string out =
      "# Capacity ledger\n\n"
      "<!-- Generated by tools/capacity_ledger.cpp (make ledger); do not edit. The test\n"
      "     CapacityLedger.DocumentIsUpToDate fails when this file is stale. -->\n\n"
      "kvaudit's capacity model run on every real start-up log of its corpus\n"
      "(`tests/fixtures/logs/real/`, each log with its public source in `SOURCES.md`), against "
      "the\n"
      "real `config.json` of the model the log served (`tests/fixtures/configs/`, sources in its\n"
      "`SOURCES.md`; `MODELS.json` says which model each log served and how that is known). Each\n"
      "figure the log printed is compared with the interval kvaudit predicts from the log's other\n"
      "figures (`kvaudit plan CONFIG --from-log LOG`): exact where the engine is exact, the "
      "interval\n"
      "being what the log's two-decimal memory figures allow. Where the log does not print the\n"
      "release, TP or DP, the values its source states are passed as flags, as a user would.\n\n"
      "A row is *reproduced* when every printed figure falls inside its interval, *outside* when\n"
      "one does not (the error is the distance to the nearer bound, in % of the printed figure),\n"
      "*no config* when no copy of the model's config.json could be found, *no capacity printed*\n"
      "when the excerpt has no figure to check, and *not predicted* when kvaudit refused (the\n"
      "reason is given).\n\n";
  out += "## Summary\n\n";
  out +=
      "| engine | logs | predicted | token figures inside | concurrency figures inside | "
      "outside: mean / max error |\n|---|---|---|---|---|---|\n";
  for (const LedgerSummary& s : ledger.summary)
    out += fmt::format(
        "| {} | {} | {} | {} / {} ({}) | {} / {} | {} |\n", s.engine.empty() ? "**all**" : s.engine,
        s.logs, s.predicted, s.token_inside, s.token_checks,
        s.token_checks > 0 ? fmt::format("{:.1f}%", 100.0 * s.token_inside / s.token_checks)
                           : std::string("-"),
        s.concurrency_inside, s.concurrency_checks,
        s.token_checks > s.token_inside
            ? fmt::format("{:.2f}% / {:.2f}%", s.outside_mean_error_percent,
                          s.outside_max_error_percent)
            : std::string("-"));
  out +=
      "\nFor comparison, llm-d-planner's validation against 57 real vLLM runs reports the KV "
      "cache\n"
      "*memory* within 0.34% mean error (llm-d-incubation/llm-d-planner PR #205, 2026-04-24):\n"
      "a GiB estimate, where the figures above are exact token, block and request counts held to\n"
      "the interval the printed memory allows.\n\n";
  out += "## Per log\n\n";
  out +=
      "| engine | log | release | model (config) | TP / DP | KV dtype | tokens printed vs "
      "predicted | concurrency printed vs predicted | other sizes | status |\n"
      "|---|---|---|---|---|---|---|---|---|---|\n";
  for (const LedgerRow& row : ledger.rows) {
    std::string model = row.model.empty() ? "unknown" : row.model;
    if (!row.config.empty())
      model += fmt::format(" (`{}`{})", row.config, row.sibling_config ? ", sibling" : "");
    std::string status = row.status;
    if (!row.note.empty()) status += ": " + row.note;
    out += fmt::format("| {} | `{}` | {} | {} | {} / {} | {} | {} | {} | {} | {} |\n", row.engine,
                       row.file, cell(row.version), cell(model),
                       row.tp > 0 ? std::to_string(row.tp) : "-",
                       row.dp > 0 ? std::to_string(row.dp) : "-", cell(row.kv_cache_dtype),
                       checks_text(row.tokens), checks_text(row.concurrency),
                       checks_text(row.sizes), cell(status));
  }
  return out;
}

}  // namespace kvaudit::ledger
