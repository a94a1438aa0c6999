#!/usr/bin/python3
"""Independent float64 PyTorch forward pass of Qwen3.5's dense hybrid text model.

Written from the published architecture (Gated DeltaNet, Yang et al. 2024, "Gated Delta
Networks: Improving Mamba2 with Delta Rule"; Qwen3-Next / Qwen3.5 as Hugging Face
transformers' modeling_qwen3_5.py describes them), not from the C++ code:
  * layers are "linear_attention" (Gated DeltaNet) or "full_attention" (layer_types, else
    every full_attention_interval-th layer is full attention);
  * RMSNorms are zero-centred: x / rms(x) * (1 + w);
  * full attention: q_proj emits [q | gate] per head, QK-norm (zero-centred), partial
    rotary (rotate_half over the first head_dim * partial_rotary_factor dims; mRoPE with
    equal t/h/w positions is 1-D rope), softmax attention, output * sigmoid(gate);
  * Gated DeltaNet: in_proj_qkv -> causal depthwise conv1d (no bias) -> SiLU -> [q|k|v];
    q, k L2-normalised per head (eps 1e-6 inside the sqrt), q / sqrt(d_k); beta =
    sigmoid(in_proj_b); g = -exp(A_log) * softplus(in_proj_a + dt_bias); per value head
    (key head = value head // (value_heads / key_heads)) the recurrence
        S = S * exp(g);  S = S + k (beta (v - S^T k))^T;  o = S^T q
    gated RMSNorm o / rms(o) * w * SiLU(in_proj_z) (w not zero-centred), out_proj.
The recurrence is computed token by token (the definition), in float64. For the F32 case a
second set of logits (logits-fla8.f32) runs the Gated DeltaNet layers through FLA's chunked
algorithm instead (the WY form of chunk_gated_delta_rule, 8-token chunks, the state each
chunk reads stored in bfloat16 as the kernel stores it): what SGLang's and vLLM's prefill
computes, against which kvaudit's "fp32:fla8" state format is checked.

Writes tiny random hybrids (config.json, safetensors, reference logits) so the C++ tests
need no torch at test time.
Usage: /usr/bin/python3 tools/torch_reference_hybrid.py [OUT_DIR]
       (default tests/fixtures/model/tiny-hybrid). Needs python3-torch and python3-numpy.
"""
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_reference import TORCH_DTYPES, apply_rope, write_safetensors  # noqa: E402

SEQ_LEN = 24
SEED = 4321

TEXT = dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, vocab_size=256, rms_norm_eps=1e-6, max_position_embeddings=256,
            hidden_act="silu", attention_bias=False, attn_output_gate=True,
            linear_conv_kernel_dim=4,
            rope_parameters=dict(rope_type="default", rope_theta=10000000.0,
                                 partial_rotary_factor=0.25, mrope_interleaved=True,
                                 mrope_section=[1, 1, 0]))

# name -> (config.json, stored dtype, shards, extra tensors that the engine must ignore)
CASES = {
    # Qwen3_5ForCausalLM, default layer pattern (3 linear, then full), grouped value heads.
    "qwen35_f32": (dict(TEXT, architectures=["Qwen3_5ForCausalLM"], model_type="qwen3_5_text",
                        num_hidden_layers=4, full_attention_interval=4, tie_word_embeddings=True,
                        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                        linear_value_head_dim=8), "F32", 1, False),
    # The published wrapper: text_config, weights under model.language_model., a vision
    # tower and an MTP head beside them, explicit layer_types, sharded with an index.
    "qwen35_vl_bf16": (dict(architectures=["Qwen3_5ForConditionalGeneration"],
                            model_type="qwen3_5", tie_word_embeddings=False,
                            text_config=dict(TEXT, model_type="qwen3_5_text",
                                             num_hidden_layers=5, mtp_num_hidden_layers=1,
                                             layer_types=["full_attention", "linear_attention",
                                                          "linear_attention", "full_attention",
                                                          "linear_attention"],
                                             linear_num_key_heads=2, linear_num_value_heads=2,
                                             linear_key_head_dim=8, linear_value_head_dim=16),
                            vision_config=dict(depth=1, hidden_size=8)), "BF16", 2, True),
}


def text_config(cfg):
    return cfg.get("text_config", cfg)


