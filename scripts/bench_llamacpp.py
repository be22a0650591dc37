#!/usr/bin/env python3
"""charm against llama.cpp on the same MoE model, machine, prompt and thread count.

NOT a test and not run by CI: it downloads llama.cpp's source (the copy vendored in the
llama-cpp-python source distribution on PyPI) and torch, builds llama.cpp for this CPU,
and needs ~60 GB of disk in --work and minutes per run. Nothing it fetches or writes
goes into the repository; everything lives in --work (default $CHARM_BENCH_DIR, else
/work/bench) and is reused on the next call.

Steps (each skipped when its output exists):
  1. the synthetic OLMoE-1B-7B-shaped checkpoint (scripts/make_synthetic_olmoe.py;
     RANDOM weights, bf16, vocab 50304);
  2. a venv with torch/transformers for llama.cpp's converter; `pip download --no-binary
     :all: llama-cpp-python`, unpacked; its vendor/llama.cpp built with cmake, CPU only
     (GGML_NATIVE, no CUDA, no curl), targets llama-bench and llama-quantize;
  3. GGUF: llama.cpp's convert_hf_to_gguf.py --outtype bf16 (through
     scripts/llamacpp_convert.py, which only cuts the fixture tokenizer's vocabulary to
     vocab_size), then llama-quantize to each pair's type (Q8_0, Q4_0, Q4_K_M, Q3_K_M,
     Q2_K);
  4. charm expert containers: `charm convert --quant int8|int4 --group-size 32`;
  5. `charm bench memory` (STREAM-like copy GB/s) at the benchmark's thread count;
  6. per precision pair (charm bf16 / BF16, int8 / Q8_0, int4 gs32 / Q4_0), --repeat
     times, alternating: `llama-bench -p PP -n TG -t T [-ub U] -r 1 -lm mmap+mlock -o json`,
     then `charm run [--max-batch-tokens U]` (single node, every expert resident in RAM,
     --stats-json) twice, as llama-bench's two tests: a PP-token prompt for one token
     (prompt tok/s; `--repeat 2 --no-prefix-cache`, the second run timed, as llama-bench
     times its runs after a warm-up run; --charm-cold times the first), and TG tokens after
     a one-word prompt (decode tok/s from an almost empty context; `--repeat 2`, the second
     run timed, as llama-bench's generation test follows its warm-up). One engine at a time;
     peak RSS from wait4's rusage.
  7. the roofline: bytes a decode step must read (below) / copy GB/s = the tok/s a
     perfectly memory-bound decode would reach; each engine's decode as a fraction of it.

Active bytes per decode token, at each engine's STORED precision (charm: the checkpoint's
dtypes for dense tensors, the container's for experts; llama.cpp: the GGUF's tensor
types, read from the file):
    sum over non-expert tensors (attention q/k/v/o, norms, routers, lm_head) of their bytes
  + one embedding row (embed bytes / vocab_size)
  + top_k / num_experts x the bytes of every layer's routed experts (top_k experts per layer)
KV-cache reads are left out (16 layers x 2 x 2048 x 4 B per cached token: 0.26 MB per
token of context, <1 % at these lengths).

Differences between the pairs (also in docs/benchmarks.md):
  * charm int8/int4 quantise only the routed experts; dense weights and routers stay at
    checkpoint precision (bf16). llama.cpp Q8_0/Q4_0 quantise every matrix (the printed
    tensor-type census shows what llama-quantize kept at other types).
  * llama.cpp quantises the activations to 8 bits inside its quantised matmuls; charm
    keeps f32 activations and widens the weights.
  * Q4_0: group 32, one f16 scale, no offset; charm int4: group 32, one f32 scale,
    symmetric (-7..7). Q8_0: group 32, f16 scale; charm int8: group 32, f32 scale.
  * llama-bench measures prompt and generation as separate tests (the generation test
    starts from an empty context, after a warm-up run of each); so does charm here (two
    processes), its prompt rate PP / time to first token of the prompt's second run in
    its process (the first run's, which pays for the process's fresh pages, is kept as
    ttft_cold_ms). The decode process times its second run too (the first is kept as
    decode_cold_tok_s): llama-bench's generation test follows its warm-up and prompt runs.

Usage: scripts/bench_llamacpp.py [--work DIR] [--threads T] [--repeat 2] [--pp 128]
                                 [--tg 64] [--pairs bf16,int8,int4] [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
from bench_util import comma_choices, fmt_spread, log, machine, sh  # noqa: E402

# charm precision -> (llama.cpp type, charm convert --quant, or "gguf": charm serves the
# very GGUF file llama.cpp runs, its GGML blocks as stored)
PAIRS = {"bf16": ("BF16", None), "int8": ("Q8_0", "int8"), "int4": ("Q4_0", "int4"),
         "gguf-bf16": ("BF16", "gguf"), "gguf-q8_0": ("Q8_0", "gguf"), "gguf-q4_k_m": ("Q4_K_M", "gguf"),
         "gguf-q3_k_m": ("Q3_K_M", "gguf"), "gguf-q2_k": ("Q2_K", "gguf")}
QUANT_BITS = {"int8": 8, "int4": 4}
GROUP_SIZE = 32
VENV_PACKAGES = ["torch", "transformers", "sentencepiece", "protobuf<5", "safetensors", "numpy"]
LLAMA_TARGETS = ["llama-bench", "llama-quantize"]


def physical_cores() -> int:
    """Distinct (core, socket) pairs of lscpu; os.cpu_count() when lscpu is missing."""
    try:
        lines = subprocess.run(["lscpu", "-p=core,socket"], capture_output=True, text=True, timeout=10).stdout
        cores = {l for l in lines.splitlines() if l and not l.startswith("#")}
        return len(cores) or os.cpu_count() or 1
    except (OSError, subprocess.TimeoutExpired):
        return os.cpu_count() or 1


def check(r: subprocess.CompletedProcess, what: str) -> subprocess.CompletedProcess:
    if r.returncode != 0:
        raise RuntimeError(f"{what} failed ({r.returncode}): {(r.stderr or r.stdout)[-3000:]}")
    return r


# ---------------------------------------------------------------------------- inputs

def ensure_checkpoint(work: Path, layers: int) -> Path:
    ck = work / ("synthetic-olmoe" if layers == 16 else f"synthetic-olmoe-{layers}l")
    if not (ck / "model.safetensors.index.json").exists():
        check(sh([sys.executable, REPO / "scripts/make_synthetic_olmoe.py", "--out", ck, "--layers", layers], 3600),
              "make_synthetic_olmoe")
    return ck


def ensure_venv(work: Path) -> Path:
    """A venv (in --work, not system-wide) with what llama.cpp's converter imports."""
    py = work / "venv/bin/python"
    if not py.exists():
        check(sh([sys.executable, "-m", "venv", work / "venv"], 600), "python -m venv")
    probe = sh([py, "-c", "import torch, transformers, sentencepiece, numpy, tokenizers"], 120)
    if probe.returncode != 0:
        check(sh([py, "-m", "pip", "install", *VENV_PACKAGES], 3600), "pip install " + " ".join(VENV_PACKAGES))
    return py


