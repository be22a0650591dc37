#!/usr/bin/env python3
"""Writes the oracle fixtures of common/ggml_dequantize.cpp: tests/fixtures/ggml_quants/.

For each GGML type charm dequantises, <TYPE>.blocks holds the raw bytes of N whole blocks
and <TYPE>.f32 what gguf-py's gguf.quants.dequantize returns for them (little-endian f32,
block after block). The blocks are, in this order:
  - edge blocks: all-zero bytes; then, for every f16 / e8m0 scale field, the field set to
    +0, -0, the smallest subnormal, the largest subnormal, the smallest normal, 1.0, -1.0,
    the largest finite and its negative, with random bytes everywhere else;
  - half the remainder from gguf.quants.quantize of normal floats at scales 1e-6 .. 1e4
    (types gguf-py cannot quantise, the K-quants, get random blocks here instead);
  - the other half random bytes with every f16 scale field forced finite (an all-ones
    exponent is replaced by a random finite one), so every bit pattern of the quants and
    sub-scales turns up. e8m0 (MXFP4) has no non-finite code in ggml's reading of it.
F32 / F16 / BF16 are elements (blocks of one): random bit patterns, NaN and infinity
included (the dequantisers are bit copies or exact widenings), plus the special values.

Needs numpy and gguf (pip install gguf); the seed is fixed, so a rerun writes the same
bytes. Run from the repository root: python3 scripts/gen_ggml_quant_cases.py

--against-ggml LIB (libggml-base.so of a llama.cpp build) writes nothing: it checks that
ggml's C dequantize_row_* give the committed .f32 bit for bit, and lists where they do not.
"""

import argparse
import ctypes
import os
import sys

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T
import gguf.quants

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "ggml_quants")

# Byte offsets of each block's f16 scale fields (ggml-common.h's block_* structs).
F16_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
}
E8M0_FIELDS = {T.MXFP4: [0]}
# Blocks per quantised type: 32-element types are cheap, 256-element ones ~1.2 KB each.
BLOCKS = {32: 256, 256: 64}
ELEMENTS = 4096  # F32 / F16 / BF16

F16_EDGES = [0x0000, 0x8000, 0x0001, 0x03FF, 0x0400, 0x3C00, 0xBC00, 0x7BFF, 0xFBFF]
E8M0_EDGES = [0, 1, 2, 126, 127, 128, 253, 254, 255]


def force_finite_f16(blocks, offsets, rng):
    for off in offsets:
        bits = blocks[:, off:off + 2].copy().view("<u2").reshape(-1)
        bad = (bits & 0x7C00) == 0x7C00
        bits[bad] = (bits[bad] & 0x83FF) | (rng.integers(0, 31, size=bad.sum(), dtype=np.uint16) << 10)
        blocks[:, off:off + 2] = bits.astype("<u2").view(np.uint8).reshape(-1, 2)


def edge_blocks(qtype, type_size, rng):
    out = [np.zeros((1, type_size), dtype=np.uint8)]
    for off in F16_FIELDS.get(qtype, []):
        for v in F16_EDGES:
            b = rng.integers(0, 256, size=(1, type_size), dtype=np.uint8)
            force_finite_f16(b, F16_FIELDS[qtype], rng)
            b[0, off:off + 2] = np.array([v], dtype="<u2").view(np.uint8)
            out.append(b)
    for off in E8M0_FIELDS.get(qtype, []):
        for v in E8M0_EDGES:
            b = rng.integers(0, 256, size=(1, type_size), dtype=np.uint8)
            b[0, off] = v
            out.append(b)
    return np.concatenate(out, axis=0)


def quantised_blocks(qtype, block_size, count, rng):
    """gguf.quants.quantize of normal floats, one scale per block; None if unsupported."""
    scales = 10.0 ** rng.uniform(-6, 4, size=(count, 1))
    x = (rng.standard_normal((count, block_size)) * scales).astype(np.float32)
    try:
        q = gguf.quants.quantize(x, qtype)
    except NotImplementedError:
        return None
    return np.ascontiguousarray(q.view(np.uint8)).reshape(count, -1)


