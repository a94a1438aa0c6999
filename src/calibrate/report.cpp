// calibrate report: per-layer scales and clipping, the carrier chosen and why, the flags.
#include <fmt/format.h>

#include <algorithm>

#include "calibrate/calibrate.h"

namespace kvaudit::calibrate {

namespace {

std::string list_text(const std::vector<float>& values) {
  std::string text;
  for (float value : values) text += fmt::format("{}{:.6g}", text.empty() ? "" : " ", value);
  return text;
}

}  // namespace

void add_to_report(const CalibrationSummary& summary, report::Report& out) {
  using report::Column;
  using report::Value;
  const KvStats& stats = *summary.stats;
  const OverlayResult& overlay = *summary.overlay;
  out.facts.push_back({"stats_source", "K/V maxima from", Value(stats.source), ""});
  out.facts.push_back({"tokens", "Calibration tokens", Value(stats.tokens), "tokens"});
  out.facts.push_back(
      {"granularity", "Granularity",
       Value(std::string(summary.options.granularity == Granularity::tensor ? "tensor" : "head")),
       ""});
  out.facts.push_back(
      {"margin", "Margin (scale = amax x margin / 448)", Value(summary.options.margin), "", 3});
  out.facts.push_back({"statistic", "Maximum used",
                       Value(summary.options.use_percentile
                                 ? fmt::format("p{:g} of per-token head maxima", stats.percentile)
                                 : std::string("maximum")),
                       ""});
  out.facts.push_back(
      {"carrier", "Carrier", Value(std::string(carrier_name(overlay.carrier))), ""});
  out.facts.push_back({"out_dir", "Overlay folder", Value(summary.request.out_dir.string()), ""});
  std::string flags;
  for (const std::string& flag : overlay.launch_flags) flags += (flags.empty() ? "" : " ") + flag;
  out.facts.push_back({"launch_flags", "Launch flags", Value(flags), ""});

  report::Table layers;
  layers.id = "scales";
  layers.title = "Scales per layer (FP8 E4M3)";
  layers.columns = {Column{"layer", "Layer", "", 0, false}, Column{"k_amax", "K amax", "", 4},
                    Column{"k_scale", "K scale", ""}, Column{"v_amax", "V amax", "", 4},
                    Column{"v_scale", "V scale", ""}};
  const bool clipping = summary.clipping != nullptr;
  if (clipping) {
    layers.columns.push_back(Column{"k_saturated_pct", "K clipped", "%", 4});
    layers.columns.push_back(Column{"v_saturated_pct", "V clipped", "%", 4});
    layers.columns.push_back(Column{"k_flushed_pct", "K flushed", "%", 4});
    layers.columns.push_back(Column{"v_flushed_pct", "V flushed", "%", 4});
  }
  report::Chart chart;
  chart.id = "scales_by_layer";
  chart.title = "K and V scales per layer";
  chart.kind = report::ChartKind::bars;
  chart.x_label = "layer";
  chart.y_label = "scale";
  chart.series = {{"K scale", {}}, {"V scale", {}}};
  chart.precision = 6;
  for (const LayerScales& layer : *summary.scales) {
    std::vector<Value> row = {Value(int64_t{layer.layer}), Value(double(layer.k_amax)),
                              Value(list_text(layer.k_scale)), Value(double(layer.v_amax)),
                              Value(list_text(layer.v_scale))};
    if (clipping) {
      auto it = std::find_if(summary.clipping->begin(), summary.clipping->end(),
                             [&](const LayerClipping& c) { return c.layer == layer.layer; });
      LayerClipping c = it == summary.clipping->end() ? LayerClipping{} : *it;
      row.push_back(Value(100.0 * c.k_saturated));
      row.push_back(Value(100.0 * c.v_saturated));
      row.push_back(Value(100.0 * c.k_flushed));
      row.push_back(Value(100.0 * c.v_flushed));
    }
    layers.rows.push_back(std::move(row));
    chart.x_categories.push_back(std::to_string(layer.layer));
    chart.series[0].y.push_back(*std::max_element(layer.k_scale.begin(), layer.k_scale.end()));
    chart.series[1].y.push_back(*std::max_element(layer.v_scale.begin(), layer.v_scale.end()));
  }
  layers.note = clipping ? "clipped: elements above 448 x scale (saturated); flushed: non-zero "
                           "elements that encode to zero; both on the calibration text"
                         : "clipping not measured: the maxima came from a statistics file";
  out.tables.push_back(std::move(layers));
  out.charts.push_back(std::move(chart));

  report::Table attempts;
  attempts.id = "carriers";
  attempts.title = "How the scales reach the engine";
  attempts.columns = {Column{"carrier", "Carrier", ""}, Column{"loaded", "Loaded", ""},
                      Column{"why", "Engine data says", ""}, Column{"reference", "Reference", ""}};
  for (const CarrierAttempt& attempt : overlay.attempts)
    attempts.rows.push_back({Value(std::string(carrier_name(attempt.carrier))),
                             Value(std::string(attempt.works ? "yes" : "no")), Value(attempt.why),
                             Value(attempt.reference)});
  out.tables.push_back(std::move(attempts));

  report::Table files;
  files.id = "files";
  files.title = "Overlay files (place them beside the original checkpoint files)";
  files.columns = {Column{"file", "File", ""}};
  for (const auto& file : overlay.files) files.rows.push_back({Value(file.string())});
  out.tables.push_back(std::move(files));
  for (const std::string& note : overlay.notes) out.notes.push_back(note);

  nlohmann::json layer_json = nlohmann::json::array();
  for (const LayerScales& layer : *summary.scales)
    layer_json.push_back({{"layer", layer.layer},
                          {"k_scale", layer.k_scale},
                          {"v_scale", layer.v_scale},
                          {"k_amax", layer.k_amax},
                          {"v_amax", layer.v_amax}});
  out.payload["calibration"] = {
      {"carrier", carrier_name(overlay.carrier)},
      {"launch_flags", overlay.launch_flags},
      {"files",
       [&] {
         nlohmann::json list = nlohmann::json::array();
         for (const auto& file : overlay.files) list.push_back(file.string());
         return list;
       }()},
      {"tensors", overlay.tensor_names},
      {"resolved_kv",
       {{"kv_cache_dtype", overlay.resolved.kv_cache_dtype},
        {"scale_source", engines::scale_source_name(overlay.resolved.scale_source)}}},
      {"layers", std::move(layer_json)}};
  out.verdict = fmt::format(
      "{} {} will load these scales ({}, {}); launch with: {}", summary.request.engine,
      summary.request.engine_version.empty() ? "(latest known)" : summary.request.engine_version,
      carrier_name(overlay.carrier), engines::scale_source_name(overlay.resolved.scale_source),
      flags);
  out.verdict_severity = report::Severity::info;
}

}  // namespace kvaudit::calibrate
