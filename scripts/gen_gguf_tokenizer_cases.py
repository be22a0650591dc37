#!/usr/bin/env python3
"""Writes tests/fixtures/gguf_tokenizer/*.json: the tokenizer metadata of GGUF files that
llama.cpp's own tools wrote, as the oracle for coordinator/text/gguf_tokenizer.cpp.

Each output file is one compact JSON object whose keys are the GGUF metadata keys
(`tokenizer.ggml.model`, `tokenizer.ggml.pre`, `tokenizer.ggml.tokens`,
`tokenizer.ggml.token_type`, `tokenizer.ggml.merges`, `tokenizer.ggml.*_token_id`,
`tokenizer.ggml.add_bos_token`, `tokenizer.chat_template`, ...) with their values as
gguf-py's GGUFReader reads them, plus "_source" saying where the file came from.

- qwen2.json: llama.cpp's `convert_hf_to_gguf.py --vocab-only` run on a copy of
  tests/fixtures/models/qwen3-moe-tiny (config.json + the Qwen3 tokenizer.json and
  tokenizer_config.json), i.e. what a real conversion of a Qwen3 MoE checkpoint writes.
- gpt-2.json, deepseek-coder.json: the metadata of llama.cpp's
  models/ggml-vocab-{gpt-2,deepseek-coder}.gguf (converted by llama.cpp from
  openai-community/gpt2 and deepseek-ai/deepseek-coder-6.7b-base), to test other
  pre-tokenizers; their .gguf.inp/.out test pairs (ids from HF tokenizers) are copied
  beside them.

`--dump GGUF OUT` dumps any GGUF file's tokenizer metadata the same way (e.g. a real
model file, to check it outside ctest: see tests/fixtures/gguf_tokenizer/README.md).

Needs the vendored llama.cpp of the llama-cpp-python 0.3.36 sdist (default path below) and
a Python with transformers, tokenizers and numpy (e.g. /work/venv-sampling).
Usage: scripts/gen_gguf_tokenizer_cases.py [--llama-cpp DIR] [--out DIR]
       scripts/gen_gguf_tokenizer_cases.py --dump FILE.gguf OUT.json
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_LLAMA_CPP = Path("/work/bench/src/llama_cpp_python-0.3.36/vendor/llama.cpp")
# llama.cpp's own vocab-only files for other pre-tokenizers, the small ones: GPT-2's
# built-in ByteLevel regex and DeepSeek Coder's sequence of five Splits.
VOCAB_FILES = ["gpt-2", "deepseek-coder", "llama-spm"]
MODEL_FILES = ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"]


def read_tokenizer_metadata(gguf_path: Path, llama_cpp: Path) -> dict:
    """The tokenizer.* key/value pairs of a GGUF file, as plain JSON values."""
    sys.path.insert(0, str(llama_cpp / "gguf-py"))
    from gguf import GGUFReader  # noqa: E402  (needs the path above)
    from gguf.constants import GGUFValueType

    reader = GGUFReader(str(gguf_path))
    out: dict = {}
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        if field.types[0] == GGUFValueType.ARRAY:
            elem = field.types[-1]
            if elem == GGUFValueType.STRING:
                out[name] = [bytes(field.parts[i]).decode("utf-8") for i in field.data]
            else:
                out[name] = [field.parts[i].tolist()[0] for i in field.data]
        elif field.types[0] == GGUFValueType.STRING:
            out[name] = bytes(field.parts[field.data[0]]).decode("utf-8")
        else:
            out[name] = field.parts[field.data[0]].tolist()[0]
    return out


def write_json(obj: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n",
                    encoding="utf-8")
    print(f"wrote {path} ({path.stat().st_size} bytes)")


def convert_fixture_model(llama_cpp: Path, out_dir: Path) -> None:
    src = ROOT / "tests/fixtures/models/qwen3-moe-tiny"
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "model"
        model.mkdir()
        for name in MODEL_FILES:
            shutil.copy(src / name, model / name)  # follows the tokenizer.json symlink
        gguf_path = Path(tmp) / "vocab.gguf"
        env = dict(os.environ, PYTHONPATH=str(llama_cpp / "gguf-py"))
        subprocess.run([sys.executable, str(llama_cpp / "convert_hf_to_gguf.py"), "--vocab-only",
                        "--outfile", str(gguf_path), str(model)], check=True, env=env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        meta = read_tokenizer_metadata(gguf_path, llama_cpp)
    meta["_source"] = ("llama.cpp convert_hf_to_gguf.py --vocab-only (llama-cpp-python 0.3.36 "
                       "vendor) on tests/fixtures/models/qwen3-moe-tiny")
    write_json(meta, out_dir / "qwen2.json")


def copy_vocab_file(llama_cpp: Path, out_dir: Path, name: str) -> None:
    models = llama_cpp / "models"
    meta = read_tokenizer_metadata(models / f"ggml-vocab-{name}.gguf", llama_cpp)
    meta["_source"] = f"llama.cpp models/ggml-vocab-{name}.gguf (llama-cpp-python 0.3.36 vendor)"
    write_json(meta, out_dir / f"{name}.json")
    for ext in ("inp", "out"):
        shutil.copy(models / f"ggml-vocab-{name}.gguf.{ext}", out_dir / f"{name}.{ext}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-cpp", type=Path, default=DEFAULT_LLAMA_CPP)
    ap.add_argument("--out", type=Path, default=ROOT / "tests/fixtures/gguf_tokenizer")
    ap.add_argument("--dump", nargs=2, type=Path, metavar=("GGUF", "OUT"))
    args = ap.parse_args()
    if args.dump:
        meta = read_tokenizer_metadata(args.dump[0], args.llama_cpp)
        meta["_source"] = str(args.dump[0])
        write_json(meta, args.dump[1])
        return
    convert_fixture_model(args.llama_cpp, args.out)
    for name in VOCAB_FILES:
        copy_vocab_file(args.llama_cpp, args.out, name)


if __name__ == "__main__":
    main()
