#!/usr/bin/env python3
"""Writes the GGUF reader's interoperability fixtures with the real gguf-py writer.

tests/fixtures/gguf/:
  reader_cases.gguf        every metadata value type (scalars at their extremes, arrays
                           of each, arrays of strings, arrays of arrays), a non-default
                           alignment (64), and F32, F16, BF16 and Q8_0 tensors of 1 to 4
                           dims (Q8_0 bytes from gguf.quants.quantize)
  reader_split-0000{1,2}-of-00002.gguf
                           the same writer's split output (split_max_tensors=2): three
                           tensors in two files with split.no / split.count /
                           split.tensors.count
  expected.json            what a reader must find in them, as gguf-py's GGUFReader
                           reads them back, plus gguf.constants.GGML_QUANT_SIZES (the
                           table common/ggml_type.cpp copies)

tests/fuzz/corpus/gguf/qwen3moe-model.gguf: a whole tiny qwen3moe model, fuzz_gguf's seed for
the model mapping and the GGUF tokenizer.

tests/unit/test_gguf.cpp reads these and compares. Deterministic (fixed values, no
randomness), so reruns give identical files. Needs numpy and gguf (pip install gguf).
Usage: scripts/gen_gguf_reader_cases.py [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import struct
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V

ALIGNMENT = 64

# gguf-py's type names -> the spelling common/gguf.cpp's gguf_value_type_name uses.
TYPE_NAMES = {
    V.UINT8: "u8", V.INT8: "i8", V.UINT16: "u16", V.INT16: "i16", V.UINT32: "u32", V.INT32: "i32",
    V.FLOAT32: "f32", V.BOOL: "bool", V.STRING: "string", V.ARRAY: "array", V.UINT64: "u64",
    V.INT64: "i64", V.FLOAT64: "f64",
}

# (key, value, type, sub_type). Scalars at their extremes; f32 values that need rounding.
METADATA = [
    ("test.u8", 255, V.UINT8, None),
    ("test.i8", -128, V.INT8, None),
    ("test.u16", 65535, V.UINT16, None),
    ("test.i16", -32768, V.INT16, None),
    ("test.u32", 4294967295, V.UINT32, None),
    ("test.i32", -2147483648, V.INT32, None),
    ("test.f32", 0.1, V.FLOAT32, None),
    ("test.bool.true", True, V.BOOL, None),
    ("test.bool.false", False, V.BOOL, None),
    ("test.string", "h\u00e9llo \u2713 \U0001F600", V.STRING, None),
    ("test.u64", 2**64 - 1, V.UINT64, None),
    ("test.i64", -(2**63), V.INT64, None),
    ("test.f64", 3.141592653589793, V.FLOAT64, None),
    ("test.array.u8", [0, 1, 254, 255], V.ARRAY, V.UINT8),
    ("test.array.i8", [-128, 0, 127], V.ARRAY, V.INT8),
    ("test.array.u16", [0, 65535], V.ARRAY, V.UINT16),
    ("test.array.i16", [-32768, 32767], V.ARRAY, V.INT16),
    ("test.array.u32", [0, 7, 4294967295], V.ARRAY, V.UINT32),
    ("test.array.i32", [-1, 0, 2147483647], V.ARRAY, V.INT32),
    ("test.array.f32", [0.5, -1.25, 1e-8, 3.4e38], V.ARRAY, V.FLOAT32),
    ("test.array.bool", [True, False, True], V.ARRAY, V.BOOL),
    ("test.array.string", ["<s>", "", "\u0120the", "a b", "\u00e9\u2713"], V.ARRAY, V.STRING),
    ("test.array.u64", [0, 2**64 - 1], V.ARRAY, V.UINT64),
    ("test.array.i64", [-(2**63), 2**63 - 1], V.ARRAY, V.INT64),
    ("test.array.f64", [2.5, -1e300], V.ARRAY, V.FLOAT64),
    # Arrays of arrays: gguf-py infers each inner array's type from its first element
    # (int -> i32, float -> f32, str -> string).
    ("test.array.nested", [[1, 2, 3], [4], [5, 6]], V.ARRAY, None),
    ("test.array.nested_mixed", [["x", "yz"], [1.5, -2.0]], V.ARRAY, None),
]


def bf16_bits(values: np.ndarray) -> np.ndarray:
    """f32 -> bf16 bits, round to nearest even (values here are exact in bf16 anyway)."""
    u = values.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def tensors() -> list[tuple[str, np.ndarray, Q | None]]:
    """(name, array to write, raw_dtype). numpy shapes are outermost first (ne reversed)."""
    ramp = np.arange(-12, 12, dtype=np.float32) * 0.25
    q_src = (np.sin(np.arange(2 * 64, dtype=np.float32) * 0.37) * 3.0).reshape(2, 64)
    return [
        ("f32.matrix", ramp.reshape(4, 6), None),
        ("f16.vector", (np.arange(16, dtype=np.float32) * 0.5 - 3.0).astype(np.float16), None),
        ("bf16.cube", bf16_bits(ramp.reshape(2, 3, 4)), Q.BF16),
        ("q8_0.matrix", gguf.quants.quantize(q_src, Q.Q8_0), Q.Q8_0),
        ("f32.4d", np.arange(2 * 1 * 3 * 2, dtype=np.float32).reshape(2, 1, 3, 2), None),
    ]


def add_metadata(w: gguf.GGUFWriter) -> None:
    for key, value, vtype, sub_type in METADATA:
        w.add_key_value(key, value, vtype, sub_type=sub_type)


def write(w: gguf.GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def describe_value(field: gguf.ReaderField) -> dict:
    """A field as gguf-py's reader sees it: {"type", "value"} (arrays: "element_type")."""
    vtype = field.types[0]
    if vtype != V.ARRAY:
        return {"type": TYPE_NAMES[vtype], "value": scalar(field.parts[field.data[0]], vtype)}
    return describe_array(field.types[1:], [field.parts[i] for i in field.data])


