#!/usr/bin/env python3
"""Writes a synthetic OLMoE checkpoint with the real shapes of OLMoE-1B-7B, for benchmarks.

RANDOM WEIGHTS: the model is not trained and its text is gibberish. It exists so the
tier benchmark (scripts/bench_tiers.py) reads and computes exactly the bytes and FLOPs
OLMoE-1B-7B-0924 would: hidden_size 2048, 16 layers, 64 routed experts per layer, top-8,
expert (moe) intermediate size 1024, 16 attention heads (no GQA), bf16 on disk, the hub's
per-expert tensor names (model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight), in
shards with a model.safetensors.index.json as transformers writes them.

Deviations from the real checkpoint (all stated in docs/benchmarks.md):
  * vocab_size 50304 as OLMoE's, but the tokenizer is the Qwen2 byte-level BPE fixture of
    this repository (tests/fixtures/tokenizer) cut to fit: its first 50278 tokens, the
    merges among them, and its 26 added tokens renumbered 50278-50303 (charm refuses a
    tokenizer with ids past vocab_size). --tokenizer-only rewrites just these files.
  * Weights are N(0, std^2) with std 0.02 (initializer_range), cut from one seeded pool of
    64 Mi values at random offsets instead of drawn afresh per tensor (writing 13 GB of
    fresh normals would take far longer on a 2-core machine; nothing measured depends on
    the values being independent).
  * Routing structure: random weights with RMS-1 embeddings make every token's deep
    hidden state alike (random attention averages over positions, and that shared part
    compounds), so deep layers picked the same ~18 experts for every token: an LRU would
    look perfect. Two knobs, both measured in docs/benchmarks.md: the embeddings' token
    part has RMS --embed-rms (4) so tokens stay distinct through 16 layers, plus a shared
    direction m_hat of RMS 1 (the anisotropy of trained LMs); router row e gets
    --router-bias (0.03) * b_e * m_hat with b_e Zipf-like (1.5/sqrt(rank)) over a random
    expert order, a mild popularity skew that is stable over tokens, as real MoEs have.

Memory: one tensor at a time (at most vocab x hidden f32, 412 MB); never the whole model.
Disk: about 13.5 GB (experts 12.9 GB). Run time: a few minutes, mostly disk writes.

Usage: scripts/make_synthetic_olmoe.py [--out DIR] [--layers N] [--vocab N] [--seed S] [--tokenizer-only]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import sys
from pathlib import Path

import numpy as np

HIDDEN = 2048
LAYERS = 16
EXPERTS = 64
TOP_K = 8
MOE_INTER = 1024
HEADS = 16
VOCAB = 50304
STD = 0.02
POOL = 1 << 26
ROUTER_BIAS = 0.03  # see --router-bias and docs/benchmarks.md
EMBED_RMS = 4.0     # see --embed-rms

REPO = Path(__file__).resolve().parent.parent


def bf16_bytes(a: np.ndarray) -> bytes:
    """Round-to-nearest-even f32 -> bf16 (as torch does), little-endian bytes."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return rounded.astype(np.uint16).tobytes()


class Pool:
    """A seeded pool of N(0, STD^2) bf16 values; tensors are windows at random offsets."""

    def __init__(self, rng: np.random.Generator):
        vals = rng.standard_normal(POOL, dtype=np.float32) * STD
        self.bits = np.frombuffer(bf16_bytes(vals), dtype=np.uint16)
        self.bits = np.concatenate([self.bits, self.bits])  # windows may wrap
        self.rng = rng

    def window(self, count: int) -> bytes:
        assert count <= POOL
        start = int(self.rng.integers(0, POOL))
        return self.bits[start:start + count].tobytes()


