#!/usr/bin/python3
"""Builds tests/fixtures/model/qwen3-recall: a small Qwen3 that copies exactly over 8K tokens.

Why: the bundled qwen3-pystd fixture (tools/train_fixture_model.py) scores 0% on kvaudit's
long-context probes even at 512 tokens: its seeded induction head matches one token, which is
ambiguous in code (with this tokenizer "fetch_node_table(" is ' f','et','ch','_n','ode','_t',
'able','(' and "_t", "able", "(" recur everywhere), and its RoPE pairs turn too far beyond 256
tokens. With every cell at zero, a KV format that damages recall cannot show. This model shares
qwen3-pystd's vocabulary (tokenizer.json, tokenizer_config.json and heldout.txt are copied
unchanged) and has a copy circuit written into its weights that matches the last ~16 tokens of
context at any distance up to 8K, so the recall / MRCR / tool-call cells sit near 100% in 16 bits
and KV damage shows as a drop. The rest is a (weak) language model trained on the stdlib text.

What it makes (tests/fixtures/model/qwen3-recall/): config.json, model.safetensors (BF16, tied
embeddings), tokenizer.json, tokenizer_config.json, heldout.txt, training.json (every setting,
the positional kernels' margins, the loss curve, the held-out loss, the copy calibration and the
MRCR / tool-call accuracies this script measured with its own forward pass).

Codes. Every token gets a word of the extended Hamming [16,11,4] code as a +-1 vector (exactly
2048 words, a seeded permutation): two different tokens' codes have dot product <= 8 against 16
for a token with itself. Exceptions: the ")"-like tokens (")", ")\\n", "):\\n", "):", ...) all get the
code of --close-target, so they match and copy as one token; tokens that end a line (the three
newline-only ones and ~50 like ":\\n", ",\\n") get a zero code, so the circuit sees every line
boundary as the same blank, and they are the sink (below).

Residual dims (LAYOUT): const (the same value in every embedding: what positional heads attend
with), marker (1 in the embedding of the sink tokens), F (see below), C (the code, small: the
only block besides F that the final norm reads, so tied-embedding logits pick the token whose
code is written there), P1, P2 (full codes of the tokens 1 and 2 back), S2..S8 (8-dim sub-codes
of the tokens 2..8 back), BQ, BK (sub-code "bags" of the tokens ~8..15 back and ~9..16 back); the
rest (LM_START on) is the trained language model's.

Layer 0, all ten heads: positional. Their key is the const channel on RoPE pairs 0..NP-1 with
fixed amplitudes, each query the same with per-pair phases, so a head's score is a fixed
function of the distance. design_kernels() fits amplitudes and phases (float64, Adam, from a
fixed start): heads 0..7 put > 0.99999 of their attention on distance 1..8 at every position
up to 8400 (margin ~17 nats over any other distance); head 8 spreads its attention over
distances 8..15, head 9 is head 8 turned by one position. Their value is the code; o_proj writes
it into P1/P2/S2..S8/BQ/BK. Layer 0's MLP is held at zero, so layer 1's input RMS is the same at
every position (every embedding row has the same energy; renormalise_embedding keeps it so).

Layer 1, KV head 0: the induction key [P1, P2, S3..S8, BK] of each position (the context before
it) and the value = its code; query heads 0 and 1 ask with [C, P1, S2..S7, BQ] (the context
ending here), on RoPE pairs 19..63, which turn by < 1e-6 rad over 8192 positions with
rope_theta 1e21: the score is the cosine between "the last ~16 tokens here" and "the ~16
tokens before that position", the same at any distance, scaled by q_norm/k_norm weight w1. Its
slots have no cross terms (exact slots, sub-codes for the far ones), so a longer exact match
always scores higher. The sink: a sink token's key is only the marker (its code is zero and the
marker weight dwarfs the rest), and each copy head's query has a fixed const part on that
coordinate, so sink positions score a fixed threshold against every query; where no earlier
context matches above it, the head attends to them, whose value is zero: no copy.
  Head 0 ("weak", threshold 0.65) writes copy_gain * code into C. The LM trains with it and sets
its own scale so that copies weigh what they are worth on ordinary code (~60-70% right).
  Head 1 ("strong", threshold 0.95: near-exact long matches, ~80% right on held-out code) gets
its gain after training (calibrate_strong_copy), sized against the trained LM's final RMS so a
strong copy wins by strong_margin nats. A model calibrated to ordinary code would not write what
kvaudit's recall probe expects (its text ends at ")" where code continues with ")\\n"). The margin
is a trade: each strong copy that is wrong on ordinary code costs about that much (see
training.json "strong_copy": held-out loss with and without it).
  F: heads 0 and 1 also write -(close target's code . copied code) / 16 into F, whose final-norm
weight is 16x C's and which is c_scale in the embedding of the ")"-like tokens other than the
target: when a ")"-like token is copied, F takes back from those tokens exactly what C gave them,
so the copy comes out as --close-target.
  Query heads 2..4 (same KV head) have a zero query; KV head 1 and heads 5..9 are trained, off the
slow pairs. Layers 2 and 3 are trained.

Training: the embedding's LM dims, layer 1's heads 5-9 and its MLP, layers 2-3, the LM dims of
the norms. Gradient masks keep trained weights from writing into a circuit dim, so training
cannot break the circuit, while the LM reads the circuit's blocks as features. Data and loop are
train_fixture_model.py's (Python stdlib, copy-augmented windows, AdamW, cosine on wall time,
bounded by --max-seconds with the kernel fit; seeds are fixed, but the step count follows the
machine's speed). After training, MAGNITUDE rescales layer 2's K and layer 3's V by powers of two
with the inverse on their consumer (as train_fixture_model.py; function unchanged), outside the
circuit: FP8 at scale 1.0 loses precision there while the copy keeps working.

Limits: a query before the text's first line end has no sink, so the copy heads copy from the
best partial match there (the first line of any text is predicted badly; kvaudit's probes start
with a comment line, and perplexity scores from n_ctx/2). kvaudit's recall probe scores ")" as
the last token; in its MRCR task the text's token is ")\\n" (the answer is followed by a newline),
and kvaudit counts a round exact when the argmax writes the rest of the answer (")"), as greedy
decoding would. --close-target ")" (the default) therefore passes both.

Usage: /usr/bin/python3 tools/make_recall_model.py [--max-seconds 480] [--out DIR]
           [--close-target ")"] [--threads 1] [--check-cases 4] [--check-recall] [--check-only]
"""
import argparse
import json
import math
import os
import shutil
import sys
import time

sys.dont_write_bytecode = True
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

TOOLS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, TOOLS)
import train_fixture_model as base  # noqa: E402  (corpus, tokenizer, training loop, writer)

ROOT = os.path.normpath(os.path.join(TOOLS, ".."))
PYSTD = os.path.join(ROOT, "tests", "fixtures", "model", "qwen3-pystd")
DEFAULT_OUT = os.path.join(ROOT, "tests", "fixtures", "model", "qwen3-recall")

MODEL = dict(hidden_size=208, intermediate_size=320, num_hidden_layers=4,
             num_attention_heads=10, num_key_value_heads=2, head_dim=128,
             rms_norm_eps=1e-6, rope_theta=1e21)
MAX_POSITIONS = 8192

OFFSETS = 8   # layer 0's heads 0..7 attend to distances 1..8, heads 8 and 9 are the bags
SUB = 8       # dims of the sub-code kept for distances 2..8 and the bags
_S = 51 + SUB * (OFFSETS - 1)
LAYOUT = dict(const=(0, 1), marker=(1, 2), F=(2, 3), C=(3, 19), P1=(19, 35), P2=(35, 51),
              **{f"S{d}": (51 + SUB * (d - 2), 51 + SUB * (d - 1)) for d in range(2, OFFSETS + 1)},
              BQ=(_S, _S + SUB), BK=(_S + SUB, _S + 2 * SUB))
