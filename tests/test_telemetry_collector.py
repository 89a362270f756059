"""Collector: strict ingest, de-duplication, gaps, restart, bad input, sender retries."""

from __future__ import annotations

import asyncio
import json
import random
import socket
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgpack
import pytest

pytest.importorskip("duckdb")

from hivemesh.errors import ConnectionClosed
from hivemesh.telemetry.collector import Collector
from hivemesh.telemetry.loopback import TcpDeliver, serve_collector
from hivemesh.telemetry.sender import Sender
from hivemesh.telemetry.spool import Spool
from hivemesh.telemetry.store import MetricsStore


def batch(seqs: list[int], **extra: Any) -> bytes:
    recs = [{"seq": s, "name": "n", "value": float(s), "kind": "counter"} for s in seqs]
    return msgpack.packb({"type": "metrics", "records": recs, **extra})  # type: ignore[no-any-return]


def seqs_in(store: MetricsStore, sender: str) -> list[int]:
    _, rows = store.query("SELECT seq FROM metrics WHERE sender = ? ORDER BY seq", [sender])
    return [r[0] for r in rows]


def test_duplicates_removed_across_batches_and_restart(tmp_path: Path) -> None:
    path = str(tmp_path / "m.duckdb")
    store = MetricsStore(path)
    c = Collector(store)
    assert c.ingest_now("a", batch([1, 2, 3]), True)["acked_through"] == 3
    ack = c.ingest_now("a", batch([2, 3, 4, 4]), True)
    assert (ack["accepted"], ack["duplicates"]) == (1, 3)
    store.close()
    store = MetricsStore(path)  # restarted collector: dedup state came back with the rows
    c = Collector(store)
    ack = c.ingest_now("a", batch([1, 4, 5]), True)
    assert (ack["accepted"], ack["duplicates"]) == (1, 2)
    assert c.ingest_now("b", batch([1]), True)["accepted"] == 1  # seqs are per sender
    assert seqs_in(store, "a") == [1, 2, 3, 4, 5]
    assert c.statistics()["duplicates"] == 5


def test_gaps_and_pending_are_reported(tmp_path: Path) -> None:
    c = Collector(MetricsStore(str(tmp_path / "m.duckdb")))
    c.ingest_now("a", batch([1, 2, 3], hi=20, backlog=17), True)
    c.ingest_now("a", batch([8, 9, 10], hi=20, backlog=10), True)
    (rep,) = c.senders()
    assert rep.gaps == [(4, 7)] and rep.pending == (11, 20) and rep.backlog == 10
    assert rep.stored == 6
    assert c.gaps() == {"a": [(4, 7)]}


def test_hand_sent_json_records_dedup_by_id(tmp_path: Path) -> None:
    store = MetricsStore(str(tmp_path / "m.duckdb"))
    c = Collector(store)
    msg = {"type": "metrics", "records": [{"id": "r1", "name": "x", "value": 1}]}
    assert c.ingest_now("human", json.dumps(msg).encode(), True)["accepted"] == 1
    assert c.ingest_now("human", msg, True)["duplicates"] == 1
    assert c.ingest_now("human", {"records": [{"name": "x", "value": 2}]}, True)["accepted"] == 1
    assert store.count() == 2


@pytest.mark.parametrize(
    ("payload", "code"),
    [
        (b"\xc1garbage", "malformed"),
        (b"{oops", "malformed"),
        (b"\x92\x01" + b"\x00" * (1024 * 1024 + 1), "oversize"),
        (msgpack.packb({"records": [], "admin": True}), "unknown_field"),
        (msgpack.packb([1, 2, 3]), "invalid_record"),
        (msgpack.packb({"records": "nope"}), "invalid_record"),
    ],
)
def test_bad_batches_are_refused_and_counted(tmp_path: Path, payload: bytes, code: str) -> None:
    store = MetricsStore(str(tmp_path / "m.duckdb"))
    c = Collector(store)
    ack = c.ingest_now("a", payload, True)
    assert ack["ok"] is False and ack["error"] == code
    assert c.statistics()[code] == 1
    assert c.ingest_now("a", batch([1]), True)["accepted"] == 1  # still working
    assert store.count() == 1


