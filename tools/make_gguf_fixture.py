#!/usr/bin/python3
"""Converts the bundled fixture model (tests/fixtures/model/qwen3-pystd) to a GGUF for llama.cpp.

The fixture is a tiny trained Qwen3 (Hugging Face layout: config.json, model.safetensors with
BF16 tensors, a byte-level BPE tokenizer.json). This writes the same weights as llama.cpp's
"qwen3" architecture so a real llama-server can serve it, with llama.cpp's own gguf-py
(pass --gguf-py DIR; nothing of llama.cpp lives in this repository). Only python3 and numpy
are needed: the safetensors file is read here (8-byte little-endian header length, a JSON
header, raw little-endian bytes).

Weights:
  --outtype f32   (default) every tensor F32: BF16 -> F32 is exact
  --outtype bf16  matrices kept as the checkpoint's BF16 bits (exact), norms F32
  --outtype f16   matrices rounded to F16, norms F32. Lossy for this model: layer 1's
                  v_proj was scaled by 2^-9 in training (see training.json "magnitude"), and
                  about 200 of its values are F16 subnormals; a few other values round too
Tokenizer: gpt2-style BPE (tokens, types, merges), bos/eos/pad ids from config.json and
tokenizer_config.json, add_bos false. llama.cpp cannot take a pre-tokenizer regex from the
file; it picks one of its built-in regexes by the name in tokenizer.ggml.pre (--pre, default
"qwen2"). The fixture's regex (tokenizer.json pre_tokenizer) is its own, so llama.cpp's token
ids can differ from the Hugging Face tokenizer's on some text (identifiers with '_' or digits,
" 123"); run with --check-tokens to count how often on heldout.txt (needs nothing else).

Usage: /usr/bin/python3 tools/make_gguf_fixture.py --gguf-py LLAMA_CPP/gguf-py \\
           --out MODEL.gguf [--model tests/fixtures/model/qwen3-pystd] [--outtype f32|bf16|f16]
           [--pre qwen2]
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

DEFAULT_MODEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                             "fixtures", "model", "qwen3-pystd")

LAYER_NAMES = {"input_layernorm.weight": "attn_norm.weight",
               "self_attn.q_proj.weight": "attn_q.weight",
               "self_attn.k_proj.weight": "attn_k.weight",
               "self_attn.v_proj.weight": "attn_v.weight",
               "self_attn.o_proj.weight": "attn_output.weight",
               "self_attn.q_norm.weight": "attn_q_norm.weight",
               "self_attn.k_norm.weight": "attn_k_norm.weight",
               "post_attention_layernorm.weight": "ffn_norm.weight",
               "mlp.gate_proj.weight": "ffn_gate.weight",
               "mlp.up_proj.weight": "ffn_up.weight",
               "mlp.down_proj.weight": "ffn_down.weight"}
TOP_NAMES = {"model.embed_tokens.weight": "token_embd.weight",
             "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}


def read_safetensors(path):
    """name -> (dtype string, numpy array in that dtype; BF16 as uint16 bits), in file order."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise SystemExit(f"{path}: too short for safetensors")
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        raise SystemExit(f"{path}: header length {n} runs past the file")
    header = json.loads(data[8:8 + n])
    base = 8 + n
    kinds = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2")}
    out = {}
    for name, info in sorted(header.items(), key=lambda kv: kv[1].get("data_offsets", [0])[0]
                             if isinstance(kv[1], dict) else -1):
        if name == "__metadata__":
            continue
        dtype = info["dtype"]
        if dtype not in kinds:
            raise SystemExit(f"{path}: {name}: dtype {dtype} not handled")
        begin, end = info["data_offsets"]
        shape = tuple(info["shape"])
        count = int(np.prod(shape)) if shape else 1
        if end - begin != count * kinds[dtype].itemsize or base + end > len(data):
            raise SystemExit(f"{path}: {name}: data_offsets do not match shape {list(shape)}")
        a = np.frombuffer(data, dtype=kinds[dtype], count=count, offset=base + begin).reshape(shape)
        out[name] = (dtype, a)
    return out


