#!/usr/bin/env python3
"""Checks charm against transformers on the converted demo checkpoint (docs/models.md).

For each prompt (wrapped in the checkpoint's chat template) this runs
`charm run --chat --temperature 0 --logits-out ... --ids-out ...` with the given topology
(single node by default; the cluster config needs its workers running) and
transformers' Qwen2MoeForCausalLM in float32 (eager attention and experts) on the same
prompt ids, then prints:

  - whether transformers' tokenizer + chat template give charm's prompt ids,
  - max |charm logit - transformers logit| after the prompt, and whether the argmax agrees,
  - greedy agreement: how many of the first N generated tokens are identical, charm's
    greedy continuation against transformers' generate(do_sample=False) (KV cache) and
    against an argmax loop of full forward passes without a cache, and
  - the smallest gap between the k-th and (k+1)-th router logit transformers saw. The
    demo's routers are scaled to a logit spread of 1e-3 (docs/models.md), so these gaps
    reach 1e-8: f32 rounding (torch's own cached vs uncached paths included) can swap an
    expert, and greedy paths may part after a few tokens although the logits agree.

Usage:
  scripts/check_demo.py [--config configs/demo-single-node.yaml] [--charm build/charm]
                        [--max-new 32] [PROMPT ...]
Needs torch and transformers (a reference check, never needed to serve).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
PROMPTS = ["What is the capital of France?",
           "Write a Python function that checks whether a number is prime."]


def model_dir(config: Path) -> Path:
    """The checkpoint directory a topology YAML names (relative to the YAML's folder)."""
    import yaml
    model = Path(yaml.safe_load(config.read_text())["model"])
    return model if model.is_absolute() else (config.parent / model).resolve()


def run_charm(charm: Path, config: Path, prompt: str, max_new: int, tmp: Path) -> tuple[dict, np.ndarray]:
    """charm's prompt/new token ids and first-step logits for one chat prompt."""
    ids_path, logits_path = tmp / "ids.json", tmp / "logits.f32"
    subprocess.run([str(charm), "run", "--config", str(config), "--chat", "--temperature", "0",
                    "--max-tokens", str(max_new), "--ids-out", str(ids_path),
                    "--logits-out", str(logits_path), prompt],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return json.loads(ids_path.read_text()), np.fromfile(logits_path, dtype="<f4")


def agreement(a: list[int], b: list[int]) -> tuple[int, int]:
    """(tokens compared, length of the common prefix)."""
    n = min(len(a), len(b))
    return n, next((i for i in range(n) if a[i] != b[i]), n)


class RouterMargins:
    """Forward hooks on every mlp.gate: the smallest k-th minus (k+1)-th router logit."""

    def __init__(self, model):
        self.smallest = float("inf")
        self.handles = [layer.mlp.gate.register_forward_hook(self._hook) for layer in model.model.layers]

    def _hook(self, module, _inputs, output):
        ordered = output[0].sort(dim=-1, descending=True).values
        k = module.top_k
        self.smallest = min(self.smallest, float((ordered[:, k - 1] - ordered[:, k]).min()))

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, default=REPO / "configs" / "demo-single-node.yaml")
    ap.add_argument("--charm", type=Path, default=REPO / "build" / "charm")
    ap.add_argument("--max-new", type=int, default=32)
    ap.add_argument("prompts", nargs="*", default=PROMPTS)
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    torch.set_num_threads(2)
    ckpt = model_dir(args.config)
    tok = AutoTokenizer.from_pretrained(ckpt)
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32, attn_implementation="eager",
                                                 experts_implementation="eager").eval()
    eos = model.generation_config.eos_token_id
    print(f"checkpoint {ckpt} ({model.config.architectures[0]}, top-{model.config.num_experts_per_tok}); "
          f"charm topology {args.config.name}")
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for prompt in args.prompts:
            ids, charm_logits = run_charm(args.charm, args.config, prompt, args.max_new, Path(tmp))
            prompt_ids, charm_new = ids["prompt_ids"], ids["new_ids"]
            hf_ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                             tokenize=True, return_dict=True)["input_ids"]
            with torch.no_grad():
                inp = torch.tensor([prompt_ids])
                ref_logits = model(inp).logits[0, -1].numpy()
                gen = model.generate(inp, attention_mask=torch.ones_like(inp), generation_config=GenerationConfig(
                    do_sample=False, max_new_tokens=args.max_new, eos_token_id=eos, pad_token_id=eos[-1] if
                    isinstance(eos, list) else eos))
            ref_new = gen[0, len(prompt_ids):].tolist()
            seq, margins = list(prompt_ids), RouterMargins(model)
            with torch.no_grad():
                for _ in range(args.max_new):
                    nxt = int(model(torch.tensor([seq]), use_cache=False).logits[0, -1].argmax())
                    seq.append(nxt)
                    if nxt in (eos if isinstance(eos, list) else [eos]):
                        break
            margins.remove()
            nocache_new = seq[len(prompt_ids):]
            diff = float(np.abs(charm_logits - ref_logits).max())
            worst = max(worst, diff)
            n, same = agreement(charm_new, ref_new)
            n2, same2 = agreement(charm_new, nocache_new)
            print(f"\nprompt: {prompt!r}")
            print(f"  prompt ids: {len(prompt_ids)}, transformers' chat template + tokenizer give the same ids: "
                  f"{hf_ids == prompt_ids}")
            print(f"  first-step logits: max |charm - transformers| = {diff:.3g}, argmax charm {int(charm_logits.argmax())}"
                  f" / transformers {int(ref_logits.argmax())}")
            print(f"  greedy: first {same} of {n} tokens identical to transformers generate(), first {same2} of "
                  f"{n2} to its no-cache loop; smallest router k/k+1 gap {margins.smallest:.2g}")
            print(f"  charm:                  {tok.decode(charm_new)!r}")
            if same < n:
                print(f"  transformers generate:  {tok.decode(ref_new)!r}")
            if same2 < n2:
                print(f"  transformers no-cache:  {tok.decode(nocache_new)!r}")
    print(f"\nmax |logit diff| over prompts: {worst:.3g}")


if __name__ == "__main__":
    sys.exit(main())
