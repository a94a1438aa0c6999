// The `check` report: facts about model, launch and resolution; the scale table;
// findings; and the machine payload (engine, resolved_kv, model).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "audit/audit.h"

namespace kvaudit::audit {

namespace {

using checkpoint::LayerKind;
using nlohmann::json;
using report::Fact;
using report::Severity;

std::string layer_summary(const checkpoint::ModelFacts& model) {
  std::map<LayerKind, int> counts;
  for (const auto& layer : model.layers) ++counts[layer.kind];
  std::string text = fmt::format("{} layers", model.layers.size());
  for (const auto& [kind, count] : counts)
    text += fmt::format(", {} {}", count, checkpoint::layer_kind_name(kind));
  return text;
}

std::string scale_source_text(const engines::ResolvedKv& resolved) {
  using engines::ScaleSource;
  switch (resolved.scale_source) {
    case ScaleSource::unit_default:
      return resolved.dtype && resolved.dtype->scales == engines::ScaleSemantics::nvfp4_global
                 ? "none: global scale 1.0 (engine default), block scales dynamic"
                 : "none: scale 1.0 (engine default)";
    case ScaleSource::checkpoint:
      return fmt::format("checkpoint ({} tensors)", resolved.loaded_scale_names.size());
    case ScaleSource::calculated:
      return "calculated (from the first batch)";
    case ScaleSource::quantization_param_path:
      return "--quantization-param-path JSON";
    case ScaleSource::dynamic_by_design:
      return fmt::format("dynamic by design ({})",
                         engines::scale_semantics_name(resolved.dtype->scales));
    case ScaleSource::unknown:
      return "unknown (checkpoint not read)";
    case ScaleSource::not_applicable:
      break;
  }
  return "not applicable (16-bit cache)";
}

// The facts: what was read (architecture, layers, heads, dtype, quantization, headers),
// the launch, and what the engine resolves.
void add_check_facts(const CheckInput& input, const CheckResult& result, report::Report& out) {
  const auto& model = input.model;
  const auto& resolved = result.resolved;
  if (!model.source.empty()) out.facts.push_back(Fact{"source", "Read from", model.source, ""});
  out.facts.push_back(
      Fact{"architecture", "Architecture",
           fmt::format("{} ({})", model.architecture.empty() ? "?" : model.architecture,
                       model.model_type),
           ""});
  out.facts.push_back(Fact{"layers", "Layers", layer_summary(model), ""});
  if (model.mla)
    out.facts.push_back(Fact{"mla_latent", "MLA latent per token per layer",
                             int64_t{model.mla->kv_lora_rank + model.mla->qk_rope_head_dim},
                             "values"});
  else
    out.facts.push_back(Fact{"kv_heads", "KV heads x head dim",
                             fmt::format("{} x {}", model.num_kv_heads, model.head_dim), ""});
  out.facts.push_back(Fact{"model_dtype", "Model dtype", model.torch_dtype, ""});
  if (model.quant)
    out.facts.push_back(Fact{
        "quantization", "Quantization",
        fmt::format("{} {} (KV: {}) from {}", model.quant->method, model.quant->weight_algo,
                    model.quant->kv_cache_quant_algo.empty()
                        ? (model.quant->has_kv_cache_scheme ? model.quant->kv_cache_scheme.dump()
                                                            : "not declared")
                        : model.quant->kv_cache_quant_algo,
                    model.quant->source_file),
        ""});
  if (model.has_weights) {
    out.facts.push_back(Fact{"tensors", "Safetensors",
                             fmt::format("{} tensors in {} shard(s), headers only",
                                         model.tensor_count, model.shard_files.size()),
                             ""});
    out.facts.push_back(
        Fact{"kv_scale_tensors", "KV scale tensors", int64_t(model.kv_scales.size()), ""});
  }
  out.facts.push_back(Fact{
      "launch", "Launch",
      fmt::format("{} tp={} pp={} dp={}{} ({})", input.engine->engine, input.flags.tp,
                  input.flags.pp, input.flags.dp, input.flags.dp_attention ? " dp-attention" : "",
                  input.flags.source.empty() ? "flags" : input.flags.source),
      ""});
  out.facts.push_back(Fact{
      "kv_cache_dtype_requested",
      "Requested " + engines::kv_dtype_setting_name(*input.engine, result.resolved.version),
      input.flags.kv_cache_dtype_flag.empty() ? "auto (default)" : input.flags.kv_cache_dtype, ""});
  out.facts.push_back(
      Fact{"kv_cache_dtype", "Resolved KV cache dtype", resolved.kv_cache_dtype, ""});
  if (!resolved.substituted_from.empty())
    out.facts.push_back(Fact{"kv_cache_dtype_stored", "Stored on this GPU as",
                             fmt::format("{} ({} substitutes it for {})", resolved.kv_cache_dtype,
                                         input.flags.platform, resolved.substituted_from),
                             ""});
  out.facts.push_back(Fact{"scale_source", "KV scales", scale_source_text(resolved), ""});
  if (!input.gpu_name.empty())
    out.facts.push_back(
        Fact{"gpu", "GPU",
             fmt::format("{} ({}, {})", input.gpu_name, input.flags.gpu_arch, input.flags.platform),
             ""});
  out.facts.push_back(Fact{"kv_policy", "KV policy",
                           input.policy == KvPolicy::lossless
                               ? std::string("lossless (any quantized KV cache is critical)")
                           : input.policy == KvPolicy::permissive
                               ? std::string("permissive (only broken combinations and start-up "
                                             "failures are critical)")
                               : std::string("evidence (severity from what is known about this "
                                             "model's K/V range)"),
                           ""});
  out.facts.push_back(Fact{"read_ms", "Checkpoint read (configs + headers)",
                           static_cast<int64_t>(std::llround(input.read_seconds * 1000.0)), "ms"});
}

// The checkpoint's KV scale tensors and whether this release loads each.
void add_scale_table(const CheckInput& input, const CheckResult& result, report::Report& out) {
  const auto& model = input.model;
  const auto& resolved = result.resolved;
  if (!model.kv_scales.empty()) {
    report::Table table;
    table.id = "kv_scales";
    table.title = "KV scale tensors in the checkpoint";
    table.columns = {{"layer", "Layer", "", 0}, {"role", "Role", "", 0},
                     {"name", "Tensor", "", 0}, {"values", "Values", "", 0},
                     {"max", "Max", "", 6},     {"loaded", "Loaded", "", 0}};
    std::set<std::string> loaded(resolved.loaded_scale_names.begin(),
                                 resolved.loaded_scale_names.end());
    for (const auto& scale : model.kv_scales) {
      float max_value = scale.values.empty() ? 0.0f : scale.values[0];
      for (float value : scale.values) max_value = std::max(max_value, value);
      table.rows.push_back({int64_t{scale.layer},
                            std::string(checkpoint::scale_role_name(scale.role)), scale.name,
                            int64_t(scale.values.size()), double(max_value),
                            resolved.quantized ? report::Value(loaded.count(scale.name) > 0)
                                               : report::Value(std::string("n/a"))});
    }
    out.tables.push_back(std::move(table));
  }
}

// Per-layer dtypes, when they are not all the same (skip layers keep the model dtype).
void add_layer_dtype_table(const CheckResult& result, report::Report& out) {
  const auto& layers = result.resolved.layer_dtypes;
  const bool mixed = std::any_of(layers.begin(), layers.end(), [&](const auto& layer) {
    return layer.dtype != result.resolved.kv_cache_dtype;
  });
  if (!mixed) return;
  report::Table table;
  table.id = "kv_layer_dtypes";
  table.title = "KV cache dtype per attention layer";
  table.columns = {{"layer", "Layer", "", 0}, {"dtype", "Stored as", "", 0}, {"why", "Why", "", 0}};
  for (const auto& layer : layers)
    table.rows.push_back(
        {int64_t{layer.layer}, layer.dtype, layer.why.empty() ? "--kv-cache-dtype" : layer.why});
  out.tables.push_back(std::move(table));
}

// FAIL / WARN / OK from the findings' severities.
void set_check_verdict(const CheckResult& result, report::Report& out) {
  const auto& resolved = result.resolved;
  int critical = 0, warning = 0;
  for (const auto& finding : result.findings) {
    critical += finding.severity == Severity::critical;
    warning += finding.severity == Severity::warning;
  }
  out.verdict_severity = critical  ? Severity::critical
                         : warning ? Severity::warning
                                   : Severity::info;
  out.verdict =
      critical ? fmt::format(
                     "FAIL: {} critical, {} warning finding(s): the KV cache loses precision "
                     "silently with this launch",
                     critical, warning)
      : warning            ? fmt::format("WARN: no critical finding, {} warning(s)", warning)
      : resolved.quantized ? fmt::format("OK: KV cache {}, scales: {}", resolved.kv_cache_dtype,
                                         scale_source_text(resolved))
                           : fmt::format("OK: KV cache {} (full precision, no scales involved)",
                                         resolved.kv_cache_dtype);
}

// The payload: engine, resolved KV facts with their provenance, model.
void add_check_payload(const CheckInput& input, const CheckResult& result, report::Report& out) {
  const auto& model = input.model;
  const auto& resolved = result.resolved;
  json dropped = json::array();
  // Block-scaled layouts (nvfp4, mxfp8): what a block holds and how its scale is encoded.
  auto block_json = [](const engines::KvDtype& d) {
    if (d.block_elements <= 0) return json();
    return json{{"elements", d.block_elements},
                {"scale_bits", d.block_scale_bits},
                {"scale_format", d.block_scale_format}};
  };
  auto provenance_json = [](const engines::Provenance& p) {
    return json{{"reference", p.reference},
                {"status", engines::rule_status_id(p.status)},
                {"verified", p.verified},
                {"bound", p.bound},
                {"audit", p.audit.checked.empty()
                              ? json()
                              : json{{"verdict", engines::audit_verdict_name(p.audit.verdict)},
                                     {"checked", p.audit.checked},
                                     {"read", p.audit.read},
                                     {"source", engines::source_kind_name(p.audit.source)}}}};
  };
  for (const auto& drop : resolved.dropped)
    dropped.push_back({{"rule", drop.rule_id},
                       {"reason", drop.reason},
                       {"provenance", provenance_json(drop.provenance)},
                       {"tensors", drop.tensor_names}});
  json failures = json::array();
  for (const auto& failure : resolved.startup_failures)
    failures.push_back({{"id", failure.id},
                        {"message", failure.message},
                        {"cause", failure.cause},
                        {"provenance", provenance_json(failure.provenance)}});
  json layer_dtypes = json::array();
  for (const auto& layer : resolved.layer_dtypes)
    layer_dtypes.push_back({{"layer", layer.layer}, {"dtype", layer.dtype}, {"why", layer.why}});
  json known_bad = json::array();
  for (const auto& hit : resolved.known_bad)
    known_bad.push_back({{"id", hit.rule->id},
                         {"certain", hit.certain},
                         {"unknown", hit.unknown},
                         {"backend", hit.backend},
                         {"provenance", provenance_json(hit.rule->provenance)}});
  out.payload["kv_policy"] = kv_policy_name(input.policy);
  out.payload["engine"] = {{"name", input.engine->engine},
                           {"version", input.version_given ? input.flags.engine_version
                                                           : input.engine->latest_known_version},
                           {"version_assumed", !input.version_given},
                           {"newer_than_known", resolved.version_newer_than_known},
                           {"data_file", input.engine->file}};
  out.payload["resolved_kv"] = {
      {"kv_cache_dtype", resolved.kv_cache_dtype},
      {"requested", resolved.requested},
      {"model_dtype", resolved.model_dtype},
      {"quantized", resolved.quantized},
      {"dtype", resolved.dtype
                    ? json{{"name", resolved.dtype->name},
                           {"torch_dtype", resolved.dtype->torch_dtype},
                           {"scales", engines::scale_semantics_name(resolved.dtype->scales)},
                           {"description", resolved.dtype->description},
                           {"block", block_json(*resolved.dtype)},
                           {"reference", resolved.dtype->reference}}
                    : json()},
      {"scale_source", engines::scale_source_name(resolved.scale_source)},
      {"rule", resolved.rule_id},
      {"reason", resolved.reason},
      {"rule_provenance", provenance_json(resolved.rule_provenance)},
      {"loaded_scale_tensors", resolved.loaded_scale_names.size()},
      {"ignored_scale_tensors", resolved.ignored_by_design.size()},
      {"skipped_layers", resolved.skipped_layers},
      {"layer_dtypes", layer_dtypes},
      {"substituted_from",
       resolved.substituted_from.empty() ? json() : json(resolved.substituted_from)},
      {"known_bad", known_bad},
      {"draft_kv_cache_dtype",
       resolved.draft_kv_cache_dtype.empty() ? json() : json(resolved.draft_kv_cache_dtype)},
      {"dropped_scales", dropped},
      {"startup_failures", failures},
      {"engine_logs_scale_warning", resolved.scale_warning_text.has_value()}};
  out.payload["model"] = {{"dir", model.dir.string()},
                          {"architecture", model.architecture},
                          {"model_type", model.model_type},
                          {"num_layers", model.num_layers},
                          {"attention_layers", model.attention_layer_count()},
                          {"num_kv_heads", model.num_kv_heads},
                          {"head_dim", model.head_dim},
                          {"tensor_count", model.tensor_count},
                          {"kv_scale_tensors", model.kv_scales.size()}};
}

}  // namespace

report::Report to_report(const CheckInput& input, const CheckResult& result) {
  report::Report out;
  out.command = "check";
  std::string version = input.version_given
                            ? input.flags.engine_version
                            : "latest known (" + input.engine->latest_known_version + ")";
  out.title = fmt::format("kvaudit check: {} on {} {}", input.model.dir.string(),
                          input.engine->engine, version);
  add_check_facts(input, result, out);
  add_scale_table(input, result, out);
  add_layer_dtype_table(result, out);
  out.findings = result.findings;
  out.notes = input.model.notes;
  set_check_verdict(result, out);
  add_check_payload(input, result, out);
  return out;
}

}  // namespace kvaudit::audit