def to_f32(dtype, a):
    if dtype == "BF16":
        return (a.astype(np.uint32) << np.uint32(16)).view(np.float32)
    return a.astype(np.float32)


def gguf_name(hf_name):
    if hf_name in TOP_NAMES:
        return TOP_NAMES[hf_name]
    prefix = "model.layers."
    if hf_name.startswith(prefix):
        layer, rest = hf_name[len(prefix):].split(".", 1)
        if rest in LAYER_NAMES:
            return f"blk.{int(layer)}.{LAYER_NAMES[rest]}"
    raise SystemExit(f"tensor {hf_name}: no llama.cpp qwen3 name for it")


def load_tokenizer(model_dir, vocab_size):
    with open(os.path.join(model_dir, "tokenizer.json"), encoding="utf-8") as f:
        tok = json.load(f)
    if tok["model"].get("type") != "BPE":
        raise SystemExit("tokenizer.json: only a BPE model is handled")
    by_id = {i: t for t, i in tok["model"]["vocab"].items()}
    special = {a["id"]: a for a in tok.get("added_tokens", [])}
    tokens, types = [], []
    for i in range(vocab_size):
        if i in special:
            tokens.append(special[i]["content"])
            types.append(3 if special[i].get("special") else 4)  # CONTROL / USER_DEFINED
        elif i in by_id:
            tokens.append(by_id[i])
            types.append(1)  # NORMAL
        else:
            tokens.append(f"[PAD{i}]")
            types.append(5)  # UNUSED
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    return tok, tokens, types, merges


# ---- the fixture's own tokenizer, for --check-tokens (Hugging Face semantics) ----

