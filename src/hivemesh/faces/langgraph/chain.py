"""The checkpoint chains of LangGraph threads, as a deterministic view over the journal.

Theory of operation
-------------------
A checkpointer on any node writes a thread's checkpoints, pending writes and
deletions as events of its own feed (kinds :data:`KINDS`). Every event names
the thread, the *fencing token* ``k`` of the thread's lease under which it
was written (:mod:`hivemesh.faces.langgraph.checkpoint` explains how the
writer got and confirmed it) and the writer (``h``, one per saver).

This view folds those events into each thread's checkpoint tree, and every
replica computes the same answers from the same events in any arrival order
(it stores everything and orders only when asked):

* **Position.** An event's position is ``(k, author, seq)``. One token is
  granted to one writer, whose events share one feed, so inside a token the
  feed order is the writer's order; across tokens, the quorum's token order.
* **Latest.** The latest checkpoint of ``(thread, ns)`` is the live one with
  the greatest ``(k, checkpoint id)``: a writer that resumed under a newer
  token is always ahead of anything written under an older one, whatever
  the clocks say -- a paused writer that wakes up and appends under its old
  token can never become the head again.
* **Deleted.** ``lg.del`` removes every event of its thread at an earlier
  position.
* **Pending writes** of a checkpoint are the ``lg.w`` events for it with a
  token at least the checkpoint's, in position order; for one ``(task,
  idx)`` the first regular write is kept and special (negative ``idx``)
  writes are replaced by later ones, as LangGraph's own savers do.
* **Forks** (:meth:`ChainView.forks`): two checkpoints of one ``(thread,
  ns)`` with the same parent written by *different* writers. The safe
  checkpointer never produces one; a naive one does, and the tests use this
  to show it.

Large payloads are split into ``lg.part`` events written just before the
event that names them (``parts``: their seqs in the same feed), so a
checkpoint of up to :data:`MAX_PAYLOAD_BYTES` travels with the journal and
is as durable as it.

The view keeps every event body in memory (a thread's whole history); the
journal keeps them on disk. A long-lived swarm with large graphs should
delete threads it no longer needs (``delete_thread``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from hivemesh.core.codec import MAX_BODY_BYTES, unpack
from hivemesh.core.event import Event

__all__ = [
    "KINDS",
    "KIND_CHECKPOINT",
    "KIND_DELETE",
    "KIND_PART",
    "KIND_WRITES",
    "MAX_PAYLOAD_BYTES",
    "PART_BYTES",
    "ChainView",
    "Record",
]

KIND_CHECKPOINT = "lg.cp"
KIND_WRITES = "lg.w"
KIND_DELETE = "lg.del"
KIND_PART = "lg.part"
KINDS = frozenset({KIND_CHECKPOINT, KIND_WRITES, KIND_DELETE, KIND_PART})
#: Largest payload carried inline; larger ones are split into parts of this size.
PART_BYTES = MAX_BODY_BYTES - 4096
#: Largest checkpoint (or batch of writes) payload, encoded.
MAX_PAYLOAD_BYTES = 32 * 1024 * 1024

Position = tuple[int, bytes, int]


@dataclass(frozen=True, slots=True)
class Record:
    """One checkpoint or writes event as the view holds it."""

    thread: str
    ns: str
    checkpoint_id: str
    parent_id: str | None
    token: int
    holder: str
    author: bytes
    seq: int
    body: dict[str, Any]

    @property
    def position(self) -> Position:
        """``(token, author, seq)``: the order of events inside a thread."""
        return (self.token, self.author, self.seq)


@dataclass(slots=True)
class _Thread:
    checkpoints: list[Record] = field(default_factory=list)
    writes: list[Record] = field(default_factory=list)
    deletes: list[Position] = field(default_factory=list)

    def deleted_before(self) -> Position | None:
        return max(self.deletes) if self.deletes else None


def _str(body: dict[str, Any], key: str) -> str | None:
    v = body.get(key)
    return v if isinstance(v, str) else None


class ChainView:
    """Checkpoint trees of every thread (see module docs). Add it to a node
    with :meth:`hivemesh.Node.add_view`."""

    kinds = KINDS

    def __init__(self) -> None:
        self._threads: dict[str, _Thread] = {}
        self._parts: dict[tuple[bytes, int], bytes] = {}
        #: events of our kinds that failed validation, ignored (by kind)
        self.rejected: dict[str, int] = {}

    # -- folding ----------------------------------------------------------------

    def apply(self, ev: Event) -> None:
        """Fold one event (any order of arrival gives the same answers)."""
        body = ev.body
        if not isinstance(body, dict) or not self._valid(ev.kind, body):
            self.rejected[ev.kind] = self.rejected.get(ev.kind, 0) + 1
            return
        if ev.kind == KIND_PART:
            self._parts[(ev.author, ev.seq)] = body["x"]
            return
        thread = self._threads.setdefault(body["t"], _Thread())
        if ev.kind == KIND_DELETE:
            thread.deletes.append((body["k"], ev.author, ev.seq))
            return
        rec = Record(
            thread=body["t"],
            ns=body["ns"],
            checkpoint_id=body["id"],
            parent_id=_str(body, "p"),
            token=body["k"],
            holder=body["h"],
            author=ev.author,
            seq=ev.seq,
            body=body,
        )
        (thread.checkpoints if ev.kind == KIND_CHECKPOINT else thread.writes).append(rec)

    @staticmethod
    def _valid(kind: str, body: dict[str, Any]) -> bool:
        if kind == KIND_PART:
            return isinstance(body.get("x"), bytes)
        if not isinstance(body.get("t"), str) or type(body.get("k")) is not int:
            return False
        if kind == KIND_DELETE:
            return True
        if not isinstance(body.get("h"), str) or not isinstance(body.get("ns"), str):
            return False
        parent = body.get("p")
        if not isinstance(body.get("id"), str) or not (parent is None or isinstance(parent, str)):
            return False
        x, parts = body.get("x"), body.get("parts")
        return isinstance(x, bytes) or (
            isinstance(parts, list) and all(type(s) is int for s in parts)
        )

    # -- payloads ---------------------------------------------------------------

    def payload(self, rec: Record) -> dict[str, Any] | None:
        """The decoded payload of ``rec`` (None while a part is missing)."""
        x = rec.body.get("x")
        if not isinstance(x, bytes):
            chunks = [self._parts.get((rec.author, s)) for s in rec.body["parts"]]
            if any(c is None for c in chunks):
                return None
            x = b"".join(c for c in chunks if c is not None)
        out = unpack(x, limit=MAX_PAYLOAD_BYTES)
        return out if isinstance(out, dict) else None

    # -- queries ----------------------------------------------------------------

    def _live(self, thread: str) -> tuple[list[Record], list[Record]]:
        th = self._threads.get(thread)
        if th is None:
            return [], []
        cut = th.deleted_before()
        if cut is None:
            return th.checkpoints, th.writes
        return (
            [r for r in th.checkpoints if r.position > cut],
            [r for r in th.writes if r.position > cut],
        )

    def checkpoints(self, thread: str, ns: str | None = None) -> list[Record]:
        """Live checkpoints of ``thread`` (in ``ns``, or every ns), newest first:
        by ``(token, checkpoint id)`` descending; one record per id (its latest
        write)."""
        by_id: dict[tuple[str, str], Record] = {}
        for r in self._live(thread)[0]:
            if ns is not None and r.ns != ns:
                continue
            key = (r.ns, r.checkpoint_id)
            if key not in by_id or r.position > by_id[key].position:
                by_id[key] = r
        return sorted(by_id.values(), key=lambda r: (r.token, r.checkpoint_id), reverse=True)

    def latest(self, thread: str, ns: str) -> Record | None:
        """The head of ``(thread, ns)``: the live checkpoint with the greatest
        ``(token, id)``, or None."""
        recs = self.checkpoints(thread, ns)
        return recs[0] if recs else None

    def get(self, thread: str, ns: str, checkpoint_id: str) -> Record | None:
        """Checkpoint ``checkpoint_id`` of ``(thread, ns)`` if live."""
        found = [
            r for r in self._live(thread)[0] if r.ns == ns and r.checkpoint_id == checkpoint_id
        ]
        return max(found, key=lambda r: r.position) if found else None

    def writes(self, rec: Record) -> list[Record]:
        """The writes events for checkpoint ``rec``, in position order (see module docs)."""
        return sorted(
            (
                w
                for w in self._live(rec.thread)[1]
                if w.ns == rec.ns and w.checkpoint_id == rec.checkpoint_id and w.token >= rec.token
            ),
            key=lambda w: w.position,
        )

    def threads(self) -> Iterator[str]:
        """Every thread with a live checkpoint, sorted."""
        for t in sorted(self._threads):
            if self._live(t)[0]:
                yield t

    def forks(self, thread: str) -> list[tuple[str, str | None, list[str]]]:
        """``(ns, parent id, [checkpoint ids])`` for every parent that has live
        children from more than one writer: a forked chain (or the orphan of a
        write whose writer was told it failed, next to its successor's)."""
        children: dict[tuple[str, str | None], dict[str, set[str]]] = {}
        for r in self._live(thread)[0]:
            kids = children.setdefault((r.ns, r.parent_id), {})
            kids.setdefault(r.holder, set()).add(r.checkpoint_id)
        out = []
        for (ns, parent), by_holder in sorted(
            children.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")
        ):
            if len(by_holder) > 1:
                ids = sorted(i for s in by_holder.values() for i in s)
                out.append((ns, parent, ids))
        return out
