#!/usr/bin/env python3
"""Replays a routing trace against per-layer expert caches: LRU and Belady's optimum.

Input: the JSON-lines trace `charm run --routing-trace FILE` writes (one line per MoE
layer call: {"step", "layer", "rows", "experts": [[e, ...] per row], "predicted"?}; see
coordinator/routing_observer.h and docs/benchmarks.md).

Model of the cache (what the worker's expert store does): each MoE layer has its own
cache of `slots` experts. A layer call needs its batch-union (every distinct expert any
row picked), each loaded once; the union is visited in ascending expert id. A visit is a
hit when the expert is cached, else a miss that loads it, evicting one expert if the
cache is full:
  * LRU evicts the least recently visited expert;
  * Belady (Belady 1966, "A study of replacement algorithms for a virtual-storage
    computer", the MIN/OPT policy) evicts the expert whose next visit on that layer is
    farthest in the future (never visited again counts as infinitely far). For unit-size
    items and demand loading it is optimal, so it bounds every policy: hits(LRU) <=
    hits(Belady) for the same slots.
Pins are not modelled; a pinned set is a cache that never evicts, which Belady bounds too.

Usage:
  scripts/replay_routing.py TRACE [--slots 64,32,16,1] [--experts 64] [--decode-only]
                            [--workers N] [--json]
--slots takes counts, or percentages of --experts such as 100%,50%,25% (default: 100%,
50%, 25% and 1 slot). --decode-only counts hits only on single-row calls (decode steps),
after simulating every call so the cache state is the real one.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import OrderedDict, defaultdict
from pathlib import Path


def read_trace(path: Path) -> list[dict]:
    """The trace's lines, checked: each needs int step/layer/rows and `rows` expert lists."""
    calls = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                c = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not JSON: {e}") from None
            for key in ("step", "layer", "rows", "experts"):
                if key not in c:
                    raise ValueError(f"{path}:{n}: missing key '{key}'")
            if not all(isinstance(c[k], int) and c[k] >= 0 for k in ("step", "layer", "rows")):
                raise ValueError(f"{path}:{n}: step, layer and rows must be non-negative integers")
            if not isinstance(c["experts"], list) or len(c["experts"]) != c["rows"]:
                raise ValueError(f"{path}:{n}: 'experts' must hold one list per row ({c['rows']} rows)")
            for row in c["experts"]:
                if not isinstance(row, list) or not all(isinstance(e, int) and e >= 0 for e in row):
                    raise ValueError(f"{path}:{n}: every row must be a list of expert ids")
            calls.append(c)
    return calls


