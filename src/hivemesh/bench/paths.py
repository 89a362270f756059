"""``hivemesh bench paths``: direct QUIC vs TCP+Noise vs relayed, in one run.

Three processes in three hosts of a network-namespace lab
(:mod:`hivemesh.netlab`; veth links through a bridge: loopback-class): a
relay, a server that echoes, and a client that measures, over each path in
turn, the round-trip time of 200-byte frames (ping-pong, p50 and p99) and
the echo throughput of 1 KiB frames (pipelined). Every path carries the
same Noise channel: TCP+Noise is the TCP transport; direct QUIC is
the channel over QUIC; relayed is the channel end to end through the relay's
circuit over QUIC. The goal: relayed within 2x of direct QUIC on p99.
Without root (no namespaces) the three processes run on loopback instead
(said in the details).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import hivemesh
from hivemesh.bench import BenchResult, Metric

DESCRIPTION = "throughput and p99 RTT: direct QUIC vs TCP+Noise vs relayed (namespaces)"
WORKER = [sys.executable, "-m", "hivemesh.bench._paths_worker"]
GOAL_RATIO = 2.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options for this benchmark."""
    parser.add_argument("--rounds", type=int, default=1000, help="ping-pongs per path")
    parser.add_argument("--frames", type=int, default=5000, help="1 KiB frames per path")
    parser.add_argument("--max-s", type=float, default=15.0, help="latency time bound per path")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    src = str(Path(hivemesh.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH", "")) if p)
    return env


def _start(argv: Sequence[str], procs: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(list(argv), env=_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    procs.append(proc)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if b"ready" not in line and b"results" not in line:
        raise RuntimeError(f"bench worker {argv} did not start: {line!r}")
    proc.stdout_first = line  # type: ignore[attr-defined]
    return proc


def _measure(wrap: Any, relay_ip: str, server_ip: str, args: argparse.Namespace) -> dict[str, Any]:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        _start(wrap("c", [*WORKER, "relay"]), procs)
        _start(wrap("b", [*WORKER, "server", "--relay", relay_ip]), procs)
        opts = [
            "--rounds",
            str(args.rounds),
            "--frames",
            str(args.frames),
            "--max-s",
            str(args.max_s),
        ]
        client = wrap("a", [*WORKER, "client", "--relay", relay_ip, "--server", server_ip, *opts])
        out = subprocess.run(client, env=_env(), capture_output=True, timeout=600, check=True)
        return dict(json.loads(out.stdout.splitlines()[-1])["results"])
    finally:
        for proc in procs:
            if proc.stdin is not None:
                try:
                    proc.stdin.write(b"stop\n")
                    proc.stdin.close()
                except BrokenPipeError:
                    pass
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def run(args: argparse.Namespace) -> BenchResult:
    """Run the benchmark."""
    from hivemesh.netlab import Lab, unavailable_reason

    reason = unavailable_reason()
    if reason is None:
        with Lab() as lab:
            hosts = {n: lab.add_host(n) for n in ("a", "b", "c")}
            res = _measure(lambda h, argv: hosts[h].argv(argv), hosts["c"].ip, hosts["b"].ip, args)
        where = "network namespaces (veth + bridge)"
    else:
        res = _measure(lambda h, argv: argv, "127.0.0.1", "127.0.0.1", args)
        where = f"loopback (namespaces unavailable: {reason})"
    q, t, r = res["quic"], res["tcp"], res["relayed"]
    result = BenchResult("paths")
    ratio = r["p99_ms"] / q["p99_ms"]
    result.metrics += [
        Metric(
            "relayed RTT p99",
            r["p99_ms"],
            q["p99_ms"],
            "ms",
            baseline_name="direct QUIC",
            higher_is_better=False,
            goal=f"<= {GOAL_RATIO:.0f}x direct",
            goal_met=ratio <= GOAL_RATIO,
        ),
        Metric(
            "direct QUIC RTT p99",
            q["p99_ms"],
            t["p99_ms"],
            "ms",
            baseline_name="TCP+Noise",
            higher_is_better=False,
        ),
        Metric(
            "direct QUIC throughput",
            q["frames_per_s"],
            t["frames_per_s"],
            "frames/s",
            baseline_name="TCP+Noise",
        ),
        Metric(
            "relayed throughput",
            r["frames_per_s"],
            q["frames_per_s"],
            "frames/s",
            baseline_name="direct QUIC",
        ),
    ]
    result.details.update(
        where=where,
        p50_ms={k: round(v["p50_ms"], 3) for k, v in res.items()},
        p99_ms={k: round(v["p99_ms"], 3) for k, v in res.items()},
        frames_per_s={k: round(v["frames_per_s"]) for k, v in res.items()},
        rounds=args.rounds,
        frames=args.frames,
    )
    return result
