#!/usr/bin/env python3
"""Continuous batching through HTTP: single-node `charm serve` on the tiny fixture model.

Server A (YAML `serving: {max_batch_tokens: 64, max_num_seqs: 8, max_waiting: 64}`):
  1. /health, /metrics, /v1/models and /cluster/status answer 200 (10 s timeout each)
     while 32 streaming completions are in flight, 8 running and the rest waiting; the
     latencies are printed, not asserted.
  2. every stream ends with a finish_reason and [DONE], and the greedy answer for a prompt
     is the same in every concurrent stream and the same as that prompt asked alone
     (batch invariance); running <= max_num_seqs throughout; afterwards nothing is running,
     waiting or holding KV blocks.
  4b. the same prompt of several KV blocks asked twice: the prefix cache counts hits and
     the greedy answer is the same.
Server B (flags `--max-num-seqs 1 --max-waiting 1 --max-batch-tokens 1`):
  3. one stream running and one waiting: a third request gets 429 with Retry-After and an
     OpenAI error body; once both clients hang up the sequences are freed and a new
     request succeeds.
  4. a client that sends a ~1900-token prompt (one prompt token per step) and hangs up
     0.1 s later: running, waiting and used KV blocks return to 0 within 20 s, and a
     following request succeeds. When the same prompt length takes over 0.5 s to prefill
     undisturbed, the cancelled one must also have stopped before its prompt was done.
Every wait is bounded. Exit 0 = pass, anything else = failure.
"""
import argparse
import json
import socket
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cluster_harness import stream_completion  # noqa: E402
from test_api import Processes, check, free_port, wait_health  # noqa: E402

PROBE_TIMEOUT_S = 10
REQUEST_TIMEOUT_S = 120
DRAIN_TIMEOUT_S = 20
PROMPTS = ["The quick brown fox", "Once upon a time", "Hello, world",
           "A longer prompt, so that its first blocks are full and the prefix cache sees them: "
           + " ".join(f"item{i}" for i in range(24))]
HANGUP_AFTER_S = 0.1  # check 4's client hangs up this long after sending
HEARTBEAT_S = 0.1  # the engine looks for hung-up clients this often
CONCURRENT = 32
MAX_NUM_SEQS_A = 8


UNPENALISED = {"repetition_penalty": 1}  # so no server default changes a greedy answer


def greedy(prompt, max_tokens, stream):
    """A greedy completion body; repetition_penalty 1 so no server default changes it."""
    return {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "repetition_penalty": 1, "stream": stream}


def long_prompt(tag, words=500):
    """About 3.9 tokens a word pair: 500 pairs are ~1940 tokens of the fixture's 2048."""
    return tag + " " + " ".join(f"apple{i % 97} banana" for i in range(words))


def start_server(procs, charm, model, tmp, name, serving=None, flags=()):
    """`charm serve` in single-node mode on `model` and a free port; returns its base URL
    once healthy."""
    port = free_port()
    doc = {"model": str(model),
           "model_name": "qwen3-moe-tiny", "mode": "single-node", "api": {"host": "127.0.0.1", "port": port}}
    if serving:
        doc["serving"] = serving
    path = Path(tmp) / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    procs.start(name, [charm, "serve", "--config", str(path), *flags])
    base = f"http://127.0.0.1:{port}"
    wait_health(base, procs)
    return base


def get(base, path):
    """GET; returns (status, body text, seconds)."""
    start = time.monotonic()
    with urllib.request.urlopen(base + path, timeout=PROBE_TIMEOUT_S) as r:
        return r.status, r.read().decode(), time.monotonic() - start


def parse_metrics(text):
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, value = line.rsplit(" ", 1)
            samples[series] = float(value)
    return samples


def metrics(base):
    return parse_metrics(get(base, "/metrics")[1])


def in_engine(m):
    """(running, waiting, used KV blocks) from parsed /metrics."""
    return (m["charm_sequences_running"], m["charm_sequences_waiting"], m['charm_kv_cache_blocks{state="used"}'])


def wait_drained(base, what):
    """Polls /metrics until nothing runs, waits or holds a KV block; returns the seconds taken."""
    start = time.monotonic()
    while True:
        m = metrics(base)
        if in_engine(m) == (0, 0, 0):
            return time.monotonic() - start
        if time.monotonic() - start > DRAIN_TIMEOUT_S:
            raise AssertionError(f"{what}: after {DRAIN_TIMEOUT_S} s running/waiting/used blocks are {in_engine(m)}")
        time.sleep(0.1)


def post(base, body):
    """POST /v1/completions; returns the JSON answer (raises HTTPError on an error status)."""
    request = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as r:
        return json.loads(r.read())