def ensure_llama_source(work: Path, py: Path, version: str | None) -> Path:
    """vendor/llama.cpp of the llama-cpp-python sdist, unpacked under work/src."""
    src = work / "src"
    found = sorted(src.glob("llama_cpp_python-*/vendor/llama.cpp/CMakeLists.txt"))
    if version:
        found = [f for f in found if f"llama_cpp_python-{version}/" in str(f)]
    if not found:
        src.mkdir(parents=True, exist_ok=True)
        spec = f"llama-cpp-python=={version}" if version else "llama-cpp-python"
        check(sh([py, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps", spec, "-d", src], 1800),
              "pip download llama-cpp-python")
        for tarball in sorted(src.glob("llama_cpp_python-*.tar.gz")):
            with tarfile.open(tarball) as t:
                t.extractall(src, filter="data")
        found = sorted(src.glob("llama_cpp_python-*/vendor/llama.cpp/CMakeLists.txt"))
        if not found:
            raise RuntimeError(f"no vendor/llama.cpp in the llama-cpp-python sdist under {src}")
    return found[-1].parent


def ensure_llama_build(work: Path, llama_src: Path, jobs: int, targets: list[str] = LLAMA_TARGETS) -> Path:
    """Builds `targets` (llama-bench, llama-server, llama-batched-bench, ...) in work/llama-build,
    CPU only; the targets already there are not rebuilt. Returns the folder of the programs."""
    build = work / "llama-build"
    if all((build / "bin" / t).exists() for t in targets):
        return build / "bin"
    check(sh(["cmake", "-S", llama_src, "-B", build, "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON",
              "-DGGML_CUDA=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
              "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=ON"], 600), "cmake configure llama.cpp")
    check(sh(["cmake", "--build", build, f"-j{jobs}", "--target", *targets], 7200), "llama.cpp build")
    return build / "bin"


def llama_version(llama_src: Path) -> dict:
    sdist = llama_src.parent.parent.name  # llama_cpp_python-X.Y.Z
    out = {"llama_cpp_python": sdist.split("-", 1)[-1]}
    r = subprocess.run(["git", "-C", str(llama_src), "rev-parse", "HEAD"], capture_output=True, text=True)
    if r.returncode == 0 and (llama_src / ".git").exists():
        out["llama_cpp_commit"] = r.stdout.strip()
    return out


def ensure_gguf(work: Path, py: Path, llama_src: Path, bin_dir: Path, ck: Path, qtype: str, threads: int) -> Path:
    folder = work / ("gguf" if ck.name == "synthetic-olmoe" else f"gguf-{ck.name}")
    folder.mkdir(exist_ok=True)
    out = folder / f"olmoe-{qtype}.gguf"
    if out.exists():
        return out
    tmp = out.with_suffix(".tmp")
    if qtype == "BF16":
        r = sh([py, REPO / "scripts/llamacpp_convert.py", llama_src, ck, "--outtype", "bf16", "--outfile", tmp], 7200)
        (folder / "convert.log").write_text(r.stdout + r.stderr)
        check(r, "convert_hf_to_gguf.py")
    else:
        bf16 = ensure_gguf(work, py, llama_src, bin_dir, ck, "BF16", threads)
        r = sh([bin_dir / "llama-quantize", bf16, tmp, qtype, str(threads)], 7200)
        (folder / f"quantize-{qtype}.log").write_text(r.stdout + r.stderr)
        check(r, f"llama-quantize {qtype}")
    os.replace(tmp, out)
    return out


def ensure_container(work: Path, charm: Path, ck: Path, quant: str) -> Path:
    """`charm convert` is itself resumable and a no-op on a finished container."""
    out = work / f"charm-{quant}-gs{GROUP_SIZE}"
    check(sh([charm, "convert", "--checkpoint", ck, "--out", out, "--quant", quant, "--group-size", GROUP_SIZE], 7200),
          f"charm convert --quant {quant}")
    return out


def make_prompt(work: Path, py: Path, ck: Path, tokens: int, vocab: int) -> str:
    """Text that the checkpoint's tokenizer encodes to exactly `tokens` ids, all < vocab:
    seeded random whole-word tokens (" word"), so each position is a different token as
    in llama-bench's random prompt. Checked again on charm's own --ids-out."""
    path = work / f"prompt-{tokens}.txt"
    if path.exists():
        return path.read_text()
    code = r"""
import json, random, re, sys
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1]); n = int(sys.argv[2]); vocab = int(sys.argv[3])
words = sorted(t for t, i in tok.get_vocab().items() if i < vocab and re.fullmatch("\u0120[a-z]{3,12}", t))
rng = random.Random(7)
for _ in range(100):
    text = "".join(" " + w[1:] for w in rng.sample(words, n)).lstrip()
    ids = tok.encode(text, add_special_tokens=False).ids
    if len(ids) == n and max(ids) < vocab:
        print(text); sys.exit(0)
sys.exit("no prompt of exactly %d tokens found" % n)
"""
    r = check(sh([py, "-c", code, ck / "tokenizer.json", tokens, vocab], 300), "prompt generation")
    text = r.stdout.strip()
    path.write_text(text)
    return text


# ------------------------------------------------------------------------ measurement

def run_measured(cmd: list, timeout: float, log_prefix: Path) -> dict:
    """Runs cmd with stdout/stderr to files; returns rc, wall s and the peak RSS (GiB)
    of the process (wait4's ru_maxrss: the largest resident set it ever had)."""
    log(" ".join(str(c) for c in cmd))
    out, err = log_prefix.with_suffix(".out"), log_prefix.with_suffix(".err")
    started = time.time()
    with open(out, "w") as fo, open(err, "w") as fe:
        p = subprocess.Popen([str(c) for c in cmd], stdout=fo, stderr=fe)
        while True:
            pid, status, usage = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if time.time() - started > timeout:
                p.kill()
                os.wait4(p.pid, 0)
                p.returncode = -9
                raise RuntimeError(f"timed out after {timeout} s: {cmd[0]}")
            time.sleep(0.2)
    p.returncode = os.waitstatus_to_exitcode(status)  # reaped here: keep Popen from waiting again
    res = {"rc": p.returncode, "wall_s": time.time() - started, "peak_rss_gib": usage.ru_maxrss / 2**20,
           "stdout": out.read_text(), "stderr": err.read_text()}
    if res["rc"] != 0:
        raise RuntimeError(f"{Path(str(cmd[0])).name} exited {res['rc']}: {res['stderr'][-2000:]}")
    return res


def run_llama(bin_dir: Path, gguf: Path, args, log_prefix: Path) -> dict:
    batch = ["-ub", args.ubatch] if args.ubatch else []
    r = run_measured([bin_dir / "llama-bench", "-m", gguf, "-p", args.pp, "-n", args.tg, "-t", args.threads, *batch,
                      "-r", "1", "-lm", args.llama_load_mode, "-o", "json"], args.timeout, log_prefix)
    tests = json.loads(r["stdout"])
    pp = next(t for t in tests if t["n_prompt"] == args.pp and t["n_gen"] == 0)
    tg = next(t for t in tests if t["n_gen"] == args.tg and t["n_prompt"] == 0)
    return {"prompt_tok_s": pp["avg_ts"], "decode_tok_s": tg["avg_ts"], "peak_rss_gib": r["peak_rss_gib"],
            "wall_s": r["wall_s"], "build_commit": pp.get("build_commit"), "build_number": pp.get("build_number"),
            "cpu_info": pp.get("cpu_info"), "model_type": pp.get("model_type")}


def write_topology(folder: Path, ck: Path, container: Path | None, threads: int, name: str) -> Path:
    """Single node, every expert resident (no ram_gb), no pins or usage file. `ck` may be
    the GGUF file itself (the gguf-* pairs)."""
    store = "pin: none, usage_file: none" + (f", container: {container}" if container else "")
    path = folder / f"charm-{name}.yaml"
    path.write_text(f"model: {ck}\nmodel_name: synthetic-olmoe\nmode: single-node\nthreads: {threads}\n"
                    f"store: {{{store}}}\n")
    return path


def run_charm(charm: Path, cfg: Path, prompt: str, args, log_prefix: Path, vocab: int) -> dict:
    """Two processes, as llama-bench's two tests, each timing its second run (the first
    unless --charm-cold): the PP-token prompt for one token (prompt tok/s = PP / time to
    first token), then TG tokens after a one-word prompt (decode tok/s from an almost empty
    context, as llama-bench's generation test starts from an empty one; after the PP-token
    prompt every step would also read PP positions of K/V)."""
    stats, ids = log_prefix.with_suffix(".stats.json"), log_prefix.with_suffix(".ids.json")
    batch = ["--max-batch-tokens", args.ubatch] if args.ubatch else []
    warm = [] if args.charm_cold else ["--repeat", 2, "--no-prefix-cache"]
    r = run_measured([charm, "run", "--config", cfg, "--max-tokens", 1, "--activations", args.charm_activations, *batch,
                      *warm, "--stats-json", stats, "--ids-out", ids, prompt], args.timeout, log_prefix)
    s = json.loads(stats.read_text())
    prompt_ids = json.loads(ids.read_text())["prompt_ids"]
    if len(prompt_ids) != args.pp or max(prompt_ids) >= vocab:
        raise RuntimeError(f"charm encoded the prompt to {len(prompt_ids)} ids (max {max(prompt_ids)}), "
                           f"expected {args.pp} ids < {vocab}")
    decode_prefix = log_prefix.with_name(log_prefix.name + "-decode")
    decode_stats = decode_prefix.with_suffix(".stats.json")
    # Sampled with a fixed seed: greedy decoding of a random model repeats one token (one routing).
    # Warm as llama-bench's generation test, which runs after its warm-up and its prompt
    # tests in the same process: every weight page it reads has been touched before.
    warm = [] if args.charm_cold else ["--repeat", 2, "--no-prefix-cache"]
    d = run_measured([charm, "run", "--config", cfg, "--max-tokens", args.tg, "--temperature", "1", "--seed", "7",
                      *batch, *warm, "--activations", args.charm_activations, "--stats-json", decode_stats,
                      prompt.split()[0]], args.timeout, decode_prefix)
    ds = json.loads(decode_stats.read_text())
    if ds["completion_tokens"] != args.tg:
        raise RuntimeError(f"charm generated {ds['completion_tokens']} tokens, not {args.tg} ({ds['finish_reason']})")
    return {"prompt_tok_s": s["prompt_tokens"] / (s["ttft_ms"] / 1e3), "decode_tok_s": ds["decode_tokens_per_s"],
            "peak_rss_gib": max(r["peak_rss_gib"], d["peak_rss_gib"]), "wall_s": r["wall_s"] + d["wall_s"],
            "ttft_ms": s["ttft_ms"], "ttft_cold_ms": s["runs"][0]["ttft_ms"],
            "decode_cold_tok_s": ds["runs"][0]["decode_tokens_per_s"]}


def memory_bandwidth(charm: Path, threads: int, folder: Path, tag: str) -> dict:
    out = folder / f"memory-{tag}.json"
    r = check(sh([charm, "bench", "memory", "--threads", threads, "--json", out], 900), "charm bench memory")
    log(r.stdout.strip())
    return json.loads(out.read_text())


# --------------------------------------------------------------------------- roofline

def safetensors_tensors(ck: Path) -> dict[str, tuple[str, int]]:
    """name -> (dtype, bytes) from the checkpoint's shard headers."""
    out = {}
    for shard in sorted(ck.glob("*.safetensors")):
        with open(shard, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n))
        for name, info in header.items():
            if name != "__metadata__":
                out[name] = (info["dtype"], info["data_offsets"][1] - info["data_offsets"][0])
    return out


def gguf_tensors(py: Path, llama_src: Path, gguf: Path) -> list[dict]:
    """[{name, type, n_elements, n_bytes}] of a GGUF file (llama.cpp's gguf-py), cached beside it."""
    cache = gguf.with_suffix(".tensors.json")
    if cache.exists() and cache.stat().st_mtime >= gguf.stat().st_mtime:
        return json.loads(cache.read_text())
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); from gguf import GGUFReader; "
            "r = GGUFReader(sys.argv[2]); print(json.dumps([{'name': t.name, 'type': t.tensor_type.name, "
            "'n_elements': int(t.n_elements), 'n_bytes': int(t.n_bytes)} for t in r.tensors]))")
    r = check(sh([py, "-c", code, llama_src / "gguf-py", gguf], 600), "gguf tensor listing")
    cache.write_text(r.stdout)
    return json.loads(r.stdout)


