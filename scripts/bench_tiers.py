#!/usr/bin/env python3
"""The expert-tier benchmark (issue 3): decode speed and disk traffic of charm's RAM/NVMe
expert hierarchy on an OLMoE-1B-7B-shaped model, at several RAM budgets, single node and
two workers on loopback, prefetch off and on; LRU against Belady on the same routing;
the store's disk bandwidth against fio's on the same file. Prints a table; writes JSON.

NOT a test and not run by CI: it needs ~27 GB of disk (checkpoint + container) and
minutes per configuration. Every run is bounded (--tokens, --timeout).

Steps:
  1. the synthetic checkpoint (scripts/make_synthetic_olmoe.py; RANDOM weights), reused;
  2. an expert container of it (`charm convert`), reused; the runs read it with O_DIRECT
     (`io: odirect`), so the page cache does not serve expert reads and nothing needs
     dropping; with --io pread the container files are evicted from the page cache
     before every run (posix_fadvise DONTNEED: only these files, as an unprivileged user
     may, instead of dropping every cache on a shared machine);
  3. fio (or dd when fio is missing) on a container file: sequential and random reads
     of expert-sized blocks with O_DIRECT, 1 job and io_threads jobs;
  4. per (mode, budget, prefetch, repeat): `charm run` for --tokens tokens on a fixed
     prompt (temperature 1, seed 7), fresh processes each time (a cold cache: `pin: none`, no usage file),
     with --stats-json for tok/s, recall and the tier counters; the first run also writes
     the routing trace;
  5. scripts/replay_routing.py on that trace: LRU and Belady hit rates for the same slots.

Usage: scripts/bench_tiers.py [--tokens 16] [--repeat 2] [--budgets 100,50,25,slot]
                              [--modes single,cluster] [--prefetch off,on] [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
import replay_routing  # noqa: E402
from bench_util import fmt_spread, log, machine, sh  # noqa: E402

CACHE = Path.home() / ".cache/charm"
LAYERS, EXPERTS, HIDDEN, INTER = 16, 64, 2048, 1024
SLOT_BYTES = 3 * HIDDEN * INTER * 2  # one bf16 expert: 12 MiB, already 4 KiB aligned
PROMPT = "The history of the city begins with a small village on the river"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen, timeout: float) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"worker exited with {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"no worker on port {port} after {timeout} s")


def evict_from_page_cache(folder: Path) -> None:
    """posix_fadvise(DONTNEED) on every file of `folder`: drops their clean cached pages."""
    for f in folder.rglob("*"):
        if f.is_file():
            fd = os.open(f, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def slots_for(budget: str, workers: int) -> int:
    """Per-layer slots of ONE worker (each owns EXPERTS / workers experts per layer)."""
    owned = EXPERTS // workers
    if budget == "slot":
        return 1
    return max(1, round(owned * float(budget) / 100))


def ram_gb(slots_per_layer: int) -> float:
    # Half a slot of slack so floating point never rounds a slot away.
    return (slots_per_layer * LAYERS + 0.5) * SLOT_BYTES / 2**30


def store_keys(container: Path, slots: int, io: str, io_threads: int) -> str:
    """The tier keys (a `store:` mapping in single-node mode, inline on a worker entry)."""
    return (f"ram_gb: {ram_gb(slots):.6f}, pin: none, usage_file: none, container: {container}, "
            f"io: {io}, io_threads: {io_threads}")


def write_topology(folder: Path, checkpoint: Path, container: Path, mode: str, slots: int, io: str,
                   io_threads: int, prefetch: bool) -> tuple[Path, list[tuple[str, int]]]:
    lines = [f"model: {checkpoint}", "model_name: synthetic-olmoe", f"prefetch: {str(prefetch).lower()}",
             "timeouts: {connect_ms: 5000, request_ms: 600000, startup_ms: 600000}"]
    workers = []
    if mode == "single":
        lines += ["mode: single-node", "store: {" + store_keys(container, slots, io, io_threads) + "}"]
    else:
        lines += ["mode: cluster", "workers:"]
        half = EXPERTS // 2
        for i, experts in enumerate([f"0-{half - 1}", f"{half}-{EXPERTS - 1}"]):
            port = free_port()
            workers.append((f"w{i}", port))
            lines.append(f"  - {{name: w{i}, host: 127.0.0.1, port: {port}, experts: \"{experts}\", "
                         f"{store_keys(container, slots, io, io_threads)}}}")
    path = folder / f"{mode}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path, workers


def run_once(charm: Path, cfg: Path, workers: list[tuple[str, int]], tokens: int, timeout: float,
             trace: Path | None) -> dict:
    procs = []
    try:
        for name, port in workers:
            procs.append(subprocess.Popen([str(charm), "worker", "--config", str(cfg), "--name", name],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
        for (name, port), p in zip(workers, procs):
            wait_port(port, p, timeout)
        stats = cfg.with_suffix(".stats.json")
        # Sampled (fixed seed), not greedy: greedy decoding of a random model repeats one
        # token, and so one routing, which flatters every cache. Logits are bit-identical
        # across budgets and topologies, so every run generates the same tokens.
        cmd = [str(charm), "run", "--config", str(cfg), "--max-tokens", str(tokens), "--temperature", "1",
               "--seed", "7", "--stats-json", str(stats)]
        if trace:
            cmd += ["--routing-trace", str(trace)]
        started = time.time()
        r = sh(cmd + [PROMPT], timeout)
        if r.returncode != 0:
            raise RuntimeError(f"charm run failed ({r.returncode}): {r.stderr[-2000:]}")
        out = json.loads(stats.read_text())
        out["wall_s"] = time.time() - started
        return out
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()


def tier_sum(stats: dict) -> dict:
    keys = ["hits", "misses", "bytes_read", "io_wait_ns", "disk_ns", "prefetch_issued", "prefetch_hits"]
    total = {k: 0 for k in keys}
    for w in stats.get("workers", []):
        for k in keys:
            total[k] += w.get("tier", {}).get(k, 0)
    return total


def fio_baseline(file: Path, io_threads: int, seconds: int) -> dict:
    """MB/s (1e6 B/s) of O_DIRECT reads of expert-sized blocks on `file`."""
    out = {}
    size = file.stat().st_size
    bs = f"{SLOT_BYTES // 1024}k"
    if shutil.which("fio"):
        jobs = {"seq_1job": ("read", 1), "rand_1job": ("randread", 1), f"rand_{io_threads}jobs": ("randread", io_threads)}
        for name, (rw, n) in jobs.items():
            r = sh(["fio", "--name", name, "--filename", str(file), "--readonly", "--rw", rw, "--bs", bs,
                    "--direct=1", "--ioengine=psync", f"--numjobs={n}", "--group_reporting", f"--size={size}",
                    f"--runtime={seconds}", "--time_based", "--output-format=json"], seconds + 60)
            job = json.loads(r.stdout)["jobs"][0]
            out[name] = job["read"]["bw_bytes"] / 1e6
        out["tool"] = "fio " + sh(["fio", "--version"], 10).stdout.strip()
    else:
        count = min(size // SLOT_BYTES, 200)
        r = sh(["dd", f"if={file}", "of=/dev/null", f"bs={SLOT_BYTES}", f"count={count}", "iflag=direct"], 120)
        line = r.stderr.strip().splitlines()[-1]
        out["seq_1job"] = count * SLOT_BYTES / float(line.split(",")[-2].split()[0]) / 1e6
        out["tool"] = "dd iflag=direct"
    return out


def ensure_inputs(args) -> tuple[Path, Path]:
    ck = args.checkpoint
    if not (ck / "model.safetensors.index.json").exists():
        r = sh([sys.executable, str(REPO / "scripts/make_synthetic_olmoe.py"), "--out", str(ck)], 3600)
        if r.returncode != 0:
            raise RuntimeError(r.stderr)
    ct = args.container
    r = sh([str(args.charm), "convert", "--checkpoint", str(ck), "--out", str(ct)], 3600)
    if r.returncode != 0:
        raise RuntimeError(f"charm convert failed: {r.stderr[-2000:]}")
    return ck, ct


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--charm", type=Path, default=REPO / "build/charm")
    ap.add_argument("--checkpoint", type=Path, default=CACHE / "synthetic-olmoe")
    ap.add_argument("--container", type=Path, default=CACHE / "synthetic-olmoe-container")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--budgets", default="100,50,25,slot")
    ap.add_argument("--modes", default="single,cluster")
    ap.add_argument("--prefetch", default="off,on")
    ap.add_argument("--io", default="odirect", choices=["odirect", "pread"])
    ap.add_argument("--io-threads", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=900, help="seconds per charm run")
    ap.add_argument("--fio-seconds", type=int, default=15)
    ap.add_argument("--min-free-gb", type=float, default=3.0,
                    help="skip a configuration whose budget would leave less RAM available than this")
    ap.add_argument("--out", type=Path, default=Path("bench_tiers.json"))
    ap.add_argument("--report", type=Path, nargs="+", help="only print the table of these earlier --out files")
    args = ap.parse_args()
    if args.report:
        report(args.report, args.budgets)
        return 0

    results = {"machine": machine(CACHE), "args": {k: str(v) for k, v in vars(args).items()}, "runs": [], "replay": {}}
    ck, ct = ensure_inputs(args)
    blob = sorted(p for p in ct.rglob("*") if p.is_file() and p.stat().st_size > 1 << 30)
    results["disk"] = fio_baseline(blob[0], args.io_threads, args.fio_seconds) if blob else {}
    log(f"disk baseline: {results['disk']}")

    trace = None
    with tempfile.TemporaryDirectory(prefix="charm-bench-") as tmp:
        folder = Path(tmp)
        for mode in args.modes.split(","):
            nworkers = 1 if mode == "single" else 2
            for budget in args.budgets.split(","):
                slots = slots_for(budget, nworkers)
                need_gb = ram_gb(slots) * nworkers
                for pf in args.prefetch.split(","):
                    for rep in range(args.repeat):
                        avail = int(next(l for l in Path("/proc/meminfo").read_text().splitlines()
                                         if l.startswith("MemAvailable")).split()[1]) / 2**20
                        row = {"mode": mode, "budget": budget, "slots_per_layer_per_worker": slots,
                               "pf": pf, "repeat": rep, "ram_gb_total": need_gb}
                        if need_gb + 2.5 + args.min_free_gb > avail:  # + the coordinator's ~2.5 GB dense part
                            row["skipped"] = f"needs {need_gb + 2.5:.1f} GiB, {avail:.1f} GiB available"
                            log(f"skip {row}")
                            results["runs"].append(row)
                            continue
                        if args.io == "pread":
                            evict_from_page_cache(ct)
                        cfg, workers = write_topology(folder, ck, ct, mode, slots, args.io, args.io_threads, pf == "on")
                        want_trace = trace is None
                        t = folder / "trace.jsonl" if want_trace else None
                        try:
                            row.update(run_once(args.charm, cfg, workers, args.tokens, args.timeout, t))
                        except (RuntimeError, subprocess.TimeoutExpired) as e:
                            row["error"] = str(e)[-500:]
                            log(f"run failed: {row['error']}")
                        if want_trace and t and t.exists():
                            trace = CACHE / "bench-routing-trace.jsonl"
                            shutil.copyfile(t, trace)
                        results["runs"].append(row)
                        args.out.write_text(json.dumps(results, indent=1))

    if trace:
        results["replay"] = replay_table(trace, args.budgets)
    args.out.write_text(json.dumps(results, indent=1))
    print_table(results, args)
    return 0


def replay_table(trace: Path, budgets: str) -> dict:
    """LRU and Belady on the trace, for every budget's slots, single node and 2 workers.
    Whole run (prefill included), like the store's counters it is compared with."""
    calls = replay_routing.read_trace(trace)
    out = {}
    for nworkers in (1, 2):
        slots = sorted({slots_for(b, nworkers) for b in budgets.split(",")}, reverse=True)
        out[str(nworkers)] = replay_routing.replay(calls, slots, partitions=nworkers, experts=EXPERTS)
    return out


