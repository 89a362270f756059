"""Fault tests: collector and senders as real processes over the loopback TCP transport.

The collector is killed (-9) and restarted, a sender is killed (-9) and
restarted, and the network between them is cut (a TCP relay in this test is
closed, then made a black hole that swallows bytes). Afterwards every record
is in the DuckDB store exactly once. Deleting a sender's spool (a true loss)
is reported as a gap covering exactly the missing seqs.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import selectors
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

duckdb = pytest.importorskip("duckdb")

from hivemesh.telemetry.collector import Collector  # noqa: E402
from hivemesh.telemetry.store import MetricsStore  # noqa: E402

SRC = str(Path(__file__).resolve().parents[1] / "src")


def wait_for(cond: Callable[[], bool], timeout_s: float, what: str) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Proc:
    """A loopback role in its own process; reads its READY/DONE lines with deadlines."""

    def __init__(self, *args: str) -> None:
        env = {**os.environ, "PYTHONPATH": SRC}
        self.p = subprocess.Popen(
            [sys.executable, "-m", "hivemesh.telemetry.loopback", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
        )
        self.lines: list[str] = []

    def read_line(self, prefix: str, timeout_s: float) -> str:
        assert self.p.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(self.p.stdout, selectors.EVENT_READ)
        end = time.monotonic() + timeout_s
        try:
            while time.monotonic() < end:
                if sel.select(timeout=max(0.0, end - time.monotonic())):
                    line = self.p.stdout.readline()
                    if not line:
                        break
                    self.lines.append(line.strip())
                    if line.startswith(prefix):
                        return line.strip()
        finally:
            sel.close()
        err = self.p.stderr.read() if self.p.poll() is not None and self.p.stderr else ""
        raise AssertionError(f"no {prefix!r} line in {timeout_s}s; got {self.lines} {err}")

    def kill9(self) -> None:
        self.p.send_signal(signal.SIGKILL)
        self.p.wait(timeout=10)

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill9()
        for f in (self.p.stdout, self.p.stderr):
            if f:
                f.close()


def start_collector(store: Path, port: int) -> Proc:
    p = Proc("collector", "--store", str(store), "--port", str(port))
    p.read_line("READY", 30)
    return p


def start_sender(spool: Path, name: str, port: int, total: int) -> Proc:
    """A sender recording about 400 records/s until it has numbered ``total``."""
    p = Proc(
        "sender", "--spool", str(spool), "--name", name, "--port", str(port),
        "--total", str(total), "--per-tick", "4", "--tick", "0.01", "--timeout", "0.5",
    )  # fmt: skip
    p.read_line("READY", 30)
    return p


def spool_meta(path: Path) -> tuple[int, int]:
    """(last assigned seq, records waiting) read from a live sender's spool."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
    try:
        meta = dict(con.execute("SELECT k, v FROM meta").fetchall())
        (backlog,) = con.execute("SELECT count(*) FROM spool").fetchone()
    except sqlite3.OperationalError:
        return 0, 0
    finally:
        con.close()
    return int(meta.get("last_seq", 0)), int(backlog)


