#!/usr/bin/python3
"""Writes a model of Qwen2.5-0.5B's shape with random weights, for speed comparisons only.

Two files hold the same values, so kvaudit's reference engine and llama.cpp can be timed on
identical work:
  OUT/                 Hugging Face layout: config.json, model.safetensors (F16 or BF16
                       projection/embedding matrices, F32 norms and biases), and the real
                       vendored Qwen3 tokenizer (its 151,669 tokens fit the 151,936 rows)
  --gguf FILE          the same tensors as a GGUF (llama.cpp's "qwen2" architecture), written
                       with llama.cpp's own gguf-py (pass --gguf-py DIR; nothing of llama.cpp
                       lives in this repository)
The weights are N(0, 0.02) (norm weights 1, biases N(0, 0.02)) from numpy's PCG64 with a fixed
seed; the text they produce is noise, which does not matter for tokens per second.

Usage: /usr/bin/python3 tools/make_bench_model.py --out DIR [--dtype f16|bf16]
           [--gguf FILE --gguf-py LLAMA_CPP/gguf-py]
"""
import argparse
import json
import os
import shutil
import struct
import sys

import numpy as np

SHAPE = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
             num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
             max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0)
SEED = 20261129
# The vendored Qwen3 tokenizer as CMake extracts it (tests/fixtures/tokenizer/qwen3/), or
# KVAUDIT_QWEN3_TOKENIZER.
TOKENIZER_DIR = os.environ.get("KVAUDIT_QWEN3_TOKENIZER") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "build", "fixtures", "qwen3-tokenizer")


def tensor_shapes():
    """Hugging Face names and [rows, cols] shapes, in a fixed order; 1-D tensors are F32."""
    s = SHAPE
    d, inter = s["hidden_size"], s["intermediate_size"]
    hd = d // s["num_attention_heads"]
    q, kv = s["num_attention_heads"] * hd, s["num_key_value_heads"] * hd
    shapes = [("model.embed_tokens.weight", (s["vocab_size"], d)), ("model.norm.weight", (d,))]
    for i in range(s["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes += [(p + "input_layernorm.weight", (d,)),
                   (p + "self_attn.q_proj.weight", (q, d)), (p + "self_attn.q_proj.bias", (q,)),
                   (p + "self_attn.k_proj.weight", (kv, d)), (p + "self_attn.k_proj.bias", (kv,)),
                   (p + "self_attn.v_proj.weight", (kv, d)), (p + "self_attn.v_proj.bias", (kv,)),
                   (p + "self_attn.o_proj.weight", (d, q)),
                   (p + "post_attention_layernorm.weight", (d,)),
                   (p + "mlp.gate_proj.weight", (inter, d)), (p + "mlp.up_proj.weight", (inter, d)),
                   (p + "mlp.down_proj.weight", (d, inter))]
    return shapes


def random_tensors():
    """name -> float32 array. Matrices are rounded later to the stored 16-bit type."""
    rng = np.random.Generator(np.random.PCG64(SEED))
    out = {}
    for name, shape in tensor_shapes():
        if name.endswith("norm.weight"):
            out[name] = np.ones(shape, dtype=np.float32)
        else:
            out[name] = (rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02))
    return out


def to_bf16_bits(a):
    """Round-to-nearest-even F32 -> BF16, as uint16 bits (no NaN in these weights)."""
    bits = a.astype(np.float32).view(np.uint32)
    rounded = bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    return (rounded >> np.uint32(16)).astype(np.uint16)


def stored(name, a, dtype):
    """The exact values both files store: F32 for 1-D tensors, else the 16-bit type."""
    if a.ndim == 1:
        return a.astype(np.float32)
    if dtype == "f16":
        return a.astype(np.float16)
    return to_bf16_bits(a)


