// logs internals: turns candidate lines into launches. Private to src/logs/.
#pragma once

#include <deque>
#include <string_view>

#include "logs/logs.h"

namespace kvaudit::logs {

// How far a launch got: a start-up marker opens a new launch when the current one already
// reached its stage.
enum Stage { kSystemd = 0, kVersion = 1, kArgs = 2, kEngineInit = 3, kLoading = 5, kReady = 8 };

// `text`'s first n bytes.
std::string clip(std::string_view text, size_t n = 300);
// A number as the engines print it ("1,573,854", "94.57", "-1.05").
std::optional<double> parse_number(std::string_view text);
// A whole, non-negative number as the engines print it.
std::optional<int64_t> parse_count(std::string_view text);
// The word after `key` in `text` (past blanks, up to a blank, ',', ')' or ';').
std::string word_after(std::string_view text, std::string_view key);

// One template that matched a line, with its captures by field name.
struct TemplateHit {
  const engines::EngineModel* engine;
  const engines::LogTemplate* log;
  std::vector<std::string> captures;
  std::optional<std::string> text(std::string_view field) const {
    for (size_t i = 0; i < log->fields.size() && i < captures.size(); ++i)
      if (log->fields[i] == field) return captures[i];
    return std::nullopt;
  }
  // A number is the capture's first word: a last placeholder captures the rest of the
  // line ("8192, available_gpu_mem=3.63 GB" after context_len=).
  static std::string_view first_word(std::string_view t) {
    size_t end = t.find(' ');
    if (end != std::string_view::npos) t = t.substr(0, end);
    while (!t.empty() && (t.back() == ',' || t.back() == ';')) t.remove_suffix(1);
    return t;
  }
  std::optional<double> number(std::string_view field) const {
    auto t = text(field);
    return t ? parse_number(first_word(*t)) : std::nullopt;
  }
  std::optional<int64_t> count(std::string_view field) const {
    auto t = text(field);
    return t ? parse_count(first_word(*t)) : std::nullopt;
  }
};

// Decides from a launch's scale messages whether it ran at scale 1.0 (null when the log
// cannot tell).
void decide_scale_fallback(const engines::Registry& registry, Launch& launch);

// The HiCache host pools a launch printed, per rank (tiers.cpp).
struct HostPoolSummary {
  double gb_per_rank = 0;  // the first rank's pools, summed (GB of 1e9 bytes)
  int pools_per_rank = 0;
  int ranks = 0;
  bool ranks_agree = true;
  // Tokens the pool holds at the device pool's printed bytes per token (unset without them).
  std::optional<int64_t> tokens_per_rank;
};
std::optional<HostPoolSummary> host_pool_summary(const Launch& launch);
// "HiCache host pool 120.00 GB per rank x 8 ranks; KV connector X" ("" when none printed).
std::string tiers_text(const Launch& launch);
nlohmann::json tiers_json(const Launch& launch);
// The host pool against the launch's --hicache-size / --hicache-ratio and its device pool.
void add_tier_findings(Launch& launch, const std::string& who);

class LaunchBuilder {
 public:
  LaunchBuilder(const engines::Registry& registry, size_t max_launches, audit::KvPolicy kv_policy);

  // One line that matched a scan pattern (raw, with its prefixes), 1-based number.
  void handle(std::string_view raw_line, int64_t line_no);
  // Moves the launches into `out`, resolving what needs the whole launch.
  void finish(LogScan& out);
  // The newest launch as finish() would return it, without copying the others (watch asks
  // after every matched line).
  std::optional<Launch> latest() const;

 private:
  // What finish() works out of one launch's lines once they are all in.
  void resolve(Launch& launch) const;
  Launch& current(int64_t line_no, const std::string& timestamp);
  Launch& open_launch(int64_t line_no, const std::string& timestamp);
  // Why `hits` (one line, printed by `rank`) must start a new run, when they do.
  std::optional<std::string> new_run_without_marker(const std::vector<TemplateHit>& hits,
                                                    const std::string& rank, int64_t line_no) const;
  // A line that starts a launch at `stage`: opens a new launch when the current
  // one already got that far.
  Launch& start_marker(int stage, int64_t line_no, const std::string& timestamp);
  // Opens a launch at a line that proves a new process without a start-up marker (an
  // excerpt of two runs with the second one's first lines cut).
  Launch& start_unmarked(int64_t line_no, const std::string& timestamp, std::string reason);
  void record_failure(Launch& launch, const std::string& kind, const std::string& message,
                      int64_t line_no);
  // An args line read through the engine data's log_args: `what` names the line in
  // evidence ("server_args", "non-default args", "engine config"); `fill_only` leaves
  // fields an earlier line set; `omits_defaults` applies log_args.omitted_defaults.
  void apply_args(Launch& launch, const engines::EngineModel& engine, const nlohmann::json& args,
                  bool complete, bool omits_defaults, bool fill_only, const std::string& what,
                  int64_t line_no);
  void apply_marker(const TemplateHit& hit, int64_t line_no, const std::string& timestamp);
  // `rank`: the line's rank prefix ("TP3"; "" none), for facts each rank prints.
  void apply_fact(Launch& launch, const TemplateHit& hit, int64_t line_no,
                  const std::string& message, const std::string& rank);

  const engines::Registry& registry_;
  std::vector<std::pair<const engines::EngineModel*, const engines::LogTemplate*>> templates_;
  std::deque<Launch> launches_;
  size_t max_launches_;
  audit::KvPolicy kv_policy_;
  int64_t dropped_ = 0;
  int next_index_ = 0;
};

}  // namespace kvaudit::logs
