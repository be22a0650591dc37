#!/usr/bin/env python3
"""scripts/moefy.py's torch-free checkpoint writing: bf16_bits and write_safetensors.

Default run (numpy only): bf16 rounding of hand-picked float32 bit patterns whose results
follow from round-to-nearest-even (ties, carries into the exponent, overflow to inf,
subnormals, NaN -> 0xFFFF as ATen writes it), block boundaries, shapes; a safetensors file
compared byte for byte with one spelled out from the format spec (huggingface/safetensors
README); a non-bf16 array is refused.
--against-torch: 2M random bit patterns against torch's Tensor.to(torch.bfloat16) and a
file against safetensors.torch.save_file, byte for byte (the demo checkpoint's pinned
checksums depend on both). Not a ctest (CI installs no torch): run it by hand, where torch
and safetensors are installed, after changing bf16_bits or write_safetensors.
A needed package that is absent is a failure (exit 1) naming it, never a skip.
"""
import argparse
import json
import sys
import tempfile
from pathlib import Path

try:
    import numpy as np
except ImportError:
    print("FAIL: numpy is not installed (scripts/setup.sh installs it)", file=sys.stderr)
    sys.exit(1)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import moefy  # noqa: E402

# (float32 bits, bf16 bits) by round-to-nearest-even on the low 16 bits.
CASES = [
    (0x3F800000, 0x3F80),  # 1.0, exact
    (0x3F807FFF, 0x3F80),  # just below half: down
    (0x3F808000, 0x3F80),  # tie, kept bit even: down
    (0x3F818000, 0x3F82),  # tie, kept bit odd: up to even
    (0x3F808001, 0x3F81),  # just above half: up
    (0x3FFF8000, 0x4000),  # tie to even carries into the exponent (1.9990234 -> 2.0)
    (0xBF818000, 0xBF82),  # negative tie rounds by magnitude
    (0x7F7FFFFF, 0x7F80),  # FLT_MAX rounds to +inf
    (0xFF7FFFFF, 0xFF80),  # -FLT_MAX rounds to -inf
    (0x7F7F7FFF, 0x7F7F),  # largest value that stays finite
    (0x7F800000, 0x7F80),  # +inf
    (0xFF800000, 0xFF80),  # -inf
    (0x00000000, 0x0000),
    (0x80000000, 0x8000),  # -0.0 keeps its sign
    (0x00008000, 0x0000),  # subnormal tie, even: down
    (0x00018000, 0x0002),  # subnormal tie, odd: up
    (0x7FC00000, 0xFFFF),  # quiet NaN
    (0xFFC00000, 0xFFFF),  # negative quiet NaN
    (0x7F800001, 0xFFFF),  # signalling NaN (would round to inf without the NaN rule)
    (0xFFFFFFFF, 0xFFFF),  # NaN whose rounding add wraps in uint32
]


def check(cond: bool, what: str) -> None:
    if not cond:
        raise SystemExit(f"FAIL: {what}")
    print(f"ok: {what}")


def test_rounding() -> None:
    src = np.array([f for f, _ in CASES], np.uint32).view(np.float32)
    want = np.array([b for _, b in CASES], np.uint16)
    got = moefy.bf16_bits(src)
    bad = [f"{f:#010x} -> {int(g):#06x}, want {b:#06x}" for (f, b), g in zip(CASES, got)
           if g != b]
    check(not bad and got.dtype == np.dtype("<u2"), f"bf16 rounding of {len(CASES)} "
          f"patterns {bad}")
    saved = moefy.BF16_BLOCK
    try:
        moefy.BF16_BLOCK = 7  # blocks that do not divide the size
        tiled = np.tile(src, 5).reshape(4, 25)
        got = moefy.bf16_bits(tiled)
        check(got.shape == (4, 25) and np.array_equal(got.reshape(-1), np.tile(want, 5)),
              "block boundaries and 2-D shape")
        got = moefy.bf16_bits(tiled.T)  # non-contiguous input
        check(np.array_equal(got, np.tile(want, 5).reshape(4, 25).T), "transposed input")
    finally:
        moefy.BF16_BLOCK = saved
    check(moefy.bf16_bits(np.zeros((0, 3), np.float32)).shape == (0, 3), "empty tensor")


def test_safetensors_layout(tmp: Path) -> None:
    tensors = {"b.w": np.array([0x3F80, 0x4000], "<u2"), "a": np.array([[0xBF80]], "<u2")}
    moefy.write_safetensors(tmp / "t.safetensors", tensors, metadata={"format": "pt"})
    head = ('{"__metadata__":{"format":"pt"},'
            '"a":{"dtype":"BF16","shape":[1,1],"data_offsets":[0,2]},'
            '"b.w":{"dtype":"BF16","shape":[2],"data_offsets":[2,6]}}').encode()
    head += b" " * (-len(head) % 8)
    want = len(head).to_bytes(8, "little") + head + bytes.fromhex("80bf" "803f" "0040")
    got = (tmp / "t.safetensors").read_bytes()
    check(got == want, "safetensors bytes: header length, sorted compact JSON, padding, data")
    check(json.loads(got[8:8 + len(head)])["b.w"]["shape"] == [2], "header parses as JSON")
    try:
        moefy.write_safetensors(tmp / "bad.safetensors", {"x": np.zeros(2, np.float32)})
        check(False, "float32 array refused")
    except ValueError as err:
        check("x" in str(err) and "float32" in str(err), f"float32 array refused: {err}")


def test_against_torch(tmp: Path) -> None:
    try:
        import torch
        from safetensors.torch import save_file
    except ImportError as err:
        print(f"FAIL: --against-torch needs torch and safetensors: {err}", file=sys.stderr)
        sys.exit(1)
    rng = np.random.default_rng(7)
    bits = rng.integers(0, 1 << 32, size=2_000_000, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    ref = torch.from_numpy(x.copy()).to(torch.bfloat16).view(torch.int16).numpy()
    got = moefy.bf16_bits(x)
    check(np.array_equal(got, ref.view(np.uint16)),
          f"bf16_bits == torch on {x.size} random patterns ({np.isnan(x).sum()} NaN)")
    floats = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in
              [("z.w", (3, 5)), ("a.b", (7,)), ("m.x", (1, 9)), ("B", (2, 2, 2))]}
    save_file({k: torch.from_numpy(v).to(torch.bfloat16) for k, v in floats.items()},
              str(tmp / "ref.safetensors"), metadata={"format": "pt"})
    moefy.write_safetensors(tmp / "mine.safetensors",
                            {k: moefy.bf16_bits(v) for k, v in floats.items()},
                            metadata={"format": "pt"})
    check((tmp / "ref.safetensors").read_bytes() == (tmp / "mine.safetensors").read_bytes(),
          "write_safetensors == safetensors.torch.save_file, byte for byte")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--against-torch", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.against_torch:
            test_against_torch(Path(tmp))
        else:
            test_rounding()
            test_safetensors_layout(Path(tmp))


if __name__ == "__main__":
    main()