def random_blocks(qtype, type_size, count, rng):
    b = rng.integers(0, 256, size=(count, type_size), dtype=np.uint8)
    force_finite_f16(b, F16_FIELDS.get(qtype, []), rng)
    return b


def quant_cases(qtype, rng):
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    edges = edge_blocks(qtype, type_size, rng)
    rest = BLOCKS[block_size] - len(edges)
    half = rest // 2
    q = quantised_blocks(qtype, block_size, half, rng)
    quantised = q is not None
    if not quantised:
        q = random_blocks(qtype, type_size, half, rng)
    r = random_blocks(qtype, type_size, rest - half, rng)
    return np.concatenate([edges, q, r], axis=0), quantised


def element_cases(qtype, rng):
    specials = {
        T.F32: [0x00000000, 0x80000000, 0x00000001, 0x807FFFFF, 0x7F800000, 0xFF800000, 0x7F800001,
                0x7FC00000, 0xFFFFFFFF, 0x7F7FFFFF],
        T.F16: [0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x7BFF, 0x7C00, 0xFC00, 0x7C01, 0x7E00,
                0x7FFF, 0xFC01],
        T.BF16: [0x0000, 0x8000, 0x0001, 0x807F, 0x7F80, 0xFF80, 0x7F81, 0x7FC0, 0xFFFF, 0x7F7F],
    }[qtype]
    width = 4 if qtype == T.F32 else 2
    dt = "<u4" if width == 4 else "<u2"
    bits = rng.integers(0, 2 ** (8 * width), size=ELEMENTS - len(specials), dtype=np.uint64).astype(dt)
    bits = np.concatenate([np.array(specials, dtype=dt), bits])
    return bits.view(np.uint8).reshape(ELEMENTS, width)


TYPES = [T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0,
         T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.MXFP4]


def against_ggml(lib_path):
    """Compares ggml's C dequantisers with the committed fixtures; returns the mismatches."""
    lib = ctypes.CDLL(lib_path)
    bad = 0
    for qtype in TYPES:
        blocks = np.fromfile(os.path.join(OUT, f"{qtype.name}.blocks"), dtype=np.uint8)
        want = np.fromfile(os.path.join(OUT, f"{qtype.name}.f32"), dtype="<u4")
        got = np.zeros(want.size, dtype=np.float32)
        if qtype == T.F32:
            got = blocks.view("<u4").copy().view(np.float32)
        else:
            name = {T.F16: "ggml_fp16_to_fp32_row", T.BF16: "ggml_bf16_to_fp32_row"}.get(
                qtype, f"dequantize_row_{qtype.name.lower().replace('_k', '_K')}")
            fn = getattr(lib, name)
            fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
            fn.restype = None
            fn(blocks.ctypes.data, got.ctypes.data, want.size)
        diff = np.nonzero(got.view("<u4") != want)[0]
        if diff.size:
            i = diff[0]
            bad += diff.size
            print(f"{qtype.name}: {diff.size} of {want.size} differ; first at {i}: ggml "
                  f"{got[i]!r} (0x{got.view('<u4')[i]:08x}), gguf-py {want.view(np.float32)[i]!r} (0x{want[i]:08x})")
        else:
            print(f"{qtype.name}: ggml == gguf-py on all {want.size} values")
    return bad


QUANTIZE_TYPES = [T.Q8_0, T.Q4_0]  # what charm's quant_dense writes (common/ggml_quantize.h)


