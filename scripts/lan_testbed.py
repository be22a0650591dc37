#!/usr/bin/env python3
"""A LAN test bed on one machine (issue 17): each charm worker in its own network namespace
behind a veth pair limited to a LAN's bandwidth, a relay in front of each worker adding a
LAN's round-trip time, and the coordinator in the root namespace. Measures decode tok/s
for 1 stream and the aggregate of 16, for 1, 2 and 4 workers, at each RTT, beside the
ceiling the model allows.

A BENCHMARK, NOT A TEST: nothing asserts, CI never runs it. Needs root (ip netns, tc).
It uses only the addresses it creates (10.231.X.0/30 links that no address or route of the
machine uses, tests/integration/cluster_harness.py's Namespaces) and 127.0.0.1; an
`unreachable` route over 10.231.0.0/16 in the root namespace keeps test traffic off the
default route even if a link goes down. Bandwidth: `tc qdisc ... tbf rate RATE` on both
ends of every link (this kernel has tbf and htb, no netem). Delay: scripts/lan_relay.py
(a user-space relay, half the RTT each way) between the coordinator and each worker. Every
load is bounded in requests and time (--time-limit per load); everything it started is
stopped and removed at exit, also on failure or Ctrl-C.

What one run does:
  1. single node (no network): decode tok/s for 1 stream and 16 streams: the compute term.
  2. for each worker count N (--workers): N namespaces, N `charm worker`s (the experts split
     evenly by id), the relay, `charm serve`; for each RTT (--rtt-ms, plus 0: the bed's own
     overhead), 1 stream and 16 streams of --tokens tokens each (temperature 0).
Each load runs --repeat times and the fastest is kept (the machine is shared). Per row: decode tok/s (1 stream: 1 / mean inter-token gap; 16 streams: generated tokens /
wall time), the wire bytes per token (coordinator<->workers, both ways, from
/cluster/status, per prompt or generated position) and per MoE layer, the relay's measured
added one-way delay, and the ceiling
    streams / (t_compute(streams) + moe_layers x RTT + streams x bytes_per_token / bandwidth)
with t_compute from step 1 (the same work on the same cores, no wire) and the fraction of
it reached (issue 17's goal: >= 0.8). On one machine a cluster can beat its single node's
step time (the coordinator's attention and the workers' experts run in separate processes
at once), so the report also gives the bed's own ceiling, streams / (t_0 + moe_layers x
RTT), t_0 being the same cluster's measured step time with no added delay (its compute,
framing and bytes on the link): what one round trip per MoE layer allows.

On one machine the workers share its cores with the coordinator, so more workers cannot
add compute here, unless each worker is given a machine's worth of CPU of its own:
--worker-cpu F puts every worker in its own cgroup (v1 `cpu` controller) limited to F cores
(cpu.cfs_quota_us = F x cpu.cfs_period_us), so N workers hold N x F cores between them,
as N small machines would; with F small the workers' expert compute dominates a step, and
the report's `x 1w` column (tok/s over the 1-worker row of the same RTT and streams) shows
whether aggregate throughput grows with the number of workers, and the JSON's
workers_throttled_s (per worker, the seconds it waited for quota during a row's loads) which
side was the bottleneck. N x F plus the coordinator's share must fit the machine's cores
for the emulation to hold.

Usage (as root; build first: cmake --build build --target charm):
  scripts/lan_testbed.py [--model DIR|fixture] [--workers 1,2,4] [--rtt-ms 0.2,1,5]
      [--rate 1gbit] [--streams 1,16] [--tokens 32] [--threads 2] [--micro-batches 0|1|2]
      [--worker-cpu F] [--time-limit 180] [--json FILE]
Default model: the demo checkpoint scripts/serve.sh builds
(~/.cache/charm/models/qwen2.5-0.5b-moe/checkpoint); `fixture` = the tiny Qwen3-MoE test
fixture (no download; network-bound, compute negligible).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests/integration"))
sys.path.insert(0, str(REPO / "scripts"))

from bench_serve import Load, Server, free_port, request_mix, wait_ready  # noqa: E402
from bench_util import log, machine  # noqa: E402
from cluster_harness import Namespaces  # noqa: E402

FIXTURE = REPO / "tests/fixtures/models/qwen3-moe-tiny"
DEMO = Path(os.environ.get("CHARM_CACHE", Path.home() / ".cache/charm")) / "models/qwen2.5-0.5b-moe/checkpoint"
RATE_UNITS = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}


def rate_bits(rate: str) -> float:
    """'1gbit' -> 1e9 (bits per second), as tc spells rates."""
    for unit, scale in RATE_UNITS.items():
        if rate.endswith(unit) and rate[: -len(unit)].replace(".", "", 1).isdigit():
            return float(rate[: -len(unit)]) * scale
    raise SystemExit(f"--rate {rate!r}: want a number and kbit, mbit or gbit (tc's spelling)")


def moe_layers(model: Path) -> int:
    """MoE decoder layers of an HF config (the round trips per token per worker at most)."""
    c = json.loads((model / "config.json").read_text())
    layers = c["num_hidden_layers"]
    dense = set(c.get("mlp_only_layers") or [])
    dense |= set(range(c.get("first_k_dense_replace") or 0))
    step = c.get("decoder_sparse_step") or 1
    return sum(1 for i in range(layers) if i not in dense and (i + 1) % step == 0)


def expert_ranges(num_experts: int, n: int) -> list[str]:
    """Experts split evenly by id over n workers: ["0-7", "8-15"]."""
    bounds = [num_experts * i // n for i in range(n + 1)]
    return [f"{bounds[i]}-{bounds[i + 1] - 1}" for i in range(n)]


def write_topologies(folder: Path, model: Path, threads: int, api_port: int, worker_hosts: list[tuple[str, int]],
                     relay_ports: list[int], secret: Path, micro_batches: int = 0,
                     worker_threads: int | None = None) -> tuple[Path, Path]:
    """The workers' topology (each listens on its namespace address) and the coordinator's
    (each worker reached through its relay on 127.0.0.1): the same workers and experts, and
    the cluster secret a LAN needs (the authenticated handshake, as users run it).
    `worker_threads`: the workers' thread count where it differs from the coordinator's."""
    config = json.loads((model / "config.json").read_text())
    num_experts = config.get("num_experts") or config.get("num_local_experts")
    ranges = expert_ranges(num_experts, len(worker_hosts))
    paths = []
    for tag, addrs, t in (("workers", worker_hosts, worker_threads or threads),
                          ("coordinator", [("127.0.0.1", p) for p in relay_ports], threads)):
        head = (f"model: {model}\nmodel_name: lan\nthreads: {t}\nmode: cluster\n"
                f"api: {{host: 127.0.0.1, port: {api_port}}}\ncluster: {{secret_file: {secret}}}\n"
                "timeouts: {connect_ms: 10000, request_ms: 600000}\n"
                f"serving: {{micro_batches: {micro_batches}}}\nworkers:\n")
        text = head + "".join(f"  - {{name: w{i}, host: {h}, port: {p}, experts: \"{r}\"}}\n"
                              for i, ((h, p), r) in enumerate(zip(addrs, ranges)))
        path = folder / f"lan-{len(worker_hosts)}w-{tag}.yaml"
        path.write_text(text)
        paths.append(path)
    return paths[0], paths[1]


def wire_bytes(port: int) -> int:
    """Bytes both ways between the coordinator and all its workers, from /cluster/status."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/cluster/status", timeout=10) as r:
        workers = json.loads(r.read())["workers"]
    return sum(w["bytes_in"] + w["bytes_out"] for w in workers)


