#!/usr/bin/env python3
"""Failover on a real multi-host cluster: three `charm worker`s, each in its own network
namespace (ip netns, a veth pair with a private 10.231.X.0/30, tc netem adding LAN latency
where the kernel has it), every expert on two of them, and `charm serve` in the root
namespace. Checks, through the HTTP API:

1. an undisturbed streamed greedy completion (the reference);
2. the same request with worker w1 SIGKILLed mid-stream completes with the same text;
   failover time (kill to next token) and tokens/s before and after are printed;
3. w1 restarted rejoins (/cluster/status: up, rejoins >= 1) and takes traffic again, with
   the same text;
4. with w0 and w2 killed (experts 0-4 have no replica left) the request fails with 503
   naming the layer and experts; the server stays up, and after restarting them the next
   request has the same text again.

Where namespaces cannot be created (not root, no CAP_NET_ADMIN) or do not carry a TCP
connection from the root namespace (a sandbox that drops veth traffic), the test says why and
runs the same scenario with the workers on 127.0.0.1 ports. Namespaces and processes are
removed at exit, also on failure.
Exit 0 = pass, anything else = failure (a missing committed model fixture too).
"""
import argparse
import re
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cluster_harness import (Namespaces, cluster_status, stream_completion,  # noqa: E402
                             write_replica_topology)
from test_api import Processes, check, free_port, wait_health  # noqa: E402

PROMPT = "The quick brown fox"
MAX_TOKENS = 200
KILL_AFTER_CHUNKS = 40
TIMEOUTS = {"connect_ms": 1000, "handshake_ms": 2000, "request_ms": 3000, "heartbeat_ms": 200,
            "rejoin_min_ms": 100, "rejoin_max_ms": 1000}


def wait_for(what, predicate, timeout_s=30):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"{what}: not within {timeout_s} s")


def tokens_per_s(chunks):
    if len(chunks) < 2:
        return 0.0
    return (len(chunks) - 1) / max(1e-9, chunks[-1][0] - chunks[0][0])


class Cluster:
    def __init__(self, charm, topology, doc, procs, ns):
        self.charm, self.topology, self.doc, self.procs, self.ns = charm, topology, doc, procs, ns
        self.workers = {}
        self.base = f"http://127.0.0.1:{doc['api']['port']}"

    def start_worker(self, i, tag=""):
        name = self.doc["workers"][i]["name"]
        prefix = self.ns.prefix(i) if self.ns else []
        self.workers[name] = self.procs.start(name + tag, prefix + [self.charm, "worker", "--config",
                                                                    str(self.topology), "--name", name])

    def kill(self, name):
        p = self.workers.pop(name)
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=10)

    def check_alive(self):
        # Killed workers are expected to be dead; only the server and live workers count.
        for name, p, _ in self.procs.procs:
            if p.poll() is not None and p in self.workers.values():
                raise AssertionError(f"{name} exited early with status {p.returncode}")


