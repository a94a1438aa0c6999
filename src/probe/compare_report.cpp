// The A/B part of the probe report: the statistics per metric, the per-probe table and its KL
// chart, the acceptance gates (JUnit-style), the A/B facts, and the payload's "compare".
#include <fmt/format.h>

#include <cmath>

#include "probe/internal.h"

namespace kvaudit::probe {

using nlohmann::json;
using report::Value;

namespace {

json interval_json(const stats::Interval& i) {
  return json::array({i.low, i.high});
}

// The statistics per metric: the table, and the payload's "metrics".
json add_metrics_table(const CompareSummary& c, report::Report& out) {
  report::Table metrics{"ab_metrics", "A/B per metric, against the control arm", {}, {}, ""};
  metrics.note = fmt::format(
      "Effect: B against A; control: {} against A (the noise floor); excess: effect minus "
      "control per probe, with its {:.0f}% bootstrap interval; p: sign-flip permutation test of "
      "the excess (one-sided for KL), Holm-adjusted over the metrics; needed: paired probes that "
      "would detect the 'sized for' effect with power 80%.",
      c.control ? c.control_label : "nothing (no control arm: floor 0)", 100 * (1 - c.alpha));
  metrics.columns = {{"metric", "Metric", "", 0, false},
                     {"unit", "Unit", "", 0, false},
                     {"probes", "Probes", ""},
                     {"effect", "Effect", "", 5},
                     {"floor", "Control", "", 5},
                     {"excess", "Excess", "", 5},
                     {"low", "Excess low", "", 5},
                     {"high", "Excess high", "", 5},
                     {"p", "p", "", 4},
                     {"p_holm", "p (Holm)", "", 4},
                     {"verdict", "Verdict", "", 0, false},
                     {"detectable", "Sized for", "", 4},
                     {"needed", "Needed", ""}};
  json metrics_json = json::array();
  for (const MetricTest& m : c.metrics) {
    const double scale = m.unit == "points" ? 100.0 : 1.0;
    metrics.rows.push_back(
        {Value(m.metric), Value(m.unit), Value(m.probes), Value(scale * m.effect),
         Value(scale * m.floor), Value(scale * m.excess), Value(scale * m.excess_interval.low),
         Value(scale * m.excess_interval.high), Value(m.test.p_value), Value(m.p_adjusted),
         Value(m.verdict), Value(scale * m.detectable), Value(m.probes_needed)});
    metrics_json.push_back({{"metric", m.metric},
                            {"label", m.label},
                            {"unit", m.unit == "points" ? "fraction" : m.unit},
                            {"probes", m.probes},
                            {"effect", m.effect},
                            {"effect_interval", interval_json(m.effect_interval)},
                            {"floor", m.floor},
                            {"floor_interval", interval_json(m.floor_interval)},
                            {"excess", m.excess},
                            {"excess_interval", interval_json(m.excess_interval)},
                            {"test", m.test.method},
                            {"p_value", m.test.p_value},
                            {"p_adjusted", m.p_adjusted},
                            {"min_attainable_p", m.test.min_attainable_p},
                            {"nonzero_differences", m.test.nonzero},
                            {"verdict", m.verdict},
                            {"detectable", m.detectable},
                            {"probes_needed", m.probes_needed},
                            {"sentence", m.sentence}});
  }
  if (!metrics.rows.empty()) out.tables.push_back(std::move(metrics));
  return metrics_json;
}

// The comparison per probe: the table, and the payload's "probes".
json add_probes_table(const CompareSummary& c, report::Report& out) {
  report::Table table{"compare", "A/B per probe", {}, {}, ""};
  table.note =
      "KL: mean KL(A || B) per position, nats, from top-k log-probs over the union of both "
      "lists plus one bucket for the unlisted mass (a token listed on one side only gets an "
      "equal share of the other side's unlisted mass); it understates the full-vocabulary KL. "
      "Teacher-forced positions are the fixed sequences, or the last prompt tokens and the "
      "expected text; otherwise the greedy tokens up to the first divergence. KL control: the "
      "same estimate between A and the control arm.";
  table.columns = {{"probe", "Probe", "", 0, false},
                   {"first_divergence", "First diverging token", "", 0, false},
                   {"token_a", "A token", "", 0, false},
                   {"token_b", "B token", "", 0, false},
                   {"kl", "KL", "nats", 5},
                   {"kl_control", "KL control", "nats", 5},
                   {"kl_basis", "KL basis", "", 0, false},
                   {"passed_a", "A pass", "", 0, false},
                   {"passed_b", "B pass", "", 0, false}};
  json probes = json::array();
  auto opt = [](const std::optional<double>& v) { return v ? json(*v) : json(); };
  for (const auto& p : c.probes) {
    table.rows.push_back(
        {Value(p.id), p.first_divergence < 0 ? Value("none") : Value(p.first_divergence),
         Value(excerpt(p.token_a, 16)), Value(excerpt(p.token_b, 16)), optional_double(p.kl),
         optional_double(p.kl_control), Value(p.kl_basis), Value(p.passed_a), Value(p.passed_b)});
    probes.push_back({{"id", p.id},
                      {"kind", p.kind},
                      {"first_divergence", p.first_divergence},
                      {"token_a", p.token_a},
                      {"token_b", p.token_b},
                      {"kl", opt(p.kl)},
                      {"kl_control", opt(p.kl_control)},
                      {"kl_positions", p.kl_positions},
                      {"kl_basis", p.kl_basis},
                      {"passed_a", p.passed_a},
                      {"passed_b", p.passed_b},
                      {"passed_control", p.passed_control},
                      {"accuracy_a", opt(p.accuracy_a)},
                      {"accuracy_b", opt(p.accuracy_b)},
                      {"accuracy_control", opt(p.accuracy_control)},
                      {"logprob_per_token_a", opt(p.logprob_a)},
                      {"logprob_per_token_b", opt(p.logprob_b)},
                      {"logprob_per_token_control", opt(p.logprob_control)}});
  }
  out.tables.push_back(std::move(table));
  return probes;
}

// KL per probe, A || B and A || control, as bars (none without a KL estimate).
void add_kl_chart(const CompareSummary& c, report::Report& out) {
  report::Chart kl_chart;
  kl_chart.id = "kl_per_probe";
  kl_chart.title = "KL per probe: A || B and A || control (nats per position, top-k estimate)";
  kl_chart.kind = report::ChartKind::bars;
  kl_chart.x_label = "probe";
  kl_chart.y_label = "KL (nats)";
  kl_chart.precision = 5;
  kl_chart.value_unit = "nats";
  report::Series kl_series{"A || B", {}}, control_series{"A || control", {}};
  for (const auto& p : c.probes)
    if (p.kl) {
      kl_chart.x_categories.push_back(p.id);
      kl_series.y.push_back(*p.kl);
      control_series.y.push_back(p.kl_control.value_or(NAN));
    }
  kl_chart.series.push_back(std::move(kl_series));
  if (c.control) kl_chart.series.push_back(std::move(control_series));
  if (!kl_chart.x_categories.empty()) out.charts.push_back(std::move(kl_chart));
}

// The gates' table and the payload's JUnit-style test cases, one per gate (none without).
json add_gates_table(const CompareSummary& c, report::Report& out) {
  // Gates, JUnit-style: one test case per gate.
  json gates = json::array();
  if (!c.gates.empty()) {
    report::Table gate_table{"gates", "Acceptance gates", {}, {}, ""};
    gate_table.columns = {{"gate", "Gate", "", 0, false},
                          {"status", "Status", "", 0, false},
                          {"settled", "Settled", "", 0, false},
                          {"message", "Message", "", 0, false}};
    for (const GateResult& g : c.gates) {
      gate_table.rows.push_back(
          {Value(g.gate.text), Value(g.status), Value(g.settled), Value(g.message)});
      json test_case = {
          {"name", g.gate.text},
          {"classname", "kvaudit.probe.gate"},
          {"metric", g.gate.metric},
          {"limit", g.gate.limit},
          {"value", g.value ? json(*g.value) : json()},
          {"interval", g.value ? interval_json(g.interval) : json()},
          {"settled", g.settled},
          {"status", g.status},
          {"message", g.message},
          {"failure", g.status == "failed" ? json({{"message", g.message}}) : json()}};
      gates.push_back(std::move(test_case));
    }
    out.tables.push_back(std::move(gate_table));
  }
  return gates;
}

// The A/B facts: verdict, control arm, mean KL, divergence, recall exact match.
void add_compare_facts(const CompareSummary& c, report::Report& out) {
  out.facts.push_back({"verdict_ab", "A/B verdict", Value(c.verdict), ""});
  if (c.control) out.facts.push_back({"control_arm", "Control arm", Value(c.control_label), ""});
  out.facts.push_back({"mean_kl", "Mean KL (A || B)", optional_double(c.mean_kl), "nats", 5});
  out.facts.push_back({"diverged", "Probes whose greedy output differs",
                       Value(fmt::format("{} of {}", c.diverged, c.probes.size())), ""});
  if (c.recall_probes > 0) {
    out.facts.push_back(
        {"recall_exact_a", "A recall exact match", Value(100 * c.recall_exact_a), "%", 1});
    out.facts.push_back(
        {"recall_exact_b", "B recall exact match", Value(100 * c.recall_exact_b), "%", 1});
  }
}

}  // namespace

json add_compare(const RunResult& result, report::Report& out) {
  json compare_json;
  if (!result.compare) return compare_json;
  const CompareSummary& c = *result.compare;
  json metrics_json = add_metrics_table(c, out);
  json probes = add_probes_table(c, out);
  add_kl_chart(c, out);
  json gates = add_gates_table(c, out);
  add_compare_facts(c, out);
  int64_t gates_failed = 0;
  for (const auto& g : c.gates) gates_failed += g.status != "passed";
  compare_json = {
      {"verdict", c.verdict},
      {"reason", c.reason},
      {"better", c.better},
      {"alpha", c.alpha},
      {"control", c.control ? json(c.control_label) : json()},
      {"metrics", std::move(metrics_json)},
      {"gates",
       {{"tests", c.gates.size()}, {"failures", gates_failed}, {"testcases", std::move(gates)}}},
      {"mean_kl", c.mean_kl ? json(*c.mean_kl) : json()},
      {"max_kl", c.max_kl ? json(*c.max_kl) : json()},
      {"diverged", c.diverged},
      {"recall_probes", c.recall_probes},
      {"recall_exact_a", c.recall_exact_a},
      {"recall_exact_b", c.recall_exact_b},
      {"recall_logprob_per_token_a", c.recall_logprob_a ? json(*c.recall_logprob_a) : json()},
      {"recall_logprob_per_token_b", c.recall_logprob_b ? json(*c.recall_logprob_b) : json()},
      {"probes", std::move(probes)}};
  return compare_json;
}

}  // namespace kvaudit::probe
