// KV set-up: what SGLang would allocate for this checkpoint and these flags, turned into a
// numerics KV format with the exact scales the cache divides by. The dtype decision is
// engines::resolve_kv (the same call `kvaudit check` makes); the scale fallback follows
// SGLang's BaseKVCacheMethod (both scales > 0: used; neither: 1.0, silently; one: the larger
// for both; a non-scalar scale: refused at load time) and load_kv_cache_scales for
// --quantization-param-path (fp8_e4m3 only, one scale for K and V per layer, TP rank 0).
// SGLang writes the cache with a PyTorch cast (x / scale).to(float8), which turns |x| >= 480
// into NaN for E4M3 and overflows E5M2 to inf: SGLang spellings therefore map to "+nan".
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "serve/serve.h"
#include "util/util.h"

namespace kvaudit::serve {

namespace {

using checkpoint::ScaleRole;

// The vocabulary dtypes serve can store: one element per value and at most one static
// scale per tensor (16-bit and FP8 layouts), stored with the numerics codec of that element.
// Block-scaled, per-token-head and packed layouts need codecs the reference engine lacks.
std::optional<std::string> serve_codec(const engines::KvDtype* dtype) {
  if (!dtype || dtype->block_elements > 0 || dtype->v_element ||
      (dtype->scales != engines::ScaleSemantics::none &&
       dtype->scales != engines::ScaleSemantics::static_per_tensor))
    return std::nullopt;
  using numerics::ElementType;
  switch (dtype->element) {
    case ElementType::bf16:
    case ElementType::f16:
    case ElementType::fp8_e4m3:
    case ElementType::fp8_e5m2:
      return std::string(numerics::element_traits(dtype->element).name);
    default:
      return std::nullopt;
  }
}

int layer_count(const checkpoint::ModelFacts& facts) {
  return facts.num_layers > 0 ? facts.num_layers : static_cast<int>(facts.layers.size());
}

numerics::KvLayout layout_of(const checkpoint::ModelFacts& facts) {
  numerics::KvLayout layout;
  layout.kv_heads = facts.num_kv_heads;
  layout.head_dim = facts.head_dim;
  for (const auto& layer : facts.layers)
    if (checkpoint::holds_kv_cache(layer.kind) && layer.kv_heads > 0) {
      layout.kv_heads = layer.kv_heads;
      layout.head_dim = layer.k_head_dim;
      break;
    }
  return layout;
}

// The checkpoint scale tensors SGLang loads, per layer and role (values as stored).
struct LayerScaleTensors {
  std::vector<const checkpoint::ScaleTensor*> k, v;
};
std::map<int, LayerScaleTensors> loaded_scale_tensors(const checkpoint::ModelFacts& facts,
                                                      const engines::ResolvedKv& resolved) {
  std::map<int, LayerScaleTensors> out;
  for (const auto& scale : facts.kv_scales) {
    if (std::find(resolved.loaded_scale_names.begin(), resolved.loaded_scale_names.end(),
                  scale.name) == resolved.loaded_scale_names.end())
      continue;
    if (scale.layer < 0) continue;
    auto& entry = out[scale.layer];
    if (scale.role != ScaleRole::v) entry.k.push_back(&scale);
    if (scale.role != ScaleRole::k) entry.v.push_back(&scale);
  }
  return out;
}

// SGLang: scales start at -1; a loaded scalar replaces it (the last one loaded wins).
float scalar_or_missing(const std::vector<const checkpoint::ScaleTensor*>& tensors,
                        const checkpoint::ModelFacts& facts) {
  float value = -1.0f;
  for (const auto* tensor : tensors) {
    if (tensor->values.size() != 1)
      throw InputError(facts.dir.string(),
                       fmt::format("Only support per-tensor scaling factor for fp8 KV cache: {} "
                                   "has {} values (SGLang refuses per-head scales at load time; "
                                   "--kv-cache-dtype fp8_e4m3:head serves them, a kvaudit "
                                   "extension)",
                                   tensor->name, tensor->values.size()));
    value = tensor->values[0];
  }
  return value;
}

void sglang_scales(const checkpoint::ModelFacts& facts, const ServeOptions& options,
                   const engines::FallbackRule& fallback, KvSetup& kv) {
  const int layers = layer_count(facts);
  kv.k_scales.assign(layers, 1.0f);
  kv.v_scales.assign(layers, 1.0f);
  bool from_checkpoint = false;
  auto tensors = loaded_scale_tensors(facts, kv.resolved);
  for (int layer = 0; layer < layers; ++layer) {
    auto it = tensors.find(layer);
    if (it == tensors.end()) continue;
    float k = scalar_or_missing(it->second.k, facts);
    float v = scalar_or_missing(it->second.v, facts);
    // The engine model's fallback rule (the same one kvaudit check applies).
    engines::LayerScales applied =
        engines::apply_fallback(fallback, it->second.k.empty() ? std::nullopt : std::optional(k),
                                it->second.v.empty() ? std::nullopt : std::optional(v));
    if (!applied.error_id.empty())
      throw InputError(facts.dir.string(),
                       fmt::format("layer {}: {} (SGLang stops at start-up: {})", layer,
                                   applied.error_id, applied.error));
    kv.k_scales[layer] = applied.k, kv.v_scales[layer] = applied.v;
    from_checkpoint |= applied.from_checkpoint;
  }
  kv.scale_source =
      from_checkpoint ? engines::ScaleSource::checkpoint : engines::ScaleSource::unit_default;

  if (kv.kv_cache_dtype == "fp8_e4m3") {
    if (!options.quantization_param_path.empty()) {
      auto json_scales = read_quantization_param_file(options.quantization_param_path,
                                                      facts.model_type, layers, kv.load_messages);
      if (json_scales) {
        kv.k_scales = *json_scales;
        kv.v_scales = *json_scales;
        kv.scale_source = engines::ScaleSource::quantization_param_path;
      }
      // SGLang logs this whether or not the loader fell back to 1.0.
      kv.load_messages.push_back(
          {"INFO", "Loaded KV cache scaling factors from " + options.quantization_param_path});
    } else if (kv.resolved.scale_warning_text) {
      kv.load_messages.push_back({"WARNING", *kv.resolved.scale_warning_text});
    }
  }
}

// Scales for an explicit numerics format with a static strategy (kvaudit extension): the
// checkpoint's tensors as they are, 1.0 where there are none.
void extension_scales(const checkpoint::ModelFacts& facts, KvSetup& kv) {
  const auto strategy = kv.format.strategy;
  if (strategy != numerics::ScaleStrategy::tensor && strategy != numerics::ScaleStrategy::head &&
      strategy != numerics::ScaleStrategy::channel) {
    kv.scale_source = kv.format.element == numerics::ElementType::bf16 ||
                              kv.format.element == numerics::ElementType::f16 ||
                              kv.format.element == numerics::ElementType::f32
                          ? engines::ScaleSource::not_applicable
                          : engines::ScaleSource::dynamic_by_design;
    return;
  }
  const numerics::KvLayout layout = layout_of(facts);
  const size_t shape = strategy == numerics::ScaleStrategy::tensor ? 1
                       : strategy == numerics::ScaleStrategy::head
                           ? static_cast<size_t>(layout.kv_heads)
                           : static_cast<size_t>(layout.row_elements());
  const int layers = layer_count(facts);
  kv.scales.assign(layers, {});
  kv.k_scales.assign(layers, 1.0f);
  kv.v_scales.assign(layers, 1.0f);
  bool any = false;
  auto tensors = loaded_scale_tensors(facts, kv.resolved);
  for (int layer = 0; layer < layers; ++layer) {
    for (int role = 0; role < 2; ++role) {
      std::vector<float> values(shape, 1.0f);
      auto it = tensors.find(layer);
      if (it != tensors.end()) {
        const auto& list = role == 0 ? it->second.k : it->second.v;
        if (!list.empty()) {
          const auto* tensor = list.back();
          if (tensor->values.size() == shape) {
            values = tensor->values;
          } else if (tensor->values.size() == 1) {
            values.assign(shape, tensor->values[0]);
          } else {
            throw InputError(facts.dir.string(),
                             fmt::format("{} has {} values; {} needs {} (or one)", tensor->name,
                                         tensor->values.size(), kv.format.spec, shape));
          }
          any = true;
        }
      }
      for (float value : values)
        if (!(std::isfinite(value) && value > 0.0f))
          throw InputError(facts.dir.string(),
                           fmt::format("layer {} {} scale {} is not a positive finite number",
                                       layer, role == 0 ? "K" : "V", value));
      (role == 0 ? kv.k_scales : kv.v_scales)[layer] =
          *std::max_element(values.begin(), values.end());
      kv.scales[layer][role] = numerics::StaticAmax{{}, values};
    }
  }
  kv.scale_source = any ? engines::ScaleSource::checkpoint : engines::ScaleSource::unit_default;
}

}  // namespace

KvSetup resolve_kv_setup(const engines::Registry& registry, const checkpoint::ModelFacts& facts,
                         const ServeOptions& options) {
  KvSetup kv;
  kv.requested = options.kv_cache_dtype;
  // serve emulates SGLang: its start-up lines, /server_info and KV set-up are SGLang's.
  const engines::EngineModel& engine = registry.engine(kEmulatedEngine);
  kv.engine_version =
      options.engine_version.empty() ? engine.latest_known_version : options.engine_version;
  auto version = engines::parse_version(kv.engine_version);
  if (!version)
    throw InputError("--engine-version",
                     fmt::format("cannot read SGLang version '{}'", options.engine_version));
  std::vector<std::string> choices = engines::kv_cache_dtype_choices(engine, *version);
  kv.sglang_spelling =
      std::find(choices.begin(), choices.end(), options.kv_cache_dtype) != choices.end();

  engines::LaunchFlags flags;
  flags.engine = kEmulatedEngine;
  flags.engine_version = kv.engine_version;
  flags.kv_cache_dtype = kv.sglang_spelling ? options.kv_cache_dtype : "auto";
  flags.kv_cache_dtype_flag = "--kv-cache-dtype";
  flags.model_path = options.model_dir.string();
  flags.quantization_param_path = options.quantization_param_path;
  flags.context_length = options.context_length;
  flags.memory_fraction = options.mem_fraction_static;
  flags.max_total_tokens = options.max_total_tokens;
  flags.source = "kvaudit serve flags";
  kv.resolved = engines::resolve_kv(facts, flags, engine);

  if (kv.sglang_spelling) {
    kv.kv_cache_dtype = kv.resolved.kv_cache_dtype;
    const engines::KvDtype* dtype = engine.dtypes->find(kv.kv_cache_dtype);
    const std::optional<std::string> codec = serve_codec(dtype);
    if (!codec)
      throw InputError("--kv-cache-dtype",
                       fmt::format("SGLang would allocate a {} KV cache, which serve cannot store "
                                   "(it serves bf16, fp16, fp8_e4m3, fp8_e5m2 and numerics "
                                   "formats such as int8:token)",
                                   kv.kv_cache_dtype));
    kv.torch_dtype = dtype->torch_dtype;
    const bool fp8 = dtype->scales == engines::ScaleSemantics::static_per_tensor;
    if (fp8) {
      sglang_scales(facts, options, engine.fallback_for(*version), kv);
      bool unit =
          std::all_of(kv.k_scales.begin(), kv.k_scales.end(), [](float s) { return s == 1.0f; }) &&
          std::all_of(kv.v_scales.begin(), kv.v_scales.end(), [](float s) { return s == 1.0f; });
      kv.format = numerics::parse_kv_format(*codec + (unit ? ":none+nan" : ":tensor+nan"));
      if (!unit) {
        kv.scales.resize(kv.k_scales.size());
        for (size_t layer = 0; layer < kv.k_scales.size(); ++layer) {
          kv.scales[layer][0] = numerics::StaticAmax{{}, {kv.k_scales[layer]}};
          kv.scales[layer][1] = numerics::StaticAmax{{}, {kv.v_scales[layer]}};
        }
      }
    } else {
      kv.format = numerics::parse_kv_format(*codec);
      kv.scale_source = engines::ScaleSource::not_applicable;
    }
  } else {
    try {
      kv.format = numerics::parse_kv_format(options.kv_cache_dtype);
    } catch (const InputError&) {
      std::string known;
      for (const auto& choice : choices) known += (known.empty() ? "" : ", ") + choice;
      throw InputError("--kv-cache-dtype",
                       fmt::format("'{}' is neither an SGLang {} choice ({}) nor a kvaudit KV "
                                   "format (e.g. fp8_e4m3:head, int8:token, int4:kivi)",
                                   options.kv_cache_dtype, version_text(*version), known));
    }
    kv.kv_cache_dtype = kv.format.spec;
    extension_scales(facts, kv);
    kv.load_messages.push_back(
        {"INFO", fmt::format("kvaudit KV format {} (not an SGLang dtype); scales: {}",
                             kv.format.spec, engines::scale_source_name(kv.scale_source))});
  }
  if (facts.linear_attention) {
    // As the emulated SGLang release decides it (data/engines/sglang.json defaults); int8
    // is a kvaudit extension (vLLM's quantized SSM caches), not an SGLang choice.
    const engines::EngineDefaults& defaults = engine.defaults_for(*version);
    const engines::MambaSsmDtype ssm = engines::resolve_mamba_ssm_dtype(
        defaults, options.mamba_ssm_dtype, facts.linear_attention->ssm_dtype);
    const auto& ssm_choices = defaults.mamba_ssm_dtype_choices;
    const bool sglang_choice =
        std::find(ssm_choices.begin(), ssm_choices.end(), ssm.dtype) != ssm_choices.end();
    if (!sglang_choice && ssm.dtype != "int8")
      throw InputError(
          ssm.origin == "launch flag" ? "--mamba-ssm-dtype" : facts.config_file,
          fmt::format("mamba_ssm_dtype '{}' ({}) is not a choice of SGLang {} ({}; "
                      "int8 as a kvaudit extension)",
                      ssm.dtype, ssm.origin, kv.engine_version, fmt::join(ssm_choices, ", ")));
    kv.state = model::parse_state_format(ssm.dtype, 0);
    kv.load_messages.push_back(
        {"INFO", fmt::format("Mamba/linear-attention state dtype: {} ({}; stored after each "
                             "prefill and decode step)",
                             kv.state.spec, ssm.origin)});
  } else if (!options.mamba_ssm_dtype.empty()) {
    throw InputError("--mamba-ssm-dtype", "the model has no linear-attention layers");
  }
  return kv;
}

PoolPlan plan_pool(const KvSetup& kv, int num_layers, int kv_heads, int head_dim,
                   int64_t weight_bytes, int64_t max_position_embeddings,
                   const ServeOptions& options) {
  PoolPlan pool;
  numerics::KvLayout layout{kv_heads, head_dim};
  pool.k_bytes_per_token = numerics::row_bytes(kv.format, layout, numerics::KvRole::key) *
                           static_cast<int64_t>(num_layers);
  pool.v_bytes_per_token = numerics::row_bytes(kv.format, layout, numerics::KvRole::value) *
                           static_cast<int64_t>(num_layers);
  pool.cell_bytes_per_token = pool.k_bytes_per_token + pool.v_bytes_per_token;
  if (pool.cell_bytes_per_token <= 0)
    throw InputError("--kv-cache-dtype", "the format stores no bytes per token");
  if (!(options.mem_fraction_static > 0.0 && options.mem_fraction_static <= 1.0))
    throw InputError("--mem-fraction-static", "must be in (0, 1]");

  int64_t pool_bytes = 0;
  if (options.max_total_tokens) {
    if (*options.max_total_tokens < 2)
      throw InputError("--max-total-tokens", "must be at least 2 tokens");
    pool.max_total_num_tokens = *options.max_total_tokens;
    pool_bytes = pool.max_total_num_tokens * pool.cell_bytes_per_token;
  } else {
    if (options.kv_pool_mib <= 0 || options.kv_pool_mib > (int64_t{1} << 20))
      throw InputError("--kv-pool-mib", "must be between 1 and 1048576");
    pool_bytes = options.kv_pool_mib << 20;
    pool.max_total_num_tokens = pool_bytes / pool.cell_bytes_per_token;
    if (pool.max_total_num_tokens < 2)
      throw InputError("--kv-pool-mib", "holds fewer than 2 tokens of this KV format");
  }
  pool.context_length = options.context_length.value_or(max_position_embeddings);
  if (pool.context_length < 2) throw InputError("--context-length", "must be at least 2 tokens");
  if (pool.context_length > max_position_embeddings)
    throw InputError("--context-length",
                     fmt::format("{} exceeds the model's max_position_embeddings {}",
                                 pool.context_length, max_position_embeddings));
  pool.max_req_input_len =
      std::min(pool.context_length - 1, pool.max_total_num_tokens - pool.page_size);
  pool.weight_bytes = weight_bytes;
  // SGLang: rest = avail_after_weights - total_before_load * (1 - fraction); choose the
  // virtual device so that rest is exactly the pool budget.
  const double f = options.mem_fraction_static;
  pool.total_before_load_bytes = (static_cast<double>(pool_bytes) + weight_bytes) / f;
  pool.avail_after_weights_bytes = pool.total_before_load_bytes - weight_bytes;
  pool.avail_after_pool_bytes =
      pool.avail_after_weights_bytes -
      static_cast<double>((pool.max_total_num_tokens + pool.page_size) * pool.cell_bytes_per_token);
  return pool;
}

}  // namespace kvaudit::serve
