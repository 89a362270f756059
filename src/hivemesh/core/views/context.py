"""The context view: shared agent state as loro CRDT documents in the journal.

Theory of operation
-------------------
The view holds one :class:`loro.LoroDoc` per *context name* (``"default"``,
``"task-42"``, ...); :meth:`ContextView.context` returns a typed handle on one.
Inside a context there is one key/value map (``ctx["k"] = v``) and any number
of named lists, counters, texts and sets (``ctx.list("chat")``,
``ctx.counter("n")``, ``ctx.text("notes")``, ``ctx.gset("done")``,
``ctx.orset("participants")``). Each is a loro root container; a list and a
counter may share a name because loro keys roots by type too. The two set
types (grow-only, and add-wins observed-remove) are loro maps under reserved
root names; their semantics are in :mod:`hivemesh.core.views.context_api`.
They need no rule of their own here: their operations are map operations of
the writing author, checked like any other below.

**Writing.** A node's local writes mutate its own docs directly. The node then
calls :meth:`ContextView.pending_update` until it returns ``None`` and appends
each ``(kind, body)`` to its feed: ``kind`` is ``"ctx.update"`` and ``body``
is ``{"c": context name, "u": loro update bytes}``, holding exactly this
author's operations since the previous export (never anyone else's). When the
event comes back through :meth:`ContextView.apply`, importing it is a no-op.

**Binding updates to authors.** Every author writes under one loro peer id,
derived from its key by :func:`peer_id_of`. :meth:`ContextView.apply` reads
the update's header (``LoroDoc.decode_import_blob_meta``) and rejects it,
before importing anything, unless

* it is an ``Updates`` blob whose operations all belong to the event author's
  peer id (else :class:`~hivemesh.errors.ForeignOperations`), and
* its operation counters start exactly where the same author's previous
  accepted update for this context ended (else
  :class:`~hivemesh.errors.OpsOutOfOrder`).

The second rule means every operation id is carried by exactly one accepted
event, so an author cannot publish two different versions of the same
operations and make replicas diverge by arrival order. Malformed or corrupted
bytes become :class:`~hivemesh.errors.DecodeError` (loro signals corruption
with a bare ``BaseException``; it is caught narrowly in :func:`_loro_call`);
the import verifies loro's checksum, and a failed import changes nothing.
The check relies on loro's update format: operations travel in change blocks
that each belong to one peer, and the header summary is read from those same
blocks (a fuzz run of 30k mutated updates found none accepted with state
other than the original).

**Convergence.** loro updates commute: an update whose causal dependencies
(other authors' operations) are not there yet is held inside the doc and
applied when they arrive. So the state depends only on the set of accepted
events. The update bytes of an author depend on its own earlier events only,
so acceptance does too.

**Last-writer-wins.** Concurrent writes to one map key resolve by loro's
rule: the larger *Lamport timestamp* wins, then the larger *peer id*. The
Lamport timestamp is the logical clock of the document (one more than every
operation the writer had seen), so a write always beats every write its author
had already seen; the peer id is the first 63 bits of the author's public key
(:func:`peer_id_of`), so a tie goes to the larger author key. That is "logical
clock, then author". The HLC of the event is *not* used: it is the journal's
clock, outside the CRDT. Do not store fencing tokens here (see
:mod:`hivemesh.core.views.registers`).

**Restart.** A node rebuilds its view by replaying the journal (its own
events included) *before* writing again; local counters then continue where
its feed ended. Its own operations can come back before operations of others
they depend on (after a restore from a backup, its own feed is pulled back
from peers first); loro holds them pending and would number a new local
operation as if they did not exist, reusing their ids. So a local write is
refused with :class:`~hivemesh.errors.ContextCatchingUp` until every own
operation the view has taken is applied.

**Checkpoints.** :meth:`ContextView.checkpoint` returns the view's state as
plain data (a full loro snapshot of every doc, with its history, and the
per-author operation counters); :meth:`ContextView.restore` loads it into an
empty view together with the journal version it covers, after which
:meth:`ContextView.replay` skips every event at or below that version
(counted in :attr:`ContextView.replay_skipped`): a restart imports only the
tail. Whether a checkpoint belongs to the journal is the caller's check
(:mod:`hivemesh.stores.viewcheckpoint`). A view holding operations that
wait for dependencies gives no checkpoint (a snapshot leaves them out).

**Engine failure.** If loro panics on a doc anyway, that doc is unusable (its
mutex is poisoned): the context is set aside in :attr:`ContextView.broken`,
counted as ``context_broken``, and raises
:class:`~hivemesh.errors.ContextBroken`; other contexts keep working and a
restart rebuilds it from the journal. Local writes are visible in :meth:`ContextView.snapshot` and
:meth:`ContextView.digest` at once, so compare replicas after exporting.

**Limits.** A single value may encode to at most :data:`MAX_VALUE_BYTES`;
larger state belongs in a blob. :meth:`ContextView.pending_update` splits
exports so each body stays under :data:`MAX_UPDATE_BYTES`. The number of
contexts is not capped here (a cap would make acceptance depend on arrival
order); admission of authors is the journal's trust policy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import loro
from loro import CounterSpan, EncodedBlobMode, ExportMode, IdSpan, LoroDoc

from hivemesh.core.codec import MAX_BODY_BYTES
from hivemesh.core.event import Event
from hivemesh.core.views.base import ViewBase, state_digest
from hivemesh.core.views.context_api import (
    _KV_ROOT,
    GSET_PREFIX,
    ORSET_PREFIX,
    _check_root,
    _deep,
    _number,
    gset_members,
    orset_members,
)
from hivemesh.core.views.context_api import CONTEXT_PATTERN as CONTEXT_PATTERN
from hivemesh.core.views.context_api import MAX_VALUE_BYTES as MAX_VALUE_BYTES
from hivemesh.core.views.context_api import Context as Context
from hivemesh.core.views.context_api import CounterHandle as CounterHandle
from hivemesh.core.views.context_api import GSetHandle as GSetHandle
from hivemesh.core.views.context_api import ListHandle as ListHandle
from hivemesh.core.views.context_api import ORSetHandle as ORSetHandle
from hivemesh.core.views.context_api import TextHandle as TextHandle
from hivemesh.errors import (
    ContextBroken,
    ContextCatchingUp,
    DecodeError,
    ForeignOperations,
    InvalidArgument,
    InvalidName,
    OpsOutOfOrder,
    RemoteProtocolError,
)

__all__ = [
    "CONTEXT_PATTERN",
    "KIND_UPDATE",
    "MAX_UPDATE_BYTES",
    "MAX_VALUE_BYTES",
    "Context",
    "ContextView",
    "CounterHandle",
    "GSetHandle",
    "ListHandle",
    "ORSetHandle",
    "TextHandle",
    "peer_id_of",
]

KIND_UPDATE = "ctx.update"
#: Largest loro update put in one event body.
MAX_UPDATE_BYTES = MAX_BODY_BYTES - 1024

_UPDATES = EncodedBlobMode.Updates
_decode_meta = LoroDoc.decode_import_blob_meta
_MAX_VALIDATED = 100_000


def peer_id_of(author: bytes) -> int:
    """The loro peer id of ``author``: its first 63 bits, big-endian.

    Order-preserving (a larger key prefix gives a larger peer id, which wins
    LWW ties) and always below loro's reserved ``2**64 - 1``. Two keys sharing
    63 leading bits would share a peer id; finding one for a given key is a
    2**63 search.
    """
    if len(author) != 32:
        raise InvalidArgument("author must be a 32-byte public key")
    return int.from_bytes(author[:8], "big") >> 1


class _EnginePanic(DecodeError):
    """loro panicked: the document it panicked in is unusable (its mutex is
    poisoned, so every later call on it panics too)."""


def _is_panic(exc: BaseException) -> bool:
    return type(exc).__name__ == "PanicException"


def _loro_call(fn: Any, *args: Any) -> Any:
    """Call into loro, turning its decode failures into :class:`DecodeError`.

    loro (via pyo3) raises a bare ``BaseException`` for corrupted input and a
    ``PanicException`` (a ``BaseException`` subclass) if Rust panics; neither
    is caught by ``except Exception``. Only those two are converted (a panic
    to :class:`_EnginePanic`): ``KeyboardInterrupt``/``SystemExit`` still
    propagate.
    """
    try:
        return fn(*args)
    except Exception as exc:
        raise DecodeError(f"loro rejected update: {exc}") from None
    except BaseException as exc:
        if _is_panic(exc):
            raise _EnginePanic(f"loro panicked: {str(exc)[:200]}") from None
        if type(exc) is BaseException:
            raise DecodeError(f"loro rejected update: {exc}") from None
        raise


def _vv_ends(vv: loro.VersionVector) -> dict[int, int]:
    return {int(p): int(hi) for p, (_lo, hi) in vv.to_spans().inner().items()}


def _check_update(blob: bytes, peer: int) -> tuple[int, int]:
    """Validate an update's header; return its counter range ``[start, end)``.

    The header is decoded without its checksum: the import that follows
    verifies the checksum over the same bytes, so a corrupted blob is still
    rejected (as malformed) before it changes anything.
    """
    meta = _loro_call(_decode_meta, blob, False)
    if meta.mode != _UPDATES:
        raise DecodeError(f"context updates must be loro Updates, not {meta.mode}")
    ends = _vv_ends(meta.partial_end_vv)
    if len(ends) == 1 and peer in ends:  # the common case: only the author's ops
        last = meta.partial_start_vv.get_last(peer)
        start, end = (0 if last is None else last + 1), ends[peer]
    else:
        starts = _vv_ends(meta.partial_start_vv)
        for p in sorted(ends):
            if p != peer and ends[p] > starts.get(p, 0):
                raise ForeignOperations(f"update carries operations of peer {p}, not {peer}")
        start, end = starts.get(peer, 0), ends.get(peer, 0)
    if end <= start:
        raise DecodeError("empty context update")
    return start, end


class ContextView(ViewBase):
    """All contexts of the swarm, fed by ``ctx.update`` events.

    ``author`` is the local node's public key (``None`` for a read-only
    replica such as an observer or a simulator checker).
    """

    kinds = frozenset({KIND_UPDATE})

    def __init__(self, author: bytes | None = None) -> None:
        super().__init__()
        self.author = author
        self._peer = None if author is None else peer_id_of(author)
        self._docs: dict[str, LoroDoc] = {}
        self._peers: dict[bytes, int] = {}  # author -> peer id (cache)
        # (context, peer) -> counter where that peer's next update must start
        self._next: dict[tuple[str, int], int] = {}
        # context -> local counter exported so far
        self._exported: dict[str, int] = {}
        # event id -> (context, peer, end) of updates vetted by validate_batch
        self._validated: dict[bytes, tuple[str, int, int]] = {}
        #: Called before every local write; raises to refuse it (the node
        #: sets its own feed's gate: no write while the feed is recovering).
        self.before_write: Callable[[], None] | None = None
        #: Contexts whose doc loro panicked in: set aside, never called again
        #: (a panicked doc's mutex is poisoned). Restart rebuilds them.
        self.broken: set[str] = set()
        #: loro imports made, and how many of them left operations pending
        #: (waiting for causal dependencies; each such import makes loro
        #: re-examine its pending queue on later imports). A replay in causal
        #: order leaves none pending when the history is complete.
        self.imports = 0
        self.imports_pending = 0
        #: Stored events :meth:`replay` skipped: a restored checkpoint covered them.
        self.replay_skipped = 0
        self._covered: dict[bytes, int] = {}  # author -> seq a restored checkpoint covers

    def _doc(self, name: str) -> LoroDoc:
        doc = self._docs.get(name)
        if doc is None:
            doc = LoroDoc()  # type: ignore[no-untyped-call]
            if self._peer is not None:
                doc.peer_id = self._peer
            self._docs[name] = doc
        return doc

    @staticmethod
    def _attach(doc: LoroDoc) -> None:
        """Materialise a detached doc's state (imports are applied lazily)."""
        if doc.is_detached():
            doc.checkout_to_latest()

    def _live(self, name: str, doc: LoroDoc) -> None:
        """Bring ``name``'s doc up to date for a read or write through a
        :class:`Context` handle; a broken context raises
        :class:`~hivemesh.errors.ContextBroken`."""
        if name in self.broken:
            raise ContextBroken(f"context {name!r} is unusable in this process; restart the node")
        try:
            self._attach(doc)
        except BaseException as exc:
            if not _is_panic(exc):
                raise
            self._break(name)
            raise ContextBroken(f"context {name!r}: loro panicked: {str(exc)[:200]}") from None

    def _check_write(self, name: str, doc: LoroDoc) -> None:
        """Refuse a local write on ``name`` unless it may go out now.

        Besides the feed gate (:attr:`before_write`): this author's own
        earlier operations must all be applied in the doc. After a restore
        they can come back before the operations of others they depend on;
        loro then holds them pending and numbers a new local operation as if
        they did not exist, so the write would reuse their ids (one id, two
        operations: every replica that sees both breaks).
        """
        if self.before_write is not None:
            self.before_write()
        assert self._peer is not None
        held = self._next.get((name, self._peer), 0)  # own ops imported, pending or not
        last = doc.oplog_vv.get_last(self._peer) if held else None  # own ops applied
        if held and (last is None or last < held - 1):
            raise ContextCatchingUp(
                f"context {name!r}: this node's earlier operations wait for others'"
                " operations they depend on; retry when those arrive"
            )

    def _break(self, name: str) -> None:
        if name not in self.broken:
            self.broken.add(name)
            self.rejected[ContextBroken.code] += 1

    @staticmethod
    def _detach(doc: LoroDoc) -> None:
        # Imports into an attached doc recompute its state each time (hundreds
        # of microseconds for concurrent list edits); detached, an import only
        # grows the oplog and the state is computed once, on the next read.
        if not doc.is_detached():
            doc.commit()
            doc.detach()

    def context(self, name: str = "default") -> Context:
        """A typed handle on the context called ``name`` (created on first use)."""
        return Context(self, _check_root(name), self._doc(_check_root(name)))

    def names(self) -> list[str]:
        """Context names known to this view, sorted."""
        return sorted(self._docs)

    # -- local writes -> events ------------------------------------------------

    def pending_update(self) -> tuple[str, dict[str, Any]] | None:
        """The next ``(kind, body)`` to append to the local feed, or ``None``.

        Call repeatedly until ``None``: each call covers one context and at
        most :data:`MAX_UPDATE_BYTES` of update.
        """
        if self._peer is None:
            return None
        peer = self._peer
        for name in sorted(self._docs):
            if name in self.broken:
                continue
            doc = self._docs[name]
            doc.commit()
            start = self._exported.get(name, 0)
            end = _vv_ends(doc.oplog_vv).get(peer, 0)
            while end > start:
                blob = doc.export(
                    ExportMode.UpdatesInRange([IdSpan(peer, CounterSpan(start, end))])
                )
                if len(blob) <= MAX_UPDATE_BYTES:
                    self._exported[name] = end
                    return KIND_UPDATE, {"c": name, "u": blob}
                if end - start == 1:  # cannot happen with MAX_VALUE_BYTES; never loop
                    raise InvalidArgument("a single operation exceeds the update limit")
                end = start + (end - start) // 2
        return None

    def unexport(self, updates: Sequence[tuple[str, dict[str, Any]]]) -> None:
        """Take back ``updates`` from :meth:`pending_update` whose append failed.

        Their writes stay in the local docs and the next
        :meth:`pending_update` covers them again, so they go out with the
        next commit that succeeds (exporting past them would leave a hole in
        this author's operations that every replica refuses).
        """
        if self._peer is None:
            return
        for _kind, body in updates:
            name = body["c"]
            start, _end = _check_update(body["u"], self._peer)
            if start < self._exported.get(name, 0):
                self._exported[name] = start

    # -- events -> state -------------------------------------------------------

    def apply(self, event: Event) -> None:
        """Import one ``ctx.update`` event (never raises for bad bodies).

        An event this view already vetted in :meth:`validate_batch` skips the
        header checks; anything else is checked in full here.
        """
        if event.kind != KIND_UPDATE:
            return
        try:
            checked = self._validated.pop(event.id, None)
            if checked is None:
                name, blob, peer = self._parse(event)
                start, end = _check_update(blob, peer)
                self._check_order(name, peer, start, self._next)
            else:
                name, peer, end = checked
                blob = event.body["u"]
            self._import(event, name, blob, peer, end)
        except RemoteProtocolError as exc:
            self._reject(exc)

    def validate_batch(self, events: Sequence[Event]) -> None:
        """Vet a remote batch before the journal stores it; raise on the first
        bad ``ctx.update`` (foreign operations, out of order, malformed).

        Called by :meth:`hivemesh.core.journal.Journal.ingest`: a refused
        batch is never stored, so stored updates are known good and
        :meth:`replay` can import them without decoding their headers again.
        """
        nxt: dict[tuple[str, int], int] = {}
        vetted: list[tuple[bytes, tuple[str, int, int]]] = []
        for event in events:
            if event.kind != KIND_UPDATE:
                continue
            try:
                name, blob, peer = self._parse(event)
                start, end = _check_update(blob, peer)
                key = (name, peer)
                self._check_order(name, peer, start, nxt if key in nxt else self._next)
            except RemoteProtocolError as exc:
                self._reject(exc)
                raise
            nxt[key] = end
            vetted.append((event.id, (name, peer, end)))
        if len(self._validated) > _MAX_VALIDATED:  # only a refused batch leaves entries
            self._validated.clear()
        self._validated.update(vetted)

    def replay(self, event: Event) -> None:
        """Import a stored event at rehydration (it was vetted when ingested,
        or it is our own); malformed bodies still go through :meth:`apply`.
        Events a restored checkpoint covers are skipped."""
        if self._covered and event.seq <= self._covered.get(event.author, 0):
            self.replay_skipped += 1
            return
        body = event.body
        if event.kind != KIND_UPDATE or type(body) is not dict or len(body) != 2:
            self.apply(event)
            return
        name, blob = body.get("c"), body.get("u")
        peer = self._peers.get(event.author)
        if (
            type(blob) is not bytes
            or type(name) is not str
            or peer is None
            or (name not in self._docs and not CONTEXT_PATTERN.match(name))
        ):
            try:
                name, blob, peer = self._parse(event)
            except RemoteProtocolError as exc:
                self._reject(exc)
                return
        try:
            self._import(event, name, blob, peer, None)
        except RemoteProtocolError as exc:
            self._reject(exc)

    def replay_many(self, events: Sequence[Event]) -> None:
        """:meth:`replay` for every ``ctx.update`` among ``events`` (others are
        ignored), in their order: the rehydration hot path.

        Same outcome as calling :meth:`replay` on each; cheaper: a stored
        update of a known context by a known author is imported with no
        per-event bookkeeping, and where each author's next operation must
        start (:meth:`_check_order`'s table) is read back from the doc's
        version vector once per call, not from every import's status. An
        import that leaves operations pending, or any event off that path
        (a new context or author, our own update, a malformed body, a doc
        not yet detached), goes through :meth:`replay` itself.
        """
        kind = KIND_UPDATE
        covered = self._covered
        docs = self._docs
        peers = self._peers
        broken = self.broken
        slow = self.replay
        touched: dict[tuple[str, bytes], LoroDoc] = {}
        seen: set[int] = set()  # docs made ready (detached, committed) in this call
        # The run being imported: events of one author into one doc (a causal
        # replay hands on runs of one author). What the fast path checks once
        # per run (a known author, a context not broken, the doc ready) holds
        # while both stay the same; the slow path may change it, so it ends
        # the run.
        run_doc: LoroDoc | None = None
        run_author = b""
        imp: Any = None
        fast = pending = 0
        for ev in events:
            if ev.kind != kind:
                continue
            if covered and ev.seq <= covered.get(ev.author, 0):
                self.replay_skipped += 1
                continue
            body = ev.body
            if type(body) is not dict or len(body) != 2:
                slow(ev)
                run_doc = None
                continue
            try:
                name = body["c"]
                blob = body["u"]
                doc = docs[name]
            except (KeyError, TypeError):  # no such key or context; unhashable name
                doc = None
            if doc is None or type(name) is not str or type(blob) is not bytes:
                slow(ev)
                run_doc = None
                continue
            author = ev.author
            if doc is not run_doc or author is not run_author:
                if author not in peers or name in broken:
                    slow(ev)
                    run_doc = None
                    continue
                if id(doc) not in seen:
                    self._ready(doc)
                    seen.add(id(doc))
                touched[(name, author)] = doc
                run_doc, run_author, imp = doc, author, doc.import_
            try:
                status = imp(blob)
            except Exception:
                slow(ev)  # the full path says what was wrong (nothing was imported)
                run_doc = None
                continue
            except BaseException as exc:
                if type(exc) is not BaseException and not _is_panic(exc):
                    raise
                slow(ev)  # as above; a panic breaks the context there
                run_doc = None
                continue
            fast += 1
            if status.pending is not None:  # waits for dependencies: exact bookkeeping
                pending += 1
                self._advance(name, peers[author], author, status)
        own = self.author
        nxt = self._next
        for (name, author), doc in touched.items():
            peer = peers[author]
            last = doc.oplog_vv.get_last(peer)
            key = (name, peer)
            if last is not None and last >= nxt.get(key, 0):
                nxt[key] = last + 1
            if author == own and nxt.get(key, 0) > self._exported.get(name, 0):
                self._exported[name] = nxt[key]
        self.imports += fast
        self.imports_pending += pending
        self.applied += fast

    def _ready(self, doc: LoroDoc) -> None:
        """Prepare ``doc`` for imports: detached (see :meth:`_detach`) and,
        for our own operations coming back, committed."""
        if not doc.is_detached():
            self._detach(doc)
        elif self._peer is not None:
            doc.commit()

    def _advance(self, name: str, peer: int, author: bytes, status: Any) -> None:
        """Record an import of ``peer``'s operations into ``name`` from its
        ``status`` (the range applied, or else held pending)."""
        span = status.success.get(peer)
        if span is None and status.pending is not None:
            span = status.pending.get(peer)
        key = (name, peer)
        end = max(self._next.get(key, 0), span[1] if span else 0)
        if author == self.author:
            self._exported[name] = max(self._exported.get(name, 0), end)
        self._next[key] = end

    def _parse(self, event: Event) -> tuple[str, bytes, int]:
        body = event.body
        if type(body) is not dict or len(body) != 2 or "c" not in body or "u" not in body:
            raise DecodeError("ctx.update body must be {c, u}")
        name, blob = body["c"], body["u"]
        if type(name) is not str or not CONTEXT_PATTERN.match(name):
            raise InvalidName(f"bad context name {name!r:.80}")
        if type(blob) is not bytes:
            raise DecodeError("ctx.update u must be bytes")
        peer = self._peers.get(event.author)
        if peer is None:
            peer = self._peers[event.author] = peer_id_of(event.author)
        return name, blob, peer

    @staticmethod
    def _check_order(name: str, peer: int, start: int, nxt: dict[tuple[str, int], int]) -> None:
        expected = nxt.get((name, peer), 0)
        if start != expected:
            raise OpsOutOfOrder(f"update starts at op {start}, expected {expected}")

    def _import(self, event: Event, name: str, blob: bytes, peer: int, end: int | None) -> None:
        if name in self.broken:
            self.rejected[ContextBroken.code] += 1
            return
        doc = self._docs.get(name) or self._doc(name)
        own = event.author == self.author
        try:
            status = _loro_call(self._import_into, doc, blob, own)
        except _EnginePanic:
            self._break(name)
            raise
        self.imports += 1
        if status.pending is not None:
            self.imports_pending += 1
        if end is None:  # trusted replay: read the range from the import status
            self._advance(name, peer, event.author, status)
        else:
            if own:
                self._exported[name] = max(self._exported.get(name, 0), end)
            self._next[(name, peer)] = end
        self.applied += 1

    def _import_into(self, doc: LoroDoc, blob: bytes, own: bool) -> Any:
        if not doc.is_detached():
            self._detach(doc)
        if own:
            doc.commit()  # our own write coming back: already in the doc (or being rebuilt)
        return doc.import_(blob)

    # -- checkpoints --------------------------------------------------------------

    def checkpoint(self) -> dict[str, Any] | None:
        """The view's state as plain data (see the module docs), or ``None``
        while some doc holds operations that wait for their dependencies or
        local writes not yet exported to the journal, or a context is broken
        (a snapshot would lose the first and keep the second, which the
        journal does not hold)."""
        if self.broken:
            return None
        for (name, peer), end in self._next.items():
            last = self._docs[name].oplog_vv.get_last(peer)
            if end and (last is None or last < end - 1):
                return None
        if self._peer is not None:
            for name, doc in self._docs.items():
                doc.commit()
                last = doc.oplog_vv.get_last(self._peer)
                if last is not None and last >= self._exported.get(name, 0):
                    return None
        docs = {}
        for name in sorted(self._docs):
            doc = self._docs[name]
            doc.commit()
            docs[name] = doc.export(ExportMode.Snapshot())
        return {
            "docs": docs,
            "next": [[name, peer, end] for (name, peer), end in sorted(self._next.items())],
            "exported": dict(sorted(self._exported.items())),
            "applied": self.applied,
            "rejected": dict(sorted(self.rejected.items())),
        }

    def restore(self, state: Any, covered: dict[bytes, int]) -> None:
        """Load :meth:`checkpoint`'s ``state`` into this empty view; stored
        events of each author up to ``covered[author]`` are in it, and
        :meth:`replay` skips them. Raises :class:`~hivemesh.errors.DecodeError`
        (leaving the view empty) when the state is malformed."""
        if self._docs or self.applied:
            raise InvalidArgument("restore needs an empty context view")
        try:
            docs: dict[str, LoroDoc] = {}
            for name, snap in state["docs"].items():
                if type(name) is not str or not CONTEXT_PATTERN.match(name):
                    raise DecodeError(f"bad context name {name!r:.80}")
                doc = LoroDoc()  # type: ignore[no-untyped-call]
                if self._peer is not None:
                    doc.peer_id = self._peer
                _loro_call(doc.import_, snap)
                doc.detach()
                docs[name] = doc
            nxt = {(str(n), int(p)): int(e) for n, p, e in state["next"]}
            exported = {str(n): int(e) for n, e in state["exported"].items()}
            applied = int(state["applied"])
            rejected = {str(c): int(n) for c, n in state["rejected"].items()}
        except DecodeError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise DecodeError(f"malformed context checkpoint: {exc}") from None
        if any(name not in docs for name, _ in nxt) or any(n not in docs for n in exported):
            raise DecodeError("context checkpoint names a context it does not hold")
        self._docs, self._next, self._exported = docs, nxt, exported
        self.applied = applied
        self.rejected.update(rejected)
        self._covered = dict(covered)

    # -- inspection -------------------------------------------------------------

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """Every non-empty context as plain data.

        ``{context: {"kv": {...}, "list": {name: [...]}, "counter": {name: n},
        "text": {name: str}, "gset": {name: [sorted members]}, "orset": {name:
        [sorted members]}, "other": {"name:Type": value}}}``. Empty roots
        (``[]``, ``{}``, ``""``, ``0``) are left out, so a container that a
        replica merely opened is indistinguishable from one it never saw.
        """
        out: dict[str, dict[str, Any]] = {}
        for name in sorted(self._docs):
            if name in self.broken:
                continue
            self._attach(self._docs[name])
            snap = _doc_snapshot(self._docs[name])
            if snap:
                out[name] = snap
        return out

    def digest(self) -> bytes:
        """Hash of :meth:`snapshot`."""
        return state_digest("ctx", self.snapshot())