def scenario(c, report):
    ref = stream_completion(c.base, PROMPT, MAX_TOKENS)
    check(ref["error"] is None and ref["done"] and ref["finish"] in ("stop", "length"),
          f"undisturbed run completes (finish {ref['finish']}, {len(ref['chunks'])} chunks)")
    check(len(ref["chunks"]) > KILL_AFTER_CHUNKS + 10, f"reference is long enough to kill mid-stream")
    report["tok/s undisturbed"] = tokens_per_s(ref["chunks"])

    # 2. SIGKILL w1 mid-stream.
    result = {}
    reader = threading.Thread(target=lambda: result.update(stream_completion(c.base, PROMPT, MAX_TOKENS)))
    before = cluster_status(c.base)["w1"]["requests"]
    reader.start()
    kill_at = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and reader.is_alive():
        # The reader fills result only at the end; watch w1's request counter instead.
        if cluster_status(c.base)["w1"]["requests"] > before + 3 * KILL_AFTER_CHUNKS // 2:
            kill_at = time.monotonic()
            c.kill("w1")
            break
        time.sleep(0.002)
    reader.join(timeout=120)
    check(kill_at is not None, "w1 was killed while the stream was running")
    check(result.get("error") is None and result.get("done"), f"disturbed stream completes: {result.get('error')}")
    check(result["text"] == ref["text"], "disturbed stream has the same text as the undisturbed run")
    check(result["finish"] == ref["finish"], "same finish_reason")
    before_kill = [ch for ch in result["chunks"] if ch[0] <= kill_at]
    after_kill = [ch for ch in result["chunks"] if ch[0] > kill_at]
    check(len(before_kill) > 0 and len(after_kill) > 0, f"the kill landed mid-stream "
          f"({len(before_kill)} chunks before, {len(after_kill)} after)")
    report["failover ms (kill to next token)"] = (after_kill[0][0] - kill_at) * 1000
    report["gap spanning the kill, ms"] = (after_kill[0][0] - before_kill[-1][0]) * 1000
    gaps = [b[0] - a[0] for a, b in zip(result["chunks"], result["chunks"][1:])]
    report["longest gap between tokens, ms"] = max(gaps) * 1000
    report["tok/s before kill"] = tokens_per_s(before_kill)
    report["tok/s after kill (w1 down)"] = tokens_per_s(after_kill)
    w1 = cluster_status(c.base)["w1"]
    check(w1["state"] == "down", f"/cluster/status shows w1 down: {w1['last_error']!r}")
    report["w1 failovers"] = w1["failovers"]

    # 3. Restart w1: it rejoins and takes traffic again.
    c.start_worker(1, "-restarted")
    wait_for("w1 rejoins", lambda: cluster_status(c.base)["w1"]["state"] == "up")
    w1 = cluster_status(c.base)["w1"]
    check(w1["rejoins"] >= 1, f"w1 rejoined (rejoins {w1['rejoins']})")
    again = stream_completion(c.base, PROMPT, MAX_TOKENS)
    check(again["text"] == ref["text"] and again["done"], "after the rejoin: same text")
    check(cluster_status(c.base)["w1"]["requests"] > w1["requests"], "w1 takes traffic again")
    report["tok/s after rejoin"] = tokens_per_s(again["chunks"])

    # 4. No replica left for experts 0-4 (w0 and w2 gone): a 503 (or error event) telling
    # the client to retry, with a request id and no worker address; the server log names
    # the layer and experts under that id. The server stays up.
    c.kill("w0")
    c.kill("w2")
    failed = stream_completion(c.base, PROMPT, MAX_TOKENS)
    message = (failed["error"] or {}).get("message", "")
    check(failed["error"] is not None, f"with no replica left the request fails: {message[:300]!r}")
    check(failed["status"] in (200, 503), f"503 or an error event (status {failed['status']})")
    request = re.search(r"\(request (\S+);", message)
    check("retry later" in message and request is not None, f"the error says retry, with a request id: {message!r}")
    check(not any(w["host"] + ":" in message for w in c.doc["workers"]), "the error shows no worker address")
    logged = [line for line in (c.procs.log_dir / "serve.log").read_text(errors="replace").splitlines()
              if f"request {request.group(1)} failed (503)" in line]
    check(len(logged) == 1 and "no live replica" in logged[0] and "layer" in logged[0],
          f"the server log names the layer and experts under the request id: {logged}")
    c.start_worker(0, "-restarted")
    c.start_worker(2, "-restarted")
    wait_for("w0 and w2 rejoin",
             lambda: all(w["state"] == "up" for w in cluster_status(c.base).values()))
    last = stream_completion(c.base, PROMPT, MAX_TOKENS)
    check(last["text"] == ref["text"] and last["done"], "the server stayed up: same text again")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--charm", required=True)
    ap.add_argument("--source-dir", required=True)
    ap.add_argument("--loopback", action="store_true", help="skip namespaces (127.0.0.1 ports)")
    a = ap.parse_args()
    fixture = Path(a.source_dir) / "tests/fixtures/models/qwen3-moe-tiny/config.json"
    if not fixture.exists():
        print(f"FAIL: committed model fixture {fixture} is missing", file=sys.stderr)
        return 1

    ns = None if a.loopback else Namespaces(3, delay_ms=1)
    why = "--loopback given" if a.loopback else ns.setup()
    if why:
        if ns:
            ns.cleanup()
        print(f"note: network namespaces not used: {why}; running the same scenario on 127.0.0.1 ports")
        ns = None
    elif ns.netem_note:
        print("note:", ns.netem_note)
    # Clean up on SIGTERM (ctest timeout) too, not only on normal exit.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    report = {"network": "namespaces (veth" + (")" if ns is None or ns.netem_note else ", netem 1 ms each way)")
              if ns else "127.0.0.1"}
    with tempfile.TemporaryDirectory(prefix="charm-failover-") as tmp:
        hosts = ns.hosts() if ns else ["127.0.0.1"] * 3
        topology, doc = write_replica_topology(a.source_dir, tmp, hosts, free_port(), TIMEOUTS)
        procs = Processes(tmp)
        ok = False
        try:
            c = Cluster(a.charm, topology, doc, procs, ns)
            for i in range(3):
                c.start_worker(i)
            procs.start("serve", [a.charm, "serve", "--config", str(topology)])
            c.workers["serve"] = procs.procs[-1][1]
            wait_health(c.base, type("Alive", (), {"check_alive": c.check_alive})())
            scenario(c, report)
            ok = True
        finally:
            procs.stop_all()
            if not ok:
                procs.dump_logs()
            if ns:
                ns.cleanup()
    print("\nfailover report:")
    for k, v in report.items():
        print(f"  {k}: {v:.1f}" if isinstance(v, float) else f"  {k}: {v}")
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