LM_START = _S + 2 * SUB

CIRCUIT = dict(
    code_seed=7,
    const=1.0,          # const channel value in every embedding
    c_scale=0.05,       # code entries in the embedding (small: a token's own code barely moves
                        # its logits; the circuit's projections scale it up)
    lm_norm=4.0,        # length of a normal token's LM part; rows sum to one fixed energy
    block_unit=0.4,     # P1, P2, S2..S8, BQ, BK entries (+-block_unit per code unit): small,
                        # so the circuit's blocks take little of the RMS the LM's layers divide by
    # Layer 0 positional heads: RoPE pairs 0..NP-1, q_norm/k_norm weight w0 on them.
    NP=19, w0=5.0, kernel_steps=4000,
    bag_start=8, bag_end=15, bag_tau=6.0,   # the query's bag window (distances), the key's is +1
    bag_weight=0.4,     # its slot weight (a bag of distinct tokens normalised to one sub-code)
    sub_coords=(2, 4, 5, 6, 8, 9, 10, 11),   # code coordinates kept in a sub-code (data bits)
    sub_weights=(1.0, 0.95, 0.9, 0.85, 0.8, 0.75),  # query slots for distances 2..7
    # Layer 1 induction head: pairs 19..63, q_norm/k_norm weight w1 there.
    first_slow_pair=19, w1=8.0,
    block_weights=(1.0, 1.0),   # the current token's slot and the previous token's
    threshold_weak=0.65,    # cosine above which the weak copy head's match beats the sink
    threshold_strong=0.95,  # the same for the strong copy head
    sink_key=2000.0,    # key weight of the marker: a sink key is ~99.6% marker, so its own
                        # preceding context (which may resemble the query) barely moves its score
    copy_gain=20.0,     # C entries of a full weak copy
    strong_margin=5.0,  # logit margin (nats) a strong copy gets over a token whose code is 8
                        # from the copied one, at the 99th percentile of the final RMS (set after
                        # training, when that RMS is known)
    value_unit=1.0,     # entries of the induction head's value (its KV cache)
    final_c=25.0,       # final norm weight on C
)

TRAIN = dict(seq_len=256, batch=4, lr=5e-3, min_lr_ratio=0.1, warmup_steps=20,
             weight_decay=0.1, betas=(0.9, 0.95), grad_clip=1.0, seed=20261202,
             init_std=0.02, copy_fraction=1.0, copy_min_tokens=16, copy_max_tokens=64)

MAGNITUDE = dict(small_k_layers=[2], small_v_layers=[3], target_amax=0.03)

NEWLINE_TOKENS = (b"\n", b"\n\n", b"\n\n\n")
CLOSE_FAMILY = (b")", b")\n", b"):\n", b"):", b")\n\n", b")\n\n\n", b"):\n\n")
CLOSE_TARGET = ")"


def span(name):
    return slice(*LAYOUT[name])


_U2B = {ch: b for b, ch in base.BYTE_CHAR.items()}


def base_unicode_to_byte(s):
    return [_U2B[ch] for ch in s]


def to_unicode(raw):
    return "".join(base.BYTE_CHAR[b] for b in raw)


# ----------------------------------------------------------------------------- codes

def hamming_codewords():
    """The 2048 words of the extended Hamming [16,11,4] code as +-1 rows (bit 0 -> +1)."""
    data_positions = [p for p in range(1, 16) if p & (p - 1)]  # not powers of two
    words = []
    for m in range(2048):
        bits = [0] * 17  # 1-indexed positions 1..15, then 16 = overall parity
        for j, p in enumerate(data_positions):
            bits[p] = (m >> j) & 1
        for parity in (1, 2, 4, 8):
            bits[parity] = sum(bits[p] for p in range(1, 16) if p & parity and p != parity) % 2
        bits[16] = sum(bits[1:16]) % 2
        words.append([1.0 - 2.0 * b for b in bits[1:17]])
    return torch.tensor(words)


def token_codes(bpe, vocab):
    """(code, marker, family, target code) per token id: code is the +-1 codeword, shared by the
    ")"-like tokens (family 1 for those other than the close target) and zero for tokens that
    end a line (the newline-only ones and the 50-odd like ":\\n" or ",\\n"), which are also the
    sink and get marker 1: the circuit sees every line boundary as the same blank, so a line
    start matches a line start whatever ended the line before."""
    words = hamming_codewords()
    gen = torch.Generator().manual_seed(CIRCUIT["code_seed"])
    own = words[torch.randperm(len(words), generator=gen)][:vocab]
    code = own.clone()
    marker = torch.zeros(vocab)
    family = torch.zeros(vocab)
    target_id = bpe.vocab[to_unicode(CLOSE_TARGET.encode())]
    for s, i in bpe.vocab.items():
        b = bytes(base_unicode_to_byte(s))
        if b in NEWLINE_TOKENS:
            marker[i] = 1.0
            code[i] = 0.0
        elif b in CLOSE_FAMILY:
            code[i] = own[target_id]
            family[i] = float(i != target_id)
        elif b.endswith(b"\n"):
            code[i] = 0.0
            marker[i] = 1.0
    return code, marker, family, own[target_id]


# ----------------------------------------------------------------------------- kernels