def report(paths: list[Path], budgets: str) -> None:
    """Prints one table from earlier runs' JSON files (their runs merged, the replay
    recomputed from the saved trace)."""
    merged = None
    for p in paths:
        r = json.loads(p.read_text())
        if merged is None:
            merged = r
        else:
            merged["runs"] += r["runs"]
    trace = CACHE / "bench-routing-trace.jsonl"
    if trace.exists():
        merged["replay"] = replay_table(trace, budgets)
    print_table(merged, None)


def print_table(results: dict, args) -> None:
    m = results["machine"]
    print(f"machine: {m['cpu']}, {m['cores']} cores; load {' '.join(m['loadavg'])}")
    d = results.get("disk", {})
    if d:
        print("disk ({}): ".format(d.get("tool", "?")) +
              ", ".join(f"{k} {v:.0f} MB/s" for k, v in d.items() if k != "tool"))
    replay = {}
    for nw, rows in results.get("replay", {}).items():
        for r in rows:
            replay[(int(nw), r["slots"])] = r
    hdr = (f"{'mode':7} {'budget':>6} {'slots':>5} {'pf':>3} {'tok/s':>11} {'MB read/tok':>12} {'hit':>6} "
           f"{'LRU sim':>7} {'Belady':>7} {'recall':>7} {'pf used':>7} {'disk MB/s':>9} {'io wait/tok':>11}")
    print(hdr)
    print("-" * len(hdr))
    groups: dict[tuple, list[dict]] = {}
    for r in results["runs"]:
        groups.setdefault((r["mode"], r["budget"], r["pf"]), []).append(r)
    for (mode, budget, pf), rows in groups.items():
        ok = [r for r in rows if "error" not in r and "skipped" not in r]
        slots = rows[0]["slots_per_layer_per_worker"]
        label = "1/layer" if budget == "slot" else f"{budget}%"
        if not ok:
            why = rows[0].get("skipped") or rows[0].get("error", "")
            print(f"{mode:7} {label:>6} {slots:>5} {pf:>3}  skipped: {why[:80]}")
            continue
        toks = [r["decode_tokens_per_s"] for r in ok]
        per_tok, hit, disk_bw, wait, recall, used = [], [], [], [], [], []
        for r in ok:
            t = tier_sum(r)
            n = r["prompt_tokens"] + r["completion_tokens"]
            per_tok.append(t["bytes_read"] / n / 1e6)
            visits = t["hits"] + t["misses"]
            hit.append(100 * t["hits"] / visits if visits else 0)
            if t["disk_ns"]:
                disk_bw.append(t["bytes_read"] / (t["disk_ns"] / 1e9) / 1e6)
            wait.append(t["io_wait_ns"] / n / 1e6)
            if pf == "on" and r.get("prefetch", {}).get("actual"):
                recall.append(100 * r["prefetch"]["correct"] / r["prefetch"]["actual"])
            if t["prefetch_issued"]:
                used.append(100 * t["prefetch_hits"] / t["prefetch_issued"])
        nw = 1 if mode == "single" else 2
        rp = replay.get((nw, slots))
        lru = f"{100 * rp['lru_hit_rate']:.1f}%" if rp else "-"
        opt = f"{100 * rp['belady_hit_rate']:.1f}%" if rp else "-"
        print(f"{mode:7} {label:>6} {slots:>5} {pf:>3} {fmt_spread(toks):>11} {fmt_spread(per_tok, 0):>12} "
              f"{fmt_spread(hit, 1):>6} {lru:>7} {opt:>7} {fmt_spread(recall, 1) if recall else '-':>7} "
              f"{fmt_spread(used, 0) if used else '-':>7} {fmt_spread(disk_bw, 0) if disk_bw else '-':>9} "
              f"{fmt_spread(wait, 0) + ' ms':>11}")


if __name__ == "__main__":
    sys.exit(main())
