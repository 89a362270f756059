"""Start-up replay verifies each feed's whole chain and only its head signature.

The shortcut (:mod:`hivemesh.stores.replay`, "Head signatures") is sound only
if the last signature, through the hash chain, still catches every change to
a stored feed. Each test below tampers with a store behind its back and
expects the head-signature replay to raise :class:`StoreCorrupt`; the
intermediate signatures it skips are checked by the audit, which must name
the damaged one. They fail if the replay stopped checking the chain, checked
the head signature against something other than the chain's end, or let the
audit miss a signature.
"""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from hivemesh.core.codec import unpack
from hivemesh.core.event import encode_event
from hivemesh.core.feed import head_message
from hivemesh.core.identity import Identity
from hivemesh.core.journal import Journal
from hivemesh.errors import StoreCorrupt
from hivemesh.runtime.rehydration import Rehydration, replay_slices
from hivemesh.runtime.supervise import Supervisor
from hivemesh.stores.replay import SigTally, audit_signatures, verify_causal, verify_feeds
from hivemesh.stores.sqlite import SQLiteStore
from store_rows import event_raw, set_event_raw
from test_store_support import build_store


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("heads") / "store.db"
    build_store(path, authors=3, batches=30, seed=11)
    return path


def _copy(pristine: Path, tmp: Path) -> Path:
    path = tmp / "store.db"
    shutil.copyfile(pristine, path)
    return path


def _sql(path: Path, stmt: str, args: tuple[Any, ...] = ()) -> Any:
    db = sqlite3.connect(path, isolation_level=None)
    try:
        return db.execute(stmt, args).fetchall()
    finally:
        db.close()


def _head_replay(path: Path) -> tuple[list[bytes], SigTally]:
    tally = SigTally()
    with SQLiteStore(path) as store:
        ids = [e.id for run in verify_causal(store, "head", tally) for e in run]
    return ids, tally


def _longest(path: Path) -> tuple[bytes, int, list[int]]:
    """(author, last seq, signed seqs) of the feed with the most signatures."""
    ((author, last),) = _sql(
        path,
        "SELECT f.author, f.last_seq FROM feeds f ORDER BY f.n_sigs DESC, f.author LIMIT 1",
    )
    signed = [
        s for (s,) in _sql(path, "SELECT seq FROM sigs WHERE author = ? ORDER BY seq", (author,))
    ]
    assert len(signed) >= 4, "the fixture needs a feed with several signed batches"
    return author, last, signed


def _unsigned_middle(signed: list[int]) -> int:
    """A seq strictly inside a batch that is neither the first nor the last."""
    lo, hi = signed[1], signed[2]
    assert hi - lo >= 2 or signed[0] > 1
    return lo + 1 if hi - lo >= 2 else signed[0] - 1


def test_head_replay_yields_what_the_full_audit_yields(pristine: Path) -> None:
    ids, tally = _head_replay(pristine)
    with SQLiteStore(pristine) as store:
        full = sorted(e.id for e in verify_feeds(store))
        feeds = len(store.heads())
        sigs = sum(len(store.signed_seqs(a)) for a in store.heads())
    assert sorted(ids) == full
    assert tally.verified == feeds == 3  # one Ed25519 verify per feed
    assert tally.covered == sigs - feeds == len(tally.deferred) > 0
    assert audit_signatures(tally.deferred) == []