def tensor_plan(layers: int, vocab: int) -> list[tuple[str, list[int]]]:
    """(name, shape) of every tensor, in file order (by layer, as transformers saves)."""
    plan = [("model.embed_tokens.weight", [vocab, HIDDEN])]
    for l in range(layers):
        p = f"model.layers.{l}."
        plan += [(p + "input_layernorm.weight", [HIDDEN]),
                 (p + "post_attention_layernorm.weight", [HIDDEN]),
                 (p + "self_attn.q_proj.weight", [HIDDEN, HIDDEN]),
                 (p + "self_attn.k_proj.weight", [HIDDEN, HIDDEN]),
                 (p + "self_attn.v_proj.weight", [HIDDEN, HIDDEN]),
                 (p + "self_attn.o_proj.weight", [HIDDEN, HIDDEN]),
                 (p + "self_attn.q_norm.weight", [HIDDEN]),
                 (p + "self_attn.k_norm.weight", [HIDDEN]),
                 (p + "mlp.gate.weight", [EXPERTS, HIDDEN])]
        for e in range(EXPERTS):
            q = f"{p}mlp.experts.{e}."
            plan += [(q + "gate_proj.weight", [MOE_INTER, HIDDEN]),
                     (q + "up_proj.weight", [MOE_INTER, HIDDEN]),
                     (q + "down_proj.weight", [HIDDEN, MOE_INTER])]
    plan += [("model.norm.weight", [HIDDEN]), ("lm_head.weight", [vocab, HIDDEN])]
    return plan


def shard_of(name: str, layers_per_shard: int) -> int:
    """Shard index: embeddings in shard 0, layer l in shard l // layers_per_shard, the head last."""
    if name.startswith("model.layers."):
        return int(name.split(".")[2]) // layers_per_shard
    return 0 if name.startswith("model.embed_tokens") else -1


def mean_direction(seed: int) -> np.ndarray:
    """The unit vector m_hat shared by the embeddings and the routers."""
    m = np.random.default_rng([seed, 7]).standard_normal(HIDDEN, dtype=np.float32)
    return m / np.linalg.norm(m)


class Writer:
    """Produces each tensor's bf16 bytes on demand, one tensor in memory at a time."""

    def __init__(self, rng: np.random.Generator, vocab: int, seed: int, router_bias: float, embed_rms: float):
        self.rng = rng
        self.embed_rms = embed_rms
        self.seed = seed
        self.router_bias = router_bias
        self.pool = Pool(rng)
        self.vocab = vocab
        self.mean_dir = mean_direction(seed)

    def embeddings(self, vocab: int) -> bytes:
        """[vocab, HIDDEN]: noise of RMS embed_rms plus sqrt(HIDDEN) * m_hat (a shared
        direction of RMS 1, the anisotropy of trained LMs). Its own seeded stream, so --rewrite-routers can redo it."""
        rng = np.random.default_rng([self.seed, 5])
        out = bytearray()
        for start in range(0, vocab, 4096):
            x = rng.standard_normal((min(4096, vocab - start), HIDDEN), dtype=np.float32) * self.embed_rms
            x += self.mean_dir * np.sqrt(HIDDEN)
            out += bf16_bytes(x)
        return bytes(out)

    def router(self, layer: int) -> bytes:
        """Layer `layer`'s router [EXPERTS, HIDDEN]: N(0, STD^2) plus router_bias * b_e * m_hat,
        with b_e = 1.5 / sqrt(rank) (centred) over a random expert order: a Zipf-like
        popularity that is stable over tokens. Its own seeded stream, like embeddings()."""
        rng = np.random.default_rng([self.seed, 1000 + layer])
        order = rng.permutation(EXPERTS)
        b = np.empty(EXPERTS, dtype=np.float32)
        b[order] = 1.5 / np.sqrt(np.arange(1, EXPERTS + 1, dtype=np.float32))
        b -= b.mean()
        w = rng.standard_normal((EXPERTS, HIDDEN), dtype=np.float32) * STD
        w += b[:, None] * self.mean_dir[None, :] * self.router_bias
        return bf16_bytes(w)

    def bytes_of(self, name: str, shape: list[int]) -> bytes:
        count = int(np.prod(shape))
        if name.endswith("norm.weight"):
            return bf16_bytes(np.ones(count, dtype=np.float32))
        if name == "model.embed_tokens.weight":
            return self.embeddings(shape[0])
        if name.endswith("mlp.gate.weight"):
            return self.router(int(name.split(".")[2]))
        if count > POOL:  # lm_head: fresh normals, in chunks
            out = bytearray()
            for start in range(0, shape[0], 4096):
                rows = min(4096, shape[0] - start)
                out += bf16_bytes(self.rng.standard_normal((rows, shape[1]), dtype=np.float32) * STD)
            return bytes(out)
        return self.pool.window(count)


