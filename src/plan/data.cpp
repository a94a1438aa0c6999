// plan data: the engines' sizing constants (data/engines/capacity/*.json), GPU
// presets (data/gpus.json), dtype spellings, and SGLang's default memory fraction.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>

#include "plan/plan.h"
#include "util/util.h"

namespace kvaudit::plan {

namespace {

std::string lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

nlohmann::json read_json(const std::filesystem::path& path) {
  std::string text = read_text_file(path, 4 << 20);
  nlohmann::json doc = nlohmann::json::parse(text, nullptr, false);
  if (doc.is_discarded() || !doc.is_object()) throw InputError(path.string(), "not a JSON object");
  return doc;
}

}  // namespace

std::string normalise_dtype_name(std::string_view text) {
  std::string t = lower(text);
  if (t.rfind("torch.", 0) == 0) t = t.substr(6);
  if (t == "auto") return "auto";
  if (t == "bf16" || t == "bfloat16") return "bf16";
  if (t == "fp16" || t == "float16" || t == "half") return "fp16";
  if (t == "fp32" || t == "float32" || t == "float") return "fp32";
  if (t == "fp8" || t == "fp8_e4m3" || t == "float8_e4m3fn" || t == "fp8_e4m3fn" ||
      t == "float8_e4m3")
    return "fp8_e4m3";
  if (t == "float8_e4m3fnuz" || t == "fp8_e4m3fnuz") return "fp8_e4m3fnuz";
  if (t == "fp8_e5m2" || t == "float8_e5m2") return "fp8_e5m2";
  if (t == "fp4_e2m1" || t == "float4_e2m1fn_x2" || t == "fp4") return "fp4_e2m1";
  if (t == "nvfp4") return "nvfp4";
  if (t == "mxfp8") return "mxfp8";
  return "";
}

EngineCapacityData load_capacity_data(std::string_view engine) {
  std::filesystem::path path =
      data_dir() / "engines" / "capacity" / (std::string(engine) + ".json");
  if (!std::filesystem::exists(path))
    throw InputError(std::string(engine), "no capacity data for this engine (expected " +
                                              path.string() + "); known: sglang, vllm");
  EngineCapacityData data;
  data.engine = std::string(engine);
  data.document = read_json(path);
  for (const auto& entry : data.document.value("kv_dtypes", nlohmann::json::array())) {
    KvDtypeSpec spec;
    spec.name = entry.value("name", "");
    spec.element_bits = entry.value("element_bits", 16);
    spec.fp4_block_scales = entry.value("fp4_block_scales", false);
    for (const auto& c : entry.value("cli", nlohmann::json::array()))
      spec.cli.push_back(c.get<std::string>());
    if (spec.name.empty() || spec.element_bits <= 0)
      throw InputError(path.string(), "kv_dtypes entry without name or element_bits");
    data.kv_dtypes.push_back(spec);
  }
  for (const auto& d : data.document.value("plan_default_dtypes", nlohmann::json::array()))
    data.plan_default_dtypes.push_back(d.get<std::string>());
  if (data.kv_dtypes.empty()) throw InputError(path.string(), "no kv_dtypes");
  return data;
}

const KvDtypeSpec& find_dtype(const EngineCapacityData& data, std::string_view name) {
  std::string wanted = normalise_dtype_name(name);
  for (const auto& spec : data.kv_dtypes)
    if (spec.name == wanted) return spec;
  std::string known;
  for (const auto& spec : data.kv_dtypes) known += (known.empty() ? "" : ", ") + spec.name;
  throw InputError("--kv-cache-dtype", fmt::format("'{}' is not a KV dtype {} sizes (known: {})",
                                                   name, data.engine, known));
}

std::vector<GpuPreset> load_gpu_presets() {
  std::filesystem::path path = data_dir() / "gpus.json";
  nlohmann::json doc = read_json(path);
  std::vector<GpuPreset> presets;
  for (const auto& entry : doc.value("gpus", nlohmann::json::array())) {
    GpuPreset gpu;
    gpu.name = entry.value("name", "");
    gpu.memory_gb = entry.value("memory_gb", 0.0);
    gpu.memory_mib = entry.value("memory_mib", int64_t{0});
    gpu.mib_source = entry.value("mib_source", "");
    for (const auto& a : entry.value("aliases", nlohmann::json::array()))
      gpu.aliases.push_back(a.get<std::string>());
    if (gpu.name.empty() || gpu.memory_mib <= 0)
      throw InputError(path.string(), "GPU entry without name or memory_mib");
    presets.push_back(gpu);
  }
  return presets;
}

GpuPreset find_gpu(std::string_view name) {
  std::string wanted = lower(name);
  auto presets = load_gpu_presets();
  for (const auto& gpu : presets) {
    if (lower(gpu.name) == wanted) return gpu;
    for (const auto& alias : gpu.aliases)
      if (lower(alias) == wanted) return gpu;
  }
  std::string known;
  for (const auto& gpu : presets) known += (known.empty() ? "" : ", ") + gpu.name;
  throw InputError("--gpu",
                   fmt::format("unknown GPU '{}' (known: {}); or pass --gpu-mem", name, known));
}

MemFractionDefault sglang_default_mem_fraction(const EngineCapacityData& data, int64_t gpu_mem_mib,
                                               int tp, int pp, bool dp_attention, int dp) {
  const nlohmann::json& rule = data.document.at("mem_fraction_static_default");
  MemFractionDefault out;
  if (gpu_mem_mib <= 0) {
    out.mem_fraction_static = rule.value("fallback_when_gpu_unknown", 0.88);
    out.derivation = "GPU memory unknown: SGLang falls back to 0.88";
    return out;
  }
  int chunked_prefill = 0, graph_bs = 0;
  for (const auto& tier : rule.at("tiers")) {
    if (static_cast<double>(gpu_mem_mib) < tier.at("below_mib").get<double>()) {
      chunked_prefill = tier.at("chunked_prefill_size").get<int>();
      graph_bs = tp < 4 ? tier.at("cuda_graph_max_bs_tp_lt4").get<int>()
                        : tier.at("cuda_graph_max_bs_tp_ge4").get<int>();
      break;
    }
  }
  double reserved = rule.at("reserved_constant_mib").get<double>();
  double activation_tokens = std::max<double>(chunked_prefill, rule.at("activation_min_tokens"));
  double activation = activation_tokens * rule.at("activation_mib_per_prefill_token").get<double>();
  double graphs = graph_bs * rule.at("cuda_graph_mib_per_batch").get<double>();
  double parallel = tp * pp / 8.0 * rule.at("parallel_mib_per_rank_over_8").get<double>();
  reserved += activation + graphs + parallel;
  double dp_extra = 0;
  if (dp_attention) {
    dp_extra = graph_bs * dp * rule.at("dp_attention_mib_per_batch_per_dp").get<double>();
    if (graph_bs > 300) dp_extra += graph_bs * dp * 1.5;
    reserved += dp_extra;
  }
  double summed = reserved;
  std::string floor_note;
  if (static_cast<double>(gpu_mem_mib) > rule.at("large_gpu_threshold_mib").get<double>()) {
    double floor_mib = rule.at("large_gpu_min_reserved_mib").get<double>();
    if (reserved < floor_mib)
      floor_note = fmt::format(", raised to the {:.0f} MiB floor", floor_mib);
    reserved = std::max(reserved, floor_mib);
  }
  double scale = std::pow(10.0, rule.value("round_decimals", 3));
  out.mem_fraction_static =
      std::round((static_cast<double>(gpu_mem_mib) - reserved) / gpu_mem_mib * scale) / scale;
  out.reserved_mib = reserved;
  out.derivation = fmt::format(
      "SGLang default mem_fraction_static for {} MiB, TP {}: reserved = 512 + {} x 1.5 "
      "(chunked prefill) + {} x 2 (CUDA graph bs) + {} x {} / 8 x 1024 (parallel){} = {:.0f} "
      "MiB{}; "
      "round(({} - {:.0f}) / {}, 3) = {:.3f}",
      gpu_mem_mib, tp, static_cast<int>(activation_tokens), graph_bs, tp, pp,
      dp_attention ? fmt::format(" + {:.0f} (DP attention)", dp_extra) : "", summed, floor_note,
      gpu_mem_mib, reserved, gpu_mem_mib, out.mem_fraction_static);
  return out;
}

}  // namespace kvaudit::plan