class Relay:
    """scripts/lan_relay.py as a child process: one listening port per target."""

    def __init__(self, targets: list[tuple[str, int]]):
        self.proc = subprocess.Popen([sys.executable, str(REPO / "scripts/lan_relay.py")] +
                                     [f"{h}:{p}" for h, p in targets],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline().split()
        if not line or line[0] != "listening":
            raise RuntimeError(f"lan_relay.py did not start: {line}")
        self.ports = [int(p) for p in line[1:]]

    def command(self, text: str) -> dict:
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()


class CpuCaps:
    """One cgroup (v1 `cpu` controller) per worker, each limited to `cores` CPUs by CFS
    quota: the workers then compute as N separate small machines would, not on a shared pool.
    Removed by cleanup() once the processes in it have exited."""

    ROOT = Path("/sys/fs/cgroup/cpu")

    def __init__(self, cores: float):
        self.cores, self.groups = cores, []

    @classmethod
    def available(cls) -> bool:
        return (cls.ROOT / "cpu.cfs_quota_us").exists()

    def add(self, pid: int) -> None:
        """A new group for process `pid` (all its threads, and those it starts later)."""
        group = self.ROOT / f"charm-lan-{os.getpid()}-{len(self.groups)}"
        group.mkdir()
        self.groups.append(group)
        period = int((group / "cpu.cfs_period_us").read_text())
        (group / "cpu.cfs_quota_us").write_text(str(max(1000, round(self.cores * period))))
        (group / "cgroup.procs").write_text(str(pid))
        if str(pid) not in (group / "cgroup.procs").read_text().split():
            raise RuntimeError(f"process {pid} did not enter {group}")

    def throttled_s(self) -> list[float]:
        """Per group, the seconds its processes waited for quota so far."""
        out = []
        for g in self.groups:
            stat = dict(line.split() for line in (g / "cpu.stat").read_text().splitlines())
            out.append(int(stat.get("throttled_time", 0)) / 1e9)
        return out

    def cleanup(self) -> None:
        for g in self.groups:
            for _ in range(50):  # the processes may still be exiting
                try:
                    g.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)
            else:
                log(f"could not remove {g} (processes still in it)")
        self.groups = []


