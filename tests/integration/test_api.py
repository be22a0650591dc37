#!/usr/bin/env python3
"""End-to-end test of `charm serve` + two `charm worker`s over loopback, driven by the
official `openai` Python client, then /metrics, `charm status` and `charm run`. The
cluster runs with a shared secret made by `charm secret new` and the API with a key (both
0600 files), so the handshake, the bearer check and the authenticated `charm status` are
exercised too. High-temperature requests check that no id the tokenizer cannot decode is
ever sampled (the fixture's vocab_size is padded past its tokenizer).

Copies the given topology (configs/local-cluster.yaml) to a temporary YAML with free
loopback ports and an absolute model path, starts the workers and the server, and always
stops every process it started at the end. Every wait is bounded. Exit 0 = pass,
anything else = failure (a missing committed model fixture too).
"""
import argparse
import json
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import yaml

API_KEY = "sk-charm-integration-0123456789"
STARTUP_TIMEOUT_S = 180
REQUEST_TIMEOUT_S = 120


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_topology(charm, config_path, out_dir):
    """The config with free ports and an absolute model path; returns (path, doc)."""
    doc = yaml.safe_load(Path(config_path).read_text())
    model = Path(doc["model"])
    if not model.is_absolute():
        doc["model"] = str((Path(config_path).parent / model).resolve())
    secret, key = Path(out_dir) / "cluster.secret", Path(out_dir) / "api.key"
    subprocess.run([charm, "secret", "new", str(secret)], check=True, timeout=60)
    key.write_text(API_KEY + "\n")
    key.chmod(0o600)
    doc["api"] = {"host": "127.0.0.1", "port": free_port(), "api_key_file": str(key)}
    doc["cluster"] = {"secret_file": str(secret)}
    for w in doc["workers"]:
        w["host"] = "127.0.0.1"
        w["port"] = free_port()
    path = Path(out_dir) / "topology.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path, doc


class Processes:
    """The processes this test started; stop_all() always ends them."""

    def __init__(self, log_dir):
        self.log_dir = Path(log_dir)
        self.procs = []

    def start(self, name, argv):
        log = open(self.log_dir / f"{name}.log", "wb")
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append((name, p, log))
        return p

    def check_alive(self):
        for name, p, _ in self.procs:
            if p.poll() is not None:
                raise AssertionError(f"{name} exited early with status {p.returncode}")

    def stop_all(self):
        for _, p, _ in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for name, p, log in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                print(f"{name} ignored SIGTERM; killing", file=sys.stderr)
                p.kill()
                p.wait(timeout=10)
            log.close()

    def dump_logs(self):
        for name, _, _ in self.procs:
            text = (self.log_dir / f"{name}.log").read_text(errors="replace")
            print(f"----- {name} log (last 4000 chars) -----\n{text[-4000:]}", file=sys.stderr)


