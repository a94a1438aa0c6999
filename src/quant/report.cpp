// Turns a QuantAnalysis into the report `kvaudit quant` prints: a tensor-metrics table, an
// attention table and error-vs-context charts, plus a verdict naming the mechanisms seen
// (saturation, NaN, flush to zero) per format.
#include <cmath>

#include <fmt/format.h>

#include "quant/quant.h"

namespace kvaudit::quant {
namespace {

double percent(int64_t part, int64_t whole) {
  return whole ? 100.0 * double(part) / double(whole) : 0.0;
}

report::Value number(double value) {
  if (!std::isfinite(value)) return std::string(std::isnan(value) ? "NaN" : "inf");
  return value;
}

std::string scale_text(const TensorMetrics& m, const numerics::KvFormat& format) {
  using numerics::ScaleStrategy;
  switch (format.strategy) {
    case ScaleStrategy::none:
      return "1.0";
    case ScaleStrategy::tensor:
      return fmt::format("{:.4g}", m.scales.at(0));
    case ScaleStrategy::head:
    case ScaleStrategy::channel: {
      float lo = m.scales.at(0), hi = lo;
      for (float s : m.scales) lo = std::min(lo, s), hi = std::max(hi, s);
      return fmt::format("{:.3g}..{:.3g}", lo, hi);
    }
    case ScaleStrategy::block:
      return format.kind == numerics::KvFormatKind::nvfp4
                 ? fmt::format("block E4M3 x {:.3g}", m.scales.at(0))
                 : "block E8M0";
    default:
      return "dynamic";
  }
}

// What each format does to the K and V values (table), and the same as JSON.
nlohmann::json add_tensor_table(const QuantAnalysis& analysis, report::Report& r) {
  report::Table tensors;
  tensors.id = "tensor_metrics";
  tensors.title = "What each format does to the K and V values";
  tensors.columns = {{"format", "format", "", 0},
                     {"tensor", "tensor", "", 0},
                     {"scale", "scale", "", 0},
                     {"bits_per_element", "bits/elem", "", 2},
                     {"relative_rmse", "rel RMSE", "", 4},
                     {"snr_db", "SNR", "dB", 1},
                     {"max_abs_error", "max |err|", "", 4},
                     {"saturated_pct", "saturated", "%", 4},
                     {"nan_pct", "became NaN", "%", 4},
                     {"inf_pct", "became inf", "%", 4},
                     {"flushed_pct", "flushed to 0", "%", 3},
                     {"subnormal_pct", "subnormal", "%", 2}};
  nlohmann::json tensor_json = nlohmann::json::array();
  for (size_t i = 0; i < analysis.tensors.size(); ++i) {
    const TensorMetrics& m = analysis.tensors[i];
    const numerics::KvFormat& format = analysis.formats[i / 2];
    const int64_t n = m.counts.elements;
    tensors.rows.push_back({m.format, std::string(numerics::kv_role_name(m.role)),
                            scale_text(m, format), m.bits_per_element,
                            number(m.error.relative_rmse()), number(m.error.snr_db()),
                            m.error.max_abs_error, percent(m.counts.saturated, n),
                            percent(m.counts.became_nan, n), percent(m.counts.became_inf, n),
                            percent(m.counts.flushed_to_zero, n), percent(m.counts.subnormal, n)});
    tensor_json.push_back({{"format", m.format},
                           {"tensor", numerics::kv_role_name(m.role)},
                           {"scales", m.scales},
                           {"bits_per_element", m.bits_per_element},
                           {"relative_rmse", m.error.relative_rmse()},
                           {"snr_db", m.error.snr_db()},
                           {"max_abs_error", m.error.max_abs_error},
                           {"elements", n},
                           {"saturated", m.counts.saturated},
                           {"became_nan", m.counts.became_nan},
                           {"became_inf", m.counts.became_inf},
                           {"flushed_to_zero", m.counts.flushed_to_zero},
                           {"subnormal", m.counts.subnormal},
                           {"nonfinite_input", m.counts.nonfinite_input}});
  }
  tensors.note =
      "saturated: clamped to the largest finite value; became NaN/inf: a finite input the cast "
      "turned into NaN/inf (torch semantics, +nan); flushed to 0: nonzero input stored as zero; "
      "subnormal: stored with reduced relative precision. Static scales are calibrated on the "
      "analysed tokens (amax / max finite).";
  r.tables.push_back(std::move(tensors));
  return tensor_json;
}

// Attention error vs context length (table), and the same as JSON.
nlohmann::json add_attention_table(const QuantAnalysis& analysis, report::Report& r) {
  report::Table attention;
  attention.id = "attention_metrics";
  attention.title = "Attention error vs context length";
  attention.columns = {{"format", "format", "", 0},
                       {"context_tokens", "context", "tokens", 0},
                       {"score_rel_rmse", "score rel RMSE", "", 4},
                       {"kl_mean", "KL mean", "nats", 6},
                       {"kl_max", "KL max", "nats", 6},
                       {"topk_agreement", "top-k agree", "", 4},
                       {"output_rel_error", "output rel err", "", 4},
                       {"nonfinite_pct", "NaN outputs", "%", 2}};
  nlohmann::json attention_json = nlohmann::json::array();
  for (const AttentionPoint& p : analysis.attention) {
    attention.rows.push_back({p.format, p.context_tokens, number(p.score_rel_rmse),
                              number(p.kl_mean), number(p.kl_max), number(p.topk_agreement),
                              number(p.output_rel_error), percent(p.nonfinite_queries, p.queries)});
    attention_json.push_back({{"format", p.format},
                              {"context_tokens", p.context_tokens},
                              {"queries", p.queries},
                              {"nonfinite_queries", p.nonfinite_queries},
                              {"score_rel_rmse", p.score_rel_rmse},
                              {"kl_mean", p.kl_mean},
                              {"kl_max", p.kl_max},
                              {"topk_agreement", p.topk_agreement},
                              {"output_rel_error", p.output_rel_error}});
  }
  attention.note =
      "Queries are the decode steps right after each context; KL(p_ref || p_format) "
      "per query in nats; top-k agreement is the overlap of the k highest-scoring "
      "keys; rows with NaN outputs leave those queries out of the averages.";
  r.tables.push_back(std::move(attention));
  return attention_json;
}

// Output error and KL vs context, one line per format.
void add_error_charts(const QuantAnalysis& analysis, report::Report& r) {
  for (auto [id, title, label, pick] :
       {std::tuple{"output_error_vs_context", "Attention output relative error vs context",
                   "output rel err", +[](const AttentionPoint& p) { return p.output_rel_error; }},
        std::tuple{"kl_vs_context", "Softmax KL divergence vs context", "KL mean (nats)",
                   +[](const AttentionPoint& p) { return p.kl_mean; }}}) {
    report::Chart chart;
    chart.id = id;
    chart.title = title;
    chart.kind = report::ChartKind::lines;
    chart.x_label = "context (tokens)";
    chart.y_label = label;
    chart.log_x = true;
    chart.log_y = true;
    for (const numerics::KvFormat& format : analysis.formats) {
      report::Series series{format.spec, {}};
      for (const AttentionPoint& p : analysis.attention) {
        if (p.format != format.spec) continue;
        if (&format == &analysis.formats.front())
          chart.x_values.push_back(double(p.context_tokens));
        series.y.push_back(pick(p));
      }
      chart.series.push_back(std::move(series));
    }
    r.charts.push_back(std::move(chart));
  }
}

// The verdict names the mechanisms per format (NaN, inf, saturation, flush to zero).
void set_quant_verdict(const QuantAnalysis& analysis, report::Report& r) {
  std::vector<std::string> problems;
  for (size_t i = 0; i < analysis.tensors.size(); ++i) {
    const TensorMetrics& m = analysis.tensors[i];
    const int64_t n = m.counts.elements;
    std::vector<std::string> what;
    if (m.counts.became_nan)
      what.push_back(fmt::format("{:.3g}% NaN", percent(m.counts.became_nan, n)));
    if (m.counts.became_inf)
      what.push_back(fmt::format("{:.3g}% inf", percent(m.counts.became_inf, n)));
    if (m.counts.saturated)
      what.push_back(fmt::format("{:.3g}% saturated", percent(m.counts.saturated, n)));
    if (percent(m.counts.flushed_to_zero, n) >= 0.01)
      what.push_back(fmt::format("{:.3g}% flushed to zero", percent(m.counts.flushed_to_zero, n)));
    if (!what.empty()) {
      problems.push_back(fmt::format("{} {}: {}", m.format, numerics::kv_role_name(m.role),
                                     fmt::join(what, ", ")));
    }
  }
  if (problems.empty()) {
    r.verdict = "No saturation, NaN or flush-to-zero in any format analysed.";
  } else {
    r.verdict = fmt::format("Silent damage: {}.", fmt::join(problems, "; "));
    r.verdict_severity = report::Severity::warning;
  }
}

}  // namespace

report::Report to_report(const QuantAnalysis& analysis) {
  report::Report r;
  r.command = "quant";
  r.title = fmt::format("kvaudit quant: {}", analysis.source);
  r.facts.push_back({"source", "Input", analysis.source, ""});
  r.facts.push_back({"tokens", "Tokens analysed", analysis.tokens, "tokens"});
  r.facts.push_back({"kv_heads", "KV heads x head_dim",
                     fmt::format("{} x {}", analysis.shape.kv_heads, analysis.shape.head_dim), ""});
  r.facts.push_back({"q_heads", "Query heads", int64_t(analysis.shape.q_heads), ""});
  r.facts.push_back({"simd", "SIMD target", numerics::simd_target_name(), ""});
  if (analysis.attention_seconds > 0) {
    r.facts.push_back({"attention_gflops", "Attention analysis throughput",
                       analysis.attention_flops / analysis.attention_seconds / 1e9, "GFLOP/s"});
  }

  const nlohmann::json tensor_json = add_tensor_table(analysis, r);

  const nlohmann::json attention_json = add_attention_table(analysis, r);

  add_error_charts(analysis, r);

  set_quant_verdict(analysis, r);
  r.payload["tensors"] = tensor_json;
  r.payload["attention"] = attention_json;
  r.payload["attention_flops"] = analysis.attention_flops;
  r.payload["attention_seconds"] = analysis.attention_seconds;
  r.payload["calibration_seconds"] = analysis.calibration_seconds;
  r.payload["load_seconds"] = analysis.load_seconds;
  r.payload["codec_seconds"] = analysis.codec_seconds;
  r.payload["tensor_error_seconds"] = analysis.tensor_error_seconds;
  return r;
}

}  // namespace kvaudit::quant
