// read_checkpoint: configs, quantization declarations, safetensors headers, KV scales.
#include "checkpoint/checkpoint.h"

#include <fmt/format.h>

#include <algorithm>
#include <exception>
#include <thread>

#include <simdjson.h>

#include "checkpoint/internal.h"
#include "util/json.h"
#include "util/util.h"

namespace kvaudit::checkpoint {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

json read_json_file(const fs::path& path) {
  std::string text = read_text_file(path, 256ull << 20);
  if (text.empty()) throw InputError(path.string(), "file is empty, expected JSON");
  try {
    return json::parse(text);
  } catch (const json::exception& error) {
    // Syntax errors, and numbers past a double's range (out_of_range, not parse_error).
    // nlohmann's message carries the byte position; drop its "[json.exception...]" prefix.
    std::string message = error.what();
    if (auto pos = message.find("] "); pos != std::string::npos) message = message.substr(pos + 2);
    throw InputError(path.string(), "invalid JSON: " + message);
  }
}

std::string text_of(const json& object, const char* key) {
  auto it = object.find(key);
  return it == object.end() ? std::string() : json_text(*it);
}

// Fills the KV-relevant parts of a quantization declaration (ModelOpt's
// "quantization" block, or any quantization_config).
void read_quant_block(const json& block, QuantFacts& quant) {
  if (!block.is_object()) return;
  if (quant.method.empty()) quant.method = text_of(block, "quant_method");
  if (quant.weight_algo.empty()) quant.weight_algo = text_of(block, "quant_algo");
  for (const char* key : {"kv_cache_quant_algo", "kv_cache_quant_method"}) {
    std::string value = text_of(block, key);
    if (!value.empty() && quant.kv_cache_quant_algo.empty()) {
      quant.kv_cache_quant_algo = value;
      quant.kv_algo_key = key;
    }
  }
  if (auto it = block.find("kv_cache_scheme"); it != block.end() && it->is_object()) {
    quant.has_kv_cache_scheme = true;
    quant.kv_cache_scheme = *it;
    quant.kv_scheme_strategy = text_of(*it, "strategy");
    quant.kv_scheme_type = text_of(*it, "type");
    if (auto bits = it->find("num_bits"); bits != it->end() && bits->is_number_integer())
      quant.kv_scheme_bits = bits->get<int>();
    if (auto dynamic = it->find("dynamic"); dynamic != it->end() && dynamic->is_boolean())
      quant.kv_scheme_dynamic = dynamic->get<bool>();
  }
  // Newer ModelOpt exports nest the same block again under "quantization".
  if (auto it = block.find("quantization"); it != block.end() && it->is_object())
    read_quant_block(*it, quant);
}

// config.json's quantization_config (the outer config's, else text_config's).
std::optional<QuantFacts> read_config_quant(const fs::path& dir, const json& config,
                                            const json& text_config) {
  for (const json* source : {&config, &text_config}) {
    auto it = source->find("quantization_config");
    if (it == source->end() || it->is_null()) continue;
    if (!it->is_object())
      throw InputError((dir / "config.json").string(), "quantization_config is not an object");
    QuantFacts quant;
    quant.source_file = (dir / "config.json").string();
    quant.source_key =
        source == &config ? "quantization_config" : "text_config.quantization_config";
    read_quant_block(*it, quant);
    if (auto producer = it->find("producer"); producer != it->end() && producer->is_object())
      quant.producer =
          fmt::format("{} {}", text_of(*producer, "name"), text_of(*producer, "version"));
    return quant;
  }
  return std::nullopt;
}

std::optional<QuantFacts> read_quant_facts(const fs::path& dir, const json& config,
                                           const json& text_config) {
  std::optional<QuantFacts> from_config = read_config_quant(dir, config, text_config);
  fs::path hf_quant = dir / "hf_quant_config.json";
  std::error_code ec;
  if (!fs::exists(hf_quant, ec)) return from_config;
  json doc = read_json_file(hf_quant);
  if (!doc.is_object()) throw InputError(hf_quant.string(), "expected a JSON object");
  QuantFacts quant;
  quant.source_file = hf_quant.string();
  quant.source_key = "quantization";
  quant.method = "modelopt";
  if (auto producer = doc.find("producer"); producer != doc.end() && producer->is_object())
    quant.producer =
        fmt::format("{} {}", text_of(*producer, "name"), text_of(*producer, "version"));
  auto block = doc.find("quantization");
  if (block == doc.end() || !block->is_object())
    throw InputError(hf_quant.string(), "has no \"quantization\" object");
  read_quant_block(*block, quant);
  // The ModelOpt sidecar is the declaration kvaudit audits; config.json's, when present,
  // is kept beside it so a disagreement between the two can be reported.
  if (from_config) {
    quant.other_source_file = from_config->source_file;
    quant.other_source_key = from_config->source_key;
    quant.other_kv_declared = from_config->kv_declared();
  }
  return quant;
}

}  // namespace

