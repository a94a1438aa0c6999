// plan sizes: bytes per token per GPU as each engine counts them, and the per-request
// state of hybrid GDN/Mamba models. Formulas follow SGLang's pool_configurator.py
// _compute_cell_size and kv_cache_configurator.py calculate_mla_kv_cache_dim,
// configs/mamba_utils.py, and vLLM's v1/kv_cache_interface.py page sizes (references in
// data/engines/capacity/*.json); element layouts come from data/engines/dtypes.json.
#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "plan/plan.h"
#include "plan/pools.h"
#include "util/util.h"

namespace kvaudit::plan {

namespace {

using checkpoint::LayerFacts;
using checkpoint::LayerKind;
using checkpoint::ModelFacts;

// Bytes of one stored element as torch counts it: FP4 is stored as float4_e2m1fn_x2 (or
// uint8), one byte per pair, and SGLang counts it with element size 1 before halving.
int64_t element_bytes(const engines::KvDtype& dtype) {
  return std::max(1, dtype.key_bits / 8);
}

bool sglang_fp4(const engines::KvDtype& dtype) {
  return dtype.key_bits == 4 && dtype.block_elements == 16;
}

bool sglang_mxfp8(const engines::KvDtype& dtype) {
  return dtype.key_bits == 8 && dtype.block_elements == 32;
}

int heads_per_rank(int kv_heads, int attention_tp, int dcp = 1) {
  // SGLang get_num_kv_heads(tp, dcp): the heads of attention TP / DCP ranks.
  return std::max(1, kv_heads / std::max(1, attention_tp / std::max(1, dcp)));
}

// The MLA cell of L layers: one latent (kv_lora_rank + qk_rope_head_dim) per token and
// layer, not split by TP and without K/V doubling; DSA's FP8 record and its lightning
// indexer keys; FP4 packing with its block scales.
void sglang_mla_cell(const ModelFacts& model, const engines::KvDtype& dtype, int64_t L,
                     CellSize& cell) {
  const int64_t bytes = element_bytes(dtype);
  const int64_t latent = model.mla->kv_lora_rank + model.mla->qk_rope_head_dim;
  cell.full_layers = static_cast<int>(L);
  cell.swa_layers = 0;
  cell.kv_heads_per_rank = 1;
  const bool dsa = model.mla->index_head_dim > 0;
  int64_t per_layer = latent * bytes;
  if (dsa && dtype.name == "fp8_e4m3") {
    // DSA's FP8 record: the latent in FP8, one FP32 scale per 128 values, rope in BF16.
    per_layer = model.mla->kv_lora_rank + model.mla->kv_lora_rank / 128 * 4 +
                int64_t{model.mla->qk_rope_head_dim} * 2;
    cell.derivation.push_back(fmt::format(
        "DSA FP8 record: kv_lora_rank {} + {} / 128 x 4 B scales + qk_rope_head_dim "
        "{} x 2 B = {} "
        "B/layer",
        model.mla->kv_lora_rank, model.mla->kv_lora_rank, model.mla->qk_rope_head_dim, per_layer));
  }
  int64_t raw = per_layer * L;
  cell.full_bytes_per_token_per_layer = per_layer;
  cell.derivation.push_back(
      fmt::format("MLA: (kv_lora_rank {} + qk_rope_head_dim {}) per layer, {} B/layer x {} layers "
                  "= {} B/token (one latent per token, not split by TP, no K/V doubling)",
                  model.mla->kv_lora_rank, model.mla->qk_rope_head_dim, per_layer, L, raw));
  if (dsa) {
    const int64_t index = model.mla->index_head_dim;
    const int64_t indexer = (index + index / 128 * 4) * L;
    cell.derivation.push_back(fmt::format(
        "DSA lightning indexer keys: (index_head_dim {} + {} / 128 x 4 B scales) x {} layers = "
        "{} B/token",
        index, index, L, indexer));
    raw += indexer;
  }
  if (sglang_fp4(dtype)) {
    int64_t scales = (latent / 16) * L * bytes;
    cell.derivation.push_back(fmt::format(
        "FP4: {} / 2 (two values per byte) + ({} / 16) x {} layers scale bytes = {} B/token", raw,
        latent, L, raw / 2 + scales));
    raw = raw / 2 + scales;
  }
  cell.bytes_per_token = raw;
}

// The K/V head shapes of the full-attention and the sliding-window layers (the last layer
// of each kind; the window goes into cell.swa_window).
struct HeadShapes {
  int kv_heads = 0, k_dim = 0, v_dim = 0;
  int swa_heads = 0, swa_k = 0, swa_v = 0;
};
HeadShapes head_shapes(const std::vector<LayerFacts>& layers, CellSize& cell) {
  HeadShapes h;
  for (const auto& layer : layers) {
    if (layer.sliding_window > 0) {
      h.swa_heads = layer.kv_heads, h.swa_k = layer.k_head_dim, h.swa_v = layer.v_head_dim;
      cell.swa_window = layer.sliding_window;
    } else {
      h.kv_heads = layer.kv_heads, h.k_dim = layer.k_head_dim, h.v_dim = layer.v_head_dim;
    }
  }
  return h;
}

// What a quantized cache adds to (or packs out of) `raw` bytes per token: FP4 packs two
// values a byte plus block scales (and, when the rules say so, one shared dequant workspace
// row); MXFP8 adds one UE8M0 scale per 32 values.
int64_t sglang_quantized_bytes(int64_t raw, const engines::KvDtype& dtype, const HeadShapes& h,
                               const SizingRules& rules, CellSize& cell) {
  const int64_t bytes = element_bytes(dtype);
  const int kv_layers = cell.full_layers + cell.swa_layers;
  const int k_dim = h.k_dim, v_dim = h.v_dim;
  if (sglang_fp4(dtype)) {
    int64_t scales =
        (static_cast<int64_t>(cell.kv_heads_per_rank) * k_dim * kv_layers * 2 * bytes) / 16;
    cell.derivation.push_back(fmt::format(
        "FP4: {} / 2 (two values per byte) + {} heads x {} x {} layers x 2 / 16 scale bytes = {} "
        "B/token",
        raw, cell.kv_heads_per_rank, k_dim, kv_layers, raw / 2 + scales));
    raw = raw / 2 + scales;
    if (rules.fp4_dequant_workspace) {
      int64_t workspace = static_cast<int64_t>(cell.kv_heads_per_rank) * k_dim * 2 * bytes;
      cell.derivation.push_back(fmt::format(
          "+ one shared FP8 dequant workspace row for prefill: {} heads x {} x 2 = {} B/token",
          cell.kv_heads_per_rank, k_dim, workspace));
      raw += workspace;
    }
  } else if (sglang_mxfp8(dtype)) {
    int64_t scales =
        static_cast<int64_t>(cell.kv_heads_per_rank) * (k_dim + v_dim) * kv_layers / 32;
    cell.derivation.push_back(
        fmt::format("MXFP8: + {} heads x ({} + {}) x {} layers / 32 UE8M0 scale bytes = {} B/token",
                    cell.kv_heads_per_rank, k_dim, v_dim, kv_layers, scales));
    raw += scales;
  }
  return raw;
}

}  // namespace

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
      if (holds_kv_cache(layers[i].kind)) mine.push_back(layers[i]);
    if (rank == 0 || mine.size() > best_count) {
      best_count = mine.size();
      best = std::move(mine);
    }
  }
  return best;
}

