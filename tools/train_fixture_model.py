#!/usr/bin/python3
"""Trains the small Qwen3-architecture fixture model that kvaudit's eval tests measure.

What it makes (tests/fixtures/model/qwen3-pystd/):
  config.json            Qwen3ForCausalLM config (Hugging Face layout)
  model.safetensors      weights in BF16, tied embeddings
  tokenizer.json         its own byte-level BPE (Hugging Face format, see below)
  tokenizer_config.json
  heldout.txt            held-out Python standard library source (never trained on)
  training.json          every setting, the loss curve, and the held-out loss of the
                         stored BF16 weights, which the C++ tests reproduce

Vocabulary: the real Qwen3 vocabulary (151,669 tokens) would make the embedding alone
~39 MB at d=128, so the model gets its own byte-level BPE of VOCAB_SIZE tokens learned
on the training text: 256 byte tokens, VOCAB_SIZE - 257 merges, and <|endoftext|>. It is
a standard Hugging Face tokenizer.json (BPE model, Split + ByteLevel pre-tokenizers,
ByteLevel decoder), so kvaudit's tokenizer module reads it like any other checkpoint's.
The Split regex uses only ASCII classes (letters/digits/underscore, space/tab/CR/LF) so
Python's re, PCRE2 and Oniguruma all split text identically.

Data: /usr/lib/python3.11 (Debian's Python standard library, PSF licence), test suites
excluded; files are split into train / held-out by a hash of their path.
Training: CPU, torch.set_num_threads(2), AdamW, bounded by --max-seconds of wall time.

Usage: /usr/bin/python3 tools/train_fixture_model.py [--max-seconds 540] [--out DIR]
"""
import argparse
import hashlib
import heapq
import json
import math
import os
import re
import struct
import sys
import time
from collections import Counter, defaultdict

# On a shared machine OpenMP's spinning barriers cost 5x; let waiting threads sleep.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

SOURCE_ROOT = "/usr/lib/python3.11"
VOCAB_SIZE = 2048
TRAIN_BYTES = 6_000_000
HELDOUT_BYTES = 48_000
SPLIT_REGEX = (r" ?[A-Za-z_][A-Za-z0-9_]*| ?[0-9]{1,3}| ?[^ \t\r\nA-Za-z0-9_]+[\r\n]*"
               r"|[ \t]*[\r\n]+|[ \t\r\n]+(?![^ \t\r\n])|[ \t\r\n]+")
EOT = "<|endoftext|>"

MODEL = dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4,
             num_attention_heads=4, num_key_value_heads=2, head_dim=32,
             rms_norm_eps=1e-6, rope_theta=10000.0)
TRAIN = dict(seq_len=256, batch=4, lr=5e-3, min_lr_ratio=0.1, warmup_steps=20,
             weight_decay=0.1, betas=(0.9, 0.95), grad_clip=1.0, seed=20261129,
             init_std=0.02, copy_fraction=1.0, copy_min_tokens=16, copy_max_tokens=64)
# Copy augmentation: in copy_fraction of the training windows an earlier span of
# copy_min..copy_max tokens is written again later in the same window (the corpus's own
# text, not the recall probe's synthetic functions), so copying from context pays.