class Relay:
    """A TCP relay we can cut (close everything) or turn into a black hole."""

    def __init__(self, listen_port: int, target_port: int) -> None:
        self.listen_port, self.target_port = listen_port, target_port
        self.mode = "up"
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server: asyncio.Server | None = None
        self.writers: set[asyncio.StreamWriter] = set()
        self.call(self._listen())

    def call(self, coro: object) -> None:
        asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)  # type: ignore[arg-type]

    async def _listen(self) -> None:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", self.listen_port)

    async def _pipe(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            while data := await r.read(65536):
                if self.mode == "up":
                    w.write(data)
                    await w.drain()
        w.close()

    async def _handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.writers.add(w)
        try:
            tr, tw = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            w.close()
            return
        self.writers.add(tw)
        await asyncio.gather(self._pipe(r, tw), self._pipe(tr, w))

    async def _cut(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
        for w in list(self.writers):
            w.close()
        self.writers.clear()

    def cut(self) -> None:
        self.call(self._cut())

    def restore(self) -> None:
        self.mode = "up"
        self.call(self._listen())

    def blackhole(self) -> None:
        self.mode = "blackhole"

    def close(self) -> None:
        self.cut()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    started: list[Proc] = []
    yield started
    for p in started:
        p.stop()


def stored_seqs(store: Path) -> dict[str, list[tuple[int, float]]]:
    con = duckdb.connect(str(store), read_only=True)
    try:
        rows = con.execute("SELECT sender, seq, value FROM metrics ORDER BY sender, seq").fetchall()
    finally:
        con.close()
    out: dict[str, list[tuple[int, float]]] = {}
    for s, seq, v in rows:
        out.setdefault(s, []).append((seq, v))
    return out


def collector_gaps(store: Path) -> dict[str, list[tuple[int, int]]]:
    st = MetricsStore(str(store), read_only=True)
    try:
        return Collector(st).gaps()
    finally:
        st.close()


def test_exactly_once_through_collector_crash_sender_crash_and_network_cut(
    tmp_path: Path, procs: list[Proc]
) -> None:
    store = tmp_path / "metrics.duckdb"
    cport, rport = free_port(), free_port()
    total = 4000
    names = ["s0", "s1", "s2"]
    spools = {n: tmp_path / f"{n}.spool" for n in names}
    collector = start_collector(store, cport)
    procs.append(collector)
    relay = Relay(rport, cport)
    try:
        senders = {n: start_sender(spools[n], n, rport, total) for n in names}
        procs.extend(senders.values())

        # 1. The collector dies mid-stream; records pile up in the spools; it comes back.
        wait_for(lambda: spool_meta(spools["s0"])[0] >= 300, 30, "s0 to record 300")
        collector.kill9()
        base = spool_meta(spools["s0"])[1]
        wait_for(lambda: spool_meta(spools["s0"])[1] >= base + 100, 30, "s0 backlog to grow")
        collector = start_collector(store, cport)
        procs.append(collector)

        # 2. A sender dies mid-stream and is restarted; it continues its numbering.
        mark = spool_meta(spools["s1"])[0] + 100
        wait_for(lambda: spool_meta(spools["s1"])[0] >= mark, 30, "s1 to record 100 more")
        senders["s1"].kill9()
        senders["s1"] = start_sender(spools["s1"], "s1", rport, total)
        procs.append(senders["s1"])

        # 3. The network is cut (connections reset, nothing listening), then a black hole.
        mark = spool_meta(spools["s2"])[0] + 100
        wait_for(lambda: spool_meta(spools["s2"])[0] >= mark, 30, "s2 to record 100 more")
        relay.cut()
        base = spool_meta(spools["s2"])[1]
        wait_for(lambda: spool_meta(spools["s2"])[1] >= base + 100, 30, "s2 backlog to grow")
        relay.restore()
        relay.blackhole()
        base = spool_meta(spools["s2"])[1]
        wait_for(lambda: spool_meta(spools["s2"])[1] >= base + 50, 30, "black-holed backlog")
        relay.cut()
        relay.restore()

        assert spool_meta(spools["s2"])[0] < total, "faults must hit before the senders finish"
        for n in names:
            senders[n].read_line("DONE", 60)
    finally:
        relay.close()
    collector.stop()

    rows = stored_seqs(store)
    assert sorted(rows) == names
    for n in names:
        seqs = [s for s, _ in rows[n]]
        assert seqs == list(range(1, total + 1)), f"{n}: not exactly once"
        assert all(float(s) == v for s, v in rows[n])
    assert collector_gaps(store) == {}


def test_deleted_spool_is_reported_as_a_gap(tmp_path: Path, procs: list[Proc]) -> None:
    store = tmp_path / "metrics.duckdb"
    spool = tmp_path / "lossy.spool"
    cport = free_port()
    collector = start_collector(store, cport)
    procs.append(collector)
    sender = start_sender(spool, "lossy", cport, 100_000)
    procs.append(sender)
    wait_for(lambda: spool_meta(spool)[0] >= 200, 30, "first records")
    collector.kill9()  # records now wait in the spool only
    base = spool_meta(spool)[1]
    wait_for(lambda: spool_meta(spool)[1] >= base + 100, 30, "backlog to grow")
    sender.kill9()
    con = sqlite3.connect(spool)
    waiting = {s for (s,) in con.execute("SELECT seq FROM spool")}
    last = int(dict(con.execute("SELECT k, v FROM meta").fetchall())["last_seq"])
    con.close()
    assert waiting
    for suffix in ("", "-wal", "-shm"):  # a true loss: the spool database is gone
        Path(f"{spool}{suffix}").unlink(missing_ok=True)

    collector = start_collector(store, cport)
    procs.append(collector)
    sender = start_sender(spool, "lossy", cport, last + 300)
    procs.append(sender)
    sender.read_line("DONE", 60)
    collector.stop()

    stored = [s for s, _ in stored_seqs(store)["lossy"]]
    assert len(stored) == len(set(stored)), "a record was stored twice"
    missing = sorted(set(range(1, last + 301)) - set(stored))
    assert missing, "the deleted spool held records, so some must be missing"
    assert set(missing) <= waiting, "only records that were in the deleted spool may be lost"
    reported = collector_gaps(store)["lossy"]
    covered = sorted(s for lo, hi in reported for s in range(lo, hi + 1))
    assert covered == missing
