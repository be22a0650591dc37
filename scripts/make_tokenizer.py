#!/usr/bin/env python3
"""Builds charm's Qwen3 tokenizer fixture from a PyPI package (no model hub needed).

The llama-cpp-python source distribution vendors llama.cpp, whose
`models/ggml-vocab-qwen2.gguf` holds the Qwen2 byte-level BPE vocabulary (tokens,
merges, token types) — the same 151,643 regular tokens and 151,387 merges that
Qwen2.5 and Qwen3 ship — together with llama.cpp's tokenizer test pairs (.inp/.out)
and the Qwen3 chat template (`models/templates/Qwen-Qwen3-0.6B.jinja`).

This script writes, into the output folder (default tests/fixtures/tokenizer/):
  tokenizer.json          Hugging Face `tokenizers` file in the layout Qwen3 ships
  tokenizer_config.json   transformers config (added_tokens_decoder, chat_template, ...)
  llama_cpp_vocab_test.inp / .out   llama.cpp's test pairs, copied verbatim

Usage:
  scripts/make_tokenizer.py [--sdist PATH.tar.gz | --sdist EXTRACTED_DIR] [--out DIR]
Without --sdist it runs
  pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36
into a temporary folder. Deterministic: the same sdist gives byte-identical output.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

SDIST_VERSION = "0.3.36"
MODELS_DIR = "vendor/llama.cpp/models"
GGUF_NAME = "ggml-vocab-qwen2.gguf"
TEMPLATE_NAME = "templates/Qwen-Qwen3-0.6B.jinja"

# The pre-tokenizer regex of Qwen2/2.5/3 (tokenizer.json, pre_tokenizer.pretokenizers[0]).
QWEN_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Qwen3's added tokens: (content, special). Ids run from 151643 in this order. Taken from
# Qwen3's published tokenizer_config.json (added_tokens_decoder).
QWEN3_ADDED = [
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
]
FIRST_ADDED_ID = 151643
MODEL_MAX_LENGTH = 131072

# GGUF token types (llama.cpp's llama_token_type).
TOKEN_TYPE_NORMAL = 1


def fetch_sdist(workdir: Path) -> Path:
    """Downloads the llama-cpp-python sdist with pip; returns the .tar.gz path."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
           f"llama-cpp-python=={SDIST_VERSION}", "-d", str(workdir)]
    subprocess.run(cmd, check=True)
    found = sorted(workdir.glob("llama_cpp_python-*.tar.gz"))
    if not found:
        raise SystemExit(f"pip download left no llama_cpp_python sdist in {workdir}")
    return found[0]


def extract_assets(sdist: Path, workdir: Path) -> dict[str, Path]:
    """Returns paths of the GGUF, .inp, .out and template, extracting from a tarball."""
    wanted = {
        "gguf": f"{MODELS_DIR}/{GGUF_NAME}",
        "inp": f"{MODELS_DIR}/{GGUF_NAME}.inp",
        "out": f"{MODELS_DIR}/{GGUF_NAME}.out",
        "template": f"{MODELS_DIR}/{TEMPLATE_NAME}",
    }
    if sdist.is_dir():
        paths = {k: sdist / v for k, v in wanted.items()}
        missing = [str(p) for p in paths.values() if not p.is_file()]
        if missing:
            raise SystemExit(f"{sdist}: missing {missing}")
        return paths
    paths = {}
    with tarfile.open(sdist) as tar:
        members = {m.name.split("/", 1)[1]: m for m in tar.getmembers() if "/" in m.name}
        for key, rel in wanted.items():
            member = members.get(rel)
            if member is None:
                raise SystemExit(f"{sdist}: has no {rel}")
            dest = workdir / Path(rel).name
            dest.write_bytes(tar.extractfile(member).read())
            paths[key] = dest
    return paths


