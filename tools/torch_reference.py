#!/usr/bin/python3
"""Independent PyTorch forward pass for the reference engine's tests (src/model).

Written from the published architectures (Llama / Llama 3, Mistral, Qwen2, Qwen3 as the
Hugging Face transformers modeling files and the RoPE, YaRN and Llama 3 scaling papers
describe them), not from the C++ code. It writes tiny random models of each family as
Hugging Face checkpoints (config.json + model.safetensors in F32/BF16/F16) and the logits
this reference computes for a fixed token sequence, in float64, so the C++ tests need no
torch at test time.

Usage: /usr/bin/python3 tools/torch_reference.py [OUT_DIR]   (default tests/fixtures/model/tiny)
Needs Debian's python3-torch (1.13) and python3-numpy.
"""
import json
import math
import os
import struct
import sys

import numpy as np
import torch

SEQ_LEN = 24
SEED = 1234

# name -> (config.json contents, stored dtype). Each case exercises different features.
BASE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=256, rms_norm_eps=1e-5, rope_theta=10000.0,
            max_position_embeddings=256, hidden_act="silu", tie_word_embeddings=False)

CASES = {
    "llama_f32": (dict(BASE, architectures=["LlamaForCausalLM"], model_type="llama"), "F32"),
    "llama3_bf16": (dict(BASE, architectures=["LlamaForCausalLM"], model_type="llama",
                         tie_word_embeddings=True, rope_theta=500000.0,
                         rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                           high_freq_factor=4.0,
                                           original_max_position_embeddings=64)), "BF16"),
    "mistral_f16": (dict(BASE, architectures=["MistralForCausalLM"], model_type="mistral",
                         num_key_value_heads=1, sliding_window=6), "F16"),
    "qwen2_bf16": (dict(BASE, architectures=["Qwen2ForCausalLM"], model_type="qwen2",
                        rope_theta=1000000.0, use_sliding_window=False, sliding_window=4,
                        rope_scaling=dict(type="yarn", factor=4.0,
                                          original_max_position_embeddings=32)), "BF16"),
    "qwen3_f32": (dict(BASE, architectures=["Qwen3ForCausalLM"], model_type="qwen3", head_dim=32,
                       tie_word_embeddings=True, use_sliding_window=True, sliding_window=8,
                       max_window_layers=1,
                       rope_scaling=dict(rope_type="linear", factor=2.0)), "F32"),
    "qwen3_bf16_partial": (dict(BASE, architectures=["Qwen3ForCausalLM"], model_type="qwen3",
                                head_dim=16, partial_rotary_factor=0.5), "BF16"),
}


# ----------------------------------------------------------------------------- rope