void read_safetensors_index(
    std::string_view text, const std::string& where,
    const std::function<void(std::string_view tensor, std::string_view shard)>& each) {
  simdjson::dom::parser parser;
  simdjson::padded_string padded(text);
  simdjson::dom::element doc;
  if (auto error = parser.parse(padded).get(doc))
    throw InputError(where, fmt::format("invalid JSON ({})", simdjson::error_message(error)));
  simdjson::dom::object map;
  if (doc["weight_map"].get_object().get(map) != simdjson::SUCCESS)
    throw InputError(where, "has no \"weight_map\" object");
  for (auto [tensor, file] : map) {
    std::string_view name;
    if (file.get_string().get(name) != simdjson::SUCCESS)
      throw InputError(where, fmt::format("weight_map['{}'] is not a file name", tensor));
    if (name.find('/') != std::string_view::npos || name == ".." || name.empty())
      throw InputError(
          where, fmt::format("weight_map names shard '{}' outside the checkpoint folder", name));
    each(tensor, name);
  }
}

namespace {

// Every *.safetensors in the folder, sorted.
std::vector<std::string> folder_shards(const fs::path& dir) {
  std::error_code ec;
  std::vector<std::string> shards;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (entry.path().extension() == ".safetensors")
      shards.push_back(entry.path().filename().string());
  std::sort(shards.begin(), shards.end());
  return shards;
}

fs::path index_path(const fs::path& dir) {
  return dir / "model.safetensors.index.json";
}

// Shard files named by the index (each must exist), or every *.safetensors.
std::vector<std::string> find_shards(const fs::path& dir) {  // list_shards, below
  const fs::path index = index_path(dir);
  std::error_code ec;
  if (!fs::exists(index, ec)) return folder_shards(dir);
  std::vector<std::string> shards = read_index_shard_names(index);
  for (const auto& name : shards)
    if (!fs::exists(dir / name, ec))
      throw InputError(index.string(), fmt::format("names shard '{}', which is missing", name));
  return shards;
}

}  // namespace

std::vector<std::string> list_shards(const fs::path& dir) {
  return find_shards(dir);
}

namespace {

// What the audit reads from one shard's header.
struct ShardFacts {
  uint64_t tensor_count = 0, weight_bytes = 0;
  std::vector<std::string> kv_projection_weights;
  std::vector<ScaleTensor> scales;
  std::vector<NormTensor> k_norms;
  std::exception_ptr error;
};

// Keeps, of ~12K entries per shard, the counts and the few dozen names the audit reads; the
// rest cost no allocation. Values are read once the whole header has been validated.
class ShardScan : public HeaderVisitor {
 public:
  explicit ShardScan(ShardFacts& out) : out_(out) {}
  std::vector<TensorInfo> value_tensors;  // key norms and KV scales, in header order

  void begin() override {
    out_ = ShardFacts();
    value_tensors.clear();
  }
  void metadata(std::string_view, std::string_view) override {}
  void tensor(const TensorView& tensor) override {
    ++out_.tensor_count;
    out_.weight_bytes += tensor.data_end - tensor.data_begin;
    const std::string_view name = tensor.name;
    const bool kv_projection =
        has_suffix(name, "_proj.weight") && (has_suffix(name, ".self_attn.k_proj.weight") ||
                                             has_suffix(name, ".self_attn.v_proj.weight"));
    if (!kv_projection && !reads_tensor_values(name)) return;
    // A multi-token-prediction head ("mtp.layers.0..." in Qwen3-Next / Qwen3.5) is the
    // speculative draft model, loaded only with NEXTN/MTP decoding and numbered from 0
    // on its own: its projections and scales are not the main model's layer 0.
    if (name.starts_with("mtp.") || name.find(".mtp.") != std::string_view::npos) return;
    if (kv_projection)
      out_.kv_projection_weights.emplace_back(name);
    else
      value_tensors.push_back(
          {std::string(name), tensor.dtype, tensor.shape, tensor.data_begin, tensor.data_end});
  }