def test_bad_records_rejected_others_kept_and_no_false_gap(tmp_path: Path) -> None:
    store = MetricsStore(str(tmp_path / "m.duckdb"))
    c = Collector(store)
    recs = [
        {"seq": 1, "name": "ok", "value": 1.0},
        {"seq": 2, "name": "x", "value": 1.0, "evil": 1},
        {"seq": 3, "name": "x", "value": "NaN"},
        {"seq": 4, "name": "x" * 1000, "value": 1.0},
        {"seq": 5, "name": "ok", "value": 5.0},
    ]
    ack = c.ingest_now("a", {"records": recs}, True)
    assert (ack["accepted"], ack["rejected"], ack["acked_through"]) == (2, 3, 5)
    stats = c.statistics()
    assert (stats["unknown_field"], stats["invalid_record"], stats["oversize"]) == (1, 1, 1)
    assert seqs_in(store, "a") == [1, 5] and c.gaps() == {}


@pytest.mark.parametrize(
    "payload",
    [
        b'{"records": [{"name": "x", "value": 1, "agent": "\\ud800"}]}',
        {"records": [{"name": "x", "value": 10**400}]},
        {"records": [{"name": "x", "value": 1, "attrs": {"gen_ai.usage.input_tokens": 2**70}}]},
        {"records": [{"name": "x", "value": 1}], "type": ("tuple",)},
        {(1, 2): 3},
    ],
)
def test_poison_records_never_reach_the_store(tmp_path: Path, payload: Any) -> None:
    store = MetricsStore(str(tmp_path / "m.duckdb"))
    c = Collector(store)
    ack = c.ingest_now("a", payload, True)
    assert ack["ok"] is False or ack["rejected"] == 1
    assert c.ingest_now("a", batch([1]), True)["accepted"] == 1  # the store still takes writes
    assert store.count() == 1


def test_untrusted_sender_rejected_and_counted(tmp_path: Path) -> None:
    store = MetricsStore(str(tmp_path / "m.duckdb"))
    c = Collector(store)
    ack = c.ingest_now("mallory", batch([1]), False)
    assert ack == {"ok": False, "error": "untrusted_author", "detail": ack["detail"]}
    assert c.statistics()["untrusted_author"] == 1 and store.count() == 0


def test_concurrent_ingests_share_flushes_and_ack_after_commit(tmp_path: Path) -> None:
    store = MetricsStore(str(tmp_path / "m.duckdb"))
    c = Collector(store, flush_interval_s=0.01)

    async def main() -> list[dict[str, Any]]:
        return await asyncio.gather(
            *(c.ingest(f"s{i}", batch(list(range(1, 101))), True) for i in range(20))
        )

    acks = asyncio.run(main())
    assert all(a["ok"] and a["accepted"] == 100 for a in acks)
    assert store.count() == 2000  # every acked row is already committed
    assert c.statistics()["batches"] == 20


