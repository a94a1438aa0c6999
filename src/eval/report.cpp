// Turns perplexity/KLD and recall results into a report::Report: tables in llama.cpp's terms,
// a KLD-by-position chart, a recall heatmap per format, and the full numbers as JSON payload.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>

#include "eval/eval.h"

namespace kvaudit::eval {

namespace {

using report::Column;
using report::Value;

std::string percent_label(double fraction) {
  if (fraction >= 1.0) return "max";
  if (fraction <= 0.0) return "min";
  if (fraction == 0.5) return "median";
  return fmt::format("{:g}%", fraction * 100.0);
}

nlohmann::json summary_json(const KldSummary& s) {
  nlohmann::json j = {{"count", s.count},
                      {"nonfinite", s.nonfinite},
                      {"ppl_base", s.ppl_base},
                      {"ppl", s.ppl_test},
                      {"ppl_ratio", s.ppl_ratio},
                      {"ppl_ratio_error", s.ppl_ratio_error},
                      {"kld_mean", s.kld_mean},
                      {"kld_mean_error", s.kld_mean_error},
                      {"kld_median", s.kld_median},
                      {"delta_p_mean", s.delta_p_mean},
                      {"delta_p_rms", s.delta_p_rms},
                      {"delta_p_rms_error", s.delta_p_rms_error},
                      {"same_top", s.same_top},
                      {"same_top_error", s.same_top_error}};
  for (const Percentile& p : s.kld_percentiles)
    j["kld_percentiles"][percent_label(p.fraction)] = p.value;
  for (const Percentile& p : s.delta_p_percentiles)
    j["delta_p_percentiles"][percent_label(p.fraction)] = p.value;
  return j;
}

double percentile_value(const std::vector<Percentile>& values, double fraction) {
  for (const Percentile& p : values)
    if (p.fraction == fraction) return p.value;
  return 0.0;
}

// The run's shape: chunks, the scored positions, the SIMD target, how the state was stored.
void add_perplexity_facts(const PerplexityResult& result, report::Report& out) {
  out.facts.push_back({"chunks", "Chunks x context",
                       Value(fmt::format("{} x {} tokens", result.chunks, result.ctx_tokens)), ""});
  out.facts.push_back({"scored_positions", "Scored positions per chunk",
                       Value(fmt::format("[{}, {})", result.first_scored, result.ctx_tokens - 1)),
                       ""});
  out.facts.push_back({"simd_target", "SIMD target", Value(result.simd_target), ""});
  if (result.state_axis)
    out.facts.push_back(
        {"state_store", "Recurrent state stored (rounded)",
         Value(result.state_store_every_tokens == 0
                   ? std::string("at the end of each forward call (one prefill chunk)")
               : result.state_store_every_tokens == 1
                   ? std::string("after every token, as decode stores it")
                   : fmt::format("every {} tokens and at the end of each call, as a "
                                 "chunked prefill stores it",
                                 result.state_store_every_tokens)),
         ""});
}

// The main table's title and columns, a row per format to come.
report::Table formats_table(const PerplexityResult& result) {
  report::Table main{
      "formats",
      (result.state_axis ? "KV formats x recurrent state precisions against the baseline "
                         : "KV formats against the baseline ") +
          result.formats[0].label(),
      {},
      {},
      ""};
  main.columns = {{"format", "format", "", 0},
                  {"kv_bytes_per_token", "KV bytes/token", "B", 0},
                  {"ppl", "PPL", "", 4},
                  {"ppl_ratio", "PPL ratio", "", 5},
                  {"ppl_ratio_error", "+-", "", 5},
                  {"kld_mean", "mean KLD", "", 6},
                  {"kld_mean_error", "+-", "", 6},
                  {"kld_median", "median KLD", "", 6},
                  {"kld_p99", "99% KLD", "", 6},
                  {"delta_p_rms", "RMS dp", "%", 3},
                  {"same_top", "same top", "%", 2},
                  {"same_top_error", "+-", "%", 2},
                  {"tokens_per_second", "tokens/s", "", 1},
                  {"nonfinite", "NaN/inf positions", "", 0}};
  if (result.state_axis)
    main.columns.insert(main.columns.begin() + 2, {"state_bytes", "state bytes", "B", 0});
  return main;
}

}  // namespace

void add_to_report(const PerplexityResult& result, report::Report& out) {
  add_perplexity_facts(result, out);

  report::Table main = formats_table(result);
  report::Table kld{
      "kld_percentiles", "KL divergence percentiles", {{"format", "format", "", 0}}, {}, ""};
  report::Table delta{"delta_p_percentiles",
                      "Delta-p percentiles (p_Q - p_base of the correct token, %)",
                      {{"format", "format", "", 0}},
                      {},
                      ""};
  report::Table counts{"encode_counts", "What encoding did to K/V elements", {}, {}, ""};
  counts.columns = {{"format", "format", "", 0},         {"elements", "elements", "", 0},
                    {"saturated", "saturated", "", 0},   {"became_nan", "became NaN", "", 0},
                    {"became_inf", "became inf", "", 0}, {"flushed_to_zero", "flushed to 0", "", 0},
                    {"subnormal", "subnormal", "", 0},   {"calibration", "static scales", "", 0}};
  for (const Percentile& p : result.formats[0].summary.kld_percentiles)
    kld.columns.push_back({"p" + percent_label(p.fraction), percent_label(p.fraction), "", 6});
  for (const Percentile& p : result.formats[0].summary.delta_p_percentiles)
    delta.columns.push_back({"p" + percent_label(p.fraction), percent_label(p.fraction), "%", 3});

  report::Chart by_position{"kld_by_position",
                            "Mean KLD by position in the chunk",
                            report::ChartKind::lines,
                            "position in chunk (bucket middle)",
                            "mean KLD (nats)",
                            {},
                            {},
                            false,
                            true,
                            {}};
  for (const PositionBucket& b : result.formats[0].buckets)
    by_position.x_values.push_back(0.5 * static_cast<double>(b.first_position + b.last_position));
  report::Table buckets{"kld_by_position",
                        "Damage by position (does it grow with distance?)",
                        {{"format", "format", "", 0},
                         {"positions", "positions", "", 0},
                         {"kld_mean", "mean KLD", "", 6},
                         {"same_top", "same top", "%", 2},
                         {"ppl_ratio", "PPL ratio", "", 5}},
                        {},
                        ""};

  nlohmann::json payload = nlohmann::json::array();
  for (const FormatResult& f : result.formats) {
    const KldSummary& s = f.summary;
    main.rows.push_back({f.label() + (f.baseline ? " (baseline)" : ""), Value(f.kv_bytes_per_token),
                         s.ppl_test, s.ppl_ratio, s.ppl_ratio_error, s.kld_mean, s.kld_mean_error,
                         s.kld_median, percentile_value(s.kld_percentiles, 0.99),
                         100.0 * s.delta_p_rms, 100.0 * s.same_top, 100.0 * s.same_top_error,
                         f.tokens_per_second, Value(s.nonfinite)});
    if (result.state_axis) main.rows.back().insert(main.rows.back().begin() + 2, f.state_bytes);
    std::vector<Value> k{f.label()}, d{f.label()};
    for (const Percentile& p : s.kld_percentiles) k.push_back(p.value);
    for (const Percentile& p : s.delta_p_percentiles) d.push_back(100.0 * p.value);
    if (!f.baseline) {
      kld.rows.push_back(k);
      delta.rows.push_back(d);
    }
    counts.rows.push_back({f.label(), Value(f.counts.elements), Value(f.counts.saturated),
                           Value(f.counts.became_nan), Value(f.counts.became_inf),
                           Value(f.counts.flushed_to_zero), Value(f.counts.subnormal),
                           f.calibration.empty() ? Value(std::string("-")) : Value(f.calibration)});
    report::Series series{f.label(), {}};
    nlohmann::json bucket_json = nlohmann::json::array();
    for (const PositionBucket& b : f.buckets) {
      series.y.push_back(b.summary.kld_mean);
      if (!f.baseline)
        buckets.rows.push_back({f.label(), fmt::format("{}-{}", b.first_position, b.last_position),
                                b.summary.kld_mean, 100.0 * b.summary.same_top,
                                b.summary.ppl_ratio});
      bucket_json.push_back({{"first_position", b.first_position},
                             {"last_position", b.last_position},
                             {"summary", summary_json(b.summary)}});
    }
    if (!f.baseline) by_position.series.push_back(series);
    payload.push_back({{"format", f.spec},
                       {"baseline", f.baseline},
                       {"kv_bytes_per_token", f.kv_bytes_per_token},
                       {"tokens_per_second", f.tokens_per_second},
                       {"calibration", f.calibration},
                       {"summary", summary_json(s)},
                       {"buckets", bucket_json}});
    if (result.state_axis) {
      payload.back()["state_dtype"] = f.state;
      payload.back()["state_bytes"] = f.state_bytes;
    }
  }
  main.note =
      "llama.cpp perplexity --kl-divergence semantics: PPL ratio = exp(mean(ln p_base - ln p_Q)); "
      "errors are one standard error; same top = argmax agreement.";
  out.tables.push_back(main);
  if (!kld.rows.empty()) out.tables.push_back(kld);
  if (!delta.rows.empty()) out.tables.push_back(delta);
  if (!buckets.rows.empty()) out.tables.push_back(buckets);
  out.tables.push_back(counts);
  if (!by_position.series.empty()) out.charts.push_back(by_position);
  out.payload["perplexity"] = {{"chunks", result.chunks},
                               {"ctx_tokens", result.ctx_tokens},
                               {"first_scored", result.first_scored},
                               {"text_tokens", result.text_tokens},
                               {"formats", payload}};
}

void add_to_report(const RecallResult& result, report::Report& out) {
  for (const std::string& note : result.notes) out.notes.push_back(note);
  if (result.formats.empty()) return;
  report::Table table{"recall",
                      "Long-range recall: reproduce a signature defined depth tokens earlier",
                      {{"format", "format", "", 0},
                       {"ctx", "context", "tokens", 0},
                       {"depth", "depth", "tokens", 0},
                       {"cases", "cases", "", 0},
                       {"logprob", "log-prob/token", "nats", 4},
                       {"exact", "exact match", "%", 1},
                       {"control_logprob", "control log-prob/token", "nats", 4},
                       {"control_exact", "control exact", "%", 1}},
                      {},
                      ""};
  table.note =
      "Teacher-forced over the argument tokens. Control: the same prompt with the "
      "definition replaced by an unrelated function (the chance level).";
  nlohmann::json payload = nlohmann::json::array();
  for (const RecallFormatResult& f : result.formats) {
    report::Chart heat{"recall_" + f.spec + (f.state.empty() ? "" : "_" + f.state + "_state"),
                       "Recall exact match (%) for " + f.label(),
                       report::ChartKind::heatmap,
                       "context (tokens)",
                       "depth (tokens)",
                       {},
                       {},
                       false,
                       false,
                       {}};
    std::vector<int64_t> ctxs, depths;
    for (const RecallCell& c : f.cells) {
      if (std::find(ctxs.begin(), ctxs.end(), c.ctx_tokens) == ctxs.end())
        ctxs.push_back(c.ctx_tokens);
      if (std::find(depths.begin(), depths.end(), c.depth_tokens) == depths.end())
        depths.push_back(c.depth_tokens);
    }
    for (int64_t ctx : ctxs) heat.x_categories.push_back(std::to_string(ctx));
    for (int64_t depth : depths) {
      report::Series row{std::to_string(depth), std::vector<double>(ctxs.size(), NAN)};
      for (const RecallCell& c : f.cells)
        if (c.depth_tokens == depth)
          row.y[std::find(ctxs.begin(), ctxs.end(), c.ctx_tokens) - ctxs.begin()] =
              100.0 * c.exact_match;
      heat.series.push_back(row);
    }
    out.charts.push_back(heat);
    nlohmann::json cells = nlohmann::json::array();
    for (const RecallCell& c : f.cells) {
      const bool has_control = &f == &result.formats[0];
      table.rows.push_back({f.label(), Value(c.ctx_tokens), Value(c.depth_tokens),
                            Value(int64_t{c.cases}), c.mean_logprob_per_token,
                            100.0 * c.exact_match,
                            has_control ? Value(c.control_logprob_per_token) : Value(),
                            has_control ? Value(100.0 * c.control_exact_match) : Value()});
      cells.push_back({{"ctx_tokens", c.ctx_tokens},
                       {"depth_tokens", c.depth_tokens},
                       {"cases", c.cases},
                       {"logprob_per_token", c.mean_logprob_per_token},
                       {"exact_match", c.exact_match},
                       {"control_logprob_per_token", c.control_logprob_per_token},
                       {"control_exact_match", c.control_exact_match}});
    }
    payload.push_back({{"format", f.spec}, {"cells", cells}});
    if (!f.state.empty()) payload.back()["state_dtype"] = f.state;
  }
  out.tables.push_back(table);
  out.payload["recall"] = payload;
}

}  // namespace kvaudit::eval

