#!/usr/bin/env python3
"""Generate the tiny random MoE model fixtures and their transformers reference outputs.

Writes, under tests/fixtures/models/:

  qwen3-moe-tiny/  Qwen3MoeForCausalLM, bf16 weights with per-expert tensors in the hub
                   layout (model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight),
                   sharded in two files + model.safetensors.index.json.
  olmoe-tiny/      OlmoeForCausalLM, bf16 weights with fused 3-D expert tensors
                   (model.layers.L.mlp.experts.gate_up_proj [E, 2I, H], gate rows first,
                   and model.layers.L.mlp.experts.down_proj [E, H, I]) in one
                   model.safetensors.
  qwen2-moe-tiny/  Qwen2MoeForCausalLM: per-expert hub layout as qwen3-moe-tiny, plus the
                   gated shared expert (mlp.shared_expert.{gate,up,down}_proj.weight,
                   mlp.shared_expert_gate.weight [1, H]) and q/k/v biases.
  mixtral-tiny/    MixtralForCausalLM in Mixtral's hub names:
                   model.layers.L.block_sparse_moe.gate.weight and
                   model.layers.L.block_sparse_moe.experts.E.{w1,w3,w2}.weight (gate, up, down).

Each directory gets config.json (hub layout, as the published checkpoints spell it),
generation_config.json, tokenizer.json (relative symlink to the shared tokenizer fixture),
tokenizer_config.json, reference.json (prompts, prompt ids, 16 greedy tokens, top-1/top-2
gaps, router choices of the first prompt) and logits_<i>.f32 (the full-vocabulary logits
after the last prompt token, raw little-endian float32).

The weights are random (not trained). The reference runs in float32 on the bf16-rounded
weights, with eager attention and eager experts, so an f32 engine can match it closely.
After writing, each directory is loaded back with AutoModelForCausalLM.from_pretrained and
must reproduce the recorded logits bit for bit: that proves transformers reads the layout
written here the way it was meant.

Deterministic: weights come from a seeded torch.Generator in sorted parameter-name order,
torch runs on one thread. If a candidate seed gives a greedy step whose top-1/top-2 logit
gap is below MIN_TOP_GAP, a router choice whose k-th/(k+1)-th logit margin is below
MIN_ROUTER_MARGIN, or too few distinct experts, the next seed is tried (and printed).

Usage: python3 scripts/gen_fixtures.py [FIXTURE ...]   (default: every fixture; CPU, about a
       minute; needs torch, transformers). Naming fixtures regenerates only those.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
import transformers
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

REPO = Path(__file__).resolve().parent.parent
OUT_ROOT = REPO / "tests" / "fixtures" / "models"
TOKENIZER_DIR = REPO / "tests" / "fixtures" / "tokenizer"
QWEN25_TEMPLATE = OUT_ROOT / "chat_template_qwen2.5.jinja"
COMMAND = "python3 scripts/gen_fixtures.py"

NEW_TOKENS = 16
MIN_TOP_GAP = 1e-3          # greedy top-1 minus top-2 logit, every step
MIN_ROUTER_MARGIN = 1e-4    # k-th minus (k+1)-th router logit, every routed position
MAX_SEED_TRIES = 50
NORM_WEIGHT_SPREAD = 0.25   # RMSNorm weights ~ 1 + N(0, spread): an engine ignoring them fails
EMBED_STD = 0.5             # larger than the layer std so the vocabulary logits are peaked

QWEN3_EOS = [151645, 151643]  # <|im_end|>, <|endoftext|>
OLMOE_EOS = 151643            # <|endoftext|>; a plain int, as OLMoE's own config has it

# config.json in the layout of the published hub checkpoints (Qwen/Qwen3-30B-A3B,
# allenai/OLMoE-1B-7B-0924): top-level rope_theta, num_experts, torch_dtype.
QWEN3_CONFIG = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "decoder_sparse_step": 1,
    "eos_token_id": 151645,
    "head_dim": 16,
    "hidden_act": "silu",
    "hidden_size": 64,
    "initializer_range": 0.3,
    "intermediate_size": 128,
    "max_position_embeddings": 2048,
    "max_window_layers": 4,
    "mlp_only_layers": [1],
    "model_type": "qwen3_moe",
    "moe_intermediate_size": 32,
    "norm_topk_prob": True,
    "num_attention_heads": 4,
    "num_experts": 16,
    "num_experts_per_tok": 4,
    "num_hidden_layers": 4,
    "num_key_value_heads": 2,
    "output_router_logits": False,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.001,
    "sliding_window": None,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": transformers.__version__,
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}

OLMOE_CONFIG = {
    "architectures": ["OlmoeForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": None,
    "clip_qkv": 3.0,
    "eos_token_id": OLMOE_EOS,
    "hidden_act": "silu",
    "hidden_size": 32,
    "initializer_range": 0.3,
    "intermediate_size": 32,
    "max_position_embeddings": 4096,
    "model_type": "olmoe",
    "norm_topk_prob": False,
    "num_attention_heads": 4,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 3,
    "num_key_value_heads": 2,
    "output_router_logits": False,
    "pad_token_id": 151643,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "rope_theta": 10000.0,
    "router_aux_loss_coef": 0.01,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": transformers.__version__,
    "use_cache": True,
    "vocab_size": 151936,
}

# --- Qwen2-MoE and Mixtral (issue 4) ---------------------------------------------------
# Hub layout of Qwen/Qwen1.5-MoE-A2.7B: no qkv_bias key (transformers' default true: q/k/v
# biased), use_sliding_window false with a sliding_window value present, no head_dim.
QWEN2_MOE_CONFIG = {
    "architectures": ["Qwen2MoeForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "decoder_sparse_step": 1,
    "eos_token_id": 151643,
    "hidden_act": "silu",
    "hidden_size": 32,
    "initializer_range": 0.3,
    "intermediate_size": 96,
    "max_position_embeddings": 8192,
    "max_window_layers": 2,
    "mlp_only_layers": [1],
    "model_type": "qwen2_moe",
    "moe_intermediate_size": 16,
    "norm_topk_prob": False,
    "num_attention_heads": 4,
    "num_experts": 16,
    "num_experts_per_tok": 4,
    "num_hidden_layers": 4,
    "num_key_value_heads": 2,
    "output_router_logits": False,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.001,
    "shared_expert_intermediate_size": 48,
    "sliding_window": 32768,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": transformers.__version__,
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}

# Hub layout of mistralai/Mixtral-8x7B-v0.1: num_local_experts, experts of width
# intermediate_size, sliding_window null, rope_theta 1e6. Qwen token ids (shared tokenizer).
MIXTRAL_CONFIG = {
    "architectures": ["MixtralForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151643,
    "hidden_act": "silu",
    "hidden_size": 32,
    "initializer_range": 0.3,
    "intermediate_size": 24,
    "max_position_embeddings": 32768,
    "model_type": "mixtral",
    "num_attention_heads": 4,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 3,
    "num_key_value_heads": 2,
    "num_local_experts": 8,
    "output_router_logits": False,
    "rms_norm_eps": 1e-05,
    "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.02,
    "sliding_window": None,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": transformers.__version__,
    "use_cache": True,
    "vocab_size": 151936,
}

PROMPTS = [
    {"name": "english", "text": "The quick brown fox jumps over the lazy dog. In 2024, "
                                "the village by the sea held its 17th annual festival, and"},
    {"name": "chinese", "text": "人工智能正在改变我们的生活方式。今天天气很好，我们去公园散步吧！"},
    {"name": "code", "text": "def fibonacci(n):\n    if n < 2:\n        return n\n"
                             "    return fibonacci(n - 1) + "},
    # No system message: the Qwen2.5 template then inserts its default system prompt and
    # the Qwen3 template none, so the two templates render differently.
    {"name": "chat", "messages": [
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "The capital of France is Paris."},
        {"role": "user", "content": "And of Germany? Answer in one word."},
    ]},
    {"name": "one_token", "text": "Hello"},
]

MODELS = [
    {"dir": "qwen3-moe-tiny", "config": QWEN3_CONFIG, "eos": QWEN3_EOS, "seed": 1000,
     "expert_layout": "per_expert", "shards": 2, "template": "qwen3"},
    {"dir": "olmoe-tiny", "config": OLMOE_CONFIG, "eos": OLMOE_EOS, "seed": 2000,
     "expert_layout": "fused", "shards": 1, "template": "qwen2.5"},
    {"dir": "qwen2-moe-tiny", "config": QWEN2_MOE_CONFIG, "eos": 151643, "seed": 3000,
     "expert_layout": "per_expert", "shards": 1, "template": "qwen2.5"},
    {"dir": "mixtral-tiny", "config": MIXTRAL_CONFIG, "eos": 151643, "seed": 4000,
     "expert_layout": "mixtral", "shards": 1, "template": "qwen3"},
]

LOAD_KW = {"dtype": torch.float32, "attn_implementation": "eager",
           "experts_implementation": "eager"}


# ----------------------------------------------------------------------------- weights

def init_weights(model: torch.nn.Module, seed: int, std: float) -> None:
    """Fill every parameter from one seeded generator (sorted names, so the draw order does
    not depend on module construction order), then round to bf16 and keep as f32."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                value = 1.0 + NORM_WEIGHT_SPREAD * torch.randn(param.shape, generator=gen)
            elif "embed_tokens" in name or name.startswith("lm_head"):
                value = EMBED_STD * torch.randn(param.shape, generator=gen)
            else:
                value = std * torch.randn(param.shape, generator=gen)
            param.copy_(value.to(torch.bfloat16).to(torch.float32))


