// calibrate overlay: writes scales where the target engine version loads them. Each
// candidate carrier is staged, laid over the original checkpoint in a scratch view
// (symlinks to the original files, the staged files on top), read back with the
// checkpoint reader and resolved with the engine data: the first one the engine loads
// without dropping anything is moved into place. So what calibrate promises is exactly
// what `kvaudit check` will report on the same files.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>

#include <unistd.h>

#include "calibrate/calibrate.h"
#include "util/util.h"

namespace kvaudit::calibrate {

namespace fs = std::filesystem;
using nlohmann::json;

std::string_view carrier_name(Carrier carrier) {
  switch (carrier) {
    case Carrier::modelopt:
      return "modelopt";
    case Carrier::compressed_tensors:
      return "compressed-tensors";
    case Carrier::kv_only_compressed_tensors:
      return "kv-only-compressed-tensors";
    case Carrier::quantization_param_path:
      return "quantization-param-path";
  }
  return "?";
}

namespace {

constexpr const char* kScalesFile = "kv_scales.safetensors";
constexpr const char* kParamPathFile = "kv_cache_scales.json";
constexpr const char* kMarkerFile = "kvaudit-calibration.json";

// "model.language_model.layers.3.self_attn." for each layer that has a K projection.
std::map<int, std::string> attention_prefixes(const checkpoint::ModelFacts& model,
                                              const std::vector<LayerScales>& scales) {
  static const Regex k_proj(R"((.*\.layers\.(\d+)\.(?:self_attn|attention)\.)k_proj\.weight)");
  std::map<int, std::string> prefixes;
  for (const std::string& name : model.kv_projection_weights)
    if (auto match = k_proj.full_match(name))
      prefixes.emplace(std::stoi(std::string(*match->at(2))), std::string(*match->at(1)));
  if (prefixes.empty())  // a bare config or an unusual layout: the Hugging Face default
    for (const LayerScales& layer : scales)
      prefixes.emplace(layer.layer, fmt::format("model.layers.{}.self_attn.", layer.layer));
  return prefixes;
}

struct ScaleTensorOut {
  std::string name;
  std::vector<float> values;
  bool scalar = true;
};

std::string safetensors_bytes(std::vector<ScaleTensorOut> tensors) {
  std::sort(tensors.begin(), tensors.end(),
            [](const ScaleTensorOut& a, const ScaleTensorOut& b) { return a.name < b.name; });
  json header = json::object();
  std::string data;
  for (const ScaleTensorOut& tensor : tensors) {
    const size_t begin = data.size();
    for (float value : tensor.values) {
      char bytes[4];
      std::memcpy(bytes, &value, 4);  // little-endian hosts only, as safetensors is
      data.append(bytes, 4);
    }
    json shape = tensor.scalar ? json::array() : json::array({tensor.values.size()});
    header[tensor.name] = {
        {"dtype", "F32"}, {"shape", shape}, {"data_offsets", {begin, data.size()}}};
  }
  header["__metadata__"] = {{"format", "pt"}, {"producer", "kvaudit calibrate"}};
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // keeps the data section 8-byte aligned
  std::string file(8, '\0');
  uint64_t length = text.size();
  std::memcpy(file.data(), &length, 8);
  return file + text + data;
}

json read_json_object(const fs::path& file) {
  json doc = json::parse(read_text_file(file), nullptr, false);
  if (doc.is_discarded() || !doc.is_object())
    throw InputError(file.string(), "is not a JSON object");
  return doc;
}

json kv_cache_scheme(Granularity granularity) {
  return {{"num_bits", 8},
          {"type", "float"},
          {"strategy", granularity == Granularity::tensor ? "tensor" : "attn_head"},
          {"dynamic", false},
          {"symmetric", true}};
}

// The files a carrier adds or replaces, by name, as bytes.
std::map<std::string, std::string> carrier_files(const checkpoint::ModelFacts& model,
                                                 const std::vector<LayerScales>& scales,
                                                 const OverlayRequest& request, Carrier carrier,
                                                 std::vector<std::string>& tensor_names) {
  std::map<std::string, std::string> files;
  tensor_names.clear();
  if (carrier == Carrier::quantization_param_path) return files;
  const auto prefixes = attention_prefixes(model, scales);
  std::vector<ScaleTensorOut> tensors;
  const bool scalar = request.granularity == Granularity::tensor;
  for (const LayerScales& layer : scales) {
    auto prefix = prefixes.find(layer.layer);
    if (prefix == prefixes.end()) continue;  // no attention here (linear-attention layer)
    if (carrier == Carrier::modelopt) {
      tensors.push_back({prefix->second + "k_proj.k_scale", layer.k_scale, scalar});
      tensors.push_back({prefix->second + "v_proj.v_scale", layer.v_scale, scalar});
    } else {
      tensors.push_back({prefix->second + "k_scale", layer.k_scale, scalar});
      tensors.push_back({prefix->second + "v_scale", layer.v_scale, scalar});
    }
  }
  for (const auto& tensor : tensors) tensor_names.push_back(tensor.name);
  std::sort(tensor_names.begin(), tensor_names.end());
  files[kScalesFile] = safetensors_bytes(tensors);

  // A sharded checkpoint is loaded through its index, so the index must name the new file.
  const fs::path index = model.files_dir / "model.safetensors.index.json";
  std::error_code ec;
  if (fs::exists(index, ec)) {
    json doc = read_json_object(index);
    if (!doc.contains("weight_map") || !doc["weight_map"].is_object())
      throw InputError(index.string(), "has no weight_map object");
    for (const std::string& name : tensor_names) doc["weight_map"][name] = kScalesFile;
    files["model.safetensors.index.json"] = doc.dump(2) + "\n";
  }

  if (carrier == Carrier::modelopt) {
    const fs::path hf_quant = model.files_dir / "hf_quant_config.json";
    if (fs::exists(hf_quant, ec)) {
      json doc = read_json_object(hf_quant);
      doc["quantization"]["kv_cache_quant_algo"] = "FP8";
      files["hf_quant_config.json"] = doc.dump(2) + "\n";
    } else {  // ModelOpt config inside config.json
      json doc = read_json_object(model.files_dir / "config.json");
      json& block = doc.contains("quantization_config") ? doc["quantization_config"]
                                                        : doc["text_config"]["quantization_config"];
      block["kv_cache_quant_algo"] = "FP8";
      files["config.json"] = doc.dump(2) + "\n";
    }
  } else {
    json doc = read_json_object(model.files_dir / "config.json");
    const bool nested = !doc.contains("quantization_config") && doc.contains("text_config") &&
                        doc["text_config"].contains("quantization_config");
    json& block = nested ? doc["text_config"]["quantization_config"] : doc["quantization_config"];
    if (carrier == Carrier::kv_only_compressed_tensors) {
      // Weights stay as they are: no config group targets any layer.
      block = {{"quant_method", "compressed-tensors"},
               {"format", "float-quantized"},
               {"quantization_status", "compressed"},
               {"config_groups", json::object()},
               {"ignore", json::array()}};
    }
    block["kv_cache_scheme"] = kv_cache_scheme(request.granularity);
    files["config.json"] = doc.dump(2) + "\n";
  }
  return files;
}

std::string param_path_json(const checkpoint::ModelFacts& model,
                            const std::vector<LayerScales>& scales, int tp) {
  json per_layer = json::object();
  for (const LayerScales& layer : scales) {
    // One factor per layer serves K and V: the larger keeps both unclipped.
    const float k = *std::max_element(layer.k_scale.begin(), layer.k_scale.end());
    const float v = *std::max_element(layer.v_scale.begin(), layer.v_scale.end());
    per_layer[std::to_string(layer.layer)] = std::max(k, v);
  }
  json ranks = json::object();
  for (int rank = 0; rank < tp; ++rank) ranks[std::to_string(rank)] = per_layer;
  return json{{"model_type", model.model_type},
              {"kv_cache", {{"dtype", "float8_e4m3fn"}, {"scaling_factor", ranks}}}}
             .dump(2) +
         "\n";
}

void write_bytes(const fs::path& file, const std::string& bytes) {
  std::ofstream out(file, std::ios::binary);
  out.write(bytes.data(), std::streamsize(bytes.size()));
  if (!out) throw InputError(file.string(), "cannot be written");
}

// A scratch folder: the original checkpoint's entries as symlinks, `files` on top.
fs::path merged_view(const fs::path& model_dir, const std::map<std::string, std::string>& files,
                     const fs::path& scratch) {
  fs::create_directories(scratch);
  for (const auto& entry : fs::directory_iterator(model_dir)) {
    const std::string name = entry.path().filename().string();
    if (!files.count(name)) fs::create_symlink(fs::absolute(entry.path()), scratch / name);
  }
  for (const auto& [name, bytes] : files) write_bytes(scratch / name, bytes);
  return scratch;
}

struct ScratchFolder {
  fs::path path;
  ~ScratchFolder() {
    std::error_code ec;
    if (!path.empty()) fs::remove_all(path, ec);
  }
};

fs::path scratch_name(const fs::path& near, const char* what) {
  static int counter = 0;
  return near / fmt::format(".kvaudit-{}-{}-{}", what, ::getpid(), ++counter);
}

}  // namespace

namespace {

// Refuses an output folder that is the checkpoint, a file, or a non-empty folder calibrate
// did not write.
void check_destination(const OverlayRequest& request, const fs::path& model_dir,
                       const fs::path& out_dir) {
  std::error_code ec;
  if (!request.dry_run && out_dir == model_dir)
    throw InputError(request.out_dir.string(),
                     "is the checkpoint folder; calibrate never modifies the original: give a new "
                     "folder and place its files beside the originals when deploying");
  if (!request.dry_run && fs::exists(out_dir, ec) && !fs::is_directory(out_dir, ec))
    throw InputError(request.out_dir.string(), "exists and is not a folder");
  if (!request.dry_run && fs::exists(out_dir, ec) && !fs::is_empty(out_dir, ec) &&
      !fs::exists(out_dir / kMarkerFile, ec))
    throw InputError(
        request.out_dir.string(),
        "is not empty and holds no earlier calibrate output; refusing to overwrite it");
}

// The carriers worth trying for this checkpoint and request, in order of preference.
std::vector<Carrier> candidate_carriers(const checkpoint::ModelFacts& model,
                                        const OverlayRequest& request,
                                        const engines::EngineModel& engine) {
  std::vector<Carrier> candidates;
  const std::string method = model.quant ? model.quant->method : "";
  if (method == "modelopt" && request.granularity == Granularity::tensor)
    candidates.push_back(Carrier::modelopt);
  else if (method == "compressed-tensors")
    candidates.push_back(Carrier::compressed_tensors);
  else if (method.empty())
    candidates.push_back(Carrier::kv_only_compressed_tensors);
  if (engine.has_quantization_param_path && request.granularity == Granularity::tensor)
    candidates.push_back(Carrier::quantization_param_path);
  return candidates;
}

// Whether the engine, reading the checkpoint with this carrier's files, loads our scales
// and only ours; else why not.
CarrierAttempt judge_carrier(const checkpoint::ModelFacts& model, Carrier carrier,
                             const engines::ResolvedKv& resolved,
                             const std::vector<std::string>& tensor_names) {
  CarrierAttempt attempt{carrier, false, "", ""};
  const std::string wanted =
      carrier == Carrier::quantization_param_path ? "quantization_param_path" : "checkpoint";
  std::vector<std::string> ours_dropped;
  for (const auto& drop : resolved.dropped)
    for (const std::string& name : drop.tensor_names)
      if (std::binary_search(tensor_names.begin(), tensor_names.end(), name)) {
        if (attempt.why.empty()) {
          attempt.why = fmt::format("{} ({})", drop.reason, drop.rule_id);
          attempt.reference = drop.provenance.reference;
        }
        ours_dropped.push_back(name);
      }
  if (resolved.kv_cache_dtype != "fp8_e4m3") {
    attempt.why = fmt::format("the KV cache resolves to {}, not fp8_e4m3", resolved.kv_cache_dtype);
  } else if (ours_dropped.empty() && carrier != Carrier::quantization_param_path &&
             !model.kv_scales.empty()) {
    // The engine would load the old tensors as well, in file order: which wins is undefined.
    attempt.why = fmt::format(
        "the checkpoint already holds {} KV scale tensors (e.g. {} in {}) that the engine would "
        "load too, in an undefined order; remove them from the checkpoint first",
        model.kv_scales.size(), model.kv_scales[0].name, model.kv_scales[0].shard_file);
  } else if (!resolved.startup_failures.empty()) {
    attempt.why =
        fmt::format("the server would not start: {} ({})", resolved.startup_failures.front().cause,
                    resolved.startup_failures.front().message);
    attempt.reference = resolved.startup_failures.front().provenance.reference;
  } else if (ours_dropped.empty() && engines::scale_source_name(resolved.scale_source) == wanted) {
    attempt.works = true;
    attempt.why = carrier == Carrier::quantization_param_path
                      ? "SGLang reads the JSON given with --quantization-param-path"
                      : fmt::format("{} scale tensors loaded", tensor_names.size());
  } else if (attempt.why.empty()) {
    attempt.why = fmt::format("the engine data resolves the scale source to {}",
                              engines::scale_source_name(resolved.scale_source));
  }
  return attempt;
}

// The marker file: what the overlay is for (engine, release, carrier, launch flags) and
// the scales it carries.
json marker_json(const OverlayRequest& request, Carrier carrier,
                 const std::vector<std::string>& launch_flags,
                 const std::vector<std::string>& tensor_names,
                 const std::vector<LayerScales>& scales) {
  json marker = {{"format", "kvaudit-calibration/1"},
                 {"engine", request.engine},
                 {"engine_version", request.engine_version},
                 {"carrier", carrier_name(carrier)},
                 {"launch_flags", launch_flags},
                 {"tensors", tensor_names}};
  json layers = json::array();
  for (const LayerScales& layer : scales)
    layers.push_back({{"layer", layer.layer},
                      {"k_scale", layer.k_scale},
                      {"v_scale", layer.v_scale},
                      {"k_amax", layer.k_amax},
                      {"v_amax", layer.v_amax}});
  marker["layers"] = std::move(layers);
  return marker;
}

// Writes the files into a staging folder beside out_dir, then moves it into place in one
// rename: a reader never sees half an overlay.
void write_staged(const std::map<std::string, std::string>& files, const fs::path& out_dir) {
  std::error_code ec;
  const fs::path staging = scratch_name(out_dir.parent_path(), "overlay");
  fs::create_directories(staging);
  try {
    for (const auto& [name, bytes] : files) write_bytes(staging / name, bytes);
    if (fs::exists(out_dir, ec)) fs::remove_all(out_dir);
    fs::rename(staging, out_dir);
  } catch (...) {
    fs::remove_all(staging, ec);
    throw;
  }
}

}  // namespace

OverlayResult write_overlay(const engines::Registry& registry, const checkpoint::ModelFacts& model,
                            const std::vector<LayerScales>& scales, const OverlayRequest& request) {
  std::error_code ec;
  const fs::path model_dir = fs::weakly_canonical(request.model_dir, ec);
  // A dry run (what would load?) stages its views in the temp folder and writes nothing.
  const fs::path out_dir =
      request.dry_run ? fs::temp_directory_path() / fmt::format("kvaudit-preview-{}", ::getpid())
                      : fs::weakly_canonical(request.out_dir, ec);
  check_destination(request, model_dir, out_dir);
  if (request.tp < 1 || request.tp > 1024) throw InputError("--tp", "must lie in 1..1024");

  const engines::EngineModel& engine = registry.engine(request.engine);
  auto version = engines::parse_version(request.engine_version);
  if (!version)
    throw InputError("--engine-version", "cannot read version '" + request.engine_version + "'");
  const std::string engine_label =
      fmt::format("{} {}", request.engine,
                  request.engine_version.empty() ? "(latest known)" : request.engine_version);
  if (request.granularity == Granularity::head) {
    const engines::FallbackRule& fallback = engine.fallback_for(*version);
    if (fallback.non_scalar != engines::NonScalarRule::per_head_for_ct_attn_head)
      throw InputError(
          "--granularity head",
          fmt::format("{} takes only per-tensor KV scales ({}: \"{}\"); use --granularity tensor",
                      engine_label, fallback.provenance.reference, fallback.non_scalar_error));
  }

  const std::vector<Carrier> candidates = candidate_carriers(model, request, engine);
  const bool sglang_json = engine.has_quantization_param_path;
  const std::string method = model.quant ? model.quant->method : "";

  fs::create_directories(out_dir.parent_path(), ec);
  OverlayResult result;
  for (Carrier carrier : candidates) {
    std::vector<std::string> tensor_names;
    std::map<std::string, std::string> files =
        carrier_files(model, scales, request, carrier, tensor_names);
    if (sglang_json) files[kParamPathFile] = param_path_json(model, scales, request.tp);

    engines::LaunchFlags flags;
    flags.engine = request.engine;
    flags.engine_version = request.engine_version;
    flags.kv_cache_dtype = engines::cli_spelling(engine, *version, "fp8_e4m3");
    flags.kv_cache_dtype_flag = "--kv-cache-dtype";
    if (carrier == Carrier::quantization_param_path)
      flags.quantization_param_path = (out_dir / kParamPathFile).string();

    ScratchFolder scratch{scratch_name(out_dir.parent_path(), "view")};
    checkpoint::ModelFacts seen =
        checkpoint::read_checkpoint(merged_view(model.files_dir, files, scratch.path));
    engines::ResolvedKv resolved = engines::resolve_kv(seen, flags, engine);

    const CarrierAttempt attempt = judge_carrier(model, carrier, resolved, tensor_names);
    result.attempts.push_back(attempt);
    if (!attempt.works) continue;
    if (request.dry_run) {  // the engine's view of the checkpoint with the overlay, no files
      seen.dir = model.dir;
      seen.files_dir = model.files_dir;
      seen.source = model.source;
      result.carrier = carrier;
      result.resolved = resolved;
      result.tensor_names = tensor_names;
      result.launch_flags = {"--kv-cache-dtype", flags.kv_cache_dtype};
      if (carrier == Carrier::quantization_param_path)
        result.launch_flags.insert(result.launch_flags.end(),
                                   {"--quantization-param-path", "SCALES.json"});
      result.view = std::move(seen);
      return result;
    }

    // Stage the overlay next to its destination, then move it into place in one rename.
    result.carrier = carrier;
    result.resolved = resolved;
    result.tensor_names = tensor_names;
    result.launch_flags = {"--kv-cache-dtype", flags.kv_cache_dtype};
    if (carrier == Carrier::quantization_param_path)
      result.launch_flags.insert(result.launch_flags.end(),
                                 {"--quantization-param-path", flags.quantization_param_path});
    for (const auto& [name, bytes] : files) result.files.push_back(name);
    result.files.push_back(kMarkerFile);
    if (carrier == Carrier::kv_only_compressed_tensors)
      result.notes.push_back(
          "config.json gains a KV-only compressed-tensors quantization_config (no config group "
          "targets the weights, which stay as they are); the engines create k_scale/v_scale "
          "parameters only through a quantization config");
    if (carrier == Carrier::quantization_param_path)
      result.notes.push_back(
          "SGLang's --quantization-param-path is not applied on some model paths in the versions "
          "kvaudit knows (sgl-project/sglang#18818); confirm after launch with kvaudit logs");
    files[kMarkerFile] =
        marker_json(request, carrier, result.launch_flags, tensor_names, scales).dump(2) + "\n";

    write_staged(files, out_dir);
    return result;
  }

  if (request.dry_run) return result;  // no view: the attempts say why nothing loads
  std::string reasons;
  for (const CarrierAttempt& attempt : result.attempts)
    reasons +=
        fmt::format("{}{}: {}{}", reasons.empty() ? "" : "; ", carrier_name(attempt.carrier),
                    attempt.why, attempt.reference.empty() ? "" : " [" + attempt.reference + "]");
  if (reasons.empty())
    reasons = fmt::format("no carrier for a {} checkpoint with --granularity {}",
                          method.empty() ? "plain" : method,
                          request.granularity == Granularity::tensor ? "tensor" : "head");
  throw InputError(request.model_dir.string(),
                   fmt::format("{} cannot load KV scales for {}: {}. Instead keep a 16-bit KV "
                               "cache (--kv-cache-dtype bf16), or calibrate for an engine version "
                               "that loads them (kvaudit check lists which)",
                               engine_label, model.architecture, reasons));
}

checkpoint::ModelFacts without_kv_quantization(const checkpoint::ModelFacts& model) {
  checkpoint::ModelFacts out = model;
  if (out.quant) {
    out.quant->kv_cache_quant_algo.clear();
    out.quant->has_kv_cache_scheme = false;
    out.quant->kv_cache_scheme = nullptr;
  }
  return out;
}

namespace {

constexpr const char* kSixteenBitMarker = "kvaudit-16bit-overlay.json";

// Sets the dotted key to null where its parent object exists; true when it changed.
bool null_key(json& document, const std::string& dotted) {
  json* node = &document;
  std::vector<std::string> parts = split_list(dotted, '.');
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    if (!node->is_object() || !node->contains(parts[i])) return false;
    node = &(*node)[parts[i]];
  }
  if (!node->is_object() || !node->contains(parts.back()) || (*node)[parts.back()].is_null())
    return false;
  (*node)[parts.back()] = nullptr;
  return true;
}

}  // namespace

