#!/usr/bin/python3
"""Writes a Qwen3.5-4B-shape hybrid with random weights, for speed measurements only.

Shape: 32 layers in Qwen3.5's pattern (24 Gated DeltaNet, 8 gated full attention), hidden
2560, MLP 9216, 16 query / 4 KV heads of 256, partial rotary 0.25, vocabulary 248,320, tied
embeddings (THUDM/slime scripts/models/qwen3.5-4B.sh's model arguments). The linear-attention
widths (16 key / 32 value heads of 128, 4 convolution taps) are Qwen3.5's family values as
the 397B config writes them for key heads and head widths; the 4B's own were not read, so
treat that part of the shape as assumed. --dense writes the same model with every layer full
attention, the comparison a hybrid's prefill speed is judged against.

Weights are N(0, 0.02) BF16 (norm weights 0: Qwen3.5's norms are zero-centred; A_log, dt_bias
as transformers initialises them) from numpy's PCG64 with a fixed seed; there is no tokenizer
(bench_model feeds token ids).

Usage: /usr/bin/python3 tools/make_hybrid_bench_model.py --out DIR [--dense] [--layers N]
"""
import argparse
import json
import os
import struct

import numpy as np

SHAPE = dict(hidden_size=2560, intermediate_size=9216, num_hidden_layers=32,
             num_attention_heads=16, num_key_value_heads=4, head_dim=256, vocab_size=248320,
             linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
             linear_value_head_dim=128, linear_conv_kernel_dim=4, full_attention_interval=4,
             rms_norm_eps=1e-6, max_position_embeddings=262144)
SEED = 20261201


def layer_types(layers, dense):
    every = SHAPE["full_attention_interval"]
    return ["full_attention" if dense or (i + 1) % every == 0 else "linear_attention"
            for i in range(layers)]


def tensor_shapes(types):
    s = SHAPE
    d, inter, hd = s["hidden_size"], s["intermediate_size"], s["head_dim"]
    q, kv = s["num_attention_heads"] * hd, s["num_key_value_heads"] * hd
    key = s["linear_num_key_heads"] * s["linear_key_head_dim"]
    value = s["linear_num_value_heads"] * s["linear_value_head_dim"]
    hv = s["linear_num_value_heads"]
    shapes = [("model.embed_tokens.weight", (s["vocab_size"], d)), ("model.norm.weight", (d,))]
    for i, kind in enumerate(types):
        p = f"model.layers.{i}."
        shapes += [(p + "input_layernorm.weight", (d,)),
                   (p + "post_attention_layernorm.weight", (d,)),
                   (p + "mlp.gate_proj.weight", (inter, d)), (p + "mlp.up_proj.weight", (inter, d)),
                   (p + "mlp.down_proj.weight", (d, inter))]
        if kind == "full_attention":
            shapes += [(p + "self_attn.q_proj.weight", (2 * q, d)),
                       (p + "self_attn.k_proj.weight", (kv, d)),
                       (p + "self_attn.v_proj.weight", (kv, d)),
                       (p + "self_attn.o_proj.weight", (d, q)),
                       (p + "self_attn.q_norm.weight", (hd,)), (p + "self_attn.k_norm.weight", (hd,))]
        else:
            l = p + "linear_attn."
            shapes += [(l + "in_proj_qkv.weight", (2 * key + value, d)),
                       (l + "in_proj_z.weight", (value, d)), (l + "in_proj_b.weight", (hv, d)),
                       (l + "in_proj_a.weight", (hv, d)),
                       (l + "conv1d.weight", (2 * key + value, 1, s["linear_conv_kernel_dim"])),
                       (l + "dt_bias", (hv,)), (l + "A_log", (hv,)),
                       (l + "norm.weight", (s["linear_value_head_dim"],)),
                       (l + "out_proj.weight", (d, value))]
    return shapes


def values(rng, name, shape):
    if name.endswith("norm.weight"):
        return np.ones(shape, np.float32) if "linear_attn.norm" in name else np.zeros(shape, np.float32)
    if name.endswith("dt_bias"):
        return np.ones(shape, np.float32)
    if name.endswith("A_log"):
        return np.log(rng.uniform(0.01, 16.0, shape)).astype(np.float32)
    return rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)


def to_bf16_bits(a):
    bits = a.astype(np.float32).view(np.uint32)
    return ((bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--dense", action="store_true")
    parser.add_argument("--layers", type=int, default=SHAPE["num_hidden_layers"])
    args = parser.parse_args()
    types = layer_types(args.layers, args.dense)
    shapes = sorted(tensor_shapes(types))
    header, offset = {}, 0
    for name, shape in shapes:
        size = int(np.prod(shape)) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    os.makedirs(args.out, exist_ok=True)
    rng = np.random.Generator(np.random.PCG64(SEED))
    with open(os.path.join(args.out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for name, shape in shapes:
            f.write(to_bf16_bits(values(rng, name, shape)).tobytes())
    config = dict(SHAPE, architectures=["Qwen3_5ForCausalLM"], model_type="qwen3_5_text",
                  num_hidden_layers=args.layers, layer_types=types, hidden_act="silu",
                  attention_bias=False, attn_output_gate=True, tie_word_embeddings=True,
                  torch_dtype="bfloat16", mamba_ssm_dtype="float32",
                  rope_parameters=dict(rope_type="default", rope_theta=10000000.0,
                                       partial_rotary_factor=0.25, mrope_interleaved=True,
                                       mrope_section=[11, 11, 10]))
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    print(f"wrote {args.out}: {offset / 2**30:.2f} GiB, {types.count('linear_attention')} Gated "
          f"DeltaNet + {types.count('full_attention')} full attention layers")


if __name__ == "__main__":
    main()
