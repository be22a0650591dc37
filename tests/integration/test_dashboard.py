#!/usr/bin/env python3
"""The dashboard in a real browser: `charm serve` with two `charm worker`s on 127.0.0.1
(configs/local-cluster.yaml with free ports, a cluster secret and an API key, as
test_api.py runs it), and Debian's headless Chromium driven over the DevTools protocol
(--remote-debugging-pipe: NUL-terminated JSON on fds 3 and 4, no extra package).

Checks: the page at / loads and goes live with the key given in its #key= fragment,
without a console error, an uncaught exception or a failed load; it shows every worker of
the topology by name; after completion requests its numbers change (completion tokens,
the workers' layer requests, the heat map's busiest count). Without the key, a fresh tab
shows the key form, and typing the key into it makes the page live. --screenshot FILE
saves a PNG of the live page (docs/dashboard.png is one).

Chromium missing is a FAILURE, not a skip: scripts/setup.sh installs it with the tests.
Every wait is bounded; Chromium and the charm processes are always stopped at the end.
Exit 0 = pass.
"""
import argparse
import base64
import fcntl
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import yaml

from test_api import API_KEY, Processes, check, wait_health, write_topology

CDP_TIMEOUT_S = 30      # one DevTools command
PAGE_TIMEOUT_S = 60     # the page reaching a state (live, changed numbers)
REQUEST_TIMEOUT_S = 120
# The fixture's expert slot is 12288 bytes (3 x 64 x 32 bf16); w1 gets 12 slots for its 24
# experts (8 on each of 3 MoE layers): 4 per layer in RAM, the rest on disk.
W1_RAM_BYTES = 12 * 12288


def high_fd(fd):
    """A copy of `fd` numbered 10 or more (the original is closed)."""
    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return high


