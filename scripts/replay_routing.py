#!/usr/bin/env python3
"""Replays a routing trace against per-layer expert caches: LRU, LRFU (recency and
frequency) and Belady's optimum.

Input: the JSON-lines trace `charm run --routing-trace FILE` writes (one line per MoE
layer call: {"step", "layer", "rows", "experts": [[e, ...] per row], "predicted"?}; see
coordinator/dispatch/routing_observer.h and docs/benchmarks.md).

Model of the cache (what the worker's expert store does, worker/experts/expert_cache.h): each
MoE layer (and, with --workers, each worker) has its own cache of `slots` experts. A
layer call needs its batch-union (every distinct expert any row picked), each once. The
experts already resident are hits, computed first; the misses are then read in ascending
id, each evicting one expert when the cache is full:
  * LRU evicts the least recently used expert (the call's hits were just used);
  * Belady (Belady 1966, "A study of replacement algorithms for a virtual-storage
    computer", the MIN/OPT policy), at call granularity, evicts the expert whose next
    call is farthest in the future (never again counts as infinitely far). It knows the
    future, so it bounds what any demand-loading policy can hit; the unit tests check
    hits(LRU) <= hits(Belady) on random traces;
  * LRFU (simulate_calls_lrfu) evicts the expert with the lowest exponentially decayed use
    count (--half-life calls of the layer), so a frequently used expert outlives a burst
    of one-off ones that LRU would keep.
Pins are not modelled (the benchmark runs `pin: none`); prefetch is not modelled.

Usage:
  scripts/replay_routing.py TRACE [--slots 64,32,16,1] [--experts 64] [--decode-only]
                            [--workers N] [--half-life CALLS] [--json]
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


DEFAULT_HALF_LIFE = 8.0  # LRFU's, in calls of a layer: worker/experts/expert_cache.h kLrfuHalfLifeCalls


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


def cache_calls(calls: list[dict], partitions: int = 1, experts: int = 1) -> dict[tuple, list[tuple[list[int], int]]]:
    """Per cache, its calls in order: (the call's batch-union restricted to the cache's
    experts, ascending; index of the call in `calls`). A cache is (layer, worker): with
    `partitions` workers, worker w owns the contiguous experts [w * ceil(experts /
    partitions), ...) (as a topology's "0-31", "32-63" split does), one cache per layer."""
    width = -(-experts // partitions)
    out: dict[tuple, list[tuple[list[int], int]]] = defaultdict(list)
    for i, c in enumerate(calls):
        parts: dict[int, list[int]] = defaultdict(list)
        for e in sorted({e for row in c["experts"] for e in row}):
            parts[min(e // width, partitions - 1)].append(e)
        for w, union in parts.items():
            out[(c["layer"], w)].append((union, i))
    return out


def simulate_calls_lru(unions: list[list[int]], slots: int) -> list[int]:
    """Hits per call under LRU with `slots` entries: the call's resident experts are hits
    (and become most recent), then its misses load in ascending id, each evicting the
    least recently used expert when the cache is full."""
    cache: OrderedDict[int, None] = OrderedDict()
    hits = []
    for union in unions:
        resident = [e for e in union if e in cache]
        for e in resident:
            cache.move_to_end(e)
        for e in union:
            if e in cache:
                continue
            if len(cache) >= slots:
                cache.popitem(last=False)
            cache[e] = None
        hits.append(len(resident))
    return hits


def simulate_calls_belady(unions: list[list[int]], slots: int) -> list[int]:
    """Hits per call under Belady's MIN at call granularity: resident experts are hits;
    each miss (ascending id) evicts, when the cache is full, the expert whose next call is
    farthest in the future (never again = infinitely far; ties: the higher id)."""
    never = len(unions)
    # next_call[i][e]: the first call after i that uses e.
    next_call: list[dict[int, int]] = [dict() for _ in unions]
    upcoming: dict[int, int] = {}
    for i in range(len(unions) - 1, -1, -1):
        for e in unions[i]:
            next_call[i][e] = upcoming.get(e, never)
        for e in unions[i]:
            upcoming[e] = i
    cache: dict[int, int] = {}  # expert -> its next call
    hits = []
    for i, union in enumerate(unions):
        resident = [e for e in union if e in cache]
        for e in union:
            if e not in cache and len(cache) >= slots:
                victim = max(cache, key=lambda x: (cache[x], x))
                del cache[victim]
            cache[e] = next_call[i][e]
        hits.append(len(resident))
    return hits


def simulate_calls_lrfu(unions: list[list[int]], slots: int, half_life: float) -> list[int]:
    """Hits per call under LRFU (Lee et al. 2001, "LRFU: a spectrum of policies that
    subsumes the least recently used and least frequently used policies"): every expert
    has a score, each use adds 1 to it and the score halves every `half_life` calls; a
    miss evicts the resident expert with the lowest score now (ties: the least recently
    used, then the higher id). Scores survive eviction (the history of every expert, as a
    worker's usage counts do). A short half-life tends to LRU, a long one to LFU."""
    decay = 0.5 ** (1.0 / half_life)
    score: dict[int, float] = {}
    stamp: dict[int, int] = {}  # expert -> call of its last use (score as of then)
    cache: set[int] = set()
    hits = []

    def now_score(e: int, i: int) -> float:
        return score.get(e, 0.0) * decay ** (i - stamp.get(e, i))

    for i, union in enumerate(unions):
        hits.append(sum(e in cache for e in union))
        for e in union:
            if e not in cache:
                if len(cache) >= slots:
                    victim = min(cache - set(union), key=lambda x: (now_score(x, i), stamp.get(x, i), -x), default=None)
                    if victim is None:  # the call alone needs more than every slot
                        victim = min(cache, key=lambda x: (now_score(x, i), stamp.get(x, i), -x))
                    cache.remove(victim)
                cache.add(e)
        for e in union:
            score[e] = now_score(e, i) + 1.0
            stamp[e] = i
    return hits


def simulate_lru(visits: list[int], slots: int) -> list[bool]:
    """Hit (True) or miss per visit under LRU, one expert per call."""
    return [h == 1 for h in simulate_calls_lru([[e] for e in visits], slots)]


def simulate_belady(visits: list[int], slots: int) -> list[bool]:
    """Hit (True) or miss per visit under Belady's MIN, one expert per call."""
    return [h == 1 for h in simulate_calls_belady([[e] for e in visits], slots)]


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
           experts: int | None = None, half_life: float = DEFAULT_HALF_LIFE) -> list[dict]:
    """One result per slot count (slots per layer per worker): hits, visits and hit rates
    of LRU, LRFU (with `half_life`, in calls of the layer) and Belady (all caches summed),
    with per-layer counts. `partitions` splits the experts among that many workers (see
    layer_visits); `experts` defaults to the largest id + 1."""
    if experts is None:
        experts = 1 + max((e for c in calls for row in c["experts"] for e in row), default=0)
    counted_call = [(not decode_only) or c["rows"] == 1 for c in calls]
    per_cache = cache_calls(calls, partitions, experts)
    results = []
    for slots in slots_list:
        r = {"slots": slots, "partitions": partitions, "visits": 0, "lru_hits": 0, "lrfu_hits": 0,
             "belady_hits": 0, "layers": {}}
        for (layer, _), seq in sorted(per_cache.items()):
            unions = [u for u, _ in seq]
            mask = [counted_call[i] for _, i in seq]
            counts = r["layers"].setdefault(layer, {"visits": 0, "lru_hits": 0, "lrfu_hits": 0, "belady_hits": 0})
            v = sum(len(u) for u, m in zip(unions, mask) if m)
            counts["visits"] += v
            r["visits"] += v
            for key, hits in (("lru_hits", simulate_calls_lru(unions, slots)),
                              ("lrfu_hits", simulate_calls_lrfu(unions, slots, half_life)),
                              ("belady_hits", simulate_calls_belady(unions, slots))):
                counted = sum(h for h, m in zip(hits, mask) if m)
                counts[key] += counted
                r[key] += counted
        for policy in ("lru", "lrfu", "belady"):
            r[f"{policy}_hit_rate"] = r[f"{policy}_hits"] / r["visits"] if r["visits"] else 0.0
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
    ap.add_argument("--half-life", type=float, default=DEFAULT_HALF_LIFE,
                    help=f"LRFU: calls of a layer over which an expert's score halves (default {DEFAULT_HALF_LIFE:g})")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = ap.parse_args(argv)
    try:
        calls = read_trace(args.trace)
        experts = args.experts or 1 + max((e for c in calls for row in c["experts"] for e in row), default=0)
        slots = parse_slots(args.slots or "100%,50%,25%,1", experts)
    except (OSError, ValueError) as e:
        print(f"replay_routing: {e}", file=sys.stderr)
        return 2
    if not args.half_life > 0:
        print(f"replay_routing: --half-life must be > 0, got {args.half_life:g}", file=sys.stderr)
        return 2
    results = replay(calls, slots, args.decode_only, args.workers, experts, args.half_life)
    if args.json:
        print(json.dumps(results))
        return 0
    steps = len({c["step"] for c in calls})
    print(f"{args.trace}: {len(calls)} layer calls, {steps} steps, {experts} experts per layer"
          + (f", {args.workers} workers" if args.workers > 1 else "")
          + (", decode steps counted" if args.decode_only else ""))
    print(f"{'slots/layer':>11} {'visits':>8} {'LRU hit':>8} {'LRFU hit':>8} {'Belady hit':>10} "
          f"{'LRU/Belady':>10} {'LRFU/Belady':>11}")
    for r in results:
        def ratio(key):
            return r[key] / r["belady_hits"] if r["belady_hits"] else float("nan")
        print(f"{r['slots']:>11} {r['visits']:>8} {100 * r['lru_hit_rate']:>7.1f}% {100 * r['lrfu_hit_rate']:>7.1f}% "
              f"{100 * r['belady_hit_rate']:>9.1f}% {ratio('lru_hits'):>10.2f} {ratio('lrfu_hits'):>11.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