def zero_padding_rows(model: torch.nn.Module, num_tokens: int) -> None:
    """Zero the embedding / lm_head rows past the tokenizer's vocabulary (vocab_size is
    padded to 151936; the tokenizer has num_tokens ids), as trained Qwen checkpoints have
    them near zero: their logits are then 0, far below the top, so greedy never emits an
    id the tokenizer cannot decode."""
    with torch.no_grad():
        model.model.embed_tokens.weight[num_tokens:] = 0
        model.lm_head.weight[num_tokens:] = 0


def hub_state_dict(model: torch.nn.Module, layout: str) -> dict[str, torch.Tensor]:
    """The bf16 tensors to write. transformers 5 holds experts fused in memory as
    experts.gate_up_proj [E, 2I, H] (gate rows then up rows) and experts.down_proj
    [E, H, I]; 'per_expert' splits them into the hub's experts.E.{gate,up,down}_proj.weight
    ([I, H], [I, H], [H, I]); 'fused' keeps them. Tied lm_head is not written."""
    tied = model.config.tie_word_embeddings
    out: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        if tied and name == "lm_head.weight":
            continue
        t = tensor.detach().to(torch.bfloat16).contiguous()
        if layout == "per_expert" and name.endswith("mlp.experts.gate_up_proj"):
            prefix = name[: -len("gate_up_proj")]
            inter = t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"{prefix}{e}.gate_proj.weight"] = t[e, :inter].clone()
                out[f"{prefix}{e}.up_proj.weight"] = t[e, inter:].clone()
        elif layout == "per_expert" and name.endswith("mlp.experts.down_proj"):
            prefix = name[: -len("down_proj")]
            for e in range(t.shape[0]):
                out[f"{prefix}{e}.down_proj.weight"] = t[e].clone()
        elif layout == "mixtral" and ".mlp." in name:
            out.update(mixtral_hub_tensors(name, t))
        else:
            out[name] = t
    return out