def measure(port: int, streams: int, tokens: int, time_limit: float, seed: int, wire: bool = True) -> dict:
    """One bounded load: `streams` clients, one request each, `tokens` tokens, 8-word prompts;
    `wire`: read the cluster's wire bytes before and after (a single node has none)."""
    requests = request_mix(streams, (8, 8), (tokens, tokens), seed)
    before = wire_bytes(port) if wire else 0
    load = Load("127.0.0.1", port, requests, streams, "completions", None, time.monotonic() + time_limit, time_limit)
    start, end = load.run()
    after = wire_bytes(port) if wire else 0
    recs = load.records
    done = [r for r in recs if r["ok"]]
    gaps = [g for r in done for g in r["gaps_s"]]
    generated = sum(r["tokens"] for r in recs)
    positions = generated + sum(r["prompt_tokens"] or 0 for r in recs)
    first = min((r["t_send"] + r["ttft_s"] for r in done if r["ttft_s"] is not None), default=start)
    decode_tokens = sum(max(r["tokens"] - 1, 0) for r in done)
    row = {"streams": streams, "completed": len(done), "failed": len(recs) - len(done),
           "generated": generated, "wall_s": end - start,
           "bytes_per_position": (after - before) / positions if positions else None}
    if streams == 1:
        row["decode_tok_s"] = len(gaps) / sum(gaps) if gaps else None
    else:
        row["decode_tok_s"] = decode_tokens / (end - first) if end > first else None
    return row


def run_single_node(args, folder: Path) -> dict[int, float]:
    """t_compute: seconds per decode step of `streams` sequences with no wire."""
    server = Server(folder, "single")
    server.port = free_port()
    cfg = folder / "single.yaml"
    cfg.write_text(f"model: {args.model}\nmodel_name: lan\nthreads: {args.threads}\nmode: single-node\n"
                   f"api: {{host: 127.0.0.1, port: {server.port}}}\n")
    server.spawn([args.charm, "serve", "--config", cfg], "serve")
    try:
        wait_ready(server, "completions", None, args.startup_timeout)
        out = {}
        for s in args.streams:
            rows = [measure(server.port, s, args.tokens, args.time_limit, args.seed, wire=False)
                    for _ in range(args.repeat)]
            out[s] = s / max(r["decode_tok_s"] or 1e-9 for r in rows)  # the best of the repeats
            log(f"single node, {s} streams: {out[s] * 1e3:.1f} ms per decode step")
        return out
    finally:
        server.stop()