CellSize sglang_cell_size_without_draft(const ModelFacts& model, const engines::KvDtype& dtype,
                                        const Parallelism& parallel, const SizingRules& rules);

CellSize sglang_cell_size(const ModelFacts& model, const engines::KvDtype& dtype,
                          const Parallelism& parallel, const SizingRules& rules) {
  CellSize cell = sglang_cell_size_without_draft(model, dtype, parallel, rules);
  const int draft = rules.speculative_draft_layers;
  const int L = cell.full_layers + cell.swa_layers;
  if (draft > 0 && L > 0) {
    const int64_t before = cell.bytes_per_token;
    cell.bytes_per_token = static_cast<int64_t>(before * (1.0 + static_cast<double>(draft) / L));
    cell.derivation.push_back(
        fmt::format("EAGLE/MTP draft layers share the pool: int({} x (1 + {} / {})) = {} B/token",
                    before, draft, L, cell.bytes_per_token));
  }
  return cell;
}

CellSize sglang_cell_size_without_draft(const ModelFacts& model, const engines::KvDtype& dtype,
                                        const Parallelism& parallel, const SizingRules& rules) {
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
    sglang_mla_cell(model, dtype, static_cast<int64_t>(layers.size()), cell);
    return cell;
  }

  // Full-attention layers (and sliding-window layers, counted separately).
  HeadShapes h = head_shapes(layers, cell);
  bool hybrid_swa = cell.full_layers > 0 && cell.swa_layers > 0;
  if (!hybrid_swa && cell.swa_layers > 0) {
    // Every layer slides: SGLang keeps one ordinary pool sized for full-length tokens.
    h.kv_heads = h.swa_heads, h.k_dim = h.swa_k, h.v_dim = h.swa_v;
    cell.full_layers = cell.swa_layers;
    cell.swa_layers = 0;
    cell.swa_window = 0;
    cell.derivation.push_back("every KV layer uses a sliding window: one ordinary pool");
  }
  cell.kv_heads_per_rank = heads_per_rank(h.kv_heads, attn_tp, parallel.dcp);
  cell.full_bytes_per_token_per_layer =
      static_cast<int64_t>(cell.kv_heads_per_rank) * (h.k_dim + h.v_dim) * bytes;
  std::string heads_note =
      h.kv_heads < attn_tp
          ? fmt::format(
                "max(1, {} kv heads // attention TP {}) = {} (heads replicated: each GPU "
                "holds a full head)",
                h.kv_heads, attn_tp, cell.kv_heads_per_rank)
          : fmt::format("{} kv heads // (attention TP {}{}) = {}", h.kv_heads, attn_tp,
                        parallel.dcp > 1 ? fmt::format(" / DCP {}", parallel.dcp) : "",
                        cell.kv_heads_per_rank);
  int64_t raw = cell.full_bytes_per_token_per_layer * cell.full_layers;
  cell.derivation.push_back(fmt::format(
      "kv heads per GPU: {}; full-attention KV: {} heads x (K {} + V {}) x {} layers x {} B = {} "
      "B/token",
      heads_note, cell.kv_heads_per_rank, h.k_dim, h.v_dim, cell.full_layers, bytes, raw));
  if (hybrid_swa) {
    int swa_rank_heads = heads_per_rank(h.swa_heads, attn_tp, parallel.dcp);
    cell.swa_bytes_per_token_per_layer =
        static_cast<int64_t>(swa_rank_heads) * (h.swa_k + h.swa_v) * bytes;
    int64_t swa_raw = cell.swa_bytes_per_token_per_layer * cell.swa_layers;
    cell.derivation.push_back(fmt::format(
        "sliding-window KV (window {}): {} heads x (K {} + V {}) x {} layers x {} B = {} B/token, "
        "in its own pool",
        cell.swa_window, swa_rank_heads, h.swa_k, h.swa_v, cell.swa_layers, bytes, swa_raw));
    raw += swa_raw;
  }
  cell.bytes_per_token = sglang_quantized_bytes(raw, dtype, h, rules, cell);
  return cell;
}