def describe_array(types: list, parts: list) -> dict:
    elem = types[0]
    if elem != V.ARRAY:
        return {"type": "array", "element_type": TYPE_NAMES[elem], "value": [scalar(p, elem) for p in parts]}
    return {"type": "array", "element_type": "array", "value": parts}


def scalar(part: np.ndarray, vtype) -> object:
    if vtype == V.STRING:
        return bytes(part).decode("utf-8")
    v = part.tolist()[0] if hasattr(part, "tolist") else part
    if vtype == V.BOOL:
        return bool(v)
    if vtype in (V.FLOAT32, V.FLOAT64):
        return float(v)
    return int(v)


def expected_metadata() -> dict:
    """Independent of the reader for nested arrays (gguf-py's ReaderField flattens them):
    the values as written, f32s rounded to f32."""
    out = {}
    for key, value, vtype, sub_type in METADATA:
        out[key] = expected_value(value, vtype, sub_type)
    return out


def infer(v) -> V:
    return V.get_type(v)


def expected_value(value, vtype, sub_type) -> dict:
    if vtype != V.ARRAY:
        return {"type": TYPE_NAMES[vtype], "value": round_f32(value) if vtype == V.FLOAT32 else value}
    elem = sub_type if sub_type is not None else infer(value[0])
    if elem == V.ARRAY:
        return {"type": "array", "element_type": "array",
                "value": [expected_value(inner, V.ARRAY, None) for inner in value]}
    return {"type": "array", "element_type": TYPE_NAMES[elem],
            "value": [round_f32(x) if elem == V.FLOAT32 else x for x in value]}


def round_f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


def expected_tensors(path: Path) -> list[dict]:
    """Every tensor as gguf-py's GGUFReader reads it back: ne, type, offsets and bytes."""
    reader = gguf.GGUFReader(path)
    out = []
    for t in reader.tensors:
        raw = bytes(np.asarray(t.data).view(np.uint8).tobytes())
        entry = {
            "name": t.name,
            "type_id": int(t.tensor_type),
            "type_name": t.tensor_type.name,
            "ne": [int(x) for x in t.shape],  # gguf-py's ReaderTensor.shape is ne order
            "data_begin": int(t.data_offset),
            "nbytes": int(t.n_bytes),
            "hex": raw.hex(),
            "f32": [float(x) for x in gguf.quants.dequantize(np.frombuffer(raw, dtype=np.uint8), t.tensor_type).ravel()],
        }
        out.append(entry)
    return out