def layer_visits(calls: list[dict], partitions: int = 1, experts: int = 1) -> dict[tuple, list[tuple[int, int]]]:
    """Per cache, the visit sequence in call order, each call's batch-union ascending:
    (expert, index of the call in `calls`). A cache is (layer, worker): with `partitions`
    workers, worker w owns the contiguous experts [w * ceil(experts / partitions), ...)
    (as a topology's "0-31", "32-63" split does) and has its own cache per layer."""
    width = -(-experts // partitions)
    out: dict[tuple, list[tuple[int, int]]] = defaultdict(list)
    for i, c in enumerate(calls):
        union = sorted({e for row in c["experts"] for e in row})
        for e in union:
            out[(c["layer"], min(e // width, partitions - 1))].append((e, i))
    return out


def simulate_lru(visits: list[int], slots: int) -> list[bool]:
    """Hit (True) or miss per visit under LRU with `slots` entries."""
    cache: OrderedDict[int, None] = OrderedDict()
    hits = []
    for e in visits:
        if e in cache:
            cache.move_to_end(e)
            hits.append(True)
            continue
        hits.append(False)
        if len(cache) >= slots:
            cache.popitem(last=False)
        cache[e] = None
    return hits


def simulate_belady(visits: list[int], slots: int) -> list[bool]:
    """Hit (True) or miss per visit under Belady's MIN with `slots` entries."""
    # next_use[i]: index of the next visit of visits[i] after i (len(visits) = never).
    never = len(visits)
    next_use = [never] * len(visits)
    last: dict[int, int] = {}
    for i in range(len(visits) - 1, -1, -1):
        next_use[i] = last.get(visits[i], never)
        last[visits[i]] = i
    cache: dict[int, int] = {}  # expert -> index of its next visit
    hits = []
    for i, e in enumerate(visits):
        if e in cache:
            hits.append(True)
        else:
            hits.append(False)
            if len(cache) >= slots:
                victim = max(cache, key=lambda x: (cache[x], x))  # farthest next use; ties: higher id
                del cache[victim]
        cache[e] = next_use[i]
    return hits


def parse_slots(text: str, experts: int) -> list[int]:
    out = []
    for part in text.split(","):
        part = part.strip()
        if part.endswith("%"):
            n = round(experts * float(part[:-1]) / 100)
        else:
            n = int(part)
        if n < 1:
            raise ValueError(f"--slots: '{part}' gives {n} slots; need at least 1")
        out.append(n)
    return out


def replay(calls: list[dict], slots_list: list[int], decode_only: bool = False, partitions: int = 1,
           experts: int | None = None) -> list[dict]:
    """One result per slot count (slots per layer per worker): hits, visits and hit rates
    of LRU and Belady (all caches summed), with per-layer counts. `partitions` splits the
    experts among that many workers (see layer_visits); `experts` defaults to the largest
    id + 1."""
    if experts is None:
        experts = 1 + max((e for c in calls for row in c["experts"] for e in row), default=0)
    counted_call = [(not decode_only) or c["rows"] == 1 for c in calls]
    per_cache = layer_visits(calls, partitions, experts)
    results = []
    for slots in slots_list:
        r = {"slots": slots, "partitions": partitions, "visits": 0, "lru_hits": 0, "belady_hits": 0, "layers": {}}
        for (layer, _), seq in sorted(per_cache.items()):
            experts = [e for e, _ in seq]
            mask = [counted_call[i] for _, i in seq]
            lru = simulate_lru(experts, slots)
            opt = simulate_belady(experts, slots)
            v = sum(mask)
            lh = sum(h for h, m in zip(lru, mask) if m)
            oh = sum(h for h, m in zip(opt, mask) if m)
            counts = r["layers"].setdefault(layer, {"visits": 0, "lru_hits": 0, "belady_hits": 0})
            counts["visits"] += v
            counts["lru_hits"] += lh
            counts["belady_hits"] += oh
            r["visits"] += v
            r["lru_hits"] += lh
            r["belady_hits"] += oh
        r["lru_hit_rate"] = r["lru_hits"] / r["visits"] if r["visits"] else 0.0
        r["belady_hit_rate"] = r["belady_hits"] / r["visits"] if r["visits"] else 0.0
        results.append(r)
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", type=Path)
    ap.add_argument("--experts", type=int, default=None, help="experts per layer (default: largest id + 1)")
    ap.add_argument("--slots", default=None, help="slot counts or percentages, comma-separated")
    ap.add_argument("--decode-only", action="store_true")
    ap.add_argument("--workers", type=int, default=1,
                    help="split the experts into this many contiguous ranges, one cache per layer each")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = ap.parse_args(argv)
    try:
        calls = read_trace(args.trace)
        experts = args.experts or 1 + max((e for c in calls for row in c["experts"] for e in row), default=0)
        slots = parse_slots(args.slots or "100%,50%,25%,1", experts)
    except (OSError, ValueError) as e:
        print(f"replay_routing: {e}", file=sys.stderr)
        return 2
    results = replay(calls, slots, args.decode_only, args.workers, experts)
    if args.json:
        print(json.dumps(results))
        return 0
    steps = len({c["step"] for c in calls})
    print(f"{args.trace}: {len(calls)} layer calls, {steps} steps, {experts} experts per layer"
          + (f", {args.workers} workers" if args.workers > 1 else "")
          + (", decode steps counted" if args.decode_only else ""))
    print(f"{'slots/layer':>11} {'visits':>8} {'LRU hit':>8} {'Belady hit':>10} {'LRU/Belady':>10}")
    for r in results:
        ratio = r["lru_hits"] / r["belady_hits"] if r["belady_hits"] else float("nan")
        print(f"{r['slots']:>11} {r['visits']:>8} {100 * r['lru_hit_rate']:>7.1f}% "
              f"{100 * r['belady_hit_rate']:>9.1f}% {ratio:>10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
