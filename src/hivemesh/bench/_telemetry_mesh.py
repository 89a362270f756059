"""The ``--layout mesh`` run of ``hivemesh bench telemetry``: senders as node processes.

One ``hivemesh up --collector`` process and one ``hivemesh up`` process per
sender, on loopback, joined into one mesh. Each sender's spool
(``telemetry-spool.sqlite3`` in its data dir) is filled before it starts, and
it starts with ``telemetry = false`` (spool only). When every sender has a
channel to the collector and resolves the name ``metrics-collector``, the
clock starts and each sender is told to send (control op ``metrics.send``);
it stops when the collector's store holds every record. So the figure covers
the real path: spool, direct requests with acks over the encrypted mesh
channels, the collector's validation, group commit and reply.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from hivemesh.runtime.swarm import LocalSwarm, NodeProc, wait_until

__all__ = ["mesh_run"]

#: The default (not the test suite's fast) membership timings: 50 nodes probing every
#: 200 ms would measure SWIM, not telemetry, on a 2-core machine.
_ENV = {
    "HIVEMESH_PROBE_INTERVAL_MS": "1000",
    "HIVEMESH_PROBE_TIMEOUT_MS": "500",
    "HIVEMESH_SUSPICION_MULT": "4",
    "HIVEMESH_SYNC_INTERVAL_MS": "1000",
    "HIVEMESH_TELEMETRY": "false",
    "HIVEMESH_TELEMETRY_HEARTBEAT_S": "3600",
    "HIVEMESH_TELEMETRY_TIMEOUT_S": "20",
    "HIVEMESH_TELEMETRY_MAX_BACKOFF_S": "0.2",
}
_HEARTBEAT = "hivemesh.telemetry.spool_backlog"


def _ready(node: NodeProc, collector: str) -> bool:
    c = node.client
    if c.call("names").get("metrics-collector") != collector:
        return False
    return any(p["address"] == collector and p["channel"] for p in c.peers())


def mesh_run(
    tmp: Path, per_sender: list[list[dict[str, Any]]], timeout_s: float = 600.0
) -> tuple[float, int, int]:
    """Run once; return (seconds, collector flushes, rows flushed)."""
    from hivemesh.telemetry.node import SPOOL_FILE
    from hivemesh.telemetry.spool import Spool

    root = tmp / "mesh"
    total = sum(len(r) for r in per_sender)
    with LocalSwarm(root, env=_ENV, start_timeout_s=60.0) as swarm:
        col = swarm.start("collector", extra_args=["--collector"])
        senders = []
        for i, recs in enumerate(per_sender):
            label = f"s{i:03d}"
            (root / label).mkdir(mode=0o700, parents=True)
            sp = Spool(root / label / SPOOL_FILE)
            sp.append_many(recs)
            sp.close()
            senders.append(swarm.start(label, bootstrap=[col.endpoint]))
        for node in senders:

            def ready(n: NodeProc = node) -> bool:
                return _ready(n, col.address)

            wait_until(ready, 60.0, what=f"{node.label} ready")
        sql = f"SELECT count(*) FROM metrics WHERE name <> '{_HEARTBEAT}'"

        def stored() -> int:
            return int(col.client.call("metrics", what="query", sql=sql)["rows"][0][0])

        t0 = time.perf_counter()
        for node in senders:
            node.client.call("metrics.send")
        wait_until(
            lambda: stored() >= total, timeout_s, what="every record stored", interval_s=0.02
        )
        dt = time.perf_counter() - t0
        got = stored()
        if got != total:
            raise RuntimeError(f"stored {got} of {total} records")
        stats = col.client.call("metrics", what="stats")
        return dt, int(stats["flushes"]), int(stats["flushed_rows"])