def layer_types(t):
    if "layer_types" in t:
        return t["layer_types"]
    interval = t.get("full_attention_interval", 4)
    return ["full_attention" if (i + 1) % interval == 0 else "linear_attention"
            for i in range(t["num_hidden_layers"])]


def zc_rms_norm(x, w, eps):  # zero-centred (Qwen3_5RMSNorm)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + w)


def rope_frequencies(t):
    params = t["rope_parameters"]
    dim = int(t["head_dim"] * params.get("partial_rotary_factor", 1.0))
    inv = 1.0 / (params["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    return inv, dim


def full_attention(t, w, p, h, positions):
    T = h.shape[0]
    H, KV, D = t["num_attention_heads"], t["num_key_value_heads"], t["head_dim"]
    eps = t["rms_norm_eps"]
    qg = (h @ w[p + "self_attn.q_proj.weight"].T).view(T, H, 2 * D)
    q, gate = qg[..., :D], qg[..., D:].reshape(T, H * D)
    k = (h @ w[p + "self_attn.k_proj.weight"].T).view(T, KV, D)
    v = (h @ w[p + "self_attn.v_proj.weight"].T).view(T, KV, D)
    q = zc_rms_norm(q, w[p + "self_attn.q_norm.weight"], eps)
    k = zc_rms_norm(k, w[p + "self_attn.k_norm.weight"], eps)
    inv, rot_dim = rope_frequencies(t)
    q = apply_rope(q, positions, inv, rot_dim, 1.0)
    k = apply_rope(k, positions, inv, rot_dim, 1.0)
    k = k.repeat_interleave(H // KV, dim=1)
    v = v.repeat_interleave(H // KV, dim=1)
    scores = torch.einsum("thd,shd->hts", q, k) / math.sqrt(D)
    allowed = positions[None, :] <= positions[:, None]
    scores = scores.masked_fill(~allowed, float("-inf"))
    out = torch.einsum("hts,shd->thd", torch.softmax(scores, dim=-1), v).reshape(T, H * D)
    out = out * torch.sigmoid(gate)
    return out @ w[p + "self_attn.o_proj.weight"].T


def l2norm(x):
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def chunked_delta_rule(q, k, v, beta, g, chunk):
    """FLA's chunk_gated_delta_rule for one head, written from its algorithm (the WY form):
    per chunk of `chunk` tokens, the state h the chunk starts from is stored in bfloat16 (the
    inputs' dtype) and both the chunk's outputs and its v_new read that copy, while the state
    carried to the next chunk is the float one updated with v_new."""
    T, dv = v.shape[0], v.shape[1]
    h = torch.zeros(k.shape[1], dv, dtype=v.dtype)
    out = torch.zeros(T, dv, dtype=v.dtype)
    for c0 in range(0, T, chunk):
        K, V, Q, b = k[c0:c0 + chunk], v[c0:c0 + chunk], q[c0:c0 + chunk], beta[c0:c0 + chunk]
        G = torch.cumsum(g[c0:c0 + chunk], 0)  # log decay from the chunk's start
        n = K.shape[0]
        decay = torch.exp(G[:, None] - G[None, :])
        A = torch.tril(b[:, None] * (K @ K.T) * decay, diagonal=-1)
        Tinv = torch.linalg.inv(torch.eye(n, dtype=v.dtype) + A)
        w_ = Tinv @ (b[:, None] * K * torch.exp(G)[:, None])
        u = Tinv @ (b[:, None] * V)
        stored = h.float().bfloat16().double()
        v_new = u - w_ @ stored
        out[c0:c0 + n] = (Q * torch.exp(G)[:, None]) @ stored + torch.tril((Q @ K.T) * decay) @ v_new
        h = h * torch.exp(G[-1]) + (K * torch.exp(G[-1] - G)[:, None]).T @ v_new
    return out


def gated_delta_net(t, w, p, h, fla_chunk=0):
    T = h.shape[0]
    Hk, Hv = t["linear_num_key_heads"], t["linear_num_value_heads"]
    dk, dv, K = t["linear_key_head_dim"], t["linear_value_head_dim"], t["linear_conv_kernel_dim"]
    l = p + "linear_attn."
    mixed = h @ w[l + "in_proj_qkv.weight"].T  # [T, 2 Hk dk + Hv dv]
    taps = w[l + "conv1d.weight"][:, 0, :]     # [C, K]
    padded = torch.cat([torch.zeros(K - 1, mixed.shape[1], dtype=mixed.dtype), mixed])
    conv = torch.stack([(padded[i:i + K] * taps.T).sum(0) for i in range(T)])
    conv = torch.nn.functional.silu(conv)
    q = conv[:, :Hk * dk].view(T, Hk, dk)
    k = conv[:, Hk * dk:2 * Hk * dk].view(T, Hk, dk)
    v = conv[:, 2 * Hk * dk:].view(T, Hv, dv)
    q, k = l2norm(q) / math.sqrt(dk), l2norm(k)
    beta = torch.sigmoid(h @ w[l + "in_proj_b.weight"].T)  # [T, Hv]
    a = h @ w[l + "in_proj_a.weight"].T
    g = -torch.exp(w[l + "A_log"]) * torch.nn.functional.softplus(a + w[l + "dt_bias"])
    z = (h @ w[l + "in_proj_z.weight"].T).view(T, Hv, dv)
    out = torch.zeros(T, Hv, dv, dtype=h.dtype)
    for head in range(Hv):
        kh = head // (Hv // Hk)
        if fla_chunk > 0:
            out[:, head] = chunked_delta_rule(q[:, kh], k[:, kh], v[:, head], beta[:, head],
                                              g[:, head], fla_chunk)
            continue
        S = torch.zeros(dk, dv, dtype=h.dtype)
        for i in range(T):
            S = S * torch.exp(g[i, head])
            delta = beta[i, head] * (v[i, head] - S.T @ k[i, kh])
            S = S + torch.outer(k[i, kh], delta)
            out[i, head] = S.T @ q[i, kh]
    eps = t["rms_norm_eps"]
    normed = out * torch.rsqrt(out.pow(2).mean(-1, keepdim=True) + eps) * w[l + "norm.weight"]
    normed = normed * torch.nn.functional.silu(z)
    return normed.reshape(T, Hv * dv) @ w[l + "out_proj.weight"].T


def forward(cfg, w, ids, base, fla_chunk=0):
    t = text_config(cfg)
    eps = t["rms_norm_eps"]
    positions = torch.arange(len(ids))
    x = w[base + "embed_tokens.weight"][torch.tensor(ids)]
    for layer, kind in enumerate(layer_types(t)):
        p = f"{base}layers.{layer}."
        h = zc_rms_norm(x, w[p + "input_layernorm.weight"], eps)
        if kind == "full_attention":
            x = x + full_attention(t, w, p, h, positions)
        else:
            x = x + gated_delta_net(t, w, p, h, fla_chunk)
        h = zc_rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        gate = h @ w[p + "mlp.gate_proj.weight"].T
        up = h @ w[p + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    x = zc_rms_norm(x, w[base + "norm.weight"], eps)
    tied = cfg.get("tie_word_embeddings", t.get("tie_word_embeddings", False))
    head = w[base + "embed_tokens.weight"] if tied else w["lm_head.weight"]
    return x @ head.T


def random_weights(cfg, base, extras, gen):
    t = text_config(cfg)
    hidden, inter, vocab = t["hidden_size"], t["intermediate_size"], t["vocab_size"]
    H, KV, D = t["num_attention_heads"], t["num_key_value_heads"], t["head_dim"]
    Hk, Hv = t["linear_num_key_heads"], t["linear_num_value_heads"]
    dk, dv, K = t["linear_key_head_dim"], t["linear_value_head_dim"], t["linear_conv_kernel_dim"]

    def matrix(rows, cols):
        return torch.randn(rows, cols, generator=gen) / math.sqrt(cols)

    def zero_centred(width):
        return 0.2 * torch.randn(width, generator=gen)

    w = {base + "embed_tokens.weight": torch.randn(vocab, hidden, generator=gen),
         base + "norm.weight": zero_centred(hidden)}
    if not cfg.get("tie_word_embeddings", False):
        w["lm_head.weight"] = matrix(vocab, hidden)
    for layer, kind in enumerate(layer_types(t)):
        p = f"{base}layers.{layer}."
        w[p + "input_layernorm.weight"] = zero_centred(hidden)
        w[p + "post_attention_layernorm.weight"] = zero_centred(hidden)
        if kind == "full_attention":
            w[p + "self_attn.q_proj.weight"] = matrix(2 * H * D, hidden)
            w[p + "self_attn.k_proj.weight"] = matrix(KV * D, hidden)
            w[p + "self_attn.v_proj.weight"] = matrix(KV * D, hidden)
            w[p + "self_attn.o_proj.weight"] = matrix(hidden, H * D)
            w[p + "self_attn.q_norm.weight"] = zero_centred(D)
            w[p + "self_attn.k_norm.weight"] = zero_centred(D)
        else:
            l = p + "linear_attn."
            conv_width = 2 * Hk * dk + Hv * dv
            w[l + "in_proj_qkv.weight"] = matrix(conv_width, hidden)
            w[l + "in_proj_z.weight"] = matrix(Hv * dv, hidden)
            w[l + "in_proj_b.weight"] = matrix(Hv, hidden)
            w[l + "in_proj_a.weight"] = matrix(Hv, hidden)
            w[l + "conv1d.weight"] = torch.randn(conv_width, 1, K, generator=gen) / math.sqrt(K)
            w[l + "dt_bias"] = 1.0 + 0.5 * torch.randn(Hv, generator=gen)
            w[l + "A_log"] = torch.log(0.01 + 4.0 * torch.rand(Hv, generator=gen))
            w[l + "norm.weight"] = 1.0 + 0.2 * torch.randn(dv, generator=gen)
            w[l + "out_proj.weight"] = matrix(hidden, Hv * dv)
        w[p + "mlp.gate_proj.weight"] = matrix(inter, hidden)
        w[p + "mlp.up_proj.weight"] = matrix(inter, hidden)
        w[p + "mlp.down_proj.weight"] = matrix(hidden, inter)
    if extras:  # tensors the text engine must leave alone
        w["model.visual.patch_embed.proj.weight"] = torch.randn(8, 12, generator=gen)
        w["mtp.fc.weight"] = matrix(hidden, 2 * hidden)
    return w


def write_shards(case_dir, weights, dtype, shards):
    names = sorted(weights)
    if shards == 1:
        write_safetensors(os.path.join(case_dir, "model.safetensors"), weights, dtype)
        return
    weight_map = {}
    for s in range(shards):
        # Published Qwen3.5 shards are named model.safetensors-0000i-of-0000N.safetensors.
        file = f"model.safetensors-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: weights[n] for n in names[s::shards]}
        write_safetensors(os.path.join(case_dir, file), part, dtype)
        weight_map.update({n: file for n in part})
    with open(os.path.join(case_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=1, sort_keys=True)


FLA_CHUNK = 8


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "model",
        "tiny-hybrid")
    gen = torch.Generator().manual_seed(SEED)
    for name, (cfg, dtype, shards, extras) in CASES.items():
        case_dir = os.path.join(out_dir, name)
        os.makedirs(case_dir, exist_ok=True)
        base = "model.language_model." if "text_config" in cfg else "model."
        cfg = dict(cfg, torch_dtype={"F32": "float32", "BF16": "bfloat16"}[dtype])
        weights = random_weights(cfg, base, extras, gen)
        stored = {k: v.to(TORCH_DTYPES[dtype]).double() for k, v in weights.items()}
        ids = torch.randint(0, text_config(cfg)["vocab_size"], (SEQ_LEN,), generator=gen).tolist()
        logits = forward(cfg, stored, ids, base)
        with open(os.path.join(case_dir, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2)
        write_shards(case_dir, weights, dtype, shards)
        with open(os.path.join(case_dir, "reference.json"), "w") as f:
            json.dump({"tokens": ids, "vocab_size": text_config(cfg)["vocab_size"],
                       "generator": "tools/torch_reference_hybrid.py (float64)"}, f)
        logits.numpy().astype("<f4").tofile(os.path.join(case_dir, "logits.f32"))
        if dtype == "F32":
            # Prefill through FLA's chunked kernel (8-token chunks: three in the sequence).
            fla = forward(cfg, stored, ids, base, fla_chunk=FLA_CHUNK)
            fla.numpy().astype("<f4").tofile(
                os.path.join(case_dir, f"logits-fla{FLA_CHUNK}.f32"))
            print(f"{name}: FLA chunk {FLA_CHUNK} moves logits by up to "
                  f"{(fla - logits).abs().max():.3g}")
        print(f"{name}: {dtype}, logits range [{logits.min():.3f}, {logits.max():.3f}]")


if __name__ == "__main__":
    main()
