"""A write that fails (a full disk) leaves no trace, and the next one works.

Core: the feed writer, the clock and the context view's export all continue
from what the store holds. Store: a group whose commit fails stays pending
whole; an append whose own commit fails takes its batch back out. The real
full disk under a real daemon is in ``test_e2e_diskfull.py``.
"""

from __future__ import annotations

import errno
import os
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from hivemesh.core.event import Event
from hivemesh.core.identity import Identity
from hivemesh.core.node import Node, NodeConfig
from hivemesh.core.store import MemoryStore
from hivemesh.core.views.context import ContextView
from hivemesh.errors import StoreError
from hivemesh.stores import appendlog as appendlog_mod
from hivemesh.stores.appendlog import AppendLog, read_records
from hivemesh.stores.sqlite import SQLiteStore
from test_store_support import FailingCommits, committed_heads, make_batch, writer


class FlakyStore(MemoryStore):
    """A MemoryStore whose next ``fail`` appends raise like a full disk."""

    def __init__(self) -> None:
        super().__init__()
        self.fail = 0

    def append(
        self, author: bytes, events: Sequence[Event], sig: bytes, *, durable: bool = True
    ) -> None:
        if self.fail:
            self.fail -= 1
            raise StoreError("disk full (test)")
        super().append(author, events, sig, durable=durable)


def node(i: int, store: MemoryStore | None = None) -> Node:
    ident = Identity.from_seed(bytes([i]) * 32)
    return Node(ident, store or MemoryStore(), random.Random(i), now_ms=0, config=NodeConfig())


def test_a_failed_append_leaves_no_trace_and_the_next_continues_the_stored_feed() -> None:
    store = FlakyStore()
    n = node(1, store)
    n.append("app.note", {"i": 0}, 1000)
    clock = n.clock.last
    store.fail = 1
    with pytest.raises(StoreError):
        n.append("app.note", {"i": 1}, 1000)
    assert n.writer.head == n.journal.head(n.identity.public)
    assert n.clock.last == clock  # the failed event took no timestamp
    ev = n.append("app.note", {"i": 2}, 1000)  # today: "must continue the stored feed"
    assert ev.seq == 2 and ev.hlc == clock + 1
    assert [e.seq for e in n.events()] == [1, 2]


def test_a_failed_append_many_keeps_only_the_batches_it_stored() -> None:
    store = FlakyStore()
    n = node(1, store)
    items = [("app.note", {"i": i}) for i in range(600)]  # three signed batches
    real = store.append
    calls = []

    def second_fails(author: bytes, events: Sequence[Event], sig: bytes, **kw: Any) -> None:
        calls.append(len(events))
        if len(calls) == 2:
            raise StoreError("disk full (test)")
        real(author, events, sig, **kw)

    store.append = second_fails  # type: ignore[method-assign]
    with pytest.raises(StoreError):
        n.append_many(items, 1000)
    assert calls == [256, 256]
    held = n.journal.head(n.identity.public)
    assert held.seq == 256 and n.writer.head == held
    stored_hlc = [e.hlc for e in n.events()][-1]
    assert n.clock.last == stored_hlc
    assert n.append("app.note", {"i": "next"}, 1000).seq == 257


def test_a_failed_context_commit_goes_out_with_the_next_and_replicas_accept_it() -> None:
    store = FlakyStore()
    a, b = node(1, store), node(2)
    views = {x.address: ContextView(x.identity.public) for x in (a, b)}
    for x in (a, b):
        x.add_view(views[x.address])
        x.add_peer(b.address if x is a else a.address)
    ctx = views[a.address].context("d")

    def commit() -> None:
        view = views[a.address]
        items = []
        while (upd := view.pending_update()) is not None:
            items.append(upd)
        before = a.journal.head(a.identity.public).seq
        try:
            a.append_many(items, 1000)
        except StoreError:
            view.unexport(items[a.journal.head(a.identity.public).seq - before :])
            raise

    ctx["k1"] = 1
    store.fail = 1
    with pytest.raises(StoreError):
        commit()
    ctx["k2"] = 2
    commit()
    for peer, frame in a.outbox():
        assert peer == b.address
        b.receive(a.address, frame, 1000)
    assert views[b.address].context("d").to_dict() == {"k1": 1, "k2": 2}
    assert not views[b.address].rejected and not views[a.address].rejected