def charm_active_bytes(ck: Path, cfg: dict, quant: str | None) -> float:
    """Bytes charm must read per decode token at its stored precision (docstring formula)."""
    k, e, vocab = cfg["num_experts_per_tok"], cfg["num_experts"], cfg["vocab_size"]
    total = 0.0
    for name, (dtype, nbytes) in safetensors_tensors(ck).items():
        if ".mlp.experts." in name:
            elements = nbytes / 2 if dtype in ("BF16", "F16") else nbytes / 4
            if quant:
                nbytes = elements * QUANT_BITS[quant] / 8 + elements / GROUP_SIZE * 4  # data + f32 group scales
            total += nbytes * k / e
        elif name == "model.embed_tokens.weight":
            total += nbytes / vocab
        else:
            total += nbytes
    return total


def llama_active_bytes(tensors: list[dict], cfg: dict) -> float:
    k, e, vocab = cfg["num_experts_per_tok"], cfg["num_experts"], cfg["vocab_size"]
    total = 0.0
    for t in tensors:
        if "_exps." in t["name"]:  # every expert of one layer in one 3-D tensor
            total += t["n_bytes"] * k / e
        elif t["name"] == "token_embd.weight":
            total += t["n_bytes"] / vocab
        else:
            total += t["n_bytes"]
    return total