def mixtral_hub_tensors(name: str, t: torch.Tensor) -> dict[str, torch.Tensor]:
    """Mixtral's hub names for one in-memory MoE tensor: transformers 5 renames
    .block_sparse_moe. to .mlp. and fuses experts.{e}.w1/w3 (gate/up) into
    experts.gate_up_proj and experts.{e}.w2 (down) into experts.down_proj on load
    (conversion_mapping.py, "mixtral"); this undoes both."""
    hub = name.replace(".mlp.", ".block_sparse_moe.")
    if hub.endswith("experts.gate_up_proj"):
        prefix = hub[: -len("gate_up_proj")]
        inter = t.shape[1] // 2
        return {**{f"{prefix}{e}.w1.weight": t[e, :inter].clone() for e in range(t.shape[0])},
                **{f"{prefix}{e}.w3.weight": t[e, inter:].clone() for e in range(t.shape[0])}}
    if hub.endswith("experts.down_proj"):
        prefix = hub[: -len("down_proj")]
        return {f"{prefix}{e}.w2.weight": t[e].clone() for e in range(t.shape[0])}
    return {hub: t}  # the router, block_sparse_moe.gate.weight


def layer_of(name: str) -> int:
    """Layer index of a tensor name, -1 for tensors before the layers, 1e9 after."""
    parts = name.split(".")
    if len(parts) > 2 and parts[1] == "layers":
        return int(parts[2])
    return -1 if "embed_tokens" in name else 10**9


