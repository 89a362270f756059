"""``hivemesh bench fanout``: events delivered to every node of a 10-process mesh.

Theory of operation
-------------------
Three systems run the same workload, one after the other, each as ``--nodes``
separate processes on 127.0.0.1 driven over JSON lines by this process
(:mod:`hivemesh.bench._fanout_procs`):

* **hivemesh** -- real node processes (:mod:`hivemesh.bench._fanout_node`,
  each a :class:`hivemesh.Node` with its own data dir and SQLite journal),
  all bootstrapped from the first; the run starts once every node replicates
  with every other one. An event is *delivered* when a node's journal has
  verified, stored and applied it.
* **NATS core** -- nats-py clients (:mod:`hivemesh.bench._fanout_nats`) on
  one subject of the real nats-server at 127.0.0.1:4222 (or, if none answers
  there and ``nats-server`` is installed, a private one on a free loopback
  port for the length of the run).
* **py-libp2p gossipsub** -- peers (:mod:`hivemesh.bench._fanout_libp2p`) run
  by the optional venv that ``scripts/bench-env.sh`` creates (py-libp2p is
  trio-only); gossipsub v1.1, 1 s heartbeat, spam protection off.

Phases, per system: a short *warm-up*; *throughput* -- the publishers append
``--events`` as fast as they can (batches of ``--batch``) and the figure is
events / (last arrival at the slowest node - first send), counted exactly
per node as distinct ``(publisher, i)`` pairs, so loss and duplicates show;
*latency* -- the publishers send at ``--rate`` events/s for ``--duration-s``
with the send time in each message, and every receiving node records
arrival - send (one machine, one clock); p50/p99 are over all samples of all
nodes. Every wait has a deadline and a stall limit; every worker is killed
(process group) when its system's run ends, however it ends.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import os
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from hivemesh.bench import BenchResult, Metric
from hivemesh.bench._fanout_procs import Fleet
from hivemesh.errors import BenchWorkerFailed

__all__ = ["DESCRIPTION", "GOAL_EVENTS_PER_S", "add_arguments", "libp2p_python", "run"]

DESCRIPTION = "events/s to all of 10 node processes and p50/p99 at 1,000/s, vs NATS and gossipsub"
#: Issue goal: events/s delivered to every one of the 10 nodes.
GOAL_EVENTS_PER_S = 20_000
#: Issue goal: our p99 latency at most this many times NATS core's.
GOAL_P99_VS_NATS = 2.0
NATS_URL = "nats://127.0.0.1:4222"
BENCH_ENV_SCRIPT = "scripts/bench-env.sh"
_DEFAULT_VENV = Path("~/.cache/hivemesh/bench-libp2p")
_HERE = Path(__file__).resolve().parent


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The workload knobs (defaults: the issue's workload)."""
    a = parser.add_argument
    a("--nodes", type=int, default=10, help="node processes per system (>= 2)")
    a("--publishers", type=int, default=1, help="how many of the nodes publish")
    a("--events", type=int, default=50_000, help="events in the throughput phase")
    a("--batch", type=int, default=256, help="events per append in the throughput phase")
    a("--rate", type=float, default=1000.0, help="events/s offered in the latency phase")
    a("--duration-s", type=float, default=5.0, help="length of the latency phase")
    a("--libp2p-events", type=int, default=2000, help="throughput-phase events for gossipsub")
    a("--timeout-s", type=float, default=120.0, help="deadline of each phase")
    a("--late-joins", type=int, default=5, help="--mode nats: late-join rounds (median)")
    a("--stall-s", type=float, default=15.0, help="give up on a phase after this long idle")
    a("--skip-nats", action="store_true", help="no NATS baseline")
    a("--skip-libp2p", action="store_true", help="no py-libp2p gossipsub baseline")
    a("--libp2p-venv", default=None, help=f"venv with libp2p (default {_DEFAULT_VENV})")
    a(
        "--mode",
        choices=["p2p", "nats"],
        default="p2p",
        help="nats: hivemesh in broker mode beside raw JetStream publish+consume "
        "(throughput and late-join catch-up; hivemesh.bench._fanout_broker)",
    )


