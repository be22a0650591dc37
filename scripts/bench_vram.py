#!/usr/bin/env python3
"""The VRAM expert tier's benchmark (issue 19; run on a machine with a CUDA GPU, by
scripts/gpu_check.sh): the synthetic OLMoE-1B-7B-shaped checkpoint (make_synthetic_olmoe.py,
numpy only) served single node by `charm run`, alternating, with every expert in RAM (the
CPU), every expert in VRAM, and half of them in VRAM: prompt and decode tok/s and their
ratios to the CPU's. Prints a table; writes the numbers as JSON.

    python3 scripts/bench_vram.py --charm build-gpu/charm --work /tmp/bench --out OUT/bench_vram.json

Needs no network. llama.cpp's CUDA build is not run here (its source and build do not fit
a device session): compare with it by hand, as docs/benchmarks.md describes.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
from bench_util import comma_choices, log, machine, sh  # noqa: E402

# A prompt of ordinary words: its token count is whatever the synthetic tokenizer makes of
# it (charm's stats report it).
PROMPT_WORDS = ("the quick brown fox jumps over the lazy dog while a model of many experts "
                "routes every token to the few it needs ").split()


def expert_bytes(ck: Path) -> int:
    """Bytes of every routed expert tensor of the checkpoint (its safetensors headers)."""
    total = 0
    for shard in sorted(ck.glob("*.safetensors")):
        with open(shard, "rb") as f:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        for name, info in header.items():
            if ".experts." in name:
                total += info["data_offsets"][1] - info["data_offsets"][0]
    return total


def run(charm: Path, yaml: Path, prompt: str, tg: int, stats: Path, timeout: float) -> dict:
    r = sh([charm, "run", "--config", yaml, "--max-tokens", tg, "--temperature", "1", "--seed", "7",
            "--stats-json", stats, prompt], timeout)
    if r.returncode != 0:
        raise RuntimeError(f"charm run failed ({r.returncode}): {r.stderr[-2000:]}")
    s = json.loads(stats.read_text())
    return {"prompt_tokens": s["prompt_tokens"], "prompt_tok_s": s["prompt_tokens"] / (s["ttft_ms"] / 1e3),
            "decode_tok_s": s["decode_tokens_per_s"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--charm", type=Path, default=REPO / "build/charm")
    ap.add_argument("--work", type=Path, default=Path("/tmp/charm-bench-vram"))
    ap.add_argument("--layers", type=int, default=16, help="layers of the synthetic checkpoint (OLMoE-1B-7B has 16)")
    ap.add_argument("--pp", type=int, default=512, help="prompt words (about as many tokens)")
    ap.add_argument("--tg", type=int, default=128, help="generated tokens")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--configs", default="cpu,all,half",
                    help="of cpu (every expert in RAM), all (every expert in VRAM), half (half in VRAM)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    chosen = comma_choices(ap, args.configs, ["cpu", "all", "half"], "config")
    if "cpu" not in chosen:
        ap.error("--configs needs cpu: the ratios are to it")
    ck = args.work / f"synthetic-olmoe-{args.layers}l"
    if not (ck / "model.safetensors.index.json").exists():
        r = sh([sys.executable, REPO / "scripts/make_synthetic_olmoe.py", "--out", ck, "--layers", args.layers], 3600)
        if r.returncode != 0:
            raise SystemExit(f"make_synthetic_olmoe failed: {r.stderr[-2000:]}")
    experts_gib = expert_bytes(ck) / 2**30
    store = "pin: none, usage_file: none"
    every = {"cpu": ("cpu (all in RAM)", store),
             "all": ("all in VRAM", f"{store}, vram_gb: {experts_gib * 1.05 + 0.01:.3f}"),
             "half": ("half in VRAM", f"{store}, vram_gb: {experts_gib / 2:.3f}")}
    configs = dict(every[c] for c in chosen)
    prompt = " ".join(PROMPT_WORDS[i % len(PROMPT_WORDS)] for i in range(args.pp))
    results: dict[str, list[dict]] = {name: [] for name in configs}
    for rep in range(args.repeat):
        for i, (name, s) in enumerate(configs.items()):
            yaml = args.work / f"vram-{i}.yaml"
            yaml.write_text(f"model: {ck}\nmodel_name: synthetic-olmoe\nmode: single-node\nstore: {{{s}}}\n")
            results[name].append(run(args.charm, yaml, prompt, args.tg, args.work / f"stats-{i}-{rep}.json",
                                     args.timeout))
            log(f"{name}: {results[name][-1]}")
    base = {k: statistics.median(r[k] for r in results["cpu (all in RAM)"]) for k in ("prompt_tok_s", "decode_tok_s")}
    print(f"| synthetic OLMoE, {args.layers} layers, experts {experts_gib:.2f} GiB | prompt tok/s | decode tok/s "
          f"| prompt vs CPU | decode vs CPU |")
    print("|---|---|---|---|---|")
    for name, runs in results.items():
        p = statistics.median(r["prompt_tok_s"] for r in runs)
        d = statistics.median(r["decode_tok_s"] for r in runs)
        print(f"| {name} | {p:.1f} | {d:.2f} | {p / base['prompt_tok_s']:.2f}x | {d / base['decode_tok_s']:.2f}x |")
    if args.out:
        args.out.write_text(json.dumps({"machine": machine(args.work), "configs": configs, "results": results,
                                        "pp_words": args.pp, "tg": args.tg}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