 private:
  ShardFacts& out_;
};

void read_shard(const fs::path& dir, const std::string& shard, ShardFacts& out) {
  MappedHeader mapped(dir / shard);
  ShardScan scan(out);
  mapped.visit(scan);
  const SafetensorsHeader sizes = mapped.sizes();
  for (const TensorInfo& tensor : scan.value_tensors) {
    if (auto layer = classify_k_norm_tensor(tensor.name)) {
      out.k_norms.push_back(
          {tensor.name, shard, *layer, tensor.dtype, read_tensor_values(sizes, tensor)});
      continue;
    }
    auto scale = classify_scale_tensor(tensor.name);
    scale->shard_file = shard;
    scale->dtype = tensor.dtype;
    scale->shape = tensor.shape.to_vector();
    scale->values = read_tensor_values(sizes, tensor);
    out.scales.push_back(std::move(*scale));
  }
}

// Every shard's facts, in shard order; shard_files gets the shards. Shard headers are
// independent, so a few threads read them and the caller merges them in shard order: the
// result never depends on the thread count. The index (40 MB for a 400B MoE, as much work as a
// third of its headers) is read on one thread while the others already read the folder's
// *.safetensors, which are nearly always the shards it names. Only the named shards count,
// their errors included, and the index's errors come first, as when it was read before them;
// a named shard the listing lacked is read afterwards.
std::vector<ShardFacts> read_shard_headers(const fs::path& dir,
                                           std::vector<std::string>& shard_files) {
  std::error_code ec;
  const size_t index_tasks = fs::exists(index_path(dir), ec) ? 1 : 0;
  std::vector<std::string> listed = folder_shards(dir);
  std::vector<ShardFacts> per_listed(listed.size());
  std::vector<std::string> named;
  std::exception_ptr index_error;
  auto read_into = [&](const std::string& shard, ShardFacts& out) {
    try {
      read_shard(dir, shard, out);
    } catch (...) {
      out.error = std::current_exception();
    }
  };
  const int threads = static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 8u));
  run_on_threads(index_tasks + listed.size(), threads, [&](size_t task) {
    if (task >= index_tasks) {
      read_into(listed[task - index_tasks], per_listed[task - index_tasks]);
      return true;
    }
    try {
      named = find_shards(dir);
    } catch (...) {
      index_error = std::current_exception();
    }
    return true;
  });
  if (index_error) std::rethrow_exception(index_error);
  if (index_tasks == 0) {
    shard_files = std::move(listed);
    return per_listed;
  }
  shard_files = std::move(named);
  std::vector<ShardFacts> per_shard(shard_files.size());
  std::vector<size_t> unlisted;
  for (size_t i = 0; i < shard_files.size(); ++i) {
    auto at = std::lower_bound(listed.begin(), listed.end(), shard_files[i]);
    if (at != listed.end() && *at == shard_files[i])
      per_shard[i] = std::move(per_listed[static_cast<size_t>(at - listed.begin())]);
    else
      unlisted.push_back(i);
  }
  run_on_threads(unlisted.size(), threads, [&](size_t k) {
    read_into(shard_files[unlisted[k]], per_shard[unlisted[k]]);
    return true;
  });
  return per_shard;
}

}  // namespace

