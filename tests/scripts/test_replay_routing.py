#!/usr/bin/env python3
"""scripts/replay_routing.py on hand-made traces whose LRU, LRFU and Belady counts are worked
out by hand (unittest; registered with ctest as `replay_routing`)."""
import io
import json
import random
import sys
import tempfile
import unittest
from contextlib import redirect_stdout
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import replay_routing as rr  # noqa: E402


def trace(path: Path, calls: list[tuple[int, int, list[list[int]]]]) -> Path:
    with open(path, "w") as f:
        for step, layer, rows in calls:
            f.write(json.dumps({"step": step, "layer": layer, "rows": len(rows), "experts": rows}) + "\n")
    return path


class SimulationTest(unittest.TestCase):
    def test_cyclic_pattern_defeats_lru_not_belady(self):
        # A B C A B C with 2 slots. LRU: every visit misses. Belady: A, B, C miss (C
        # evicts B, used later than A), A hits, B misses (evicts A, never used again),
        # C hits -> 2 hits.
        seq = [0, 1, 2, 0, 1, 2]
        self.assertEqual(rr.simulate_lru(seq, 2), [False] * 6)
        self.assertEqual(rr.simulate_belady(seq, 2), [False, False, False, True, False, True])

    def test_lru_recency(self):
        # 2 slots: A B A C B -> A,B miss; A hit; C evicts B (LRU); B misses.
        self.assertEqual(rr.simulate_lru([0, 1, 0, 2, 1], 2), [False, False, True, False, False])
        self.assertEqual(rr.simulate_belady([0, 1, 0, 2, 1], 2), [False, False, True, False, True])

    def test_resident_experts_of_a_call_are_used_first(self):
        # 1 slot, calls {0,5} then {5,7}: after call 1 the slot holds 5 (loaded last);
        # call 2 finds 5 resident (a hit) before loading 7. Visiting in id order instead
        # would not matter here, but {3,5} then {3,9} shows it: 5 is resident after call 1,
        # 3 is not, so call 2 has no hit under either policy.
        self.assertEqual(rr.simulate_calls_lru([[0, 5], [5, 7]], 1), [0, 1])
        self.assertEqual(rr.simulate_calls_belady([[0, 5], [5, 7]], 1), [0, 1])
        self.assertEqual(rr.simulate_calls_lru([[3, 5], [3, 9]], 1), [0, 0])
        # Belady keeps what the next call needs: 2 slots, {1,2,3} {1} -> evict 2 or 3
        # (never used again; ties: higher id), keep 1: a hit. LRU evicts 1 (oldest).
        self.assertEqual(rr.simulate_calls_belady([[1, 2, 3], [1]], 2), [0, 1])
        self.assertEqual(rr.simulate_calls_lru([[1, 2, 3], [1]], 2), [0, 0])

    def test_enough_slots_only_cold_misses(self):
        seq = [3, 1, 3, 2, 1, 2, 3]
        for sim in (rr.simulate_lru, rr.simulate_belady):
            self.assertEqual(sum(not h for h in sim(seq, 3)), 3)

    def test_lrfu_keeps_the_frequent_expert_lru_drops(self):
        # 2 slots: 0 0 0 1 2 0. LRU: 2 evicts 0 (used before 1), so the last 0 misses: 2
        # hits. LRFU: 0's score (~3) beats 1's (1), so 2 evicts 1 and the last 0 hits: 3.
        seq = [[0], [0], [0], [1], [2], [0]]
        self.assertEqual(rr.simulate_calls_lru(seq, 2), [0, 1, 1, 0, 0, 0])
        self.assertEqual(rr.simulate_calls_lrfu(seq, 2, half_life=32), [0, 1, 1, 0, 0, 1])
        # Scores decay: with a half-life of 0.5 calls 0's old uses are worth nothing by
        # call 4, so LRFU evicts by recency there, as LRU does.
        self.assertEqual(rr.simulate_calls_lrfu(seq, 2, half_life=0.5), [0, 1, 1, 0, 0, 0])

    def test_lrfu_bounds(self):
        rng = random.Random(11)
        for _ in range(200):
            seq = [[min(rng.randrange(12), rng.randrange(12))] for _ in range(rng.randrange(1, 60))]
            for slots in (1, 2, 3, 5, 8):
                lru, opt = rr.simulate_calls_lru(seq, slots), rr.simulate_calls_belady(seq, slots)
                # A vanishing half-life is LRU exactly; no policy beats Belady.
                self.assertEqual(rr.simulate_calls_lrfu(seq, slots, half_life=1e-3), lru)
                self.assertLessEqual(sum(rr.simulate_calls_lrfu(seq, slots, half_life=16)), sum(opt))

    def test_belady_never_below_lru(self):
        rng = random.Random(7)
        for _ in range(200):
            seq = [min(rng.randrange(12), rng.randrange(12)) for _ in range(rng.randrange(1, 60))]
            for slots in (1, 2, 3, 5, 8):
                self.assertGreaterEqual(sum(rr.simulate_belady(seq, slots)), sum(rr.simulate_lru(seq, slots)))


class ReplayTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.tmp = Path(self.dir.name)

    def tearDown(self):
        self.dir.cleanup()

    def test_union_per_call_layers_apart_and_decode_only(self):
        # Layer 0: a 2-row prefill whose union is {1, 2, 3} (expert 2 twice: one visit),
        # then decode steps {1, 4} and {2, 1}. Layer 5: {7}, {7}, {7}.
        path = trace(self.tmp / "t.jsonl", [
            (0, 0, [[2, 1], [3, 2]]), (0, 5, [[7], [7]]),
            (1, 0, [[4, 1]]), (1, 5, [[7]]),
            (2, 0, [[2, 1]]), (2, 5, [[7]]),
        ])
        calls = rr.read_trace(path)
        # 2 slots, layer 0 visits: 1 2 3 | 1 4 | 1 2
        #   LRU:    M M M | M M | H M  -> 1 hit
        #   Belady: M M M(evict 2: next use 6 > 1's 3) | H M(evict 3: never) | H M -> 2 hits
        # layer 5 visits: 7 | 7 | 7 -> 2 hits either way.
        [r] = rr.replay(calls, [2])
        #   LRFU:   M M M(evict 2: equal scores, higher id) | H M(evict 3, not in the call)
        #           | H M -> 2 hits
        self.assertEqual(r["layers"][0], {"visits": 7, "lru_hits": 1, "lrfu_hits": 2, "belady_hits": 2})
        self.assertEqual(r["layers"][5], {"visits": 3, "lru_hits": 2, "lrfu_hits": 2, "belady_hits": 2})
        self.assertEqual((r["visits"], r["lru_hits"], r["lrfu_hits"], r["belady_hits"]), (10, 3, 4, 4))
        # Decode only: the prefill's visits are simulated but not counted.
        [d] = rr.replay(calls, [2], decode_only=True)
        self.assertEqual(d["layers"][0], {"visits": 4, "lru_hits": 1, "lrfu_hits": 2, "belady_hits": 2})
        self.assertEqual(d["layers"][5], {"visits": 2, "lru_hits": 2, "lrfu_hits": 2, "belady_hits": 2})

    def test_workers_have_their_own_caches(self):
        # 4 experts, 2 workers: {0, 1} and {2, 3}. One slot per worker-layer.
        # Calls: {0,2} {0,2} {1,3} {0,2}. One shared 1-slot cache: call 1 leaves 2
        # resident, call 2 hits it (resident first) and leaves 0, then nothing: 1 hit.
        # Per worker: w0 sees 0 0 1 0 (LRU: M H M M; Belady: same, 1 hit), w1 2 2 3 2.
        path = trace(self.tmp / "t.jsonl", [(0, 0, [[0, 2]]), (1, 0, [[2, 0]]), (2, 0, [[1, 3]]), (3, 0, [[0, 2]])])
        calls = rr.read_trace(path)
        [shared] = rr.replay(calls, [1], experts=4)
        self.assertEqual((shared["visits"], shared["lru_hits"]), (8, 1))
        [split] = rr.replay(calls, [1], partitions=2, experts=4)
        self.assertEqual(split["layers"][0], {"visits": 8, "lru_hits": 2, "lrfu_hits": 2, "belady_hits": 2})

    def test_slots_as_percentages(self):
        self.assertEqual(rr.parse_slots("100%,50%,25%,1", 64), [64, 32, 16, 1])
        with self.assertRaises(ValueError):
            rr.parse_slots("0", 64)

    def test_malformed_traces_are_rejected_naming_the_line(self):
        cases = {
            "not json\n": "t.jsonl:1: not JSON",
            '{"step": 0, "layer": 0, "rows": 1}\n': "missing key 'experts'",
            '{"step": 0, "layer": -1, "rows": 1, "experts": [[1]]}\n': "non-negative integers",
            '{"step": 0, "layer": 0, "rows": 2, "experts": [[1]]}\n': "one list per row (2 rows)",
            '{"step": 0, "layer": 0, "rows": 1, "experts": [["x"]]}\n': "list of expert ids",
        }
        for text, needle in cases.items():
            path = self.tmp / "t.jsonl"
            path.write_text(text)
            with self.assertRaises(ValueError) as ctx:
                rr.read_trace(path)
            self.assertIn(needle, str(ctx.exception))
            self.assertEqual(rr.main([str(path)]), 2)

    def test_table(self):
        path = trace(self.tmp / "t.jsonl", [(0, 0, [[0]]), (1, 0, [[1]]), (2, 0, [[0]])])
        out = io.StringIO()
        with redirect_stdout(out):
            self.assertEqual(rr.main([str(path), "--slots", "1,2"]), 0)
        lines = out.getvalue().splitlines()
        self.assertIn("3 layer calls, 3 steps, 2 experts per layer", lines[0])
        self.assertEqual(lines[2].split(), ["1", "3", "0.0%", "0.0%", "0.0%", "nan", "nan"])
        self.assertEqual(lines[3].split(), ["2", "3", "33.3%", "33.3%", "33.3%", "1.00", "1.00"])
        self.assertEqual(rr.main([str(path), "--half-life", "0"]), 2)


if __name__ == "__main__":
    unittest.main()