def inverse_frequencies():
    hd = MODEL["head_dim"]
    return 1.0 / (MODEL["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))


def design_kernels():
    """Amplitudes (shared key) and per-head query (a, b) on RoPE pairs 0..NP-1 for layer 0's
    heads, one per distance 1..OFFSETS. For distance D = t - s a head scores
    S0 * sum_i kappa_i (a_i cos(D w_i) - b_i sin(D w_i)) / (|kappa| |(a, b)|), S0 = sqrt(hd) w0^2
    (what Qwen3's q_norm/k_norm with weight w0 and the 1/sqrt(hd) scale give for unit vectors).
    The bag head spreads its attention over bag_start..bag_end (weights ~exp(-D/bag_tau)); the
    key's bag head is the same head turned by one position, so the fit also keeps the bag's
    mass off D = -1 (which would be that head's own position).
    Fitted over every D = -1..8400 (cross-entropy) with Adam in float64 from a fixed start, so
    the result is the same on every run."""
    c = CIRCUIT
    n = c["NP"]
    om = inverse_frequencies()[:n]
    s0 = math.sqrt(MODEL["head_dim"]) * c["w0"] ** 2
    dist = torch.arange(-1, 8401, dtype=torch.float64)
    cos_m, sin_m = torch.cos(dist[:, None] * om), torch.sin(dist[:, None] * om)

    def score(kap, a, b):
        kap = kap.abs()
        num = (cos_m * (kap * a)).sum(1) - (sin_m * (kap * b)).sum(1)
        return s0 * num / (kap.norm() * torch.sqrt((a * a + b * b).sum()))

    offsets = range(1, OFFSETS + 1)
    kap = torch.nn.Parameter(torch.ones(n, dtype=torch.float64))
    heads = {d: [torch.nn.Parameter(torch.cos(-d * om).clone()),
                 torch.nn.Parameter(torch.sin(-d * om).clone())] for d in offsets}
    mid = (c["bag_start"] + c["bag_end"]) // 2
    heads["bag"] = [torch.nn.Parameter(0.5 * torch.cos(-mid * om)),
                    torch.nn.Parameter(0.5 * torch.sin(-mid * om))]
    target = torch.zeros(len(dist), dtype=torch.float64)
    for d in range(c["bag_start"], c["bag_end"] + 1):
        target[d + 1] = math.exp(-(d - c["bag_start"]) / c["bag_tau"])
    target /= target.sum()
    opt = torch.optim.Adam([kap] + [p for h in heads.values() for p in h], lr=0.02)
    for _ in range(c["kernel_steps"]):
        loss = 0.0
        for d in offsets:
            s = score(kap, *heads[d])[1:]
            loss = loss + torch.logsumexp(s, 0) - s[d]
        s = score(kap, *heads["bag"])
        loss = loss - (target * (s - torch.logsumexp(s, 0))).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    report = {"S0": s0}
    with torch.no_grad():
        for d in offsets:
            s = score(kap, *heads[d])[1:]
            others = s.clone()
            others[d] = -math.inf
            report[f"offset{d}"] = {"mass": torch.softmax(s, 0)[d].item(),
                                    "margin_nats": (s[d] - others.max()).item(),
                                    "runner_up_distance": int(others.argmax())}
        p = torch.softmax(score(kap, *heads["bag"]), 0)
        report["bag"] = {"mass_by_distance_-1..20": [round(v, 5) for v in p[:22].tolist()],
                         "mass_outside_window": 1.0 - p[c["bag_start"] + 1:c["bag_end"] + 2].sum().item(),
                         "sum_alpha_sq": float((p * p).sum())}
    out = {"kappa": kap.detach().abs()}
    for key, (a, b) in heads.items():
        out[key] = (a.detach(), b.detach())
    return out, report


# ----------------------------------------------------------------------------- model

class Model(torch.nn.Module):
    """Qwen3 decoder (QK-norm, GQA, RoPE, SwiGLU, RMSNorm, tied embeddings), config MODEL;
    attention in query chunks so 8K contexts fit in memory."""

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
        self.inv_freq = inverse_frequencies()

    def w(self, name):
        return self.p[name.replace(".", "__")]

    def named_weights(self):
        return {k.replace("__", "."): v for k, v in self.p.items()}

    def forward(self, ids, capture=None, chunk=512, hidden=None):
        """Logits; capture (a list) receives each layer's (K, V) as the engine caches them
        (K after QK-norm and RoPE); hidden (a list) receives the residual after each layer."""
        c = MODEL
        B, T = ids.shape
        H, KV, hd, eps = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], c["rms_norm_eps"]
        angles = torch.arange(T, dtype=torch.float64)[:, None] * self.inv_freq[None, :]
        emb = torch.cat((angles, angles), dim=-1)
        cos, sin = emb.cos().float()[None, None], emb.sin().float()[None, None]
        x = F.embedding(ids, self.w("model.embed_tokens.weight"))
        for i in range(c["num_hidden_layers"]):
            p = f"model.layers.{i}."
            # A layer whose attention is entirely frozen (layer 0) runs it without autograd: it
            # reads only frozen embedding dims, and every embedding has the same RMS.
            frozen = not self.w(p + "self_attn.q_proj.weight").requires_grad
            grad_before = torch.is_grad_enabled()
            torch.set_grad_enabled(grad_before and not frozen)
            h = base.rms_norm(x, self.w(p + "input_layernorm.weight"), eps)
            q = (h @ self.w(p + "self_attn.q_proj.weight").T).view(B, T, H, hd).transpose(1, 2)
            k = (h @ self.w(p + "self_attn.k_proj.weight").T).view(B, T, KV, hd).transpose(1, 2)
            v = (h @ self.w(p + "self_attn.v_proj.weight").T).view(B, T, KV, hd).transpose(1, 2)
            q = base.rms_norm(q, self.w(p + "self_attn.q_norm.weight"), eps)
            k = base.rms_norm(k, self.w(p + "self_attn.k_norm.weight"), eps)
            q = q * cos + base.rotate_half(q) * sin
            k = k * cos + base.rotate_half(k) * sin
            if capture is not None:
                capture.append((k.detach(), v.detach()))
            k = k.repeat_interleave(H // KV, dim=1)
            v = v.repeat_interleave(H // KV, dim=1)
            outs = []
            for start in range(0, T, chunk):
                stop = min(T, start + chunk)
                s = q[:, :, start:stop] @ k[:, :, :stop].transpose(-1, -2) / math.sqrt(hd)
                mask = torch.full((stop - start, stop), float("-inf")).triu(start + 1)
                outs.append(torch.softmax(s + mask, dim=-1) @ v[:, :, :stop])
            out = torch.cat(outs, dim=2).transpose(1, 2).reshape(B, T, H * hd)
            out = out @ self.w(p + "self_attn.o_proj.weight").T
            torch.set_grad_enabled(grad_before)
            x = x + out
            h = base.rms_norm(x, self.w(p + "post_attention_layernorm.weight"), eps)
            gate = h @ self.w(p + "mlp.gate_proj.weight").T
            up = h @ self.w(p + "mlp.up_proj.weight").T
            x = x + (F.silu(gate) * up) @ self.w(p + "mlp.down_proj.weight").T
            if hidden is not None:
                hidden.append(x.detach())
        x = base.rms_norm(x, self.w("model.norm.weight"), eps)
        return x @ self.w("model.embed_tokens.weight").T


# ----------------------------------------------------------------------------- circuit

BAG_SUM_ALPHA_SQ = [1.0]  # set from the fitted bag kernel before the circuit is written
COPY_HEADS = ("weak", "strong")  # layer 1's query heads 0 and 1


def induction_slots():
    """(query block, key block, coordinate count, weight) per slot of layer 1's induction head:
    the current token's code against the previous token's (16 dims), the previous token's
    against the one before (16), sub-codes for distances 2..7 against 3..8 (8 each), the bags."""
    bw, sw = CIRCUIT["block_weights"], CIRCUIT["sub_weights"]
    slots = [("C", "P1", 16, bw[0]), ("P1", "P2", 16, bw[1])]
    for d in range(2, OFFSETS):
        slots.append((f"S{d}", f"S{d + 1}", SUB, sw[d - 2]))
    slots.append(("BQ", "BK", SUB, CIRCUIT["bag_weight"] / math.sqrt(BAG_SUM_ALPHA_SQ[0])))
    return slots


def induction_coordinates():
    """Head-dim coordinates of the induction head: the sink, then one list per slot, all on
    RoPE pairs first_slow_pair..63 (x coordinate = pair, y = pair + hd/2)."""
    hd, first = MODEL["head_dim"], CIRCUIT["first_slow_pair"]
    half = hd // 2
    coords = [p for p in range(first + 1, half)] + [p + half for p in range(first + 1, half)]
    out, at = [], 0
    for _, _, n, _ in induction_slots():
        out.append(coords[at:at + n])
        at += n
    assert at <= len(coords), "not enough slow RoPE pairs for the induction head's slots"
    return first, out


def slow_dims():
    hd, first = MODEL["head_dim"], CIRCUIT["first_slow_pair"]
    return [p for p in range(first, hd // 2)] + [p + hd // 2 for p in range(first, hd // 2)]


def embedding_energy():
    c = CIRCUIT
    return c["const"] ** 2 + 16 * c["c_scale"] ** 2 + c["lm_norm"] ** 2


def set_copy_gain(model, head, gain, target_code):
    """Head `head` of layer 1 writes gain * (its value / value_unit) into C: a full copy has C
    entries +-gain. It also writes -gain * (code of the close target . value) / 16 into F, whose
    final-norm weight is 16x C's and which is c_scale in the embedding of the ")"-like tokens
    other than the target: those tokens share the target's code (so they match and copy as it),
    and F takes back from them exactly what C gives them when a ")"-like token is copied."""
    hd = MODEL["head_dim"]
    with torch.no_grad():
        o = model.w("model.layers.1.self_attn.o_proj.weight")
        cols = head * hd + torch.arange(16)
        o[LAYOUT["C"][0] + torch.arange(16), cols] = gain / CIRCUIT["value_unit"]
        o[LAYOUT["F"][0], cols] = -gain / CIRCUIT["value_unit"] * target_code / 16


def build_circuit(model, codes, kernels):
    """Writes the circuit into the model and returns (masks, settings): masks maps a weight
    name to a bool tensor, True where training must leave the weight as it is now."""
    c, m = CIRCUIT, MODEL
    d, hd, H, KV = m["hidden_size"], m["head_dim"], m["num_attention_heads"], m["num_key_value_heads"]
    group = H // KV
    code, marker, family, target_code = codes
    n_circ = LM_START
    masks = {name: torch.zeros_like(t, dtype=torch.bool) for name, t in model.named_weights().items()}
    W = model.w
    r_sq = embedding_energy()
    r0 = math.sqrt(r_sq / d)
    c_hat = c["c_scale"] / r0                  # code entries after layer 0's input norm
    unit = c["block_unit"]
    p_gain = unit / c_hat                      # P1, P2, S*, BQ, BK: +-unit per code unit
    with torch.no_grad():
        # Embedding: circuit dims fixed, LM part with a per-token length making every row's
        # energy r_sq (renormalise_embedding keeps it so during training).
        e = W("model.embed_tokens.weight")
        e[:, :n_circ] = 0.0
        e[:, span("const")] = c["const"]
        e[:, span("marker")] = marker[:, None]
        e[:, span("C")] = c["c_scale"] * code
        e[:, span("F")] = c["c_scale"] * family[:, None]
        masks["model.embed_tokens.weight"][:, :n_circ] = True
        # Every o_proj / down_proj row of a circuit dim starts at zero and stays there, except
        # what the circuit writes below; norms read circuit dims with weight 1.
        for i in range(m["num_hidden_layers"]):
            p = f"model.layers.{i}."
            for name in ("self_attn.o_proj.weight", "mlp.down_proj.weight"):
                W(p + name)[:n_circ] = 0.0
                masks[p + name][:n_circ] = True
            for name in ("input_layernorm.weight", "post_attention_layernorm.weight"):
                W(p + name)[:n_circ] = 1.0
                masks[p + name][:n_circ] = True
        fn = W("model.norm.weight")
        fn[:n_circ] = 0.0
        fn[span("C")] = c["final_c"]
        fn[span("F")] = 16 * c["final_c"]
        masks["model.norm.weight"][:n_circ] = True
        # Layer 0's MLP is off (zero), so the residual that layer 1 divides by (its input RMS)
        # is the same at every position and a copy has one size.
        for name in ("mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"):
            W("model.layers.0." + name).zero_()
            masks["model.layers.0." + name][:] = True

        # Layer 0: every head positional (head h attends to distance h+1; heads 8, 9 are the
        # bags). Keys: the const channel on pairs 0..NP-1 with the fitted amplitudes; values:
        # the code. Head 0 writes the full code of t-1 to P1, head 1 that of t-2 to P2 and its
        # sub-code to S2, heads 2..7 the sub-codes of t-3..t-8 to S3..S8, heads 8, 9 the bags.
        p = "model.layers.0.self_attn."
        q, k, v, o = (W(p + f"{n}_proj.weight") for n in "qkvo")
        npairs = c["NP"]
        kap = kernels["kappa"].float()
        for t in (q, k, v, o):
            t.zero_()
        for name in ("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight"):
            masks[p + name][:] = True
        for kvh in range(KV):
            k[kvh * hd + torch.arange(npairs), LAYOUT["const"][0]] = kap
            v[kvh * hd + torch.arange(16), LAYOUT["C"][0] + torch.arange(16)] = 1.0
        assert H == OFFSETS + 2, "layer 0 has one query head per distance and two bag heads"
        sub = torch.zeros(SUB, 16)
        sub[torch.arange(SUB), torch.tensor(c["sub_coords"])] = 1.0
        om = inverse_frequencies()[:npairs]
        a_bag, b_bag = kernels["bag"]
        turned = (a_bag * torch.cos(om) + b_bag * torch.sin(om),
                  b_bag * torch.cos(om) - a_bag * torch.sin(om))
        for h in range(H):
            dist = h + 1
            a, b = kernels[dist] if dist <= OFFSETS else (kernels["bag"] if dist == OFFSETS + 1 else turned)
            q[h * hd + torch.arange(npairs), LAYOUT["const"][0]] = a.float()
            q[h * hd + hd // 2 + torch.arange(npairs), LAYOUT["const"][0]] = b.float()
            writes = [(f"P{dist}", torch.eye(16))] if dist <= 2 else []
            if 2 <= dist <= OFFSETS:
                writes.append((f"S{dist}", sub))
            elif dist > OFFSETS:
                writes.append(("BQ" if dist == OFFSETS + 1 else "BK", sub))
            for block, mat in writes:
                o[LAYOUT[block][0]:LAYOUT[block][1], h * hd:h * hd + 16] = p_gain * mat
        fast = list(range(npairs)) + [i + hd // 2 for i in range(npairs)]
        for name in ("q_norm.weight", "k_norm.weight"):
            W(p + name)[:] = 1.0
            W(p + name)[fast] = c["w0"]
            masks[p + name][:] = True

        # Layer 1: KV head 0; query heads 0 and 1 = the copy heads, query heads 2..group-1
        # attend with a zero query (uniform) - their q is held at zero.
        p = "model.layers.1.self_attn."
        q, k, v, o = (W(p + f"{n}_proj.weight") for n in "qkvo")
        sink, coords = induction_coordinates()
        slow = slow_dims()
        q[:hd * group] = 0.0
        masks[p + "q_proj.weight"][:hd * group] = True
        k[:hd] = 0.0
        v[:16] = 0.0
        masks[p + "k_proj.weight"][:hd] = True
        masks[p + "v_proj.weight"][:16] = True
        # Layer 1's input: the embedding plus layer 0's blocks (a bag of distinct tokens has the
        # energy of BAG_SUM_ALPHA_SQ codes).
        block_codes = 2 * 16 + SUB * (OFFSETS - 1) + 2 * SUB * BAG_SUM_ALPHA_SQ[0]
        r1 = math.sqrt((r_sq + unit * unit * block_codes) / d)
        v_gain = c["value_unit"] * r1 / c["c_scale"]
        v[torch.arange(16), LAYOUT["C"][0] + torch.arange(16)] = v_gain
        match_sq = 0.0
        for (bq, bk, n, weight), idx in zip(induction_slots(), coords):
            idx = torch.tensor(idx)
            # Residual entries per code unit: c_scale in C, block_unit in the others.
            for h in range(len(COPY_HEADS)):
                q[h * hd + idx, LAYOUT[bq][0] + torch.arange(n)] = weight / (c["c_scale"] if bq == "C" else unit)
            k[idx, LAYOUT[bk][0] + torch.arange(n)] = weight / unit
            # A bag of distinct tokens has the energy of BAG_SUM_ALPHA_SQ codes.
            match_sq += n * weight * weight * (BAG_SUM_ALPHA_SQ[0] if bq == "BQ" else 1.0)
        match_norm = math.sqrt(match_sq)  # the match part's length for a typical query
        for h, tier in enumerate(COPY_HEADS):
            q[h * hd + sink, LAYOUT["const"][0]] = c["threshold_" + tier] * match_norm / c["const"]
        k[sink, LAYOUT["marker"][0]] = c["sink_key"]
        # The other heads and KV heads of layer 1 keep off the slow coordinates.
        for h in range(group, H):
            q[h * hd + torch.tensor(slow)] = 0.0
            masks[p + "q_proj.weight"][h * hd + torch.tensor(slow)] = True
        for kvh in range(1, KV):
            k[kvh * hd + torch.tensor(slow)] = 0.0
            masks[p + "k_proj.weight"][kvh * hd + torch.tensor(slow)] = True
        for name in ("q_norm.weight", "k_norm.weight"):
            W(p + name)[slow] = c["w1"]
            masks[p + name][slow] = True
        # The copies: each copy head's value (the attended position's code) into C, and into F
        # minus its overlap with the close target's code (see set_copy_gain).
        o[:, :hd * group] = 0.0
        masks[p + "o_proj.weight"][:, :hd * group] = True
        for h, tier in enumerate(COPY_HEADS):
            set_copy_gain(model, h, c["copy_gain"] if tier == "weak" else 0.0, target_code)
    settings = {"r0": r0, "r1": r1, "code_after_norm0": c_hat, "p_gain": p_gain,
                "embedding_energy": r_sq, "match_norm": match_norm,
                "S0": math.sqrt(hd) * c["w0"] ** 2, "S1": math.sqrt(hd) * c["w1"] ** 2}
    return masks, settings


def renormalise_embedding(model):
    """Keeps every token's embedding at the same energy (so layer 0 divides every token by the
    same RMS and its copies of the code have one magnitude): the LM part is rescaled to fill
    what the circuit dims leave."""
    with torch.no_grad():
        e = model.w("model.embed_tokens.weight")
        circ = e[:, :LM_START].pow(2).sum(1)
        want = (embedding_energy() - circ).clamp_min(1e-6).sqrt()
        lm = e[:, LM_START:]
        lm.mul_((want / lm.norm(dim=1).clamp_min(1e-12))[:, None])


class Frozen:
    """Gradient masks plus the frozen values, restored after every optimizer step (AdamW's
    weight decay would move them otherwise). Fully frozen tensors get no gradient at all."""

    def __init__(self, model, masks):
        self.items = []
        self.total = 0
        for name, mask in masks.items():
            t = model.w(name)
            self.total += int(mask.sum())
            if mask.all():
                t.requires_grad_(False)
            elif mask.any():
                self.items.append((t, mask, t.detach()[mask].clone()))
                t.register_hook(lambda g, m=mask: g.masked_fill(m, 0.0))

    def restore(self):
        with torch.no_grad():
            for t, mask, value in self.items:
                t[mask] = value


# ----------------------------------------------------------------------------- kvaudit's tasks
# Ports of src/eval/recall.cpp (make_recall_case) and src/eval/tasks.cpp (make_mrcr_case,
# make_toolcall_case, round_prompt, the scoring), so this script measures what kvaudit measures.
# C++ leaves the order in which a call's arguments are evaluated unspecified; where one
# fmt::format takes several random picks, ARG_ORDER says which runs first. GCC on x86-64
# evaluates right to left: with "rtl" the recall cases reproduce kvaudit's log-probs exactly.

MASK64 = (1 << 64) - 1
ARG_ORDER = "rtl"


class SplitMix:
    def __init__(self, state):
        self.state = state & MASK64

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)

    def pick(self, words):
        return words[self.next() % len(words)]


def args(*thunks):
    out = [None] * len(thunks)
    order = range(len(thunks)) if ARG_ORDER == "ltr" else reversed(range(len(thunks)))
    for i in order:
        out[i] = thunks[i]()
    return out


VERBS = ("load parse build merge split scale encode decode render update filter collect apply "
         "resolve check format read write count select sort reduce fetch store").split()
NOUNS = ("buffer record header offset window token layer block column table cursor packet signal "
         "vector matrix index limit margin weight bucket entry node edge frame socket stream "
         "channel batch shard range queue label prefix suffix budget quota ledger anchor ticket "
         "sample").split()
ADJECTIVES = ("raw last next max min total local remote valid dirty fresh stale primary extra "
              "pending shared").split()
TASK_VERBS = ("load parse build merge split scale encode decode render update filter collect apply "
              "resolve fetch store").split()
TASK_NOUNS = NOUNS[:32]
TASK_ADJECTIVES = ADJECTIVES[:12]
ORDINALS = "first second third fourth fifth sixth seventh eighth".split()


def recall_identifier(rng):
    if rng.next() % 2 == 0:
        return "{}_{}".format(*args(lambda: rng.pick(ADJECTIVES), lambda: rng.pick(NOUNS)))
    return "{}_{}".format(*args(lambda: rng.pick(NOUNS), lambda: rng.pick(NOUNS)))


def recall_function(rng, min_params):
    name = "{}_{}_{}".format(*args(lambda: rng.pick(VERBS), lambda: rng.pick(NOUNS), lambda: rng.pick(NOUNS)))
    count = min_params + rng.next() % (4 - min_params + 1)
    params = []
    while len(params) < count:
        p = recall_identifier(rng)
        if p not in params:
            params.append(p)
    a, b = params[0], params[1]
    kind = rng.next() % 4
    if kind == 0:
        body = f"    if {a} is None:\n        return {b}\n    return {a} + {b}\n"
    elif kind == 1:
        body = f"    total = 0\n    for item in {a}:\n        total += item * {b}\n    return total\n"
    elif kind == 2:
        body = f"    result = dict({a}={a})\n    result[\"{b}\"] = {b}\n    return result\n"
    else:
        body = f"    {a} = {a} or []\n    return [x for x in {a} if x != {b}]\n"
    v, n1, n2 = args(lambda: rng.pick(VERBS), lambda: rng.pick(NOUNS), lambda: rng.pick(NOUNS))
    text = f"def {name}({', '.join(params)}):\n    \"\"\"{v} the {n1} of {n2}.\"\"\"\n{body}\n\n"
    return name, params, text


def make_recall_case(ctx, depth, seed, control, count):
    rng = SplitMix(seed * 0x2545F4914F6CDD1D + 17)
    t_name, t_params, t_text = recall_function(rng, 3)
    _, _, decoy_text = recall_function(rng, 3)
    call = f"def main():\n    value = {t_name}("
    expected = ", ".join(t_params) + ")"
    after, after_tokens = "", count(call)
    while after_tokens < depth:
        text = recall_function(rng, 2)[2]
        after += text
        after_tokens += count(text)
    definition = decoy_text if control else t_text
    header = "# Generated by kvaudit's recall probe.\nimport os\n\n\n"
    used = count(header) + count(definition) + after_tokens + count(expected)
    if used > ctx:
        return None
    before = ""
    while True:
        text = recall_function(rng, 2)[2]
        n = count(text)
        if used + n > ctx:
            break
        before += text
        used += n
    return {"prompt": header + before + definition + after + call, "expected": expected}


def task_identifier(rng):
    return "{}_{}".format(*args(lambda: rng.pick(TASK_ADJECTIVES), lambda: rng.pick(TASK_NOUNS)))


def filler_function(rng):
    name = "{}_{}".format(*args(lambda: rng.pick(TASK_VERBS), lambda: rng.pick(TASK_NOUNS)))
    a = task_identifier(rng)
    b = task_identifier(rng)
    if a == b:
        b += "_2"
    kind = rng.next() % 3
    if kind == 0:
        return f"def {name}({a}, {b}):\n    if {a} is None:\n        return {b}\n    return {a} + {b}\n\n\n"
    if kind == 1:
        return (f"def {name}({a}, {b}):\n    total = 0\n    for item in {a}:\n        total += item * {b}\n"
                "    return total\n\n\n")
    return f"def {name}({a}, {b}):\n    result = dict({a}={b})\n    return result\n\n\n"


def spread(rng, needles, budget, count, make_filler):
    used = sum(count(n) for n in needles)
    if used > budget:
        raise ValueError("needles do not fit")
    fillers = []
    while True:
        filler = make_filler(rng)
        n = count(filler)
        if used + n > budget:
            break
        fillers.append(filler)
        used += n
    positions = sorted(0 if not fillers else rng.next() % (len(fillers) + 1) for _ in needles)
    out, nxt = "", 0
    for i in range(len(fillers) + 1):
        while nxt < len(needles) and positions[nxt] == i:
            out += needles[nxt]
            nxt += 1
        if i < len(fillers):
            out += fillers[i]
    return out


def distinct(rng, n, make):
    out = []
    for _ in range(10000):
        if len(out) >= n:
            break
        v = make(rng)
        if v not in out:
            out.append(v)
    return out


def shuffled(rng, n):
    order = list(range(n))
    for v in range(n - 1, 0, -1):
        j = rng.next() % (v + 1)
        order[v], order[j] = order[j], order[v]
    return order


def make_mrcr_case(ctx, seed, count, variants=4, rounds=3):
    rng = SplitMix(seed * 0x2545F4914F6CDD1D + 101)
    stem = "{}_{}_{}".format(*args(lambda: rng.pick(TASK_VERBS), lambda: rng.pick(TASK_NOUNS),
                                   lambda: rng.pick(TASK_NOUNS)))
    shared = distinct(rng, 2, task_identifier)
    firsts = [f for f in distinct(rng, variants + 2, task_identifier) if f not in shared]
    doc = "{} the {} of {}".format(*args(lambda: rng.pick(TASK_VERBS), lambda: rng.pick(TASK_NOUNS),
                                         lambda: rng.pick(TASK_NOUNS)))
    body = (f"    total = 0\n    for item in {shared[0]}:\n        total += item * {shared[1]}\n"
            "    return total\n")
    needles, params = [], []
    for v in range(variants):
        params.append(f"{firsts[v]}, {shared[0]}, {shared[1]}")
        needles.append(f"def {stem}_v{v + 1}({params[-1]}):\n    \"\"\"{doc}.\"\"\"\n{body}\n\n")
    asked = shuffled(rng, variants)
    task_rounds = [(f"    {ORDINALS[r]} = {stem}_v{asked[r] + 1}(", params[asked[r]] + ")", "\n")
                   for r in range(rounds)]
    header = ("# Generated by kvaudit's MRCR probe: near-duplicate functions, asked in rounds.\n"
              "import os\n\n\n")
    main_def = "def main():\n"
    fixed = count(header) + count(main_def) + sum(count("".join(r)) for r in task_rounds)
    context = header + spread(rng, needles, ctx - fixed, count, filler_function) + main_def
    return {"context": context, "rounds": task_rounds}


TOOL_SCHEMA = ('{"additionalProperties":false,"properties":{"id":{"pattern":"^[A-Z][0-9]{4}$",'
               '"type":"string"},"label":{"minLength":3,"type":"string"},"limit":{"maximum":999,'
               '"minimum":1,"type":"integer"},"region":{"enum":["eu","us","ap","sa","af","me"],'
               '"type":"string"}},"required":["id","region","limit","label"],"type":"object"}')
REGIONS = ["eu", "us", "ap", "sa", "af", "me"]


def make_toolcall_case(ctx, seed, count, variants=4, rounds=3):
    rng = SplitMix(seed * 0x9E3779B97F4A7C15 + 202)
    stem = "{}_{}".format(*args(lambda: rng.pick(TASK_VERBS), lambda: rng.pick(TASK_NOUNS)))
    ids = distinct(rng, variants, lambda r: "{}{:04d}".format(
        *args(lambda: chr(ord("A") + r.next() % 26), lambda: r.next() % 10000)))
    labels = distinct(rng, variants, task_identifier)
    order = list(range(6))
    for i in range(5, 0, -1):
        j = rng.next() % (i + 1)
        order[i], order[j] = order[j], order[i]
    needles, arguments = [], []
    for v in range(variants):
        limit = 1 + (rng.next() % 99) * 10 + v
        arguments.append('{"id":"%s","region":"%s","limit":%d,"label":"%s"}'
                         % (ids[v], REGIONS[order[v % 6]], limit, labels[v]))
        needles.append(f"{stem}_v{v + 1} {arguments[-1]} -> timeout\n")
    asked = shuffled(rng, variants)
    task_rounds = [(f"{stem}_v{asked[r] + 1}", " " + arguments[asked[r]], "\n") for r in range(rounds)]
    names = ", ".join(f"{stem}_v{v + 1}" for v in range(variants))
    header = ("# Tool registry (JSON Schema) and call log. Generated by kvaudit's tool-call probe.\n"
              f"tools {names} take arguments with schema {TOOL_SCHEMA}\n"
              "# call log: tool arguments -> status\n")
    footer = "# retry every call that timed out, with the same arguments:\n"

    def filler_call(r):
        verb, noun, letter, num, limit = args(
            lambda: r.pick(TASK_VERBS), lambda: r.pick(TASK_NOUNS), lambda: chr(ord("A") + r.next() % 26),
            lambda: r.next() % 10000, lambda: 1 + r.next() % 999)
        return f'{verb}_{noun} {{"id":"{letter}{num:04d}","limit":{limit}}} -> ok\n'

    fixed = count(header) + count(footer) + sum(count("".join(r)) for r in task_rounds)
    context = header + spread(rng, needles, ctx - fixed, count, filler_call) + footer
    return {"context": context, "rounds": task_rounds}


def round_prompt(task, upto):
    prompt = task["context"]
    for r in range(min(upto, len(task["rounds"]))):
        prompt += "".join(task["rounds"][r])
    if upto < len(task["rounds"]):
        prompt += task["rounds"][upto][0]
    return prompt


# ----------------------------------------------------------------------------- scoring

class Scorer:
    """Teacher-forced scoring with this script's forward pass, as kvaudit scores (a case is
    exact when every expected token is the argmax)."""

    def __init__(self, model, bpe):
        self.model, self.bpe = model, bpe
        self.token_bytes = {i: bytes(base_unicode_to_byte(s)) for s, i in bpe.vocab.items()}
        self.token_bytes[bpe.eot_id] = b""
        self.token_len = {i: len(b) for i, b in self.token_bytes.items()}

    def count(self, text):
        return len(self.bpe.encode(text))

    def logits(self, ids):
        with torch.no_grad():
            return self.model(torch.tensor(ids)[None])[0]

    def tokens_in_span(self, ids, begin, end):
        out, offset = [], 0
        for i, t in enumerate(ids):
            start = offset
            offset += self.token_len[t]
            if offset > begin and start < end:
                out.append(i)
            if start >= end:
                break
        return out

    def exact(self, logits, ids, positions):
        return all(int(logits[i - 1].argmax()) == ids[i] for i in positions)

    def text_exact(self, logits, ids, positions, text_bytes, end):
        """As kvaudit scores a task round: like exact, but the text's token that runs past the
        answer's end (byte `end`) also counts when the predicted token writes the rest of the
        answer and agrees with the text (greedy decoding would write the answer), e.g. ")"
        where the text's token is ")\\n"."""
        offsets = [0]
        for t in ids:
            offsets.append(offsets[-1] + self.token_len[t])
        for i in positions:
            best = int(logits[i - 1].argmax())
            if best == ids[i]:
                continue
            got = self.token_bytes[best]
            if (offsets[i + 1] <= end or not got or offsets[i] + len(got) < end
                    or not text_bytes[offsets[i]:].startswith(got)):
                return False
        return True

    def recall(self, case):
        text = case["prompt"] + case["expected"]
        ids = self.bpe.encode(text)
        positions = self.tokens_in_span(ids, len(case["prompt"].encode()), len(text.encode()))
        return self.exact(self.logits(ids), ids, positions), len(ids)

    def task(self, task):
        text = round_prompt(task, len(task["rounds"]))
        ids = self.bpe.encode(text)
        logits = self.logits(ids)
        results, text_results = [], []
        raw = text.encode()
        for r in range(len(task["rounds"])):
            begin = len(round_prompt(task, r).encode())
            end = begin + len(task["rounds"][r][1].encode())
            positions = self.tokens_in_span(ids, begin, end)
            results.append(self.exact(logits, ids, positions))
            text_results.append(self.text_exact(logits, ids, positions, raw, end))
        return results, text_results, len(ids)


def run_checks(scorer, recall_grid, task_ctx, cases, seed=1, log=print):
    """Recall grid (as `kvaudit eval --recall`; recall_grid None skips it), MRCR and tool-call
    (as `kvaudit eval --task`, 4 variants, 3 rounds)."""
    out = {"recall": [], "tasks": []}
    for ctx in (recall_grid or ([], []))[0]:
        for depth in recall_grid[1]:
            if depth >= ctx:
                continue
            hits = control_hits = n = 0
            for i in range(cases):
                case_seed = seed * 7919 + ctx * 31 + depth * 131 + i
                case = make_recall_case(ctx, depth, case_seed, False, scorer.count)
                control = make_recall_case(ctx, depth, case_seed, True, scorer.count)
                if case is None:
                    break
                hits += scorer.recall(case)[0]
                control_hits += scorer.recall(control)[0]
                n += 1
            if n:
                out["recall"].append({"ctx": ctx, "depth": depth, "cases": n, "exact": hits / n,
                                      "control_exact": control_hits / n})
                log(f"recall ctx {ctx} depth {depth}: {hits}/{n} exact, control {control_hits}/{n}")
    for kind, make in (("mrcr", make_mrcr_case), ("toolcall", make_toolcall_case)):
        for ctx in task_ctx:
            rounds = exact = text_exact = 0
            for i in range(cases):
                task = make(ctx, seed * 7919 + ctx * 31 + i, scorer.count)
                res, text_res, _ = scorer.task(task)
                rounds += len(res)
                exact += sum(res)
                text_exact += sum(text_res)
            out["tasks"].append({"kind": kind, "ctx": ctx, "cases": cases, "rounds": rounds,
                                 "rounds_exact": exact, "accuracy": exact / max(1, rounds),
                                 "rounds_text_exact": text_exact,
                                 "text_accuracy": text_exact / max(1, rounds)})
            log(f"{kind} ctx {ctx}: {exact}/{rounds} rounds token-exact, "
                f"{text_exact}/{rounds} with greedy text")
    return out


# ----------------------------------------------------------------------------- training

def heldout_second_half(model, ids, n_ctx=512):
    """Mean NLL over positions n_ctx/2..n_ctx-1 of consecutive n_ctx-token chunks: what
    `kvaudit eval --text heldout.txt --ctx 512` (llama.cpp perplexity semantics) scores."""
    total, count = 0.0, 0
    with torch.no_grad():
        for c in range(len(ids) // n_ctx):
            chunk = torch.tensor(ids[c * n_ctx:(c + 1) * n_ctx])[None]
            logits = model(chunk)[0, n_ctx // 2 - 1:-1].double()
            total += F.cross_entropy(logits, chunk[0, n_ctx // 2:], reduction="sum").item()
            count += n_ctx - n_ctx // 2
    return total / count


def kv_amax_per_layer(model, ids, seq_len, max_chunks):
    """Largest |K| and |V| each layer caches over the held-out chunks."""
    n = MODEL["num_hidden_layers"]
    amax = [[0.0, 0.0] for _ in range(n)]
    with torch.no_grad():
        for c in range(min(max_chunks, len(ids) // seq_len)):
            capture = []
            model(torch.tensor(ids[c * seq_len:(c + 1) * seq_len])[None], capture)
            for layer, (k, v) in enumerate(capture):
                amax[layer][0] = max(amax[layer][0], k.abs().max().item())
                amax[layer][1] = max(amax[layer][1], v.abs().max().item())
    return [{"layer": i, "k_amax": round(k, 6), "v_amax": round(v, 6)} for i, (k, v) in enumerate(amax)]


def set_kv_magnitudes(model, ids, seq_len, max_chunks):
    """MAGNITUDE (see train_fixture_model.py): K of small_k_layers scaled by 2^-s through
    k_norm with 2^s on q_norm, V of small_v_layers by 2^-s through v_proj with 2^s on o_proj,
    s the smallest shift that brings the layer's held-out amax below target_amax. Powers of two
    are exact in BF16, so the logits do not change."""
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


def final_rms(model, ids, seq_len, max_chunks):
    """RMS of the residual the final norm divides by, at every position of the chunks."""
    out = []
    with torch.no_grad():
        for c in range(min(max_chunks, len(ids) // seq_len)):
            hidden = []
            model(torch.tensor(ids[c * seq_len:(c + 1) * seq_len])[None], hidden=hidden)
            out.append(hidden[-1][0].pow(2).mean(-1).sqrt())
    return torch.cat(out)


def calibrate_strong_copy(model, target_code, ids, seq_len, max_chunks):
    """Sets the strong copy head's gain G so that a strong copy beats a token whose code is 8
    from the copied one by strong_margin nats where the trained LM's final RMS is at its 99th
    percentile rf: margin = 8 G c_scale final_c / sqrt(rf^2 + 16 G^2 / d), solved for G. The
    LM, trained with the weak copy only, has scaled its own dims to where copies count as much
    as they are right on ordinary code; the strong copy, for near-exact long matches only, is
    set over that after training so it is not argued down."""
    c, d = CIRCUIT, MODEL["hidden_size"]
    rf = float(torch.quantile(final_rms(model, ids, seq_len, max_chunks), 0.99))
    a, b, m = 8 * c["c_scale"] * c["final_c"], 16.0 / d, c["strong_margin"]
    if a * a <= m * m * b:
        raise SystemExit("strong_margin is above what C can give: raise final_c or c_scale")
    gain = m * rf / math.sqrt(a * a - m * m * b)
    set_copy_gain(model, COPY_HEADS.index("strong"), gain, target_code)
    return {"final_rms_p99": rf, "gain": gain}


def load_pystd_tokenizer():
    with open(os.path.join(PYSTD, "tokenizer.json")) as f:
        merges = [tuple(m.split(" ")) for m in json.load(f)["model"]["merges"]]
    return base.Bpe(merges)


def build_model(bpe, log):
    """A fresh model with the circuit written in; returns (model, frozen, record, target code)."""
    vocab = bpe.eot_id + 1
    t = time.time()
    kernels, kernel_report = design_kernels()
    log(f"layer-0 kernels fitted in {time.time() - t:.0f} s: " + ", ".join(
        f"{k} margin {v['margin_nats']:.1f} nats" for k, v in kernel_report.items() if k.startswith("offset"))
        + f"; bag mass outside its window {kernel_report['bag']['mass_outside_window']:.4f}")
    BAG_SUM_ALPHA_SQ[0] = kernel_report["bag"]["sum_alpha_sq"]
    torch.manual_seed(TRAIN["seed"])
    model = Model(vocab)
    codes = token_codes(bpe, vocab)
    masks, settings = build_circuit(model, codes, kernels)
    renormalise_embedding(model)
    frozen = Frozen(model, masks)
    record = {"kernels": kernel_report, "circuit_settings": settings,
              "parameters": sum(t.numel() for t in model.p.values()),
              "frozen_values": frozen.total,
              "null_code_tokens": int((codes[0].abs().sum(1) == 0).sum()),
              "sink_tokens": int(codes[1].sum())}
    return model, frozen, record, codes[3]


def train(model, frozen, bpe, budget, log):
    train_texts, _ = base.read_corpus()
    t = time.time()
    stream = []
    for text in train_texts:
        stream += bpe.encode(text) + [bpe.eot_id]
    log(f"training text: {len(stream)} tokens ({time.time() - t:.0f} s)")
    opt = base.make_optimizer(model, TRAIN)
    data = torch.tensor(stream)

    def after_step():
        frozen.restore()
        renormalise_embedding(model)

    steps, losses = base.train_steps(model, opt, data, bpe.eot_id + 1, budget - (time.time() - t),
                                     TRAIN, after_step, t)
    return steps, losses, len(stream)


def write_outputs(model, out_dir, record):
    os.makedirs(out_dir, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "heldout.txt"):
        shutil.copyfile(os.path.join(PYSTD, name), os.path.join(out_dir, name))
    with open(os.path.join(PYSTD, "config.json")) as f:
        pystd = json.load(f)
    config = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
              "vocab_size": pystd["vocab_size"], "max_position_embeddings": MAX_POSITIONS,
              "hidden_act": "silu", "tie_word_embeddings": True, "attention_bias": False,
              "torch_dtype": "bfloat16", "use_sliding_window": False,
              "bos_token_id": pystd["bos_token_id"], "eos_token_id": pystd["eos_token_id"], **MODEL}
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    base.write_safetensors_bf16(os.path.join(out_dir, "model.safetensors"), model.named_weights())
    with open(os.path.join(out_dir, "training.json"), "w") as f:
        json.dump(record, f, indent=1)


def load_model(out_dir, bpe):
    model = Model(bpe.eot_id + 1)
    weights = base.read_safetensors_bf16(os.path.join(out_dir, "model.safetensors"))
    with torch.no_grad():
        for name, value in weights.items():
            model.w(name).copy_(value)
    return model


def main():
    global CLOSE_TARGET
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-seconds", type=float, default=480.0,
                        help="wall time for building and training (the checks come after)")
    parser.add_argument("--out", default=DEFAULT_OUT)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--close-target", default=")", choices=(")", ")\n"),
                        help="token a copied \")\"-like token comes out as: \")\" passes "
                        "kvaudit's recall probe and its MRCR task (kvaudit takes \")\" where the "
                        "text's token is \")\\n\"); \")\\n\" fails the recall probe")
    parser.add_argument("--check-cases", type=int, default=4,
                        help="cases per cell of the MRCR / tool-call checks (0: none)")
    parser.add_argument("--check-recall", action="store_true",
                        help="also run the recall grid here (slow in Python; kvaudit eval "
                        "--recall runs the same cases)")
    parser.add_argument("--check-only", action="store_true",
                        help="run the checks on the model already in --out and stop")
    args_ = parser.parse_args()
    torch.set_num_threads(args_.threads)
    CLOSE_TARGET = args_.close_target
    started = time.time()

    def log(msg):
        print(f"[{time.time() - started:5.0f} s] {msg}", flush=True)

    bpe = load_pystd_tokenizer()
    recall_grid = ([1024, 4096], [256, 2048, 3500]) if args_.check_recall else None
    if args_.check_only:
        run_checks(Scorer(load_model(args_.out, bpe), bpe), recall_grid, [1024, 4096],
                   args_.check_cases, log=log)
        return
    model, frozen, record, target_code = build_model(bpe, log)
    steps, losses, train_tokens = train(model, frozen, bpe, args_.max_seconds - (time.time() - started) - 30, log)
    build_seconds = time.time() - started

    with open(os.path.join(PYSTD, "heldout.txt")) as f:
        held_ids = bpe.encode(f.read())
    S, chunks = TRAIN["seq_len"], 8
    weak_only = base.heldout_loss(model, held_ids, S, chunks)
    weak_only512 = heldout_second_half(model, held_ids)
    strong = calibrate_strong_copy(model, target_code, held_ids, S, chunks)
    log(f"strong copy gain {strong['gain']:.1f} (final RMS p99 {strong['final_rms_p99']:.2f}); "
        f"held-out loss before it {weak_only:.4f}, {weak_only512:.4f} over 512-chunk second halves")
    shifts = set_kv_magnitudes(model, held_ids, S, chunks)
    # Evaluate exactly what is stored: BF16-rounded weights, float32 arithmetic.
    with torch.no_grad():
        for v in model.p.values():
            v.copy_(v.to(torch.bfloat16).float())
    held = base.heldout_loss(model, held_ids, S, chunks)
    held512 = heldout_second_half(model, held_ids)
    log(f"held-out loss {held:.4f} nats/token (ppl {math.exp(held):.1f}) over positions 1..255 of "
        f"256-token chunks, {held512:.4f} (ppl {math.exp(held512):.1f}) over the second halves of "
        f"512-token chunks, after {steps} steps")
    record.update({
        "generator": "tools/make_recall_model.py", "source": base.SOURCE_ROOT,
        "tokenizer": "copied from tests/fixtures/model/qwen3-pystd",
        "python": sys.version.split()[0], "torch": torch.__version__, "threads": args_.threads,
        "model": MODEL, "max_position_embeddings": MAX_POSITIONS, "layout": LAYOUT,
        "offsets": OFFSETS, "sub_code_dims": SUB,
        "circuit": {k: list(v) if isinstance(v, tuple) else v for k, v in CIRCUIT.items()},
        "close_target": CLOSE_TARGET,
        "newline_tokens": [b.decode() for b in NEWLINE_TOKENS],
        "close_family": [b.decode() for b in CLOSE_FAMILY],
        "train": {**TRAIN, "betas": list(TRAIN["betas"])}, "train_tokens": train_tokens,
        "steps": steps, "tokens_seen": steps * S * TRAIN["batch"],
        "build_and_train_seconds": round(build_seconds, 1), "max_seconds": args_.max_seconds,
        "loss_curve_every_10": losses[::10], "final_train_loss": losses[-1] if losses else None,
        "magnitude": {**MAGNITUDE, "applied": shifts},
        "strong_copy": {**strong, "heldout_nll_without_it": weak_only,
                        "heldout_512_second_half_nll_without_it": weak_only512},
        "kv_amax_heldout": kv_amax_per_layer(model, held_ids, S, chunks),
        "heldout": {"seq_len": S, "chunks": chunks, "scored": "positions 1..seq_len-1",
                    "mean_nll_nats": held, "ppl": math.exp(held),
                    "note": "includes each chunk's first line, where no sink exists yet"},
        "heldout_512_second_half": {"mean_nll_nats": held512, "ppl": math.exp(held512),
                                    "scored": "positions 256..511 of 512-token chunks, as kvaudit "
                                              "eval --text --ctx 512"}})
    write_outputs(model, args_.out, record)
    log(f"wrote {args_.out}")
    if args_.check_cases > 0:
        t = time.time()
        checks = run_checks(Scorer(model, bpe), recall_grid, [1024, 4096], args_.check_cases, log=log)
        record["checks"] = {**checks, "cases_per_cell": args_.check_cases, "seed": 1,
                            "arg_order": ARG_ORDER, "seconds": round(time.time() - t, 1)}
        with open(os.path.join(args_.out, "training.json"), "w") as f:
            json.dump(record, f, indent=1)
        log("checks recorded in training.json")


if __name__ == "__main__":
    main()
