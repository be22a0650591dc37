"""Shared pieces of the failover and load tests: a replicated topology written to a temp
dir, worker placement on loopback or in network namespaces, and a streaming client that
timestamps every chunk. Used by test_failover.py and test_load.py."""
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import yaml

from test_api import free_port

# Each expert on two workers, so any one of them can go (configs/replicas.yaml's split).
REPLICA_WORKERS = [("w0", "0-10"), ("w1", "5-15"), ("w2", ["0-4", "11-15"])]


def write_replica_topology(source_dir, out_dir, hosts, api_port, timeouts):
    """A topology of REPLICA_WORKERS on `hosts` (one per worker), the tiny fixture model,
    and a cluster shared secret (a 0600 file in `out_dir`), so every connect, the
    coordinator's rejoins after a kill included, runs the authenticated handshake. The API
    has no key: the tests read /cluster/status and stream without one."""
    model = Path(source_dir) / "tests/fixtures/models/qwen3-moe-tiny"
    secret = Path(out_dir) / "cluster.secret"
    secret.write_text(os.urandom(32).hex() + "\n")
    secret.chmod(0o600)
    doc = {
        "model": str(model.resolve()),
        "model_name": "qwen3-moe-tiny",
        "mode": "cluster",
        "api": {"host": "127.0.0.1", "port": api_port},
        "timeouts": timeouts,
        "cluster": {"secret_file": str(secret)},
        "workers": [{"name": n, "host": h, "port": free_port(), "experts": e}
                    for (n, e), h in zip(REPLICA_WORKERS, hosts)],
    }
    path = Path(out_dir) / "topology.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path, doc


def run(argv):
    """Runs a command; returns (ok, stderr)."""
    r = subprocess.run(argv, capture_output=True, text=True)
    return r.returncode == 0, r.stderr.strip()


TEST_SUBNET = "10.231.0.0/16"  # the test links' /30s are carved from it


