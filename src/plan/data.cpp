// plan data: GPU presets (data/gpus.json), the dtypes an engine version sizes, and
// SGLang's default memory fraction (its constants are engine data).
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>

#include "plan/plan.h"
#include "util/json.h"
#include "util/util.h"

namespace kvaudit::plan {

namespace {

nlohmann::json read_json(const std::filesystem::path& path) {
  nlohmann::json doc = read_json_file(path, 4 << 20);
  if (!doc.is_object()) throw InputError(path.string(), "not a JSON object");
  return doc;
}

}  // namespace

const engines::KvDtype& plan_dtype(const engines::EngineModel& engine,
                                   const engines::Version& version, std::string_view name) {
  const std::string canonical = engine.dtypes->normalise(name);
  std::vector<std::string> accepted;
  if (const engines::DtypeChoices* choices = engine.choices_for(version))
    for (const auto& choice : choices->accepted) {
      if (choice.dtype == "auto") continue;
      if (choice.dtype == canonical) return *engine.dtypes->find(canonical);
      if (std::find(accepted.begin(), accepted.end(), choice.dtype) == accepted.end())
        accepted.push_back(choice.dtype);
    }
  // The model dtype under auto (fp16 on vLLM releases without a float16 choice, say).
  if (canonical == "bf16" || canonical == "fp16") return *engine.dtypes->find(canonical);
  throw InputError(
      "--kv-cache-dtype",
      fmt::format("'{}' is not a KV dtype {} {} accepts (it accepts: {})", name, engine.engine,
                  engines::version_text(version), fmt::join(accepted, ", ")));
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
    gpu.arch = entry.value("arch", "");
    gpu.platform = entry.value("platform", "");
    gpu.arch_source = entry.value("arch_source", "");
    if (gpu.arch.empty() || (gpu.platform != "cuda" && gpu.platform != "rocm"))
      throw InputError(path.string(), fmt::format("GPU '{}': needs \"arch\" and \"platform\" "
                                                  "(cuda or rocm)",
                                                  gpu.name));
    for (const auto& a : entry.value("aliases", nlohmann::json::array()))
      gpu.aliases.push_back(a.get<std::string>());
    if (gpu.name.empty() || gpu.memory_mib <= 0)
      throw InputError(path.string(), "GPU entry without name or memory_mib");
    presets.push_back(gpu);
  }
  return presets;
}

GpuPreset find_gpu(std::string_view name) {
  std::string wanted = ascii_lower(name);
  auto presets = load_gpu_presets();
  for (const auto& gpu : presets) {
    if (ascii_lower(gpu.name) == wanted) return gpu;
    for (const auto& alias : gpu.aliases)
      if (ascii_lower(alias) == wanted) return gpu;
  }
  std::string known;
  for (const auto& gpu : presets) known += (known.empty() ? "" : ", ") + gpu.name;
  throw InputError("--gpu",
                   fmt::format("unknown GPU '{}' (known: {}); or pass --gpu-mem", name, known));
}

MemFractionDefault sglang_default_mem_fraction(const engines::MemFractionTable& rule,
                                               int64_t gpu_mem_mib, int tp, int pp,
                                               bool dp_attention, int dp) {
  MemFractionDefault out;
  if (gpu_mem_mib <= 0)
    throw InputError("--gpu-mem", "SGLang's default fraction needs the GPU memory");
  int chunked_prefill = 0, graph_bs = 0;
  for (const auto& tier : rule.tiers) {
    if (static_cast<double>(gpu_mem_mib) < tier.below_mib) {
      chunked_prefill = tier.chunked_prefill_size;
      graph_bs = tp < 4 ? tier.cuda_graph_bs_tp_lt4 : tier.cuda_graph_bs_tp_ge4;
      break;
    }
  }
  double reserved = rule.reserved_constant_mib;
  double activation_tokens = std::max<double>(chunked_prefill, rule.activation_min_tokens);
  double activation = activation_tokens * rule.activation_mib_per_prefill_token;
  double graphs = graph_bs * rule.cuda_graph_mib_per_batch;
  double parallel = tp * pp / 8.0 * rule.parallel_mib_per_rank_over_8;
  reserved += activation + graphs + parallel;
  double dp_extra = 0;
  if (dp_attention) {
    dp_extra = graph_bs * dp * rule.dp_attention_mib_per_batch_per_dp;
    if (graph_bs > 300) dp_extra += graph_bs * dp * 1.5;
    reserved += dp_extra;
  }
  double summed = reserved;
  std::string floor_note;
  if (static_cast<double>(gpu_mem_mib) > rule.large_gpu_threshold_mib) {
    double floor_mib = rule.large_gpu_min_reserved_mib;
    if (reserved < floor_mib)
      floor_note = fmt::format(", raised to the {:.0f} MiB floor", floor_mib);
    reserved = std::max(reserved, floor_mib);
  }
  double scale = std::pow(10.0, rule.round_decimals);
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