def write_safetensors(path, tensors, dtype):
    header, offset = {}, 0
    names = sorted(tensors)
    for name in names:
        a = tensors[name]
        kind = "F32" if a.dtype == np.float32 else ("F16" if dtype == "f16" else "BF16")
        header[name] = {"dtype": kind, "shape": list(a.shape),
                        "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for name in names:
            f.write(np.ascontiguousarray(tensors[name]).tobytes())


def write_hf(out, tensors, dtype):
    os.makedirs(out, exist_ok=True)
    s = SHAPE
    config = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
              "hidden_act": "silu", "attention_dropout": 0.0, "tie_word_embeddings": True,
              "torch_dtype": "float16" if dtype == "f16" else "bfloat16",
              "use_sliding_window": False, "sliding_window": 32768, "max_window_layers": 21,
              "bos_token_id": 151643, "eos_token_id": 151645, **s}
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    write_safetensors(os.path.join(out, "model.safetensors"), tensors, dtype)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(TOKENIZER_DIR, name), os.path.join(out, name))


def write_gguf(path, tensors, dtype, gguf_py):
    sys.path.insert(0, gguf_py)
    import gguf  # llama.cpp's writer, from the caller's checkout

    s = SHAPE
    w = gguf.GGUFWriter(path, "qwen2")
    w.add_name("kvaudit random Qwen2.5-0.5B shape")
    w.add_context_length(s["max_position_embeddings"])
    w.add_embedding_length(s["hidden_size"])
    w.add_block_count(s["num_hidden_layers"])
    w.add_feed_forward_length(s["intermediate_size"])
    w.add_head_count(s["num_attention_heads"])
    w.add_head_count_kv(s["num_key_value_heads"])
    w.add_rope_freq_base(s["rope_theta"])
    w.add_layer_norm_rms_eps(s["rms_norm_eps"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if dtype == "f16" else gguf.LlamaFileType.MOSTLY_BF16)

    with open(os.path.join(TOKENIZER_DIR, "tokenizer.json")) as f:
        tok = json.load(f)
    vocab = {t: i for t, i in tok["model"]["vocab"].items()}
    special = {a["id"]: a["content"] for a in tok["added_tokens"]}
    tokens, types = [], []
    by_id = {i: t for t, i in vocab.items()}
    for i in range(s["vocab_size"]):
        if i in special:
            tokens.append(special[i])
            types.append(gguf.TokenType.CONTROL)
        elif i in by_id:
            tokens.append(by_id[i])
            types.append(gguf.TokenType.NORMAL)
        else:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(151643)
    w.add_eos_token_id(151645)
    w.add_add_bos_token(False)

    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    layer_names = {"input_layernorm.weight": "attn_norm.weight",
                   "self_attn.q_proj.weight": "attn_q.weight", "self_attn.q_proj.bias": "attn_q.bias",
                   "self_attn.k_proj.weight": "attn_k.weight", "self_attn.k_proj.bias": "attn_k.bias",
                   "self_attn.v_proj.weight": "attn_v.weight", "self_attn.v_proj.bias": "attn_v.bias",
                   "self_attn.o_proj.weight": "attn_output.weight",
                   "post_attention_layernorm.weight": "ffn_norm.weight",
                   "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
                   "mlp.down_proj.weight": "ffn_down.weight"}
    for name, _ in tensor_shapes():
        if name in names:
            target = names[name]
        else:
            layer, rest = name[len("model.layers."):].split(".", 1)
            target = f"blk.{layer}.{layer_names[rest]}"
        a = tensors[name]
        if a.dtype == np.uint16:  # BF16 bits
            w.add_tensor(target, a, raw_shape=a.shape, raw_dtype=gguf.GGMLQuantizationType.BF16)
        else:
            w.add_tensor(target, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--dtype", choices=("f16", "bf16"), default="f16")
    parser.add_argument("--gguf")
    parser.add_argument("--gguf-py")
    args = parser.parse_args()
    if args.gguf and not args.gguf_py:
        parser.error("--gguf needs --gguf-py (llama.cpp's gguf-py folder)")
    tensors = {name: stored(name, a, args.dtype) for name, a in random_tensors().items()}
    write_hf(args.out, tensors, args.dtype)
    if args.gguf:
        write_gguf(args.gguf, tensors, args.dtype, args.gguf_py)


if __name__ == "__main__":
    main()
