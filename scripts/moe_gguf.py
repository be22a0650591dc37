#!/usr/bin/env python3
"""The demo MoE checkpoint (scripts/moefy.py build) as a llama.cpp `qwen2moe` GGUF, BF16.

So llama.cpp serves the same model, bit for bit the same weights, as charm: every matrix
is copied as the checkpoint's bf16 bits (llama.cpp's GGML_TYPE_BF16), the 1-D tensors
(norms, biases, the shared-expert gate) widened to f32 as llama.cpp's own converter keeps
them. The tokenizer (vocabulary, merges, special ids, chat template) is copied key by key
from the dense source GGUF the checkpoint was made from (moefy.py fetch), so both engines
tokenize with the vocabulary the model was trained on. Needs numpy and gguf only (no torch:
llama.cpp's convert_hf_to_gguf.py imports it).

Layout (llama.cpp src/models/qwen2moe.cpp): per layer the 16 routed experts stacked into
one 3-D tensor each (ffn_gate_exps / ffn_up_exps [n_expert, ff_exp, hidden], ffn_down_exps
[n_expert, hidden, ff_exp] in numpy order), the router `ffn_gate_inp`, the shared expert
`ffn_{gate,up,down}_shexp` and its sigmoid gate `ffn_gate_inp_shexp` [hidden].
Difference kept: llama.cpp's qwen2moe graph never renormalises the top-k weights, which is
what this checkpoint asks for (config.json norm_topk_prob: false).

Usage: scripts/moe_gguf.py [--checkpoint DIR] [--source-gguf FILE] [--out FILE]
Defaults: the cache of moefy.py (~/.cache/charm/models/qwen2.5-0.5b-moe/): checkpoint/,
source.gguf, and out moe-bf16.gguf beside them; an existing out is kept (prints its path).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from moefy import _GLOBAL_NAMES, _LAYER_NAMES, default_cache  # noqa: E402

# HF Qwen2-MoE per-layer suffix -> GGUF suffix, beyond the dense names moefy.py maps.
_MOE_NAMES = {
    "mlp.gate.weight": "ffn_gate_inp.weight",
    "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight",
    "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
}
_EXPERT_NAMES = {"gate_proj": "ffn_gate_exps.weight", "up_proj": "ffn_up_exps.weight",
                 "down_proj": "ffn_down_exps.weight"}


def bf16_tensors(ck: Path) -> dict[str, np.ndarray]:
    """name -> uint16 array of bf16 bits (a read-only memory map) for every checkpoint tensor.
    Raises SystemExit for a dtype other than BF16."""
    out = {}
    for shard in sorted(ck.glob("*.safetensors")):
        with open(shard, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n))
        data = np.memmap(shard, dtype="<u2", mode="r", offset=8 + n)
        for name, info in header.items():
            if name == "__metadata__":
                continue
            if info["dtype"] != "BF16":
                raise SystemExit(f"{shard}: tensor {name} is {info['dtype']}, expected BF16")
            begin, end = (o // 2 for o in info["data_offsets"])
            out[name] = data[begin:end].reshape(info["shape"])
    return out


def gguf_tensors(hf: dict[str, np.ndarray], n_layers: int, n_experts: int):
    """Yields (GGUF name, array); an array of dtype uint16 holds bf16 bits, float32 is f32."""
    layer_map = {v: k for k, v in _LAYER_NAMES.items()} | {k: v for k, v in _MOE_NAMES.items()}
    for gname, hname in _GLOBAL_NAMES.items():
        yield gname, widen(hf[hname])
    for i in range(n_layers):
        pre = f"model.layers.{i}."
        for hsuffix, gsuffix in layer_map.items():
            if pre + hsuffix in hf:
                t = hf[pre + hsuffix]
                yield f"blk.{i}.{gsuffix}", widen(t.reshape(-1) if "shared_expert_gate" in hsuffix else t)
        for proj, gsuffix in _EXPERT_NAMES.items():
            yield f"blk.{i}.{gsuffix}", np.stack([hf[f"{pre}mlp.experts.{e}.{proj}.weight"] for e in range(n_experts)])


def widen(t: np.ndarray) -> np.ndarray:
    """1-D tensors as float32 (bf16 bits shifted up), matrices left as bf16 bits."""
    return (t.astype(np.uint32) << 16).view(np.float32) if t.ndim == 1 else t


def copy_tokenizer(reader, writer) -> None:
    """Every tokenizer.* key of the source GGUF, same value types."""
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), vtype, sub_type=sub)


def write(ck: Path, source: Path, out: Path) -> None:
    cfg = json.loads((ck / "config.json").read_text())
    reader = gguf.GGUFReader(str(source))
    hf = bf16_tensors(ck)
    tmp = out.with_suffix(".partial")
    w = gguf.GGUFWriter(str(tmp), "qwen2moe")
    w.add_name(cfg.get("moefy", {}).get("source", "qwen2.5-0.5b") + " MoEfied (charm demo model)")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)
    for add, key in ((w.add_block_count, "num_hidden_layers"), (w.add_context_length, "max_position_embeddings"),
                     (w.add_embedding_length, "hidden_size"), (w.add_feed_forward_length, "intermediate_size"),
                     (w.add_head_count, "num_attention_heads"), (w.add_head_count_kv, "num_key_value_heads"),
                     (w.add_rope_freq_base, "rope_theta"), (w.add_layer_norm_rms_eps, "rms_norm_eps"),
                     (w.add_expert_count, "num_experts"), (w.add_expert_used_count, "num_experts_per_tok"),
                     (w.add_expert_feed_forward_length, "moe_intermediate_size"),
                     (w.add_expert_shared_feed_forward_length, "shared_expert_intermediate_size")):
        add(cfg[key])
    copy_tokenizer(reader, w)
    for name, t in gguf_tensors(hf, cfg["num_hidden_layers"], cfg["num_experts"]):
        if t.dtype == np.uint16:
            w.add_tensor(name, np.ascontiguousarray(t), raw_dtype=gguf.GGMLQuantizationType.BF16)
        else:
            w.add_tensor(name, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, out)


def main() -> int:
    cache = default_cache()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", type=Path, default=cache / "checkpoint")
    ap.add_argument("--source-gguf", type=Path, default=cache / "source.gguf")
    ap.add_argument("--out", type=Path, default=cache / "moe-bf16.gguf")
    args = ap.parse_args()
    if not args.out.exists():
        write(args.checkpoint, args.source_gguf, args.out)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