def read_gguf_vocab(path: Path) -> tuple[list[str], list[int], list[str]]:
    """Reads tokens, token types and merges from the GGUF file."""
    import gguf  # imported here so --help works without it

    reader = gguf.GGUFReader(str(path))

    def strings(key: str) -> list[str]:
        field = reader.fields[key]
        return [bytes(field.parts[i]).decode("utf-8") for i in field.data]

    def ints(key: str) -> list[int]:
        field = reader.fields[key]
        return [int(field.parts[i][0]) for i in field.data]

    pre = bytes(reader.fields["tokenizer.ggml.pre"].parts[-1]).decode()
    model = bytes(reader.fields["tokenizer.ggml.model"].parts[-1]).decode()
    if model != "gpt2" or pre != "qwen2":
        raise SystemExit(f"{path}: expected a gpt2/qwen2 vocabulary, got {model}/{pre}")
    return (strings("tokenizer.ggml.tokens"), ints("tokenizer.ggml.token_type"),
            strings("tokenizer.ggml.merges"))


def regular_vocab(tokens: list[str], types: list[int]) -> dict[str, int]:
    """The BPE vocabulary: the normal tokens below the first added id, checked dense."""
    vocab = {}
    for i in range(FIRST_ADDED_ID):
        if types[i] != TOKEN_TYPE_NORMAL:
            raise SystemExit(f"token {i} {tokens[i]!r} has type {types[i]}, expected normal")
        vocab[tokens[i]] = i
    if len(vocab) != FIRST_ADDED_ID:
        raise SystemExit("duplicate tokens in the GGUF vocabulary")
    # The GGUF's own ids for the first three specials must agree with Qwen3's.
    for offset, (content, _) in enumerate(QWEN3_ADDED[:3]):
        if tokens[FIRST_ADDED_ID + offset] != content:
            raise SystemExit(f"GGUF id {FIRST_ADDED_ID + offset} is not {content}")
    return vocab


def added_token_entry(content: str, special: bool) -> dict:
    """The per-token flags Qwen3 uses for every added token."""
    return {"content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": special}


def build_tokenizer_json(vocab: dict[str, int], merges: list[str]) -> dict:
    """tokenizer.json in the key order and structure of Qwen3's published file."""
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                  "use_regex": False}
    added = [{"id": FIRST_ADDED_ID + i, **added_token_entry(c, s)}
             for i, (c, s) in enumerate(QWEN3_ADDED)]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": QWEN_REGEX}, "behavior": "Isolated",
                 "invert": False},
                dict(byte_level),
            ],
        },
        "post_processor": dict(byte_level),
        "decoder": dict(byte_level),
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": merges,
        },
    }


def build_tokenizer_config(chat_template: str) -> dict:
    """tokenizer_config.json as Qwen3 ships it (transformers' Qwen2Tokenizer)."""
    decoder = {str(FIRST_ADDED_ID + i): {k: v for k, v in added_token_entry(c, s).items()}
               for i, (c, s) in enumerate(QWEN3_ADDED)}
    for entry in decoder.values():  # Qwen3's key order: content first, then flags sorted
        entry_sorted = {"content": entry.pop("content")}
        entry_sorted.update(sorted(entry.items()))
        entry.clear()
        entry.update(entry_sorted)
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": decoder,
        "additional_special_tokens": [c for c, s in QWEN3_ADDED[1:14] if s],
        "bos_token": None,
        "chat_template": chat_template,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": MODEL_MAX_LENGTH,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sdist", type=Path, help="llama-cpp-python sdist (.tar.gz or dir)")
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).resolve().parent.parent / "tests/fixtures/tokenizer")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        sdist = args.sdist or fetch_sdist(workdir)
        assets = extract_assets(sdist, workdir)
        tokens, types, merges = read_gguf_vocab(assets["gguf"])
        vocab = regular_vocab(tokens, types)
        template = assets["template"].read_text(encoding="utf-8")

        args.out.mkdir(parents=True, exist_ok=True)
        with open(args.out / "tokenizer.json", "w", encoding="utf-8") as f:
            json.dump(build_tokenizer_json(vocab, merges), f, ensure_ascii=False, indent=1)
            f.write("\n")
        with open(args.out / "tokenizer_config.json", "w", encoding="utf-8") as f:
            json.dump(build_tokenizer_config(template), f, ensure_ascii=False, indent=2)
            f.write("\n")
        (args.out / "llama_cpp_vocab_test.inp").write_bytes(assets["inp"].read_bytes())
        (args.out / "llama_cpp_vocab_test.out").write_bytes(assets["out"].read_bytes())
    print(f"wrote {args.out}: {len(vocab)} regular tokens, {len(merges)} merges, "
          f"{len(QWEN3_ADDED)} added tokens")


if __name__ == "__main__":
    main()