# A seeded induction circuit. Long-range recall needs an induction circuit (a head that
# attends to the previous token, and a later head that attends to the position after an
# earlier occurrence of the current token and copies what follows it). From random weights
# it appears only after far more tokens than a CPU can train here: three attempts of 10 to
# 20 CPU-minutes (plain text; text with copied spans; repeated random blocks) left recall at
# the control level, and 500 steps on random tokens with copied spans did not move their
# loss off uniform. So the weights start with one, written analytically in the style of
# mechanistic-interpretability constructions; the two heads' attention patterns are kept
# fixed and everything else (embeddings, values, outputs, MLPs, the other heads and
# layers) is trained on the stdlib text as usual:
#   residual dim 0 is a constant channel (every embedding's dim 0 = const); dims 74..83
#     hold a fixed random +-code_scale code per token; the trained token embedding lives in
#     dims 1..63 (scaled by embed_gain); the rest start at zero;
#   layer 0 head 0: q and k read only the constant channel, with k's RoPE pairs 0..3 turned
#     by one position's angle, so every query's score peaks at the previous position; its
#     V copies the code dims and o_proj writes them into dims 64..73 (prev_gain), which
#     nothing else in layer 0 (nor the embedding) writes;
#   layer 1 head 0: q reads the current token's code and k the previous token's (dims
#     64..73), both placed on the RoPE pairs 11..15, which turn by under 0.5 rad over 256
#     positions, so the score measures whether the two codes match; its V is an orthonormal
#     projection C of the token dims, written back into them (copy_gain * C^T, trained
#     from there);
#   the QK-norm weights of those layers (prev_norm, match_norm) make both heads sharp, and
#     the final norm weight (final_norm, trained) lets the copied token's logit stand out.
SEED_CIRCUIT = dict(const=0.05, embed_gain=5.0, code_scale=0.1, prev_gain=0.1, copy_gain=1.0,
                    prev_norm=3.0, match_norm=3.0, final_norm=2.0, seed=5)

# After training, some layers get K or V rescaled by a power of two, with the inverse power
# on the weight that consumes them, so the function is unchanged (powers of two are exact in
# BF16 and F32: the logits are bit-identical) while those layers' magnitudes sit where FP8
# at scale 1.0 loses precision: amax below 0.1, much of the layer in E4M3's subnormal range
# below 2^-6, as in real checkpoints whose V (or K) are small. kvaudit's calibration must
# then show a difference between scale 1.0 and calibrated scales (QK-norm otherwise keeps
# this model's K near 1, where scale 1.0 is harmless).
#   V of layer L: v_proj * 2^-s, o_proj * 2^s.   K of layer L: k_norm * 2^-s, q_norm * 2^s.
# s is the smallest shift that brings the layer's held-out amax below target_amax.
MAGNITUDE = dict(small_v_layers=[1], small_k_layers=[2], target_amax=0.03)


# ----------------------------------------------------------------------------- data

def source_files():
    paths = []
    for root, dirs, files in os.walk(SOURCE_ROOT):
        dirs[:] = sorted(d for d in dirs if d not in ("test", "tests", "idle_test",
                                                      "site-packages", "dist-packages",
                                                      "__pycache__"))
        paths += [os.path.join(root, f) for f in sorted(files) if f.endswith(".py")]
    return paths


def is_heldout(path):
    return hashlib.sha256(path.encode()).digest()[0] % 16 == 0


def read_corpus():
    train, heldout = [], []
    train_bytes = heldout_bytes = 0
    for path in source_files():
        with open(path, "rb") as f:
            text = f.read().decode("utf-8", errors="replace")
        if is_heldout(path):
            if heldout_bytes < HELDOUT_BYTES:
                heldout.append(text)
                heldout_bytes += len(text.encode())
        elif train_bytes < TRAIN_BYTES:
            train.append(text)
            train_bytes += len(text.encode())
    held = "".join(heldout).encode()[:HELDOUT_BYTES].decode("utf-8", errors="ignore")
    held = held[:held.rfind("\n") + 1]
    return train, held


# ----------------------------------------------------------------------------- tokenizer