def rewrite_routers(folder: Path, writer: Writer) -> None:
    """Overwrites the embeddings and every mlp.gate.weight in place (same shapes and
    dtype), to tune the routing structure without rewriting 13 GB."""
    for shard in sorted(folder.glob("model-*.safetensors")):
        with open(shard, "r+b") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
            for name, info in header.items():
                if name.endswith("mlp.gate.weight"):
                    data = writer.router(int(name.split(".")[2]))
                elif name == "model.embed_tokens.weight":
                    data = writer.embeddings(info["shape"][0])
                else:
                    continue
                f.seek(8 + n + info["data_offsets"][0])
                f.write(data)
    print(f"rewrote the embeddings and routers of {folder} (router bias {writer.router_bias})")



def write_shard(path: Path, entries: list[tuple[str, list[int]]], writer: Writer) -> None:
    """Streams one safetensors file: header with every offset, then the tensors in order."""
    header, offset = {}, 0
    for name, shape in entries:
        nbytes = int(np.prod(shape)) * 2
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    header["__metadata__"] = {"format": "pt", "note": "charm synthetic OLMoE: RANDOM weights"}
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for name, shape in entries:
            data = writer.bytes_of(name, shape)
            assert len(data) == int(np.prod(shape)) * 2, name
            f.write(data)
    os.replace(tmp, path)


def cut_tokenizer(tokenizer: dict, tokenizer_config: dict, vocab: int) -> tuple[dict, dict, int]:
    """The fixture's byte-level BPE cut to `vocab` ids: the first vocab - len(added_tokens)
    base tokens (BPE ids follow merge order, so every kept token's merges are kept), the
    merges whose parts and result are all kept, and the added tokens renumbered after
    them. Returns (tokenizer.json, tokenizer_config.json, the new id of <|endoftext|>,
    the fixture's EOS). Raises ValueError when vocab cannot hold the added tokens and the 256 bytes."""
    added = tokenizer["added_tokens"]
    base = vocab - len(added)
    if base < 256:
        raise ValueError(f"vocab {vocab} leaves {base} base tokens: fewer than the 256 byte tokens")
    tok = json.loads(json.dumps(tokenizer))
    model = tok["model"]
    model["vocab"] = {t: i for t, i in model["vocab"].items() if i < base}
    kept = model["vocab"]

    def parts(m):
        return m.split(" ", 1) if isinstance(m, str) else m
    model["merges"] = [m for m in model["merges"] if all(p in kept for p in parts(m)) and "".join(parts(m)) in kept]
    renumber = {a["id"]: base + i for i, a in enumerate(added)}
    for a in tok["added_tokens"]:
        a["id"] = renumber[a["id"]]
    cfg = json.loads(json.dumps(tokenizer_config))
    cfg["added_tokens_decoder"] = {str(renumber[int(k)]): v for k, v in tokenizer_config["added_tokens_decoder"].items()}
    eos = next(a["id"] for a in tok["added_tokens"] if a["content"] == "<|endoftext|>")
    return tok, cfg, eos


def write_tokenizer(out: Path, vocab: int) -> None:
    """tokenizer.json, tokenizer_config.json and generation_config.json into out, and the
    EOS / pad ids into its config.json (written first)."""
    src = REPO / "tests/fixtures/tokenizer"
    tok, cfg, eos = cut_tokenizer(json.loads((src / "tokenizer.json").read_text()),
                                  json.loads((src / "tokenizer_config.json").read_text()), vocab)
    (out / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False) + "\n")
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, ensure_ascii=False, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}) + "\n")
    model_config = json.loads((out / "config.json").read_text())
    model_config.update(eos_token_id=eos, pad_token_id=eos)
    (out / "config.json").write_text(json.dumps(model_config, indent=2) + "\n")


