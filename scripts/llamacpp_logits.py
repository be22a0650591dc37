#!/usr/bin/env python3
"""llama.cpp's own logits on the GGUF test files, committed as the third oracle of charm's
GGUF path (beside transformers on the safetensors and gguf-py's dequantisation):
tests/fixtures/llamacpp_logits/. tests/unit/test_llamacpp_logits.cpp compares charm's
logits on the very same files with these and reports the difference.

NOT run by CI (it needs a llama.cpp build); run it again when the fixtures change:
  python3 scripts/llamacpp_logits.py [--work /work/bench]
It compiles scripts/llamacpp_logits.cpp against the llama.cpp that scripts/bench_llamacpp.py
builds (the copy vendored in llama-cpp-python's sdist, under --work; run
`scripts/bench_llamacpp.py --prepare-only` first), writes the fixture GGUFs with
scripts/gen_gguf_fixtures.py (the same files ctest writes), and runs each file on the
prompts of its fixture's reference.json (the committed K-quant files on a fixed prompt):
last-position logits, one thread, f32 KV cache, no flash attention.

Stored per case (manifest.json): the file, the prompt ids, llama.cpp's argmax, and the
logits at two sets of ids: llama.cpp's 128 largest and 128 evenly spaced ones (all of them
for vocabularies up to 512). A file llama.cpp refuses is listed with its error.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
OUT = REPO / "tests" / "fixtures" / "llamacpp_logits"
FIXTURES = REPO / "tests" / "fixtures" / "models"
KQUANT = REPO / "tests" / "fixtures" / "gguf_models"
# (fixture, outtype): the families llama.cpp runs, at the precisions the tests read.
TINY = [(name, outtype) for name in ["qwen2-moe-tiny", "qwen3-moe-tiny", "olmoe-tiny", "mixtral-tiny",
                                     "deepseek-v3-tiny", "gpt-oss-tiny", "glm4-moe-tiny", "minimax-m2-tiny",
                                     "qwen3-next-tiny", "qwen3.5-moe-tiny", "glm-moe-dsa-tiny", "deepseek-v32-tiny"]
        for outtype in ["f32"]]  # f32: llama.cpp multiplies BF16 weights by bf16-rounded activations
TINY += [("qwen3-moe-tiny", "q8_0"), ("qwen3-moe-tiny", "q4_0"), ("deepseek-v3-tiny", "q8_0")]
KQUANT_PROMPT = [1, 5, 17, 300, 42, 7, 511, 0, 256]  # test_gguf_model's K-quant prompt
PROMPTS_PER_FIXTURE = 2
KEEP = 128


def find_llama(work: Path) -> tuple[Path, Path]:
    src = sorted(work.glob("src/llama_cpp_python-*/vendor/llama.cpp"))
    build = work / "llama-build"
    if not src or not (build / "bin" / "libllama.so").exists():
        sys.exit(f"no llama.cpp build under {work}: run scripts/bench_llamacpp.py --prepare-only --work {work}")
    return src[-1], build


def compile_runner(src: Path, build: Path, out: Path) -> Path:
    exe = out / "llamacpp_logits"
    cmd = ["g++", "-O2", "-std=c++17", str(REPO / "scripts" / "llamacpp_logits.cpp"), "-o", str(exe),
           f"-I{src / 'include'}", f"-I{src / 'ggml' / 'include'}", f"-L{build / 'bin'}", "-lllama", "-lggml",
           "-lggml-base", f"-Wl,-rpath,{build / 'bin'}"]
    subprocess.run(cmd, check=True)
    return exe


def llama_version(src: Path) -> str:
    r = subprocess.run(["git", "-C", str(src), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if r.returncode == 0:
        return r.stdout.strip()
    sdist = src.parent.parent.name  # llama_cpp_python-<version>
    return f"vendored in {sdist}"


def kept_ids(logits: np.ndarray) -> list[int]:
    n = logits.size
    if n <= 4 * KEEP:
        return list(range(n))
    top = np.argsort(-logits, kind="stable")[:KEEP]
    spaced = np.linspace(0, n - 1, KEEP).astype(np.int64)
    return sorted(set(int(i) for i in top) | set(int(i) for i in spaced))


def with_merges(gguf_path: Path, tmp: Path) -> Path:
    """`gguf_path` itself, or, when its byte-level BPE tokenizer has no merges (the
    committed K-quant fixtures: charm never tokenizes there), a copy with one merge:
    llama.cpp refuses to load a gpt2 tokenizer without the key. The tensors and every
    other key are the same bytes, so the logits are the same model's."""
    import gguf
    from gen_gguf_fixtures import copied_writer
    reader = gguf.GGUFReader(str(gguf_path))
    if "tokenizer.ggml.merges" in reader.fields or reader.get_field("tokenizer.ggml.model").contents() != "gpt2":
        return gguf_path
    out = tmp / ("merges-" + gguf_path.name)
    writer = copied_writer(reader, out)
    writer.add_token_merges(["<t0> <t1>"])  # one merge of two of its tokens: an empty list is not written
    for t in reader.tensors:
        writer.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)  # quantised data comes shaped in bytes
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def run_case(exe: Path, gguf: Path, prompt: list[int], tmp: Path) -> dict:
    out = tmp / "logits.f32"
    r = subprocess.run([str(exe), str(gguf), ",".join(map(str, prompt)), str(out)], capture_output=True, text=True,
                       timeout=600)
    if r.returncode != 0:
        errors = ([line for line in r.stderr.splitlines() if "error" in line or "GGML_ASSERT" in line] or
                  r.stderr.strip().splitlines())
        return {"refused": (errors or ["exit " + str(r.returncode)])[0].strip()}
    logits = np.fromfile(out, dtype="<f4")
    ids = kept_ids(logits)
    return {"vocab": int(logits.size), "argmax": int(np.argmax(logits)), "ids": ids,
            "logits": [float(logits[i]) for i in ids]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=Path(os.environ.get("CHARM_BENCH_DIR", "/work/bench")))
    args = parser.parse_args()
    src, build = find_llama(args.work)
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        exe = compile_runner(src, build, tmp)
        cases = []
        for name, outtype in TINY:
            subprocess.run([sys.executable, str(REPO / "scripts" / "gen_gguf_fixtures.py"), "--out", str(tmp),
                            "--outtype", outtype, name], check=True, capture_output=True)
            reference = json.loads((FIXTURES / name / "reference.json").read_text())
            for p in reference["prompts"][:PROMPTS_PER_FIXTURE]:
                file = f"{name}.{outtype}.gguf"
                case = {"file": file, "generated_by": "gen_gguf_fixtures.py", "prompt_ids": p["prompt_ids"]}
                case.update(run_case(exe, tmp / file, p["prompt_ids"], tmp))
                cases.append(case)
                print(file, case.get("refused", f"argmax {case.get('argmax')}"))
        for gguf in sorted(KQUANT.glob("*.gguf")):
            case = {"file": gguf.name, "generated_by": "committed", "prompt_ids": KQUANT_PROMPT}
            case.update(run_case(exe, with_merges(gguf, tmp), KQUANT_PROMPT, tmp))
            cases.append(case)
            print(gguf.name, case.get("refused", f"argmax {case.get('argmax')}"))
    manifest = {"llama_cpp": llama_version(src), "settings": "CPU, 1 thread, f32 KV cache, no flash attention",
                "cases": cases}
    lines = ",\n".join("  " + json.dumps(c, separators=(",", ":")) for c in cases)  # a case per line
    head = json.dumps({k: v for k, v in manifest.items() if k != "cases"})[:-1]
    (OUT / "manifest.json").write_text(f'{head}, "cases": [\n{lines}\n]}}\n')
    print(f"wrote {OUT / 'manifest.json'} ({len(cases)} cases)")


if __name__ == "__main__":
    main()