SixteenBitOverlayResult write_sixteen_bit_overlay(const engines::EngineModel& engine,
                                                  const engines::LaunchFlags& flags,
                                                  const checkpoint::ModelFacts& model,
                                                  const fs::path& out_dir) {
  const std::string where = out_dir.string();
  const auto& setting = engine.kv_dtype_setting.sixteen_bit_overlay;
  if (!setting)
    throw InputError("--write-overlay",
                     fmt::format("{} runs a 16-bit KV cache from its {} setting: no overlay is "
                                 "needed",
                                 engine.engine, engine.kv_dtype_setting.flag));
  if (model.dir.empty() || !fs::is_directory(model.dir))
    throw InputError("--write-overlay", "needs the checkpoint folder (not a bare config.json)");
  std::error_code ec;
  const fs::path model_dir = fs::canonical(model.dir, ec);
  if (fs::exists(out_dir, ec) && fs::canonical(out_dir, ec) == model_dir)
    throw InputError(where,
                     "is the checkpoint folder; the original is never modified: name a "
                     "new folder");
  if (fs::exists(out_dir, ec) && !fs::is_directory(out_dir, ec))
    throw InputError(where, "exists and is not a folder");
  if (fs::exists(out_dir, ec) && !fs::is_empty(out_dir, ec) &&
      !fs::exists(out_dir / kSixteenBitMarker, ec))
    throw InputError(where,
                     "is not empty and holds no earlier overlay of kvaudit; refusing to "
                     "overwrite it");
  // The config files that declare the KV quantization, rewritten.
  std::map<std::string, std::string> files;
  SixteenBitOverlayResult result;
  for (const auto& [file, key] : std::vector<std::pair<std::string, std::string>>{
           {setting->file, setting->key}, {"config.json", setting->inline_key}}) {
    if (key.empty() || !fs::exists(model_dir / file, ec)) continue;
    json document = read_json_object(model_dir / file);
    if (null_key(document, key)) {
      files[file] = document.dump(2) + "\n";
      result.edited.push_back(fmt::format("{}: {} = null", file, key));
    }
  }
  if (files.empty())
    throw InputError(where, fmt::format("the checkpoint declares no KV quantization at {} or "
                                        "config.json {}: {} already keeps the model dtype",
                                        setting->key, setting->inline_key, engine.engine));
  files[kSixteenBitMarker] = json{{"kvaudit", "16-bit KV overlay"},
                                  {"engine", engine.engine},
                                  {"original", model_dir.string()},
                                  {"edited", result.edited},
                                  {"why", setting->reason}}
                                 .dump(2) +
                             "\n";
  // Staged beside the destination, checked, then renamed into place (atomic for readers).
  // A folder that cannot be written is bad input naming it, not an internal error; the
  // scratch folder goes with the exception.
  const fs::path parent = fs::absolute(out_dir).parent_path();
  ScratchFolder staging;
  try {
    fs::create_directories(parent);
    staging.path = scratch_name(parent, "16bit");
    merged_view(model_dir, files, staging.path);
  } catch (const fs::filesystem_error& error) {
    throw InputError(where, fmt::format("cannot be written: {}", error.code().message()));
  }
  for (const auto& entry : fs::directory_iterator(model_dir))
    if (!files.count(entry.path().filename().string()))
      result.linked.push_back(entry.path().filename().string());
  checkpoint::ReadOptions read;
  read.read_safetensors = false;  // the weights are the original's, linked
  checkpoint::ModelFacts view = checkpoint::read_checkpoint(staging.path, read);
  engines::LaunchFlags as_served = flags;
  as_served.kv_cache_dtype = "auto";
  as_served.kv_cache_dtype_flag.clear();
  result.resolved = engines::resolve_kv(view, as_served, engine);
  if (result.resolved.quantized)
    throw InputError(where, fmt::format("the overlay would still run a {} cache ({}); not written",
                                        result.resolved.kv_cache_dtype, result.resolved.reason));
  try {
    if (fs::exists(out_dir, ec)) fs::remove_all(out_dir);
    fs::rename(staging.path, out_dir);
  } catch (const fs::filesystem_error& error) {
    throw InputError(where, fmt::format("cannot be written: {}", error.code().message()));
  }
  staging.path.clear();
  result.out_dir = out_dir;
  return result;
}

}  // namespace kvaudit::calibrate