def write_model_seed(path: Path) -> None:
    """A whole (tiny) qwen3moe model: hyper-parameters, a byte-level tokenizer, a chat
    template and every tensor a layer needs (hidden 32, one layer, 2 experts, 8 tokens):
    the fuzz_gguf seed that reaches the model mapping and the tokenizer, not only the reader."""
    arch = gguf.MODEL_ARCH.QWEN3MOE
    w = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[arch])
    h, heads, head_dim, experts, inter, vocab = 32, 2, 16, 2, 32, 8
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(h)
    w.add_feed_forward_length(inter)
    w.add_head_count(heads)
    w.add_head_count_kv(1)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_expert_count(experts)
    w.add_expert_used_count(1)
    w.add_expert_feed_forward_length(inter)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(["a", "b", "ab", "c", "d", "<|im_start|>", "<|im_end|>", "e"])
    w.add_token_types([1, 1, 1, 1, 1, 3, 3, 1])
    w.add_token_merges(["a b"])
    w.add_eos_token_id(6)
    w.add_chat_template("{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}")
    rng = np.random.default_rng(3)
    f32 = lambda *shape: (rng.standard_normal(shape) * 0.1).astype(np.float32)
    for name, value in [("token_embd.weight", f32(vocab, h)), ("output_norm.weight", f32(h)),
                        ("output.weight", f32(vocab, h)), ("blk.0.attn_norm.weight", f32(h)),
                        ("blk.0.attn_q.weight", f32(heads * head_dim, h)), ("blk.0.attn_k.weight", f32(head_dim, h)),
                        ("blk.0.attn_v.weight", f32(head_dim, h)), ("blk.0.attn_output.weight", f32(h, heads * head_dim)),
                        ("blk.0.attn_q_norm.weight", f32(head_dim)), ("blk.0.attn_k_norm.weight", f32(head_dim)),
                        ("blk.0.ffn_norm.weight", f32(h)), ("blk.0.ffn_gate_inp.weight", f32(experts, h)),
                        ("blk.0.ffn_gate_exps.weight", f32(experts, inter, h)),
                        ("blk.0.ffn_up_exps.weight", f32(experts, inter, h)),
                        ("blk.0.ffn_down_exps.weight", f32(experts, h, inter))]:
        w.add_tensor(name, value)
    write(w)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "tests/fixtures/gguf")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    cases = args.out / "reader_cases.gguf"
    w = gguf.GGUFWriter(cases, arch="charmtest")
    w.add_custom_alignment(ALIGNMENT)
    add_metadata(w)
    for name, array, raw_dtype in tensors():
        w.add_tensor(name, array, raw_dtype=raw_dtype)
    write(w)

    split_base = args.out / "reader_split.gguf"
    w = gguf.GGUFWriter(split_base, arch="charmtest", split_max_tensors=2)
    w.add_uint32("test.u32", 7)
    for name, array, raw_dtype in tensors()[:3]:
        w.add_tensor(name, array, raw_dtype=raw_dtype)
    write(w)
    split_files = sorted(args.out.glob("reader_split-*-of-*.gguf"))

    reader = gguf.GGUFReader(cases)
    version = int(reader.fields["GGUF.version"].parts[-1][0])
    expected = {
        "generator": f"gguf-py {getattr(gguf, '__version__', '?')} (scripts/gen_gguf_reader_cases.py)",
        "version": version,
        "alignment": ALIGNMENT,
        "metadata": {"general.architecture": {"type": "string", "value": "charmtest"},
                     "general.alignment": {"type": "u32", "value": ALIGNMENT}, **expected_metadata()},
        "tensors": expected_tensors(cases),
        "split": {
            "files": [p.name for p in split_files],
            "tensors": [[t["name"] for t in expected_tensors(p)] for p in split_files],
        },
        "ggml_types": [
            {"id": int(t), "name": t.name, "block_elements": gguf.constants.GGML_QUANT_SIZES[t][0],
             "block_bytes": gguf.constants.GGML_QUANT_SIZES[t][1]}
            for t in Q
        ],
    }
    # Cross-check the scalar metadata against gguf-py's own reader.
    for key, want in expected["metadata"].items():
        got = describe_value(reader.fields[key])
        if want["element_type" if "element_type" in want else "type"] != "array" and got != want:
            raise SystemExit(f"{key}: gguf-py reads {got}, expected {want}")
    (args.out / "expected.json").write_text(json.dumps(expected, indent=1, ensure_ascii=False) + "\n")
    seed = Path(__file__).resolve().parent.parent / "tests" / "fuzz" / "corpus" / "gguf" / "qwen3moe-model.gguf"
    write_model_seed(seed)
    print(seed)
    for p in [cases, *split_files, args.out / "expected.json"]:
        print(f"wrote {p} ({p.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