def write_safetensors(tensors: dict[str, torch.Tensor], out_dir: Path, shards: int,
                      num_layers: int) -> list[str]:
    """Write one model.safetensors, or `shards` files split by layer with the hub's
    model.safetensors.index.json. Returns the file names written."""
    meta = {"format": "pt"}
    if shards == 1:
        save_file(tensors, str(out_dir / "model.safetensors"), metadata=meta)
        return ["model.safetensors"]
    assert shards == 2, "only 1 or 2 shards are implemented"
    # Embeddings and the first half of the layers in shard 1, the rest (and norm) in 2.
    cut = num_layers // 2
    names = [f"model-0000{i + 1}-of-0000{shards}.safetensors" for i in range(shards)]
    parts: list[dict[str, torch.Tensor]] = [{}, {}]
    weight_map = {}
    for key in sorted(tensors):
        idx = 0 if layer_of(key) < cut else 1
        parts[idx][key] = tensors[key]
        weight_map[key] = names[idx]
    for name, part in zip(names, parts):
        save_file(part, str(out_dir / name), metadata=meta)
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return names + ["model.safetensors.index.json"]


# ----------------------------------------------------------------------------- tokenizer

def write_tokenizer_files(out_dir: Path, template: str) -> None:
    """tokenizer.json as a relative symlink to the shared fixture; tokenizer_config.json a
    real copy, with the Qwen2.5 chat template substituted when asked."""
    link = out_dir / "tokenizer.json"
    link.symlink_to(os.path.relpath(TOKENIZER_DIR / "tokenizer.json", out_dir))
    cfg = json.loads((TOKENIZER_DIR / "tokenizer_config.json").read_text())
    if template == "qwen2.5":
        cfg["chat_template"] = QWEN25_TEMPLATE.read_text()
    (out_dir / "tokenizer_config.json").write_text(
        json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")


def encode_prompts(tok, base_tok) -> list[dict]:
    """Render and tokenize PROMPTS with the model directory's tokenizer (its own chat
    template); plain texts must tokenize identically with the shared tokenizer fixture."""
    out = []
    for p in PROMPTS:
        entry = {"name": p["name"]}
        if "messages" in p:
            text = tok.apply_chat_template(p["messages"], tokenize=False,
                                           add_generation_prompt=True)
            entry["messages"] = p["messages"]
            entry["add_generation_prompt"] = True
        else:
            text = p["text"]
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert ids == base_tok(text, add_special_tokens=False)["input_ids"], p["name"]
        entry["text"] = text
        entry["prompt_ids"] = ids
        out.append(entry)
    assert len(out[-1]["prompt_ids"]) == 1, "the one-token prompt must be one token"
    return out


# ----------------------------------------------------------------------------- reference

class RouterProbe:
    """Forward hooks on every MoE router (mlp.gate): records the selection of each call and
    the smallest k-th/(k+1)-th router-logit margin seen."""

    def __init__(self, model: torch.nn.Module):
        self.calls: list[tuple[int, torch.Tensor, torch.Tensor]] = []
        self.min_margin = float("inf")
        self.handles = []
        for idx, layer in enumerate(model.model.layers):
            gate = getattr(layer.mlp, "gate", None)
            if gate is not None and hasattr(gate, "top_k"):
                self.handles.append(gate.register_forward_hook(self._hook(idx, gate.top_k)))

    def _hook(self, layer_idx: int, top_k: int):
        def hook(_module, _inputs, output):
            logits, scores, indices = output
            ordered = logits.detach().sort(dim=-1, descending=True).values
            margin = (ordered[:, top_k - 1] - ordered[:, top_k]).min().item()
            self.min_margin = min(self.min_margin, margin)
            self.calls.append((layer_idx, indices.detach().clone(), scores.detach().clone()))
        return hook

    def reset(self) -> None:
        self.calls = []

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


class ClipProbe:
    """For OLMoE's clip_qkv: counts q/k/v entries beyond the clip value (before the clamp)."""

    def __init__(self, model: torch.nn.Module, clip: float | None):
        self.clip = clip
        self.beyond = 0
        self.total = 0
        self.handles = []
        if clip is None:
            return
        for layer in model.model.layers:
            attn = layer.self_attn
            for mod in (attn.q_norm, attn.k_norm, attn.v_proj):
                self.handles.append(mod.register_forward_hook(self._hook))

    def _hook(self, _module, _inputs, output):
        self.beyond += int((output.abs() > self.clip).sum())
        self.total += output.numel()

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


class HiddenProbe:
    """Root-mean-square of the residual stream per position: the embeddings, each decoder
    layer's output, and the final norm's output (what the lm_head sees)."""

    def __init__(self, model: torch.nn.Module):
        self.rms: list[list[float]] = []
        inner = model.model
        mods = [inner.embed_tokens, *inner.layers, inner.norm]
        self.handles = [m.register_forward_hook(self._hook) for m in mods]

    def _hook(self, _module, _inputs, output):
        h = output[0] if isinstance(output, tuple) else output
        self.rms.append([round(float(v), 5) for v in h[0].pow(2).mean(-1).sqrt()])

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def greedy_generate(model, ids: list[int]) -> tuple[list[int], list[torch.Tensor]]:
    """model.generate, greedy, exactly NEW_TOKENS tokens (no EOS stop). Returns new ids and
    the raw logits of each step."""
    gen_cfg = GenerationConfig(do_sample=False, max_new_tokens=NEW_TOKENS,
                               min_new_tokens=0, eos_token_id=None, pad_token_id=0,
                               bos_token_id=None, use_cache=True,
                               return_dict_in_generate=True, output_logits=True)
    inp = torch.tensor([ids])
    out = model.generate(inp, attention_mask=torch.ones_like(inp), generation_config=gen_cfg)
    new = out.sequences[0, len(ids):].tolist()
    assert len(new) == NEW_TOKENS, f"generate returned {len(new)} tokens"
    return new, [step[0].detach() for step in out.logits]


def no_cache_greedy(model, ids: list[int]) -> list[int]:
    """Greedy decoding by full forward passes without a KV cache: a cross-check of generate."""
    seq = list(ids)
    for _ in range(NEW_TOKENS):
        logits = model(torch.tensor([seq]), use_cache=False).logits[0, -1]
        seq.append(int(logits.argmax()))
    return seq[len(ids):]


def top_gap(logits: torch.Tensor) -> float:
    top2 = logits.topk(2).values
    return float(top2[0] - top2[1])


def compute_reference(model, prompts: list[dict], eos: list[int]) -> dict:
    """Runs every prompt: first-step logits, greedy continuation, gaps, router choices of
    the first prompt, routing diversity and clip statistics."""
    router = RouterProbe(model)
    clip = ClipProbe(model, getattr(model.config, "clip_qkv", None))
    results = []
    experts_used: dict[int, set] = {}
    first_routing = None
    for i, p in enumerate(prompts):
        ids = p["prompt_ids"]
        router.reset()
        hidden = HiddenProbe(model) if i == 0 else None
        out = model(torch.tensor([ids]), use_cache=False)
        if hidden is not None:
            hidden.remove()
            hidden_rms = hidden.rms
        first_logits = out.logits[0, -1].detach().clone()
        for layer_idx, indices, _ in router.calls:
            experts_used.setdefault(layer_idx, set()).update(indices.flatten().tolist())
        if i == 0:
            first_routing = {
                str(layer_idx): {"expert_ids": indices.tolist(),
                                 "weights": [[round(float(w), 6) for w in row] for row in scores]}
                for layer_idx, indices, scores in router.calls}
        new, step_logits = greedy_generate(model, ids)
        assert torch.allclose(step_logits[0], first_logits, atol=1e-4), "prefill mismatch"
        check = no_cache_greedy(model, ids)
        assert check == new, f"{p['name']}: cached {new} vs uncached {check} greedy differ"
        gaps = [top_gap(l) for l in step_logits]
        eos_at = next((j for j, t in enumerate(new) if t in eos), None)
        top5 = first_logits.topk(5)
        results.append({**p, "new_ids": new, "top_gaps": [round(g, 6) for g in gaps],
                        "first_top5": [[int(t), round(float(v), 5)]
                                       for v, t in zip(top5.values, top5.indices)],
                        "eos_stop_index": eos_at, "logits": first_logits})
    router.remove()
    clip.remove()
    return {
        "prompts": results,
        "first_routing": first_routing,
        "hidden_rms": hidden_rms,
        "min_gap": min(min(r["top_gaps"]) for r in results),
        "min_router_margin": router.min_margin,
        "experts_used": {k: sorted(v) for k, v in sorted(experts_used.items())},
        "clip_fraction": (clip.beyond / clip.total) if clip.total else None,
    }


def acceptable(ref: dict, num_experts: int) -> str | None:
    """Why a seed's reference is rejected, or None if it is fine."""
    if ref["min_gap"] < MIN_TOP_GAP:
        return f"min top-1/top-2 gap {ref['min_gap']:.2e} < {MIN_TOP_GAP}"
    if ref["min_router_margin"] < MIN_ROUTER_MARGIN:
        return f"min router margin {ref['min_router_margin']:.2e} < {MIN_ROUTER_MARGIN}"
    for layer, used in ref["experts_used"].items():
        if len(used) < num_experts // 2:
            return f"layer {layer} routes to only {len(used)} of {num_experts} experts"
    return None


# ----------------------------------------------------------------------------- per model

def num_experts_of(cfg: dict) -> int:
    """Routed experts per layer: num_experts, or Mixtral's num_local_experts."""
    return cfg["num_experts"] if "num_experts" in cfg else cfg["num_local_experts"]


def check_config(config, cfg: dict) -> None:
    """transformers must read config.json (hub layout) into the intended values."""
    rope = config.rope_parameters
    assert rope["rope_theta"] == cfg["rope_theta"] and rope["rope_type"] == "default", rope
    assert config.num_experts == num_experts_of(cfg), "num_experts not read"
    for key, want in cfg.items():
        if key in ("rope_theta", "rope_scaling", "torch_dtype", "transformers_version",
                   "architectures", "model_type", "num_experts"):
            continue
        if key == "sliding_window" and cfg.get("use_sliding_window") is False:
            # Qwen2MoeConfig.__post_init__ sets it to 0 when use_sliding_window is false.
            assert config.sliding_window == 0, config.sliding_window
            continue
        got = getattr(config, key)
        assert got == want, f"config {key}: transformers read {got!r}, wrote {want!r}"


def build_model(model_dir: Path, seed: int, std: float, num_tokens: int):
    config = AutoConfig.from_pretrained(model_dir)
    check_config(config, json.loads((model_dir / "config.json").read_text()))
    model = AutoModelForCausalLM.from_config(config, **LOAD_KW).eval()
    init_weights(model, seed, std)
    zero_padding_rows(model, num_tokens)
    if config.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return model


def write_generation_config(model_dir: Path, cfg: dict, eos) -> None:
    gen = {"bos_token_id": cfg.get("bos_token_id"), "eos_token_id": eos,
           "do_sample": False, "transformers_version": transformers.__version__}
    if cfg.get("pad_token_id") is not None:
        gen["pad_token_id"] = cfg["pad_token_id"]
    (model_dir / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")


def verify_reload(model_dir: Path, model, ref: dict) -> None:
    """from_pretrained of the written directory must give the same parameters and the same
    first-step logits, bit for bit, and the same greedy tokens."""
    loaded, info = AutoModelForCausalLM.from_pretrained(model_dir, output_loading_info=True,
                                                        **LOAD_KW)
    loaded.eval()
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        assert not info.get(kind), f"{model_dir.name}: {kind} {info.get(kind)}"
    mine = dict(model.named_parameters())
    for name, param in loaded.named_parameters():
        assert torch.equal(param, mine[name]), f"{model_dir.name}: {name} differs after reload"
    with torch.no_grad():
        for i, p in enumerate(ref["prompts"]):
            logits = loaded(torch.tensor([p["prompt_ids"]]), use_cache=False).logits[0, -1]
            saved = np.fromfile(model_dir / f"logits_{i}.f32", dtype="<f4")
            assert np.array_equal(logits.numpy(), saved), f"{model_dir.name}: logits_{i} differ"
            new, _ = greedy_generate(loaded, p["prompt_ids"])
            assert new == p["new_ids"], f"{model_dir.name}: prompt {i} greedy differs on reload"
    print(f"  reload check: parameters, logits and greedy tokens identical "
          f"({len(ref['prompts'])} prompts)")


def generate_model(spec: dict, base_tok) -> dict:
    model_dir = OUT_ROOT / spec["dir"]
    if model_dir.exists():
        shutil.rmtree(model_dir)
    model_dir.mkdir(parents=True)
    cfg = spec["config"]
    (model_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    write_generation_config(model_dir, cfg, spec["eos"])
    write_tokenizer_files(model_dir, spec["template"])
    tok = AutoTokenizer.from_pretrained(model_dir)
    prompts = encode_prompts(tok, base_tok)
    eos = spec["eos"] if isinstance(spec["eos"], list) else [spec["eos"]]

    print(f"{spec['dir']}:")
    std = cfg["initializer_range"]
    for attempt in range(MAX_SEED_TRIES):
        seed = spec["seed"] + attempt
        model = build_model(model_dir, seed, std, len(tok))
        with torch.no_grad():
            ref = compute_reference(model, prompts, eos)
        why = acceptable(ref, num_experts_of(cfg))
        if why is None:
            break
        print(f"  seed {seed} rejected: {why}; trying seed {seed + 1}")
    else:
        sys.exit(f"{spec['dir']}: no acceptable seed in {MAX_SEED_TRIES} tries")
    emitted = [t for p in ref["prompts"] for t in p["new_ids"]]
    assert max(emitted) < len(tok), "greedy emitted an id outside the tokenizer"
    print(f"  seed {seed}: min top-1/top-2 gap {ref['min_gap']:.4f}, "
          f"min router margin {ref['min_router_margin']:.4f}, experts used per layer "
          f"{ {k: len(v) for k, v in ref['experts_used'].items()} }"
          + (f", clip_qkv clamps {100 * ref['clip_fraction']:.2f}% of q/k/v entries"
             if ref["clip_fraction"] is not None else ""))

    tensors = hub_state_dict(model, spec["expert_layout"])
    files = write_safetensors(tensors, model_dir, spec["shards"], cfg["num_hidden_layers"])
    for i, p in enumerate(ref["prompts"]):
        p["logits"].numpy().astype("<f4").tofile(model_dir / f"logits_{i}.f32")

    reference = {
        "model": spec["dir"],
        "description": "random weights (not trained); reference computed by transformers "
                       "in float32 on the bf16-rounded weights, eager attention and experts",
        "command": COMMAND,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "seed": seed,
        "dtype_stored": "bfloat16",
        "dtype_compute": "float32",
        "expert_layout": spec["expert_layout"],
        "weight_files": files,
        "eos_token_ids": eos,
        "new_tokens": NEW_TOKENS,
        "greedy": "argmax each step, no EOS stop (eos_stop_index: first new token that is "
                  "an EOS id, or null)",
        "min_top_gap": round(ref["min_gap"], 6),
        "min_router_margin": round(ref["min_router_margin"], 6),
        "clip_qkv_fraction_clamped": (round(ref["clip_fraction"], 6)
                                      if ref["clip_fraction"] is not None else None),
        "logits_format": "raw little-endian float32, [vocab_size] values: the logits after "
                         "the last prompt token",
        "prompts": [{"name": p["name"], **({"messages": p["messages"],
                                             "add_generation_prompt": True}
                                            if "messages" in p else {}),
                     "text": p["text"], "prompt_ids": p["prompt_ids"],
                     "new_ids": p["new_ids"], "new_text": tok.decode(p["new_ids"]),
                     "top_gaps": p["top_gaps"], "eos_stop_index": p["eos_stop_index"],
                     "first_top5": p["first_top5"],
                     "logits_file": f"logits_{i}.f32"}
                    for i, p in enumerate(ref["prompts"])],
        "debug_first_prompt": {
            "router_topk": ref["first_routing"],
            "router_note": "per MoE layer: for each prompt position the selected expert ids "
                           "in descending router-probability order and their weights "
                           "(after norm_topk_prob when set); dense layers are absent",
            "hidden_rms": ref["hidden_rms"],
            "hidden_rms_note": "root-mean-square of the hidden state per prompt position: "
                               "index 0 = embeddings, index L+1 = output of decoder layer "
                               "L (residual included), last entry = final norm output",
        },
    }
    (model_dir / "reference.json").write_text(
        json.dumps(reference, indent=1, ensure_ascii=False) + "\n")
    verify_reload(model_dir, model, reference)
    size = sum(f.stat().st_size for f in model_dir.iterdir() if not f.is_symlink())
    print(f"  wrote {model_dir.relative_to(REPO)} ({size / 1e6:.2f} MB)")
    return {"dir": spec["dir"], "seed": seed, "min_gap": ref["min_gap"], "size": size}


def main() -> None:
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    if not (TOKENIZER_DIR / "tokenizer.json").exists():
        sys.exit(f"missing {TOKENIZER_DIR / 'tokenizer.json'}")
    if not QWEN25_TEMPLATE.exists():
        sys.exit(f"missing {QWEN25_TEMPLATE}")
    base_tok = AutoTokenizer.from_pretrained(TOKENIZER_DIR)
    wanted = sys.argv[1:] or [spec["dir"] for spec in MODELS]
    unknown = set(wanted) - {spec["dir"] for spec in MODELS}
    if unknown:
        sys.exit(f"unknown fixture(s) {sorted(unknown)}; known: {[s['dir'] for s in MODELS]}")
    summary = [generate_model(spec, base_tok) for spec in MODELS if spec["dir"] in wanted]
    total = sum(s["size"] for s in summary)
    print(f"total {total / 1e6:.2f} MB; min gaps "
          + ", ".join(f"{s['dir']} {s['min_gap']:.4f}" for s in summary))


if __name__ == "__main__":
    main()