class Namespaces:
    """One network namespace per worker, joined to the root namespace by a veth pair with a
    private /30 (10.231.X.0/30, a free X near one from this process id), optionally with
    netem latency on both ends (delay_ms; a kernel without netem runs without it, said in
    netem_note) and a token-bucket rate limit on both ends (rate, a tc rate such as "1gbit";
    required when given), and an `unreachable` route over TEST_SUBNET in the root
    namespace. Only addresses the test creates itself are used. setup() proves each link
    carries a TCP connection before the test relies on it. cleanup() removes all."""

    def __init__(self, count, delay_ms=0, rate=None):
        self.count = count
        self.delay_ms = delay_ms
        self.rate = rate
        tag = os.getpid() % 10000
        self.names = [f"charm-ft{tag}-{i}" for i in range(count)]
        self.veths = [(f"cft{tag}h{i}", f"cft{tag}n{i}") for i in range(count)]
        self.subnets = []
        self.created = []
        self.netem_note = ""

    def setup(self):
        """Creates everything; returns "" on success or why namespaces cannot be made."""
        if os.geteuid() != 0:
            return "not root (ip netns needs CAP_NET_ADMIN and CAP_SYS_ADMIN)"
        why = self._choose_subnets()
        if why:
            return why
        # Nothing for the test subnet ever leaves by the default route, even with a link down.
        ok, err = run(["ip", "route", "add", "unreachable", TEST_SUBNET])
        if ok:
            self.created.append(("route", TEST_SUBNET))
        elif "File exists" not in err:
            return f"`ip route add unreachable {TEST_SUBNET}` failed: {err}"
        for ns, (host_if, ns_if), (host_ip, ns_ip) in zip(self.names, self.veths, self.subnets):
            steps = [
                ["ip", "netns", "add", ns],
                ["ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if],
                ["ip", "link", "set", ns_if, "netns", ns],
                ["ip", "addr", "add", f"{host_ip}/30", "dev", host_if],
                ["ip", "link", "set", host_if, "up"],
                ["ip", "netns", "exec", ns, "ip", "addr", "add", f"{ns_ip}/30", "dev", ns_if],
                ["ip", "netns", "exec", ns, "ip", "link", "set", ns_if, "up"],
                ["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"],
            ]
            for step in steps:
                ok, err = run(step)
                if not ok:
                    return f"`{' '.join(step)}` failed: {err}"
                if step[1:3] == ["netns", "add"]:
                    self.created.append(("ns", ns))
                if step[1:3] == ["link", "add"]:
                    self.created.append(("link", host_if))
            in_ns = ["ip", "netns", "exec", ns]
            if self.rate:
                # A LAN's bandwidth both ways. The burst holds a few 64 KiB GSO super-packets
                # (veth sends them whole), the queue 20 ms of traffic before drops.
                for prefix, dev in (([], host_if), (in_ns, ns_if)):
                    argv = prefix + ["tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", self.rate,
                                     "burst", "256kb", "latency", "20ms"]
                    ok, err = run(argv)
                    if not ok:
                        return f"`{' '.join(argv)}` failed: {err}"
            # LAN latency both ways; a kernel without sch_netem runs without it (said so).
            for prefix, dev in (([], host_if), (in_ns, ns_if)):
                if not self.delay_ms or self.rate:
                    break  # netem would replace the tbf root qdisc: a rate-limited link gets its delay elsewhere
                ok, err = run(prefix + ["tc", "qdisc", "add", "dev", dev, "root", "netem", "delay", f"{self.delay_ms}ms"])
                if not ok and not self.netem_note:
                    self.netem_note = f"tc netem unavailable ({err}); no added latency"
        return self._probe()

    def _choose_subnets(self):
        """Picks `count` /30s of TEST_SUBNET that no address or route of this machine uses
        (a namespace left by a killed run, or the machine's own network), starting from one
        derived from the process id. Returns "" or why none is free."""
        out = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True).stdout
        out += subprocess.run(["ip", "-4", "route", "show", "table", "all"], capture_output=True, text=True).stdout
        used = {int(m) for m in re.findall(r"\b10\.231\.(\d+)\.\d+", out)}
        start = os.getpid() % 60
        for k in range(60):
            base = ((start + k) % 60) * 4
            if not used & set(range(base, base + self.count)):
                self.subnets = [(f"10.231.{base + i}.1", f"10.231.{base + i}.2") for i in range(self.count)]
                return ""
        return f"no free /30 in {TEST_SUBNET} (in use: {sorted(used)})"

    def _probe(self, timeout_s=5.0):
        """A TCP connection from the root namespace to a listener in each namespace, so a
        machine whose sandbox does not carry veth traffic (it happened on a CI machine:
        every connect refused) is noticed before the test relies on it. Returns "" or why."""
        listener = ("import socket,sys; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1);"
                    "s.bind((sys.argv[1], 0)); s.listen(1); print(s.getsockname()[1], flush=True);"
                    "s.settimeout(%s); c, _ = s.accept(); c.sendall(b'ok'); c.close()" % timeout_s)
        for ns, (_, ns_ip) in zip(self.names, self.subnets):
            p = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", listener, ns_ip],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            try:
                port = p.stdout.readline().strip()
                if not port.isdigit():
                    return f"no test listener in namespace {ns}: {p.communicate(timeout=timeout_s)[1].strip()}"
                err = ""
                deadline = time.monotonic() + timeout_s
                while time.monotonic() < deadline:
                    try:
                        with socket.create_connection((ns_ip, int(port)), timeout=1.0) as c:
                            if c.recv(2) == b"ok":
                                err = ""
                                break
                            err = "the listener sent nothing"
                    except OSError as e:
                        err = str(e)
                    time.sleep(0.1)
                if err:
                    return f"a TCP connection from the root namespace to {ns_ip} (namespace {ns}) failed: {err}"
            finally:
                p.kill()
                p.wait()
        return ""

    def hosts(self):
        return [ns_ip for _, ns_ip in self.subnets]

    def prefix(self, i):
        """argv prefix that runs a command inside worker i's namespace."""
        return ["ip", "netns", "exec", self.names[i]]

    def cleanup(self):
        for kind, name in reversed(self.created):
            if kind == "route":
                run(["ip", "route", "del", "unreachable", name])
            else:
                run(["ip", "link", "del", name] if kind == "link" else ["ip", "netns", "del", name])
        self.created = []


def stream_completion(base, prompt, max_tokens, timeout=120, extra=None):
    """POST /v1/completions stream=true, temperature 0, plus the fields of `extra`. Returns
    dict(text, chunks: [(t, text)], finish, error, status). Every chunk is timestamped with
    time.monotonic()."""
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                       **(extra or {})}).encode()
    req = urllib.request.Request(base + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    out = {"text": "", "chunks": [], "finish": None, "error": None, "status": None, "done": False}
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            out["status"] = r.status
            for raw in r:
                line = raw.decode().strip()
                if not line.startswith("data: "):
                    continue
                data = line[len("data: "):]
                if data == "[DONE]":
                    out["done"] = True
                    break
                event = json.loads(data)
                if "error" in event:
                    out["error"] = event["error"]
                    continue
                for c in event.get("choices", []):
                    if c.get("text"):
                        out["chunks"].append((time.monotonic(), c["text"]))
                        out["text"] += c["text"]
                    out["finish"] = c.get("finish_reason") or out["finish"]
    except urllib.error.HTTPError as e:
        out["status"] = e.code
        out["error"] = json.loads(e.read().decode() or "{}").get("error")
    return out


def cluster_status(base):
    with urllib.request.urlopen(base + "/cluster/status", timeout=5) as r:
        return {w["name"]: w for w in json.loads(r.read())["workers"]}


def rss_kib(pid):
    """VmRSS of `pid` in KiB (0 if gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0