namespace kvaudit::eval {

void add_to_report(const TaskResult& result, report::Report& out) {
  for (const std::string& note : result.notes) out.notes.push_back(note);
  if (result.formats.empty()) return;
  report::Table table{"tasks",
                      "Long-context tasks: near-duplicate needles asked in rounds",
                      {{"format", "format", "", 0},
                       {"task", "task", "", 0},
                       {"ctx", "context", "tokens", 0},
                       {"cases", "cases", "", 0},
                       {"rounds", "rounds", "", 0},
                       {"accuracy", "accuracy", "%", 1},
                       {"low", "95% low", "%", 1},
                       {"high", "95% high", "%", 1},
                       {"logprob", "log-prob/token", "nats", 4}},
                      {},
                      ""};
  table.note =
      "mrcr: call near-duplicate functions (same stem and body, suffix _vN) in rounds; "
      "toolcall: re-issue near-duplicate tools' calls as JSON arguments. A round is exact when "
      "every answer token is the argmax, or for a text token that runs past the answer, the "
      "argmax writes the rest of it (teacher-forced after the earlier rounds' correct answers); "
      "interval: Wilson.";
  nlohmann::json payload = nlohmann::json::array();
  for (const TaskFormatResult& f : result.formats) {
    nlohmann::json cells = nlohmann::json::array();
    for (const TaskCell& c : f.cells) {
      table.rows.push_back({f.spec, c.kind, Value(c.ctx_tokens), Value(int64_t{c.cases}),
                            Value(c.rounds), 100.0 * c.accuracy, 100.0 * c.accuracy_low,
                            100.0 * c.accuracy_high, c.mean_logprob_per_token});
      cells.push_back({{"task", c.kind},
                       {"ctx_tokens", c.ctx_tokens},
                       {"cases", c.cases},
                       {"rounds", c.rounds},
                       {"rounds_exact", c.rounds_exact},
                       {"accuracy", c.accuracy},
                       {"accuracy_interval", {c.accuracy_low, c.accuracy_high}},
                       {"logprob_per_token", c.mean_logprob_per_token}});
    }
    payload.push_back({{"format", f.spec}, {"cells", cells}});
  }
  out.tables.push_back(table);
  out.payload["tasks"] = payload;
}

void set_eval_verdict(const PerplexityResult* perplexity, const RecallResult* recall,
                      report::Report& out, const TaskResult* tasks) {
  using report::Severity;
  Severity severity = Severity::info;
  std::vector<std::string> parts;
  if (perplexity != nullptr && perplexity->formats.size() > 1) {
    const FormatResult* worst = nullptr;
    for (const FormatResult& f : perplexity->formats) {
      if (f.baseline) continue;
      const KldSummary& s = f.summary;
      if (s.nonfinite > 0 || s.ppl_ratio >= 1.05 || s.same_top < 0.90) {
        severity = Severity::critical;
      } else if ((s.ppl_ratio >= 1.01 || s.kld_mean >= 0.01) && severity == Severity::info) {
        severity = Severity::warning;
      }
      if (worst == nullptr || s.nonfinite > worst->summary.nonfinite ||
          (s.nonfinite == worst->summary.nonfinite && s.kld_mean > worst->summary.kld_mean))
        worst = &f;
    }
    const KldSummary& s = worst->summary;
    parts.push_back(fmt::format(
        "worst KV format {} vs {}: PPL ratio {:.4f}, mean KLD {:.5f}, "
        "same top {:.2f}%{}",
        worst->label(), perplexity->formats[0].label(), s.ppl_ratio, s.kld_mean, 100.0 * s.same_top,
        s.nonfinite > 0 ? fmt::format(", {} NaN/inf positions", s.nonfinite) : std::string()));
  }
  if (recall != nullptr && recall->formats.size() > 1) {
    double worst_drop = 0.0;
    std::string worst_spec;
    for (size_t f = 1; f < recall->formats.size(); ++f)
      for (size_t c = 0; c < recall->formats[f].cells.size(); ++c) {
        double drop =
            recall->formats[0].cells[c].exact_match - recall->formats[f].cells[c].exact_match;
        if (drop > worst_drop) {
          worst_drop = drop;
          worst_spec = recall->formats[f].label();
        }
      }
    if (worst_drop >= 0.20 && severity == Severity::info) severity = Severity::warning;
    parts.push_back(worst_spec.empty()
                        ? std::string("recall: no format below the baseline in any cell")
                        : fmt::format("recall: {} loses up to {:.0f} points of exact match",
                                      worst_spec, 100.0 * worst_drop));
  }
  if (tasks != nullptr && tasks->formats.size() > 1) {
    double worst_drop = 0.0;
    std::string worst;
    for (size_t f = 1; f < tasks->formats.size(); ++f)
      for (size_t c = 0; c < tasks->formats[f].cells.size(); ++c) {
        const TaskCell& base = tasks->formats[0].cells[c];
        const TaskCell& cell = tasks->formats[f].cells[c];
        if (base.accuracy - cell.accuracy > worst_drop) {
          worst_drop = base.accuracy - cell.accuracy;
          worst =
              fmt::format("{} loses {:.0f} points of {} accuracy at {} tokens",
                          tasks->formats[f].spec, 100.0 * worst_drop, cell.kind, cell.ctx_tokens);
        }
      }
    if (worst_drop >= 0.20 && severity == Severity::info) severity = Severity::warning;
    parts.push_back(worst.empty() ? std::string("tasks: no format below the baseline in any cell")
                                  : "tasks: " + worst);
  }
  out.verdict_severity = severity;
  out.verdict = parts.empty() ? "evaluated one format (nothing to compare against)"
                              : fmt::format("{}", fmt::join(parts, "; "));
}

report::Report to_report(const EvalSummary& summary, const PerplexityResult* perplexity,
                         const RecallResult* recall, const TaskResult* tasks) {
  report::Report out;
  out.command = "eval";
  out.title =
      fmt::format("kvaudit eval: {} ({} layers, {} KV heads x {}, {} weights)", summary.model_dir,
                  summary.num_layers, summary.num_kv_heads, summary.head_dim, summary.weight_type);
  out.facts.push_back({"baseline", "Baseline KV format", report::Value(summary.baseline), ""});
  out.facts.push_back({"threads", "Threads", report::Value(int64_t{summary.threads}), ""});
  if (!summary.layer_mix.empty())
    out.facts.push_back({"layer_mix", "Layers", report::Value(summary.layer_mix), ""});
  for (const std::string& note : summary.notes) out.notes.push_back(note);
  if (perplexity) add_to_report(*perplexity, out);
  if (recall) add_to_report(*recall, out);
  if (tasks) add_to_report(*tasks, out);
  set_eval_verdict(perplexity, recall, out, tasks);
  return out;
}

}  // namespace kvaudit::eval
