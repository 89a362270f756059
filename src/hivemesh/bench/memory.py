"""``hivemesh bench memory``: resident memory of a node process, beside a bare
interpreter.

Three processes are measured from outside, by their ``VmRSS`` (and peak,
``VmHWM``) in ``/proc/PID/status``, each after it has sat idle for
``--settle-s`` seconds:

* **baseline**: ``python3 -c`` importing only standard-library modules, the
  ones any asyncio node with SQLite and TLS-grade hashing loads (asyncio,
  ssl, hashlib, sqlite3, json, logging, socket, ...), then waiting;
* **idle**: a node as users run it (``python -m hivemesh up`` on loopback),
  joined to one peer, after start-up;
* **loaded**: the same node after ``--writes`` context writes of its own and
  as many replicated from its peer (over the control socket; bounded in
  count and time), once idle again.

Details break the figure down: the RSS of a fresh interpreter after
importing each dependency alone (cryptography, PyNaCl, loro, msgpack,
msgspec; and the optional DuckDB and Arrow where installed, which a plain
node no longer loads), and after importing the daemon's modules, so the
floor under the goal (50 MB) is visible. Only the standard library is
imported here at module level: ``hivemesh bench`` loads every benchmark
module to list them.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hivemesh.bench import BenchResult, Metric

DESCRIPTION = "RSS of an idle and a loaded node process vs a bare interpreter (stdlib only)"

GOAL_MB = 50.0
#: What the baseline interpreter imports: standard library only.
STDLIB = "asyncio, hashlib, json, logging, os, random, secrets, socket, sqlite3, ssl, struct, zlib"
#: Each measured alone in a fresh interpreter (import cost in RSS).
DEPENDENCIES = (
    "cryptography.hazmat.primitives.asymmetric.ed25519",
    "nacl.bindings",
    "loro",
    "msgpack",
    "msgspec",
    "hivemesh.runtime.daemon",
    "duckdb",
    "pyarrow",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options for this benchmark."""
    parser.add_argument("--writes", type=int, default=2_000, help="context writes per node")
    parser.add_argument("--settle-s", type=float, default=3.0, help="idle time before a reading")
    parser.add_argument("--max-load-s", type=float, default=60.0, help="bound on the write phase")


def status_mb(pid: int) -> dict[str, float]:
    """``VmRSS`` and ``VmHWM`` of process ``pid``, in MB (MiB)."""
    out: dict[str, float] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) / 1024
    return out


def _import_rss(module: str) -> float | None:
    """RSS (MB) of a fresh interpreter that imported ``module`` (None if missing)."""
    code = (
        "import sys\n"
        f"import {module}\n"
        "for line in open('/proc/self/status'):\n"
        "    if line.startswith('VmRSS'): print(int(line.split()[1]) / 1024)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    return float(done.stdout) if done.returncode == 0 and done.stdout.strip() else None


def _baseline(settle_s: float) -> dict[str, float]:
    code = f"import {STDLIB}, sys, time\nprint('ready', flush=True)\ntime.sleep(600)\n"
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL
    )
    try:
        assert proc.stdout is not None
        proc.stdout.readline()
        time.sleep(settle_s)
        return status_mb(proc.pid)
    finally:
        proc.kill()
        proc.wait(10)


def run(args: argparse.Namespace) -> BenchResult:
    """Run the benchmark."""
    from hivemesh.client.swarm import LocalSwarm, wait_until

    base = _baseline(args.settle_s)
    bare = _import_rss("sys")
    with tempfile.TemporaryDirectory(prefix="hm-bench-memory-") as root, LocalSwarm(root) as swarm:
        a = swarm.start("a")
        b = swarm.start("b", bootstrap=[a.endpoint])
        wait_until(lambda: b.address in a.client.status()["members"], 15, what="a and b joined")
        assert a.proc is not None
        time.sleep(args.settle_s)
        idle = status_mb(a.proc.pid)
        deadline = time.monotonic() + args.max_load_s
        written = 0
        ca, cb = a.client, b.client
        for i in range(args.writes):
            if time.monotonic() > deadline:
                break
            ca.ctx_set("bench", f"a{i % 500}", {"i": i, "pad": "x" * 64})
            cb.ctx_set("bench", f"b{i % 500}", {"i": i, "pad": "y" * 64})
            written += 1
        total = 2 * written + 0  # a's own and b's, each one event
        wait_until(
            lambda: a.client.status()["journal"]["events"] >= total, 30, what="a holds b's writes"
        )
        time.sleep(args.settle_s)
        loaded = status_mb(a.proc.pid)
        events = a.client.status()["journal"]["events"]
    deps = {m: _import_rss(m) for m in DEPENDENCIES}
    return BenchResult(
        "memory",
        [
            Metric(
                "idle node RSS",
                idle["VmRSS"],
                base["VmRSS"],
                "MB",
                "stdlib-only interpreter",
                higher_is_better=False,
                goal=f"<= {GOAL_MB:g} MB",
                goal_met=idle["VmRSS"] <= GOAL_MB,
            ),
            Metric(
                "loaded node RSS",
                loaded["VmRSS"],
                base["VmRSS"],
                "MB",
                "stdlib-only interpreter",
                higher_is_better=False,
            ),
            Metric("loaded node peak RSS", loaded["VmHWM"], None, "MB", higher_is_better=False),
        ],
        {
            "node": "python -m hivemesh up (loopback, one peer)",
            "baseline_imports": STDLIB,
            "bare_interpreter_mb": bare,
            "writes": {"own": written, "replicated": written, "journal_events": events},
            "import_rss_mb": deps,
            "pid_note": f"measured from /proc/PID/status on {os.uname().sysname}",
            "data_dirs": str(Path(tempfile.gettempdir())),
        },
    )
