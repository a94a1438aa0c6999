#!/usr/bin/python3
"""Trains the small Qwen3.5-pattern hybrid fixture that kvaudit's hybrid eval tests measure.

What it makes (tests/fixtures/model/qwen35-pystd/):
  config.json, model.safetensors (BF16, tied embeddings), tokenizer.json,
  tokenizer_config.json, heldout.txt (the same tokenizer and held-out text as
  tests/fixtures/model/qwen3-pystd, made by tools/train_fixture_model.py), training.json.

Architecture: Qwen3_5ForCausalLM text model, 4 layers in Qwen3.5's pattern (three Gated
DeltaNet layers, then full attention), zero-centred RMSNorms, gated attention, partial
rotary 0.25; written from the published architecture (see tools/torch_reference_hybrid.py),
trained in float32 with the recurrence computed token by token.

The recall circuit. As in train_fixture_model.py, long-range copying needs an induction
circuit, which random initialisation on a CPU budget never finds, so it is seeded and its
attention pattern kept fixed; here its first half is a Gated DeltaNet head, its second the
full-attention layer:
  residual dim 0 constant, dims 74..83 a fixed random +-code per token, token embedding in
    dims 1..63, dims 64..73 reserved for the previous token's code;
  layer 0 (Gated DeltaNet), value head 0: the convolution passes the code dims of the
    previous token (tap t-1) into v and the constant into q and k (tap t); beta ~ 1 and
    decay ~ 0, so the state holds only the last write and o_t = v_t / sqrt(d_k): the
    previous token's code, which the gated norm and out_proj write into dims 64..73;
  layer 3 (full attention), head 0: q reads the current code, k the previous code, on
    unrotated dims (partial rotary leaves them position-free), so it attends to the
    position after an earlier occurrence of the current token and copies its token dims;
    its output gate is held open.
Afterwards layer 3's V is scaled by 2^-s (o_proj by 2^s, exact in BF16) so its amax sits
where FP8 at scale 1.0 loses precision, as in real checkpoints with small V.

Usage: /usr/bin/python3 tools/train_hybrid_fixture.py [--max-seconds 540] [--out DIR]
"""
import argparse
import json
import math
import os
import shutil
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_fixture_model import (Bpe, heldout_loss, make_optimizer,  # noqa: E402
                                 orthonormal_rows, read_corpus, restore_frozen, rotate_half,
                                 train_steps, write_safetensors_bf16)

HERE = os.path.dirname(os.path.abspath(__file__))
TOKENIZER_FROM = os.path.join(HERE, "..", "tests", "fixtures", "model", "qwen3-pystd")

MODEL = dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4,
             num_attention_heads=4, num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-6,
             full_attention_interval=4, attn_output_gate=True,
             linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32,
             linear_value_head_dim=32, linear_conv_kernel_dim=4)
ROPE = dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.25)
TRAIN = dict(seq_len=256, batch=4, lr=5e-3, min_lr_ratio=0.1, warmup_steps=20,
             weight_decay=0.1, betas=(0.9, 0.95), grad_clip=1.0, seed=20261201,
             init_std=0.02, copy_fraction=1.0, copy_min_tokens=16, copy_max_tokens=64)
SEED_CIRCUIT = dict(const=0.05, embed_gain=5.0, code_scale=0.1, qk_gain=10.0, v_gain=0.1,
                    open_gate=50.0, z_gain=2.0, dt_bias=5.0, a_log=math.log(50.0), prev_gain=0.05,
                    copy_gain=1.0, match_norm=3.0, final_norm=2.0, seed=5)
MAGNITUDE = dict(small_v_layers=[3], target_amax=0.03)
TOKEN, PREV, CODE = slice(1, 64), slice(64, 74), slice(74, 84)


def layer_types():
    n, every = MODEL["num_hidden_layers"], MODEL["full_attention_interval"]
    return ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(n)]


def zc_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + w)


