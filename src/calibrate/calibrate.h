// calibrate: static FP8 KV-cache scales that an engine really loads. Collects per-layer,
// per-head K/V maxima on the reference engine (or takes them from a statistics file written
// elsewhere), turns them into scales, and writes them as an overlay beside the original
// checkpoint under the tensor names and quantization config the target engine version
// loads for this architecture, plus SGLang's --quantization-param-path JSON. Which carrier
// works is decided by engines::resolve_kv on the checkpoint as it will look with the
// overlay, so the engine knowledge stays in data/engines/. Not here: the forward pass
// (model/), measuring the effect (eval/), rendering (report/).
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "engines/engines.h"
#include "model/model.h"
#include "numerics/numerics.h"
#include "report/report.h"

namespace kvaudit::calibrate {

// ---------------------------------------------------------------- statistics
// The file format of `--from-stats` (and of `--stats-out`), "kvaudit-kv-stats/1":
//   {"format": "kvaudit-kv-stats/1", "num_layers": L, "num_kv_heads": H,
//    "tokens": T (optional, informational), "source": "..." (optional),
//    "layers": [{"layer": 0, "k_amax": [H floats], "v_amax": [H floats],
//                "k_amax_percentile": [H], "v_amax_percentile": [H]  (optional)}, ...]}
// k_amax / v_amax: absolute maxima of K as stored in the cache (after any QK-norm and RoPE)
// and of V, per KV head, over the calibration tokens. A single number instead of a list
// means the per-tensor maximum (per-head scales then cannot be derived). Every attention
// layer appears exactly once. "*_percentile" hold the percentile named by
// "percentile" (e.g. 99.9) of the per-token head maxima.
struct LayerKvStats {
  int layer = 0;
  std::vector<float> k_amax, v_amax;                        // [kv_heads] or [1]
  std::vector<float> k_amax_percentile, v_amax_percentile;  // empty when not collected
};

struct KvStats {
  std::string source;  // "reference engine over FILE" or the stats file
  int num_layers = 0;
  int num_kv_heads = 0;
  int64_t tokens = 0;
  double percentile = 100.0;  // of the *_percentile fields (100: none collected)
  std::vector<LayerKvStats> layers;
  // Layers with no KV cache (a hybrid's Gated DeltaNet layers): no entry in `layers`.
  std::vector<int> layers_without_kv;
};

struct CollectOptions {
  int64_t chunk_tokens = 1024;  // the text is run in independent sequences of this length
  double percentile = 100.0;    // also collect this percentile of per-token head maxima
};

// Runs `tokens` through the reference engine (BF16 KV cache) and records K/V maxima.
KvStats collect_kv_stats(const model::Model& model, std::span<const int32_t> tokens,
                         const CollectOptions& options, ThreadPool& pool);
nlohmann::json kv_stats_to_json(const KvStats& stats);
// Parses and validates a statistics document (InputError(label, ...) on any problem:
// missing layers, NaN or negative maxima, wrong lengths).
KvStats kv_stats_from_json(const nlohmann::json& doc, const std::string& label);
KvStats read_kv_stats(const std::filesystem::path& file);

// ---------------------------------------------------------------- scales

enum class Granularity { tensor, head };

struct ScaleOptions {
  Granularity granularity = Granularity::tensor;
  // scale = amax * margin / 448 (FP8 E4M3's largest finite value). margin > 1 leaves
  // headroom for values above what the calibration text produced; margin 1 spends the
  // whole range on what was seen.
  double margin = 1.0;
  // Use the collected percentile of per-token head maxima instead of the maximum
  // (requires statistics with *_percentile fields).
  bool use_percentile = false;
};

struct LayerScales {
  int layer = 0;
  std::vector<float> k_scale, v_scale;  // [1] (tensor) or [kv_heads] (head)
  float k_amax = 0.0f, v_amax = 0.0f;   // the largest maximum behind the scales
};

// Throws InputError when the statistics cannot give what the options ask (per-head scales
// from per-tensor maxima, a percentile that was not collected, a zero maximum).
std::vector<LayerScales> compute_scales(const KvStats& stats, const ScaleOptions& options);

// What the scales do on the calibration text: the fraction of K and V elements that FP8
// E4M3 saturates and flushes to zero, per layer, with the scales applied as given.
struct LayerClipping {
  int layer = 0;
  double k_saturated = 0.0, v_saturated = 0.0;  // fractions of elements
  double k_flushed = 0.0, v_flushed = 0.0;
};
std::vector<LayerClipping> measure_clipping(const model::Model& model,
                                            std::span<const int32_t> tokens,
                                            const std::vector<LayerScales>& scales,
                                            Granularity granularity, const CollectOptions& options,
                                            ThreadPool& pool);

// Scales as a model::Session takes them (explicit, bit for bit), per layer {K, V}.
std::vector<std::array<numerics::StaticAmax, 2>> session_scales(
    const std::vector<LayerScales>& scales, int num_layers);

// Reads scales written by calibrate, or by anyone else: a .safetensors file, a folder
// holding .safetensors files (k/v scale tensors in any known naming convention), or
// SGLang's --quantization-param-path JSON (tp rank 0; one factor per layer for K and V).
// Every attention layer must have both scales. `label` names the path in errors.
// layers_without_kv (a hybrid's Gated DeltaNet layers) need none and get empty scales.
std::vector<LayerScales> load_scales(const std::filesystem::path& path, int num_layers,
                                     int num_kv_heads,
                                     const std::vector<int>& layers_without_kv = {});

// ---------------------------------------------------------------- overlay

// How the scales reach the engine.
enum class Carrier {
  modelopt,            // k_proj.k_scale / v_proj.v_scale + hf_quant_config kv_cache_quant_algo
  compressed_tensors,  // self_attn.k_scale / v_scale + quantization_config.kv_cache_scheme
  kv_only_compressed_tensors,  // the same, with a KV-only compressed-tensors config added
  quantization_param_path,     // SGLang's JSON file only
};
std::string_view carrier_name(Carrier carrier);

struct OverlayRequest {
  std::filesystem::path model_dir;
  std::filesystem::path out_dir;
  std::string engine;          // an engine of the registry
  std::string engine_version;  // "" = latest known
  int tp = 1;                  // ranks written into SGLang's JSON
  Granularity granularity = Granularity::tensor;
  bool dry_run = false;  // only say which carrier would load (view in OverlayResult); no files
};

struct CarrierAttempt {
  Carrier carrier = Carrier::modelopt;
  bool works = false;
  std::string why;  // the engine data's verdict in one sentence (drop reason and reference)
  std::string reference;
};

struct OverlayResult {
  Carrier carrier = Carrier::modelopt;
  std::vector<CarrierAttempt> attempts;      // every carrier considered, in order
  std::vector<std::filesystem::path> files;  // written, relative to out_dir
  std::vector<std::string> launch_flags;     // e.g. {"--kv-cache-dtype", "fp8_e4m3"}
  engines::ResolvedKv resolved;              // the engine's view of checkpoint + overlay
  std::vector<std::string> tensor_names;     // scale tensors written
  std::vector<std::string> notes;
  std::optional<checkpoint::ModelFacts> view;  // dry run: the checkpoint as the engine sees it
};

// Chooses the first carrier that the target engine version loads for this checkpoint
// (checked by resolving the checkpoint as it will look with the overlay), writes the
// overlay atomically into out_dir, and returns what it did. Throws InputError naming the
// reasons and references when no carrier works (the refusal), when out_dir is the model
// folder, or when a per-head request meets an engine that only takes per-tensor scales.
// `registry` holds request.engine.
OverlayResult write_overlay(const engines::Registry& registry, const checkpoint::ModelFacts& model,
                            const std::vector<LayerScales>& scales, const OverlayRequest& request);

// ---------------------------------------------------------------- 16-bit overlay

// The checkpoint as an engine sees it through its 16-bit overlay (engine data
// kv_dtype_setting.sixteen_bit_overlay): the KV quantization removed, everything else kept.
checkpoint::ModelFacts without_kv_quantization(const checkpoint::ModelFacts& model);

struct SixteenBitOverlayResult {
  std::filesystem::path out_dir;
  std::vector<std::string> edited;  // config files rewritten ("hf_quant_config.json: ...")
  std::vector<std::string> linked;  // entries linked to the original checkpoint
  engines::ResolvedKv resolved;     // the engine's view of the overlay under auto
};
// Writes out_dir: every entry of the checkpoint folder as a symlink to the original, and
// the config files that declare the KV quantization rewritten with it set to null, so the
// engine's auto keeps the model dtype; the original is never touched. Verified by reading
// the written folder back and resolving it under auto. InputError when the engine has no
// such overlay (its flag gives a 16-bit cache), out_dir is the checkpoint or a non-empty
// folder this did not write, or the result would still quantize the cache.
SixteenBitOverlayResult write_sixteen_bit_overlay(const engines::EngineModel& engine,
                                                  const engines::LaunchFlags& flags,
                                                  const checkpoint::ModelFacts& model,
                                                  const std::filesystem::path& out_dir);

// ---------------------------------------------------------------- report

struct CalibrationSummary {
  const KvStats* stats = nullptr;
  const std::vector<LayerScales>* scales = nullptr;
  const std::vector<LayerClipping>* clipping = nullptr;  // may be null (--from-stats)
  const OverlayResult* overlay = nullptr;
  ScaleOptions options;
  OverlayRequest request;
};
void add_to_report(const CalibrationSummary& summary, report::Report& out);

}  // namespace kvaudit::calibrate
