#!/usr/bin/env python3
"""Writes the sentencepiece-style (Llama / Mistral / Mixtral) tokenizer fixtures from the
Llama vocabulary llama.cpp ships (tests/fixtures/gguf_tokenizer/llama-spm.json, the dump of
its models/ggml-vocab-llama-spm.gguf by scripts/gen_gguf_tokenizer_cases.py):

- tests/fixtures/spm_tokenizer/tokenizer.json: the Hugging Face tokenizer.json that
  transformers' LlamaConverter writes for such a vocabulary (the layout of the Llama 2 /
  Mistral / Mixtral hub files): BPE with byte_fallback and fuse_unk, merges from the piece
  scores (transformers' generate_merges: every split of a piece into two pieces, ordered by
  the merged piece's score, best first), normalizer Prepend("▁") + Replace(" ", "▁"), no
  pre-tokenizer, decoder Replace("▁", " ") + ByteFallback + Fuse + Strip(1 leading space),
  <unk> <s> </s> as special added tokens;
- (not written: tests/unit/test_tokenizer.cpp makes the same change) the same vocabulary in
  the newer layout (no normalizer; Metaspace pre-tokenizer, prepend_scheme "first", split
  false), as transformers writes for `legacy: false`, for its cases;
- tests/fixtures/spm_tokenizer/cases.jsonl and cases_metaspace.jsonl: ids and decodes HF
  `tokenizers` gives for scripts/gen_tokenizer_cases.py's generated strings (same format).

Before writing, the built tokenizer.json must reproduce llama.cpp's own test pairs
(llama-spm.inp/.out, ids from HF's Llama tokenizer): that proves it is the hub's tokenizer.

Deterministic. Needs tokenizers (and transformers for generate_merges), e.g. /work/venv-tf.
Usage: scripts/gen_spm_tokenizer_cases.py [--count N]
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import gen_tokenizer_cases as cases  # noqa: E402

SOURCE = ROOT / "tests/fixtures/gguf_tokenizer/llama-spm.json"
OUT = ROOT / "tests/fixtures/spm_tokenizer"
SEED = 20261202
NORMAL, UNKNOWN, CONTROL, BYTE = 1, 2, 3, 6


def tokenizer_json(meta: dict, metaspace: bool) -> dict:
    from transformers.tokenization_utils_base import generate_merges

    tokens, scores, types = (meta[f"tokenizer.ggml.{k}"] for k in ("tokens", "scores", "token_type"))
    vocab = {t: i for i, t in enumerate(tokens)}
    vocab_scores = {t: (0.0 if types[i] in (UNKNOWN, CONTROL) else scores[i]) for i, t in enumerate(tokens)}
    merges = generate_merges(vocab, vocab_scores)
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, t in enumerate(tokens) if types[i] in (UNKNOWN, CONTROL)]
    replace = {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": None if metaspace else {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"}, replace]},
        "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first",
                          "split": False} if metaspace else None,
        "post_processor": None,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": tokens[meta["tokenizer.ggml.unknown_token_id"]],
                  "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": True,
                  "byte_fallback": True, "ignore_merges": False, "vocab": vocab,
                  "merges": [[a, b] for a, b in merges]},
    }


def check_llama_cpp_pairs(tok) -> None:
    base = SOURCE.with_suffix("")
    texts = base.with_suffix(".inp").read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")[:-1]
    ids = base.with_suffix(".out").read_text(encoding="utf-8").split("\n")
    for i, text in enumerate(texts):  # every text is followed by the separator
        want = [int(x) for x in ids[i].split()]
        got = tok.encode(text, add_special_tokens=False).ids
        if got != want:
            raise SystemExit(f"llama-spm pair {i} {text!r}: tokenizers gives {got}, llama.cpp's .out {want}")
    print(f"llama.cpp's {len(texts)} llama-spm test pairs reproduced")


def write_cases(tok, path: Path, count: int) -> None:
    rng = random.Random(SEED)
    with open(path, "w", encoding="utf-8") as f:
        for cat, item in cases.generate_texts(rng, count):
            text = item.decode("utf-8", "replace") if isinstance(item, bytes) else item
            ids = tok.encode(text, add_special_tokens=False).ids
            row = {"cat": cat, **({"hex": item.hex()} if isinstance(item, bytes) else {"text": text}), "ids": ids,
                   "decoded": tok.decode(ids, skip_special_tokens=False),
                   "decoded_skip": tok.decode(ids, skip_special_tokens=True)}
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"wrote {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=1200)
    args = ap.parse_args()
    import tokenizers

    meta = json.loads(SOURCE.read_text(encoding="utf-8"))
    OUT.mkdir(parents=True, exist_ok=True)
    for metaspace, case_file in ((False, "cases.jsonl"), (True, "cases_metaspace.jsonl")):
        doc = tokenizer_json(meta, metaspace)
        tok = tokenizers.Tokenizer.from_str(json.dumps(doc))
        if not metaspace:
            check_llama_cpp_pairs(tok)
            path = OUT / "tokenizer.json"
            path.write_text(json.dumps(doc, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")
            print(f"wrote {path}")
        write_cases(tok, OUT / case_file, args.count)


if __name__ == "__main__":
    main()
