#!/usr/bin/env python3
"""Cross-checks every pre-tokenizer of coordinator/text/gguf_tokenizer.cpp on the texts of
tests/fixtures/tokenizer/cases.jsonl, outside ctest. For each known tokenizer.ggml.pre
name P it takes llama.cpp's ggml-vocab-qwen2.gguf (a byte-level vocabulary), sets its pre
to P (gguf-py's gguf_new_metadata.py), and compares the ids charm gives with

  hf:       HF tokenizers (Python) running the tokenizer.json charm builds for it -- do
            charm and tokenizers execute that tokenizer.json alike (PCRE2 vs Oniguruma);
  llama.cpp: llama.cpp's own tokenizer on the GGUF (libllama from a llama.cpp build, via a
            small C++ helper compiled here) -- llama.cpp's regex engine is its own, so
            differences here may be llama.cpp's approximations rather than charm's.

Texts NFC would change and invalid UTF-8 are left out (llama.cpp applies no normalizer).
Prints one line per pre-tokenizer: "P: hf N/M, llama.cpp N/M". Exit status 1 if any hf
comparison differs.

Needs: a charm build (build/tests/test_gguf_tokenizer), a Python with tokenizers, numpy
(e.g. /work/venv-sampling), the llama.cpp sources of the llama-cpp-python 0.3.36 sdist,
and for the llama.cpp column a llama.cpp build's bin/ with libllama.so (skipped if absent).
Usage: scripts/check_gguf_pretokenizers.py [--llama-cpp DIR] [--llama-build DIR] [--build DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SEP = "\n__ggml_vocab_test__\n"

HELPER = r"""
#include "llama.h"
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>
// argv[1]: vocab-only GGUF, argv[2]: texts separated by SEP; prints ids per text.
int main(int argc, char** argv) {
  if (argc != 3) return 2;
  llama_backend_init();
  llama_model_params params = llama_model_default_params();
  params.vocab_only = true;
  llama_model* model = llama_model_load_from_file(argv[1], params);
  if (!model) return 1;
  const llama_vocab* vocab = llama_model_get_vocab(model);
  std::ifstream in(argv[2], std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(in)), {});
  const std::string sep = "\n__ggml_vocab_test__\n";
  size_t start = 0;
  for (size_t end; (end = all.find(sep, start)) != std::string::npos; start = end + sep.size()) {
    const std::string text = all.substr(start, end - start);
    std::vector<llama_token> ids(text.size() * 2 + 16);
    const int n = llama_tokenize(vocab, text.data(), (int)text.size(), ids.data(),
                                 (int)ids.size(), false, true);
    for (int i = 0; i < n; ++i) std::printf("%s%d", i ? " " : "", ids[i]);
    std::printf("\n");
  }
  llama_model_free(model);
  return 0;
}
"""


def known_pre_tokenizers() -> list[str]:
    src = (ROOT / "coordinator/text/gguf_tokenizer.cpp").read_text(encoding="utf-8")
    table = src[src.index("pre_tokenizers() {"):src.index("return table;")]
    return re.findall(r'"([a-z0-9.-]+)"', "".join(re.findall(r"\{\{([^}]*)\}", table)))


def cases_text(out: Path) -> int:
    texts = []
    for line in (ROOT / "tests/fixtures/tokenizer/cases.jsonl").open(encoding="utf-8"):
        case = json.loads(line)
        if "hex" in case or case.get("nfc_changes") or not case["text"] or SEP in case["text"]:
            continue
        texts.append(case["text"])
    out.write_bytes("".join(t + SEP for t in texts).encode("utf-8"))
    return len(texts)


def charm_match(test_bin: Path, dump: Path, pairs: Path, json_out: Path | None = None) -> str:
    env = dict(os.environ, CHARM_GGUF_TOKENIZER_DUMP=str(dump), CHARM_GGUF_TOKENIZER_PAIRS=str(pairs))
    if json_out:
        env["CHARM_GGUF_TOKENIZER_JSON_OUT"] = str(json_out)
    out = subprocess.run([str(test_bin), "--no-skip", "-tc=*dumped*"], env=env, text=True,
                         capture_output=True).stdout
    m = re.search(r"(\d+/\d+) test pairs match", out)
    return m.group(1) if m else "error"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-cpp", type=Path,
                    default=Path("/work/bench/src/llama_cpp_python-0.3.36/vendor/llama.cpp"))
    ap.add_argument("--llama-build", type=Path, default=Path("/work/bench/llama-build/bin"))
    ap.add_argument("--build", type=Path, default=ROOT / "build")
    args = ap.parse_args()
    lc = args.llama_cpp
    test_bin = args.build / "tests/test_gguf_tokenizer"
    env = dict(os.environ, PYTHONPATH=str(lc / "gguf-py"))
    from tokenizers import Tokenizer

    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        texts = t / "cases.inp"
        n = cases_text(texts)
        raw = texts.read_bytes()  # bytes: read_text would turn "\r\n" into "\n"
        texts_list = raw.decode("utf-8").split(SEP)[:-1]
        helper = None
        if (args.llama_build / "libllama.so").exists():
            (t / "tok.cpp").write_text(HELPER)
            helper = t / "tok"
            subprocess.run(["g++", "-O1", "-std=c++17", str(t / "tok.cpp"), f"-I{lc}/include",
                            f"-I{lc}/ggml/include", f"-L{args.llama_build}", "-lllama",
                            f"-Wl,-rpath,{args.llama_build}", "-o", str(helper)], check=True)
        print(f"{n} texts")
        for pre in known_pre_tokenizers():
            gguf = t / f"{pre}.gguf"
            subprocess.run([sys.executable, str(lc / "gguf-py/gguf/scripts/gguf_new_metadata.py"),
                            "--force", "--pre-tokenizer", pre, str(lc / "models/ggml-vocab-qwen2.gguf"),
                            str(gguf)], env=env, check=True, capture_output=True)
            dump = t / f"{pre}.json"
            subprocess.run([sys.executable, str(ROOT / "scripts/gen_gguf_tokenizer_cases.py"),
                            "--llama-cpp", str(lc), "--dump", str(gguf), str(dump)], check=True,
                           capture_output=True)
            # hf: the tokenizer.json charm builds, run by HF tokenizers
            tj = t / f"{pre}.tokenizer.json"
            charm_match(test_bin, dump, t / "none", tj)  # writes tj (pairs missing: ignored)
            hf = Tokenizer.from_file(str(tj))
            (t / f"hf_{pre}.inp").write_bytes(raw)
            (t / f"hf_{pre}.out").write_text("".join(
                " ".join(map(str, hf.encode(x, add_special_tokens=False).ids)) + "\n"
                for x in texts_list))
            hf_result = charm_match(test_bin, dump, t / f"hf_{pre}")
            failed = failed or hf_result != f"{n}/{n}"
            lc_result = "skipped"
            if helper:
                (t / f"lc_{pre}.inp").write_bytes(raw)
                ids = subprocess.run([str(helper), str(gguf), str(texts)], check=True,
                                     capture_output=True, text=True).stdout
                (t / f"lc_{pre}.out").write_text(ids)
                lc_result = charm_match(test_bin, dump, t / f"lc_{pre}")
            print(f"{pre}: hf {hf_result}, llama.cpp {lc_result}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
