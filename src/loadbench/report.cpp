// The load test's report: the ladder per server and prompt kind, real text against the
// random-token control, A against B, speculative acceptance, and the curves.
#include <fmt/format.h>

#include <cmath>
#include <map>
#include <set>

#include "loadbench/loadbench.h"

namespace kvaudit::loadbench {

using nlohmann::json;
using report::Value;

namespace {

// A and B by URL (one server: A).
std::string side_of(const LoadResult& result, const std::string& url) {
  if (result.servers.size() == 2 && result.servers[1].url == url) return "B";
  return "A";
}

// Accepted / drafted tokens: counts when the server gave them, else SGLang's gauge.
double acceptance(const LoadLevel& l) {
  if (l.draft_tokens > 0) return static_cast<double>(l.accepted_tokens) / l.draft_tokens;
  return l.spec_accept_rate_gauge >= 0 ? l.spec_accept_rate_gauge : NAN;
}

// Accepted draft tokens per verify step. SGLang's accept length counts the token every step
// emits as well (scheduler: spec_num_total_accepted_tokens += num_accepted_tokens + bs), so
// one is taken off to match vLLM's and llama-server's accepted / drafts.
double accepted_per_step(const LoadLevel& l) {
  if (l.drafts > 0) return static_cast<double>(l.accepted_tokens) / static_cast<double>(l.drafts);
  return l.spec_accept_length_gauge >= 1.0 ? l.spec_accept_length_gauge - 1.0 : NAN;
}

Value optional_number(double value) {
  return std::isnan(value) ? Value(std::string("-")) : Value(value);
}

const LoadLevel* find_level(const LoadResult& result, const std::string& side,
                            const std::string& prompts, int concurrency) {
  for (const LoadLevel& l : result.levels)
    if (side_of(result, l.server) == side && l.prompts == prompts && l.concurrency == concurrency)
      return &l;
  return nullptr;
}

void add_ladder(const LoadResult& result, report::Report& out) {
  report::Table ladder{"load_ladder", "Throughput and latency per concurrency", {}, {}, ""};
  ladder.columns = {{"server", "server", "", 0},
                    {"prompts", "prompts", "", 0},
                    {"concurrency", "concurrency", "", 0},
                    {"requests", "requests", "", 0},
                    {"failures", "failed", "", 0},
                    {"cancelled", "cancelled", "", 0},
                    {"rps", "req/s", "", 2},
                    {"tps", "output tok/s", "", 1},
                    {"ttft_p50", "TTFT p50", "ms", 1},
                    {"ttft_p90", "p90", "ms", 1},
                    {"ttft_p99", "p99", "ms", 1},
                    {"itl_p50", "ITL p50", "ms", 2},
                    {"itl_p90", "p90", "ms", 2},
                    {"itl_p99", "p99", "ms", 2},
                    {"e2e_p50", "whole p50", "ms", 1},
                    {"e2e_p99", "p99", "ms", 1},
                    {"acceptance", "draft accepted", "%", 1},
                    {"per_step", "accepted/step", "", 2},
                    {"output_tokens", "tokens", "", 0},
                    {"server_tokens", "server counted", "", 0},
                    {"cached", "prompt cached", "%", 1}};
  for (const LoadLevel& l : result.levels) {
    const double per_step = accepted_per_step(l);
    auto ms = [&](const LatencySummary& s, double v) {
      return s.count > 0 ? Value(1000.0 * v) : Value(std::string("-"));
    };
    ladder.rows.push_back(
        {side_of(result, l.server) + (l.resumed ? " (resumed)" : ""),
         l.prompts,
         int64_t{l.concurrency},
         l.requests,
         l.failures,
         l.cancelled,
         l.requests_per_second,
         l.output_tokens_per_second,
         ms(l.ttft, l.ttft.p50),
         ms(l.ttft, l.ttft.p90),
         ms(l.ttft, l.ttft.p99),
         ms(l.itl, l.itl.p50),
         ms(l.itl, l.itl.p90),
         ms(l.itl, l.itl.p99),
         ms(l.e2e, l.e2e.p50),
         ms(l.e2e, l.e2e.p99),
         optional_number(100.0 * acceptance(l)),
         optional_number(per_step),
         l.output_tokens,
         l.server_output_tokens >= 0 ? Value(l.server_output_tokens) : Value(std::string("-")),
         l.cached_prompt_tokens >= 0 && l.prompt_tokens > 0
             ? Value(100.0 * static_cast<double>(l.cached_prompt_tokens) /
                     static_cast<double>(l.prompt_tokens))
             : Value(std::string("-"))});
  }
  ladder.note =
      "TTFT: request sent to first streamed text; ITL: gap between streamed chunks (a chunk "
      "holds every token the server sends at once: accepted drafts arrive together); "
      "draft accepted: accepted / drafted tokens over the level (server counters); tokens: "
      "output tokens by the answers' usage, server counted: the server's own generation "
      "counter over the level (/metrics), the independent check; prompt cached: prompt "
      "tokens the server says it served from its prompt cache (usage "
      "prompt_tokens_details.cached_tokens).";
  out.tables.push_back(ladder);
}

// Sessions (--load-turns): first turns against later ones, whose prompts begin with the turn
// before's. A server that reuses the shared prefix gets later turns to the first token
// sooner, though their prompts are longer.
// Returns what the sessions say about each server's prefix reuse ("" when nothing): from
// its cached-token counts when it reports them, else inferred from TTFT at concurrency 1
// (no queueing there).
std::vector<std::string> add_turns(const LoadResult& result, const LoadOptions& options,
                                   report::Report& out) {
  report::Table turns{
      "load_turns",
      fmt::format("Time to first token by turn ({} turns a session)", options.turns),
      {{"server", "server", "", 0},
       {"prompts", "prompts", "", 0},
       {"concurrency", "concurrency", "", 0},
       {"first_p50", "first turn TTFT p50", "ms", 1},
       {"later_p50", "later turns TTFT p50", "ms", 1},
       {"later_over_first", "later/first", "", 3},
       {"cached", "prompt cached", "%", 1}},
      {},
      ""};
  // Turn k holds k/T of the session: re-prefilling every turn costs later turns (T + 2) / 2
  // times the first turn's prompt on average, and a prefix cache can serve at most
  // (1 + ... + T-1) / (1 + ... + T) = (T - 1) / (T + 1) of all prompt tokens.
  const double full_prefill = (options.turns + 2) / 2.0;
  const double cacheable = (options.turns - 1.0) / (options.turns + 1.0);
  std::vector<std::string> verdicts;
  std::set<std::string> judged;
  for (const LoadLevel& l : result.levels) {
    if (l.ttft_later_turns.count == 0 || l.ttft_first_turn.count == 0) continue;
    const double ratio =
        l.ttft_first_turn.p50 > 0 ? l.ttft_later_turns.p50 / l.ttft_first_turn.p50 : NAN;
    const double cached = l.cached_prompt_tokens >= 0 && l.prompt_tokens > 0
                              ? static_cast<double>(l.cached_prompt_tokens) / l.prompt_tokens
                              : NAN;
    turns.rows.push_back({side_of(result, l.server), l.prompts, int64_t{l.concurrency},
                          1000.0 * l.ttft_first_turn.p50, 1000.0 * l.ttft_later_turns.p50,
                          optional_number(ratio), optional_number(100.0 * cached)});
    const std::string side = side_of(result, l.server);
    if (l.concurrency != 1 || judged.count(side)) continue;
    judged.insert(side);
    if (!std::isnan(cached)) {
      verdicts.push_back(fmt::format(
          "{} served {:.0f}% of the sessions' prompt tokens from its prefix cache (at most "
          "{:.0f}% can be){}",
          side, 100.0 * cached, 100.0 * cacheable,
          cached < 0.05 ? ": it re-prefills every turn (prefix caching off?)" : ""));
    } else if (!std::isnan(ratio) && ratio >= 0.75 * full_prefill) {
      verdicts.push_back(fmt::format(
          "{}'s later turns take {:.1f}x the first turn's TTFT against {:.1f}x for a full "
          "re-prefill: it does not appear to reuse the shared prefix (inferred from TTFT; it "
          "reports no cached tokens)",
          side, ratio, full_prefill));
    }
  }
  if (turns.rows.empty()) return verdicts;
  turns.note = fmt::format(
      "Turn k re-sends its session's context grown to k/{} of the session's length, after the "
      "answer to turn k-1, so its prompt begins with the one before. Later turns are longer: "
      "later/first well below k-proportional growth means the server served the shared "
      "prefix from its cache (SGLang's radix cache, vLLM's prefix caching, llama-server's "
      "cache_prompt).",
      options.turns);
  out.tables.push_back(turns);
  return verdicts;
}

// Real/random output-throughput ratio per server and level, and A/B per prompt kind.
std::vector<std::string> add_ratios(const LoadResult& result, const std::vector<int>& ladder,
                                    report::Report& out, json& payload) {
  std::vector<std::string> verdicts;
  report::Table ratios{"load_ratios", "Real text against random tokens", {}, {}, ""};
  ratios.columns = {{"concurrency", "concurrency", "", 0}};
  const std::vector<std::string> sides = result.servers.size() == 2
                                             ? std::vector<std::string>{"A", "B"}
                                             : std::vector<std::string>{"A"};
  for (const std::string& side : sides)
    ratios.columns.push_back({"real_over_random_" + side, side + " real/random tok/s", "", 3});
  if (sides.size() == 2) {
    ratios.columns.push_back({"b_over_a_real", "B/A real", "", 3});
    ratios.columns.push_back({"b_over_a_random", "B/A random", "", 3});
  }
  // Levels where the random-token control says "equal" (within 5%, a benchmark's
  // run-to-run noise) while real code says otherwise, and the level with the largest gap.
  std::vector<std::string> misled;
  double worst_gap = 0.0;
  int worst_at = 0;
  double real_at_worst = 1.0, random_at_worst = 1.0;
  for (int c : ladder) {
    std::vector<Value> row{int64_t{c}};
    // The same keys with one server or two (null where there is no B).
    json entry = {{"concurrency", c},
                  {"real_over_random_A", nullptr},
                  {"real_over_random_B", nullptr},
                  {"b_over_a_real", nullptr},
                  {"b_over_a_random", nullptr}};
    for (const std::string& side : sides) {
      const LoadLevel* real = find_level(result, side, "real", c);
      const LoadLevel* random = find_level(result, side, "random", c);
      double ratio = NAN;
      if (real && random && random->output_tokens_per_second > 0)
        ratio = real->output_tokens_per_second / random->output_tokens_per_second;
      row.push_back(optional_number(ratio));
      entry["real_over_random_" + side] = std::isnan(ratio) ? json() : json(ratio);
    }
    if (sides.size() == 2) {
      double ab[2] = {NAN, NAN};
      for (int k = 0; k < 2; ++k) {
        const char* kind = k == 0 ? "real" : "random";
        const LoadLevel* a = find_level(result, "A", kind, c);
        const LoadLevel* b = find_level(result, "B", kind, c);
        if (a && b && a->output_tokens_per_second > 0)
          ab[k] = b->output_tokens_per_second / a->output_tokens_per_second;
        row.push_back(optional_number(ab[k]));
      }
      entry["b_over_a_real"] = std::isnan(ab[0]) ? json() : json(ab[0]);
      entry["b_over_a_random"] = std::isnan(ab[1]) ? json() : json(ab[1]);
      if (!std::isnan(ab[0]) && !std::isnan(ab[1])) {
        if (std::fabs(ab[1] - 1.0) < 0.05 && std::fabs(ab[0] - 1.0) >= 0.05)
          misled.push_back(fmt::format("{} ({:.2f}x random, {:.2f}x real)", c, ab[1], ab[0]));
        if (std::fabs(ab[0] - ab[1]) > worst_gap) {
          worst_gap = std::fabs(ab[0] - ab[1]);
          worst_at = c;
          real_at_worst = ab[0];
          random_at_worst = ab[1];
        }
      }
    }
    ratios.rows.push_back(row);
    payload.push_back(entry);
  }
  if (sides.size() == 2 && worst_at > 0) {
    verdicts.push_back(fmt::format(
        "B/A output throughput up to {:.2f}x on real code vs {:.2f}x on random tokens (at "
        "concurrency {})",
        real_at_worst, random_at_worst, worst_at));
    verdicts.push_back(misled.empty()
                           ? std::string("the random-token control never called them equal "
                                         "where real code did not")
                           : fmt::format("a random-token benchmark would have called them equal "
                                         "at concurrency {}",
                                         fmt::join(misled, ", ")));
  }
  ratios.note =
      "Random-token prompts have the lengths of the real ones; what a random-token benchmark "
      "(sglang.bench_serving --dataset-name random, vllm bench serve --dataset-name random) "
      "measures. Speculative methods gain only where drafts are accepted.";
  out.tables.push_back(ratios);
  return verdicts;
}

// A curve per server and prompt kind over the ladder (concurrency on a log axis).
report::Chart ladder_chart(std::string id, std::string title, std::string y_label) {
  report::Chart chart;
  chart.id = std::move(id);
  chart.title = std::move(title);
  chart.kind = report::ChartKind::lines;
  chart.x_label = "concurrency";
  chart.y_label = std::move(y_label);
  chart.log_x = true;
  return chart;
}

void add_charts(const LoadResult& result, const std::vector<int>& ladder, report::Report& out) {
  report::Chart throughput =
      ladder_chart("load_throughput", "Output tokens/s by concurrency", "output tokens/s");
  report::Chart ttft =
      ladder_chart("load_ttft", "Time to first token (p50) by concurrency", "TTFT p50 (ms)");
  // Decode speed as each request sees it: the per-token gap, which batching trades for
  // throughput (the curve that rises while tokens/s still climbs).
  report::Chart itl =
      ladder_chart("load_itl", "Inter-token latency (p50) by concurrency", "ITL p50 (ms)");
  for (int c : ladder) {
    throughput.x_values.push_back(c);
    ttft.x_values.push_back(c);
    itl.x_values.push_back(c);
  }
  const std::vector<std::string> sides = result.servers.size() == 2
                                             ? std::vector<std::string>{"A", "B"}
                                             : std::vector<std::string>{"A"};
  for (const std::string& side : sides)
    for (const char* kind : {"real", "random"}) {
      report::Series tps{side + " " + kind, {}}, first{side + " " + kind, {}},
          gap{side + " " + kind, {}};
      bool any = false;
      for (int c : ladder) {
        const LoadLevel* l = find_level(result, side, kind, c);
        tps.y.push_back(l ? l->output_tokens_per_second : NAN);
        first.y.push_back(l && l->ttft.count > 0 ? 1000.0 * l->ttft.p50 : NAN);
        gap.y.push_back(l && l->itl.count > 0 ? 1000.0 * l->itl.p50 : NAN);
        any |= l != nullptr;
      }
      if (!any) continue;
      throughput.series.push_back(tps);
      ttft.series.push_back(first);
      itl.series.push_back(gap);
    }
  out.charts.push_back(throughput);
  out.charts.push_back(ttft);
  out.charts.push_back(itl);
}

}  // namespace

report::Report to_report(const LoadResult& result, const LoadOptions& options) {
  report::Report out;
  out.command = "probe";
  out.title = result.servers.size() == 2
                  ? fmt::format("kvaudit probe --load: A {} vs B {}", result.servers[0].url,
                                result.servers[1].url)
                  : fmt::format("kvaudit probe --load: {}", result.servers[0].url);
  for (size_t s = 0; s < result.servers.size(); ++s) {
    const probe::ServerFacts& f = result.servers[s];
    out.facts.push_back(
        {s == 0 ? "server_a" : "server_b", s == 0 ? "A" : "B",
         Value(fmt::format("{} ({}{}, model {})", f.url, f.engine,
                           f.engine_version.empty() ? "" : " " + f.engine_version, f.model_id)),
         ""});
  }
  out.facts.push_back({"prompts", "Prompts", Value(result.prompt_source), ""});
  out.facts.push_back({"lengths", "Prompt / output tokens (cycled)",
                       Value(fmt::format("{} / {}", fmt::join(options.prompt_tokens, ", "),
                                         fmt::join(options.output_tokens, ", "))),
                       ""});
  if (options.turns > 1)
    out.facts.push_back(
        {"turns", "Turns per session",
         Value(fmt::format("{} (each re-sends the session's context, grown; prompt lengths "
                           "above are the last turn's)",
                           options.turns)),
         ""});
  out.facts.push_back({"requests_sent", "Requests sent", Value(result.requests_sent), ""});
  out.facts.push_back({"seconds", "Run time", Value(result.seconds), "s", 1});
  add_ladder(result, out);
  json ratios = json::array();
  std::vector<std::string> verdicts = add_ratios(result, options.concurrency, out, ratios);
  add_charts(result, options.concurrency, out);
  for (const std::string& verdict : add_turns(result, options, out)) verdicts.push_back(verdict);

  // Speculative decoding: acceptance on real text against random tokens.
  for (const std::string side : {"A", "B"}) {
    double real_sum = 0, real_draft = 0, random_sum = 0, random_draft = 0;
    bool gauges = false;
    for (const LoadLevel& l : result.levels) {
      if (side_of(result, l.server) != side) continue;
      double accepted = static_cast<double>(l.accepted_tokens);
      double drafted = static_cast<double>(l.draft_tokens);
      if (l.draft_tokens <= 0) {
        // SGLang gives a rate only (a gauge): each level counts as one sample of it.
        if (l.spec_accept_rate_gauge < 0) continue;
        accepted = 100.0 * l.spec_accept_rate_gauge, drafted = 100.0, gauges = true;
      }
      (l.prompts == "real" ? real_sum : random_sum) += accepted;
      (l.prompts == "real" ? real_draft : random_draft) += drafted;
    }
    if (real_draft > 0 || random_draft > 0)
      verdicts.push_back(fmt::format(
          "{} speculative drafts accepted {:.1f}% on real code, {:.1f}% on random tokens{}{}", side,
          real_draft > 0 ? 100.0 * real_sum / real_draft : 0.0,
          random_draft > 0 ? 100.0 * random_sum / random_draft : 0.0,
          real_draft > 0 && random_draft > 0 &&
                  real_sum / real_draft > 2 * random_sum / random_draft
              ? ": a random-token benchmark under-states the method"
              : "",
          gauges ? " (SGLang's acceptance gauge at each level's end, averaged over levels)" : ""));
  }

  int64_t failures = 0, cancelled = 0;
  for (const LoadLevel& l : result.levels) failures += l.failures, cancelled += l.cancelled;
  json levels = json::array();
  for (const LoadLevel& l : result.levels) levels.push_back(to_json(l));
  out.payload["load"] = {{"levels", levels},          {"ratios", ratios},
                         {"stopped", result.stopped}, {"requests_sent", result.requests_sent},
                         {"seconds", result.seconds}, {"prompt_source", result.prompt_source},
                         {"turns", options.turns}};
  for (const std::string& note : result.notes) out.notes.push_back(note);
  for (const LoadLevel& l : result.levels)
    for (const std::string& error : l.errors)
      out.notes.push_back(
          fmt::format("{} {} x{}: {}", side_of(result, l.server), l.prompts, l.concurrency, error));
  if (!result.stopped.empty()) out.notes.push_back("Stopped early: " + result.stopped + ".");

  // Independent requests whose prompts the server had cached: their TTFT and throughput are
  // a warm cache's, not what new traffic gets (a second run with the same --seed sends the
  // same prompts).
  std::string warm;
  if (options.turns <= 1)
    for (const LoadLevel& l : result.levels)
      if (l.cached_prompt_tokens > 0 && l.prompt_tokens > 0 &&
          10 * l.cached_prompt_tokens >= l.prompt_tokens) {
        warm = fmt::format(
            "{} served {:.0f}% of the prompt tokens at {} x{} from its prompt cache: those "
            "latencies are a warm cache's, not new traffic's (a repeated run with the same "
            "--seed resends the same prompts: change --seed, or restart the server)",
            side_of(result, l.server),
            100.0 * static_cast<double>(l.cached_prompt_tokens) /
                static_cast<double>(l.prompt_tokens),
            l.prompts, l.concurrency);
        break;
      }
  out.verdict_severity = failures > 0 || !result.stopped.empty() || !warm.empty()
                             ? report::Severity::warning
                             : report::Severity::info;
  if (!warm.empty()) verdicts.insert(verdicts.begin(), warm);
  std::string head =
      result.stopped.empty()
          ? fmt::format("{} levels measured", result.levels.size())
          : fmt::format("stopped early ({}) after {} levels", result.stopped, result.levels.size());
  if (failures > 0) head += fmt::format(", {} failed requests", failures);
  if (cancelled > 0)
    head += fmt::format(", {} requests cancelled by the run's own {}", cancelled,
                        result.stopped.empty() ? "limit or an interrupt" : "stop");
  out.verdict = head;
  for (const std::string& v : verdicts) out.verdict += "; " + v;
  return out;
}

}  // namespace kvaudit::loadbench