def libp2p_python(venv: str | None = None) -> Path | None:
    """The venv interpreter that can run the gossipsub worker, or None."""
    root = Path(venv or os.environ.get("HIVEMESH_BENCH_VENV") or _DEFAULT_VENV).expanduser()
    py = root / "bin" / "python"
    if not py.exists() or not any(root.glob("lib/python3*/site-packages/libp2p/__init__.py")):
        return None
    return py


# -- waiting ---------------------------------------------------------------------


async def _until(
    what: str, check: Callable[[], Awaitable[bool]], timeout_s: float, interval_s: float = 0.1
) -> None:
    """Await ``check()`` (async, truthy when done) with a deadline."""
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached in {timeout_s}s")
        await asyncio.sleep(interval_s)


async def _wait_delivery(
    fleet: Fleet, phase: str, expected: list[int], timeout_s: float, stall_s: float
) -> list[dict[str, Any]]:
    """Poll counts until every node has its expected count, or a stall/deadline."""
    deadline = time.monotonic() + timeout_s
    last_total, last_change = -1, time.monotonic()
    while True:
        reps = await fleet.gather("report", 30.0, phase=phase, samples=False)
        counts = [r["count"] for r in reps]
        if all(c >= e for c, e in zip(counts, expected, strict=True)):
            break
        now = time.monotonic()
        if sum(counts) != last_total:
            last_total, last_change = sum(counts), now
        if now > deadline or now - last_change > stall_s:
            break
        await asyncio.sleep(0.05)
    return await fleet.gather("report", 60.0, phase=phase, samples=True)


def _expected(nodes: int, shares: list[int]) -> list[int]:
    total = sum(shares)
    return [total - (shares[i] if i < len(shares) else 0) for i in range(nodes)]