class RawRequest:
    """A POST /v1/completions on a plain socket, so the test can hang up whenever it likes."""

    def __init__(self, base, body):
        host, port = base.rsplit("/", 1)[1].split(":")
        payload = json.dumps(body).encode()
        self.sock = socket.create_connection((host, int(port)), timeout=REQUEST_TIMEOUT_S)
        self.sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)
        self.received = b""

    def read_until(self, marker, timeout):
        deadline = time.monotonic() + timeout
        while marker not in self.received:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {marker!r} within {timeout} s: got {self.received[:300]!r}")
            self.sock.settimeout(left)
            chunk = self.sock.recv(65536)
            if not chunk:
                raise AssertionError(f"connection closed before {marker!r}: got {self.received[:300]!r}")
            self.received += chunk

    def close(self):
        self.sock.close()


def check_concurrent(base):
    """Checks 1 and 2 on server A."""
    max_tokens = 200
    alone = {p: stream_completion(base, p, max_tokens, REQUEST_TIMEOUT_S, UNPENALISED) for p in PROMPTS}
    for p, r in alone.items():
        check(r["status"] == 200 and r["done"] and r["finish"] in ("stop", "length") and r["text"],
              f"alone: {p[:20]!r} complete ({len(r['text'])} chars, finish {r['finish']})")

    finished = [0]
    lock = threading.Lock()

    def one(prompt):
        r = stream_completion(base, prompt, max_tokens, REQUEST_TIMEOUT_S, UNPENALISED)
        with lock:
            finished[0] += 1
        return prompt, r

    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(CONCURRENT)]
    probes, states = [], []  # probes: (endpoint, status, seconds, unfinished streams at the answer)
    good_rounds = 0
    with ThreadPoolExecutor(max_workers=CONCURRENT) as pool:
        futures = [pool.submit(one, p) for p in prompts]
        deadline = time.monotonic() + 2 * REQUEST_TIMEOUT_S
        while finished[0] < CONCURRENT and time.monotonic() < deadline:
            round_ok = True
            for endpoint in ("/health", "/metrics", "/v1/models", "/cluster/status"):
                status, body, seconds = get(base, endpoint)
                unfinished = CONCURRENT - finished[0]
                probes.append((endpoint, status, seconds, unfinished))
                if status != 200:
                    raise AssertionError(f"{endpoint} answered {status} under load")
                round_ok = round_ok and unfinished > 0
                if endpoint == "/metrics":
                    running, waiting, used = in_engine(parse_metrics(body))
                    states.append((running, waiting, used))
                    round_ok = round_ok and running + waiting > 0
            good_rounds += round_ok
            time.sleep(0.05)
        results = [f.result(timeout=2 * REQUEST_TIMEOUT_S) for f in futures]

    print(f"\nprobe latencies under load ({len(probes)} probes in {good_rounds} rounds while streams ran):")
    for endpoint in ("/health", "/metrics", "/v1/models", "/cluster/status"):
        ms = sorted(s * 1000 for e, _, s, u in probes if e == endpoint and u > 0)
        if ms:
            print(f"  {endpoint:16s} n={len(ms):3d} min {ms[0]:.1f} ms, median {ms[len(ms) // 2]:.1f} ms, "
                  f"max {ms[-1]:.1f} ms")
    print("  (running, waiting, used blocks) seen: first " + ", ".join(map(str, states[:6])) +
          f" ... max running {max(s[0] for s in states):.0f}, max waiting {max(s[1] for s in states):.0f}")
    check(good_rounds >= 1, f"{good_rounds} probe rounds answered all four endpoints while streams were still "
          "running and /metrics showed running + waiting > 0")
    check(max(s[0] for s in states) <= MAX_NUM_SEQS_A, f"never more than max_num_seqs={MAX_NUM_SEQS_A} running")
    check(max(s[1] for s in states) > 0, "some requests were seen waiting")

    for prompt, r in results:
        if r["status"] != 200 or r["error"] is not None or not r["done"] or r["finish"] not in ("stop", "length"):
            raise AssertionError(f"concurrent {prompt[:20]!r}: incomplete: {r}")
        if r["text"] != alone[prompt]["text"]:
            raise AssertionError(f"concurrent {prompt[:20]!r} differs from alone:\n  concurrent {r['text']!r}\n"
                                 f"  alone      {alone[prompt]['text']!r}")
    check(True, f"all {CONCURRENT} concurrent streams complete (finish_reason, [DONE]) and each prompt's greedy "
          f"answer equals the one asked alone ({len(PROMPTS)} prompts x {CONCURRENT // len(PROMPTS)})")
    seconds = wait_drained(base, "after the concurrent streams")
    check(True, f"after the streams nothing runs, waits or holds a KV block ({seconds:.2f} s)")


def check_prefix_cache(base):
    """Check 4b on server A: the same ~280-token prompt twice."""
    prompt = long_prompt("prefix", 70)
    before = metrics(base)["charm_prefix_cache_hits_total"]
    first = post(base, greedy(prompt, 16, False))
    middle = metrics(base)["charm_prefix_cache_hits_total"]
    second = post(base, greedy(prompt, 16, False))
    after = metrics(base)["charm_prefix_cache_hits_total"]
    print(f"prefix cache: prompt {first['usage']['prompt_tokens']} tokens; hits {before:.0f} -> {middle:.0f} "
          f"(first) -> {after:.0f} (second)")
    check(after > middle, "the second identical prompt hits the prefix cache")
    check(first["choices"][0]["text"] == second["choices"][0]["text"] and first["choices"][0]["text"],
          "the greedy answer from the cached prefix equals the first")