def test_a_store_error_while_receiving_is_counted_and_changes_nothing() -> None:
    a, store = node(1), FlakyStore()
    b = node(2, store)
    a.add_peer(b.address)
    a.append("app.note", {}, 1000)
    frames = a.outbox()
    store.fail = 1
    for _peer, frame in frames:
        b.receive(a.address, frame, 1000)  # today: the StoreError escapes
    assert b.counters["store_error"] == 1
    assert b.journal.head(a.identity.public).seq == 0
    for _peer, frame in frames:
        b.receive(a.address, frame, 1001)  # the retry is taken
    assert b.journal.head(a.identity.public).seq == 1


def test_a_failed_group_commit_keeps_replicated_batches_pending(tmp_path: Path) -> None:
    """The journal counts a replicated batch as held once ``append`` returned:
    a failed commit must not drop it (today: dropped, the store falls behind
    the journal and the author's next batch is refused for good)."""
    path, rng, peer = tmp_path / "s.db", random.Random(2), writer(0)
    with SQLiteStore(path) as store:
        store.write_behind = True
        first, sig1 = make_batch(peer, 3, rng)
        store.append(peer.identity.public, first, sig1, durable=False)
        real = store.db
        store._db = FailingCommits(real, failures=1)  # type: ignore[assignment]
        with pytest.raises(StoreError):
            store.sync()
        assert store.pending == 1
        store._db = real
        second, sig2 = make_batch(peer, 2, rng)
        store.append(peer.identity.public, second, sig2, durable=False)
        store.sync()
        assert committed_heads(path) == {peer.identity.public: 5}


def test_an_append_whose_own_commit_fails_takes_its_batch_back(tmp_path: Path) -> None:
    path, rng, me, peer = tmp_path / "s.db", random.Random(3), writer(1), writer(0)
    with SQLiteStore(path) as store:
        store.write_behind = True  # no append log: a durable append commits itself
        theirs, sig0 = make_batch(peer, 2, rng)
        store.append(peer.identity.public, theirs, sig0, durable=False)
        real = store.db
        store._db = FailingCommits(real, failures=1)  # type: ignore[assignment]
        seq_before = me.head
        mine, sig1 = make_batch(me, 2, rng)
        with pytest.raises(StoreError):
            store.append(me.identity.public, mine, sig1)
        assert store.pending == 1  # the peer's batch waits; ours is out
        store._db = real
        me.reset(seq_before)  # the caller writes the same seqs again, differently
        again, sig2 = make_batch(me, 3, rng)
        store.append(me.identity.public, again, sig2)
        assert committed_heads(path) == {peer.identity.public: 2, me.identity.public: 3}


class _FlakyOs:
    """``os`` for the append log: the next write stops halfway with ENOSPC and
    the cut-back after it fails once (an I/O error on a sick disk)."""

    def __init__(self) -> None:
        self.fail_write = self.fail_truncate = False

    def write(self, fd: int, data: Any) -> int:
        if self.fail_write:
            self.fail_write = False
            os.write(fd, bytes(data[: len(data) // 2]))
            raise OSError(errno.ENOSPC, "No space left on device")
        return os.write(fd, data)

    def ftruncate(self, fd: int, size: int) -> None:
        if self.fail_truncate:
            self.fail_truncate = False
            raise OSError(errno.EIO, "I/O error")
        os.ftruncate(fd, size)

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)


def test_a_torn_log_record_that_could_not_be_cut_is_cut_before_the_next_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Otherwise the next, acknowledged, record would sit behind a torn one
    and be cut off with it at recovery."""
    flaky = _FlakyOs()
    monkeypatch.setattr(appendlog_mod, "os", flaky)
    log = AppendLog(tmp_path / "log", fsync=False)
    log.write(b"a" * 32, b"s" * 64, [b"first"])
    flaky.fail_write = flaky.fail_truncate = True
    with pytest.raises(OSError):
        log.write(b"a" * 32, b"s" * 64, [b"failed" * 100])
    log.write(b"a" * 32, b"s" * 64, [b"third"])
    scan = read_records((tmp_path / "log").read_bytes())
    assert [r.raws for r in scan.records] == [[b"first"], [b"third"]] and scan.torn_bytes == 0
    log.close()