class Chromium:
    """Headless Chromium with its DevTools protocol on a pipe. Commands go to the browser
    or, with `session`, to a page target attached in flat mode. Events are queued per
    session. close() always ends the process."""

    def __init__(self, binary, profile_dir):
        # Above fd 9, so that moving them to 3 and 4 in the child overwrites none of them.
        to_chrome_r, self._to_chrome = (high_fd(fd) for fd in os.pipe())
        self._from_chrome, from_chrome_w = (high_fd(fd) for fd in os.pipe())
        argv = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--no-default-browser-check",
                "--disable-extensions", "--disable-background-networking", "--disable-sync",
                "--disable-component-update", "--mute-audio", "--hide-scrollbars",
                f"--user-data-dir={profile_dir}", "--remote-debugging-pipe", "about:blank"]
        # The protocol wants the pipe on fds 3 (commands in) and 4 (replies out).
        shell = f'exec "$@" 3<&{to_chrome_r} 4>&{from_chrome_w} {to_chrome_r}<&- {from_chrome_w}>&-'
        self.log = open(Path(profile_dir) / "chromium.log", "wb")
        self.proc = subprocess.Popen(["bash", "-c", shell, "chromium", *argv], pass_fds=(to_chrome_r, from_chrome_w),
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._next_id = 0
        self._replies = {}
        self._events = {}
        self._cv = threading.Condition()
        self._closed = False
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        buf = b""
        while True:
            try:
                chunk = os.read(self._from_chrome, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                with self._cv:
                    self._closed = True
                    self._cv.notify_all()
                return
            buf += chunk
            while b"\0" in buf:
                raw, buf = buf.split(b"\0", 1)
                msg = json.loads(raw)
                with self._cv:
                    if "id" in msg:
                        self._replies[msg["id"]] = msg
                    else:
                        self._events.setdefault(msg.get("sessionId"), queue.Queue()).put(msg)
                    self._cv.notify_all()

    def send(self, method, params=None, session=None, timeout=CDP_TIMEOUT_S):
        with self._cv:
            self._next_id += 1
            msg_id = self._next_id
        msg = {"id": msg_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_chrome, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        with self._cv:
            while msg_id not in self._replies:
                left = deadline - time.monotonic()
                if self._closed or left <= 0:
                    raise AssertionError(f"chromium: no answer to {method} within {timeout} s (closed: {self._closed})")
                self._cv.wait(left)
            reply = self._replies.pop(msg_id)
        if "error" in reply:
            raise AssertionError(f"chromium: {method} failed: {reply['error']}")
        return reply.get("result", {})

    def events(self, session):
        """Every event of `session` received so far."""
        with self._cv:
            q = self._events.setdefault(session, queue.Queue())
        out = []
        while not q.empty():
            out.append(q.get_nowait())
        return out

    def open_page(self):
        """A new tab (its own sessionStorage), attached, with console, log, page and
        runtime events on; returns its session id."""
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime", "Log", "Page"):
            self.send(f"{domain}.enable", session=session)
        self.send("Emulation.setDeviceMetricsOverride",
                  {"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": False}, session=session)
        return session

    def evaluate(self, session, expression):
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session=session)
        if "exceptionDetails" in result:
            raise AssertionError(f"page script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def close(self):
        try:
            if self.proc.poll() is None:
                try:
                    self.send("Browser.close", timeout=5)
                except AssertionError:
                    pass
                self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, 9)
                self.proc.wait(timeout=10)
            os.close(self._to_chrome)
            self.log.close()


def problems(events):
    """Console errors, uncaught exceptions and failed loads among a page's events."""
    out = []
    for e in events:
        m, p = e.get("method"), e.get("params", {})
        if m == "Runtime.exceptionThrown":
            out.append("exception: " + json.dumps(p.get("exceptionDetails", {}))[:500])
        elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert", "warning"):
            out.append(f"console.{p['type']}: " + json.dumps(p.get("args", []))[:500])
        elif m == "Log.entryAdded" and p.get("entry", {}).get("level") in ("error", "warning"):
            out.append("log: " + p["entry"].get("text", "")[:500])
    return out


PAGE_STATE = """(() => {
  const text = (id) => document.getElementById(id).textContent;
  const rows = [...document.querySelectorAll('#workers tbody tr')];
  return {
    status: text('status'),
    keyForm: !document.getElementById('key-form').hidden,
    workers: rows.map((r) => r.dataset.worker),
    requests: rows.map((r) => r.querySelector('.requests').textContent),
    completion: text('completion-tokens'),
    heat: text('heat-note'),
    heatWidth: document.getElementById('heat').width,
  };
})()"""


def wait_page(chrome, session, what, done):
    """Polls the page's state until done(state); returns it. Fails after PAGE_TIMEOUT_S."""
    deadline = time.monotonic() + PAGE_TIMEOUT_S
    state = None
    while time.monotonic() < deadline:
        state = chrome.evaluate(session, PAGE_STATE)
        if done(state):
            return state
        time.sleep(0.2)
    raise AssertionError(f"the page did not reach '{what}' within {PAGE_TIMEOUT_S} s; last state: {state}")


def navigate(chrome, session, url):
    chrome.send("Page.navigate", {"url": url}, session=session)
    deadline = time.monotonic() + PAGE_TIMEOUT_S
    while time.monotonic() < deadline:
        if chrome.evaluate(session, "document.readyState") == "complete" and \
                chrome.evaluate(session, "location.href").startswith(url.split("#")[0]):
            return
        time.sleep(0.1)
    raise AssertionError(f"{url} did not load within {PAGE_TIMEOUT_S} s")


def complete(base, model, n, max_tokens=8):
    for i in range(n):
        body = json.dumps({"model": model, "prompt": f"Tell me about the number {i}", "max_tokens": max_tokens,
                           "temperature": 0}).encode()
        req = urllib.request.Request(base + "/v1/completions", data=body, method="POST",
                                     headers={"Content-Type": "application/json", "Authorization": "Bearer " + API_KEY})
        with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as r:
            check(r.status == 200, f"completion {i} answered")


def test_live_page(chrome, base, doc, screenshot):
    session = chrome.open_page()
    navigate(chrome, session, base + "/#key=" + API_KEY)
    names = sorted(w["name"] for w in doc["workers"])
    first = wait_page(chrome, session, "live with every worker",
                      lambda s: s["status"].startswith("live") and sorted(s["workers"]) == names)
    check(sorted(first["workers"]) == names, f"the page shows every worker by name: {first['workers']}")
    check(not first["keyForm"], "no key form when the key came in the fragment")
    check(first["heatWidth"] > 10, "the heat map is drawn")
    check(chrome.evaluate(session, "location.hash") == "", "the key is taken out of the address bar")

    complete(base, doc.get("model_name", "qwen3-moe-tiny"), 3)
    changed = wait_page(chrome, session, "numbers changed after the requests",
                        lambda s: s["completion"] != first["completion"] and s["requests"] != first["requests"]
                        and s["heat"] != first["heat"])
    check(changed["completion"] != first["completion"],
          f"completion tokens changed: {first['completion']} -> {changed['completion']}")
    check(changed["requests"] != first["requests"],
          f"the workers' layer requests changed: {first['requests']} -> {changed['requests']}")
    check(changed["heat"] != first["heat"], f"the heat map changed: {changed['heat']}")
    time.sleep(1.5)  # one more poll, so the live token rate has two samples for the screenshot
    errors = problems(chrome.events(session))
    check(not errors, f"no console errors, exceptions or failed loads: {errors}")
    if screenshot:
        take_screenshot(chrome, session, base, doc, screenshot)


def take_screenshot(chrome, session, base, doc, path):
    """A PNG of the page while requests run (so that the live rate is not 0), cut to the
    page's content. Nothing is asserted on it."""
    busy = threading.Thread(target=complete, args=(base, doc.get("model_name", "qwen3-moe-tiny"), 6, 48))
    busy.start()
    time.sleep(2.5)
    height = chrome.evaluate(session, "Math.ceil(document.body.getBoundingClientRect().bottom) + 12")
    clip = {"x": 0, "y": 0, "width": 1280, "height": height, "scale": 1}
    png = chrome.send("Page.captureScreenshot", {"format": "png", "clip": clip}, session=session)
    busy.join(timeout=REQUEST_TIMEOUT_S)
    Path(path).write_bytes(base64.b64decode(png["data"]))
    print(f"screenshot: {path}")


def test_key_form(chrome, base):
    session = chrome.open_page()  # a new tab: its sessionStorage holds no key
    navigate(chrome, session, base + "/")
    asked = wait_page(chrome, session, "asking for the key", lambda s: s["keyForm"])
    check("key" in asked["status"].lower(), f"without the key the page asks for it: {asked['status']}")
    check(asked["workers"] == [], "and shows no data")
    chrome.evaluate(session, f"document.getElementById('key-input').value = {json.dumps(API_KEY)};"
                             "document.getElementById('key-form').requestSubmit(); true")
    live = wait_page(chrome, session, "live after typing the key", lambda s: s["status"].startswith("live"))
    check(not live["keyForm"] and len(live["workers"]) == 2, "typing the key into the form makes the page live")
    # The one expected failure: the 401 before the key was given.
    errors = [e for e in problems(chrome.events(session)) if "401" not in e]
    check(not errors, f"nothing else went wrong: {errors}")


def with_budget(topology, doc):
    """Gives worker w1 a RAM budget smaller than its experts, so that the heat map has
    experts on disk and in LRU slots as well as pinned ones."""
    for w in doc["workers"]:
        if w["name"] == "w1":
            w["ram_gb"] = W1_RAM_BYTES / 2**30
    Path(topology).write_text(yaml.safe_dump(doc))


def get_state(base):
    req = urllib.request.Request(base + "/dashboard/state", headers={"Authorization": "Bearer " + API_KEY})
    with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as r:
        return json.loads(r.read())


def test_residency(base):
    """w0 (experts 0-7, no budget) holds all of its experts in RAM; w1 (8-15) at most 4 of
    8 per layer: its others are on disk."""
    layers = get_state(base)["heat"]["layers"]
    check(len(layers) == 3, f"three MoE layers in the heat map: {[l['layer'] for l in layers]}")
    for layer in layers:
        tiers = layer["tiers"]
        check(len(tiers) == 16 and set(tiers[:8]) <= {"P", "L"}, f"layer {layer['layer']}: w0's experts in RAM: {tiers}")
        check(tiers[8:].count("D") >= 4, f"layer {layer['layer']}: w1's budget leaves experts on disk: {tiers}")


def find_chromium(given):
    for name in ([given] if given else []) + ["chromium", "chromium-browser", "google-chrome"]:
        path = shutil.which(name) if name else None
        if path:
            return path
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--charm", required=True)
    ap.add_argument("--config", required=True)
    ap.add_argument("--source-dir", required=True)
    ap.add_argument("--chromium", help="the browser (default: chromium on PATH)")
    ap.add_argument("--screenshot", help="save a PNG of the live page here")
    a = ap.parse_args()

    browser = find_chromium(a.chromium)
    if not browser:
        print("FAIL: headless Chromium not found (apt-get install chromium; scripts/setup.sh installs it)",
              file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="charm-dashboard-") as tmp:
        topology, doc = write_topology(a.charm, a.config, tmp)
        with_budget(topology, doc)
        procs = Processes(tmp)
        chrome = None
        ok = False
        try:
            for w in doc["workers"]:
                procs.start(w["name"], [a.charm, "worker", "--config", str(topology), "--name", w["name"]])
            procs.start("serve", [a.charm, "serve", "--config", str(topology)])
            base = f"http://127.0.0.1:{doc['api']['port']}"
            wait_health(base, procs)
            profile = Path(tmp) / "chromium"
            profile.mkdir()
            chrome = Chromium(browser, profile)
            test_live_page(chrome, base, doc, a.screenshot)
            test_residency(base)
            test_key_form(chrome, base)
            ok = True
        finally:
            if chrome:
                chrome.close()
                if not ok:
                    log = (Path(tmp) / "chromium" / "chromium.log").read_text(errors="replace")
                    print(f"----- chromium log (last 3000 chars) -----\n{log[-3000:]}", file=sys.stderr)
            procs.stop_all()
            if not ok:
                procs.dump_logs()
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