def wait_health(base, procs):
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        procs.check_alive()
        try:
            with urllib.request.urlopen(base + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{base}/health did not answer within {STARTUP_TIMEOUT_S} s")


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print("ok:", what)


def check_usage(usage, what):
    check(usage is not None, f"{what}: usage present")
    check(usage.prompt_tokens > 0 and usage.completion_tokens > 0, f"{what}: usage counts positive")
    check(usage.total_tokens == usage.prompt_tokens + usage.completion_tokens, f"{what}: total = prompt + completion")


def test_openai_client(base, model_name):
    import openai

    wrong = openai.OpenAI(base_url=base + "/v1", api_key="wrong", timeout=REQUEST_TIMEOUT_S, max_retries=0)
    try:
        wrong.models.list()
        raise AssertionError("a wrong API key was accepted")
    except openai.AuthenticationError as e:
        check(e.status_code == 401, "a wrong API key gets 401")
    client = openai.OpenAI(base_url=base + "/v1", api_key=API_KEY, timeout=REQUEST_TIMEOUT_S, max_retries=0)

    ids = [m.id for m in client.models.list()]
    check(ids == [model_name], f"models.list is [{model_name}]: {ids}")

    prompt = "The capital of France is"
    args = dict(model=model_name, prompt=prompt, max_tokens=12, temperature=0)
    whole = client.completions.create(**args)
    check(whole.object == "text_completion", "completion object")
    check(len(whole.choices) == 1 and whole.choices[0].finish_reason in ("stop", "length"), "completion choice")
    check_usage(whole.usage, "completion")
    check(whole.usage.completion_tokens <= 12, "completion respects max_tokens")
    if whole.choices[0].finish_reason == "length":
        check(whole.usage.completion_tokens == 12, "finish 'length' after max_tokens tokens")

    streamed, finish, objects = "", None, set()
    for chunk in client.completions.create(**args, stream=True):
        objects.add(chunk.object)
        for c in chunk.choices:
            streamed += c.text
            finish = c.finish_reason or finish
    check(objects == {"text_completion"}, f"stream chunk objects: {objects}")
    check(streamed == whole.choices[0].text, f"streamed completion equals whole: {streamed!r}")
    check(finish == whole.choices[0].finish_reason, "streamed finish_reason equals whole")

    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hello."}]
    chat_args = dict(model=model_name, messages=messages, max_tokens=12, temperature=0)
    chat = client.chat.completions.create(**chat_args)
    check(chat.object == "chat.completion", "chat object")
    check(chat.choices[0].message.role == "assistant", "chat message role")
    check_usage(chat.usage, "chat")

    content, role, usage, finish = "", None, None, None
    for chunk in client.chat.completions.create(**chat_args, stream=True, stream_options={"include_usage": True}):
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            role = c.delta.role or role
            content += c.delta.content or ""
            finish = c.finish_reason or finish
    check(role == "assistant", "chat stream announces the assistant role")
    check(content == (chat.choices[0].message.content or ""), f"streamed chat equals whole: {content!r}")
    check(finish == chat.choices[0].finish_reason, "streamed chat finish_reason equals whole")
    check(usage is not None and usage.model_dump() == chat.usage.model_dump(), "stream usage equals whole usage")

    try:
        client.chat.completions.create(model=model_name, messages=messages, temperature=-1)
        raise AssertionError("temperature -1 was accepted")
    except openai.BadRequestError as e:
        body = e.body if isinstance(e.body, dict) else {}
        check(e.status_code == 400 and body.get("param") == "temperature", f"400 naming temperature: {body}")


def test_undecodable_never_sampled(base, model_name):
    """Near-uniform sampling (temperature 50) over the fixture's 151936 logits, 267 of them
    padding past the tokenizer's 151669 ids: before charm masked them, seed 1 picked one
    within 250 tokens and the request failed with a 400 naming tokenizer.json. Every
    request must now succeed, whole and streamed, on both endpoints."""
    import openai

    client = openai.OpenAI(base_url=base + "/v1", api_key=API_KEY, timeout=REQUEST_TIMEOUT_S, max_retries=0)
    args = dict(model=model_name, max_tokens=250, temperature=50, seed=1)
    whole = client.completions.create(prompt=[9707, 11, 1879], **args)
    check(whole.usage.completion_tokens == 250, f"hot completion: {whole.usage.completion_tokens} tokens")
    streamed = ""
    for chunk in client.completions.create(prompt=[9707, 11, 1879], stream=True, **args):
        streamed += "".join(c.text for c in chunk.choices)
    check(streamed == whole.choices[0].text, "hot streamed completion equals the whole one")
    messages = [{"role": "user", "content": "Say anything."}]
    for seed in (1, 2):
        chat = client.chat.completions.create(messages=messages, **dict(args, seed=seed))
        check(chat.choices[0].finish_reason in ("stop", "length"), f"hot chat, seed {seed}")
        pieces = [c.choices[0].delta.content or "" for c in
                  client.chat.completions.create(messages=messages, stream=True, **dict(args, seed=seed))
                  if c.choices]
        check("".join(pieces) == (chat.choices[0].message.content or ""), f"hot chat stream, seed {seed}")


def test_logprobs_penalties_n(base, model_name):
    """OpenAI's logprobs shapes, the penalties and n, through the official client."""
    import openai

    client = openai.OpenAI(base_url=base + "/v1", api_key=API_KEY, timeout=REQUEST_TIMEOUT_S, max_retries=0)
    messages = [{"role": "user", "content": "Count from one to ten."}]
    greedy = dict(model=model_name, max_tokens=10, temperature=0, extra_body={"repetition_penalty": 1})
    chat = client.chat.completions.create(messages=messages, logprobs=True, top_logprobs=3, **greedy)
    lp = chat.choices[0].logprobs
    check(lp is not None and isinstance(lp.content, list), "chat logprobs: a content list")
    comp = client.completions.create(prompt="One, two, three,", logprobs=2, **greedy)
    clp = comp.choices[0].logprobs
    check(clp is not None and len(clp.tokens) == len(clp.token_logprobs) == len(clp.top_logprobs) ==
          len(clp.text_offset), "completion logprobs: four lists of one length")
    check(len(lp.content) == chat.usage.completion_tokens, "chat: one logprob per generated token")
    for e in lp.content:
        tops = [t.logprob for t in e.top_logprobs]
        check(e.logprob <= 0 and len(tops) == 3 and tops == sorted(tops, reverse=True), f"chat entry {e.token!r}")
        # Greedy without penalties samples the argmax: the first alternative.
        check(e.top_logprobs[0].token == e.token and e.top_logprobs[0].logprob == e.logprob, "greedy = top 1")
        check(bytes(e.bytes).decode("utf-8", "replace") == e.token, "bytes are the token's")
    streamed = []
    for chunk in client.chat.completions.create(messages=messages, logprobs=True, top_logprobs=3, stream=True,
                                                **greedy):
        for c in chunk.choices:
            streamed += c.logprobs.content if c.logprobs else []
    check([e.model_dump() for e in streamed] == [e.model_dump() for e in lp.content], "streamed chat logprobs")
    check(len(clp.tokens) == comp.usage.completion_tokens and clp.text_offset[0] == 0, "completion logprobs")
    # A huge repetition penalty leaves every seen token's logit near 0 or far below it:
    # greedy then never repeats a token.
    rep = client.completions.create(prompt="One, two, three,", logprobs=0,
                                    **dict(greedy, max_tokens=24, extra_body={"repetition_penalty": 1e6}))
    tokens = rep.choices[0].logprobs.tokens
    check(len(set(tokens)) == len(tokens), f"repetition_penalty 1e6: no token twice: {tokens}")

    # n: choice i samples with seed + i, so each equals a single request with that seed.
    sampled = dict(model=model_name, prompt="Once upon a time", max_tokens=12, temperature=1, seed=5)
    two = client.completions.create(n=2, **sampled)
    check([c.index for c in two.choices] == [0, 1], "n=2: two choices, indexed 0 and 1")
    for i in range(2):
        one = client.completions.create(**dict(sampled, seed=5 + i))
        check(two.choices[i].text == one.choices[0].text, f"n=2: choice {i} is seed {5 + i}'s")
    texts = {0: "", 1: ""}
    for chunk in client.completions.create(n=2, stream=True, **sampled):
        for c in chunk.choices:
            texts[c.index] += c.text
    check([texts[0], texts[1]] == [c.text for c in two.choices], "n=2 streamed: each choice's text")

    for field, value in (("frequency_penalty", 2.5), ("presence_penalty", -3), ("n", 17)):
        try:
            client.completions.create(**dict(sampled, **{field: value}))
            raise AssertionError(f"{field} {value} was accepted")
        except openai.BadRequestError as e:
            body = e.body if isinstance(e.body, dict) else {}
            check(e.status_code == 400 and body.get("param") == field, f"400 naming {field}: {body}")


def test_metrics(base, doc):
    """GET /metrics after the generations above: tokens, TTFT and per-worker RPC moved."""
    request = urllib.request.Request(base + "/metrics", headers={"Authorization": "Bearer " + API_KEY})
    with urllib.request.urlopen(request, timeout=10) as r:
        text = r.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, value = line.rsplit(" ", 1)
            samples[series] = float(value)
    check(samples.get("charm_completion_tokens_total", 0) > 0, "metrics count completion tokens")
    check(samples.get("charm_prompt_tokens_total", 0) > 0, "metrics count prompt tokens")
    check(samples.get("charm_time_to_first_token_seconds_count", 0) >= 4, "metrics observe TTFT per generation")
    check(samples.get("charm_time_per_output_token_seconds_count", 0) > 0, "metrics observe per-token latency")
    for w in doc["workers"]:
        name = w["name"]
        check(samples.get(f'charm_worker_rpc_seconds_count{{worker="{name}"}}', 0) > 0, f"RPC latency of {name}")
        check(samples.get(f'charm_worker_up{{worker="{name}"}}') == 1, f"{name} is up in /metrics")
    check(samples.get('charm_http_requests_total{endpoint="/v1/completions",status="200"}', 0) >= 2,
          "metrics count HTTP requests by endpoint and status")


def test_status(charm, topology, doc):
    r = subprocess.run([charm, "status", "--config", str(topology), "--timeout-ms", "5000"],
                       capture_output=True, text=True, timeout=60)
    print(r.stdout)
    check(r.returncode == 0, f"charm status exits 0 (got {r.returncode}, stderr {r.stderr!r})")
    lines = [line.split() for line in r.stdout.splitlines() if line.strip()]
    header = lines[0]
    check("STATE" in header and "EXPERTS" in header, f"status header names STATE and EXPERTS: {header}")
    for w in doc["workers"]:
        rows = [f for f in lines[1:] if f[0] == w["name"]]
        check(len(rows) == 1, f"status lists worker {w['name']}")
        row = dict(zip(header, rows[0]))
        check(row["STATE"] == "up", f"worker {w['name']} is up")
        check(row["EXPERTS"].isdigit() and int(row["EXPERTS"]) > 0, f"worker {w['name']} holds {row['EXPERTS']} experts")
        check(row["TIERS"] == "ram:" + row["EXPERTS"], f"worker {w['name']} holds its experts in RAM")
        check(row["LAST_SEEN"] != "-" and row["FAILOVERS"] == "0", f"worker {w['name']}: last seen, no failovers")


def worker_requests(base):
    """Layer requests the coordinator has sent to all workers so far (/cluster/status)."""
    request = urllib.request.Request(base + "/cluster/status", headers={"Authorization": "Bearer " + API_KEY})
    with urllib.request.urlopen(request, timeout=10) as r:
        return sum(w["requests"] for w in json.loads(r.read())["workers"])


def post_completion(base, body):
    request = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(), method="POST",
                                     headers={"Authorization": "Bearer " + API_KEY,
                                              "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as r:
        return json.loads(r.read())


def test_hostile_json(base, procs):
    """40 KB of nested arrays in a message, or in chat_template_kwargs, used to kill the
    coordinator with SIGSEGV (and serve.sh then stopped the workers): now a 400 naming
    the field, and the server keeps serving."""
    deep = "[" * 20000 + "]" * 20000
    for where, body in (("messages[0].tool_calls", '{"messages": [{"role": "user", "content": "hi", "tool_calls": '
                         + deep + '}], "max_tokens": 2}'),
                        ("chat_template_kwargs.x", '{"messages": [{"role": "user", "content": "hi"}], '
                         '"chat_template_kwargs": {"x": ' + deep + '}, "max_tokens": 2}')):
        request = urllib.request.Request(base + "/v1/chat/completions", data=body.encode(), method="POST",
                                         headers={"Authorization": "Bearer " + API_KEY,
                                                  "Content-Type": "application/json"})
        try:
            urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S)
            raise AssertionError(f"a {len(body)}-byte request nested 20000 deep in {where} was accepted")
        except urllib.error.HTTPError as e:
            error = json.loads(e.read())["error"]
            check(e.code == 400 and error["param"].startswith(where + "[0]") and "limit of 64 levels" in error["message"],
                  f"deep JSON in {where}: 400 naming the field and the limit: {e.code} {error}")
    procs.check_alive()
    with urllib.request.urlopen(base + "/health", timeout=10) as r:
        check(r.status == 200, "the server answers /health after the deep requests")


def test_client_hangup(base):
    """A non-streamed request whose client hangs up stops generating (it would otherwise
    run to max_tokens while every other request queues): the layer requests it causes are
    counted against an undisturbed run of the same request."""
    body = {"prompt": "Count with me: one two three", "max_tokens": 2000, "temperature": 0}
    before = worker_requests(base)
    full = post_completion(base, body)
    undisturbed = worker_requests(base) - before
    check(full["usage"]["completion_tokens"] >= 1000,
          f"the undisturbed run is long enough to tell ({full['usage']['completion_tokens']} tokens)")

    before = worker_requests(base)
    payload = json.dumps(body).encode()
    with socket.create_connection(("127.0.0.1", int(base.rsplit(":", 1)[1])), timeout=10) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Authorization: Bearer " + API_KEY.encode() +
                  b"\r\nContent-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)
        time.sleep(0.1)  # let it start generating, then hang up
    post_completion(base, {"prompt": "Hi", "max_tokens": 1, "temperature": 0})  # queued behind it
    disturbed = worker_requests(base) - before
    check(disturbed < undisturbed / 2,
          f"the abandoned request stopped early ({disturbed} layer requests vs {undisturbed} undisturbed)")


def test_run(charm, topology):
    r = subprocess.run([charm, "run", "--config", str(topology), "--max-tokens", "4", "--temperature", "0",
                        "Hello"], capture_output=True, text=True, timeout=REQUEST_TIMEOUT_S)
    check(r.returncode == 0, f"charm run exits 0 (stderr {r.stderr[-2000:]!r})")
    check("prompt tokens:" in r.stderr and "tok/s" in r.stderr, f"charm run prints stats: {r.stderr.strip()[-300:]!r}")
    r = subprocess.run([charm, "run", "--config", str(topology), "--max-tokens", "0", "Hello"],
                       capture_output=True, text=True, timeout=60)
    check(r.returncode == 2, "charm run --max-tokens 0 exits 2")
    r = subprocess.run([charm, "serve", "--config", str(topology) + ".missing"], capture_output=True, text=True,
                       timeout=60)
    check(r.returncode in (1, 2) and r.stderr.startswith("charm: "), f"missing config is reported: {r.stderr!r}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--charm", required=True)
    ap.add_argument("--config", required=True)
    ap.add_argument("--source-dir", required=True)
    a = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="charm-api-") as tmp:
        topology, doc = write_topology(a.charm, a.config, tmp)
        if not (Path(doc["model"]) / "config.json").exists():
            print(f"FAIL: committed model fixture {doc['model']}/config.json is missing", file=sys.stderr)
            return 1
        procs = Processes(tmp)
        ok = False
        try:
            for w in doc["workers"]:
                procs.start(w["name"], [a.charm, "worker", "--config", str(topology), "--name", w["name"]])
            procs.start("serve", [a.charm, "serve", "--config", str(topology)])
            base = f"http://127.0.0.1:{doc['api']['port']}"
            wait_health(base, procs)
            test_openai_client(base, doc.get("model_name") or Path(doc["model"]).name)
            test_undecodable_never_sampled(base, doc.get("model_name") or Path(doc["model"]).name)
            test_logprobs_penalties_n(base, doc.get("model_name") or Path(doc["model"]).name)
            test_metrics(base, doc)
            test_hostile_json(base, procs)
            test_client_hangup(base)
            test_status(a.charm, topology, doc)
            test_run(a.charm, topology)
            ok = True
        finally:
            procs.stop_all()
            if not ok:
                procs.dump_logs()
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
