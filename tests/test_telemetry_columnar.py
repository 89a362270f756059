"""Columnar (v2) batches: same records and rules as v1, de-duplication, gaps, fallbacks."""

from __future__ import annotations

import asyncio
import math
import random
from pathlib import Path
from typing import Any

import msgpack
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hivemesh.errors import HivemeshError
from hivemesh.telemetry import columnar
from hivemesh.telemetry.collector import Collector
from hivemesh.telemetry.columnar import decode_columnar, encode_columnar, rebuild_records
from hivemesh.telemetry.schema import MAX_BATCH_RECORDS, validate_record
from hivemesh.telemetry.spool import Spool
from hivemesh.telemetry.store import MetricsStore

_scalar = st.one_of(
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(),
    st.text(max_size=8),
    st.just("y" * 300),
)
_attr_keys = st.sampled_from(
    ["gen_ai.request.model", "gen_ai.usage.input_tokens", "error.type", "k", "gen_ai.tool.name",
     "gen_ai.provider.name", "hivemesh.task.id", "gen_ai.operation.name", "z"]
)  # fmt: skip
_record = st.fixed_dictionaries(
    {"name": st.sampled_from(["a", "b.c", "gen_ai.x", "bad name"]), "value": st.floats()},
    optional={
        "kind": st.sampled_from(["counter", "gauge", "llm_call", "nope"]),
        "ts_ms": st.integers(-1, 2**54),
        "unit": st.sampled_from(["", "ms", "x" * 300]),
        "agent": st.text(max_size=4),
        "id": st.text(max_size=4),
        "attrs": st.dictionaries(_attr_keys, _scalar, max_size=5),
    },
)


def _blobs(recs: list[dict[str, Any]], first_seq: int = 1) -> list[bytes]:
    return [msgpack.packb({"seq": first_seq + i, **r}) for i, r in enumerate(recs)]


def _v1_rows(recs: list[dict[str, Any]], first_seq: int = 1) -> list[tuple[Any, ...]] | None:
    rows = []
    for i, r in enumerate(recs):
        try:
            row = validate_record({"seq": first_seq + i, **r})
        except HivemeshError:
            return None
        ts = row[2] if row[2] is not None else 7
        rows.append(("s", row[0], row[1], ts, 7, *row[3:]))
    return rows


