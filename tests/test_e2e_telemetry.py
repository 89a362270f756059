"""Fleet telemetry over the real mesh: faults with real node processes.

Every node is a ``python -m hivemesh up`` process on 127.0.0.1. Senders record
through their control socket (``metrics.record``); the records travel as
acknowledged direct requests to the node named ``metrics-collector``
(``hivemesh up --collector``), whose DuckDB store we query through its control
socket and the ``hivemesh metrics ... --data-dir`` CLI. Faults: the collector
SIGKILLed and restarted, a sender SIGKILLed and restarted, the network between
a sender and the collector cut (both sit behind TCP relays this test owns, and
advertise the relays), a sender's spool deleted (a true loss: reported as a
gap), and bad input over the mesh (malformed, oversized, unknown fields, an
untrusted node). Every wait has a deadline; every child is killed at the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hivemesh.client.swarm import LocalSwarm, NodeProc, wait_until
from hivemesh.telemetry.errors import TelemetryRefused

ENV = {
    "HIVEMESH_TELEMETRY_TIMEOUT_S": "1",
    "HIVEMESH_TELEMETRY_MAX_BACKOFF_S": "0.3",
    "HIVEMESH_TELEMETRY_HEARTBEAT_S": "1",
    "HIVEMESH_HEALTH_INTERVAL_S": "0.3",
    "HIVEMESH_METRICS_SENDERS": "sender-1,sender-2,sender-x",
}
WAIT_S = 20.0


@pytest.fixture(scope="module")
def swarm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSwarm]:
    root: Path = tmp_path_factory.mktemp("tele")
    with LocalSwarm(root, env=ENV) as s:
        c = s.start("c", extra_args=["--collector"])
        s.start("s1", bootstrap=[c.endpoint], extra_args=["--name", "sender-1"])
        s.start("s2", bootstrap=[c.endpoint], extra_args=["--name", "sender-2"])
        yield s


def _sql(c: NodeProc, sql: str) -> list[list[Any]]:
    rows: list[list[Any]] = c.client.call("metrics", what="query", sql=sql)["rows"]
    return rows


def _stored(c: NodeProc, sender: NodeProc, name: str) -> tuple[int, int]:
    """(rows, distinct seqs -- or ids for seq-less hand-sent rows) for ``name`` from ``sender``."""
    (row,) = _sql(
        c,
        f"SELECT count(*), count(DISTINCT coalesce(CAST(seq AS VARCHAR), id)) FROM metrics"
        f" WHERE sender = '{sender.address}' AND name = '{name}'",
    )
    return int(row[0]), int(row[1])


def _record(node: NodeProc, name: str, count: int) -> tuple[int, int]:
    got = node.client.call("metrics.record", name=name, value=1.5, count=count)
    return int(got["first_seq"]), int(got["last_seq"])


def _telemetry(node: NodeProc) -> dict[str, Any]:
    t: dict[str, Any] = node.client.status()["telemetry"]
    return t


def _wait_sent(node: NodeProc) -> None:
    wait_until(lambda: _telemetry(node)["spool_backlog"] == 0, WAIT_S, what=f"{node.label} sent")


def _wait_exactly(c: NodeProc, sender: NodeProc, name: str, n: int) -> None:
    got = wait_until(
        lambda: (got := _stored(c, sender, name))[0] >= n and got, WAIT_S, what=f"{n} {name}"
    )
    _wait_sent(sender)
    assert _stored(c, sender, name) == (n, n), got


def _cli(*args: str) -> Any:
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parent.parent / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run(
        [sys.executable, "-m", "hivemesh", *args, "--json"],
        capture_output=True,
        env=env,
        timeout=30,
        check=True,
    )
    return json.loads(out.stdout)


def _counters(c: NodeProc) -> dict[str, int]:
    got: dict[str, int] = c.client.call("metrics", what="stats")["counters"]
    return got


def _wait_members(swarm: LocalSwarm, labels: list[str]) -> None:
    def ok() -> bool:
        return all(swarm.member_state("c", x) == "up" for x in labels)

    wait_until(ok, WAIT_S, what="members up")


def test_collector_killed_then_restarted(swarm: LocalSwarm) -> None:
    c, s1 = swarm.nodes["c"], swarm.nodes["s1"]
    _record(s1, "fa.before", 50)
    _wait_exactly(c, s1, "fa.before", 50)
    swarm.kill("c")
    _record(s1, "fa", 150)
    # the sender keeps trying and failing meanwhile; nothing is lost
    wait_until(lambda: _telemetry(s1)["sender"]["failures"] >= 2, WAIT_S, what="failed sends")
    assert _telemetry(s1)["spool_backlog"] >= 150
    _record(s1, "fa", 50)
    swarm.restart("c")
    _wait_exactly(c, s1, "fa", 200)
    _wait_exactly(c, s1, "fa.before", 50)


def test_sender_killed_then_restarted_and_node_down_alerted(swarm: LocalSwarm) -> None:
    c, s1 = swarm.nodes["c"], swarm.nodes["s1"]
    _wait_members(swarm, ["s1"])
    _record(s1, "fb", 300)
    swarm.kill("s1")  # kill -9, with records spooled and maybe in flight

    def down_alert() -> bool:
        alerts = c.client.call("metrics", what="alerts")
        return any(a["rule"] == "node_down" and a["subject"] == s1.address for a in alerts)

    wait_until(down_alert, WAIT_S, what="node_down alert for the killed sender")
    swarm.restart("s1")
    _record(s1, "fb", 100)
    _wait_exactly(c, s1, "fb", 400)
    wait_until(lambda: not down_alert(), WAIT_S, what="node_down alert resolved")


def test_spool_deleted_is_reported_as_a_gap(swarm: LocalSwarm) -> None:
    c, s2 = swarm.nodes["c"], swarm.nodes["s2"]
    _record(s2, "fd.before", 20)
    _wait_exactly(c, s2, "fd.before", 20)
    swarm.kill("c")
    _record(s2, "fd.lost", 40)
    spool = _telemetry(s2)["spool"]
    swarm.kill("s2")
    lost = (spool["acked_seq"] + 1, spool["last_seq"])
    assert lost[1] - lost[0] + 1 >= 40
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            (s2.data_dir / f"telemetry-spool.sqlite3{suffix}").unlink()
    swarm.restart("c")
    swarm.restart("s2")
    _record(s2, "fd.after", 10)
    _wait_exactly(c, s2, "fd.after", 10)
    gaps = _cli("metrics", "gaps", "--data-dir", str(c.data_dir))
    mine = [(g["first_missing"], g["last_missing"]) for g in gaps if g["sender"] == s2.address]
    assert mine == [lost]
    assert _stored(c, s2, "fd.lost") == (0, 0)
    count_sql = f"SELECT count(*) FROM metrics WHERE sender = '{s2.address}'"
    before = _sql(c, count_sql)[0][0]
    top = _cli("metrics", "top", "--by", "sender", "--data-dir", str(c.data_dir))
    (row,) = [r for r in top if r["sender"] == s2.address]
    assert before <= row["records"] <= _sql(c, count_sql)[0][0]  # heartbeats keep coming
    failures = _cli("metrics", "failures", "--data-dir", str(c.data_dir))
    assert {"by", "key", "records", "failures", "failure_rate"} <= set(failures[0])


def test_bad_input_over_the_mesh_is_rejected_and_counted(swarm: LocalSwarm) -> None:
    c, s2 = swarm.nodes["c"], swarm.nodes["s2"]
    intruder = swarm.start("intruder", bootstrap=[c.endpoint])
    before = _counters(c)
    bad = {
        "invalid_record": {"type": "metrics", "records": [{"name": "e.x", "value": "high"}]},
        "oversize": {"type": "metrics", "records": [{"name": "x" * 300, "value": 1}]},
        "unknown_field": {"type": "metrics", "records": [{"name": "e.x", "value": 1, "zz": 2}]},
        "malformed": "not a batch",
    }
    too_many = {"type": "metrics", "records": [{"name": "big", "value": 1}] * 6000}
    for reason, data in [*bad.items(), ("oversize", too_many)]:
        # sent to the collector's name: refused with the reason, never "delivered"
        with pytest.raises(TelemetryRefused, match=reason):
            s2.client.send("metrics-collector", data, timeout_s=10)
    _record(intruder, "fe.untrusted", 5)
    s2.client.send(
        "metrics-collector",
        {"type": "metrics", "records": [{"name": "fe.hand", "value": 2.0, "id": "h1"}]},
        timeout_s=10,
    )

    def counted() -> dict[str, int] | None:
        now = _counters(c)
        grew = {k: now.get(k, 0) - before.get(k, 0) for k in (*bad, "untrusted_author")}
        return grew if all(v > 0 for v in grew.values()) else None

    grew = wait_until(counted, WAIT_S, what="every rejection counted")
    assert grew["oversize"] >= 2  # an over-long string and a batch of too many records
    # the collector keeps running and storing good records, hand-sent ones too
    _wait_exactly(c, s2, "fe.hand", 1)
    _record(s2, "fe.good", 10)
    _wait_exactly(c, s2, "fe.good", 10)
    assert _stored(c, intruder, "fe.untrusted") == (0, 0)
    tele = _telemetry(intruder)
    assert tele["spool_backlog"] >= 5 and "untrusted_author" in tele["sender"]["last_error"]
    assert swarm.nodes["c"].running


class Relay:
    """A TCP relay on loopback that this test can cut and restore."""

    def __init__(self, port: int) -> None:
        self.target = ("127.0.0.1", 0)
        self.cut_now = False
        self._pairs: list[socket.socket] = []
        self._lock = threading.Lock()
        self.srv = socket.create_server(("127.0.0.1", port))
        self.port = self.srv.getsockname()[1]
        self.srv.settimeout(0.2)
        self._stop = False
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                a, _ = self.srv.accept()
            except OSError:
                continue
            if self.cut_now or not self.target[1]:
                a.close()
                continue
            try:
                b = socket.create_connection(self.target, timeout=2)
            except OSError:
                a.close()
                continue
            with self._lock:
                self._pairs += [a, b]
            for x, y in ((a, b), (b, a)):
                threading.Thread(target=self._pump, args=(x, y), daemon=True).start()

    def _pump(self, x: socket.socket, y: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := x.recv(65536):
                y.sendall(data)
        for s in (x, y):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        """Drop every connection and refuse new ones."""
        self.cut_now = True
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for s in pairs:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def restore(self) -> None:
        """Accept and forward again."""
        self.cut_now = False

    def close(self) -> None:
        """Stop for good."""
        self._stop = True
        self.cut()
        self.srv.close()
        self._thread.join(2)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_network_cut_between_sender_and_collector(tmp_path: Path) -> None:
    rc, rx = Relay(0), Relay(0)
    try:
        with LocalSwarm(tmp_path, env=ENV) as s:
            pc, px = _free_port(), _free_port()
            rc.target, rx.target = ("127.0.0.1", pc), ("127.0.0.1", px)
            c = s.start(
                "c",
                extra_args=[
                    "--collector",
                    *("--listen", f"127.0.0.1:{pc}", "--advertise", f"127.0.0.1:{rc.port}"),
                ],
            )
            x = s.start(
                "x",
                bootstrap=[f"127.0.0.1:{rc.port}"],
                extra_args=[
                    *("--name", "sender-x", "--listen", f"127.0.0.1:{px}"),
                    *("--advertise", f"127.0.0.1:{rx.port}"),
                ],
            )
            _record(x, "fc", 100)
            _wait_exactly(c, x, "fc", 100)
            failures = _telemetry(x)["sender"]["failures"]
            rc.cut()
            rx.cut()
            _record(x, "fc", 100)
            wait_until(
                lambda: _telemetry(x)["sender"]["failures"] >= failures + 2,
                WAIT_S,
                what="sends fail while the network is cut",
            )
            assert _telemetry(x)["spool_backlog"] >= 100
            rc.restore()
            rx.restore()
            _wait_exactly(c, x, "fc", 200)
    finally:
        rc.close()
        rx.close()


def test_kill_leaves_no_children(swarm: LocalSwarm) -> None:
    for node in swarm.running():
        assert node.proc is not None and node.proc.poll() is None
    swarm.kill("intruder", signal.SIGTERM)
    assert not swarm.nodes["intruder"].running
