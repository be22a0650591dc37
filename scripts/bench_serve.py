#!/usr/bin/env python3
"""Many users at once (issue 14): C concurrent streaming clients against an OpenAI-compatible
server, for each C of a list, charm and llama.cpp's llama-server side by side.

A BENCHMARK, NOT A TEST: nothing asserts, CI never runs it, and its numbers depend on the
machine and on whatever else runs there. It talks only to 127.0.0.1, and always stops by
itself: every client's requests are bounded (--requests-per-client) and the whole run of
one C by a hard --time-limit, after which the connections still open are closed.

What one run of concurrency C does: C client threads (http.client, standard library only)
each send their requests back to back, every request a streamed ("stream": true,
stream_options.include_usage) POST to /v1/completions (or /v1/chat/completions with
--endpoint chat), temperature 0 (--temperature T: sampled, each request with its own
"seed", the same on every target). The requests are a fixed seeded mix (--seed): a prompt of
--prompt-words words (uniform in the range) drawn from a built-in word list (each word
about one token), and max_tokens uniform in --max-tokens. The same C gets the same mix
on every target. A request may stop early (end of sequence): every count is of the tokens
actually generated, from the usage chunk (else the number of text chunks). It measures:
  * output tok/s: all generated tokens / wall time of the run (first request sent to the
    last one ended), the aggregate the server gives C users together;
  * TTFT p50/p99: request sent -> first chunk carrying text;
  * ITL p50/p99: the gaps between successive text chunks of one request (inter-token
    latency as a user sees it; one chunk is one token on both servers, except where a
    chunk holds several tokens to complete a UTF-8 character);
  * requests completed / failed (an HTTP or stream error, or cut at the time limit);
  * peak RSS of the server: the most of VmRSS sampled every 0.2 s from /proc/PID/status,
    and VmHWM (the kernel's high-water mark: the process's whole life), summed over the
    processes of the target (a charm cluster: coordinator plus workers).

Targets (--target, a comma list, run alternately for every C, each on a fresh server):
  charm          `charm serve` on a single-node config written here (model --model);
  charm-cluster  two `charm worker`s on loopback, each owning half the routed experts, and
                 a coordinator (`charm serve`), as configs/demo-cluster.yaml;
  llamacpp       `llama-server -m GGUF -np C -t T -c C*(longest request)`, built from the
                 llama.cpp vendored in the llama-cpp-python sdist (bench_llamacpp.py's
                 functions, in --work); --batched-bench also runs `llama-batched-bench`
                 on the same GGUF for the raw throughput of C sequences decoded together;
                 --llama-threads 2,1 runs it at each -t (ggml's thread pool spins at its
                 barriers, so -t = every core collapses on a machine that is busy);
  url            an already running server at --base-url (peak RSS with --server-pid).

The default model is the demo model (docs/models.md): the checkpoint `scripts/moefy.py
build` makes, and for llama.cpp the same weights as a BF16 GGUF (scripts/moe_gguf.py),
both in ~/.cache/charm/models/qwen2.5-0.5b-moe/.

Usage:
  scripts/bench_serve.py --target charm,llamacpp [--concurrency 1,4,16,64] [--threads 2]
      [--requests-per-client 3] [--prompt-words 32,1024] [--max-tokens 16,256]
      [--time-limit 300] [--llama-threads 2,1] [--batched-bench] [--json FILE] [--work DIR]
  scripts/bench_serve.py --target url --base-url http://127.0.0.1:8080 --server-pid PID
  scripts/bench_serve.py --report FILE.json      # the tables of an earlier --json
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
from bench_llamacpp import ensure_llama_build, ensure_llama_source, llama_version, physical_cores  # noqa: E402
from bench_util import comma_choices, log, machine  # noqa: E402
from moefy import default_cache  # noqa: E402

LLAMA_SERVE_TARGETS = ["llama-server", "llama-batched-bench"]
TARGETS = ("charm", "charm-cluster", "llamacpp", "url")

# Common English words, one token each with their leading space in Qwen's and most BPE
# vocabularies; a prompt is a seeded draw of them, so no two prompts share a long prefix.
WORDS = """time year people way day man thing woman life child world school state family
student group country problem hand part place case week company system program question
work government number night point home water room mother area money story fact month
lot right study book eye job word business issue side kind head house service friend
father power hour game line end member law car city community name president team minute
idea kid body information back parent face others level office door health person art war
history party result change morning reason research girl guy moment air teacher force
education foot boy age policy music market sense nation plan college interest death
experience effect class control care field development role effort rate heart drug show
leader light voice wife police mind price report decision son view relationship town road
arm difference value building action model season society tax director position player
record paper space ground form event official matter center couple site project activity
star table need court oil situation cost industry figure street image phone data picture
practice piece land product doctor wall patient worker news test movie north love support
technology step baby computer type attention film tree source organization hair window
evidence population truth song river""".split()


# ----------------------------------------------------------------------------- the load

def request_mix(n: int, prompt_words: tuple[int, int], max_tokens: tuple[int, int], seed: int) -> list[dict]:
    """n requests {prompt, max_tokens}, the same for the same arguments."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = rng.randint(*prompt_words)
        out.append({"prompt": " ".join(rng.choice(WORDS) for _ in range(words)),
                    "max_tokens": rng.randint(*max_tokens)})
    return out


