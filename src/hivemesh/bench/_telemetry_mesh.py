"""The ``--layout mesh`` run of ``hivemesh bench telemetry``: sender nodes over the real mesh.

One ``hivemesh up --collector`` process and one real node per sender, on
loopback, joined into one mesh. Every sender node has its own data dir:
identity key, journal, telemetry spool (``telemetry-spool.sqlite3``, filled
before it starts), listening socket and Noise channel to the collector. With
``per_process = 1`` each sender is its own ``hivemesh up`` process; with
``per_process = k`` the sender nodes are hosted ``k`` to an OS process
(:mod:`hivemesh.bench._telemetry_host`: same daemons, one interpreter), so
that 50 nodes on a 2-core machine are not 50 interpreters competing for it.

Senders start with ``telemetry = false`` (spool only). When every sender has
a channel to the collector and resolves ``metrics-collector``, the clock
starts and each sender is told to send (control op ``metrics.send``); it
stops when the collector's store holds every record (checked with SQL). The
figure covers the whole delivery path: spool read and columnar encoding,
acknowledged direct requests over the encrypted channels, the collector's
decoding, validation, de-duplication, group commit into DuckDB and reply, the
sender's spool delete. CPU seconds of the collector and of the sender
processes over the same interval are reported too (``/proc``), since the
wall-clock figure on a shared machine moves with other load.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hivemesh.client.swarm import LocalSwarm, NodeProc, die_with_parent, wait_until
from hivemesh.errors import DeadlineExceeded

__all__ = ["MeshRun", "mesh_run"]

#: The default (not the test suite's fast) membership and connection timings: 50 nodes
#: probing every 200 ms, or re-checking each of their ~50 links every 100 ms, would measure
#: SWIM and the dialler, not telemetry, on a 2-core machine.
_ENV = {
    "HIVEMESH_RECONNECT_MIN_S": "0.2",
    "HIVEMESH_RECONNECT_MAX_S": "10",
    "HIVEMESH_DIAL_TIMEOUT_S": "5",
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
_CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class MeshRun:
    """One measured run."""

    seconds: float
    flushes: int
    flushed_rows: int
    collector_cpu_s: float
    senders_cpu_s: float
    sender_processes: int
    #: CPU share (cores) of the sender processes idling just before the run
    senders_idle_cores: float


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process (``/proc/<pid>/stat``)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def _ready(node: NodeProc, collector: str) -> bool:
    c = node.client
    if c.call("names").get("metrics-collector") != collector:
        return False
    return any(p["address"] == collector and p["channel"] for p in c.peers())


class _Hosts:
    """Sender nodes hosted ``per_process`` to an OS process."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, dirs: list[Path], bootstrap: str, timeout_s: float) -> list[NodeProc]:
        cmd = [sys.executable, "-m", "hivemesh.bench._telemetry_host", "--bootstrap", bootstrap]
        log = open(dirs[0].parent / f"host-{len(self.procs)}.log", "ab")  # noqa: SIM115
        try:
            proc = subprocess.Popen(
                [*cmd, *map(str, dirs)],
                stdout=subprocess.PIPE,
                stderr=log,
                stdin=subprocess.DEVNULL,
                env=self.env,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        finally:
            log.close()
        self.procs.append(proc)
        assert proc.stdout is not None
        nodes: list[NodeProc] = []
        buf = b""
        deadline = time.monotonic() + timeout_s
        while len(nodes) < len(dirs):
            left = deadline - time.monotonic()
            if left <= 0 or proc.poll() is not None:
                raise DeadlineExceeded(f"sender host did not start {len(dirs)} nodes")
            if select.select([proc.stdout], [], [], left)[0]:
                chunk = os.read(proc.stdout.fileno(), 65536)
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    doc = json.loads(line)
                    node = NodeProc(Path(doc["data_dir"]).name, Path(doc["data_dir"]))
                    node.address = doc["address"]
                    node.proc = proc
                    nodes.append(node)
        return nodes

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
            if p.stdout is not None:
                p.stdout.close()


def mesh_run(
    tmp: Path,
    per_sender: list[list[dict[str, Any]]],
    *,
    per_process: int = 1,
    timeout_s: float = 600.0,
) -> MeshRun:
    """Run once (see module docs)."""
    from hivemesh.telemetry.node import SPOOL_FILE
    from hivemesh.telemetry.spool import Spool

    root = tmp / "mesh"
    total = sum(len(r) for r in per_sender)
    hosts: _Hosts | None = None
    with LocalSwarm(root, env=_ENV, start_timeout_s=60.0) as swarm:
        try:
            col = swarm.start("collector", extra_args=["--collector"])
            dirs = []
            for i, recs in enumerate(per_sender):
                d = root / f"s{i:03d}"
                d.mkdir(mode=0o700, parents=True)
                sp = Spool(d / SPOOL_FILE)
                sp.append_many(recs)
                sp.close()
                dirs.append(d)
            senders: list[NodeProc] = []
            if per_process <= 1:
                senders = [swarm.start(d.name, bootstrap=[col.endpoint]) for d in dirs]
            else:
                hosts = _Hosts(swarm.env)
                for k in range(0, len(dirs), per_process):
                    senders += hosts.start(dirs[k : k + per_process], col.endpoint, 120.0)
            for node in senders:

                def ready(n: NodeProc = node) -> bool:
                    return _ready(n, col.address)

                wait_until(ready, 60.0, what=f"{node.label} ready")
            return _measure(col, senders, total, timeout_s)
        finally:
            if hosts is not None:
                hosts.close()


def _measure(col: NodeProc, senders: list[NodeProc], total: int, timeout_s: float) -> MeshRun:
    sql = f"SELECT count(*) FROM metrics WHERE name <> '{_HEARTBEAT}'"

    def stored() -> int:
        return int(col.client.call("metrics", what="query", sql=sql)["rows"][0][0])

    def flushed() -> int:  # cheap: a counter, no DuckDB query (which would queue behind flushes)
        return int(col.client.call("metrics", what="stats")["flushed_rows"])

    assert col.proc is not None
    pids = sorted({n.proc.pid for n in senders if n.proc is not None})
    i0, t_idle = sum(_cpu_s(p) for p in pids), time.perf_counter()
    time.sleep(2.0)
    idle = (sum(_cpu_s(p) for p in pids) - i0) / (time.perf_counter() - t_idle)
    c0 = _cpu_s(col.proc.pid)
    s0 = sum(_cpu_s(p) for p in pids)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:  # start them together, not one by one
        list(pool.map(lambda n: n.client.call("metrics.send"), senders))
    # Every record plus each sender's one heartbeat (recorded when it starts sending),
    # then confirmed by SQL outside the timed part; or, should a heartbeat be missing,
    # every record by SQL, asked at most every 0.5 s (a query waits behind flushes).
    deadline = t0 + timeout_s
    asked = 0.0
    while True:
        n = flushed()
        t1, c1, s1 = time.perf_counter(), _cpu_s(col.proc.pid), sum(_cpu_s(p) for p in pids)
        if n >= total + len(senders) and stored() >= total:
            break
        if n >= total and t1 - asked > 0.5:
            asked = t1
            if stored() >= total:
                break
        if t1 > deadline:
            raise DeadlineExceeded(f"{stored()} of {total} records stored in {timeout_s}s")
        time.sleep(0.01)
    dt = t1 - t0
    got = int(col.client.call("metrics", what="query", sql=sql)["rows"][0][0])
    if got != total:
        raise RuntimeError(f"stored {got} of {total} records")
    stats = col.client.call("metrics", what="stats")
    return MeshRun(
        seconds=dt,
        flushes=int(stats["flushes"]),
        flushed_rows=int(stats["flushed_rows"]),
        collector_cpu_s=c1 - c0,
        senders_cpu_s=s1 - s0,
        sender_processes=len(pids),
        senders_idle_cores=idle,
    )