def type_census(tensors: list[dict]) -> str:
    """'q4_0 x96 (3.4 GB), q6_K x1 (output.weight) ...': what llama-quantize kept at which type."""
    by_type: dict[str, list[dict]] = {}
    for t in tensors:
        by_type.setdefault(t["type"], []).append(t)
    parts = []
    for ty, ts in sorted(by_type.items(), key=lambda kv: -sum(t["n_bytes"] for t in kv[1])):
        gb = sum(t["n_bytes"] for t in ts) / 1e9
        names = f" ({', '.join(t['name'] for t in ts)})" if len(ts) <= 2 else ""
        parts.append(f"{ty} x{len(ts)}{names} {gb:.2f} GB")
    return ", ".join(parts)


# ------------------------------------------------------------------------------ main

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=Path(os.environ.get("CHARM_BENCH_DIR", "/work/bench")))
    ap.add_argument("--charm", type=Path, default=REPO / "build/charm")
    ap.add_argument("--threads", type=int, default=physical_cores())
    ap.add_argument("--repeat", type=int, default=2, help="alternating llama.cpp/charm runs per precision")
    ap.add_argument("--pp", type=int, default=128, help="prompt tokens")
    ap.add_argument("--tg", type=int, default=64, help="generated tokens")
    ap.add_argument("--ubatch", type=int, default=0,
                    help="prompt tokens per forward pass for both engines: llama-bench -ub U and charm "
                         "--max-batch-tokens U. 0 (default): each engine's own default, llama-bench's 512 and "
                         "charm's serving.max_batch_tokens, 256, which runs a 512-token prompt as two passes "
                         "(faster for charm's exact path on this host, slower for its q8 path: docs/benchmarks.md)")
    ap.add_argument("--pairs", default="bf16,int8,int4",
                    help="of " + ",".join(PAIRS) + " (gguf-*: charm serves the same GGUF file llama.cpp runs)")
    ap.add_argument("--layers", type=int, default=16, help="layers of the synthetic checkpoint (OLMoE-1B-7B has 16)")
    ap.add_argument("--prepare-only", action="store_true", help="build and convert everything, measure nothing")
    ap.add_argument("--charm-activations", choices=["f32", "q8"], default="f32",
                    help="charm's activations (q8: int8 activations in GGML-block matmuls, lossy, as llama.cpp)")
    ap.add_argument("--charm-cold", action="store_true",
                    help="time charm's first prompt and decode runs in their processes (default: the second, "
                         "after a warm-up run as llama-bench's)")
    ap.add_argument("--jobs", type=int, default=2, help="parallel compile jobs for llama.cpp")
    ap.add_argument("--llama-cpp-python", dest="lcp_version", help="sdist version (default: the newest)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per engine run")
    ap.add_argument("--llama-load-mode", default="mmap+mlock",
                    help="llama-bench -lm: mmap+mlock makes every weight resident before timing, as charm's "
                         "store does (plain mmap faults in the experts a run first routes to from disk "
                         "when the page cache lost the GGUF, e.g. to the previous charm run)")
    ap.add_argument("--llama-bin", type=Path,
                    help="run llama-bench from this folder instead of WORK/llama-build/bin (a build with other "
                         "flags; e.g. without AMX where a VM faults on AMX tiles: docs/benchmarks.md)")
    ap.add_argument("--out", type=Path, help="JSON results (default: WORK/results/bench_llamacpp.json)")
    ap.add_argument("--report", type=Path, help="only print the table of an earlier --out file")
    args = ap.parse_args()
    if args.report:
        print_report(json.loads(args.report.read_text()))
        return 0
    pairs = comma_choices(ap, args.pairs, PAIRS, "pair")
    if args.ubatch < 0:
        ap.error(f"--ubatch {args.ubatch}: give a token count, or 0 for each engine's default")
    if not args.charm.exists():
        ap.error(f"{args.charm}: no charm binary (cmake --build build --target charm)")
    args.work.mkdir(parents=True, exist_ok=True)
    results_dir = args.work / "results"
    results_dir.mkdir(exist_ok=True)
    out_path = args.out or results_dir / "bench_llamacpp.json"

    ck = ensure_checkpoint(args.work, args.layers)
    cfg = json.loads((ck / "config.json").read_text())
    py = ensure_venv(args.work)
    llama_src = ensure_llama_source(args.work, py, args.lcp_version)
    bin_dir = ensure_llama_build(args.work, llama_src, args.jobs)
    ggufs = {p: ensure_gguf(args.work, py, llama_src, bin_dir, ck, PAIRS[p][0], args.threads) for p in pairs}
    if args.llama_bin:
        if not (args.llama_bin / "llama-bench").exists():
            ap.error(f"{args.llama_bin}: no llama-bench there")
        bin_dir = args.llama_bin
    containers = {p: ensure_container(args.work, args.charm, ck, PAIRS[p][1])
                  if PAIRS[p][1] not in (None, "gguf") else None for p in pairs}
    prompt = make_prompt(args.work, py, ck, args.pp, cfg["vocab_size"])
    if args.prepare_only:
        log("prepared: " + ", ".join(str(g) for g in ggufs.values()))
        return 0

    res = {"machine": machine(args.work), "threads": args.threads, "pp": args.pp, "tg": args.tg,
           "ubatch": args.ubatch, "charm_prompt_run": "first" if args.charm_cold else "second (after a warm-up run)",
           "charm_decode_run": "first" if args.charm_cold else "second (after a warm-up run)",
           "charm_activations": args.charm_activations,
           "llama": llama_version(llama_src), "commands": [], "pairs": {}}
    res["machine"]["lscpu"] = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip()
    # The commit says which charm ran only when it is the repository's own build.
    own_build = args.charm.resolve() == (REPO / "build/charm").resolve()
    res["charm_commit"] = head if own_build else f"{args.charm} (repository at {head})"
    res["memory"] = [memory_bandwidth(args.charm, args.threads, results_dir, "before")]
    for p in pairs:
        qtype, quant = PAIRS[p]
        tensors = gguf_tensors(py, llama_src, ggufs[p])
        same_file = quant == "gguf"
        topo = write_topology(results_dir, ggufs[p] if same_file else ck, containers[p], args.threads, p)
        entry = {"llama_type": qtype, "gguf": str(ggufs[p]), "gguf_types": type_census(tensors),
                 "charm_bytes_per_token": llama_active_bytes(tensors, cfg) if same_file
                 else charm_active_bytes(ck, cfg, quant),
                 "llama_bytes_per_token": llama_active_bytes(tensors, cfg),
                 "topology": topo.read_text(), "llama": [], "charm": [], "errors": []}
        res["pairs"][p] = entry
        for rep in range(args.repeat):
            for engine in ("llama", "charm"):
                prefix = results_dir / f"{p}-{engine}-{rep}"
                try:
                    if engine == "llama":
                        entry["llama"].append(run_llama(bin_dir, ggufs[p], args, prefix))
                    else:
                        entry["charm"].append(run_charm(args.charm, topo, prompt, args, prefix, cfg["vocab_size"]))
                    log(f"{p} {engine} {rep}: {entry[engine][-1]}")
                except (RuntimeError, json.JSONDecodeError, StopIteration) as e:
                    entry["errors"].append(f"{engine} run {rep}: {e}")
                    log(f"{p} {engine} {rep} FAILED: {e}")
                out_path.write_text(json.dumps(res, indent=1))
    res["memory"].append(memory_bandwidth(args.charm, args.threads, results_dir, "after"))
    res["machine"]["loadavg_end"] = Path("/proc/loadavg").read_text().split()[:3]
    out_path.write_text(json.dumps(res, indent=1))
    print_report(res)
    log(f"results: {out_path}")
    return 0