def request_body(req: dict, endpoint: str, model: str | None) -> tuple[str, bytes]:
    body = {"max_tokens": req["max_tokens"], "temperature": req.get("temperature", 0), "stream": True,
            "stream_options": {"include_usage": True}}
    if body["temperature"] > 0:
        body["seed"] = req["seed"]
    if model:
        body["model"] = model
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": req["prompt"]}]
        return "/v1/chat/completions", json.dumps(body).encode()
    body["prompt"] = req["prompt"]
    return "/v1/completions", json.dumps(body).encode()


def chunk_text(event: dict) -> str:
    """The text a stream chunk carries (completion `text` or chat `delta.content`)."""
    out = ""
    for choice in event.get("choices") or []:
        out += choice.get("text") or (choice.get("delta") or {}).get("content") or ""
    return out


class Load:
    """C client threads sending their share of `requests` back to back to host:port.
    REQUIRES: run() called once. Every record is one request:
    {ok, error, t_send, ttft_s, gaps_s [...], tokens, prompt_tokens, t_end}."""

    def __init__(self, host: str, port: int, requests: list[dict], clients: int, endpoint: str,
                 model: str | None, deadline: float, request_timeout: float):
        self.host, self.port, self.endpoint, self.model = host, port, endpoint, model
        self.queues = [requests[i::clients] for i in range(clients)]
        self.deadline, self.request_timeout = deadline, request_timeout
        self.records: list[dict] = []
        self.lock = threading.Lock()
        self.open: set[http.client.HTTPConnection] = set()

    def one(self, req: dict) -> dict:
        rec = {"ok": False, "error": None, "t_send": time.monotonic(), "ttft_s": None, "gaps_s": [],
               "tokens": 0, "chunks": 0, "prompt_tokens": None, "max_tokens": req["max_tokens"]}
        path, body = request_body(req, self.endpoint, self.model)
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.request_timeout)
        with self.lock:
            self.open.add(conn)
        usage, done, last = None, False, None
        try:
            conn.request("POST", path, body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            if resp.status != 200:
                rec["error"] = f"HTTP {resp.status}: {resp.read()[:300]!r}"
                return rec
            for raw in resp:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True
                    break
                event = json.loads(data)
                if "error" in event:
                    rec["error"] = f"stream error: {json.dumps(event['error'])[:300]}"
                    return rec
                now = time.monotonic()
                if event.get("usage"):
                    usage = event["usage"]
                if chunk_text(event):
                    rec["chunks"] += 1
                    if last is None:
                        rec["ttft_s"] = now - rec["t_send"]
                    else:
                        rec["gaps_s"].append(now - last)
                    last = now
            if not done:
                rec["error"] = ("cut at the time limit" if time.monotonic() >= self.deadline
                                else "stream ended without [DONE]")
            else:
                rec["ok"] = True
        except (OSError, http.client.HTTPException, json.JSONDecodeError, ValueError) as e:
            rec["error"] = ("cut at the time limit" if time.monotonic() >= self.deadline
                            else f"{type(e).__name__}: {e}")
        finally:
            with self.lock:
                self.open.discard(conn)
            conn.close()
            rec["t_end"] = time.monotonic()
            if usage:
                rec["tokens"] = int(usage.get("completion_tokens") or 0)
                rec["prompt_tokens"] = usage.get("prompt_tokens")
            else:
                rec["tokens"] = rec["chunks"]
        return rec

    def client(self, queue: list[dict]) -> None:
        for req in queue:
            if time.monotonic() >= self.deadline:
                break
            rec = self.one(req)
            with self.lock:
                self.records.append(rec)

    def run(self) -> tuple[float, float]:
        """Runs every client to its end or the deadline; returns (start, end) monotonic s."""
        threads = [threading.Thread(target=self.client, args=(q,), daemon=True) for q in self.queues]
        start = time.monotonic()
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            if time.monotonic() >= self.deadline:
                with self.lock:
                    for conn in list(self.open):  # unblocks the readers; they record the cut
                        if conn.sock:
                            try:
                                conn.sock.shutdown(socket.SHUT_RDWR)
                            except OSError:
                                pass
            for t in threads:
                t.join(timeout=0.2)
        return start, time.monotonic()


# ------------------------------------------------------------------------ measurement

def proc_status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (KiB) of /proc/PID/status; {} once the process is gone."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return {}
    return {l.split(":")[0]: int(l.split()[1]) for l in lines if l.startswith(("VmRSS:", "VmHWM:"))}


class RssSampler(threading.Thread):
    """Samples the summed VmRSS of `pids` every 0.2 s until stop(); peak in KiB."""

    def __init__(self, pids: list[int]):
        super().__init__(daemon=True)
        self.pids, self.peak_kib, self.halt = pids, 0, threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            self.peak_kib = max(self.peak_kib, sum(proc_status(p).get("VmRSS", 0) for p in self.pids))
            self.halt.wait(0.2)

    def stop(self) -> dict:
        self.halt.set()
        self.join()
        hwm = [proc_status(p).get("VmHWM", 0) for p in self.pids]
        return {"peak_rss_gib": self.peak_kib / 2**20, "vm_hwm_gib": sum(hwm) / 2**20,
                "vm_hwm_gib_each": [h / 2**20 for h in hwm]}


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0-100), linear between closest ranks; None for no values."""
    if not values:
        return None
    v = sorted(values)
    k = (len(v) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def summarise(records: list[dict], start: float, end: float) -> dict:
    ok = [r for r in records if r["ok"]]
    ttft = [r["ttft_s"] for r in records if r["ttft_s"] is not None]
    gaps = [g for r in records for g in r["gaps_s"]]
    tokens = sum(r["tokens"] for r in records)
    errors: dict[str, int] = {}
    for r in records:
        if not r["ok"]:
            errors[r["error"]] = errors.get(r["error"], 0) + 1
    wall = max(end - start, 1e-9)
    return {"wall_s": wall, "tokens": tokens, "output_tok_s": tokens / wall,
            "completed": len(ok), "failed": len(records) - len(ok), "errors": errors,
            "ttft_p50_ms": ms(percentile(ttft, 50)), "ttft_p99_ms": ms(percentile(ttft, 99)),
            "itl_p50_ms": ms(percentile(gaps, 50)), "itl_p99_ms": ms(percentile(gaps, 99)),
            "early_stops": sum(1 for r in ok if r["tokens"] < r["max_tokens"]),
            "prompt_tokens_mean": (sum(r["prompt_tokens"] for r in ok if r["prompt_tokens"]) / len(ok)
                                   if ok and all(r["prompt_tokens"] for r in ok) else None)}


def ms(s: float | None) -> float | None:
    return None if s is None else s * 1e3


# --------------------------------------------------------------------------- servers

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """Processes of one target started for one C, stopped by stop() (SIGINT, then SIGKILL
    after 15 s). Output goes to log files in `folder`."""

    def __init__(self, folder: Path, name: str):
        self.folder, self.name = folder, name
        self.procs: list[subprocess.Popen] = []
        self.port = 0

    def spawn(self, cmd: list, tag: str) -> None:
        log(" ".join(str(c) for c in cmd))
        out = open(self.folder / f"{self.name}-{tag}.log", "w")
        self.procs.append(subprocess.Popen([str(c) for c in cmd], stdout=out, stderr=subprocess.STDOUT))

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def check_alive(self) -> None:
        for p in self.procs:
            if p.poll() is not None:
                raise RuntimeError(f"{self.name}: {p.args[0]} exited {p.returncode} (logs in {self.folder})")

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        for p in reversed(self.procs):
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def wait_ready(server: Server, endpoint: str, model: str | None, timeout: float) -> float:
    """Retries a 4-token request until it succeeds (the server loaded its model and, for a
    cluster, reached its workers); this warm-up is not measured. Returns the seconds taken."""
    started = time.monotonic()
    warm = {"prompt": "The first words of a warm-up request", "max_tokens": 4}
    while True:
        server.check_alive()
        rec = Load("127.0.0.1", server.port, [warm], 1, endpoint, model, time.monotonic() + 60, 60).one(warm)
        if rec["ok"]:
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise RuntimeError(f"{server.name}: not ready after {timeout} s: {rec['error']}")
        time.sleep(1)


def charm_config(folder: Path, model: Path, threads: int, port: int, cluster: bool) -> tuple[Path, list[str]]:
    """A single-node or two-worker loopback config; returns it and the worker names."""
    text = (f"model: {model}\nmodel_name: bench\nthreads: {threads}\n"
            f"api: {{host: 127.0.0.1, port: {port}}}\n")
    names = []
    if cluster:
        ports = [free_port(), free_port()]
        n = json.loads((model / "config.json").read_text()).get("num_experts", 16)
        text += "mode: cluster\ntimeouts: {connect_ms: 5000, request_ms: 600000}\nworkers:\n"
        for i, (lo, hi) in enumerate(((0, n // 2 - 1), (n // 2, n - 1))):
            names.append(f"w{i}")
            text += f"  - {{name: w{i}, host: 127.0.0.1, port: {ports[i]}, experts: \"{lo}-{hi}\"}}\n"
    else:
        text += "mode: single-node\n"
    path = folder / f"charm-{'cluster' if cluster else 'single'}.yaml"
    path.write_text(text)
    return path, names


def start_charm(args, folder: Path, cluster: bool) -> Server:
    server = Server(folder, "charm-cluster" if cluster else "charm")
    server.port = free_port()
    cfg, workers = charm_config(folder, args.model, args.threads, server.port, cluster)
    for name in workers:
        server.spawn([args.charm, "worker", "--config", cfg, "--name", name], name)
    server.spawn([args.charm, "serve", "--config", cfg], "serve")
    return server


def start_llama(args, bin_dir: Path, folder: Path, clients: int, longest: int, threads: int) -> Server:
    server = Server(folder, f"llamacpp-t{threads}")
    server.port = free_port()
    ctx = clients * longest
    server.spawn([bin_dir / "llama-server", "-m", args.gguf, "-np", clients, "-t", threads, "-c", ctx,
                  "--host", "127.0.0.1", "--port", server.port, "--no-webui"], "serve")
    return server


def batched_bench(args, bin_dir: Path, folder: Path, conc: list[int], threads: int) -> list[dict]:
    """llama-batched-bench on the GGUF: P-token prompts, T generated, every C of conc;
    one jsonl row a C, `threads` added."""
    pp, tg = args.batched_pp, args.batched_tg
    cmd = [bin_dir / "llama-batched-bench", "-m", args.gguf, "-c", max(conc) * (pp + tg) + 16, "-b", 2048,
           "-ub", 512, "-npp", pp, "-ntg", tg, "-npl", ",".join(map(str, conc)), "-t", threads,
           "--output-format", "jsonl"]
    log(" ".join(str(c) for c in cmd))
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=args.time_limit * len(conc))
    (folder / f"llama-batched-bench-t{threads}.log").write_text(r.stdout + r.stderr)
    if r.returncode != 0:
        raise RuntimeError(f"llama-batched-bench exited {r.returncode}: {r.stderr[-2000:]}")
    rows = []
    for line in r.stdout.splitlines():
        if line.startswith("{"):
            rows.append({**json.loads(line), "threads": threads})
    return rows


# ------------------------------------------------------------------------------ main

def run_one(args, target: str, clients: int, requests: list[dict], folder: Path, bin_dir: Path | None) -> dict:
    """One target ("llamacpp-tN": llama-server -t N) at one C on a fresh server (or the
    --base-url one); the summary dict."""
    server = None
    longest = args.prompt_words[1] * 2 + args.max_tokens[1] + 64  # generous: words -> tokens
    try:
        if target == "url":
            u = urllib.parse.urlsplit(args.base_url)
            host, port, pids, ready_s = u.hostname, u.port or 80, ([args.server_pid] if args.server_pid else []), 0.0
        else:
            server = (start_llama(args, bin_dir, folder, clients, longest, int(target.split("-t")[1]))
                      if target.startswith("llamacpp") else start_charm(args, folder, target == "charm-cluster"))
            host, port, pids = "127.0.0.1", server.port, server.pids()
            ready_s = wait_ready(server, args.endpoint, args.model_name, args.startup_timeout)
        sampler = RssSampler(pids)
        sampler.start()
        load = Load(host, port, requests, clients, args.endpoint, args.model_name,
                    time.monotonic() + args.time_limit, args.request_timeout)
        start, end = load.run()
        mem = sampler.stop()
        res = {"target": target, "clients": clients, "requests": len(requests), "ready_s": ready_s,
               **summarise(load.records, start, end), **mem}
    except RuntimeError as e:
        res = {"target": target, "clients": clients, "requests": len(requests), "error": str(e)}
    finally:
        if server:
            server.stop()
    log(f"{target} C={clients}: " + json.dumps({k: v for k, v in res.items() if k != "errors"}))
    return res


def fmt(v, digits: int = 1) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def print_report(res: dict) -> None:
    m = res["machine"]
    print(f"machine: {m['cpu']}, {m['cores']} logical cores, load {' '.join(m['loadavg'])} at start, "
          f"{' '.join(m.get('loadavg_end', ['?']))} at end; threads {res['threads']}; charm {res['charm_commit']}"
          + (f"; llama.cpp from llama-cpp-python {res['llama'].get('llama_cpp_python')}" if res.get("llama") else ""))
    a = res["args"]
    print(f"mix: seed {a['seed']}, prompt words {a['prompt_words']}, max_tokens {a['max_tokens']}, "
          f"{a['requests_per_client']} requests per client, time limit {a['time_limit']} s, endpoint {a['endpoint']}")
    print()
    print("| C | target | output tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | done/failed "
          "| tokens | wall s | peak RSS GiB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in res["runs"]:
        if "error" in r:
            print(f"| {r['clients']} | {r['target']} | failed: {r['error'][:80]} |||||||||")
            continue
        print(f"| {r['clients']} | {r['target']} | {fmt(r['output_tok_s'])} | {fmt(r['ttft_p50_ms'], 0)} | "
              f"{fmt(r['ttft_p99_ms'], 0)} | {fmt(r['itl_p50_ms'])} | {fmt(r['itl_p99_ms'])} | "
              f"{r['completed']}/{r['failed']} | {r['tokens']} | {fmt(r['wall_s'])} | {fmt(r['peak_rss_gib'], 2)} |")
    for r in res["runs"]:
        for err, n in (r.get("errors") or {}).items():
            print(f"C={r['clients']} {r['target']}: {n} x {err}")
    if res.get("batched_bench"):
        print()
        print(f"llama-batched-bench (-npp {a['batched_pp']} -ntg {a['batched_tg']}):")
        print()
        print("| C (npl) | threads | prompt tok/s | decode tok/s (all C together) | total s |")
        print("|---|---|---|---|---|")
        for b in res["batched_bench"]:
            print(f"| {b.get('pl')} | {b.get('threads')} | {fmt(b.get('speed_pp'))} | {fmt(b.get('speed_tg'))} "
                  f"| {fmt(b.get('t'), 2)} |")


def int_list(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def int_range(s: str) -> tuple[int, int]:
    lo, hi = int_list(s)
    return lo, hi


def main() -> int:
    cache = default_cache()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="charm,llamacpp", help="comma list of " + ", ".join(TARGETS))
    ap.add_argument("--concurrency", type=int_list, default=[1, 4, 16, 64], help="the C list")
    ap.add_argument("--requests-per-client", type=int, default=3)
    ap.add_argument("--prompt-words", type=int_range, default=(32, 1024), help="LO,HI words per prompt")
    ap.add_argument("--max-tokens", type=int_range, default=(16, 256), help="LO,HI max_tokens per request")
    ap.add_argument("--seed", type=int, default=14)
    ap.add_argument("--temperature", type=float, default=0.0, help="every request's temperature (0: greedy)")
    ap.add_argument("--endpoint", choices=("completions", "chat"), default="completions")
    ap.add_argument("--time-limit", type=float, default=300, help="hard limit of one C's run, s")
    ap.add_argument("--request-timeout", type=float, default=600, help="socket timeout of one request, s")
    ap.add_argument("--startup-timeout", type=float, default=300, help="s for a server to load and answer")
    ap.add_argument("--threads", type=int, default=physical_cores(), help="charm's compute threads")
    ap.add_argument("--llama-threads", type=int_list,
                    help="llama-server -t (default: --threads); a list runs one llamacpp target per value "
                         "(-t 1 as well shows ggml's spinning thread pool on a machine with no core to spare)")
    ap.add_argument("--model", type=Path, default=cache / "checkpoint", help="charm checkpoint directory")
    ap.add_argument("--gguf", type=Path, default=cache / "moe-bf16.gguf", help="llama.cpp's GGUF of it")
    ap.add_argument("--model-name", help="`model` field of each request (default: none)")
    ap.add_argument("--charm", type=Path, default=REPO / "build/charm")
    ap.add_argument("--base-url", default="http://127.0.0.1:8080", help="for --target url")
    ap.add_argument("--server-pid", type=int, help="for --target url: the process whose RSS to read")
    ap.add_argument("--batched-bench", action="store_true", help="also run llama-batched-bench")
    ap.add_argument("--batched-pp", type=int, default=128)
    ap.add_argument("--batched-tg", type=int, default=64)
    ap.add_argument("--work", type=Path, default=Path(os.environ.get("CHARM_BENCH_DIR", "/work/bench")),
                    help="llama.cpp source and build (as bench_llamacpp.py), logs and configs")
    ap.add_argument("--jobs", type=int, default=2, help="parallel compile jobs for llama.cpp")
    ap.add_argument("--json", type=Path, help="write every number here")
    ap.add_argument("--report", type=Path, help="only print the tables of an earlier --json file")
    args = ap.parse_args()
    if args.report:
        print_report(json.loads(args.report.read_text()))
        return 0
    targets = comma_choices(ap, args.target, TARGETS, "target")
    args.llama_threads = args.llama_threads or [args.threads]
    targets = [x for t in targets for x in ([f"llamacpp-t{n}" for n in args.llama_threads] if t == "llamacpp" else [t])]
    if any(t.startswith("charm") for t in targets) and not args.charm.exists():
        ap.error(f"{args.charm}: no charm binary (cmake --build build --target charm)")
    folder = args.work / "serve" / time.strftime("%Y%m%d-%H%M%S")
    folder.mkdir(parents=True, exist_ok=True)

    res = {"machine": machine(args.work), "threads": args.threads, "runs": [],
           "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
           "charm_commit": subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                                          capture_output=True, text=True).stdout.strip()}
    bin_dir = None
    if any(t.startswith("llamacpp") for t in targets):
        if not args.gguf.exists():
            ap.error(f"{args.gguf}: no GGUF (scripts/moe_gguf.py makes the demo model's)")
        llama_src = ensure_llama_source(args.work, Path(sys.executable), None)
        bin_dir = ensure_llama_build(args.work, llama_src, args.jobs, LLAMA_SERVE_TARGETS)
        res["llama"] = llama_version(llama_src)
    for clients in args.concurrency:
        requests = request_mix(clients * args.requests_per_client, args.prompt_words, args.max_tokens,
                               args.seed + clients)
        for i, req in enumerate(requests):
            req.update(temperature=args.temperature, seed=args.seed * 1000 + i)
        for target in targets:
            res["runs"].append(run_one(args, target, clients, requests, folder, bin_dir))
            if args.json:
                args.json.write_text(json.dumps(res, indent=1))
    if args.batched_bench and bin_dir:
        try:
            res["batched_bench"] = [row for n in args.llama_threads
                                    for row in batched_bench(args, bin_dir, folder, args.concurrency, n)]
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            res["batched_bench_error"] = str(e)
            log(f"llama-batched-bench FAILED: {e}")
    res["machine"]["loadavg_end"] = Path("/proc/loadavg").read_text().split()[:3]
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    print_report(res)
    log(f"logs and configs: {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
