"""Helpers shared by the benchmark scripts (bench_tiers.py, bench_llamacpp.py): logging,
bounded subprocess runs, and a description of the machine for the report."""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
from pathlib import Path


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def sh(cmd: list, timeout: float, **kw) -> subprocess.CompletedProcess:
    """Runs `cmd` (logged), output captured as text; raises TimeoutExpired after `timeout` s."""
    log(" ".join(str(c) for c in cmd))
    return subprocess.run([str(c) for c in cmd], timeout=timeout, text=True, capture_output=True, **kw)


def machine(disk: Path) -> dict:
    """CPU model, logical cores, memory and load now, and the file system holding `disk`."""
    def out(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return ""
    cpu = next((l.split(":", 1)[1].strip() for l in out(["lscpu"]).splitlines() if l.startswith("Model name")), "?")
    return {"cpu": cpu, "cores": os.cpu_count(), "free": out(["free", "-g"]), "df": out(["df", "-h", str(disk)]),
            "loadavg": Path("/proc/loadavg").read_text().split()[:3]}


def comma_choices(ap, value: str, choices, what: str) -> list[str]:
    """`value` split at commas; ap.error (exits) naming the first item not in `choices`."""
    items = value.split(",")
    for item in items:
        if item not in choices:
            ap.error(f"unknown {what} {item!r}; choose from {', '.join(choices)}")
    return items


def fmt_spread(values: list[float], digits: int = 2) -> str:
    """mean±half the spread (max - min), or "-" for no values."""
    if not values:
        return "-"
    m = statistics.mean(values)
    if len(values) == 1:
        return f"{m:.{digits}f}"
    return f"{m:.{digits}f}±{(max(values) - min(values)) / 2:.{digits}f}"
