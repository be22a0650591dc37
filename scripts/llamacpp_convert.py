#!/usr/bin/env python3
"""Runs llama.cpp's own convert_hf_to_gguf.py on the synthetic OLMoE checkpoint, with two
changes: the tokenizer's vocabulary is cut to the model's vocab_size (and its merges to
those among the kept tokens), and a tokenizer whose pre-tokenizer hash the converter does
not know is named "qwen2" (the hash is of token ids, and a cut vocabulary gives other ids
than any released model; the split regex is still Qwen2's).

Why: scripts/make_synthetic_olmoe.py gives its checkpoint vocab_size 50304 (OLMoE's) but
the repository's Qwen2 fixture tokenizer, whose ids reach 151 k. The converter asserts
max(tokenizer id) < vocab_size (TextModel.get_vocab_base) and stops. Here
transformers.AutoTokenizer.from_pretrained returns the real tokenizer behind a proxy whose
`vocab` holds only the ids < vocab_size; everything else (encoding, the pre-tokenizer
hash that picks "qwen2", merges, special tokens) is the real tokenizer's. Tokens with
larger ids (Qwen2's special tokens among them) are left out of the GGUF; llama.cpp warns
about the special-token ids it then cannot find. Timing is not affected: llama-bench feeds
random token ids < n_vocab and never tokenizes text.

Usage (in a Python environment with torch, transformers, sentencepiece, numpy):
  llamacpp_convert.py LLAMA_CPP_DIR MODEL_DIR --outtype bf16 --outfile OUT.gguf
(every argument after LLAMA_CPP_DIR goes to convert_hf_to_gguf.py unchanged)
"""
from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path


class CutVocabTokenizer:
    """A tokenizer whose `vocab` property keeps only ids < vocab_size; the rest delegates."""

    def __init__(self, tokenizer, vocab_size: int):
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)

    @property
    def vocab(self) -> dict[str, int]:
        return {t: i for t, i in self._tokenizer.vocab.items() if i < self._vocab_size}

    def get_vocab(self) -> dict[str, int]:
        return self.vocab


def keep_consistent_merges(vocab_size: int, model_dir: Path) -> None:
    """Writes only the merges whose two parts and result are all kept tokens (ids <
    vocab_size), and only the special ids among them: the others would name tokens the cut
    vocabulary lacks, and a reader that checks them against the vocabulary (charm,
    tokenizers) would refuse the file."""
    import gguf

    tokenizer = json.loads((model_dir / "tokenizer.json").read_text())
    kept = {t for t, i in tokenizer["model"]["vocab"].items() if i < vocab_size}
    add_to_gguf = gguf.SpecialVocab.add_to_gguf

    def filtered(self, gw, quiet: bool = False):
        pairs = [m.split(" ", 1) if isinstance(m, str) else m for m in self.merges]
        self.merges = [" ".join(p) for p in pairs if len(p) == 2 and p[0] in kept and p[1] in kept
                       and p[0] + p[1] in kept]
        # Special ids past the cut (Qwen2's <|im_end|> is 151645) would name no token.
        self.special_token_ids = {k: v for k, v in self.special_token_ids.items() if v < vocab_size}
        return add_to_gguf(self, gw, quiet)

    gguf.SpecialVocab.add_to_gguf = filtered


def name_unknown_pre_tokenizer_qwen2() -> None:
    """TextModel.get_vocab_base_pre, but "qwen2" where it would raise NotImplementedError:
    the checkpoint's tokenizer is the repository's Qwen2 byte-level BPE, which
    scripts/make_synthetic_olmoe.py may already have cut to vocab_size (then no hash the
    converter knows matches)."""
    from conversion import base

    original = base.TextModel.get_vocab_base_pre

    def get_vocab_base_pre(self, tokenizer) -> str:
        try:
            return original(self, tokenizer)
        except NotImplementedError:
            return "qwen2"

    base.TextModel.get_vocab_base_pre = get_vocab_base_pre


def main() -> int:
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    llama_cpp = Path(sys.argv[1]).resolve()
    model_dir = Path(sys.argv[2])
    vocab_size = json.loads((model_dir / "config.json").read_text())["vocab_size"]

    import transformers
    load = transformers.AutoTokenizer.from_pretrained

    def from_pretrained(*args, **kwargs):
        return CutVocabTokenizer(load(*args, **kwargs), vocab_size)

    transformers.AutoTokenizer.from_pretrained = from_pretrained
    sys.path.insert(0, str(llama_cpp / "gguf-py"))
    keep_consistent_merges(vocab_size, model_dir)
    sys.path.insert(0, str(llama_cpp))
    name_unknown_pre_tokenizer_qwen2()
    sys.argv = [str(llama_cpp / "convert_hf_to_gguf.py")] + sys.argv[2:]
    runpy.run_path(sys.argv[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