def test_columnar_and_map_batches_in_one_flush_store_the_same_rows(tmp_path: Path) -> None:
    # A v2 batch stages dictionary-encoded strings, a v1 batch plain ones: one flush
    # holding both stores each record exactly as the other path would.
    recs = [
        {"kind": "llm_call", "name": "gen_ai.client.operation.duration", "value": 1.5,
         "unit": "ms", "agent": "a", "ts_ms": 7,
         "attrs": {"gen_ai.request.model": "m", "gen_ai.usage.input_tokens": 3, "x.y": "z"}},
        {"kind": "tool_call", "name": "gen_ai.tool.duration", "value": 2.0, "unit": "ms",
         "agent": "a", "attrs": {"gen_ai.tool.name": "t", "error.type": "E"}},
        {"kind": "counter", "name": "n", "value": 1.0, "agent": "b"},
    ]  # fmt: skip
    payloads = {}
    for sender, columnar in (("v2", True), ("v1", False)):
        sp = Spool(tmp_path / f"{sender}.db")
        sp.append_many(recs)
        got = sp.take_batch(10, columnar=columnar)
        assert got is not None
        payloads[sender] = got.payload
        sp.close()
    assert payloads["v2"] != payloads["v1"]
    store = MetricsStore(str(tmp_path / "m.duckdb"))
    c = Collector(store, clock_ms=lambda: 99)

    async def main() -> list[dict[str, Any]]:
        return await asyncio.gather(*(c.ingest(s, p, True) for s, p in payloads.items()))

    acks = asyncio.run(main())
    assert all(a["ok"] and a["accepted"] == 3 for a in acks) and c.flushes == 1
    _, rows = store.query("SELECT * FROM metrics ORDER BY seq, sender")
    assert len(rows) == 6
    for v1, v2 in zip(rows[0::2], rows[1::2], strict=True):
        assert (v1[0], v2[0]) == ("v1", "v2") and v1[1:] == v2[1:]
    assert rows[0][3] == 7 and rows[2][3] == 99  # ts_ms, defaulted to the receive time
    assert rows[2][13] is False and rows[2][14] == "E" and rows[4][10] is None


def test_garbage_frames_on_the_loopback_transport_do_not_stop_the_collector(
    tmp_path: Path,
) -> None:
    store = MetricsStore(str(tmp_path / "m.duckdb"))
    c = Collector(store)

    async def main() -> None:
        server = await serve_collector(c, "127.0.0.1", 0, trusted=lambda s: s != "evil")
        port = server.sockets[0].getsockname()[1]
        loop = asyncio.get_running_loop()

        def raw(data: bytes) -> bytes:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(data)
                s.shutdown(socket.SHUT_WR)
                return s.recv(65536)

        await loop.run_in_executor(None, raw, struct.pack(">I", 3) + b"\xc1\xc1\xc1")
        await loop.run_in_executor(None, raw, struct.pack(">I", 2**31) + b"x")  # oversize
        await loop.run_in_executor(None, raw, b"\x00\x00")  # truncated header
        evil = TcpDeliver("127.0.0.1", port, "evil")
        assert (await evil(batch([1])))["error"] == "untrusted_author"
        good = TcpDeliver("127.0.0.1", port, "good")
        assert (await good(batch([1, 2])))["acked_through"] == 2
        good.close()
        evil.close()
        server.close()
        await server.wait_closed()

    asyncio.run(main())
    stats = c.statistics()
    assert stats["malformed"] == 1 and stats["oversize"] == 1 and stats["untrusted_author"] == 1
    assert seqs_in(store, "good") == [1, 2]


def test_sender_retries_through_failures_without_loss(tmp_path: Path) -> None:
    store = MetricsStore(str(tmp_path / "m.duckdb"))
    c = Collector(store)
    sp = Spool(tmp_path / "s.db")
    sp.append_many({"name": "n", "value": float(i)} for i in range(1, 1001))
    rng = random.Random(3)
    calls = {"n": 0}

    async def flaky(payload: bytes) -> Mapping[str, Any]:
        calls["n"] += 1
        r = rng.random()
        if r < 0.3:
            raise ConnectionClosed("cut before delivery")
        ack = await c.ingest("s", payload, True)
        if r < 0.5:
            raise ConnectionClosed("ack lost after delivery")  # stored, not acked: resent
        return ack

    async def main() -> bool:
        sender = Sender(sp, flaky, batch_max=50, min_backoff_s=0.001, max_backoff_s=0.002)
        return await sender.flush(30)

    assert asyncio.run(main())
    assert seqs_in(store, "s") == list(range(1, 1001))
    assert c.statistics()["duplicates"] > 0 and calls["n"] > 20
    assert sp.backlog == 0