std::optional<MambaState> sglang_mamba_state(const ModelFacts& model, const Parallelism& parallel,
                                             const SizingRules& rules) {
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
  const int64_t conv_bytes = rules.conv_bytes;
  const int64_t ssm_bytes = rules.ssm_bytes;
  const int64_t ssm_elems =
      static_cast<int64_t>(la.num_value_heads) / tp * la.value_head_dim * la.key_head_dim;
  state.conv_bytes_per_layer = conv_elems * conv_bytes;
  state.ssm_bytes_per_layer = ssm_elems * ssm_bytes;
  state.bytes_per_request =
      (state.conv_bytes_per_layer + state.ssm_bytes_per_layer) * state.linear_layers;
  state.derivation.push_back(fmt::format(
      "GDN/Mamba state per request: conv ({} value heads x {} + 2 x {} key groups x {}) / TP {} x "
      "(kernel {} - 1) x {} B ({}) = {} B/layer; recurrent {} value heads / TP {} x {} x {} x {} B "
      "({}, {}) = {} B/layer; x {} linear layers = {} B/request",
      la.num_value_heads, la.value_head_dim, n_groups, la.key_head_dim, tp, la.conv_kernel,
      conv_bytes, rules.conv_dtype, state.conv_bytes_per_layer, la.num_value_heads, tp,
      la.value_head_dim, la.key_head_dim, ssm_bytes, rules.ssm_dtype,
      rules.ssm_dtype_origin.empty() ? "engine default" : rules.ssm_dtype_origin,
      state.ssm_bytes_per_layer, state.linear_layers, state.bytes_per_request));
  return state;
}

