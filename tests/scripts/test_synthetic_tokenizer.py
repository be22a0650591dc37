#!/usr/bin/env python3
"""scripts/make_synthetic_olmoe.py's tokenizer cut: the repository's Qwen2 tokenizer fixture
made to fit a smaller vocab_size (charm refuses a tokenizer with ids past it). unittest;
registered with ctest as `synthetic_tokenizer`."""
import json
import sys
import unittest
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import make_synthetic_olmoe as mso  # noqa: E402

FIXTURE = REPO / "tests/fixtures/tokenizer"


def load(name: str) -> dict:
    return json.loads((FIXTURE / name).read_text())


class CutTokenizerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.src, cls.src_cfg = load("tokenizer.json"), load("tokenizer_config.json")
        cls.tok, cls.cfg, cls.eos = mso.cut_tokenizer(cls.src, cls.src_cfg, 50304)

    def test_every_id_below_vocab_size(self):
        ids = list(self.tok["model"]["vocab"].values()) + [a["id"] for a in self.tok["added_tokens"]]
        self.assertEqual(sorted(ids), list(range(50304)))  # dense: no hole, no id twice

    def test_added_tokens_renumbered_after_the_base_and_in_the_config(self):
        n = len(self.src["added_tokens"])
        self.assertEqual([a["content"] for a in self.tok["added_tokens"]],
                         [a["content"] for a in self.src["added_tokens"]])
        self.assertEqual([a["id"] for a in self.tok["added_tokens"]], list(range(50304 - n, 50304)))
        decoder = self.cfg["added_tokens_decoder"]
        self.assertEqual(sorted(int(k) for k in decoder), list(range(50304 - n, 50304)))
        self.assertEqual(decoder[str(self.eos)]["content"], "<|endoftext|>")

    def test_kept_tokens_and_merges_unchanged(self):
        vocab = self.tok["model"]["vocab"]
        src_vocab = self.src["model"]["vocab"]
        for token, i in vocab.items():
            self.assertEqual(src_vocab[token], i)
        merges = self.tok["model"]["merges"]
        self.assertGreater(len(merges), 40000)
        for m in merges:
            a, b = m.split(" ", 1) if isinstance(m, str) else m
            self.assertIn(a, vocab)
            self.assertIn(b, vocab)
            self.assertIn(a + b, vocab)
        # Order is kept: the cut list is a subsequence of the fixture's, in rank order.
        rank = {json.dumps(m): r for r, m in enumerate(self.src["model"]["merges"])}
        ranks = [rank[json.dumps(m)] for m in merges]
        self.assertEqual(ranks, sorted(ranks))

    def test_the_source_is_not_modified(self):
        self.assertEqual(self.src, load("tokenizer.json"))

    def test_a_vocab_without_room_for_the_bytes_is_refused(self):
        with self.assertRaisesRegex(ValueError, "fewer than the 256 byte tokens"):
            mso.cut_tokenizer(self.src, self.src_cfg, 200)


if __name__ == "__main__":
    unittest.main()