class Hybrid(torch.nn.Module):
    def __init__(self, vocab):
        super().__init__()
        c = MODEL
        d, inter = c["hidden_size"], c["intermediate_size"]
        H, KV, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        Hk, Hv = c["linear_num_key_heads"], c["linear_num_value_heads"]
        dk, dv, K = c["linear_key_head_dim"], c["linear_value_head_dim"], c["linear_conv_kernel_dim"]
        self.p = torch.nn.ParameterDict()
        std = TRAIN["init_std"]
        out_std = std / math.sqrt(2 * c["num_hidden_layers"])

        def param(name, *shape, scale=std, fill=None):
            t = torch.full(shape, float(fill)) if fill is not None else torch.randn(*shape) * scale
            self.p[name.replace(".", "__")] = torch.nn.Parameter(t)

        param("model.embed_tokens.weight", vocab, d)
        param("model.norm.weight", d, fill=0.0)
        for i, kind in enumerate(layer_types()):
            p = f"model.layers.{i}."
            param(p + "input_layernorm.weight", d, fill=0.0)
            param(p + "post_attention_layernorm.weight", d, fill=0.0)
            if kind == "full_attention":
                param(p + "self_attn.q_proj.weight", 2 * H * hd, d)
                param(p + "self_attn.k_proj.weight", KV * hd, d)
                param(p + "self_attn.v_proj.weight", KV * hd, d)
                param(p + "self_attn.o_proj.weight", d, H * hd, scale=out_std)
                param(p + "self_attn.q_norm.weight", hd, fill=0.0)
                param(p + "self_attn.k_norm.weight", hd, fill=0.0)
            else:
                l = p + "linear_attn."
                conv = 2 * Hk * dk + Hv * dv
                param(l + "in_proj_qkv.weight", conv, d)
                param(l + "in_proj_z.weight", Hv * dv, d)
                param(l + "in_proj_b.weight", Hv, d)
                param(l + "in_proj_a.weight", Hv, d)
                param(l + "conv1d.weight", conv, 1, K, scale=1.0 / math.sqrt(K))
                param(l + "dt_bias", Hv, fill=1.0)
                self.p[(l + "A_log").replace(".", "__")] = torch.nn.Parameter(
                    torch.log(torch.empty(Hv).uniform_(1.0, 16.0)))
                param(l + "norm.weight", dv, fill=1.0)
                param(l + "out_proj.weight", d, Hv * dv, scale=out_std)
            param(p + "mlp.gate_proj.weight", inter, d)
            param(p + "mlp.up_proj.weight", inter, d)
            param(p + "mlp.down_proj.weight", d, inter, scale=out_std)
        rot = int(hd * ROPE["partial_rotary_factor"])
        self.rot = rot
        self.inv_freq = 1.0 / (ROPE["rope_theta"] ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot))

    def w(self, name):
        return self.p[name.replace(".", "__")]

    def named_weights(self):
        return {k.replace("__", "."): v for k, v in self.p.items()}

    def attention(self, p, h, capture):
        c = MODEL
        B, T, _ = h.shape
        H, KV, hd, eps = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], c["rms_norm_eps"]
        qg = (h @ self.w(p + "self_attn.q_proj.weight").T).view(B, T, H, 2 * hd)
        q, gate = qg[..., :hd].transpose(1, 2), qg[..., hd:].reshape(B, T, H * hd)
        k = (h @ self.w(p + "self_attn.k_proj.weight").T).view(B, T, KV, hd).transpose(1, 2)
        v = (h @ self.w(p + "self_attn.v_proj.weight").T).view(B, T, KV, hd).transpose(1, 2)
        q = zc_norm(q, self.w(p + "self_attn.q_norm.weight"), eps)
        k = zc_norm(k, self.w(p + "self_attn.k_norm.weight"), eps)
        angles = torch.arange(T, dtype=torch.float64)[:, None] * self.inv_freq[None, :]
        emb = torch.cat((angles, angles), dim=-1)
        cos, sin = emb.cos().float()[None, None], emb.sin().float()[None, None]
        r = self.rot
        q = torch.cat((q[..., :r] * cos + rotate_half(q[..., :r]) * sin, q[..., r:]), dim=-1)
        k = torch.cat((k[..., :r] * cos + rotate_half(k[..., :r]) * sin, k[..., r:]), dim=-1)
        if capture is not None:
            capture.append((k.detach(), v.detach()))
        k = k.repeat_interleave(H // KV, dim=1)
        v = v.repeat_interleave(H // KV, dim=1)
        mask = torch.full((T, T), float("-inf")).triu(1)
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd) + mask, dim=-1)
        out = (att @ v).transpose(1, 2).reshape(B, T, H * hd) * torch.sigmoid(gate)
        return out @ self.w(p + "self_attn.o_proj.weight").T

    def delta_net(self, p, h):
        c = MODEL
        B, T, _ = h.shape
        Hk, Hv = c["linear_num_key_heads"], c["linear_num_value_heads"]
        dk, dv, K = c["linear_key_head_dim"], c["linear_value_head_dim"], c["linear_conv_kernel_dim"]
        l = p + "linear_attn."
        mixed = h @ self.w(l + "in_proj_qkv.weight").T                       # [B, T, C]
        taps = self.w(l + "conv1d.weight")                                    # [C, 1, K]
        conv = F.conv1d(F.pad(mixed.transpose(1, 2), (K - 1, 0)), taps, groups=taps.shape[0])
        conv = F.silu(conv).transpose(1, 2)                                   # [B, T, C]
        q = conv[..., :Hk * dk].view(B, T, Hk, dk)
        k = conv[..., Hk * dk:2 * Hk * dk].view(B, T, Hk, dk)
        v = conv[..., 2 * Hk * dk:].view(B, T, Hv, dv)
        q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6) / math.sqrt(dk)
        k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
        q = q.repeat_interleave(Hv // Hk, dim=2)
        k = k.repeat_interleave(Hv // Hk, dim=2)
        beta = torch.sigmoid(h @ self.w(l + "in_proj_b.weight").T)           # [B, T, Hv]
        g = -torch.exp(self.w(l + "A_log")) * F.softplus(
            h @ self.w(l + "in_proj_a.weight").T + self.w(l + "dt_bias"))
        decay = torch.exp(g)
        S = torch.zeros(B, Hv, dk, dv)
        outs = []
        for t in range(T):
            S = S * decay[:, t, :, None, None]
            kt = k[:, t]
            mem = torch.einsum("bhkv,bhk->bhv", S, kt)
            delta = (v[:, t] - mem) * beta[:, t, :, None]
            S = S + kt[..., None] * delta[:, :, None, :]
            outs.append(torch.einsum("bhkv,bhk->bhv", S, q[:, t]))
        o = torch.stack(outs, dim=1)                                          # [B, T, Hv, dv]
        z = (h @ self.w(l + "in_proj_z.weight").T).view(B, T, Hv, dv)
        o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + c["rms_norm_eps"])
        o = o * self.w(l + "norm.weight") * F.silu(z)
        return o.reshape(B, T, Hv * dv) @ self.w(l + "out_proj.weight").T

    def forward(self, ids, capture=None):
        eps = MODEL["rms_norm_eps"]
        x = F.embedding(ids, self.w("model.embed_tokens.weight"))
        for i, kind in enumerate(layer_types()):
            p = f"model.layers.{i}."
            h = zc_norm(x, self.w(p + "input_layernorm.weight"), eps)
            x = x + (self.attention(p, h, capture) if kind == "full_attention"
                     else self.delta_net(p, h))
            h = zc_norm(x, self.w(p + "post_attention_layernorm.weight"), eps)
            up = h @ self.w(p + "mlp.up_proj.weight").T
            x = x + (F.silu(h @ self.w(p + "mlp.gate_proj.weight").T) * up) @ \
                self.w(p + "mlp.down_proj.weight").T
        x = zc_norm(x, self.w("model.norm.weight"), eps)
        return x @ self.w("model.embed_tokens.weight").T


def seed_circuit(model):
    """Writes the circuit (module docstring) into fresh weights; returns what stays fixed."""
    c, m = SEED_CIRCUIT, MODEL
    gen = torch.Generator().manual_seed(c["seed"])
    hd, dk, dv = m["head_dim"], m["linear_key_head_dim"], m["linear_value_head_dim"]
    key_width = m["linear_num_key_heads"] * dk
    code_dims = CODE.stop - CODE.start
    K = m["linear_conv_kernel_dim"]
    q_row, k_row, v0 = 0, key_width, 2 * key_width  # key head 0's q and k, value head 0's v
    frozen = []

    def freeze(name, *index):
        frozen.append((name, index))

    with torch.no_grad():
        embed = model.w("model.embed_tokens.weight")
        embed[:, 64:] = 0.0
        embed[:, TOKEN] *= c["embed_gain"]
        embed[:, 0] = c["const"]
        signs = torch.randint(0, 2, (embed.shape[0], code_dims), generator=gen) * 2 - 1
        embed[:, CODE] = c["code_scale"] * signs.float()
        freeze("model.embed_tokens.weight", slice(None), slice(0, 1))
        freeze("model.embed_tokens.weight", slice(None), slice(64, 84))
        # Nothing before layer 3 writes the reserved dims (but layer 0's head 0, below).
        for layer in range(3):
            p = f"model.layers.{layer}."
            for name in ("linear_attn.out_proj.weight", "mlp.down_proj.weight"):
                model.w(p + name)[64:84] = 0.0
                freeze(p + name, slice(64, 84))
        # Layer 0, Gated DeltaNet value head 0: the previous token's code.
        l = "model.layers.0.linear_attn."
        qkv, taps = model.w(l + "in_proj_qkv.weight"), model.w(l + "conv1d.weight")
        for rows in (slice(q_row, q_row + dk), slice(k_row, k_row + dk), slice(v0, v0 + dv)):
            qkv[rows] = 0.0
            taps[rows] = 0.0
            freeze(l + "in_proj_qkv.weight", rows)
            freeze(l + "conv1d.weight", rows)
        qkv[q_row, 0] = qkv[k_row, 0] = c["qk_gain"]
        taps[q_row, 0, K - 1] = taps[k_row, 0, K - 1] = 1.0      # the current position
        for i in range(code_dims):
            qkv[v0 + i, CODE.start + i] = c["v_gain"]
            taps[v0 + i, 0, K - 2] = 1.0                            # the previous position
        # beta = sigmoid(large) ~ 1; decay input 0 (dt_bias and A_log make the decay ~ 0);
        # the output gate z reads the constant: SiLU(z) ~ 1.
        for name, rows, weight in (("in_proj_b.weight", slice(0, 1), c["open_gate"]),
                                   ("in_proj_a.weight", slice(0, 1), 0.0),
                                   ("in_proj_z.weight", slice(0, dv), c["z_gain"])):
            model.w(l + name)[rows] = 0.0
            model.w(l + name)[rows, 0] = weight
            freeze(l + name, rows)
        model.w(l + "dt_bias")[0] = c["dt_bias"]
        model.w(l + "A_log")[0] = c["a_log"]
        model.w(l + "norm.weight").fill_(1.0)
        freeze(l + "dt_bias", slice(0, 1))
        freeze(l + "A_log", slice(0, 1))
        freeze(l + "norm.weight", slice(None))
        out = model.w(l + "out_proj.weight")
        out[:, 0:dv] = 0.0
        out[64:84] = 0.0
        out[PREV, 0:code_dims] = c["prev_gain"] * torch.eye(code_dims)
        freeze(l + "out_proj.weight", slice(None), slice(0, dv))
        freeze("model.layers.0.input_layernorm.weight", slice(None))
        # Layer 3, full attention head 0 (KV head 0): match current code against previous
        # code on unrotated dims, copy the token dims, gate open.
        p = "model.layers.3.self_attn."
        q, k, v, o = (model.w(p + f"{n}_proj.weight") for n in "qkvo")
        q[:2 * hd] = 0.0
        k[:hd] = 0.0
        v[:hd] = 0.0
        o[:, :hd] = 0.0
        first = model.rot  # the first unrotated dim
        for i in range(code_dims):
            q[first + i, CODE.start + i] = 1.0
            k[first + i, PREV.start + i] = 1.0
        q[hd:2 * hd, 0] = c["open_gate"]
        copy = orthonormal_rows(hd, TOKEN.stop - TOKEN.start, gen)
        v[:hd, TOKEN] = copy
        o[TOKEN, :hd] = c["copy_gain"] * copy.T
        model.w(p + "q_norm.weight").fill_(c["match_norm"] - 1.0)
        model.w(p + "k_norm.weight").fill_(c["match_norm"] - 1.0)
        model.w("model.norm.weight").fill_(c["final_norm"] - 1.0)
        freeze(p + "q_proj.weight", slice(0, 2 * hd))
        freeze(p + "k_proj.weight", slice(0, hd))
        freeze(p + "q_norm.weight", slice(None))
        freeze(p + "k_norm.weight", slice(None))
        freeze("model.layers.3.input_layernorm.weight", slice(None))
    return [(model.w(n), i, model.w(n)[i].detach().clone()) for n, i in frozen]


def copy_loss(model, ids, seq_len, span=32):
    """Mean NLL of a span of held-out text the second time it appears in the window (the
    recall circuit at work) and the first time (no copy possible)."""
    first = torch.tensor(ids[:seq_len])
    window = first.clone()
    window[seq_len - span:] = first[16:16 + span]
    with torch.no_grad():
        logits = model(window[None])[0].double()
    nll = F.cross_entropy(logits[:-1], window[1:], reduction="none")
    return nll[seq_len - span:].mean().item(), nll[16:16 + span - 1].mean().item()


def shrink_v(model, ids, seq_len):
    """MAGNITUDE: V of the attention layer times 2^-s, o_proj times 2^s (exact)."""
    shifts = []
    with torch.no_grad():
        for layer in MAGNITUDE["small_v_layers"]:
            capture, amax = [], 0.0
            for c in range(min(8, len(ids) // seq_len)):
                model(torch.tensor(ids[c * seq_len:(c + 1) * seq_len])[None], capture)
            amax = max(v.abs().max().item() for _, v in capture)
            ratio = amax / MAGNITUDE["target_amax"]
            shift = max(0, math.floor(math.log2(ratio)) + 1) if ratio >= 1 else 0
            p = f"model.layers.{layer}.self_attn."
            model.w(p + "v_proj.weight").mul_(2.0 ** -shift)
            model.w(p + "o_proj.weight").mul_(2.0 ** shift)
            shifts.append({"layer": layer, "tensor": "v", "log2_scale": -shift,
                           "amax_before": round(amax, 6)})
    return shifts


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-seconds", type=float, default=540.0)
    parser.add_argument("--out", default=os.path.join(HERE, "..", "tests", "fixtures", "model",
                                                      "qwen35-pystd"))
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(TRAIN["seed"])
    started = time.time()
    with open(os.path.join(TOKENIZER_FROM, "tokenizer.json")) as f:
        merges = [tuple(m.split(" ")) for m in json.load(f)["model"]["merges"]]
    bpe = Bpe(merges)
    vocab = bpe.eot_id + 1
    train_texts, held = read_corpus()
    with open(os.path.join(TOKENIZER_FROM, "heldout.txt")) as f:
        if f.read() != held:
            raise SystemExit("held-out text differs from qwen3-pystd's: same corpus expected")
    stream = []
    for text in train_texts:
        stream += bpe.encode(text) + [bpe.eot_id]
    held_ids = bpe.encode(held)
    print(f"{len(stream)} training tokens, {len(held_ids)} held-out ({time.time() - started:.0f} s)",
          flush=True)

    model = Hybrid(vocab)
    frozen = seed_circuit(model)
    opt = make_optimizer(model, TRAIN)
    data = torch.tensor(stream)
    S, B = TRAIN["seq_len"], TRAIN["batch"]
    print("copy loss at start (second, first occurrence):", copy_loss(model, held_ids, S), flush=True)
    budget = args.max_seconds - (time.time() - started) - 40
    step, losses = train_steps(model, opt, data, vocab, budget, TRAIN, lambda: restore_frozen(frozen),
                               started)

    shifts = shrink_v(model, held_ids, S)
    with torch.no_grad():  # evaluate exactly what is stored
        for v in model.p.values():
            v.copy_(v.to(torch.bfloat16).float())
    held_loss = heldout_loss(model, held_ids, S, 8)
    second, first = copy_loss(model, held_ids, S)
    print(f"held-out loss {held_loss:.4f} nats/token (ppl {math.exp(held_loss):.2f}); copy loss "
          f"{second:.3f} on the repeat vs {first:.3f} the first time", flush=True)

    os.makedirs(args.out, exist_ok=True)
    text = dict(MODEL, model_type="qwen3_5_text", vocab_size=vocab, max_position_embeddings=4096,
                hidden_act="silu", attention_bias=False, tie_word_embeddings=True,
                layer_types=layer_types(), rope_parameters=ROPE, mamba_ssm_dtype="float32",
                bos_token_id=bpe.eot_id, eos_token_id=bpe.eot_id, torch_dtype="bfloat16")
    config = dict(text, architectures=["Qwen3_5ForCausalLM"])
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    write_safetensors_bf16(os.path.join(args.out, "model.safetensors"), model.named_weights())
    for name in ("tokenizer.json", "tokenizer_config.json", "heldout.txt"):
        shutil.copyfile(os.path.join(TOKENIZER_FROM, name), os.path.join(args.out, name))
    with open(os.path.join(args.out, "training.json"), "w") as f:
        json.dump({"generator": "tools/train_hybrid_fixture.py", "torch": torch.__version__,
                   "model": MODEL, "rope": ROPE, "seed_circuit": SEED_CIRCUIT,
                   "train": {**TRAIN, "betas": list(TRAIN["betas"])}, "threads": args.threads,
                   "steps": step, "tokens_seen": step * S * B,
                   "seconds": round(time.time() - started, 1),
                   "loss_curve_every_10": losses[::10], "final_train_loss": losses[-1] if losses else None,
                   "magnitude": {**MAGNITUDE, "applied": shifts},
                   "copy_loss": {"repeat": second, "first": first, "span": 32},
                   "heldout": {"seq_len": S, "chunks": 8, "scored": "positions 1..seq_len-1",
                               "mean_nll_nats": held_loss, "ppl": math.exp(held_loss)}}, f)
    print(f"wrote {args.out} after {time.time() - started:.0f} s", flush=True)


if __name__ == "__main__":
    main()