_ROOT_KINDS = {"List": "list", "Counter": "counter", "Text": "text"}


def _doc_snapshot(doc: LoroDoc) -> dict[str, Any]:
    doc.commit()
    snap: dict[str, Any] = {}
    entries: dict[str, Any] = doc.get_deep_value_with_id()  # type: ignore[assignment]
    for entry in entries.values():
        cid = str(entry["cid"])
        root, _, ctype = cid.removeprefix("cid:root-").rpartition(":")
        if ctype == "Map" and root == _KV_ROOT:
            value: Any = _deep(doc.get_map(root))
            section = None
        elif ctype == "Map" and root.startswith(GSET_PREFIX):
            value = gset_members(_deep(doc.get_map(root)))
            section, root = "gset", root.removeprefix(GSET_PREFIX)
        elif ctype == "Map" and root.startswith(ORSET_PREFIX):
            value = orset_members(_deep(doc.get_map(root)))
            section, root = "orset", root.removeprefix(ORSET_PREFIX)
        elif ctype == "List":
            value = _deep(doc.get_list(root))
            section = "list"
        elif ctype == "Counter":
            value = _number(doc.get_counter(root).value)
            section = "counter"
        elif ctype == "Text":
            value = doc.get_text(root).to_string()
            section = "text"
        else:
            value = entry["value"]
            section, root = "other", f"{root}:{ctype}"
        if value in ([], {}, "", 0) and not isinstance(value, bool):
            continue
        if section is None:
            snap[_KV_ROOT] = value
        else:
            snap.setdefault(section, {})[root] = value
    return snap
