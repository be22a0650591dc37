#!/usr/bin/env python3
"""Measures a moefy checkpoint against its dense source with transformers itself.

On held-out text (stdlib documents that calibration never saw, see moefy.text_sources):
  - perplexity of the dense GGUF model (dequantised, float32, Qwen2ForCausalLM) and of the
    MoE checkpoint (AutoModelForCausalLM, computed in float32 from its bf16 weights) at
    each top-k in --top-k;
  - agreement of the MoE's greedy next token with the dense model's;
  - routing concentration: per layer, the share of expert selections served by the
    hottest 10% of experts (ceil(0.1 * E)), averaged and worst over layers.
Then five plain prompts answered by the MoE (greedy, chat template) at --answer-k.

Usage
  scripts/moefy_eval.py --moe DIR --gguf FILE [--top-k 2 4 8 16] [--seqs 10]
                        [--seq-len 512] [--answer-k 8] [--json OUT.json]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import moefy  # noqa: E402

PROMPTS = [
    "Hello! How are you today?",
    "What is the capital of France?",
    "Write a Python function that checks whether a number is prime.",
    "Translate into French: The weather is nice today and I am going for a walk.",
    "List five fruits that are red.",
]


def score(model, ids: np.ndarray, label: str):
    """(mean NLL in nats, greedy next tokens int64 [S, L-1]) of model on ids [S, L]."""
    nll, n, greedy = 0.0, 0, []
    with torch.no_grad():
        for s in range(len(ids)):
            x = torch.from_numpy(ids[s:s + 1])
            logits = model(input_ids=x).logits[0, :-1].float()
            target = x[0, 1:]
            nll += float(torch.nn.functional.cross_entropy(logits, target, reduction="sum"))
            n += target.numel()
            greedy.append(logits.argmax(-1).numpy())
            moefy.progress(label, s + 1, len(ids))
    return nll / n, np.stack(greedy)


def set_top_k(model, k: int) -> None:
    """Changes num_experts_per_tok of every MoE block in place."""
    model.config.num_experts_per_tok = k
    for layer in model.model.layers:
        layer.mlp.gate.top_k = k


def routing_recorder(model):
    """Hooks every router; returns (counts list [layers] of int64 [E], remove())."""
    n_exp = model.config.num_experts
    counts = [np.zeros(n_exp, np.int64) for _ in model.model.layers]

    def hook(i):
        def fn(_mod, _inp, out):
            idx = out[2].reshape(-1).numpy()
            counts[i] += np.bincount(idx, minlength=n_exp)
        return fn
    handles = [layer.mlp.gate.register_forward_hook(hook(i))
               for i, layer in enumerate(model.model.layers)]
    return counts, lambda: [h.remove() for h in handles]


def concentration(counts) -> dict:
    """Share of selections served by the hottest ceil(10%) experts, per layer stats."""
    shares = []
    for c in counts:
        hot = max(1, math.ceil(0.1 * len(c)))
        shares.append(float(np.sort(c)[::-1][:hot].sum() / max(c.sum(), 1)))
    n_hot = max(1, math.ceil(0.1 * len(counts[0])))
    return {"hot_experts": n_hot, "uniform_share": n_hot / len(counts[0]),
            "mean_share": float(np.mean(shares)), "max_share": float(np.max(shares)),
            "min_share": float(np.min(shares)), "per_layer": shares}


def answer(model, tok, prompt: str, max_new: int) -> str:
    """Greedy chat answer through the checkpoint's own chat template."""
    enc = tok.apply_chat_template([{"role": "user", "content": prompt}],
                                  add_generation_prompt=True, return_tensors="pt",
                                  return_dict=True)
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=max_new, do_sample=False,
                             repetition_penalty=1.0, top_p=None, top_k=None,
                             temperature=None)
    return tok.decode(out[0][enc["input_ids"].shape[1]:], skip_special_tokens=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--moe", type=Path, required=True)
    ap.add_argument("--gguf", type=Path, required=True)
    ap.add_argument("--top-k", type=int, nargs="*", default=[2, 4, 8, 16],
                    help="top-k values to score; none: answers only")
    ap.add_argument("--dense-answers", action="store_true",
                    help="also answer the prompts with the dense model, for reference")
    ap.add_argument("--seqs", type=int, default=10)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--answer-k", type=int, default=8)
    ap.add_argument("--max-new", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(args.moe))
    _, held = moefy.text_sources()
    ids = moefy.token_chunks(tok, held, args.seqs, args.seq_len, seed=2)
    result = {"held_out_tokens": int(ids.shape[0] * (ids.shape[1] - 1)), "rows": []}

    t0 = time.time()
    hp, tensors, _ = moefy.load_dense(args.gguf)
    dense = moefy.dense_hf_model(hp, tensors)
    if args.top_k:
        d_nll, d_greedy = score(dense, ids, "dense")
        result["rows"].append({"model": "dense", "ppl": math.exp(d_nll)})
        print(f"dense ppl {math.exp(d_nll):.3f} ({time.time() - t0:.0f}s)", flush=True)
    if args.dense_answers:
        result["dense_answers"] = [{"prompt": p, "answer": answer(dense, tok, p, args.max_new)}
                                   for p in PROMPTS]
        for item in result["dense_answers"]:
            print(f"\n[dense] >>> {item['prompt']}\n{item['answer']}", flush=True)
    del dense, tensors

    moe = AutoModelForCausalLM.from_pretrained(str(args.moe), dtype=torch.float32)
    moe.eval()
    for k in args.top_k:
        set_top_k(moe, k)
        counts, remove = routing_recorder(moe)
        nll, greedy = score(moe, ids, f"moe top-{k}")
        remove()
        row = {"model": f"moe top-{k}", "top_k": k, "ppl": math.exp(nll),
               "greedy_agreement": float((greedy == d_greedy).mean()),
               "concentration": concentration(counts)}
        result["rows"].append(row)
        print(f"top-{k}: ppl {row['ppl']:.3f} agreement {row['greedy_agreement']:.4f} "
              f"hot-10% share {row['concentration']['mean_share']:.3f} "
              f"(max {row['concentration']['max_share']:.3f})", flush=True)

    set_top_k(moe, args.answer_k)
    result["answers"] = {"top_k": args.answer_k, "items": []}
    for p in PROMPTS:
        a = answer(moe, tok, p, args.max_new)
        result["answers"]["items"].append({"prompt": p, "answer": a})
        print(f"\n>>> {p}\n{a}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
