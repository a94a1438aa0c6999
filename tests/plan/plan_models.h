// Hand-built ModelFacts for the architectures the plan tests use, from the models'
// published config.json values (Qwen3.5-397B-A17B and DeepSeek-V3 on the hub; the demo's
// copy is examples/qwen3.5-397b-a17b-nvfp4/config.json).
#pragma once

#include "checkpoint/checkpoint.h"

namespace kvaudit::plan::test_models {

inline checkpoint::ModelFacts dense(const char* name, int layers, int kv_heads, int head_dim) {
  checkpoint::ModelFacts m;
  m.config_file = name;
  m.model_type = name;
  m.torch_dtype = "bfloat16";
  m.num_layers = layers;
  m.num_kv_heads = kv_heads;
  m.head_dim = head_dim;
  for (int i = 0; i < layers; ++i) {
    checkpoint::LayerFacts layer;
    layer.index = i;
    layer.kind = checkpoint::LayerKind::full_attention;
    layer.kv_heads = kv_heads;
    layer.k_head_dim = head_dim;
    layer.v_head_dim = head_dim;
    m.layers.push_back(layer);
  }
  return m;
}

// Qwen3.5-397B-A17B (qwen3_5_moe_text): 60 layers, full attention every 4th layer.
inline checkpoint::ModelFacts qwen35_397b() {
  checkpoint::ModelFacts m = dense("qwen3_5_moe_text", 60, 2, 256);
  for (auto& layer : m.layers) {
    if (layer.index % 4 != 3) {
      layer.kind = checkpoint::LayerKind::linear_attention;
      layer.kv_heads = 0, layer.k_head_dim = 0, layer.v_head_dim = 0;
    }
  }
  checkpoint::LinearAttentionFacts la;
  la.num_key_heads = 16;
  la.num_value_heads = 64;
  la.key_head_dim = 128;
  la.value_head_dim = 128;
  la.conv_kernel = 4;
  la.ssm_dtype = "float32";
  m.linear_attention = la;
  return m;
}

inline checkpoint::ModelFacts llama31_8b() {
  return dense("llama", 32, 8, 128);
}
inline checkpoint::ModelFacts qwen3_0_6b() {
  return dense("qwen3", 28, 8, 128);
}

inline checkpoint::ModelFacts deepseek_v3() {
  checkpoint::ModelFacts m = dense("deepseek_v3", 61, 0, 0);
  for (auto& layer : m.layers) {
    layer.kind = checkpoint::LayerKind::mla;
    layer.kv_heads = 1, layer.k_head_dim = 576, layer.v_head_dim = 0;
  }
  checkpoint::MlaFacts mla;
  mla.kv_lora_rank = 512;
  mla.qk_rope_head_dim = 64;
  mla.qk_nope_head_dim = 128;
  mla.v_head_dim = 128;
  m.mla = mla;
  return m;
}

// A Gemma-3-like 5:1 sliding-window model: 24 layers, every 6th full.
inline checkpoint::ModelFacts gemma_like_swa() {
  checkpoint::ModelFacts m = dense("gemma3_text", 24, 8, 128);
  for (auto& layer : m.layers)
    if (layer.index % 6 != 5) layer.sliding_window = 1024;
  return m;
}

}  // namespace kvaudit::plan::test_models
