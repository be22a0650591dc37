#!/usr/bin/env python3
"""A TCP relay that adds a one-way delay in each direction: a LAN's round-trip time on a
machine whose kernel has no `netem` (scripts/lan_testbed.py runs one in front of each
worker; the coordinator connects to the relay, the relay to the worker).

Bytes keep their order and their timing: each chunk read from one side is written to the
other side `one_way_ms` after it was read (a reader thread stamps it, a writer thread sleeps
until then), so a request/response exchange gains 2 x one_way_ms. The sleeping is
time.sleep (clock_nanosleep), good to about 0.1 ms here: the `stats` command reports the
delay actually added, so a report can show it beside the nominal one.

Runs as a child process (so the load generator's threads do not share its interpreter):

    lan_relay.py TARGET_HOST:PORT [TARGET_HOST:PORT ...]

prints one line "listening PORT PORT ..." (127.0.0.1, one port per target, in order), then
reads commands on stdin, one per line, answering each on stdout with one JSON line:
    delay MS   set the one-way delay of every relay (new and open connections), -> {"ok": true}
    stats      -> {"chunks": N, "added_ms_mean": X, "added_ms_p99": Y} since the last stats
EOF on stdin stops it (and every connection). Only 127.0.0.1 is listened on.
"""
from __future__ import annotations

import collections
import json
import socket
import sys
import threading
import time

CHUNK = 1 << 20  # bytes per recv; a frame of any size passes in pieces


class Delay:
    """The one-way delay in seconds, shared by every pump, and what was actually added."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.lock = threading.Lock()
        self.added: list[float] = []

    def record(self, added_s: float) -> None:
        with self.lock:
            if len(self.added) < 1_000_000:  # bounded: a stats command empties it
                self.added.append(added_s)

    def take_stats(self) -> dict:
        with self.lock:
            added, self.added = sorted(self.added), []
        if not added:
            return {"chunks": 0, "added_ms_mean": None, "added_ms_p99": None}
        return {"chunks": len(added), "added_ms_mean": 1e3 * sum(added) / len(added),
                "added_ms_p99": 1e3 * added[min(len(added) - 1, int(0.99 * len(added)))]}


def pump(src: socket.socket, dst: socket.socket, delay: Delay) -> None:
    """Copies src to dst, each chunk delay.seconds after it was read; half-closes dst at EOF."""
    queue: collections.deque = collections.deque()
    ready = threading.Condition()

    def reader() -> None:
        while True:
            try:
                data = src.recv(CHUNK)
            except OSError:
                data = b""
            with ready:
                queue.append((time.monotonic(), time.monotonic() + delay.seconds, data))
                ready.notify()
            if not data:
                return

    threading.Thread(target=reader, daemon=True).start()
    while True:
        with ready:
            while not queue:
                ready.wait()
            read_at, due, data = queue.popleft()
        wait = due - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        if not data:
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            return
        delay.record(time.monotonic() - read_at)  # before the send: its peer may act on it at once
        try:
            dst.sendall(data)
        except OSError:
            return


def serve(listener: socket.socket, target: tuple[str, int], delay: Delay) -> None:
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        try:
            upstream = socket.create_connection(target, timeout=10)
        except OSError:
            client.close()
            continue
        upstream.settimeout(None)
        for s in (client, upstream):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=pump, args=(client, upstream, delay), daemon=True).start()
        threading.Thread(target=pump, args=(upstream, client, delay), daemon=True).start()


def parse_target(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise SystemExit(f"lan_relay: bad target {text!r} (want HOST:PORT)")
    return host, int(port)


def main(argv: list[str]) -> int:
    if not argv:
        raise SystemExit(__doc__)
    targets = [parse_target(t) for t in argv]
    delay = Delay()
    ports = []
    for target in targets:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        ports.append(listener.getsockname()[1])
        threading.Thread(target=serve, args=(listener, target, delay), daemon=True).start()
    print("listening " + " ".join(map(str, ports)), flush=True)
    for line in sys.stdin:
        words = line.split()
        if len(words) == 2 and words[0] == "delay":
            try:
                ms = float(words[1])
            except ValueError:
                ms = -1.0
            if not 0 <= ms <= 1000:
                print(json.dumps({"ok": False, "error": f"delay {words[1]!r}: want 0..1000 ms"}), flush=True)
                continue
            delay.seconds = ms / 1e3
            print(json.dumps({"ok": True}), flush=True)
        elif words == ["stats"]:
            print(json.dumps(delay.take_stats()), flush=True)
        else:
            print(json.dumps({"ok": False, "error": f"unknown command {line.strip()!r}"}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