def config(layers: int, vocab: int) -> dict:
    return {
        "architectures": ["OlmoeForCausalLM"], "model_type": "olmoe",
        "attention_bias": False, "attention_dropout": 0.0, "clip_qkv": None,
        "bos_token_id": None, "eos_token_id": None, "pad_token_id": None,  # set by write_tokenizer
        "hidden_act": "silu", "hidden_size": HIDDEN, "intermediate_size": MOE_INTER,
        "initializer_range": STD, "max_position_embeddings": 4096,
        "norm_topk_prob": False, "num_attention_heads": HEADS, "num_key_value_heads": HEADS,
        "num_experts": EXPERTS, "num_experts_per_tok": TOP_K, "num_hidden_layers": layers,
        "output_router_logits": False, "rms_norm_eps": 1e-5, "rope_scaling": None,
        "rope_theta": 10000.0, "router_aux_loss_coef": 0.01, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "use_cache": True, "vocab_size": vocab,
        "charm_note": "synthetic: OLMoE-1B-7B shapes, RANDOM weights (scripts/make_synthetic_olmoe.py)",
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path.home() / ".cache/charm/synthetic-olmoe")
    ap.add_argument("--layers", type=int, default=LAYERS)
    ap.add_argument("--vocab", type=int, default=VOCAB)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers-per-shard", type=int, default=2)
    ap.add_argument("--router-bias", type=float, default=ROUTER_BIAS,
                    help="strength of the routers' shared popularity component (0: unstructured)")
    ap.add_argument("--embed-rms", type=float, default=EMBED_RMS,
                    help="RMS of the token-specific part of the embeddings (the shared part has RMS 1)")
    ap.add_argument("--rewrite-routers", action="store_true",
                    help="only overwrite the embeddings and routers of an existing checkpoint")
    ap.add_argument("--tokenizer-only", action="store_true",
                    help="only rewrite the tokenizer files of an existing checkpoint (cut to --vocab)")
    args = ap.parse_args()
    if args.tokenizer_only:
        write_tokenizer(args.out, args.vocab)
        return 0
    if args.rewrite_routers:
        rewrite_routers(args.out, Writer(np.random.default_rng(args.seed), args.vocab, args.seed, args.router_bias,
                                         args.embed_rms))
        return 0

    plan = tensor_plan(args.layers, args.vocab)
    need = sum(int(np.prod(s)) * 2 for _, s in plan)
    args.out.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(args.out).free
    if os.path.exists(args.out / "model.safetensors.index.json"):
        print(f"{args.out}: already written (delete the folder to rewrite)")
        return 0
    if free < need + (4 << 30):
        print(f"{args.out}: needs {need / 1e9:.1f} GB plus 4 GB headroom, {free / 1e9:.1f} GB free", file=sys.stderr)
        return 1

    rng = np.random.default_rng(args.seed)
    writer = Writer(rng, args.vocab, args.seed, args.router_bias, args.embed_rms)
    shards: dict[int, list] = {}
    for name, shape in plan:
        shards.setdefault(shard_of(name, args.layers_per_shard), []).append((name, shape))
    order = sorted(k for k in shards if k >= 0) + ([-1] if -1 in shards else [])
    total = len(order)
    weight_map = {}
    for i, key in enumerate(order):
        fname = f"model-{i + 1:05d}-of-{total:05d}.safetensors"
        print(f"writing {fname} ({len(shards[key])} tensors)", flush=True)
        write_shard(args.out / fname, shards[key], writer)
        for name, _ in shards[key]:
            weight_map[name] = fname
    (args.out / "config.json").write_text(json.dumps(config(args.layers, args.vocab), indent=2) + "\n")
    write_tokenizer(args.out, args.vocab)
    # The index last: its presence marks a complete checkpoint.
    index = {"metadata": {"total_size": need}, "weight_map": weight_map}
    (args.out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    print(f"wrote {args.out}: {need / 1e9:.2f} GB, {args.layers} layers, vocab {args.vocab}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