def run_cluster(args, folder: Path, n: int, t_compute: dict[int, float], layers: int) -> list[dict]:
    ns = Namespaces(n, rate=args.rate)
    relay, server = None, Server(folder, f"cluster{n}")
    caps = CpuCaps(args.worker_cpu) if args.worker_cpu else None
    rows = []
    try:
        why = ns.setup()
        if why:
            raise RuntimeError(f"network namespaces: {why}")
        worker_hosts = [(h, 7800 + i) for i, h in enumerate(ns.hosts())]
        relay = Relay(worker_hosts)
        server.port = free_port()
        secret = folder / "cluster.secret"
        if not secret.exists():
            subprocess.run([str(args.charm), "secret", "new", str(secret)], check=True, capture_output=True)
        wcfg, ccfg = write_topologies(folder, args.model, args.threads, server.port, worker_hosts, relay.ports,
                                      secret, args.micro_batches, caps and max(1, math.ceil(args.worker_cpu)))
        for i in range(n):
            server.spawn(ns.prefix(i) + [args.charm, "worker", "--config", wcfg, "--name", f"w{i}"], f"w{i}")
            if caps:
                caps.add(server.pids()[-1])  # `ip netns exec` execs the worker: the same pid
        # The relay accepts at once and resets when its worker is not listening yet, which
        # the coordinator's start-up takes for a dead worker: wait for every worker first.
        wait_listening(server, folder, [f"w{i}" for i in range(n)], args.startup_timeout)
        server.spawn([args.charm, "serve", "--config", ccfg], "serve")
        wait_ready(server, "completions", None, args.startup_timeout)
        bw = rate_bits(args.rate) / 8
        for rtt in [0.0] + args.rtt_ms:
            relay.command(f"delay {rtt / 2}")
            wait_ready(server, "completions", None, args.startup_timeout)  # connections warm at this delay
            relay.command("stats")
            for s in args.streams:
                throttled = caps.throttled_s() if caps else []
                repeats = [measure(server.port, s, args.tokens, args.time_limit, args.seed) for _ in range(args.repeat)]
                row = max(repeats, key=lambda r: r["decode_tok_s"] or 0)  # the best: this machine is shared
                added = relay.command("stats")
                per_step = t_compute[s] + layers * rtt / 1e3 + s * (row["bytes_per_position"] or 0) / bw
                row.update({"workers": n, "rtt_ms": rtt, "relay_added_ms_mean": added["added_ms_mean"],
                            "ceiling_tok_s": s / per_step})
                if caps:  # per worker, the seconds it waited for quota during these loads
                    row["workers_throttled_s"] = [b - a for a, b in zip(throttled, caps.throttled_s())]
                row["of_ceiling"] = row["decode_tok_s"] / row["ceiling_tok_s"] if row["decode_tok_s"] else None
                rows.append(row)
                log(f"{n} workers, RTT {rtt} ms, {s} streams: {row['decode_tok_s'] or 0:.2f} tok/s "
                    f"(ceiling {row['ceiling_tok_s']:.2f}), {row['bytes_per_position'] or 0:.0f} B/position")
        return rows
    finally:
        server.stop()
        if relay:
            relay.stop()
        ns.cleanup()
        if caps:
            caps.cleanup()


def wait_listening(server: Server, folder: Path, tags: list[str], timeout: float) -> None:
    """Until every worker's log says it listens; RuntimeError if one exits or `timeout` s pass."""
    deadline = time.monotonic() + timeout
    for tag in tags:
        log_file = folder / f"{server.name}-{tag}.log"
        while "listening on" not in (log_file.read_text() if log_file.exists() else ""):
            server.check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"worker {tag} not listening after {timeout} s (see {log_file})")
            time.sleep(0.2)