def bytes_to_unicode():
    """GPT-2's byte -> printable character table used by ByteLevel pre-tokenizers."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


BYTE_CHAR = bytes_to_unicode()
SPLIT = re.compile(SPLIT_REGEX)


def pretokenize(text):
    return ["".join(BYTE_CHAR[b] for b in piece.encode()) for piece in SPLIT.findall(text)]


def train_bpe(texts, merges_wanted):
    """Classic BPE training with incremental pair counts; ties broken by the pair itself."""
    word_counts = Counter()
    for text in texts:
        word_counts.update(pretokenize(text))
    words = [list(w) for w in word_counts]
    freqs = list(word_counts.values())
    pair_counts = Counter()
    where = defaultdict(set)
    for i, w in enumerate(words):
        for pair in zip(w, w[1:]):
            pair_counts[pair] += freqs[i]
            where[pair].add(i)
    heap = [(-c, p) for p, c in pair_counts.items()]
    heapq.heapify(heap)
    merges = []
    while len(merges) < merges_wanted and heap:
        count, pair = heapq.heappop(heap)
        if pair_counts.get(pair, 0) != -count or count == 0:
            continue
        merges.append(pair)
        merged = pair[0] + pair[1]
        touched = set()
        for i in list(where[pair]):
            w = words[i]
            for p in zip(w, w[1:]):
                pair_counts[p] -= freqs[i]
                touched.add(p)
            out, j = [], 0
            while j < len(w):
                if j + 1 < len(w) and w[j] == pair[0] and w[j + 1] == pair[1]:
                    out.append(merged)
                    j += 2
                else:
                    out.append(w[j])
                    j += 1
            words[i] = out
            for p in zip(out, out[1:]):
                pair_counts[p] += freqs[i]
                where[p].add(i)
                touched.add(p)
        del pair_counts[pair]
        where.pop(pair, None)
        for p in touched:
            if pair_counts.get(p, 0) > 0:
                heapq.heappush(heap, (-pair_counts[p], p))
    return merges


class Bpe:
    """Encoder with Hugging Face BPE semantics: lowest-rank pair first, leftmost first."""

    def __init__(self, merges):
        self.ranks = {pair: i for i, pair in enumerate(merges)}
        self.vocab = {BYTE_CHAR[b]: b for b in range(256)}
        for i, (a, b) in enumerate(merges):
            self.vocab[a + b] = 256 + i
        self.eot_id = len(self.vocab)
        self.cache = {}

    def word(self, w):
        if w in self.cache:
            return self.cache[w]
        symbols = list(w)
        while len(symbols) > 1:
            ranked = [(self.ranks.get(p, 1 << 30), k) for k, p in enumerate(zip(symbols, symbols[1:]))]
            rank, k = min(ranked)
            if rank == 1 << 30:
                break
            symbols = symbols[:k] + [symbols[k] + symbols[k + 1]] + symbols[k + 2:]
        ids = [self.vocab[s] for s in symbols]
        self.cache[w] = ids
        return ids

    def encode(self, text):
        ids = []
        for w in pretokenize(text):
            ids += self.word(w)
        return ids


def tokenizer_json(bpe, merges):
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": bpe.eot_id, "content": EOT, "single_word": False,
                          "lstrip": False, "rstrip": False, "normalized": False,
                          "special": True}],
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": SPLIT_REGEX}, "behavior": "Isolated",
             "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
             "use_regex": False}]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                    "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": "", "end_of_word_suffix": "", "fuse_unk": False,
                  "byte_fallback": False, "ignore_merges": False,
                  "vocab": bpe.vocab, "merges": [f"{a} {b}" for a, b in merges]},
    }


# ----------------------------------------------------------------------------- model

def rms_norm(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Qwen3(torch.nn.Module):
    """Qwen3 decoder (QK-norm, GQA, RoPE, SwiGLU, RMSNorm, tied embeddings)."""

    def __init__(self, vocab):
        super().__init__()
        c = MODEL
        d, hd, H, KV = c["hidden_size"], c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"]
        self.p = torch.nn.ParameterDict()
        std = TRAIN["init_std"]

        def param(name, *shape, scale=std, ones=False):
            t = torch.ones(*shape) if ones else torch.randn(*shape) * scale
            self.p[name.replace(".", "__")] = torch.nn.Parameter(t)

        param("model.embed_tokens.weight", vocab, d)
        param("model.norm.weight", d, ones=True)
        out_std = std / math.sqrt(2 * c["num_hidden_layers"])
        for i in range(c["num_hidden_layers"]):
            p = f"model.layers.{i}."
            param(p + "input_layernorm.weight", d, ones=True)
            param(p + "post_attention_layernorm.weight", d, ones=True)
            param(p + "self_attn.q_proj.weight", H * hd, d)
            param(p + "self_attn.k_proj.weight", KV * hd, d)
            param(p + "self_attn.v_proj.weight", KV * hd, d)
            param(p + "self_attn.o_proj.weight", d, H * hd, scale=out_std)
            param(p + "self_attn.q_norm.weight", hd, ones=True)
            param(p + "self_attn.k_norm.weight", hd, ones=True)
            param(p + "mlp.gate_proj.weight", c["intermediate_size"], d)
            param(p + "mlp.up_proj.weight", c["intermediate_size"], d)
            param(p + "mlp.down_proj.weight", d, c["intermediate_size"], scale=out_std)
        inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
        self.inv_freq = inv

    def w(self, name):
        return self.p[name.replace(".", "__")]

    def named_weights(self):
        return {k.replace("__", "."): v for k, v in self.p.items()}

    def forward(self, ids, capture=None):
        """Logits; capture (a list), if given, receives each layer's (K, V) as the engine
        caches them (K after QK-norm and RoPE)."""
        c = MODEL
        B, T = ids.shape
        H, KV, hd, eps = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], c["rms_norm_eps"]
        angles = torch.arange(T, dtype=torch.float64)[:, None] * self.inv_freq[None, :]
        emb = torch.cat((angles, angles), dim=-1)
        cos, sin = emb.cos().float()[None, None], emb.sin().float()[None, None]
        mask = torch.full((T, T), float("-inf")).triu(1)
        x = F.embedding(ids, self.w("model.embed_tokens.weight"))
        for i in range(c["num_hidden_layers"]):
            p = f"model.layers.{i}."
            h = rms_norm(x, self.w(p + "input_layernorm.weight"), eps)
            q = (h @ self.w(p + "self_attn.q_proj.weight").T).view(B, T, H, hd).transpose(1, 2)
            k = (h @ self.w(p + "self_attn.k_proj.weight").T).view(B, T, KV, hd).transpose(1, 2)
            v = (h @ self.w(p + "self_attn.v_proj.weight").T).view(B, T, KV, hd).transpose(1, 2)
            q = rms_norm(q, self.w(p + "self_attn.q_norm.weight"), eps)
            k = rms_norm(k, self.w(p + "self_attn.k_norm.weight"), eps)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            if capture is not None:
                capture.append((k.detach(), v.detach()))
            k = k.repeat_interleave(H // KV, dim=1)
            v = v.repeat_interleave(H // KV, dim=1)
            att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd) + mask, dim=-1)
            out = (att @ v).transpose(1, 2).reshape(B, T, H * hd)
            x = x + out @ self.w(p + "self_attn.o_proj.weight").T
            h = rms_norm(x, self.w(p + "post_attention_layernorm.weight"), eps)
            gate = h @ self.w(p + "mlp.gate_proj.weight").T
            up = h @ self.w(p + "mlp.up_proj.weight").T
            x = x + (F.silu(gate) * up) @ self.w(p + "mlp.down_proj.weight").T
        x = rms_norm(x, self.w("model.norm.weight"), eps)
        return x @ self.w("model.embed_tokens.weight").T


def orthonormal_rows(rows, cols, generator):
    q, _ = torch.linalg.qr(torch.randn(cols, rows, generator=generator))
    return q.T.contiguous()


def seed_induction_circuit(model):
    """Writes the circuit described at SEED_CIRCUIT into freshly initialised weights and
    returns the slices training must leave as they are."""
    c, hd = SEED_CIRCUIT, MODEL["head_dim"]
    gen = torch.Generator().manual_seed(c["seed"])
    token, prev, code = slice(1, 64), slice(64, 74), slice(74, 84)
    code_dims = code.stop - code.start
    with torch.no_grad():
        embed = model.w("model.embed_tokens.weight")
        embed[:, 64:] = 0.0
        embed[:, token] *= c["embed_gain"]
        embed[:, 0] = c["const"]
        signs = torch.randint(0, 2, (embed.shape[0], code_dims), generator=gen) * 2 - 1
        embed[:, code] = c["code_scale"] * signs.float()
        # Layer 0, head 0 (KV head 0): the previous-token head; it moves the previous
        # token's code into the prev dims, which nothing else in layer 0 writes.
        p = "model.layers.0."
        q, k, v, o = (model.w(p + f"self_attn.{n}_proj.weight") for n in "qkvo")
        q[:hd] = 0.0
        k[:hd] = 0.0
        for j in range(4):
            angle = float(model.inv_freq[j])
            q[j, 0] = 1.0
            k[j, 0], k[j + hd // 2, 0] = math.cos(angle), math.sin(angle)
        v[:code_dims] = 0.0
        v[:code_dims, code] = torch.eye(code_dims)
        o[64:84] = 0.0
        o[prev, :code_dims] = c["prev_gain"] * torch.eye(code_dims)
        model.w(p + "mlp.down_proj.weight")[64:84] = 0.0
        model.w(p + "self_attn.q_norm.weight").fill_(c["prev_norm"])
        model.w(p + "self_attn.k_norm.weight").fill_(c["prev_norm"])
        # Layer 1, head 0 (KV head 0): the induction head. It matches the current token's
        # code against the previous token's on the slow RoPE pairs and copies the token dims
        # of the position it finds.
        p = "model.layers.1."
        q, k, v, o = (model.w(p + f"self_attn.{n}_proj.weight") for n in "qkvo")
        for w in (q, k, v):
            w[:hd] = 0.0
        o[:, :hd] = 0.0
        slow_pairs = [11, 12, 13, 14, 15, 27, 28, 29, 30, 31]
        for i, dim in enumerate(slow_pairs):
            q[dim, code.start + i] = 1.0
            k[dim, prev.start + i] = 1.0
        copy = orthonormal_rows(hd, 63, gen)
        v[:hd, token] = copy
        o[token, :hd] = c["copy_gain"] * copy.T
        model.w(p + "self_attn.q_norm.weight").fill_(c["match_norm"])
        model.w(p + "self_attn.k_norm.weight").fill_(c["match_norm"])
        model.w("model.norm.weight").fill_(c["final_norm"])
    frozen = [("model.embed_tokens.weight", (slice(None), slice(0, 1))),
              ("model.embed_tokens.weight", (slice(None), slice(64, 84))),
              ("model.layers.0.self_attn.v_proj.weight", (slice(0, code_dims),)),
              ("model.layers.0.self_attn.o_proj.weight", (slice(64, 84),)),
              ("model.layers.0.mlp.down_proj.weight", (slice(64, 84),))]
    for layer in (0, 1):
        p = f"model.layers.{layer}."
        frozen += [(p + "self_attn.q_proj.weight", (slice(0, hd),)),
                   (p + "self_attn.k_proj.weight", (slice(0, hd),)),
                   (p + "self_attn.q_norm.weight", (slice(None),)),
                   (p + "self_attn.k_norm.weight", (slice(None),)),
                   (p + "input_layernorm.weight", (slice(None),))]
    return [(model.w(name), index, model.w(name)[index].detach().clone()) for name, index in frozen]


def restore_frozen(frozen):
    with torch.no_grad():
        for tensor, index, value in frozen:
            tensor[index] = value


def heldout_loss(model, ids, seq_len, max_chunks):
    """Mean NLL (nats) over positions 1..seq_len-1 of consecutive seq_len-token chunks."""
    total, count = 0.0, 0
    with torch.no_grad():
        for c in range(min(max_chunks, len(ids) // seq_len)):
            chunk = torch.tensor(ids[c * seq_len:(c + 1) * seq_len])[None]
            logits = model(chunk)[0, :-1].double()
            total += F.cross_entropy(logits, chunk[0, 1:], reduction="sum").item()
            count += seq_len - 1
    return total / count


def kv_amax_per_layer(model, ids, seq_len, max_chunks):
    """Largest |K| and |V| each layer caches over the held-out chunks."""
    amax = [[0.0, 0.0] for _ in range(MODEL["num_hidden_layers"])]
    with torch.no_grad():
        for c in range(min(max_chunks, len(ids) // seq_len)):
            capture = []
            model(torch.tensor(ids[c * seq_len:(c + 1) * seq_len])[None], capture)
            for layer, (k, v) in enumerate(capture):
                amax[layer][0] = max(amax[layer][0], k.abs().max().item())
                amax[layer][1] = max(amax[layer][1], v.abs().max().item())
    return [{"layer": i, "k_amax": round(k, 6), "v_amax": round(v, 6)}
            for i, (k, v) in enumerate(amax)]


def set_kv_magnitudes(model, ids, seq_len, max_chunks):
    """Applies MAGNITUDE (see above); returns the shifts it applied."""
    amax = kv_amax_per_layer(model, ids, seq_len, max_chunks)
    shifts = []
    with torch.no_grad():
        for role, layers in (("k", MAGNITUDE["small_k_layers"]), ("v", MAGNITUDE["small_v_layers"])):
            for layer in layers:
                ratio = amax[layer][role + "_amax"] / MAGNITUDE["target_amax"]
                shift = max(0, math.floor(math.log2(ratio)) + 1) if ratio >= 1 else 0
                p = f"model.layers.{layer}.self_attn."
                small, large = ("k_norm", "q_norm") if role == "k" else ("v_proj", "o_proj")
                model.w(p + small + ".weight").mul_(2.0 ** -shift)
                model.w(p + large + ".weight").mul_(2.0 ** shift)
                shifts.append({"layer": layer, "tensor": role, "log2_scale": -shift})
    return shifts


def read_safetensors_bf16(path):
    with open(path, "rb") as f:
        raw = f.read()
    length = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + length])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        bits = torch.frombuffer(bytearray(raw[8 + length + begin:8 + length + end]), dtype=torch.int16)
        out[name] = bits.view(torch.bfloat16).float().reshape(info["shape"])
    return out


def rescale_only(out_dir):
    """Applies MAGNITUDE to an already trained fixture in place: reads its BF16 weights,
    rescales, checks that the held-out loss is unchanged, and records it in training.json."""
    with open(os.path.join(out_dir, "training.json")) as f:
        record = json.load(f)
    if "magnitude" in record:
        raise SystemExit(f"{out_dir} is already rescaled: {record['magnitude']}")
    with open(os.path.join(out_dir, "tokenizer.json")) as f:
        merges = [tuple(m.split(" ")) for m in json.load(f)["model"]["merges"]]
    bpe = Bpe(merges)
    with open(os.path.join(out_dir, "heldout.txt")) as f:
        held_ids = bpe.encode(f.read())
    model = Qwen3(bpe.eot_id + 1)
    weights = read_safetensors_bf16(os.path.join(out_dir, "model.safetensors"))
    with torch.no_grad():
        for name, value in weights.items():
            model.w(name).copy_(value)
    S, chunks = record["heldout"]["seq_len"], record["heldout"]["chunks"]
    before = heldout_loss(model, held_ids, S, chunks)
    amax_before = kv_amax_per_layer(model, held_ids, S, chunks)
    shifts = set_kv_magnitudes(model, held_ids, S, chunks)
    after = heldout_loss(model, held_ids, S, chunks)
    amax = kv_amax_per_layer(model, held_ids, S, chunks)
    print(f"held-out loss {before!r} -> {after!r}; shifts {shifts}\namax before {amax_before}\n"
          f"amax after {amax}", flush=True)
    if abs(after - before) > 1e-9 or abs(before - record["heldout"]["mean_nll_nats"]) > 1e-6:
        raise SystemExit("the rescaled model does not compute the recorded function")
    write_safetensors_bf16(os.path.join(out_dir, "model.safetensors"), model.named_weights())
    record["magnitude"] = {**MAGNITUDE, "applied": shifts, "applied_by": "--rescale-only"}
    record["kv_amax_heldout"] = amax
    with open(os.path.join(out_dir, "training.json"), "w") as f:
        json.dump(record, f)


# ----------------------------------------------------------------------------- output

def write_safetensors_bf16(path, tensors):
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        raw = tensors[name].detach().to(torch.bfloat16).contiguous().view(torch.int16).numpy().tobytes()
        header[name] = {"dtype": "BF16", "shape": list(tensors[name].shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def make_optimizer(model, train):
    """AdamW with weight decay on every parameter but the norms' weights."""
    decay = [v for k, v in model.p.items() if not k.endswith("norm__weight")]
    no_decay = [v for k, v in model.p.items() if k.endswith("norm__weight")]
    return torch.optim.AdamW([{"params": decay, "weight_decay": train["weight_decay"]},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=train["lr"], betas=train["betas"])


def train_steps(model, opt, data, vocab, budget, train, after_step, started):
    """AdamW steps on random windows of `data` (each with a span copied later in the window,
    train["copy_fraction"] of them) until `budget` seconds have passed; the learning rate
    follows warmup then a cosine on wall time, so a slower or busier machine takes fewer
    steps of the same schedule. after_step() runs after each update (restores the frozen
    slices). Returns (steps, losses)."""
    S, B = train["seq_len"], train["batch"]
    step, losses = 0, []
    train_started = time.time()
    while True:
        progress = (time.time() - train_started) / budget
        if progress >= 1.0:
            break
        warm = min(1.0, (step + 1) / train["warmup_steps"])
        cosine = train["min_lr_ratio"] + (1 - train["min_lr_ratio"]) * 0.5 * (1 + math.cos(math.pi * progress))
        for g in opt.param_groups:
            g["lr"] = train["lr"] * warm * cosine
        starts = torch.randint(0, len(data) - S - 1, (B,))
        batch = torch.stack([data[s:s + S + 1] for s in starts.tolist()])
        for row in range(B):
            if torch.rand(1).item() < train["copy_fraction"]:
                span = int(torch.randint(train["copy_min_tokens"], train["copy_max_tokens"] + 1, (1,)))
                src = int(torch.randint(0, S + 1 - 2 * span, (1,)))
                dst = int(torch.randint(src + span, S + 2 - span, (1,)))
                batch[row, dst:dst + span] = batch[row, src:src + span].clone()
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, vocab), batch[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), train["grad_clip"])
        opt.step()
        after_step()
        losses.append(round(loss.item(), 4))
        if step % 25 == 0:
            print(f"step {step} ({progress:.0%}) loss {loss.item():.3f} ({time.time() - started:.0f} s)", flush=True)
        step += 1
    return step, losses


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-seconds", type=float, default=590.0)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                      "..", "tests", "fixtures", "model", "qwen3-pystd"))
    parser.add_argument("--merges-from", help="reuse the merges of an earlier run's tokenizer.json "
                        "(BPE training is deterministic; this only saves its minute)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rescale-only", action="store_true",
                        help="apply MAGNITUDE to the trained model in --out and stop")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.rescale_only:
        rescale_only(args.out)
        return
    torch.manual_seed(TRAIN["seed"])
    started = time.time()

    train_texts, held = read_corpus()
    if args.merges_from:
        with open(args.merges_from) as f:
            merges = [tuple(m.split(" ")) for m in json.load(f)["model"]["merges"]]
    else:
        merges = train_bpe(train_texts, VOCAB_SIZE - 257)
    bpe = Bpe(merges)
    vocab = bpe.eot_id + 1
    stream = []
    for text in train_texts:
        stream += bpe.encode(text) + [bpe.eot_id]
    held_ids = bpe.encode(held)
    tokenizer_seconds = time.time() - started
    print(f"tokenizer: {len(merges)} merges, {len(stream)} training tokens, "
          f"{len(held_ids)} held-out tokens ({tokenizer_seconds:.0f} s)", flush=True)

    model = Qwen3(vocab)
    frozen = seed_induction_circuit(model)
    opt = make_optimizer(model, TRAIN)
    data = torch.tensor(stream)
    S, B = TRAIN["seq_len"], TRAIN["batch"]
    budget = args.max_seconds - (time.time() - started) - 25  # leave time to evaluate and save
    step, losses = train_steps(model, opt, data, vocab, budget, TRAIN,
                               lambda: restore_frozen(frozen), started)

    shifts = set_kv_magnitudes(model, held_ids, S, 8)
    # Evaluate exactly what is stored: BF16-rounded weights, float32 arithmetic.
    with torch.no_grad():
        for v in model.p.values():
            v.copy_(v.to(torch.bfloat16).float())
    held_loss = heldout_loss(model, held_ids, S, max_chunks=8)
    print(f"held-out loss {held_loss:.4f} nats/token, ppl {math.exp(held_loss):.2f} "
          f"(uniform {vocab})", flush=True)

    os.makedirs(args.out, exist_ok=True)
    config = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
              "vocab_size": vocab, "max_position_embeddings": 4096, "hidden_act": "silu",
              "tie_word_embeddings": True, "attention_bias": False, "torch_dtype": "bfloat16",
              "use_sliding_window": False, "bos_token_id": bpe.eot_id, "eos_token_id": bpe.eot_id,
              **MODEL}
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    write_safetensors_bf16(os.path.join(args.out, "model.safetensors"), model.named_weights())
    with open(os.path.join(args.out, "tokenizer.json"), "w") as f:
        json.dump(tokenizer_json(bpe, merges), f, ensure_ascii=False)
    with open(os.path.join(args.out, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": EOT, "pad_token": EOT, "bos_token": None,
                   "add_bos_token": False, "model_max_length": 4096}, f, indent=2)
    with open(os.path.join(args.out, "heldout.txt"), "w") as f:
        f.write(held)
    sample = held[:2000]
    with open(os.path.join(args.out, "training.json"), "w") as f:
        json.dump({"generator": "tools/train_fixture_model.py", "source": SOURCE_ROOT,
                   "python": sys.version.split()[0], "torch": torch.__version__,
                   "model": MODEL, "seed_circuit": SEED_CIRCUIT, "threads": args.threads, "train": {**TRAIN, "betas": list(TRAIN["betas"])},
                   "vocab_size": vocab, "split_regex": SPLIT_REGEX,
                   "train_bytes_cap": TRAIN_BYTES, "train_tokens": len(stream),
                   "heldout_tokens": len(held_ids), "steps": step,
                   "tokens_seen": step * S * B, "seconds": round(time.time() - started, 1),
                   "loss_curve_every_10": losses[::10], "final_train_loss": losses[-1],
                   "magnitude": {**MAGNITUDE, "applied": shifts},
                   "kv_amax_heldout": kv_amax_per_layer(model, held_ids, S, 8),
                   "heldout": {"seq_len": S, "chunks": 8, "scored": "positions 1..seq_len-1",
                               "mean_nll_nats": held_loss, "ppl": math.exp(held_loss)},
                   "tokenizer_sample": {"text": sample, "ids": bpe.encode(sample)}}, f)
    print(f"wrote {args.out} after {time.time() - started:.0f} s", flush=True)


if __name__ == "__main__":
    main()