def _shares(total: int, publishers: int) -> list[int]:
    return [total // publishers + (1 if i < total % publishers else 0) for i in range(publishers)]


def _pct(sorted_vals: list[int], q: float) -> float | None:
    """Percentile ``q`` of microsecond samples, in ms (None without samples: valid JSON)."""
    if not sorted_vals:
        return None
    k = min(len(sorted_vals) - 1, max(0, round(q * (len(sorted_vals) - 1))))
    return sorted_vals[k] / 1000.0


# -- one system ------------------------------------------------------------------


async def _phase_throughput(
    fleet: Fleet, args: argparse.Namespace, n: int, phase: str
) -> dict[str, Any]:
    shares = _shares(n, args.publishers)
    pubs = fleet.workers[: args.publishers]
    sends = await asyncio.gather(
        *(
            w.call("publish", args.timeout_s, n=k, batch=args.batch, phase=phase)
            for w, k in zip(pubs, shares, strict=True)
        )
    )
    expected = _expected(len(fleet.workers), shares)
    reps = await _wait_delivery(fleet, phase, expected, args.timeout_s, args.stall_s)
    t0 = min(s["t0_ns"] for s in sends)
    complete = all(r["count"] >= e for r, e in zip(reps, expected, strict=True))
    last = max(r["last_ns"] for r in reps)
    # events every node holds (the publisher holds its own by definition)
    delivered_all = min(r["count"] + (n - e) for r, e in zip(reps, expected, strict=True))
    elapsed_s = max(1e-9, (last - t0) / 1e9)
    return {
        "events": n,
        "complete": complete,
        "delivered_to_all": delivered_all,
        "lost": sum(max(0, e - r["count"]) for r, e in zip(reps, expected, strict=True)),
        "duplicates": sum(r["duplicates"] for r in reps),
        "seconds": round(elapsed_s, 3),
        "publish_seconds": round((max(s["t1_ns"] for s in sends) - t0) / 1e9, 3),
        "events_per_s": delivered_all / elapsed_s,
    }


async def _phase_paced(
    fleet: Fleet, args: argparse.Namespace, phase: str, rate: float, total: int, stall_s: float
) -> dict[str, Any]:
    """Send ``total`` events at ``rate``/s (split over the publishers); latency and loss."""
    shares = _shares(total, args.publishers)
    pubs = fleet.workers[: args.publishers]
    per_rate = rate / args.publishers
    sends = await asyncio.gather(
        *(
            w.call("pace", total / rate + args.timeout_s, n=k, rate=per_rate, phase=phase)
            for w, k in zip(pubs, shares, strict=True)
        )
    )
    expected = _expected(len(fleet.workers), shares)
    reps = await _wait_delivery(fleet, phase, expected, args.timeout_s, stall_s)
    samples = sorted(s for r in reps for s in r["latency_us"])
    t0 = min(s["t0_ns"] for s in sends)
    last = max(r["last_ns"] for r in reps)
    lost = sum(max(0, e - r["count"]) for r, e in zip(reps, expected, strict=True))
    return {
        "events": total,
        "rate": rate,
        "lost": lost,
        "delivered_fraction": round(1 - lost / max(1, sum(expected)), 4),
        "events_per_s": total / max(1e-9, (last - t0) / 1e9) if not lost else 0.0,
        "samples": len(samples),
        "p50_ms": _pct(samples, 0.50),
        "p99_ms": _pct(samples, 0.99),
        "max_ms": samples[-1] / 1000.0 if samples else None,
    }


#: Offered rates tried, highest first, when a burst loses events.
_ZERO_LOSS_RATES = (2000.0, 1000.0, 500.0, 200.0, 100.0, 50.0, 20.0)


async def _zero_loss_rate(fleet: Fleet, args: argparse.Namespace) -> dict[str, Any]:
    """The highest offered rate (of :data:`_ZERO_LOSS_RATES`) delivered without loss."""
    tried = []
    for rate in _ZERO_LOSS_RATES:
        total = int(min(max(40, rate * 2), 2000))  # about 2 s of traffic, bounded
        await _settle(fleet)
        res = await _phase_paced(fleet, args, f"zl{rate:g}", rate, total, stall_s=5.0)
        tried.append({"rate": rate, "lost": res["lost"]})
        if res["lost"] == 0:
            return {"rate": rate, "events_per_s": res["events_per_s"], "tried": tried}
    return {"rate": 0.0, "events_per_s": 0.0, "tried": tried}


async def _settle(fleet: Fleet, timeout_s: float = 30.0) -> None:
    """Wait (bounded) until the workers are nearly idle, so a backlog left by
    one phase does not run into the next one's figures."""
    window_s, idle_cpu_s = 0.5, 0.05 * len(fleet.workers)
    deadline = time.monotonic() + timeout_s
    prev = sum(r["cpu_s"] for r in await fleet.gather("report", 30.0, phase="", samples=False))
    while time.monotonic() < deadline:
        await asyncio.sleep(window_s)
        now = sum(r["cpu_s"] for r in await fleet.gather("report", 30.0, phase="", samples=False))
        if now - prev < idle_cpu_s:
            return
        prev = now


def _proc_cpu_s(pid: int | None) -> float:
    """CPU seconds used so far by process ``pid`` (0.0 if unknown or gone)."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _find_pid(comm: str) -> int | None:
    """The pid of the one running process named ``comm`` (None if 0 or > 1)."""
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError):
                if (d / "comm").read_text().strip() == comm:
                    found.append(int(d.name))
    return found[0] if len(found) == 1 else None


async def _measure(
    fleet: Fleet, args: argparse.Namespace, events: int, server_pid: int | None = None
) -> dict[str, Any]:
    warm = await _phase_paced(fleet, args, "warm", 100.0, 50, args.stall_s)
    await _settle(fleet)
    before = await fleet.gather("report", 30.0, phase="none", samples=False)
    server_before = _proc_cpu_s(server_pid)
    tp = await _phase_throughput(fleet, args, events, "tp")
    server_cpu = _proc_cpu_s(server_pid) - server_before
    mid = await fleet.gather("report", 30.0, phase="none", samples=False)
    out: dict[str, Any] = {"warmup_lost": warm["lost"], "throughput": tp}
    await _settle(fleet)
    if tp["complete"]:
        out["zero_loss_events_per_s"] = tp["events_per_s"]
    else:
        zl = await _zero_loss_rate(fleet, args)
        out["zero_loss"] = zl
        out["zero_loss_events_per_s"] = zl["events_per_s"]
    total = max(1, int(args.rate * args.duration_s))
    await _settle(fleet)
    lat_before = await fleet.gather("report", 30.0, phase="none", samples=False)
    server_before = _proc_cpu_s(server_pid)
    t_lat = time.monotonic()
    out["latency"] = await _phase_paced(fleet, args, "lat", args.rate, total, args.stall_s)
    after = await fleet.gather("report", 30.0, phase="none", samples=False)
    lat_cpu = _proc_cpu_s(server_pid) - server_before
    lat_cpu += sum(a["cpu_s"] - b["cpu_s"] for a, b in zip(after, lat_before, strict=True))
    out["latency"]["cpu_s"] = round(lat_cpu, 2)
    out["latency"]["cores_busy"] = round(lat_cpu / max(1e-9, time.monotonic() - t_lat), 2)
    tp_cpu = server_cpu + sum(m["cpu_s"] - b["cpu_s"] for m, b in zip(mid, before, strict=True))
    if server_pid is not None:
        out["throughput"]["server_cpu_s"] = round(server_cpu, 2)
    copies = tp["delivered_to_all"] * (len(fleet.workers) - 1)  # each event to every other node
    out["throughput"]["cpu_s"] = round(tp_cpu, 2)
    out["throughput"]["deliveries_per_cpu_s"] = round(copies / max(1e-9, tp_cpu))
    out["cpu_s"] = round(sum(r["cpu_s"] for r in after), 2)
    out["dropped_total"] = sum(r["dropped_total"] for r in after)
    counters: dict[str, int] = {}
    for r in after:
        for k, v in r.get("counters", {}).items():
            counters[k] = counters.get(k, 0) + int(v)
    out["counters"] = dict(sorted(counters.items()))
    return out


def _python_env() -> dict[str, str]:
    env = dict(os.environ)
    src = str(_HERE.parent.parent)
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    for k in list(env):
        if k.startswith("HIVEMESH_") and not k.startswith("HIVEMESH_BENCH_"):
            del env[k]  # the nodes take their settings from the bench, not the caller
    return env


async def _run_hivemesh(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    env = _python_env()
    async with Fleet(tmp) as fleet:
        argv = [sys.executable, "-m", "hivemesh.bench._fanout_node"]
        first = await fleet.spawn(
            "hm0", [*argv, "--index", "0", "--data-dir", str(tmp / "n0")], env=env
        )
        boot = f"{first.hello['address']}@{first.hello['endpoint']}"
        await asyncio.gather(
            *(
                fleet.spawn(
                    f"hm{i}",
                    [
                        *argv,
                        "--index",
                        str(i),
                        "--data-dir",
                        str(tmp / f"n{i}"),
                        "--bootstrap",
                        boot,
                    ],
                    env=env,
                )
                for i in range(1, args.nodes)
            )
        )
        fleet.workers.sort(key=lambda w: int(w.name[2:]))
        want = args.nodes - 1

        async def meshed() -> bool:
            return all(s["peers"] >= want for s in await fleet.gather("status", 10.0))

        await _until("full mesh of hivemesh nodes", meshed, 60.0)
        return await _measure(fleet, args, args.events)


def _port_open(host: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1.0):
        return True
    return False


async def _private_nats(
    tmp: Path, *, jetstream: bool = False
) -> tuple[asyncio.subprocess.Process, str]:
    exe = shutil.which("nats-server")
    if exe is None:
        raise FileNotFoundError("no nats-server answering at 127.0.0.1:4222 and none installed")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = (tmp / "nats-server.log").open("wb")
    js = ["-js", "-sd", str(tmp / "jetstream")] if jetstream else []
    proc = await asyncio.create_subprocess_exec(
        exe, "-a", "127.0.0.1", "-p", str(port), *js, stdout=log, stderr=log,
        start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 10
    while not _port_open("127.0.0.1", port):
        if time.monotonic() > deadline or proc.returncode is not None:
            proc.kill()
            raise TimeoutError("private nats-server did not start")
        await asyncio.sleep(0.05)
    return proc, f"nats://127.0.0.1:{port}"


async def _run_nats(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    server: asyncio.subprocess.Process | None = None
    url = NATS_URL
    if not _port_open("127.0.0.1", 4222):
        server, url = await _private_nats(tmp)
    try:
        async with Fleet(tmp) as fleet:
            argv = [sys.executable, "-m", "hivemesh.bench._fanout_nats", "--url", url]
            env = _python_env()
            await asyncio.gather(
                *(
                    fleet.spawn(f"nats{i}", [*argv, "--index", str(i)], env=env)
                    for i in range(args.nodes)
                )
            )
            fleet.workers.sort(key=lambda w: int(w.name[4:]))
            pid = server.pid if server is not None else _find_pid("nats-server")
            out = await _measure(fleet, args, args.events, server_pid=pid)
            out["server"] = url + (" (private)" if server else "")
            out["server_cpu_counted"] = pid is not None
            return out
    finally:
        if server is not None:
            with contextlib.suppress(ProcessLookupError):
                server.kill()
            await server.wait()


async def _run_libp2p(args: argparse.Namespace, tmp: Path, py: Path) -> dict[str, Any]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    script = str(_HERE / "_fanout_libp2p.py")
    async with Fleet(tmp) as fleet:
        await asyncio.gather(
            *(
                fleet.spawn(
                    f"p2p{i}", [str(py), script, "--index", str(i)], env=env, ready_timeout_s=60
                )
                for i in range(args.nodes)
            )
        )
        fleet.workers.sort(key=lambda w: int(w.name[3:]))
        addrs = [w.hello["maddr"] for w in fleet.workers]
        await asyncio.gather(
            *(w.call("connect", 60.0, addrs=addrs[:i]) for i, w in enumerate(fleet.workers))
        )
        want = min(4, args.nodes - 1)  # gossipsub's degree_low

        async def meshed() -> bool:
            return all(s["mesh"] >= want for s in await fleet.gather("status", 10.0))

        await _until("gossipsub mesh", meshed, 60.0, interval_s=0.25)
        return await _measure(fleet, args, args.libp2p_events)


# -- the benchmark -----------------------------------------------------------------


async def _run(args: argparse.Namespace) -> BenchResult:
    if args.nodes < 2 or not 1 <= args.publishers < args.nodes:
        raise ValueError("need --nodes >= 2 and 1 <= --publishers < --nodes")
    details: dict[str, Any] = {"nodes": args.nodes, "publishers": args.publishers}
    with tempfile.TemporaryDirectory(prefix="hivemesh-fanout-") as d:
        tmp = Path(d)
        (tmp / "hm").mkdir()
        ours = await _run_hivemesh(args, tmp / "hm")
        details["hivemesh"] = ours
        nats: dict[str, Any] | None = None
        if not args.skip_nats:
            (tmp / "nats").mkdir()
            if importlib.util.find_spec("nats") is None:
                nats = {"error": "unavailable: nats-py is not installed (pip install nats-py)"}
            else:
                try:
                    nats = await _run_nats(args, tmp / "nats")
                except (OSError, TimeoutError, BenchWorkerFailed) as exc:
                    nats = {"error": f"failed: {exc}"}
            details["nats"] = nats
        p2p: dict[str, Any] | None = None
        if not args.skip_libp2p:
            py = libp2p_python(args.libp2p_venv)
            if py is None:
                hint = f"create it with: bash {BENCH_ENV_SCRIPT}"
                p2p = {"error": f"unavailable: no py-libp2p venv; {hint}"}
            else:
                (tmp / "p2p").mkdir()
                try:
                    p2p = await _run_libp2p(args, tmp / "p2p", py)
                except (OSError, TimeoutError, BenchWorkerFailed) as exc:
                    p2p = {"error": f"failed: {exc}"}
            details["libp2p"] = p2p
    details["load_average_1m"] = round(os.getloadavg()[0], 2)
    return BenchResult("fanout", _metrics(args, ours, nats, p2p), details)


def _fig(res: dict[str, Any] | None, *path: str) -> float | None:
    cur: Any = res
    for p in path:
        if not isinstance(cur, dict) or p not in cur:
            return None
        cur = cur[p]
    return float(cur) if isinstance(cur, int | float) else None


def _metrics(
    args: argparse.Namespace,
    ours: dict[str, Any],
    nats: dict[str, Any] | None,
    p2p: dict[str, Any] | None,
) -> list[Metric]:
    n = args.nodes
    tp = _fig(ours, "zero_loss_events_per_s") or 0.0
    complete = bool(ours.get("throughput", {}).get("complete"))
    p50 = _fig(ours, "latency", "p50_ms") or float("nan")
    p99 = _fig(ours, "latency", "p99_ms") or float("nan")
    nats_p99 = _fig(nats, "latency", "p99_ms")
    return [
        Metric(
            f"events/s to all {n} nodes",
            tp,
            _fig(nats, "zero_loss_events_per_s"),
            "ev/s",
            "nats core",
            goal=f">= {GOAL_EVENTS_PER_S:,} ev/s, zero loss",
            goal_met=complete and tp >= GOAL_EVENTS_PER_S,
        ),
        Metric(
            f"events/s to all {n} nodes",
            tp,
            _fig(p2p, "zero_loss_events_per_s"),
            "ev/s",
            "py-libp2p gossipsub (zero-loss rate)",
        ),
        Metric(
            "deliveries per CPU-second",
            _fig(ours, "throughput", "deliveries_per_cpu_s") or 0.0,
            _fig(nats, "throughput", "deliveries_per_cpu_s"),
            "1/cpu-s",
            "nats core (clients + server)",
        ),
        Metric(
            f"p50 latency @ {args.rate:,.0f} ev/s",
            p50,
            _fig(nats, "latency", "p50_ms"),
            "ms",
            "nats core",
            higher_is_better=False,
        ),
        Metric(
            f"p99 latency @ {args.rate:,.0f} ev/s",
            p99,
            nats_p99,
            "ms",
            "nats core",
            higher_is_better=False,
            goal=f"<= {GOAL_P99_VS_NATS:g}x nats",
            goal_met=None if nats_p99 is None else p99 <= GOAL_P99_VS_NATS * nats_p99,
        ),
        Metric(
            f"p99 latency @ {args.rate:,.0f} ev/s",
            p99,
            _fig(p2p, "latency", "p99_ms"),
            "ms",
            "py-libp2p gossipsub",
            higher_is_better=False,
        ),
    ]


def run(args: argparse.Namespace) -> BenchResult:
    """Run all three systems (see module docs); ``--mode nats``: broker mode
    beside raw JetStream instead (:mod:`hivemesh.bench._fanout_broker`)."""
    if args.mode == "nats":
        from hivemesh.bench._fanout_broker import run_broker

        return run_broker(args)
    return asyncio.run(_run(args))