def quantize_inputs(qtype, rng):
    """f32 rows of 32-value blocks for the quantiser fixtures: edge blocks first, then
    seeded normals at scales 1e-6 .. 1e4, half of them rounded to bf16 (the checkpoints'
    values). No block here makes 1 / d overflow (|x| below ~1e-36 but not 0): ggml and
    gguf-py leave those quants undefined (charm writes 0; the block dequantises to 0 anyway)."""
    edges = np.zeros((8, 32), dtype=np.float32)
    edges[1, :6] = [127, 2.5, -3.5, 0.5, -0.5, 126.5]   # Q8_0 d = 1: ties round away from zero
    edges[2, :6] = [-8, -7.5, 0.5, 6.5, 7, -0.5]        # Q4_0 d = 1: trunc(x + 8.5), 7 clipped to 15
    edges[3, :4] = [8, 7.5, -0.5, -8]                    # Q4_0 d = -1; +8 is the first of two maxima
    edges[4, :3] = [-5, 5, 1]                            # the first of equal magnitudes is the signed max
    edges[5, :] = 1e-30                                  # d rounds to f16 zero, 1 / d is still finite
    largest = {T.Q8_0: 8.3e6, T.Q4_0: 5.2e5}[qtype]     # d just below f16's largest, 65504
    edges[6, :] = rng.uniform(-largest, largest, 32)
    edges[6, 0] = largest
    edges[7, :] = rng.uniform(-1, 1, 32) * np.float32(6.1e-5)  # d an f16 subnormal
    x = (rng.standard_normal((248, 32)) * 10.0 ** rng.uniform(-6, 4, size=(248, 1))).astype(np.float32)
    bits = x[:124].view(np.uint32)
    x[:124] = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).view(np.float32)
    return np.ascontiguousarray(np.concatenate([edges, x]).astype("<f4"))


def write_quantize_cases():
    """<TYPE>.quantize.f32 (inputs) and <TYPE>.quantize.blocks (gguf.quants.quantize of them)."""
    rng = np.random.default_rng(20261207)
    for qtype in QUANTIZE_TYPES:
        x = quantize_inputs(qtype, rng)
        blocks = np.ascontiguousarray(gguf.quants.quantize(x, qtype).view(np.uint8))
        with open(os.path.join(OUT, f"{qtype.name}.quantize.f32"), "wb") as f:
            f.write(x.tobytes())
        with open(os.path.join(OUT, f"{qtype.name}.quantize.blocks"), "wb") as f:
            f.write(blocks.tobytes())
        print(f"{qtype.name}: {x.shape[0]} blocks quantised")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against-ggml", metavar="LIB")
    args = parser.parse_args()
    if args.against_ggml:
        sys.exit(1 if against_ggml(args.against_ggml) else 0)
    rng = np.random.default_rng(20251201)
    os.makedirs(OUT, exist_ok=True)
    total = 0
    for qtype in TYPES:
        if qtype in (T.F32, T.F16, T.BF16):
            blocks, quantised = element_cases(qtype, rng), False
        else:
            blocks, quantised = quant_cases(qtype, rng)
        blocks = np.ascontiguousarray(blocks)
        with np.errstate(over="ignore"):  # MXFP4's e = 254, 255 times 12 overflows to inf
            values = gguf.quants.dequantize(blocks.reshape(-1).copy(), qtype)
        values = np.ascontiguousarray(values, dtype=np.float32).astype("<f4", copy=False)
        with open(os.path.join(OUT, f"{qtype.name}.blocks"), "wb") as f:
            f.write(blocks.tobytes())
        with open(os.path.join(OUT, f"{qtype.name}.f32"), "wb") as f:
            f.write(values.tobytes())
        total += blocks.nbytes + values.nbytes
        print(f"{qtype.name}: {blocks.shape[0]} blocks, {values.size} values"
              f"{', half from gguf.quants.quantize' if quantised else ''}")
    write_quantize_cases()
    print(f"total {total} bytes")
    if total >= 1 << 20:
        sys.exit("fixtures exceed 1 MB")


if __name__ == "__main__":
    main()
