// plan sizes: bytes per token per GPU as each engine counts them, and the per-request
// state of hybrid GDN/Mamba models. Formulas follow SGLang's
// model_runner_kv_cache_mixin.py get_cell_size_per_token, configs/mamba_utils.py and
// vLLM's v1/core/kv_cache_utils.py (references in data/engines/capacity/*.json).
#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "plan/plan.h"
#include "util/util.h"

namespace kvaudit::plan {

namespace {

using checkpoint::LayerFacts;
using checkpoint::LayerKind;
using checkpoint::ModelFacts;

// Bytes of one stored element: FP4 is stored as float4_e2m1fn_x2, one byte per pair,
// and the engines count it with element size 1 before halving.
int64_t element_bytes(const KvDtypeSpec& dtype) {
  return std::max(1, dtype.element_bits / 8);
}

// The KV-holding layers one pipeline rank owns. Layers are split evenly, as SGLang's
// and vLLM's get_pp_indices do by default; the rank with the most KV layers decides
// the token count (both engines take the minimum over ranks).
std::vector<LayerFacts> kv_layers_of_busiest_rank(const ModelFacts& model, int pp) {
  std::vector<LayerFacts> layers = model.layers;
  if (layers.empty()) {
    for (int i = 0; i < model.num_layers; ++i) {
      LayerFacts layer;
      layer.index = i;
      layer.kv_heads = model.num_kv_heads;
      layer.k_head_dim = model.head_dim;
      layer.v_head_dim = model.head_dim;
      layers.push_back(layer);
    }
  }
  if (layers.empty())
    throw InputError(model.config_file.empty() ? "checkpoint" : model.config_file,
                     "the model has no layers plan can size");
  pp = std::max(1, pp);
  size_t best_count = 0;
  std::vector<LayerFacts> best;
  for (int rank = 0; rank < pp; ++rank) {
    size_t begin = layers.size() * rank / pp, end = layers.size() * (rank + 1) / pp;
    std::vector<LayerFacts> mine;
    for (size_t i = begin; i < end; ++i)
      if (layers[i].kind != LayerKind::linear_attention) mine.push_back(layers[i]);
    if (rank == 0 || mine.size() > best_count) {
      best_count = mine.size();
      best = std::move(mine);
    }
  }
  return best;
}

int heads_per_rank(int kv_heads, int attention_tp) {
  return std::max(1, kv_heads / std::max(1, attention_tp));
}

}  // namespace

CellSize sglang_cell_size(const ModelFacts& model, const KvDtypeSpec& dtype,
                          const Parallelism& parallel) {
  CellSize cell;
  std::vector<LayerFacts> layers = kv_layers_of_busiest_rank(model, parallel.pp);
  const int64_t bytes = element_bytes(dtype);
  const int attn_tp = parallel.attention_tp();
  int mla_layers = 0;
  for (const auto& layer : layers) {
    if (layer.kind == LayerKind::mla)
      ++mla_layers;
    else if (layer.sliding_window > 0)
      ++cell.swa_layers;
    else
      ++cell.full_layers;
  }
  if (mla_layers > 0) {
    if (!model.mla) throw InputError(model.config_file, "MLA layers without MLA dimensions");
    const int64_t latent = model.mla->kv_lora_rank + model.mla->qk_rope_head_dim;
    const int64_t L = static_cast<int64_t>(layers.size());
    cell.full_layers = static_cast<int>(L);
    cell.swa_layers = 0;
    cell.kv_heads_per_rank = 1;
    int64_t raw = latent * L * bytes;
    cell.full_bytes_per_token_per_layer = latent * bytes;
    cell.derivation.push_back(
        fmt::format("MLA: (kv_lora_rank {} + qk_rope_head_dim {}) x {} layers x {} B = {} B/token "
                    "(one latent per token, not split by TP, no K/V doubling)",
                    model.mla->kv_lora_rank, model.mla->qk_rope_head_dim, L, bytes, raw));
    if (dtype.fp4_block_scales) {
      int64_t scales = (latent / 16) * L * bytes;
      cell.derivation.push_back(fmt::format(
          "FP4: {} / 2 (two values per byte) + ({} / 16) x {} layers scale bytes = {} B/token", raw,
          latent, L, raw / 2 + scales));
      raw = raw / 2 + scales;
    }
    cell.bytes_per_token = raw;
    return cell;
  }

  // Full-attention layers (and sliding-window layers, counted separately).
  int kv_heads = 0, k_dim = 0, v_dim = 0, swa_heads = 0, swa_k = 0, swa_v = 0;
  for (const auto& layer : layers) {
    if (layer.sliding_window > 0) {
      swa_heads = layer.kv_heads, swa_k = layer.k_head_dim, swa_v = layer.v_head_dim;
      cell.swa_window = layer.sliding_window;
    } else {
      kv_heads = layer.kv_heads, k_dim = layer.k_head_dim, v_dim = layer.v_head_dim;
    }
  }
  bool hybrid_swa = cell.full_layers > 0 && cell.swa_layers > 0;
  if (!hybrid_swa && cell.swa_layers > 0) {
    // Every layer slides: SGLang keeps one ordinary pool sized for full-length tokens.
    kv_heads = swa_heads, k_dim = swa_k, v_dim = swa_v;
    cell.full_layers = cell.swa_layers;
    cell.swa_layers = 0;
    cell.swa_window = 0;
    cell.derivation.push_back("every KV layer uses a sliding window: one ordinary pool");
  }
  cell.kv_heads_per_rank = heads_per_rank(kv_heads, attn_tp);
  cell.full_bytes_per_token_per_layer =
      static_cast<int64_t>(cell.kv_heads_per_rank) * (k_dim + v_dim) * bytes;
  std::string heads_note =
      kv_heads < attn_tp
          ? fmt::format(
                "max(1, {} kv heads // attention TP {}) = {} (heads replicated: each GPU "
                "holds a full head)",
                kv_heads, attn_tp, cell.kv_heads_per_rank)
          : fmt::format("{} kv heads // attention TP {} = {}", kv_heads, attn_tp,
                        cell.kv_heads_per_rank);
  int64_t raw = cell.full_bytes_per_token_per_layer * cell.full_layers;
  cell.derivation.push_back(fmt::format(
      "kv heads per GPU: {}; full-attention KV: {} heads x (K {} + V {}) x {} layers x {} B = {} "
      "B/token",
      heads_note, cell.kv_heads_per_rank, k_dim, v_dim, cell.full_layers, bytes, raw));
  if (hybrid_swa) {
    int swa_rank_heads = heads_per_rank(swa_heads, attn_tp);
    cell.swa_bytes_per_token_per_layer =
        static_cast<int64_t>(swa_rank_heads) * (swa_k + swa_v) * bytes;
    int64_t swa_raw = cell.swa_bytes_per_token_per_layer * cell.swa_layers;
    cell.derivation.push_back(fmt::format(
        "sliding-window KV (window {}): {} heads x (K {} + V {}) x {} layers x {} B = {} B/token, "
        "in its own pool",
        cell.swa_window, swa_rank_heads, swa_k, swa_v, cell.swa_layers, bytes, swa_raw));
    raw += swa_raw;
  }
  if (dtype.fp4_block_scales) {
    int64_t scales = (static_cast<int64_t>(cell.kv_heads_per_rank) * k_dim *
                      (cell.full_layers + cell.swa_layers) * 2 * bytes) /
                     16;
    cell.derivation.push_back(fmt::format(
        "FP4: {} / 2 (two values per byte) + {} heads x {} x {} layers x 2 / 16 scale bytes = {} "
        "B/token",
        raw, cell.kv_heads_per_rank, k_dim, cell.full_layers + cell.swa_layers, raw / 2 + scales));
    raw = raw / 2 + scales;
  }
  cell.bytes_per_token = raw;
  return cell;
}

std::optional<MambaState> sglang_mamba_state(const ModelFacts& model, const Parallelism& parallel) {
  if (!model.linear_attention) return std::nullopt;
  const auto& la = *model.linear_attention;
  MambaState state;
  for (const auto& layer : model.layers)
    if (layer.kind == LayerKind::linear_attention) ++state.linear_layers;
  // Busiest pipeline rank: layers split evenly.
  if (parallel.pp > 1) {
    int best = 0;
    for (int rank = 0; rank < parallel.pp; ++rank) {
      size_t begin = model.layers.size() * rank / parallel.pp;
      size_t end = model.layers.size() * (rank + 1) / parallel.pp;
      int n = 0;
      for (size_t i = begin; i < end; ++i) n += model.layers[i].kind == LayerKind::linear_attention;
      best = std::max(best, n);
    }
    state.linear_layers = best;
  }
  if (state.linear_layers == 0) return std::nullopt;
  const int tp = std::max(1, parallel.attention_tp());
  int64_t n_groups = la.num_key_heads;
  if (n_groups % tp != 0) n_groups = tp;  // extra_groups_for_head_shards
  const int64_t conv_dim =
      static_cast<int64_t>(la.num_value_heads) * la.value_head_dim + 2 * n_groups * la.key_head_dim;
  const int64_t conv_elems = conv_dim / tp * (la.conv_kernel - 1);
  const int64_t conv_bytes = 2;  // bfloat16 unless SGLANG_MAMBA_CONV_DTYPE says otherwise
  int64_t ssm_bytes = 4;         // float32 default
  if (la.ssm_dtype == "bfloat16" || la.ssm_dtype == "float16") ssm_bytes = 2;
  const int64_t ssm_elems =
      static_cast<int64_t>(la.num_value_heads) / tp * la.value_head_dim * la.key_head_dim;
  state.conv_bytes_per_layer = conv_elems * conv_bytes;
  state.ssm_bytes_per_layer = ssm_elems * ssm_bytes;
  state.bytes_per_request =
      (state.conv_bytes_per_layer + state.ssm_bytes_per_layer) * state.linear_layers;
  state.derivation.push_back(fmt::format(
      "GDN/Mamba state per request: conv ({} value heads x {} + 2 x {} key groups x {}) / TP {} x "
      "(kernel {} - 1) x 2 B = {} B/layer; recurrent {} value heads / TP {} x {} x {} x {} B "
      "({}) = {} B/layer; x {} linear layers = {} B/request",
      la.num_value_heads, la.value_head_dim, n_groups, la.key_head_dim, tp, la.conv_kernel,
      state.conv_bytes_per_layer, la.num_value_heads, tp, la.value_head_dim, la.key_head_dim,
      ssm_bytes, la.ssm_dtype.empty() ? "float32 default" : la.ssm_dtype, state.ssm_bytes_per_layer,
      state.linear_layers, state.bytes_per_request));
  return state;
}

VllmLayout vllm_layout(const ModelFacts& model, const KvDtypeSpec& dtype,
                       const Parallelism& parallel, int block_size) {
  VllmLayout layout;
  layout.block_size = block_size;
  std::vector<LayerFacts> layers = kv_layers_of_busiest_rank(model, parallel.pp);
  const int64_t bytes = element_bytes(dtype);
  // Layers group by spec: (kind, window). vLLM requires one page size across groups.
  std::map<std::pair<int, int>, int> count_by_spec;
  for (const auto& layer : layers) {
    int64_t page;
    if (layer.kind == LayerKind::mla) {
      if (!model.mla) throw InputError(model.config_file, "MLA layers without MLA dimensions");
      page = static_cast<int64_t>(block_size) *
             (model.mla->kv_lora_rank + model.mla->qk_rope_head_dim) * bytes;
    } else {
      int heads = heads_per_rank(layer.kv_heads, parallel.tp);
      page =
          static_cast<int64_t>(block_size) * heads * (layer.k_head_dim + layer.v_head_dim) * bytes;
    }
    layout.page_bytes_per_layer = std::max(layout.page_bytes_per_layer, page);
    layout.bytes_per_token += page / block_size;
    count_by_spec[{static_cast<int>(layer.kind), layer.sliding_window}]++;
    if (layer.sliding_window > 0) layout.sliding_window = layer.sliding_window;
  }
  if (count_by_spec.size() == 1) {
    layout.group_size = static_cast<int>(layers.size());
    layout.num_groups = 1;
  } else {
    int min_n = 1 << 30, max_n = 0;
    for (const auto& [spec, n] : count_by_spec)
      min_n = std::min(min_n, n), max_n = std::max(max_n, n);
    layout.group_size = max_n < min_n * 1.5 ? max_n : min_n;
    for (const auto& [spec, n] : count_by_spec)
      layout.num_groups += (n + layout.group_size - 1) / layout.group_size;
  }
  layout.derivation.push_back(fmt::format(
      "vLLM page per layer: block {} x {} B/token/layer = {} B; {} KV layers in {} group(s) of {} "
      "layers; {} B/token/GPU",
      block_size, layout.page_bytes_per_layer / block_size, layout.page_bytes_per_layer,
      layers.size(), layout.num_groups, layout.group_size, layout.bytes_per_token));
  return layout;
}

}  // namespace kvaudit::plan
