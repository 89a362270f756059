"""One hivemesh node process for ``bench fanout`` (run with ``python -m``).

The worker runs :class:`hivemesh.Node` -- the same daemon as ``hivemesh
up`` -- on its own asyncio loop, with its own data dir, listening on
127.0.0.1. A journal view for the benchmark's event kind records each event
the moment the journal applies it (verified and stored), which is what
"delivered" means here; events this node authored itself are not counted.

Ops (JSON lines, see :mod:`hivemesh.bench._fanout_wire`): ``status``,
``publish`` (a burst of ``n`` events appended in batches of ``batch``, each
batch one signed append that is flushed to the peers' send queues before the
next), ``pace`` (one append per due tick at ``rate`` events/s), ``report``.

Diagnosis switches (environment, passed through by the bench; never set by
it): ``HIVEMESH_BENCH_PROFILE=DIR`` writes a CPU-time cProfile per node to
``DIR/node<i>.prof``; ``HIVEMESH_BENCH_SLOW_MS=N`` logs every event-loop
step that blocks longer than N ms; ``HIVEMESH_BENCH_LOG_DIR=DIR`` sends the
node's log there; ``HIVEMESH_BENCH_SQLITE_PRAGMA="name=value"`` runs one
PRAGMA on the node's store (``wal_autocheckpoint=0`` shows what WAL
checkpoints cost the latency tail). Figures to publish use none of them.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import resource
import sys
import time
from typing import Any

from hivemesh.bench._fanout_wire import Receipts, body, burst, paced, serve_stdio
from hivemesh.core.event import Event
from hivemesh.node import Node
from hivemesh.runtime.daemon import now_ms

KIND = "bench.fanout"
if "--mesh" in sys.argv:
    # Broker mode: load the NATS client before the clock starts, as the raw
    # JetStream worker does, and what the daemon's start imports lazily
    # (imports are excluded for both).
    import hivemesh.mesh.nats_engine
    import hivemesh.runtime.broker
    import hivemesh.runtime.control
    import hivemesh.stores.sqlite
    import hivemesh.telemetry.app
    import hivemesh.telemetry.columnar  # noqa: F401  (the telemetry sender's first batch)
START_NS = time.time_ns()  # a late joiner's catch-up counts from here (imports excluded)
_RU = resource.getrusage(resource.RUSAGE_SELF)
START_CPU_S = _RU.ru_utime + _RU.ru_stime  # and its CPU time


class _ReceiptView:
    """A journal view that hands every benchmark event to :class:`Receipts`."""

    kinds = frozenset({KIND})

    def __init__(self, receipts: Receipts) -> None:
        self.receipts = receipts

    def apply(self, event: Event) -> None:
        self.receipts.record(event.body)


class _Commits:
    """When the node's store last committed everything it held (bench only:
    a late joiner has caught up once its events are in views *and* durable)."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.durable_ns = 0
        self._sync = store.sync
        store.sync = self.sync  # the daemon's group commit and the broker reader call it

    def sync(self) -> None:
        self._sync()
        if not self.store.pending:
            self.durable_ns = time.time_ns()


def _cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


async def _main(args: argparse.Namespace) -> None:
    me: int = args.index
    receipts = Receipts(me)
    # Daemon defaults, except quick re-dials so the mesh forms fast at start,
    # and open trust (a loopback bench mesh; nodes are private by default).
    settings: dict[str, Any] = {
        "trust_mode": "open",
        "reconnect_min_s": 0.05,
        "reconnect_max_s": 0.5,
        "sync_interval_ms": args.sync_interval_ms,
    }
    if args.mesh:  # broker mode (bench fanout --mode nats)
        settings["mesh"] = args.mesh
    bootstrap = [args.bootstrap] if args.bootstrap else []
    slow_ms = os.environ.get("HIVEMESH_BENCH_SLOW_MS")
    if slow_ms:  # diagnosis: log every loop step that blocks longer than this
        loop = asyncio.get_running_loop()
        loop.set_debug(True)
        loop.slow_callback_duration = float(slow_ms) / 1000
    async with Node(args.data_dir, bootstrap=bootstrap, **settings) as node:
        daemon = node.daemon
        node.add_view(_ReceiptView(receipts))  # fresh data dir: nothing to replay
        commits = _Commits(daemon._store)
        pragma = os.environ.get("HIVEMESH_BENCH_SQLITE_PRAGMA")
        if pragma:  # diagnosis only: e.g. "wal_autocheckpoint=0" to see checkpoint stalls
            daemon.node.journal.store.db.execute(f"PRAGMA {pragma}")  # type: ignore[attr-defined]

        async def status(req: dict[str, Any]) -> dict[str, Any]:
            return {"peers": len(daemon.node.peers), "links": len(daemon.conns.links)}

        async def send(phase: str, first: int, stop: int, t: int) -> None:
            items = [(KIND, body(me, phase, j, t)) for j in range(first, stop)]
            daemon.node.append_many(items, now_ms())  # one signed append
            await daemon.flush()  # into the peers' channels now

        async def publish(req: dict[str, Any]) -> dict[str, Any]:
            return await burst(req, send, asyncio.sleep)

        async def pace(req: dict[str, Any]) -> dict[str, Any]:
            return await paced(req, send, asyncio.sleep, asyncio.get_running_loop().time)

        async def report(req: dict[str, Any]) -> dict[str, Any]:
            if req.get("status") is False:  # a cheap poll: receipts only
                return {
                    **receipts.report(str(req["phase"]), samples=bool(req.get("samples", True))),
                    "cpu_s": _cpu_s(),
                    "pending": commits.store.pending,
                    "durable_ns": commits.durable_ns,
                }
            st = daemon.status()
            counters = {
                k: v
                for k, v in st["counters"].items()
                if k.startswith(("dropped", "duplicate", "events_", "gap", "pull", "send_"))
            }
            return {
                **receipts.report(str(req["phase"]), samples=bool(req.get("samples", True))),
                "cpu_s": _cpu_s(),
                "dropped_total": st["dropped_total"],
                "counters": counters,
            }

        await serve_stdio(
            {"status": status, "publish": publish, "pace": pace, "report": report},
            {
                "address": node.address,
                "endpoint": node.endpoint,
                "pid_cpu_s": _cpu_s(),
                "start_ns": START_NS,
                "start_cpu_s": START_CPU_S,
            },
        )


def main() -> None:
    """Parse the worker's arguments and serve until told to stop."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--index", type=int, required=True)
    p.add_argument("--data-dir", required=True)
    p.add_argument("--bootstrap", default="")
    p.add_argument("--sync-interval-ms", type=int, default=1000)
    p.add_argument("--mesh", default="", help="broker mode: the --mesh URL")
    args = p.parse_args()
    log_dir = os.environ.get("HIVEMESH_BENCH_LOG_DIR")
    logging.basicConfig(
        level=logging.WARNING,
        filename=os.path.join(log_dir, f"node{args.index}.log") if log_dir else None,
    )
    prof_dir = os.environ.get("HIVEMESH_BENCH_PROFILE")
    if not prof_dir:
        asyncio.run(_main(args))
        return
    import cProfile  # profiling the node under load: where does a delivered event's time go?

    prof = cProfile.Profile(time.process_time)  # CPU, not wall: the box is shared
    prof.enable()
    try:
        asyncio.run(_main(args))
    finally:
        prof.disable()
        prof.dump_stats(os.path.join(prof_dir, f"node{args.index}.prof"))


if __name__ == "__main__":
    main()
