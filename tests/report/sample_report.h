// A report shaped like the ones kvaudit commands build (check + plan + eval
// charts), shared by the report tests. Values are chosen to exercise every
// formatting rule: grouped integers, small doubles, NaN, empty cells, wide text.
#pragma once

#include <cmath>
#include <limits>

#include "report/report.h"

namespace kvaudit::report::testing {

inline Report sample_report() {
  Report report;
  report.command = "check";
  report.title = "kvaudit check: examples/qwen3.5-397b-a17b-nvfp4 on sglang 0.5.9 (TP 8)";
  report.verdict = "FP8 KV cache with unit scales: long-context recall is at risk";
  report.verdict_severity = Severity::critical;
  report.facts = {
      {"engine", "Engine", Value{std::string("sglang 0.5.9")}, ""},
      {"kv_dtype", "Resolved KV dtype", Value{std::string("fp8_e4m3")}, ""},
      {"max_total_tokens", "KV capacity", Value{int64_t{1234567}}, "tokens"},
      {"kv_pool_gib", "KV pool", Value{71.25}, "GiB"},
      {"scales_present", "Scale tensors shipped", Value{false}, ""},
      {"clipped_fraction_pct", "Keys clipped", Value{0.0123}, "%"},
  };
  Table capacity;
  capacity.id = "capacity";
  capacity.title = "Capacity by KV dtype";
  capacity.columns = {{"dtype", "KV dtype", ""},
                      {"cell_bytes_per_token", "Bytes per token", "B"},
                      {"max_tokens", "Max tokens", "tokens"},
                      {"pool_gib", "Pool", "GiB", 2},
                      {"rel_error", "Relative error", "", 4}};
  capacity.rows = {
      {Value{std::string("bf16")}, Value{int64_t{245760}}, Value{int64_t{617283}}, Value{71.25},
       Value{0.0}},
      {Value{std::string("fp8_e4m3")}, Value{int64_t{122880}}, Value{int64_t{1234567}},
       Value{71.25}, Value{0.000123456}},
      {Value{std::string("nvfp4 \xE2\x9A\xA0\xEF\xB8\x8F")}, Value{int64_t{69120}},
       Value{int64_t{2194785}}, Value{71.251}, Value{std::numeric_limits<double>::quiet_NaN()}},
      {Value{std::string("int4 (未校准)")}, Value{}, Value{int64_t{-1}}, Value{-0.0},
       Value{0.0421}},
  };
  capacity.note = "Pool = free GPU memory after weights x mem_fraction_static.";
  report.tables.push_back(capacity);

  Chart bars;
  bars.id = "capacity-by-dtype";
  bars.title = "Token capacity by KV dtype";
  bars.kind = ChartKind::bars;
  bars.x_label = "KV dtype";
  bars.y_label = "tokens";
  bars.x_categories = {"bf16", "fp8_e4m3", "nvfp4"};
  bars.series = {{"max tokens", {617283, 1234567, 2194785}}};
  bars.precision = 0;
  report.charts.push_back(bars);

  Chart concurrency;
  concurrency.id = "concurrency-vs-context";
  concurrency.title = "Concurrent requests vs context length";
  concurrency.kind = ChartKind::lines;
  concurrency.x_label = "context length (tokens)";
  concurrency.y_label = "concurrent requests";
  concurrency.x_values = {4096, 16384, 32768, 65536, 131072, 262144};
  concurrency.log_x = true;
  concurrency.log_y = true;
  concurrency.series = {{"bf16", {150.7, 37.7, 18.8, 9.4, 4.7, 2.35}},
                        {"fp8_e4m3", {301.4, 75.4, 37.7, 18.8, 9.4, 4.7}},
                        {"nvfp4", {535.8, 134.0, 67.0, 33.5, 16.7, 8.4}}};
  report.charts.push_back(concurrency);

  Chart error;
  error.id = "error-vs-context";
  error.title = "Attention output error vs context length";
  error.kind = ChartKind::lines;
  error.x_label = "context length (tokens)";
  error.y_label = "relative RMSE";
  error.x_values = {1024, 4096, 16384, 65536, 131072};
  error.log_x = true;
  error.log_y = true;
  error.precision = 4;
  error.series = {
      {"fp8_e4m3 (scale 1.0)", {0.011, 0.019, 0.034, 0.061, 0.083}},
      {"fp8_e4m3 (calibrated)", {0.0021, 0.0024, 0.0026, 0.0029, 0.0031}},
      {"int4 per-group", {0.031, 0.033, std::numeric_limits<double>::quiet_NaN(), 0.038, 0.040}}};
  report.charts.push_back(error);

  Chart kld;
  kld.id = "kld-by-position";
  kld.title = "KL divergence vs BF16 by position bucket";
  kld.kind = ChartKind::lines;
  kld.x_label = "position bucket (tokens)";
  kld.y_label = "mean KLD (nats)";
  kld.x_categories = {"0-1K", "1K-4K", "4K-16K", "16K-64K"};
  kld.precision = 4;
  kld.series = {{"fp8_e4m3", {0.0012, 0.0019, 0.0041, 0.0093}},
                {"nvfp4", {0.0051, 0.0077, 0.0132, 0.0240}}};
  report.charts.push_back(kld);

  Chart recall;
  recall.id = "recall-heatmap";
  recall.title = "Recall by context length and needle depth (B)";
  recall.kind = ChartKind::heatmap;
  recall.x_label = "context length";
  recall.y_label = "needle depth";
  recall.x_categories = {"8K", "32K", "64K", "128K"};
  recall.precision = 2;
  recall.series = {{"0%", {1.0, 1.0, 0.95, 0.9}},
                   {"50%", {1.0, 0.9, 0.8, 0.6}},
                   {"100%", {1.0, 1.0, 0.9, std::numeric_limits<double>::quiet_NaN()}}};
  report.charts.push_back(recall);

  Chart difference = recall;
  difference.id = "recall-difference";
  difference.title = "Recall difference B - A";
  difference.diverging = true;
  difference.series = {{"0%", {0.0, 0.0, -0.05, -0.1}},
                       {"50%", {0.0, -0.1, -0.2, -0.4}},
                       {"100%", {0.05, 0.0, -0.1, 0.0}}};
  report.charts.push_back(difference);

  Finding unit_scale;
  unit_scale.id = "fp8-unit-scale";
  unit_scale.severity = Severity::critical;
  unit_scale.title = "FP8 KV cache runs with scale 1.0: the checkpoint ships no k_scale/v_scale";
  unit_scale.consequence =
      "Keys above 448 clip and values below 2^-9 flush to zero, so recall degrades with context.";
  unit_scale.evidence = {
      {"hf_quant_config.json", "quantization.kv_cache_quant_algo", "FP8"},
      {"model.safetensors.index.json", "*.k_scale", "(absent in 60 of 60 layers)"}};
  unit_scale.fix = "--kv-cache-dtype bf16 (or calibrate: kvaudit calibrate ... --out scales.json)";
  unit_scale.reference = "sglang python/sglang/srt/layers/quantization/kv_cache.py";
  report.findings.push_back(unit_scale);

  Finding memory;
  memory.id = "mem-fraction-low";
  memory.severity = Severity::warning;
  memory.title = "mem_fraction_static 0.80 leaves 14 GiB per GPU unused";
  memory.consequence = "Capacity is 18% lower than the hardware allows.";
  memory.evidence = {{"launch", "--mem-fraction-static", "0.80"}};
  memory.fix = "--mem-fraction-static 0.88";
  report.findings.push_back(memory);

  Finding hybrid;
  hybrid.id = "hybrid-state";
  hybrid.severity = Severity::info;
  hybrid.title = "45 of 60 layers are Gated DeltaNet: their state does not grow with context";
  hybrid.evidence = {{"config.json", "layer_types", "linear_attention x45, full_attention x15"}};
  report.findings.push_back(hybrid);

  report.notes = {"Capacity assumes no CUDA graph memory beyond the engine default.",
                  "Recall numbers come from 20 needles per cell."};
  report.payload = {{"engine", {{"name", "sglang"}, {"version", "0.5.9"}}},
                    {"resolved_kv", {{"dtype", "fp8_e4m3"}, {"scale_source", "default_1.0"}}}};
  return report;
}

}  // namespace kvaudit::report::testing
