#!/usr/bin/python3
"""Independent references for kvaudit's numerics tests (run with Debian's /usr/bin/python3).

Writes, under tests/numerics/golden/:
  float_conversions.txt  one line per input: float32 bits, torch bfloat16 bits, numpy float16
                         bits (inputs: specials, every bf16/fp16 rounding tie near a sample of
                         values, overflow and underflow boundaries, and random floats).
  fp8_decode.txt         every code of e4m3fn, e4m3fnuz, e5m2 and e2m1 decoded from the format
                         definitions with exact rationals (torch 1.13 has no float8 types).
The C++ tests read these files; regenerate with: /usr/bin/python3 tools/oracles/make_float_goldens.py
"""
import os
import struct
from fractions import Fraction

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "..", "tests", "numerics", "golden")


def f32_from_bits(bits):
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def inputs():
    bits = set()
    specials = [0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000,
                0x7F800001, 0x00000001, 0x80000001, 0x007FFFFF, 0x00800000, 0x7F7FFFFF,
                0xFF7FFFFF]
    bits.update(specials)
    rng = np.random.default_rng(20261129)
    # bf16 ties and neighbours: low 16 bits 0x8000 (tie), 0x7FFF, 0x8001, for random highs.
    for high in rng.integers(0, 0x10000, size=400):
        for low in (0x8000, 0x7FFF, 0x8001, 0x0000, 0xFFFF):
            bits.add((int(high) << 16) | low)
    # fp16 ties: midpoints between consecutive fp16 values, plus the neighbouring floats.
    for h in list(rng.integers(0, 0x7C00, size=400)) + [0x7BFF, 0x0000, 0x0001, 0x03FF, 0x0400]:
        a = np.array([int(h)], dtype=np.uint16).view(np.float16).astype(np.float64)[0]
        b = np.array([int(h) + 1], dtype=np.uint16).view(np.float16).astype(np.float64)[0]
        if not np.isfinite(b):
            b = 65536.0  # the value the next code would have: the overflow boundary
        mid = np.float32((a + b) / 2)
        for v in (mid, np.nextafter(mid, np.float32(np.inf)), np.nextafter(mid, np.float32(0))):
            for s in (1, -1):
                bits.add(int(np.array([s * v], dtype=np.float32).view(np.uint32)[0]))
    for v in rng.standard_normal(600) * np.exp(rng.uniform(-20, 20, 600)):
        bits.add(int(np.array([v], dtype=np.float32).view(np.uint32)[0]))
    return sorted(bits)


def float_conversions():
    rows = []
    for b in inputs():
        x = np.array([b], dtype=np.uint32).view(np.float32)
        with np.errstate(over="ignore", invalid="ignore"):
            f16 = int(x.astype(np.float16).view(np.uint16)[0])
        t = torch.from_numpy(x.copy()).to(torch.bfloat16)
        bf16 = int(t.view(torch.int16).item()) & 0xFFFF
        rows.append(f"{b:08x} {bf16:04x} {f16:04x}")
    return rows


def minifloat(code, exp_bits, man_bits, bias, kind):
    sign = -1 if (code >> (exp_bits + man_bits)) & 1 else 1
    e = (code >> man_bits) & ((1 << exp_bits) - 1)
    m = code & ((1 << man_bits) - 1)
    top = (1 << exp_bits) - 1
    if kind == "fnuz" and code == 0x80:
        return "nan"
    if kind == "fn" and e == top and m == (1 << man_bits) - 1:
        return "nan"
    if kind == "ieee" and e == top:
        return "nan" if m else ("inf" if sign > 0 else "-inf")
    if e == 0:
        value = Fraction(m, 1 << man_bits) * Fraction(2) ** (1 - bias)
    else:
        value = (1 + Fraction(m, 1 << man_bits)) * Fraction(2) ** (e - bias)
    value *= sign
    if value == 0 and sign < 0:
        return "-0"
    return repr(float(value))


def fp8_decode():
    rows = []
    for name, e, m, bias, kind, count in [("fp8_e4m3", 4, 3, 7, "fn", 256),
                                          ("fp8_e4m3fnuz", 4, 3, 8, "fnuz", 256),
                                          ("fp8_e5m2", 5, 2, 15, "ieee", 256),
                                          ("fp4_e2m1", 2, 1, 1, "none", 16)]:
        for code in range(count):
            rows.append(f"{name} {code} {minifloat(code, e, m, bias, kind)}")
    return rows


def main():
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "float_conversions.txt"), "w") as f:
        f.write("# f32_bits torch_bf16_bits numpy_f16_bits (hex); tools/oracles/make_float_goldens.py\n")
        f.write("\n".join(float_conversions()) + "\n")
    with open(os.path.join(OUT, "fp8_decode.txt"), "w") as f:
        f.write("# format code value (exact rationals); tools/oracles/make_float_goldens.py\n")
        f.write("\n".join(fp8_decode()) + "\n")


if __name__ == "__main__":
    main()