def inverse_frequencies(cfg):
    """Per rotary pair frequencies (radians per position), after rope_scaling."""
    head_dim = cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
    dim = int(head_dim * cfg.get("partial_rotary_factor", 1.0))
    base = cfg["rope_theta"]
    inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    scaling = cfg.get("rope_scaling") or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    factor = scaling.get("factor", 1.0)
    attention_factor = 1.0
    if kind == "linear":  # position interpolation: positions divided by factor
        inv = inv / factor
    elif kind == "llama3":  # Llama 3.1: scale long wavelengths, keep short, blend between
        old = scaling["original_max_position_embeddings"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        wavelen = 2 * math.pi / inv
        smooth = (old / wavelen - low) / (high - low)
        blended = (1 - smooth) * inv / factor + smooth * inv
        inv = torch.where(wavelen > old / low, inv / factor,
                          torch.where(wavelen < old / high, inv, blended))
    elif kind == "yarn":  # YaRN (Peng et al. 2023), NTK-by-parts + attention temperature
        old = scaling.get("original_max_position_embeddings", cfg["max_position_embeddings"])
        beta_fast, beta_slow = scaling.get("beta_fast", 32), scaling.get("beta_slow", 1)

        def dim_for(rotations):
            return dim * math.log(old / (rotations * 2 * math.pi)) / (2 * math.log(base))

        lo = max(math.floor(dim_for(beta_fast)), 0)
        hi = min(math.ceil(dim_for(beta_slow)), dim - 1)
        if lo == hi:
            hi += 0.001
        ramp = ((torch.arange(dim // 2, dtype=torch.float64) - lo) / (hi - lo)).clamp(0, 1)
        inv = (inv / factor) * ramp + inv * (1 - ramp)
        attention_factor = scaling.get("attention_factor", 0.1 * math.log(factor) + 1.0)
    return inv, dim, attention_factor


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x, positions, inv, rot_dim, attention_factor):
    # x: [T, H, D]; only the first rot_dim channels rotate (partial rotary).
    angles = positions[:, None].double() * inv[None, :]
    emb = torch.cat((angles, angles), dim=-1)
    cos = (emb.cos() * attention_factor)[:, None, :]
    sin = (emb.sin() * attention_factor)[:, None, :]
    rot, rest = x[..., :rot_dim], x[..., rot_dim:]
    return torch.cat((rot * cos + rotate_half(rot) * sin, rest), dim=-1)


# ----------------------------------------------------------------------------- model

def rms_norm(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def sliding_windows(cfg):
    layers = cfg["num_hidden_layers"]
    if cfg["model_type"] == "mistral":
        return [cfg.get("sliding_window") or 0] * layers
    if cfg["model_type"] in ("qwen2", "qwen3") and cfg.get("use_sliding_window"):
        first = cfg.get("max_window_layers", layers)
        return [cfg["sliding_window"] if i >= first else 0 for i in range(layers)]
    return [0] * layers


def forward(cfg, w, ids):
    """Logits [T, vocab] in float64 for token ids [T] starting at position 0."""
    T = len(ids)
    H, KV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D = cfg.get("head_dim", cfg["hidden_size"] // H)
    eps = cfg["rms_norm_eps"]
    inv, rot_dim, attention_factor = inverse_frequencies(cfg)
    positions = torch.arange(T)
    windows = sliding_windows(cfg)
    x = w["model.embed_tokens.weight"][torch.tensor(ids)]
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        proj = {}
        for name in ("q", "k", "v"):
            y = h @ w[p + f"self_attn.{name}_proj.weight"].T
            bias = w.get(p + f"self_attn.{name}_proj.bias")
            proj[name] = y + bias if bias is not None else y
        q = proj["q"].view(T, H, D)
        k = proj["k"].view(T, KV, D)
        v = proj["v"].view(T, KV, D)
        if cfg["model_type"] == "qwen3":  # QK-norm over each head, before RoPE
            q = rms_norm(q, w[p + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, w[p + "self_attn.k_norm.weight"], eps)
        q = apply_rope(q, positions, inv, rot_dim, attention_factor)
        k = apply_rope(k, positions, inv, rot_dim, attention_factor)
        k = k.repeat_interleave(H // KV, dim=1)  # GQA: each KV head serves H/KV query heads
        v = v.repeat_interleave(H // KV, dim=1)
        scores = torch.einsum("thd,shd->hts", q, k) / math.sqrt(D)
        i = positions[:, None]
        j = positions[None, :]
        allowed = j <= i
        if windows[layer]:
            allowed &= (i - j) < windows[layer]
        scores = scores.masked_fill(~allowed, float("-inf"))
        attn = torch.softmax(scores, dim=-1)
        out = torch.einsum("hts,shd->thd", attn, v).reshape(T, H * D)
        x = x + out @ w[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        gate = h @ w[p + "mlp.gate_proj.weight"].T
        up = h @ w[p + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else w["lm_head.weight"]
    return x @ head.T


# ----------------------------------------------------------------------------- files

def random_weights(cfg, generator):
    H, KV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D = cfg.get("head_dim", cfg["hidden_size"] // H)
    hidden, inter, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]

    def matrix(rows, cols):  # fan-in scaled so activations stay O(1)
        return torch.randn(rows, cols, generator=generator) / math.sqrt(cols)

    def norm(width):
        return 1.0 + 0.2 * torch.randn(width, generator=generator)

    w = {"model.embed_tokens.weight": torch.randn(vocab, hidden, generator=generator),
         "model.norm.weight": norm(hidden)}
    if not cfg["tie_word_embeddings"]:
        w["lm_head.weight"] = matrix(vocab, hidden)
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        w[p + "input_layernorm.weight"] = norm(hidden)
        w[p + "post_attention_layernorm.weight"] = norm(hidden)
        w[p + "self_attn.q_proj.weight"] = matrix(H * D, hidden)
        w[p + "self_attn.k_proj.weight"] = matrix(KV * D, hidden)
        w[p + "self_attn.v_proj.weight"] = matrix(KV * D, hidden)
        w[p + "self_attn.o_proj.weight"] = matrix(hidden, H * D)
        if cfg["model_type"] == "qwen2":
            for name, width in (("q", H * D), ("k", KV * D), ("v", KV * D)):
                w[p + f"self_attn.{name}_proj.bias"] = 0.5 * torch.randn(width, generator=generator)
        if cfg["model_type"] == "qwen3":
            w[p + "self_attn.q_norm.weight"] = norm(D)
            w[p + "self_attn.k_norm.weight"] = norm(D)
        w[p + "mlp.gate_proj.weight"] = matrix(inter, hidden)
        w[p + "mlp.up_proj.weight"] = matrix(inter, hidden)
        w[p + "mlp.down_proj.weight"] = matrix(hidden, inter)
    return w


TORCH_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def write_safetensors(path, tensors, dtype):
    """Minimal safetensors writer: 8-byte header length, JSON header, raw little-endian data."""
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].to(TORCH_DTYPES[dtype]).contiguous()
        raw = t.view(torch.int16).numpy().tobytes() if dtype != "F32" else t.numpy().tobytes()
        header[name] = {"dtype": dtype, "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for raw in blobs:
            f.write(raw)


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "model", "tiny")
    generator = torch.Generator().manual_seed(SEED)
    for name, (cfg, dtype) in CASES.items():
        case_dir = os.path.join(out_dir, name)
        os.makedirs(case_dir, exist_ok=True)
        cfg = dict(cfg, torch_dtype={"F32": "float32", "BF16": "bfloat16", "F16": "float16"}[dtype])
        weights = random_weights(cfg, generator)
        # The reference runs on exactly the stored values (rounded to the stored type), in f64.
        stored = {k: v.to(TORCH_DTYPES[dtype]).double() for k, v in weights.items()}
        ids = torch.randint(0, cfg["vocab_size"], (SEQ_LEN,), generator=generator).tolist()
        logits = forward(cfg, stored, ids)
        with open(os.path.join(case_dir, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2)
        write_safetensors(os.path.join(case_dir, "model.safetensors"), weights, dtype)
        with open(os.path.join(case_dir, "reference.json"), "w") as f:
            json.dump({"tokens": ids, "vocab_size": cfg["vocab_size"],
                       "generator": "tools/torch_reference.py (float64)"}, f)
        logits.numpy().astype("<f4").tofile(os.path.join(case_dir, "logits.f32"))
        print(f"{name}: {dtype}, logits range [{logits.min():.3f}, {logits.max():.3f}]")


if __name__ == "__main__":
    main()