void fill_from_config(const json& config, ModelFacts& facts) {
  const std::string where = facts.config_file.empty() ? "config.json" : facts.config_file;
  if (!config.is_object()) throw InputError(where, "expected a JSON object");
  const json* text_config = &config;
  if (auto it = config.find("text_config"); it != config.end() && it->is_object()) {
    text_config = &*it;
    facts.outer_model_type = text_of(config, "model_type");
  }
  facts.multimodal = config.contains("vision_config") && config["vision_config"].is_object();
  if (auto it = config.find("architectures");
      it != config.end() && it->is_array() && !it->empty() && (*it)[0].is_string())
    facts.architecture = (*it)[0].get<std::string>();
  try {
    fill_architecture(*text_config, facts);
  } catch (const InputError& error) {
    throw InputError(where, error.problem());
  } catch (const json::exception& error) {
    throw InputError(where, std::string("unexpected value: ") + error.what());
  }
  // Wrappers (Qwen3_5ForConditionalGeneration) may say it only at the top level.
  if (text_config != &config && !text_config->contains("tie_word_embeddings"))
    if (auto it = config.find("tie_word_embeddings"); it != config.end() && it->is_boolean())
      facts.tie_word_embeddings = it->get<bool>();
  if (facts.torch_dtype.empty()) facts.torch_dtype = text_of(config, "torch_dtype");
  if (facts.torch_dtype.empty()) facts.torch_dtype = text_of(config, "dtype");
  // An integer or a list of them; anything else names no end token (generation_config.json,
  // not read here, may name more).
  if (auto it = config.find("eos_token_id"); it != config.end()) {
    if (it->is_number_integer()) facts.eos_token_ids.push_back(it->get<int64_t>());
    if (it->is_array())
      for (const json& id : *it)
        if (id.is_number_integer()) facts.eos_token_ids.push_back(id.get<int64_t>());
  }
}

ModelFacts read_checkpoint(const fs::path& dir_or_config, const ReadOptions& options) {
  ModelFacts facts;
  std::error_code ec;
  fs::path config_path;
  bool bare_config = false;
  if (!fs::exists(dir_or_config, ec))
    throw InputError(dir_or_config.string(), "no such file or folder");
  if (fs::is_directory(dir_or_config, ec)) {
    facts.dir = dir_or_config;
    config_path = dir_or_config / "config.json";
    if (!fs::exists(config_path, ec)) {
      bool empty = fs::is_empty(dir_or_config, ec);
      throw InputError(dir_or_config.string(),
                       empty
                           ? "folder is empty (expected a Hugging Face checkpoint with config.json)"
                           : "no config.json (not a Hugging Face checkpoint folder?)");
    }
  } else {
    config_path = dir_or_config;
    facts.dir = dir_or_config.parent_path().empty() ? fs::path(".") : dir_or_config.parent_path();
    bare_config = true;
  }
  facts.config_file = config_path.string();
  json config = read_json_file(config_path);
  if (!config.is_object()) throw InputError(facts.config_file, "expected a JSON object");

  fill_from_config(config, facts);
  const json* text_config = &config;
  if (auto it = config.find("text_config"); it != config.end() && it->is_object())
    text_config = &*it;
  facts.quant = read_quant_facts(facts.dir, config, *text_config);

  facts.files_dir = facts.dir;
  if (bare_config || !options.read_safetensors) return facts;
  std::vector<ShardFacts> per_shard = read_shard_headers(facts.dir, facts.shard_files);
  for (auto& shard : per_shard) {
    if (shard.error) std::rethrow_exception(shard.error);  // the first failing shard in order
    facts.tensor_count += shard.tensor_count;
    facts.weight_bytes += shard.weight_bytes;
    for (auto& name : shard.kv_projection_weights)
      facts.kv_projection_weights.push_back(std::move(name));
    for (auto& scale : shard.scales) facts.kv_scales.push_back(std::move(scale));
    for (auto& norm : shard.k_norms) facts.k_norms.push_back(std::move(norm));
  }
  facts.has_weights = !facts.shard_files.empty();
  // Layer order, not string order ("layers.3" before "layers.11").
  auto layer_of = [](const std::string& name) {
    size_t at = name.find("layers.");
    return at == std::string::npos ? 0L : std::strtol(name.c_str() + at + 7, nullptr, 10);
  };
  std::sort(facts.kv_projection_weights.begin(), facts.kv_projection_weights.end(),
            [&](const std::string& a, const std::string& b) {
              long la = layer_of(a), lb = layer_of(b);
              return la != lb ? la < lb : a < b;
            });
  std::sort(facts.k_norms.begin(), facts.k_norms.end(),
            [](const NormTensor& a, const NormTensor& b) {
              return a.layer != b.layer ? a.layer < b.layer : a.name < b.name;
            });
  std::sort(facts.kv_scales.begin(), facts.kv_scales.end(),
            [](const ScaleTensor& a, const ScaleTensor& b) {
              return a.layer != b.layer ? a.layer < b.layer : a.name < b.name;
            });
  return facts;
}

}  // namespace kvaudit::checkpoint
