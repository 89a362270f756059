"""View checkpoints: a restart imports only the tail; a bad or foreign
checkpoint is refused with a reason (hivemesh.stores.viewcheckpoint)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from hivemesh.bench._shared_history import SharedBatch, shared_history
from hivemesh.core.journal import Journal
from hivemesh.core.views import ContextView, View, standard_views
from hivemesh.errors import DecodeError, ViewCheckpointInvalid
from hivemesh.stores import viewcheckpoint
from hivemesh.stores.replay import verify_causal
from hivemesh.stores.sqlite import SQLiteStore

NODE = b"\x07" * 32


def _batches(n: int, seed: int = 5) -> list[SharedBatch]:
    return list(shared_history(n, 5, seed, others=0.3))


def _append(store: SQLiteStore, batches: list[SharedBatch]) -> None:
    for author, events, sig in batches:
        store.append(author, events, sig)


def _rebuild(store: SQLiteStore, ckpt: viewcheckpoint.Checkpoint | None = None) -> list[View]:
    journal = Journal(store)
    views = standard_views(NODE)
    if ckpt is not None:
        _ctx(views).restore(ckpt.views["ctx"], ckpt.covered)
    for view in views:
        journal.add_view(view)
    for run in verify_causal(store):
        journal.apply_to_views(run, replay=True)
    return views


def _ctx(views: list[View]) -> ContextView:
    return next(v for v in views if isinstance(v, ContextView))


def _save(path: Path, store: SQLiteStore, views: list[View], node: bytes = NODE) -> None:
    state = _ctx(views).checkpoint()
    assert state is not None
    heads = {a: (s, h) for a, (s, h) in store.heads().items()}
    viewcheckpoint.save(path, node, heads, {"ctx": state})


def _ctx_events(batches: list[SharedBatch]) -> int:
    return sum(1 for _a, evs, _s in batches for e in evs if e.kind == "ctx.update")


def test_restart_from_checkpoint_imports_only_the_tail(tmp_path: Path) -> None:
    batches = _batches(1500)
    head, tail = batches[: len(batches) * 2 // 3], batches[len(batches) * 2 // 3 :]
    ckpt_path = viewcheckpoint.checkpoint_path(tmp_path / "s.db")
    with SQLiteStore(tmp_path / "s.db") as store:
        _append(store, head)
        _save(ckpt_path, store, _rebuild(store))
        _append(store, tail)
        full = _rebuild(store)
        ckpt = viewcheckpoint.load(ckpt_path, NODE, store)
        assert ckpt is not None
        resumed = _rebuild(store, ckpt)
    assert stat.S_IMODE(ckpt_path.stat().st_mode) == 0o600
    for a, b in zip(full, resumed, strict=True):
        assert a.digest() == b.digest(), type(a).__name__
    ctx = _ctx(resumed)
    assert ctx.imports == _ctx_events(tail) > 0  # only the tail went through loro
    assert ctx.replay_skipped == _ctx_events(head)
    assert ctx.applied == _ctx(full).applied
    # the restored view writes on: its counters continue where the feed ended
    ctx.context("shared")["after"] = 1
    assert ctx.pending_update() is not None


@pytest.fixture
def saved(tmp_path: Path) -> tuple[Path, Path]:
    db = tmp_path / "s.db"
    with SQLiteStore(db) as store:
        _append(store, _batches(300))
        _save(viewcheckpoint.checkpoint_path(db), store, _rebuild(store))
    return db, viewcheckpoint.checkpoint_path(db)


def _load(db: Path, path: Path, node: bytes = NODE) -> viewcheckpoint.Checkpoint | None:
    with SQLiteStore(db) as store:
        return viewcheckpoint.load(path, node, store)


def test_missing_checkpoint_is_none(tmp_path: Path) -> None:
    with SQLiteStore(tmp_path / "s.db") as store:
        assert viewcheckpoint.load(tmp_path / "nope", NODE, store) is None


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (lambda b: b[:-1] + bytes([b[-1] ^ 1]), "checksum"),
        (lambda b: b[: len(b) // 2], "checksum"),
        (lambda b: b"x" + b[1:], "magic"),
        (lambda b: b"", "magic"),
    ],
)
def test_damaged_checkpoint_is_refused(saved: tuple[Path, Path], damage: object, why: str) -> None:
    db, path = saved
    assert _load(db, path) is not None
    path.write_bytes(damage(path.read_bytes()))  # type: ignore[operator]
    with pytest.raises(ViewCheckpointInvalid, match=why) as refused:
        _load(db, path)
    # the counter suffix (view_checkpoint_ignored_<reason>) travels with the error
    assert refused.value.reason == {"checksum": "checksum", "magic": "format"}[why]


def test_checkpoint_of_another_node_is_refused(saved: tuple[Path, Path]) -> None:
    db, path = saved
    with pytest.raises(ViewCheckpointInvalid, match="another node") as refused:
        _load(db, path, node=b"\x08" * 32)
    assert refused.value.reason == "node"


def test_checkpoint_beside_another_journal_is_refused(saved: tuple[Path, Path]) -> None:
    db, path = saved
    same = _batches(300)
    db.unlink()
    with SQLiteStore(db) as store:  # a shorter journal: a store restored from a backup
        _append(store, same[: len(same) // 2])
    with pytest.raises(ViewCheckpointInvalid, match="lacks an event") as refused:
        _load(db, path)
    assert refused.value.reason == "journal"
    db.unlink()
    with SQLiteStore(db) as store:  # the same writers, other events at the same seqs
        _append(store, list(shared_history(600, 5, 5, others=0.0)))
    with pytest.raises(ViewCheckpointInvalid, match="another event"):
        _load(db, path)


def test_malformed_state_leaves_the_view_empty() -> None:
    view = ContextView(NODE)
    with pytest.raises(DecodeError):
        view.restore({"docs": {"shared": b"not loro"}, "next": [], "exported": {}}, {})
    with pytest.raises(DecodeError):
        view.restore(
            {"docs": {}, "next": [["x", 1, 2]], "exported": {}, "applied": 0, "rejected": {}}, {}
        )
    assert view.names() == [] and view.applied == 0
    view.restore({"docs": {}, "next": [], "exported": {}, "applied": 0, "rejected": {}}, {})


def test_no_checkpoint_while_operations_wait(tmp_path: Path) -> None:
    """Operations waiting for their dependencies are not in a snapshot."""
    batches = _batches(200, seed=9)
    view = ContextView(None)
    late = [e for _a, evs, _s in batches for e in evs if e.kind == "ctx.update"]
    for ev in reversed(late[-40:]):
        view.replay(ev)
    assert view.imports_pending > 0
    assert view.checkpoint() is None


def test_no_checkpoint_while_local_writes_are_not_exported() -> None:
    view = ContextView(NODE)
    view.context("mine")["k"] = 1
    assert view.checkpoint() is None  # the journal does not hold that write yet
    assert view.pending_update() is not None
    assert view.checkpoint() is not None