def test_flipped_bit_in_an_event_body_is_detected(pristine: Path, tmp_path: Path) -> None:
    path = _copy(pristine, tmp_path)
    author, _, signed = _longest(path)
    seq = _unsigned_middle(signed)
    raw = event_raw(path, author, seq)
    bad = raw[:-2] + bytes([raw[-2] ^ 0x01]) + raw[-1:]
    set_event_raw(path, author, seq, bad)
    with pytest.raises(StoreCorrupt, match=str(path)):
        _head_replay(path)


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_rewritten_event_is_detected(pristine: Path, tmp_path: Path, where: str) -> None:
    """A well-formed event with another body and the right ``prev``: only the
    chain (its successor's ``prev``, or for the last event the signed head)
    can catch it, since no signature covers it directly any more."""
    path = _copy(pristine, tmp_path)
    author, last, signed = _longest(path)
    seq = {"first": 1, "middle": _unsigned_middle(signed), "last": last}[where]
    raw = event_raw(path, author, seq)
    _v, a, s, prev, hlc, kind, _body = unpack(raw)
    forged = encode_event(a, s, prev, hlc, kind, {"forged": True}).raw
    set_event_raw(path, author, seq, forged)
    with pytest.raises(StoreCorrupt, match=str(path)):
        _head_replay(path)


def test_reordered_events_are_detected(pristine: Path, tmp_path: Path) -> None:
    path = _copy(pristine, tmp_path)
    author, _, signed = _longest(path)
    seq = _unsigned_middle(signed)
    r1, r2 = event_raw(path, author, seq), event_raw(path, author, seq + 1)
    set_event_raw(path, author, seq, r2)
    set_event_raw(path, author, seq + 1, r1)
    with pytest.raises(StoreCorrupt, match="seq"):
        _head_replay(path)


def test_forged_head_signature_is_detected(pristine: Path, tmp_path: Path) -> None:
    path = _copy(pristine, tmp_path)
    author, last, signed = _longest(path)
    assert signed[-1] == last
    ((sig,),) = _sql(path, "SELECT sig FROM sigs WHERE author = ? AND seq = ?", (author, last))
    bad = bytes([sig[0] ^ 0x40]) + sig[1:]
    _sql(path, "UPDATE sigs SET sig = ? WHERE author = ? AND seq = ?", (bad, author, last))
    with pytest.raises(StoreCorrupt, match="signature over the head does not verify"):
        _head_replay(path)


@pytest.mark.parametrize("signer", ["original signature", "another key"])
def test_rechained_tail_is_detected(pristine: Path, tmp_path: Path, signer: str) -> None:
    """The strongest change a chain check alone cannot see: every event from
    one in the middle to the head rewritten and re-chained consistently, the
    ``feeds`` row updated to the new head. Only the head signature stands in
    the way, and it must be checked over the chain's actual end."""
    path = _copy(pristine, tmp_path)
    author, last, signed = _longest(path)
    start = _unsigned_middle(signed)
    rows = [(seq, event_raw(path, author, seq)) for seq in range(start, last + 1)]
    prev = unpack(rows[0][1])[3]
    h = prev
    for seq, raw in rows:
        _v, a, s, _p, hlc, kind, body = unpack(raw)
        ev = encode_event(a, s, h, hlc, kind, body if seq != start else {"forged": True})
        set_event_raw(path, author, seq, ev.raw)
        h = ev.id
    _sql(path, "UPDATE feeds SET last_hash = ? WHERE author = ?", (h, author))
    if signer == "another key":
        mallory = Identity.from_seed(b"\x99" * 32)
        forged_sig = mallory.sign(head_message(author, last, h))
        _sql(
            path, "UPDATE sigs SET sig = ? WHERE author = ? AND seq = ?", (forged_sig, author, last)
        )
    with pytest.raises(StoreCorrupt, match="signature over the head does not verify"):
        _head_replay(path)


