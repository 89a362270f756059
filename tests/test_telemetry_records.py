"""Record schema, sequence tracking, spool and the recording API."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hivemesh.errors import DecodeError, FrameTooLarge, HivemeshError, InvalidArgument
from hivemesh.telemetry.errors import InvalidRecord, UnknownField
from hivemesh.telemetry.fastdecode import decode_rows_fast
from hivemesh.telemetry.recorder import Metrics, usage_tokens
from hivemesh.telemetry.schema import (
    MAX_BATCH_BYTES,
    MAX_STR_CHARS,
    ROW_FIELDS,
    decode_batch,
    validate_record,
)
from hivemesh.telemetry.seqtrack import SeqTracker
from hivemesh.telemetry.spool import Spool

# -- schema ----------------------------------------------------------------------


def test_minimal_hand_written_record_is_valid() -> None:
    row = dict(zip(ROW_FIELDS, validate_record({"name": "x", "value": 1}), strict=True))
    assert row["kind"] == "gauge" and row["value"] == 1.0 and row["ok"] is True
    assert row["seq"] is None and row["attrs"] == ""


def test_genai_attributes_are_hoisted_and_rest_kept_as_json() -> None:
    row = dict(
        zip(
            ROW_FIELDS,
            validate_record(
                {
                    "name": "gen_ai.client.operation.duration",
                    "value": 12.5,
                    "kind": "llm_call",
                    "attrs": {
                        "gen_ai.request.model": "m1",
                        "gen_ai.usage.input_tokens": 7,
                        "gen_ai.usage.output_tokens": 3,
                        "error.type": "Timeout",
                        "z": 1,
                        "a": "b",
                    },
                }
            ),
            strict=True,
        )
    )
    assert (row["model"], row["input_tokens"], row["output_tokens"]) == ("m1", 7, 3)
    assert row["ok"] is False and row["error_type"] == "Timeout"
    assert row["attrs"] == '{"a":"b","z":1}'


@pytest.mark.parametrize(
    ("rec", "exc"),
    [
        ({"name": "x", "value": 1, "colour": "red"}, UnknownField),
        ({"name": "x"}, InvalidRecord),
        ({"name": "x", "value": float("nan")}, InvalidRecord),
        ({"name": "x", "value": "1"}, InvalidRecord),
        ({"name": "x", "value": True}, InvalidRecord),
        ({"name": "1bad name", "value": 1}, InvalidRecord),
        ({"name": "x" * (MAX_STR_CHARS + 1), "value": 1}, FrameTooLarge),
        ({"name": "x", "value": 1, "kind": "histogramz"}, InvalidRecord),
        ({"name": [], "value": 1}, InvalidRecord),  # unhashable: not a TypeError
        ({"name": "x", "value": 1, "kind": ["gauge"]}, InvalidRecord),
        ({"name": "x", "value": 1, "unit": {"ms": 1}}, InvalidRecord),
        ({"name": "x", "value": 1, "seq": 0}, InvalidRecord),
        ({"name": "x", "value": 1, "seq": "3"}, InvalidRecord),
        ({"name": "x", "value": 1, "attrs": {"k": [1]}}, InvalidRecord),
        ({"name": "x", "value": 1, "attrs": {f"k{i}": i for i in range(40)}}, FrameTooLarge),
        ({"name": "x", "value": 1, "attrs": {"gen_ai.usage.input_tokens": -1}}, InvalidRecord),
        ({"name": "x", "value": 1, "attrs": {"gen_ai.request.model": 5}}, InvalidRecord),
        ({"name": "x", "value": 1, "attrs": {"k": "v" * 300}}, FrameTooLarge),
        ([1, 2], InvalidRecord),
    ],
)
def test_bad_records_raise_typed_errors(rec: object, exc: type[HivemeshError]) -> None:
    with pytest.raises(exc):
        validate_record(rec)


def test_batch_envelope_checks() -> None:
    ok = decode_batch(json.dumps({"type": "metrics", "records": []}).encode())
    assert ok.records == [] and ok.hi is None
    with pytest.raises(UnknownField):
        decode_batch({"records": [], "extra": 1})
    with pytest.raises(InvalidRecord):
        decode_batch({"type": "logs", "records": []})
    with pytest.raises(FrameTooLarge):
        decode_batch(b"\x91" + b"\x00" * MAX_BATCH_BYTES)
    with pytest.raises(DecodeError):
        decode_batch(b"{not json")
    with pytest.raises(DecodeError):
        decode_batch(b"\xc1\xc1")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=512))
def test_garbage_bytes_never_crash_the_decoder(data: bytes) -> None:
    try:
        batch = decode_batch(data)
        for r in batch.records:
            validate_record(r)
    except HivemeshError:
        pass


_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(),
    st.text(max_size=8),
    st.just("x" * 300),
)
_attr_keys = st.sampled_from(
    ["gen_ai.request.model", "gen_ai.usage.input_tokens", "error.type", "k", "gen_ai.tool.name",
     "gen_ai.provider.name", "hivemesh.task.id", "gen_ai.operation.name"]
)  # fmt: skip
_good = st.fixed_dictionaries(
    {"name": st.sampled_from(["a", "b.c", "gen_ai.x"]), "value": st.floats(-1e6, 1e6)},
    optional={
        "seq": st.integers(1, 10**6),
        "kind": st.sampled_from(["counter", "gauge", "llm_call"]),
        "ts_ms": st.integers(0, 2**40),
        "attrs": st.dictionaries(_attr_keys, _scalar, max_size=4),
    },
)
_record = st.one_of(
    _good,
    _good.flatmap(lambda r: st.just(r) | st.builds(lambda k, v: {**r, k: v},
                                                   st.sampled_from(["name", "value", "seq", "x"]),
                                                   _scalar)),
)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(st.lists(_record, max_size=5))
def test_fast_path_agrees_with_the_strict_slow_path(recs: list[dict[str, object]]) -> None:
    data = msgpack.packb({"type": "metrics", "records": recs})
    slow: list[tuple[object, ...]] | None = []
    for r in recs:
        try:
            row = validate_record(r)
        except HivemeshError:
            slow = None
            break
        assert slow is not None
        ts = row[2] if row[2] is not None else 7
        slow.append(("s", row[0], row[1], ts, 7, *row[3:]))
    fast = decode_rows_fast(data, "s", 7)
    # The fast path may decline a valid batch (the slow path then takes it), but it must
    # never accept an invalid one, and what it accepts it must flatten identically.
    if slow is None:
        assert fast is None
    if fast is not None:
        assert list(zip(*fast[0], strict=True)) == slow


# -- sequence tracking -------------------------------------------------------------


def test_seqtracker_dedup_and_gaps_any_order() -> None:
    rng = random.Random(7)
    seqs = [s for s in range(1, 301) if not 100 <= s <= 120 and s != 250]
    order = seqs * 2
    rng.shuffle(order)
    t = SeqTracker()
    added = sum(t.add(s) for s in order)
    assert added == len(seqs)
    assert t.gaps() == [(100, 120), (250, 250)]
    assert t.missing_count() == 22
    t.announce(400)
    assert t.pending() == (301, 400)
    t2 = SeqTracker.from_state(json.loads(json.dumps(t.to_state())))
    assert t2.gaps() == t.gaps() and 55 in t2 and 110 not in t2


# -- spool -------------------------------------------------------------------------


def test_spool_numbers_batches_acks_and_survives_reopen(tmp_path: Path) -> None:
    sp = Spool(tmp_path / "s.db")
    assert sp.append_many({"name": "x", "value": float(i)} for i in range(10)) == list(range(1, 11))
    b = sp.take_batch(4)
    assert b is not None and (b.first_seq, b.last_seq, b.count) == (1, 4, 4)
    batch = decode_batch(b.payload)
    assert [r["seq"] for r in batch.records] == [1, 2, 3, 4]
    assert batch.hi == 10 and batch.backlog == 10
    assert sp.take_batch(4) == b  # not removed until acked
    assert sp.ack(4) == 4 and sp.backlog == 6
    sp.close()
    sp = Spool(tmp_path / "s.db")
    assert sp.backlog == 6 and sp.last_seq == 10
    assert sp.append({"name": "y", "value": 1.0}) == 11
    sp.close()


def test_deleted_spool_continues_numbering_from_sidecar(tmp_path: Path) -> None:
    sp = Spool(tmp_path / "s.db")
    sp.append_many({"name": "x", "value": 1.0} for _ in range(5))
    sp.close()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{tmp_path / 's.db'}{suffix}").unlink(missing_ok=True)
    sp = Spool(tmp_path / "s.db")
    assert sp.backlog == 0 and sp.append({"name": "x", "value": 1.0}) == 6
    sp.close()


def test_full_spool_drops_counts_and_consumes_seq(tmp_path: Path) -> None:
    sp = Spool(tmp_path / "s.db", max_records=3)
    m = Metrics(sp)
    seqs = [m.count("c") for _ in range(5)]
    assert seqs == [1, 2, 3, None, None]
    assert m.dropped == 2 and sp.statistics().dropped == 2 and sp.last_seq == 5
    sp.ack(3)
    assert m.count("c") == 6  # seqs 4 and 5 are a gap the collector will report
    sp.close()


def test_large_records_split_batches_under_the_size_limit(tmp_path: Path) -> None:
    sp = Spool(tmp_path / "s.db")
    big = {f"k{i}": "v" * 250 for i in range(30)}
    sp.append_many({"name": "x", "value": 1.0, "attrs": big} for _ in range(200))
    b = sp.take_batch(1000)
    assert b is not None and 0 < b.count < 200 and len(b.payload) <= MAX_BATCH_BYTES
    sp.close()


# -- recording API -----------------------------------------------------------------


def _records(sp: Spool) -> list[dict[str, object]]:
    b = sp.take_batch(1000)
    assert b is not None
    return list(msgpack.unpackb(b.payload)["records"])


def test_metrics_api_uses_genai_names_and_records_failures(tmp_path: Path) -> None:
    sp = Spool(tmp_path / "s.db")
    pokes: list[int] = []
    m = Metrics(sp, agent="planner", clock_ms=lambda: 1000, on_record=lambda: pokes.append(1))
    with m.track_llm("gpt-x", provider="openai") as call:
        call.set_usage({"usage": {"prompt_tokens": 11, "completion_tokens": 4}})
    with pytest.raises(KeyError), m.track_tool("search"):
        raise KeyError("boom")
    with m.track_task("t1"):
        pass
    with m.timer("step"):
        pass
    m.gauge("queue.depth", 3)
    with pytest.raises(InvalidArgument):
        m.record("bad name", 1)
    recs = _records(sp)
    assert len(recs) == 5 and len(pokes) == 5
    llm, tool, task, timer, gauge = recs
    assert llm["name"] == "gen_ai.client.operation.duration" and llm["kind"] == "llm_call"
    assert llm["attrs"]["gen_ai.usage.input_tokens"] == 11  # type: ignore[index]
    assert llm["attrs"]["gen_ai.usage.output_tokens"] == 4  # type: ignore[index]
    assert llm["attrs"]["gen_ai.provider.name"] == "openai"  # type: ignore[index]
    assert tool["attrs"]["error.type"] == "KeyError"  # type: ignore[index]
    assert tool["attrs"]["gen_ai.tool.name"] == "search"  # type: ignore[index]
    assert task["attrs"]["hivemesh.task.id"] == "t1" and task["unit"] == "ms"  # type: ignore[index]
    assert timer["kind"] == "timer" and gauge["value"] == 3.0
    assert all(r["agent"] == "planner" and r["ts_ms"] == 1000 for r in recs)
    sp.close()


def test_usage_tokens_reads_both_styles() -> None:
    class U:
        input_tokens = 5
        output_tokens = 6

    class R:
        usage = U()

    assert usage_tokens(R()) == (5, 6)
    assert usage_tokens({"usage": {"prompt_tokens": 1, "completion_tokens": 2}}) == (1, 2)
    assert usage_tokens({}) == (0, 0)


def test_a_full_disk_under_the_spool_is_a_typed_store_error(tmp_path: Path) -> None:
    """Found by ``hivemesh chaos`` (disk-full): ``metrics.record`` on a full
    disk failed with a bare ``sqlite3.OperationalError`` (its rollback raised
    "no transaction is active": SQLite had rolled back already). A file size
    limit stands in for the full disk; the spool stays usable afterwards."""
    code = (
        "import resource, signal\n"
        "from hivemesh.errors import StoreError\n"
        "from hivemesh.telemetry.spool import Spool\n"
        f"spool = Spool({str(tmp_path / 'spool.sqlite3')!r})\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, hard))\n"
        "codes = set()\n"
        "for i in range(400):\n"
        "    try:\n"
        "        spool.append({'name': 'x', 'value': i, 'attrs': {'pad': 'p' * 4000}})\n"
        "    except StoreError as exc:\n"
        "        codes.add(exc.code)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))\n"
        "spool.append({'name': 'x', 'value': -1})\n"
        "print(sorted(codes))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "['store_error']", out.stdout