def byte_to_unicode():
    """GPT-2's byte -> printable character table: the one train_fixture_model.py trained with."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from train_fixture_model import bytes_to_unicode
    return bytes_to_unicode()


def hf_encoder(tok):
    import re
    pre = tok["pre_tokenizer"]
    pattern = None
    for p in pre.get("pretokenizers", [pre]):
        if p.get("type") == "Split":
            pattern = p["pattern"]["Regex"]
    if pattern is None:
        raise SystemExit("tokenizer.json: no Split pre-tokenizer")
    split = re.compile(pattern)
    vocab = tok["model"]["vocab"]
    ranks = {tuple(m.split(" ") if isinstance(m, str) else m): r
             for r, m in enumerate(tok["model"]["merges"])}
    b2u = byte_to_unicode()

    def bpe(word):
        parts = list(word)
        while len(parts) > 1:
            best = min(((ranks.get((parts[i], parts[i + 1]), 1 << 30), i)
                        for i in range(len(parts) - 1)))
            if best[0] == 1 << 30:
                break
            i = best[1]
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        return [vocab[p] for p in parts]

    def encode(text):
        ids = []
        for piece in split.findall(text):
            ids += bpe("".join(b2u[b] for b in piece.encode("utf-8")))
        return ids
    return encode


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL, help="Hugging Face folder")
    parser.add_argument("--out", help="GGUF file to write")
    parser.add_argument("--gguf-py", help="llama.cpp's gguf-py folder")
    parser.add_argument("--outtype", choices=("f32", "bf16", "f16"), default="f32")
    parser.add_argument("--pre", default="qwen2",
                        help="llama.cpp pre-tokenizer name (tokenizer.ggml.pre)")
    parser.add_argument("--name", default="kvaudit qwen3-pystd fixture")
    parser.add_argument("--check-tokens", metavar="TEXT_FILE",
                        help="print the fixture tokenizer's ids for each line of TEXT_FILE as "
                             "JSON lines (to compare with llama-server /tokenize) and exit")
    args = parser.parse_args()
    model_dir = os.path.abspath(args.model)
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)

    if args.check_tokens:
        with open(os.path.join(model_dir, "tokenizer.json"), encoding="utf-8") as f:
            encode = hf_encoder(json.load(f))
        with open(args.check_tokens, encoding="utf-8") as f:
            for line in f.read().split("\n\n"):
                print(json.dumps({"text": line, "ids": encode(line)}))
        return
    if not args.out or not args.gguf_py:
        parser.error("--out and --gguf-py are needed (llama.cpp's gguf-py folder)")

    sys.path.insert(0, os.path.abspath(args.gguf_py))
    import gguf  # llama.cpp's writer, from the caller's checkout

    if cfg.get("model_type") != "qwen3":
        raise SystemExit(f"config.json: model_type {cfg.get('model_type')!r}, expected 'qwen3'")
    tok_cfg = {}
    tc_path = os.path.join(model_dir, "tokenizer_config.json")
    if os.path.exists(tc_path):
        with open(tc_path) as f:
            tok_cfg = json.load(f)

    n_embd, n_head = cfg["hidden_size"], cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or n_embd // n_head
    n_ctx = cfg.get("max_position_embeddings", tok_cfg.get("model_max_length", 4096))
    vocab_size = cfg["vocab_size"]

    w = gguf.GGUFWriter(args.out, "qwen3")
    w.add_name(args.name)
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_embd)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(n_head)
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(float(cfg.get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    w.add_file_type({"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                     "bf16": gguf.LlamaFileType.MOSTLY_BF16}[args.outtype])

    tok, tokens, types, merges = load_tokenizer(model_dir, vocab_size)
    content_to_id = {a["content"]: a["id"] for a in tok.get("added_tokens", [])}
    content_to_id.update(tok["model"]["vocab"])

    def token_id(key):
        name = tok_cfg.get(key)
        if isinstance(name, dict):
            name = name.get("content")
        if isinstance(name, str) and name in content_to_id:
            return content_to_id[name]
        value = cfg.get(key + "_id")
        return value if isinstance(value, int) else None

    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(args.pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    for key, add in (("bos_token", w.add_bos_token_id), ("eos_token", w.add_eos_token_id),
                     ("pad_token", w.add_pad_token_id)):
        tid = token_id(key)
        if key == "bos_token" and tid is None:
            tid = cfg.get("bos_token_id")  # tokenizer_config says null; config.json has one
        if tid is not None:
            add(tid)
    w.add_add_bos_token(bool(tok_cfg.get("add_bos_token", False)))
    w.add_add_eos_token(bool(tok_cfg.get("add_eos_token", False)))
    if tok_cfg.get("chat_template"):
        w.add_chat_template(tok_cfg["chat_template"])

    tensors = read_safetensors(os.path.join(model_dir, "model.safetensors"))
    if cfg.get("tie_word_embeddings") and "lm_head.weight" in tensors:
        del tensors["lm_head.weight"]  # llama.cpp reuses token_embd when output is absent
    order = sorted(tensors, key=lambda n: (n.startswith("model.layers."),
                                           int(n.split(".")[2]) if n.startswith("model.layers.")
                                           else 0, gguf_name(n)))
    for name in order:
        dtype, a = tensors[name]
        target = gguf_name(name)
        if a.ndim == 1 or args.outtype == "f32":
            w.add_tensor(target, np.ascontiguousarray(to_f32(dtype, a)))
        elif args.outtype == "f16":
            w.add_tensor(target, np.ascontiguousarray(to_f32(dtype, a).astype(np.float16)))
        elif dtype == "BF16":
            w.add_tensor(target, np.ascontiguousarray(a), raw_shape=a.shape,
                         raw_dtype=gguf.GGMLQuantizationType.BF16)
        else:
            raise SystemExit(f"{name}: --outtype bf16 needs BF16 tensors, found {dtype}")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {args.out}: qwen3, {len(order)} tensors ({args.outtype}), "
          f"{vocab_size} tokens, {len(merges)} merges, pre={args.pre}")


if __name__ == "__main__":
    main()
