#!/usr/bin/env python3
"""Generate the sampler fixture: penalties and logprobs from the reference implementations.

Writes tests/fixtures/sampler/cases.json, which tests/unit/test_sampler.cpp reads (so the
test needs no torch). Each case has fixed random f32 logits [vocab] (some ids masked to
-inf, some logits tied on purpose), a prompt and a generated token history, penalty
values, and:

  penalized   the logits after, in vLLM's order (vllm/model_executor/layers/utils.py,
              apply_penalties): transformers' RepetitionPenaltyLogitsProcessor over
              prompt + generated, then OpenAI's frequency and presence penalties over the
              generated tokens. transformers has no frequency/presence processor, so those
              two are the written formula (logit -= frequency_penalty * count, then
              logit -= presence_penalty * (count > 0)) computed in numpy float32, and
              checked here against the same formula in torch float32 tensors as vLLM
              writes it.
  logprobs    torch.log_softmax of the RAW logits (f32), every id (-inf kept as null).
  order       every id by raw logit, most likely first, ties lower id first (the order
              charm's top_logprobs use; torch.topk does not define its ties).

Floats are written as the exact decimal of their f32 value (Python's repr of the double),
so the C++ side reads back the same bits.

Usage: python3 scripts/gen_sampler_cases.py   (seconds; needs numpy, torch, transformers)
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "tests" / "fixtures" / "sampler" / "cases.json"
COMMAND = "python3 scripts/gen_sampler_cases.py"
SEED = 1234

# name, vocab, logit scale, logit offset, repetition, frequency, presence, prompt length,
# generated length, masked ids, tied groups
CASES = [
    ("small_ties_masked", 64, 2.0, 0.0, 1.3, 0.5, -0.7, 12, 20, 4, 3),
    ("typical", 512, 3.0, 0.0, 1.1, 0.3, 0.2, 40, 30, 8, 4),
    ("boosting", 512, 3.0, -1.0, 0.8, -1.5, 2.0, 25, 25, 0, 2),
    ("repetition_only", 256, 2.5, 0.5, 1.05, 0.0, 0.0, 30, 10, 2, 2),
    ("openai_only", 256, 2.5, 0.0, 1.0, 2.0, -2.0, 0, 40, 2, 0),
    ("wide_vocab", 2048, 2.0, 0.0, 1.2, 0.1, 0.1, 64, 64, 16, 8),
    ("peaked", 1024, 6.0, 10.0, 1.5, 1.0, 1.0, 16, 16, 0, 0),
]


def penalize_reference(logits: np.ndarray, prompt: list[int], generated: list[int], rep: float, freq: float,
                       pres: float) -> np.ndarray:
    scores = torch.from_numpy(logits.copy()).unsqueeze(0)
    history = prompt + generated
    if history:
        ids = torch.tensor([history], dtype=torch.long)
        scores = RepetitionPenaltyLogitsProcessor(penalty=rep)(ids, scores)
    out = scores.squeeze(0).numpy().astype(np.float32).copy()
    counts = np.bincount(np.array(generated, dtype=np.int64), minlength=len(logits)).astype(np.float32)
    numpy_out = out.copy()
    numpy_out -= np.float32(freq) * counts
    numpy_out -= np.float32(pres) * (counts > 0).astype(np.float32)
    # The same formula on f32 tensors, as vLLM applies it to its logits.
    t = torch.from_numpy(out.copy()).unsqueeze(0)
    bins = torch.from_numpy(counts.astype(np.int64)).unsqueeze(0)
    t -= torch.tensor([freq], dtype=torch.float32).unsqueeze(1) * bins
    t -= torch.tensor([pres], dtype=torch.float32).unsqueeze(1) * (bins > 0)
    torch_out = t.squeeze(0).numpy()
    assert np.array_equal(numpy_out.view(np.uint32), torch_out.view(np.uint32)), "numpy and torch formulas differ"
    return numpy_out


def f32_list(values: np.ndarray) -> list:
    return [None if math.isinf(float(v)) and v < 0 else float(v) for v in values.astype(np.float32)]


def main() -> None:
    torch.set_num_threads(1)
    rng = np.random.default_rng(SEED)
    cases = []
    worst = 0.0
    for name, vocab, scale, offset, rep, freq, pres, n_prompt, n_gen, n_masked, n_ties in CASES:
        logits = (rng.standard_normal(vocab) * scale + offset).astype(np.float32)
        # Ties: a few groups of ids share one logit (the ordering rule must show).
        for _ in range(n_ties):
            group = rng.choice(vocab, size=3, replace=False)
            logits[group] = logits[group[0]]
        masked = sorted(int(i) for i in rng.choice(vocab, size=n_masked, replace=False)) if n_masked else []
        logits[masked] = -np.inf
        # Histories drawn from a small pool so that ids repeat (counts > 1), with masked ids
        # among them (a penalty must leave -inf alone).
        pool = rng.choice(vocab, size=max(4, (n_prompt + n_gen) // 3), replace=False).tolist() + masked[:1]
        prompt = [int(rng.choice(pool)) for _ in range(n_prompt)]
        generated = [int(rng.choice(pool)) for _ in range(n_gen)]
        penalized = penalize_reference(logits, prompt, generated, rep, freq, pres)
        logprobs = torch.log_softmax(torch.from_numpy(logits.copy()), dim=-1).numpy()
        shifted = logits.astype(np.float64) - np.max(logits)
        exact = shifted - np.log(np.sum(np.exp(shifted)))
        finite = np.isfinite(logits)
        worst = max(worst, float(np.max(np.abs(logprobs[finite].astype(np.float64) - exact[finite]))))
        order = sorted(range(vocab), key=lambda i: (-float(logits[i]), i))
        cases.append({
            "name": name,
            "vocab": vocab,
            "repetition_penalty": rep,
            "frequency_penalty": freq,
            "presence_penalty": pres,
            "prompt": prompt,
            "generated": generated,
            "logits": f32_list(logits),
            "penalized": f32_list(penalized),
            "logprobs": f32_list(logprobs),
            "order": order,
        })
    doc = {
        "generated_by": COMMAND,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "torch_log_softmax_max_abs_error_vs_float64": worst,
        "cases": cases,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
    print(f"wrote {OUT} ({len(cases)} cases); torch.log_softmax vs float64: max abs error {worst:.3g}")


if __name__ == "__main__":
    main()