def test_sender_run_loop_stops_and_backs_off(tmp_path: Path) -> None:
    sp = Spool(tmp_path / "s.db")
    sp.append({"name": "n", "value": 1.0})
    attempts: list[float] = []

    async def down(payload: bytes) -> Mapping[str, Any]:
        attempts.append(asyncio.get_running_loop().time())
        raise ConnectionClosed("collector down")

    async def main() -> None:
        sender = Sender(sp, down, linger_s=0, min_backoff_s=0.01, max_backoff_s=0.05)
        stop = asyncio.Event()
        task = asyncio.create_task(sender.run(stop))
        while len(attempts) < 5:
            await asyncio.sleep(0.01)
        stop.set()
        await asyncio.wait_for(task, 5)
        assert sender.statistics().failures >= 5
        assert "collector down" in sender.statistics().last_error

    asyncio.run(main())
    assert sp.backlog == 1  # nothing lost while the collector is down


def test_notify_wakes_an_idle_sender(tmp_path: Path) -> None:
    sp = Spool(tmp_path / "s.db")
    got: list[bytes] = []

    async def deliver(payload: bytes) -> Mapping[str, Any]:
        got.append(payload)
        return {"ok": True, "acked_through": msgpack.unpackb(payload)["hi"]}

    async def main() -> None:
        sender = Sender(sp, deliver, linger_s=0, idle_poll_s=60.0)
        stop = asyncio.Event()
        task = asyncio.create_task(sender.run(stop))
        loop = asyncio.get_running_loop()
        for i in range(3):  # each record must go out long before the 60 s idle poll
            await asyncio.sleep(0.05)  # let the sender fall asleep
            sp.append({"name": "n", "value": float(i)})
            sender.notify()
            deadline = loop.time() + 5
            while sp.backlog and loop.time() < deadline:
                await asyncio.sleep(0.005)
            assert sp.backlog == 0, f"record {i} not sent after notify"
        stop.set()
        await asyncio.wait_for(task, 5)

    asyncio.run(main())
    assert len(got) == 3


def test_staging_is_bounded_with_backpressure(tmp_path: Path) -> None:
    store = MetricsStore(str(tmp_path / "m.duckdb"))
    c = Collector(store, max_staged_rows=150, flush_interval_s=60)

    async def main() -> list[dict[str, Any]]:
        first = asyncio.ensure_future(c.ingest("a", batch(list(range(1, 101))), True))
        second = asyncio.ensure_future(c.ingest("b", batch(list(range(1, 101))), True))
        await asyncio.sleep(0)
        third = await c.ingest("c", batch([1]), True)  # 200 rows staged > 150: refused
        await c.drain()
        return [await first, await second, third]

    a, b, refused = asyncio.run(main())
    assert a["ok"] and b["ok"] and refused == {**refused, "ok": False, "error": "busy"}
    assert c.statistics()["busy"] == 1 and store.count() == 200


def test_a_batch_that_fails_to_stage_is_not_marked_stored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = MetricsStore(str(tmp_path / "m.duckdb"))
    c = Collector(store)
    c.ingest_now("a", batch([1, 2]), True)
    real = MetricsStore.batch_from_rows

    def boom(rows: Any) -> Any:
        raise ValueError("simulated conversion bug")

    monkeypatch.setattr(MetricsStore, "batch_from_rows", staticmethod(boom))
    # Out of order (3 is missing), so it takes the row-by-row path.
    ack = c.ingest_now("a", batch([5, 4]), True)
    assert ack["ok"] is False and ack["error"] == "internal_error"
    assert c.statistics()["internal_error"] == 1
    monkeypatch.setattr(MetricsStore, "batch_from_rows", staticmethod(real))
    ack = c.ingest_now("a", batch([5, 4, 3]), True)
    assert (ack["accepted"], ack["duplicates"]) == (3, 0)  # not mistaken for duplicates
    assert seqs_in(store, "a") == [1, 2, 3, 4, 5]
