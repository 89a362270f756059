"""``hivemesh bench fanout --mode nats``: broker mode beside raw JetStream, same run.

Two systems on the same nats-server (127.0.0.1:4222 with JetStream, else a
private ``nats-server -js`` on a free port), one after the other, each as
``--nodes`` processes driven by this one (:mod:`hivemesh.bench._fanout_procs`):

* **hivemesh in broker mode** -- node processes
  (:mod:`hivemesh.bench._fanout_node` with ``--mesh nats://…?swarm=<fresh>``):
  the publisher appends events in batches of ``--batch``; each node gets
  them from the swarm's stream and verifies, stores and applies them (an
  event is *delivered* when its journal applied it);
* **raw JetStream** -- nats-py processes (:mod:`hivemesh.bench._fanout_js`):
  one JetStream message per event on a fresh stream, published with acks
  (256 in flight), read by an ordered push consumer per process.

Phases: *throughput* -- ``--events`` events from one publisher, the figure is
events / (last arrival at the slowest node - first send); *late join* -- once
both throughput phases are over (their processes stopped, both streams kept),
``--late-joins`` rounds each start one new process of each system in turn
(ours, then raw) that reads everything from its stream: events / (its last
arrival - its process start, imports excluded: the clock starts when its
module is loaded). The figure is the median of each system's rounds, and
every round's pair is in the details (``late_join_rounds``): single runs on
a shared machine vary by half either way, and alternating the two systems
exposes both to the same moments of load. Ours arrives when every event
is applied to the views *and* committed to the node's store (the first
commit that leaves nothing pending after the last event; ``last_event_s``
is the views' moment alone); the raw consumer stores nothing. The raw late joiner replays
the same number of messages of the same size, one event per message; ours
reads the same events as signed batches (that is the point: one signature
and one stream message cover many events). Goals (issue 17): throughput at
least 0.5x raw JetStream; late-join catch-up at least 2x its replay.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from hivemesh.bench import BenchResult, Metric
from hivemesh.bench._fanout_procs import Fleet

__all__ = ["GOAL_CATCHUP_VS_REPLAY", "GOAL_THROUGHPUT_VS_JS", "run_broker"]

GOAL_THROUGHPUT_VS_JS = 0.5
GOAL_CATCHUP_VS_REPLAY = 2.0


async def _late_join(tmp: Path, name: str, argv: list[str], env: dict[str, str], n: int,
                     args: argparse.Namespace) -> dict[str, Any]:  # fmt: skip
    """Start one process that reads the whole stream; its catch-up rate."""
    from hivemesh.bench.fanout import _until

    tmp.mkdir(parents=True, exist_ok=True)
    async with Fleet(tmp) as fleet:
        worker = await fleet.spawn(name, argv, env=env)
        start_ns = int(worker.hello["start_ns"])
        rep: dict[str, Any] = {}

        async def caught_up() -> bool:
            nonlocal rep
            # polled every 20 ms: without the node's status (counters), which
            # would charge the bench's own polling to the node being measured
            rep = await worker.call("report", 30.0, phase="tp", samples=False, status=False)
            # ours: every event applied *and* committed to the store (the raw
            # consumer stores nothing: its last arrival)
            durable = int(rep.get("durable_ns", 0)) >= int(rep["last_ns"]) and not rep.get(
                "pending"
            )
            return int(rep["count"]) >= n and (durable or "durable_ns" not in rep)

        await _until(f"{name} catches up", caught_up, args.timeout_s, 0.02)
        final = await worker.call("report", 30.0, phase="tp", samples=False)
        done_ns = max(int(rep["last_ns"]), int(rep.get("durable_ns", 0)))
        seconds = max(1e-9, (done_ns - start_ns) / 1e9)
        # CPU seconds the process spent from its clock's start to the last report:
        # load-independent beside the wall-clock rate (the box is shared).
        cpu0 = float(worker.hello.get("start_cpu_s", 0.0))
        cpu_s = float(rep["cpu_s"]) - cpu0
        ready = worker.hello.get("pid_cpu_s")  # CPU spent starting (ours: the node is up)
        return {
            "events": n,
            "seconds": round(seconds, 3),
            "events_per_s": n / seconds,
            "cpu_s": round(cpu_s, 3),
            "first_event_s": round((int(rep["first_ns"]) - start_ns) / 1e9, 3),
            "last_event_s": round((int(rep["last_ns"]) - start_ns) / 1e9, 3),
            "start_cpu_s": None if ready is None else round(float(ready) - cpu0, 3),
            "counters": final.get("counters", {}),
        }


async def _hivemesh(args: argparse.Namespace, tmp: Path, mesh: str) -> dict[str, Any]:
    """The throughput phase of broker mode on the swarm of ``mesh`` (kept)."""
    from hivemesh.bench.fanout import _phase_throughput, _python_env, _until

    env = _python_env()
    argv = [sys.executable, "-m", "hivemesh.bench._fanout_node", "--mesh", mesh]
    async with Fleet(tmp) as fleet:
        await asyncio.gather(
            *(
                fleet.spawn(
                    f"hm{i}", [*argv, "--index", str(i), "--data-dir", str(tmp / f"n{i}")], env=env
                )
                for i in range(args.nodes)
            )
        )
        fleet.workers.sort(key=lambda w: int(w.name[2:]))
        want = args.nodes - 1

        async def linked() -> bool:
            return all(s["links"] >= want for s in await fleet.gather("status", 10.0))

        await _until("every broker-mode node linked to every other", linked, 60.0)
        tp = await _phase_throughput(fleet, args, args.events, "tp")
        return {"swarm": mesh, "throughput": tp}


async def _drop_swarm(url: str, swarm: str) -> None:
    """Delete the bench swarm's streams: a file stream reserves its max_bytes
    (1 GiB by default) on the server, so swarms left behind fill it."""
    import nats

    nc = await nats.connect(url, connect_timeout=5)
    try:
        js = nc.jetstream(timeout=10.0)
        for name in (f"HM_{swarm}", f"HM_{swarm}_TEL", f"KV_hm_{swarm}_leases"):
            with contextlib.suppress(nats.js.errors.NotFoundError):
                await js.delete_stream(name)
    finally:
        await nc.close()


async def _add_stream(url: str, stream: str) -> None:
    import nats
    from nats.js.api import StorageType, StreamConfig

    nc = await nats.connect(url, connect_timeout=5)
    try:
        js = nc.jetstream(timeout=10.0)
        await js.add_stream(
            StreamConfig(name=stream, subjects=[f"{stream}.events"], storage=StorageType.FILE)
        )
    finally:
        await nc.close()


async def _drop_stream(url: str, stream: str) -> None:
    import nats

    nc = await nats.connect(url, connect_timeout=5)
    try:
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await nc.jetstream(timeout=10.0).delete_stream(stream)
    finally:
        await nc.close()


def _js_argv(url: str, stream: str) -> list[str]:
    return [sys.executable, "-m", "hivemesh.bench._fanout_js", "--url", url, "--stream", stream]


async def _raw(args: argparse.Namespace, tmp: Path, url: str, stream: str) -> dict[str, Any]:
    """The throughput phase of raw JetStream on ``stream`` (kept)."""
    from hivemesh.bench.fanout import _phase_throughput, _python_env, _until

    env = _python_env()
    argv = _js_argv(url, stream)
    async with Fleet(tmp) as fleet:
        await asyncio.gather(
            *(fleet.spawn(f"js{i}", [*argv, "--index", str(i)], env=env)
              for i in range(args.nodes))
        )  # fmt: skip
        fleet.workers.sort(key=lambda w: int(w.name[2:]))

        async def connected() -> bool:
            return all(s["connected"] for s in await fleet.gather("status", 10.0))

        await _until("raw JetStream clients connected", connected, 30.0)
        tp = await _phase_throughput(fleet, args, args.events, "tp")
        return {"stream": stream, "throughput": tp}


async def _late_joins(
    args: argparse.Namespace, tmp: Path, mesh: str, url: str, stream: str
) -> list[dict[str, Any]]:
    """``--late-joins`` rounds of one late joiner of each system, in turn."""
    from hivemesh.bench.fanout import _python_env

    env = _python_env()
    ours_argv = [sys.executable, "-m", "hivemesh.bench._fanout_node", "--mesh", mesh]
    raw_argv = [*_js_argv(url, stream), "--replay"]
    rounds = []
    for i in range(max(1, args.late_joins)):
        where = tmp / f"late{i}"
        argv = [*ours_argv, "--index", str(args.nodes), "--data-dir", str(where / "node")]
        ours = await _late_join(where / "hm", "late", argv, env, args.events, args)
        argv = [*raw_argv, "--index", str(args.nodes)]
        raw = await _late_join(where / "js", "jslate", argv, env, args.events, args)
        ratio = ours["events_per_s"] / max(1e-9, raw["events_per_s"])
        rounds.append({"hivemesh": ours, "jetstream": raw, "ratio": round(ratio, 3)})
    return rounds


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median rate (the lower middle one of an even count)."""
    ranked = sorted(runs, key=lambda r: float(r["events_per_s"]))
    return ranked[(len(ranked) - 1) // 2]


async def _run(args: argparse.Namespace) -> BenchResult:
    import tempfile

    from hivemesh.bench.fanout import NATS_URL, _port_open, _private_nats

    if args.nodes < 2:
        raise ValueError("need --nodes >= 2")
    args.publishers = 1
    details: dict[str, Any] = {"mode": "nats", "nodes": args.nodes, "events": args.events,
                               "batch": args.batch}  # fmt: skip
    server = None
    with tempfile.TemporaryDirectory(prefix="hivemesh-fanout-broker-") as d:
        tmp = Path(d)
        url = NATS_URL
        try:
            if not _port_open("127.0.0.1", 4222):
                server, url = await _private_nats(tmp, jetstream=True)
            (tmp / "hm").mkdir()
            (tmp / "js").mkdir()
            swarm = f"bench{uuid.uuid4().hex[:10]}"
            stream = f"HMBENCH_{uuid.uuid4().hex[:10]}"
            mesh = f"{url}?swarm={swarm}"
            await _add_stream(url, stream)
            try:
                ours = await _hivemesh(args, tmp / "hm", mesh)
                raw = await _raw(args, tmp / "js", url, stream)
                rounds = await _late_joins(args, tmp, mesh, url, stream)
            finally:
                with contextlib.suppress(Exception):
                    await _drop_swarm(url, swarm)
                with contextlib.suppress(Exception):
                    await _drop_stream(url, stream)
        finally:
            if server is not None:
                with contextlib.suppress(ProcessLookupError):
                    server.kill()
                await server.wait()
    ours["late_join"] = _median_run([r["hivemesh"] for r in rounds])
    raw["late_join"] = _median_run([r["jetstream"] for r in rounds])
    details["hivemesh"] = ours
    details["jetstream"] = raw
    details["late_join_rounds"] = [
        {"ratio": r["ratio"], **{
            f"{who}_{k}": round(r[system][k], 3) if k != "events_per_s" else round(r[system][k])
            for who, system in (("ours", "hivemesh"), ("raw", "jetstream"))
            for k in ("events_per_s", "cpu_s", "first_event_s")
        }}
        for r in rounds
    ]  # fmt: skip
    details["server"] = url + (" (private)" if server is not None else "")
    details["load_average_1m"] = round(os.getloadavg()[0], 2)
    tp = Metric(
        "throughput to all nodes",
        ours["throughput"]["events_per_s"],
        raw["throughput"]["events_per_s"],
        "events/s",
        "raw JetStream pub+consume",
    )
    tp.goal = f">= {GOAL_THROUGHPUT_VS_JS}x raw JetStream"
    tp.goal_met = bool(ours["throughput"]["complete"]) and (tp.ratio or 0) >= GOAL_THROUGHPUT_VS_JS
    lj = Metric("late-join catch-up", ours["late_join"]["events_per_s"],
                raw["late_join"]["events_per_s"], "events/s",
                f"raw JetStream replay (medians of {len(rounds)} rounds)")  # fmt: skip
    lj.goal = f">= {GOAL_CATCHUP_VS_REPLAY}x raw JetStream replay"
    lj.goal_met = (lj.ratio or 0) >= GOAL_CATCHUP_VS_REPLAY
    return BenchResult("fanout", [tp, lj], details)


def run_broker(args: argparse.Namespace) -> BenchResult:
    """Run both systems (module docs)."""
    started = time.monotonic()
    result = asyncio.run(_run(args))
    result.details["wall_s"] = round(time.monotonic() - started, 1)
    return result