def print_report(res: dict) -> None:
    print(f"\nmodel {res['model']} ({res['moe_layers']} MoE layers), link {res['rate']}, "
          f"{res['tokens']} tokens per stream, threads {res['threads']}, "
          f"micro_batches {res.get('micro_batches', 0)}, "
          f"worker cpu {res.get('worker_cpu') or 'unlimited'}, commit {res['commit']}")
    print("single node, ms per decode step: " +
          ", ".join(f"{s} streams {t * 1e3:.1f}" for s, t in res["t_compute_s"].items()))
    print(f"{'workers':>7} {'RTT ms':>6} {'added':>6} {'streams':>7} {'tok/s':>8} {'ceiling':>8} {'of ceil':>7} "
          f"{'bed ceil':>8} {'of bed':>6} {'x 1w':>5} {'B/pos':>8} {'B/pos/layer':>11} {'failed':>6}")
    for r in res["rows"]:
        def f(v, d=2):
            return "-" if v is None else f"{v:.{d}f}"
        per_layer = None if r["bytes_per_position"] is None else r["bytes_per_position"] / res["moe_layers"]
        bed = bed_ceiling(res, r)
        print(f"{r['workers']:>7} {r['rtt_ms']:>6.1f} {f(r['relay_added_ms_mean'] and 2 * r['relay_added_ms_mean']):>6} "
              f"{r['streams']:>7} {f(r['decode_tok_s']):>8} {f(r['ceiling_tok_s']):>8} {f(r['of_ceiling']):>7} "
              f"{f(bed):>8} {f(bed and r['decode_tok_s'] and r['decode_tok_s'] / bed):>6} "
              f"{f(versus_one_worker(res, r)):>5} "
              f"{f(r['bytes_per_position'], 0):>8} {f(per_layer, 0):>11} {r['failed']:>6}")
    print("added = 2 x the relay's measured mean one-way delay (what a round trip gained); "
          "ceiling = streams / (t_compute + moe_layers x RTT + streams x B/pos / bandwidth); "
          "bed ceil = streams / (t_0 + moe_layers x RTT), t_0 this cluster's step at RTT 0; "
          "x 1w = tok/s over the 1-worker row of the same RTT and streams")


def versus_one_worker(res: dict, row: dict) -> float | None:
    """tok/s of `row` over that of 1 worker at the same RTT and streams: the growth with workers."""
    one = measured_row(res, 1, row["rtt_ms"], row["streams"])
    return row["decode_tok_s"] / one["decode_tok_s"] if one and row["decode_tok_s"] else None


def measured_row(res: dict, workers: int, rtt_ms: float, streams: int) -> dict | None:
    """The row of that configuration whose load measured a rate, or None."""
    return next((r for r in res["rows"] if r["workers"] == workers and r["rtt_ms"] == rtt_ms
                 and r["streams"] == streams and r["decode_tok_s"]), None)


def bed_ceiling(res: dict, row: dict) -> float | None:
    """streams / (t_0 + moe_layers x RTT): t_0 the step time of the same workers and streams
    at no added delay (measured), so only the added round trips are modelled."""
    base = measured_row(res, row["workers"], 0, row["streams"])
    if base is None:
        return None
    t0 = row["streams"] / base["decode_tok_s"]
    return row["streams"] / (t0 + res["moe_layers"] * row["rtt_ms"] / 1e3)