VllmLayout vllm_layout(const ModelFacts& model, const engines::KvDtype& dtype,
                       const Parallelism& parallel, int block_size) {
  VllmLayout layout;
  layout.block_size = block_size;
  std::vector<LayerFacts> layers = kv_layers_of_busiest_rank(model, parallel.pp);
  const int64_t bytes = element_bytes(dtype);
  std::string layout_note;
  // Layers group by spec: (kind, window). vLLM requires one page size across groups.
  std::map<std::pair<int, int>, int> count_by_spec;
  for (const auto& layer : layers) {
    int64_t page;
    if (layer.kind == LayerKind::mla) {
      if (!model.mla) throw InputError(model.config_file, "MLA layers without MLA dimensions");
      const int64_t latent = model.mla->kv_lora_rank + model.mla->qk_rope_head_dim;
      page =
          dtype.fixed_mla_bytes_per_token_layer > 0
              ? static_cast<int64_t>(block_size) * dtype.fixed_mla_bytes_per_token_layer
              : static_cast<int64_t>(block_size) * engines::kv_bits_per_head(dtype, latent, 0) / 8;
    } else {
      int heads = heads_per_rank(layer.kv_heads, parallel.tp);
      // Data, block scales and per-(token, head) scales of the dtype's layout.
      page = static_cast<int64_t>(block_size) * heads *
             engines::kv_bits_per_head(dtype, layer.k_head_dim, layer.v_head_dim) / 8;
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
  }
  for (const auto& [spec, n] : count_by_spec) {
    const int groups = (n + layout.group_size - 1) / layout.group_size;
    (spec.second > 0 ? layout.sliding_groups : layout.full_groups) += groups;
  }
  layout.num_groups = layout.full_groups + layout.sliding_groups;
  (void)bytes;
  if (dtype.scale_bytes_per_token_head > 0)
    layout_note = fmt::format(" (includes {} B FP32 scales per token per head for K and V)",
                              dtype.scale_bytes_per_token_head);
  else if (dtype.block_elements > 0)
    layout_note = fmt::format(" (includes one {}-bit scale per {} values)", dtype.block_scale_bits,
                              dtype.block_elements);
  else if (dtype.scales == engines::ScaleSemantics::packed_dynamic)
    layout_note = " (packed layout sized from its bits per value; slot padding not modelled)";
  layout.derivation.push_back(fmt::format(
      "vLLM page per layer: block {} x {} B/token/layer = {} B{}; {} KV layers in {} group(s) of "
      "{} "
      "layers; {} B/token/GPU",
      block_size, layout.page_bytes_per_layer / block_size, layout.page_bytes_per_layer,
      layout_note, layers.size(), layout.num_groups, layout.group_size, layout.bytes_per_token));
  return layout;
}

int64_t vllm_blocks_per_request(const VllmLayout& layout, int64_t context,
                                std::optional<int64_t> max_num_batched_tokens) {
  const int64_t block = std::max(1, layout.block_size);
  const auto cdiv = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
  int64_t blocks = static_cast<int64_t>(layout.full_groups) * cdiv(context, block);
  if (layout.sliding_groups > 0) {
    const int64_t held = max_num_batched_tokens
                             ? layout.sliding_window - 1 + *max_num_batched_tokens
                             : static_cast<int64_t>(layout.sliding_window);
    blocks += static_cast<int64_t>(layout.sliding_groups) *
              (cdiv(std::min<int64_t>(held, context), block) + 1);
  }
  return blocks;
}

}  // namespace kvaudit::plan
