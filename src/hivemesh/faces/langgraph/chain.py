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
  position (and the view frees them; one arriving after the delete is
  dropped on arrival).
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


Key = tuple[str, str]  # (ns, checkpoint id)


@dataclass(slots=True)
class _Thread:
    checkpoints: dict[Key, list[Record]] = field(default_factory=dict)
    writes: dict[Key, list[Record]] = field(default_factory=dict)
    cut: Position | None = None  # the latest delete's position

    def live(self, rec: Record) -> bool:
        return self.cut is None or rec.position > self.cut

    def compact(self) -> list[Record]:
        """Drop what the latest delete removed; returns the dropped records."""
        dropped = []
        for table in (self.checkpoints, self.writes):
            for key in list(table):
                keep = [r for r in table[key] if self.live(r)]
                dropped += [r for r in table[key] if not self.live(r)]
                if keep:
                    table[key] = keep
                else:
                    del table[key]
        return dropped


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
            pos = (body["k"], ev.author, ev.seq)
            if thread.cut is None or pos > thread.cut:
                thread.cut = pos
                for r in thread.compact():  # free what it deleted, parts included
                    for seq in r.body.get("parts") or ():
                        self._parts.pop((r.author, seq), None)
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
        if not thread.live(rec):  # a delete that ranks after it arrived first
            for seq in rec.body.get("parts") or ():
                self._parts.pop((rec.author, seq), None)
            return
        table = thread.checkpoints if ev.kind == KIND_CHECKPOINT else thread.writes
        held = table.setdefault((rec.ns, rec.checkpoint_id), [])
        if all(r.position != rec.position for r in held):  # an event applied twice: once
            held.append(rec)

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

    def checkpoints(self, thread: str, ns: str | None = None) -> list[Record]:
        """Live checkpoints of ``thread`` (in ``ns``, or every ns), newest first:
        by ``(token, checkpoint id)`` descending; one record per id (its latest
        write)."""
        th = self._threads.get(thread)
        if th is None:
            return []
        recs = [
            max(rs, key=lambda r: r.position)
            for (rns, _cid), rs in th.checkpoints.items()
            if ns is None or rns == ns
        ]
        return sorted(recs, key=lambda r: (r.token, r.checkpoint_id), reverse=True)

    def latest(self, thread: str, ns: str) -> Record | None:
        """The head of ``(thread, ns)``: the live checkpoint with the greatest
        ``(token, id)``, or None."""
        recs = self.checkpoints(thread, ns)
        return recs[0] if recs else None

    def get(self, thread: str, ns: str, checkpoint_id: str) -> Record | None:
        """Checkpoint ``checkpoint_id`` of ``(thread, ns)`` if live."""
        th = self._threads.get(thread)
        found = th.checkpoints.get((ns, checkpoint_id)) if th is not None else None
        return max(found, key=lambda r: r.position) if found else None

    def writes(self, rec: Record) -> list[Record]:
        """The writes events for checkpoint ``rec``, in position order (see module docs)."""
        th = self._threads.get(rec.thread)
        found = th.writes.get((rec.ns, rec.checkpoint_id), []) if th is not None else []
        return sorted((w for w in found if w.token >= rec.token), key=lambda w: w.position)

    def threads(self) -> Iterator[str]:
        """Every thread with a live checkpoint, sorted."""
        return iter(sorted(t for t, th in self._threads.items() if th.checkpoints))

    def forks(self, thread: str) -> list[tuple[str, str | None, list[str]]]:
        """``(ns, parent id, [checkpoint ids])`` for every parent that has live
        children from more than one writer: a forked chain (or the orphan of a
        write whose writer was told it failed, next to its successor's)."""
        children: dict[tuple[str, str | None], dict[str, set[str]]] = {}
        for r in self.checkpoints(thread):
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