def check_args(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """ap.error (exits 2) naming the first argument no measurement can be made with."""
    if rate_bits(args.rate) <= 0:
        ap.error(f"--rate {args.rate}: must be positive")
    for name, values, low in (("--workers", args.workers, 1), ("--streams", args.streams, 1)):
        if not values or min(values) < low:
            ap.error(f"{name}: every value at least {low}")
    if any(n > 16 for n in args.workers):
        ap.error("--workers: at most 16 each")
    if any(r < 0 for r in args.rtt_ms):
        ap.error("--rtt-ms: round-trip times are not negative")
    for name, value in (("--tokens", args.tokens), ("--repeat", args.repeat)):
        if value < 1:
            ap.error(f"{name} {value}: at least 1")
    if args.worker_cpu < 0:
        ap.error(f"--worker-cpu {args.worker_cpu}: a number of cores, not negative")
    for name, value in (("--time-limit", args.time_limit), ("--startup-timeout", args.startup_timeout)):
        if not value > 0:
            ap.error(f"{name} {value}: must be positive")


def int_list(s: str) -> list[int]:
    return [int(x) for x in s.split(",")]


def float_list(s: str) -> list[float]:
    return [float(x) for x in s.split(",")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(DEMO), help="checkpoint directory, or `fixture`")
    ap.add_argument("--workers", type=int_list, default=[1, 2, 4])
    ap.add_argument("--rtt-ms", type=float_list, default=[0.2, 1.0, 5.0], help="added round-trip times")
    ap.add_argument("--rate", default="1gbit", help="link bandwidth, tc's spelling")
    ap.add_argument("--streams", type=int_list, default=[1, 16])
    ap.add_argument("--tokens", type=int, default=32, help="tokens per stream")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--seed", type=int, default=17)
    ap.add_argument("--micro-batches", type=int, default=0, choices=[0, 1, 2],
                    help="the coordinator's serving.micro_batches (0: automatic, now 1)")
    ap.add_argument("--worker-cpu", type=float, default=0.0,
                    help="limit each worker to this many cores (its own cgroup): N small machines; 0: no limit")
    ap.add_argument("--repeat", type=int, default=3, help="loads per row; the fastest is reported")
    ap.add_argument("--time-limit", type=float, default=180, help="hard limit of one load, s")
    ap.add_argument("--startup-timeout", type=float, default=300)
    ap.add_argument("--charm", type=Path, default=REPO / "build/charm")
    ap.add_argument("--json", type=Path, help="write every number here")
    ap.add_argument("--report", type=Path, help="only print the table of an earlier --json file")
    args = ap.parse_args()
    if args.report:
        if not args.report.is_file():
            ap.error(f"--report {args.report}: no such file")
        try:
            print_report(json.loads(args.report.read_text()))
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            ap.error(f"--report {args.report}: not a lan_testbed.py --json file ({e})")
        return 0
    check_args(ap, args)
    args.model = FIXTURE if args.model == "fixture" else Path(args.model).resolve()
    if os.geteuid() != 0:
        ap.error("needs root (ip netns, tc)")
    if args.worker_cpu and not CpuCaps.available():
        ap.error(f"--worker-cpu needs the cgroup v1 cpu controller at {CpuCaps.ROOT}")
    if not args.charm.exists():
        ap.error(f"{args.charm}: no charm binary (cmake --build build --target charm)")
    if not (args.model / "config.json").exists():
        ap.error(f"{args.model}: no checkpoint (scripts/serve.sh builds the demo model; or --model fixture)")
    folder = Path(os.environ.get("CHARM_BENCH_DIR", "/tmp/charm-bench")) / "lan" / time.strftime("%Y%m%d-%H%M%S")
    folder.mkdir(parents=True, exist_ok=True)
    layers = moe_layers(args.model)
    # Up to five charm processes share this machine's cores: OpenMP threads that spin at
    # their barriers would take the cores the others need (the tests set the same).
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")
    res = {"model": str(args.model), "moe_layers": layers, "rate": args.rate, "tokens": args.tokens,
           "threads": args.threads, "micro_batches": args.micro_batches,
           "worker_cpu": args.worker_cpu, "machine": machine(folder), "rows": [],
           "commit": subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                                    capture_output=True, text=True).stdout.strip()}
    res["t_compute_s"] = run_single_node(args, folder)
    for n in args.workers:
        res["rows"] += run_cluster(args, folder, n, res["t_compute_s"], layers)
        if args.json:
            args.json.write_text(json.dumps(res, indent=1))
    res["machine"]["loadavg_end"] = Path("/proc/loadavg").read_text().split()[:3]
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    print_report(res)
    log(f"logs and configs: {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
