#!/usr/bin/env python3
"""The demo model as a GGUF file, served through two workers, against its safetensors
checkpoint on one node (issue 15; the record is in docs/benchmarks.md).

Convert the demo checkpoint with llama.cpp's own converter first (its Python needs torch
and transformers, e.g. the venv scripts/bench_llamacpp.py makes), and optionally quantise
it with llama-quantize:
  python3 LLAMA_CPP/convert_hf_to_gguf.py models/qwen2.5-0.5b-moe/checkpoint \\
      --outtype bf16 --outfile demo-bf16.gguf
  llama-quantize demo-bf16.gguf demo-q4_k_m.gguf Q4_K_M
then:
  scripts/check_demo_gguf.py --gguf demo-bf16.gguf [--gguf demo-q4_k_m.gguf ...]

For each prompt (chat template, greedy) this runs `charm run` on
  - the safetensors checkpoint, single node (the reference),
  - each GGUF through a coordinator and two `charm worker` processes (experts 0-7 and
    8-15 of every layer, read straight out of the GGUF),
  - each GGUF single node,
and prints whether the first-step logits are the same bits (sha256) and the generated
tokens the same, with each run's decode tok/s. A BF16 GGUF must match the safetensors
checkpoint exactly; a quantised one must match itself across placements (single node vs
two workers), and its difference from the checkpoint is printed. Exit 1 on a mismatch
that must not happen.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
PROMPTS = ["What is the capital of France?",
           "Write a Python function that checks whether a number is prime.",
           "Name three colours of the rainbow."]


def topology(model: Path, ports: tuple[int, int] | None) -> str:
    text = f"model: {model}\nmodel_name: demo\n"
    if ports is None:
        return text + "mode: single-node\n"
    return text + ("mode: cluster\ntimeouts: {connect_ms: 5000, startup_ms: 300000}\nworkers:\n"
                   f"  - {{name: w0, host: 127.0.0.1, port: {ports[0]}, experts: '0-7'}}\n"
                   f"  - {{name: w1, host: 127.0.0.1, port: {ports[1]}, experts: '8-15'}}\n")


def run(charm: Path, config: Path, prompt: str, max_new: int, tmp: Path) -> dict:
    ids, logits, stats = tmp / "ids.json", tmp / "logits.f32", tmp / "stats.json"
    subprocess.run([str(charm), "run", "--config", str(config), "--chat", "--temperature", "0", "--max-tokens",
                    str(max_new), "--ids-out", str(ids), "--logits-out", str(logits), "--stats-json", str(stats),
                    prompt], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=1800)
    raw = logits.read_bytes()
    return {"sha": hashlib.sha256(raw).hexdigest()[:16], "logits": np.frombuffer(raw, dtype="<f4"),
            "new": json.loads(ids.read_text())["new_ids"],
            "tok_s": json.loads(stats.read_text()).get("decode_tokens_per_s", 0.0)}


class Workers:
    """Two `charm worker` processes of `config`, stopped on exit."""

    def __init__(self, charm: Path, config: Path):
        self.procs = [subprocess.Popen([str(charm), "worker", "--config", str(config), "--name", name],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for name in ("w0", "w1")]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            p.wait(timeout=60)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", type=Path, action="append", required=True, help="a GGUF of the demo model (repeatable)")
    ap.add_argument("--checkpoint", type=Path, default=REPO / "models" / "qwen2.5-0.5b-moe" / "checkpoint")
    ap.add_argument("--charm", type=Path, default=REPO / "build" / "charm")
    ap.add_argument("--max-new", type=int, default=16)
    ap.add_argument("--ports", default="7781,7782")
    ap.add_argument("prompts", nargs="*", default=PROMPTS)
    args = ap.parse_args()
    ports = tuple(int(p) for p in args.ports.split(","))
    bad = 0
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        st = tmp / "st.yaml"
        st.write_text(topology(args.checkpoint.resolve(), None))
        reference = {p: run(args.charm, st, p, args.max_new, tmp) for p in args.prompts}
        print(f"reference: {args.checkpoint} (safetensors), single node")
        for p, r in reference.items():
            print(f"  {p!r}: logits {r['sha']}, {len(r['new'])} tokens, {r['tok_s']:.1f} tok/s")
        for gguf in args.gguf:
            single, cluster = tmp / "single.yaml", tmp / "cluster.yaml"
            single.write_text(topology(gguf.resolve(), None))
            cluster.write_text(topology(gguf.resolve(), ports))
            lossless = "bf16" in gguf.name.lower() or "f32" in gguf.name.lower()
            print(f"\n{gguf.name} ({'lossless: must equal the safetensors' if lossless else 'quantised'})")
            with Workers(args.charm, cluster):
                time.sleep(1)
                two = {p: run(args.charm, cluster, p, args.max_new, tmp) for p in args.prompts}
            one = {p: run(args.charm, single, p, args.max_new, tmp) for p in args.prompts}
            for p in args.prompts:
                r, a, b = reference[p], two[p], one[p]
                same_placement = a["sha"] == b["sha"] and a["new"] == b["new"]
                same_as_reference = a["sha"] == r["sha"] and a["new"] == r["new"]
                diff = float(np.abs(a["logits"] - r["logits"]).max())
                agree = next((i for i in range(min(len(a["new"]), len(r["new"]))) if a["new"][i] != r["new"][i]),
                             min(len(a["new"]), len(r["new"])))
                print(f"  {p!r}: two workers {a['sha']} ({a['tok_s']:.1f} tok/s), single node {b['sha']} "
                      f"({b['tok_s']:.1f} tok/s): placement {'same bits' if same_placement else 'DIFFERS'}; "
                      f"vs safetensors: {'same bits and tokens' if same_as_reference else f'max |dlogit| {diff:.3g}, first {agree} tokens equal'}")
                bad += not same_placement or (lossless and not same_as_reference)
    print("\nOK" if not bad else f"\n{bad} mismatches")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