def charm_label(pair: str, activations: str) -> str:
    """'charm int8 gs32', or for the same-file pairs 'charm, same GGUF (f32 activations)'."""
    if PAIRS[pair][1] == "gguf":
        return f"charm, same GGUF ({activations} activations)"
    return f"charm {pair}" + (f" gs{GROUP_SIZE}" if pair != "bf16" else "")


def print_report(res: dict) -> None:
    copy = max(m["kernels"]["copy"]["best_gb_per_s"] for m in res["memory"])
    m = res["machine"]
    print(f"machine: {m['cpu']}, {m['cores']} logical cores; load {' '.join(m['loadavg'])} at start, "
          f"{' '.join(m.get('loadavg_end', ['?']))} at end")
    lv = res["llama"]
    print(f"llama.cpp: from llama-cpp-python {lv.get('llama_cpp_python')} (vendored llama.cpp "
          f"{lv.get('llama_cpp_commit', '?')[:12]}); charm {res.get('charm_commit', '?')}")
    batch = res.get("ubatch") or "each engine's default"  # 0, or absent in results from before --ubatch
    timed = res.get("charm_prompt_run", "first")  # absent in results from before --repeat
    print(f"threads {res['threads']}, prompt {res['pp']} tokens (batch: {batch}; charm's {timed} run in its process), "
          f"decode {res['tg']} tokens; "
          f"memory bandwidth (charm bench memory, STREAM copy, best): "
          + ", ".join(f"{x['kernels']['copy']['best_gb_per_s']:.1f}" for x in res["memory"]) + f" GB/s -> {copy:.1f}")
    print()
    print("| precision | engine | prompt tok/s | decode tok/s | peak RSS GiB | active GB/token | roofline tok/s "
          "| decode / roofline | runs |")
    print("|---|---|---|---|---|---|---|---|---|")
    for p, e in res["pairs"].items():
        for engine, label, key in (("llama", f"llama.cpp {e['llama_type']}", "llama_bytes_per_token"),
                                   ("charm", charm_label(p, res.get("charm_activations", "f32")),
                                    "charm_bytes_per_token")):
            runs = e[engine]
            gb = e[key] / 1e9
            roof = copy / gb
            dec = [r["decode_tok_s"] for r in runs]
            frac = f"{100 * sum(dec) / len(dec) / roof:.0f} %" if dec else "-"
            print(f"| {p} | {label} | {fmt_spread([r['prompt_tok_s'] for r in runs])} | {fmt_spread(dec)} | "
                  f"{fmt_spread([r['peak_rss_gib'] for r in runs])} | {gb:.3f} | {roof:.2f} | {frac} | {len(runs)} |")
    print()
    for p, e in res["pairs"].items():
        cold = [res["pp"] / (r["ttft_cold_ms"] / 1e3) for r in e["charm"] if "ttft_cold_ms" in r]
        if cold and timed != "first":
            print(f"{p}: charm's first prompt run in its process (fresh pages): {fmt_spread(cold)} tok/s")
        cold = [r["decode_cold_tok_s"] for r in e["charm"] if "decode_cold_tok_s" in r]
        if cold and res.get("charm_decode_run", "first") != "first":
            print(f"{p}: charm's first decode run in its process: {fmt_spread(cold)} tok/s")
    for p, e in res["pairs"].items():
        print(f"{e['llama_type']} GGUF tensor types: {e['gguf_types']}")
        for err in e["errors"]:
            print(f"{p} error: {err}")


if __name__ == "__main__":
    sys.exit(main())