def check_queue_full(base):
    """Check 3 on server B (max_num_seqs 1, max_waiting 1)."""
    body = greedy("Count with me: one two three", 1500, True)
    running = RawRequest(base, body)
    waiting = None
    try:
        running.read_until(b"data: ", 30)
        waiting = RawRequest(base, body)
        deadline = time.monotonic() + PROBE_TIMEOUT_S
        while in_engine(metrics(base))[:2] != (1, 1):
            if time.monotonic() > deadline:
                raise AssertionError(f"the second stream is not waiting: {in_engine(metrics(base))}")
            time.sleep(0.05)
        check(True, "one stream running, one waiting")
        try:
            post(base, greedy("Hi", 4, False))
            raise AssertionError("a third request was accepted with max_num_seqs 1 + max_waiting 1 in flight")
        except urllib.error.HTTPError as e:
            retry, error = e.headers.get("Retry-After"), json.loads(e.read())["error"]
            print(f"429 answer: Retry-After {retry!r}, error {error}")
            check(e.code == 429, f"the third request gets 429 (got {e.code})")
            check(retry is not None and retry.strip().isdigit(), f"with a Retry-After header ({retry!r})")
            check(isinstance(error.get("message"), str) and error["message"] and error.get("type") == "rate_limit_error",
                  "and an OpenAI error body (message, type rate_limit_error)")
    finally:
        running.close()
        if waiting:
            waiting.close()
    seconds = wait_drained(base, "after both streams hung up")
    check(True, f"both hung-up streams freed their sequences and blocks ({seconds:.2f} s)")
    r = post(base, greedy("Hi", 4, False))
    check(r["choices"][0]["finish_reason"] in ("stop", "length"), "a new request succeeds afterwards")


def check_hangup_in_prefill(base):
    """Check 4 on server B (one prompt token per step)."""
    m0 = metrics(base)
    start = time.monotonic()
    undisturbed = post(base, greedy(long_prompt("alpha"), 1, False))
    prefill_s = time.monotonic() - start
    m1 = metrics(base)
    prompt_tokens = undisturbed["usage"]["prompt_tokens"]
    print(f"undisturbed: {prompt_tokens} prompt tokens in {prefill_s:.2f} s, "
          f"{m1['charm_step_tokens_sum'] - m0['charm_step_tokens_sum']:.0f} step tokens")

    request = RawRequest(base, greedy(long_prompt("omega"), 100, True))  # another prompt: no cached prefix
    time.sleep(HANGUP_AFTER_S)
    request.close()
    seconds = wait_drained(base, "after a client hung up mid-prefill")
    m2 = metrics(base)
    processed = m2["charm_step_tokens_sum"] - m1["charm_step_tokens_sum"]
    print(f"hung up {HANGUP_AFTER_S} s after sending: {processed:.0f} tokens processed before the cancel, "
          f"drained in {seconds:.2f} s")
    check(True, "the hung-up sequence is freed: running, waiting and used KV blocks back to 0")
    # Only where the undisturbed prefill outlasts the hang-up plus a few heartbeats does
    # "cut short" follow from correctness rather than from this machine's speed.
    if prefill_s > HANGUP_AFTER_S + 4 * HEARTBEAT_S:
        check(processed < prompt_tokens - 16, f"the cancel stopped the prefill ({processed:.0f} of ~{prompt_tokens})")
    else:
        print(f"note: the prefill took only {prefill_s:.2f} s undisturbed; not asserting it was cut short")
    r = post(base, greedy("Hi", 4, False))
    check(r["choices"][0]["finish_reason"] in ("stop", "length"), "a following request succeeds")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--charm", required=True)
    ap.add_argument("--source-dir", required=True)
    a = ap.parse_args()
    model = (Path(a.source_dir) / "tests/fixtures/models/qwen3-moe-tiny").resolve()
    if not (model / "config.json").exists():
        print(f"FAIL: committed model fixture {model}/config.json is missing", file=sys.stderr)
        return 1

    with tempfile.TemporaryDirectory(prefix="charm-serving-") as tmp:
        procs = Processes(tmp)
        ok = False
        try:
            base = start_server(procs, a.charm, model, tmp, "serve-batched",
                                serving={"max_batch_tokens": 64, "max_num_seqs": MAX_NUM_SEQS_A, "max_waiting": 64,
                                         "kv_cache_gb": 0.25})
            check_concurrent(base)
            check_prefix_cache(base)
            base = start_server(procs, a.charm, model, tmp, "serve-queue1",
                                flags=["--max-num-seqs", "1", "--max-waiting", "1", "--max-batch-tokens", "1",
                                       "--kv-cache-gb", "0.25"])
            check_queue_full(base)
            check_hangup_in_prefill(base)
            procs.check_alive()
            ok = True
        finally:
            procs.stop_all()
            if not ok:
                procs.dump_logs()
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