def test_damaged_intermediate_signature_is_found_by_the_audit(
    pristine: Path, tmp_path: Path
) -> None:
    """It makes no event suspect (the replay goes through, same events) but
    the audit must name it, and the journal must stop serving it."""
    path = _copy(pristine, tmp_path)
    author, last, signed = _longest(path)
    seq = signed[1]
    ((sig,),) = _sql(path, "SELECT sig FROM sigs WHERE author = ? AND seq = ?", (author, seq))
    _sql(
        path,
        "UPDATE sigs SET sig = ? WHERE author = ? AND seq = ?",
        (bytes([sig[5] ^ 1]) * 64, author, seq),
    )
    ids, tally = _head_replay(path)
    assert sorted(ids) == sorted(_head_replay(pristine)[0])
    bad = audit_signatures(tally.deferred, "store: ")
    assert [(item[0], item[1]) for item, _exc in bad] == [(author, seq)]
    assert f"#{seq}: signature over the head does not verify" in str(bad[0][1])
    with SQLiteStore(path) as store:
        journal = Journal(store)
        chunk = journal.read_chunk(author, signed[0] + 1, seq)
        assert chunk is not None and len(chunk[0]) == seq - signed[0]  # served as it stands
        assert journal.withhold_signature(author, seq)
        assert not journal.withhold_signature(author, seq)  # once
        assert not journal.withhold_signature(author, last)  # never the head
        chunk = journal.read_chunk(author, signed[0] + 1, seq)
        assert chunk is not None and len(chunk[0]) == signed[2] - signed[0]  # to the next
        assert chunk[1] != bytes([sig[5] ^ 1]) * 64


def _fake_daemon(path: Path, store: SQLiteStore) -> Any:
    counters: Counter[str] = Counter()
    journal = Journal(store)
    return SimpleNamespace(
        counters=counters,
        supervisor=Supervisor(counters, on_fatal=lambda failure: None),
        node=SimpleNamespace(journal=journal),
        peer=SimpleNamespace(rehydrate=lambda events, now: len(events)),
        context_view=SimpleNamespace(imports=0, imports_pending=0, replay_skipped=0),
        config=SimpleNamespace(store_path=path),
        identity=Identity.from_seed(b"\x07" * 32),
    )


@pytest.mark.parametrize("damage", [False, True])
def test_daemon_rehydration_counts_and_audits(pristine: Path, tmp_path: Path, damage: bool) -> None:
    path = _copy(pristine, tmp_path)
    author, _, signed = _longest(path)
    if damage:
        _sql(
            path,
            "UPDATE sigs SET sig = zeroblob(64) WHERE author = ? AND seq = ?",
            (author, signed[0]),
        )

    async def main() -> tuple[Any, Rehydration]:
        with SQLiteStore(path) as store:
            d = _fake_daemon(path, store)
            r = Rehydration(d)
            n = await r.run(store)
            assert n == d.node.journal.total_events
            await d.supervisor.drain()
            return d, r

    d, r = asyncio.run(main())
    snap = r.snapshot()
    assert snap["signatures_verified"] == d.counters["rehydrate_signatures_verified"] == 3
    assert snap["signatures_covered"] == d.counters["store_signatures_audited"] > 0
    if damage:
        assert d.counters["store_signature_invalid"] == 1
        assert snap["signature_audit"] == "1 damaged"
        assert signed[0] not in d.node.journal._signed[author]
    else:
        assert d.counters["store_signature_invalid"] == 0
        assert snap["signature_audit"] == "ok"


def test_daemon_rehydration_counts_a_corrupt_store(pristine: Path, tmp_path: Path) -> None:
    path = _copy(pristine, tmp_path)
    author, last, _ = _longest(path)
    _sql(path, "UPDATE sigs SET sig = zeroblob(64) WHERE author = ? AND seq = ?", (author, last))

    async def main() -> Any:
        with SQLiteStore(path) as store:
            d = _fake_daemon(path, store)
            with pytest.raises(StoreCorrupt, match="signature over the head"):
                await Rehydration(d).run(store)
            return d

    d = asyncio.run(main())
    assert d.counters["rehydrate_store_corrupt"] == 1


def test_replay_slices_check_head_signatures_only(pristine: Path) -> None:
    tally = SigTally()
    with SQLiteStore(pristine) as store:
        n = sum(len(s) for s in replay_slices(store, 7, tally))
        assert n == sum(seq for seq, _ in store.heads().values())
    assert tally.verified == 3 and tally.covered > 0


def test_unknown_signature_mode_is_refused(pristine: Path) -> None:
    with SQLiteStore(pristine) as store, pytest.raises(ValueError):
        list(verify_causal(store, "some"))  # type: ignore[arg-type]