@settings(max_examples=300, deadline=None)
@given(st.lists(_record, min_size=1, max_size=6), st.integers(1, 2**40))
def test_columnar_means_the_same_records_as_v1(recs: list[dict[str, Any]], s0: int) -> None:
    data = encode_columnar(_blobs(recs, s0), hi=s0 + 10, backlog=3)
    v1 = _v1_rows(recs, s0)
    if data is None:
        return  # a record that does not fit the typed form travels as v1
    cb = decode_columnar(data, "s", 7)
    assert cb is not None and (cb.hi, cb.backlog, cb.n) == (s0 + 10, 3, len(recs))
    if cb.batch is not None:
        # accepted whole: every record valid under v1's rules, flattened identically
        assert v1 is not None
        assert [tuple(r.values()) for r in cb.batch.to_pylist()] == v1
    # the rebuilt records are the originals as v1 reads them
    assert _v1_rows([{k: v for k, v in r.items() if k != "seq"} for r in rebuild_records(cb)],
                    s0) == v1  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_garbled_columnar_batches_never_crash_the_collector(data: st.DataObject) -> None:
    good = encode_columnar(_blobs([{"name": "a", "value": 1.0, "kind": "counter"}] * 3))
    assert good is not None
    raw = bytearray(good)
    for _ in range(data.draw(st.integers(1, 4))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    try:
        cb = decode_columnar(bytes(raw), "s", 7)
        if cb is not None and cb.batch is None:
            for r in rebuild_records(cb):
                with_err: Any = None
                try:
                    validate_record(r)
                except HivemeshError as exc:
                    with_err = exc
                assert with_err is None or isinstance(with_err, HivemeshError)
    except HivemeshError:
        pass


def _tamper(data: bytes, **changes: Any) -> bytes:
    raw = msgspec.msgpack.decode(data, type=columnar._Batch2)
    return msgspec.msgpack.encode(msgspec.structs.replace(raw, **changes))


def _collector(tmp_path: Path) -> Collector:
    return Collector(MetricsStore(str(tmp_path / "m.duckdb")))


def _run(c: Collector, payload: bytes, sender: str = "s1") -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        return await c.ingest(sender, payload, True)

    return asyncio.run(go())


def test_resends_and_overlaps_are_deduplicated_and_gaps_reported(tmp_path: Path) -> None:
    c = _collector(tmp_path)
    recs = [{"name": "x", "value": float(i), "kind": "gauge"} for i in range(10)]
    first = encode_columnar(_blobs(recs[:6]), hi=10)
    assert first is not None
    assert _run(c, first) == {
        "ok": True, "acked_through": 6, "accepted": 6, "duplicates": 0, "rejected": 0,
    }  # fmt: skip
    assert _run(c, first)["duplicates"] == 6  # a lost ack: resent, stored once
    overlap = encode_columnar(_blobs(recs[3:8], 4))  # seqs 4..8: 4..6 already stored
    assert overlap is not None
    ack = _run(c, overlap)
    assert (ack["accepted"], ack["duplicates"], ack["acked_through"]) == (2, 3, 8)
    gapped = encode_columnar([_blobs(recs)[9]])  # seq 10 only: 9 is lost
    assert gapped is not None
    assert _run(c, gapped)["accepted"] == 1
    assert c.gaps() == {"s1": [(9, 9)]}
    assert c.store.count() == 9
    rows = c.store.query("SELECT seq, value FROM metrics ORDER BY seq")[1]
    assert rows == [(s, float(s - 1)) for s in (1, 2, 3, 4, 5, 6, 7, 8, 10)]
    c.close()


def test_a_rule_breaking_record_is_rejected_alone(tmp_path: Path) -> None:
    c = _collector(tmp_path)
    recs = [
        {"name": "llm", "value": 5.0, "kind": "llm_call",
         "attrs": {"gen_ai.request.model": "m", "gen_ai.usage.input_tokens": 3}},
        {"name": "tool", "value": 2.0, "kind": "tool_call"},
        {"name": "llm", "value": 6.0, "kind": "llm_call",
         "attrs": {"gen_ai.request.model": "m", "gen_ai.usage.input_tokens": 4}},
    ]  # fmt: skip
    data = encode_columnar(_blobs(recs))
    assert data is not None
    raw = msgspec.msgpack.decode(data, type=columnar._Batch2)
    tool = next(i for i, d in enumerate(raw.dims) if d[1] == "tool")
    dims = list(raw.dims)
    dims[tool] = ("nope", *dims[tool][1:])  # an unknown kind for the tool call
    ack = _run(c, _tamper(data, dims=dims))
    assert ack == {"ok": True, "acked_through": 3, "accepted": 2, "duplicates": 0, "rejected": 1,
                   "errors": [{"index": 1, "error": "invalid_record",
                               "detail": "unknown kind 'nope'"}]}  # fmt: skip
    assert c.statistics()["invalid_record"] == 1
    assert c.gaps() == {}  # a rejection is accounted for, not a gap
    rows = c.store.query("SELECT seq, model, input_tokens FROM metrics ORDER BY seq")[1]
    assert rows == [(1, "m", 3), (3, "m", 4)]
    c.close()


@pytest.mark.parametrize(
    "change",
    [
        {"dim": columnar._Codes(1, bytes([0, 0, 9]))},  # a code past the dims table
        {"value": b"\x00" * 8},  # one value for three records
        {"seq": columnar._IntCol(1, 2, b"\x00")},  # odd bytes for width 2
        {"seq": columnar._IntCol(2**63 - 2, 0)},  # a run beyond int64
    ],
)
def test_structurally_broken_batches_are_refused_whole(
    tmp_path: Path, change: dict[str, Any]
) -> None:
    c = _collector(tmp_path)
    data = encode_columnar(_blobs([{"name": "a", "value": 1.0}] * 3))
    assert data is not None
    ack = _run(c, _tamper(data, **change))
    assert ack["ok"] is False and ack["error"] == "malformed"
    assert c.store.count() == 0 and c.statistics()["batches_refused"] == 1
    c.close()


def test_spool_sends_columnar_within_the_byte_cap_and_falls_back_to_v1(tmp_path: Path) -> None:
    sp = Spool(tmp_path / "s.db")
    rng = random.Random(3)
    # distinct long strings: the dims table cannot share them, so the batch must shrink
    sp.append_many(
        {"name": "x", "value": 1.0, "attrs": {"hivemesh.task.id": f"{rng.getrandbits(900):0>250x}"}}
        for _ in range(3000)
    )
    b = sp.take_batch(MAX_BATCH_RECORDS, 64 * 1024, columnar=True)
    assert b is not None and len(b.payload) <= 64 * 1024 and 100 < b.count < 3000
    cb = decode_columnar(b.payload, "s", 1)
    assert cb is not None and cb.batch is not None and cb.n == b.count
    sp.ack(b.last_seq)
    # a spooled record the typed form cannot hold (a non-finite value) goes as v1
    sp2 = Spool(tmp_path / "s2.db")
    bad = msgpack.packb({"seq": 1, "name": "x", "value": math.nan})
    sp2._db.execute("INSERT INTO spool VALUES (1, ?)", (bad,))
    sp2._backlog = 1
    b2 = sp2.take_batch(10, columnar=True)
    assert b2 is not None and decode_columnar(b2.payload, "s", 1) is None
    assert msgpack.unpackb(b2.payload)["records"][0]["seq"] == 1
    sp.close()
    sp2.close()
