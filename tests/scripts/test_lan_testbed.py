#!/usr/bin/env python3
"""scripts/lan_relay.py and lan_testbed.py's arithmetic (unittest; ctest `lan_testbed`).
The relay runs as the test bed runs it, a child process on 127.0.0.1, in front of an echo
server on 127.0.0.1: bytes arrive whole and in order, the set delay is added at least
(only lower bounds on time: this machine is shared), and malformed commands and targets
are refused by name."""
import json
import socket
import subprocess
import sys
import threading
import time
import unittest
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO / "tests/integration"))
import lan_testbed as bed  # noqa: E402

RELAY = REPO / "scripts/lan_relay.py"


def echo_server() -> int:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)

    def serve():
        while True:
            conn, _ = srv.accept()
            threading.Thread(target=echo, args=(conn,), daemon=True).start()

    def echo(conn):
        while data := conn.recv(1 << 16):
            conn.sendall(data)
        conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return srv.getsockname()[1]


def recv_exactly(sock, n):
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            break
        out += chunk
    return bytes(out)


class RelayTest(unittest.TestCase):
    def setUp(self):
        self.proc = subprocess.Popen([sys.executable, str(RELAY), f"127.0.0.1:{echo_server()}"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        words = self.proc.stdout.readline().split()
        self.assertEqual(words[0], "listening")
        self.port = int(words[1])

    def tearDown(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=10)

    def command(self, text):
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def test_bytes_arrive_whole_and_in_order(self):
        payload = bytes(range(256)) * 12289  # 3 MiB and change: many recv chunks
        with socket.create_connection(("127.0.0.1", self.port), timeout=30) as c:
            threading.Thread(target=c.sendall, args=(payload,), daemon=True).start()
            self.assertEqual(recv_exactly(c, len(payload)), payload)
        self.assertGreater(self.command("stats")["chunks"], 0)

    def test_delay_is_added_each_way(self):
        self.assertEqual(self.command("delay 10"), {"ok": True})  # one way: a round trip gains >= 20 ms
        with socket.create_connection(("127.0.0.1", self.port), timeout=30) as c:
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for _ in range(3):
                t = time.monotonic()
                c.sendall(b"ping")
                self.assertEqual(recv_exactly(c, 4), b"ping")
                self.assertGreaterEqual(time.monotonic() - t, 0.020)
        stats = self.command("stats")
        self.assertEqual(stats["chunks"], 6)
        self.assertGreaterEqual(stats["added_ms_mean"], 10.0)
        self.assertEqual(self.command("stats")["chunks"], 0)  # stats since the last stats

    def test_malformed_commands_are_refused_by_name(self):
        self.assertEqual(self.command("delay -1"), {"ok": False, "error": "delay '-1': want 0..1000 ms"})
        self.assertEqual(self.command("delay fast")["ok"], False)
        self.assertIn("unknown command 'speed 3'", self.command("speed 3")["error"])
        self.assertEqual(self.command("delay 0"), {"ok": True})  # still serving afterwards


class ArgumentsTest(unittest.TestCase):
    def test_bad_target_is_named(self):
        r = subprocess.run([sys.executable, str(RELAY), "127.0.0.1"], capture_output=True, text=True, timeout=30)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("bad target '127.0.0.1' (want HOST:PORT)", r.stderr)

    def test_bad_bed_arguments_are_named_before_anything_starts(self):
        for argv, message in ((["--streams", "0"], "--streams: every value at least 1"),
                              (["--rtt-ms", "-5"], "--rtt-ms: round-trip times are not negative"),
                              (["--repeat", "0"], "--repeat 0: at least 1"),
                              (["--rate", "0gbit"], "--rate 0gbit: must be positive"),
                              (["--worker-cpu", "-1"], "--worker-cpu -1.0: a number of cores, not negative"),
                              (["--report", "/nonexistent/lan.json"], "no such file")):
            r = subprocess.run([sys.executable, str(REPO / "scripts/lan_testbed.py"), *argv],
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 2, argv)
            self.assertIn(message, r.stderr)

    def test_rates_in_tc_spelling(self):
        self.assertEqual(bed.rate_bits("1gbit"), 1e9)
        self.assertEqual(bed.rate_bits("2.5mbit"), 2.5e6)
        with self.assertRaises(SystemExit):
            bed.rate_bits("1gbps")

    def test_growth_is_read_against_one_worker_at_the_same_rtt_and_streams(self):
        def row(workers, rtt, streams, tok_s):
            return {"workers": workers, "rtt_ms": rtt, "streams": streams, "decode_tok_s": tok_s}
        res = {"rows": [row(1, 0.0, 16, 10.0), row(1, 1.0, 16, 8.0), row(1, 1.0, 1, 2.0),
                        row(2, 1.0, 16, 12.0), row(2, 1.0, 1, 2.0), row(4, 5.0, 16, 9.0), row(2, 0.0, 16, None)]}
        self.assertEqual(bed.versus_one_worker(res, res["rows"][3]), 1.5)
        self.assertEqual(bed.versus_one_worker(res, res["rows"][4]), 1.0)
        self.assertIsNone(bed.versus_one_worker(res, res["rows"][5]))  # no 1-worker row at 5 ms
        self.assertIsNone(bed.versus_one_worker(res, res["rows"][6]))  # that load measured nothing

    def test_experts_split_evenly_by_id(self):
        self.assertEqual(bed.expert_ranges(16, 1), ["0-15"])
        self.assertEqual(bed.expert_ranges(16, 4), ["0-3", "4-7", "8-11", "12-15"])
        self.assertEqual(bed.expert_ranges(16, 3), ["0-4", "5-9", "10-15"])

    def test_moe_layers_skip_dense_ones(self):
        fixtures = REPO / "tests/fixtures/models"
        qwen3 = json.loads((fixtures / "qwen3-moe-tiny/config.json").read_text())
        self.assertEqual(qwen3["mlp_only_layers"], [1])
        self.assertEqual(bed.moe_layers(fixtures / "qwen3-moe-tiny"), qwen3["num_hidden_layers"] - 1)
        glm = json.loads((fixtures / "glm4-moe-tiny/config.json").read_text())
        self.assertEqual(bed.moe_layers(fixtures / "glm4-moe-tiny"),
                         glm["num_hidden_layers"] - glm["first_k_dense_replace"])


if __name__ == "__main__":
    unittest.main()
