#!/usr/bin/env python3
"""Writes the K-quant GGUF fixtures (tests/fixtures/gguf_models/): a small random Qwen3-MoE
(`qwen3moe`) whose every matrix has rows of whole 256-value blocks, so llama.cpp's own
`llama-quantize` gives it real Q4_K_M and Q5_K_M files (the mixes users download: Q4_K /
Q5_K with Q6_K for some tensors). gguf-py cannot write K-quants, hence llama-quantize; the
outputs are committed so CI needs neither llama.cpp nor this script.

The model: hidden 256, 2 layers, 4 heads of 64 (2 KV heads), q/k norms, 8 experts of
width 256 (top 2), vocabulary 512 (tokens "<t0>".."<t511>": the tests check logits, not
text), weights N(0, 0.05), seed fixed. The BF16 source is written beside the outputs to a
temporary folder only.

Usage: gen_gguf_kquant_fixture.py LLAMA_QUANTIZE [--out DIR]
(LLAMA_QUANTIZE: llama.cpp's program, e.g. as scripts/bench_llamacpp.py builds it in
 <work>/llama-build/bin/llama-quantize; needs numpy and gguf)
"""
from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import gguf

ROOT = Path(__file__).resolve().parent.parent
HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, EXPERTS, TOP_K, FF, VOCAB = 256, 2, 4, 2, 64, 8, 2, 256, 512


def bf16(values: np.ndarray) -> np.ndarray:
    bits = values.astype(np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def write_source(path: Path) -> None:
    rng = np.random.default_rng(20261201)
    w = gguf.GGUFWriter(str(path), "qwen3moe")
    w.add_name("qwen3moe-k256")
    w.add_block_count(LAYERS)
    w.add_context_length(512)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FF)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_expert_count(EXPERTS)
    w.add_expert_used_count(TOP_K)
    w.add_expert_feed_forward_length(FF)
    w.add_vocab_size(VOCAB)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list([f"<t{i}>" for i in range(VOCAB)])
    w.add_token_types([gguf.TokenType.NORMAL] * VOCAB)
    w.add_token_merges([])
    w.add_eos_token_id(0)

    def matrix(*shape):
        return bf16(rng.normal(0, 0.05, shape))

    def norm(n):
        return (1.0 + rng.normal(0, 0.1, n)).astype(np.float32)

    bf = gguf.GGMLQuantizationType.BF16
    w.add_tensor("token_embd.weight", matrix(VOCAB, HIDDEN), raw_dtype=bf)
    w.add_tensor("output_norm.weight", norm(HIDDEN))
    w.add_tensor("output.weight", matrix(VOCAB, HIDDEN), raw_dtype=bf)
    for l in range(LAYERS):
        p = f"blk.{l}."
        w.add_tensor(p + "attn_norm.weight", norm(HIDDEN))
        w.add_tensor(p + "attn_q.weight", matrix(HEADS * HEAD_DIM, HIDDEN), raw_dtype=bf)
        w.add_tensor(p + "attn_k.weight", matrix(KV_HEADS * HEAD_DIM, HIDDEN), raw_dtype=bf)
        w.add_tensor(p + "attn_v.weight", matrix(KV_HEADS * HEAD_DIM, HIDDEN), raw_dtype=bf)
        w.add_tensor(p + "attn_output.weight", matrix(HIDDEN, HEADS * HEAD_DIM), raw_dtype=bf)
        w.add_tensor(p + "attn_q_norm.weight", norm(HEAD_DIM))
        w.add_tensor(p + "attn_k_norm.weight", norm(HEAD_DIM))
        w.add_tensor(p + "ffn_norm.weight", norm(HIDDEN))
        w.add_tensor(p + "ffn_gate_inp.weight", rng.normal(0, 0.5, (EXPERTS, HIDDEN)).astype(np.float32))
        w.add_tensor(p + "ffn_gate_exps.weight", matrix(EXPERTS, FF, HIDDEN), raw_dtype=bf)
        w.add_tensor(p + "ffn_up_exps.weight", matrix(EXPERTS, FF, HIDDEN), raw_dtype=bf)
        w.add_tensor(p + "ffn_down_exps.weight", matrix(EXPERTS, HIDDEN, FF), raw_dtype=bf)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("llama_quantize", type=Path)
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures" / "gguf_models")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "qwen3moe-k256.bf16.gguf"
        write_source(source)
        for kind in ("Q4_K_M", "Q5_K_M"):
            out = args.out / f"qwen3moe-k256.{kind.lower()}.gguf"
            subprocess.run([str(args.llama_quantize), str(source), str(out), kind], check=True,
                           stdout=subprocess.DEVNULL)
            types = sorted({t.tensor_type.name for t in gguf.GGUFReader(str(out)).tensors})
            print(out, out.stat().st_size, "bytes:", ", ".join(types))


if __name__ == "__main__":
    main()
