#!/usr/bin/env python3
"""A bounded load test: `charm serve` over three replicated loopback workers
(configs/replicas.yaml's split), CLIENTS concurrent streaming clients, ROUNDS rounds (every
client sends one request per round), each request MAX_TOKENS greedy tokens. Requires zero
errors and every answer complete (a finish_reason and [DONE], the same text for the same
prompt), samples the coordinator's RSS every 20 ms, reports the peak, and requires memory
flat: RSS after the last round within max(8 MiB, 10 %) of RSS after the warm-up rounds
(the HTTP server's 64 threads each touch their stack and malloc arena the first time
they serve, about 16 MiB in all, then RSS stays flat: measured 112.6 MiB after round 1,
128.0 MiB from round 12 to round 20).
Exit 0 = pass, anything else = failure (a missing committed model fixture too).
"""
import argparse
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cluster_harness import rss_kib, stream_completion, write_replica_topology  # noqa: E402
from test_api import Processes, check, free_port, wait_health  # noqa: E402

PROMPTS = ["The quick brown fox", "Once upon a time", "In the beginning", "Hello, world"]
TIMEOUTS = {"connect_ms": 1000, "request_ms": 5000, "heartbeat_ms": 500}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--charm", required=True)
    ap.add_argument("--source-dir", required=True)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=16)
    ap.add_argument("--warmup-rounds", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=48)
    a = ap.parse_args()
    fixture = Path(a.source_dir) / "tests/fixtures/models/qwen3-moe-tiny/config.json"
    if not fixture.exists():
        print(f"FAIL: committed model fixture {fixture} is missing", file=sys.stderr)
        return 1

    with tempfile.TemporaryDirectory(prefix="charm-load-") as tmp:
        topology, doc = write_replica_topology(a.source_dir, tmp, ["127.0.0.1"] * 3, free_port(), TIMEOUTS)
        procs = Processes(tmp)
        ok = False
        try:
            for w in doc["workers"]:
                procs.start(w["name"], [a.charm, "worker", "--config", str(topology), "--name", w["name"]])
            serve = procs.start("serve", [a.charm, "serve", "--config", str(topology)])
            base = f"http://127.0.0.1:{doc['api']['port']}"
            wait_health(base, procs)

            samples, stop = [], threading.Event()

            def sample():
                while not stop.is_set():
                    samples.append(rss_kib(serve.pid))
                    time.sleep(0.02)

            sampler = threading.Thread(target=sample)
            sampler.start()
            rss_after_round, answers, total_tokens = [], {}, 0
            start = time.monotonic()
            with ThreadPoolExecutor(max_workers=a.clients) as pool:
                for rnd in range(a.rounds):
                    prompts = [PROMPTS[(rnd + i) % len(PROMPTS)] for i in range(a.clients)]
                    results = list(pool.map(lambda p: (p, stream_completion(base, p, a.max_tokens)), prompts))
                    for prompt, r in results:
                        if r["error"] is not None or not r["done"] or r["finish"] not in ("stop", "length"):
                            raise AssertionError(f"round {rnd}: incomplete answer for {prompt!r}: {r['error']}, "
                                                 f"finish {r['finish']}, done {r['done']}")
                        if answers.setdefault(prompt, r["text"]) != r["text"]:
                            raise AssertionError(f"round {rnd}: {prompt!r} answered differently")
                        total_tokens += len(r["chunks"])
                    rss_after_round.append(rss_kib(serve.pid))
            elapsed = time.monotonic() - start
            stop.set()
            sampler.join()
            requests = a.clients * a.rounds
            check(True, f"{requests} requests from {a.clients} concurrent clients: zero errors, all complete")
            warm = min(a.warmup_rounds, a.rounds)
            first, last = rss_after_round[warm - 1], rss_after_round[-1]
            tolerance = max(8 * 1024, first // 10)
            print(f"\nload report: {a.clients} clients x {a.rounds} rounds = {requests} streamed requests, "
                  f"{a.max_tokens} max tokens each")
            print(f"  wall time: {elapsed:.1f} s, {total_tokens} chunks, {total_tokens / elapsed:.1f} tok/s aggregate, "
                  f"{requests / elapsed:.2f} requests/s")
            print(f"  coordinator RSS: peak {max(samples) / 1024:.1f} MiB; after warm-up (round {warm}) "
                  f"{first / 1024:.1f} MiB, "
                  f"after round {a.rounds} {last / 1024:.1f} MiB (tolerance {tolerance / 1024:.1f} MiB)")
            print("  RSS after each round (MiB): " + ", ".join(f"{v / 1024:.1f}" for v in rss_after_round))
            check(last - first <= tolerance, "memory flat across the run")
            ok = True
        finally:
            procs.stop_all()
            if not ok:
                procs.dump_logs()
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
