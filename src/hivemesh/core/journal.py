"""The swarm journal: the union of every feed this node holds.

Theory of operation
-------------------
The journal is a grow-only set of events, partitioned by author into feeds.
Each feed is held as a contiguous prefix ``1..head.seq`` whose last event is
covered by a stored head signature. That single invariant gives:

* **replication is a CRDT by construction** -- merging is set union, and a
  *version vector* ``author -> head.seq`` summarises exactly what we hold;
* **exact anti-entropy** -- what a peer lacks is the range
  ``their_seq + 1 .. our_seq`` of each feed (:meth:`Journal.missing_for`);
* **cheap serving** -- any range can be served in chunks that end at a
  stored signed seq (:meth:`Journal.read_chunk`).

:meth:`Journal.ingest` is the one gate for remote input: it verifies (see
:mod:`hivemesh.core.feed`), holds back a batch stamped beyond the receiver's
clock bound (:class:`~hivemesh.errors.ClockAhead`; neither stored nor applied,
see :mod:`hivemesh.core.deferral`), lets views that validate content vet the batch
(a context update carrying another author's operations is refused here, so
it is never stored and the author's feed stops at that point, on every
replica alike), persists atomically, then applies to the views. It stores
nothing that fails and raises a :class:`~hivemesh.errors.RemoteProtocolError`
for the caller to count.

Views receive each event exactly once, in per-author seq order, with an
arbitrary interleaving across authors; they must be order-independent.

Attested runs (deferred head signatures)
----------------------------------------
An Ed25519 verify costs about 100 us here, more than everything else a
receiver does with a one-event batch. A batch that arrives *from its author
itself*, over a channel whose handshake proved the author's key, is already
authenticated: the signature adds only transferability (third parties can
check it). ``ingest(..., attested=True)`` therefore checks everything but the
signature, applies the batch to the views at once and keeps it, with its
signature, in the author's *unsettled run* in memory. :meth:`Journal.settle`
(the runtime's group commit, every few ms) verifies only the **last**
signature of each run -- it covers the whole hash chain, the run included --
and hands the run to the store as one batch under that signature. So:

* nothing unverified is ever stored or served: reads of an author's feed
  (:meth:`read_chunk`, replay checks) settle that author first, and a
  non-attested batch settles the run it extends before it is verified;
* a run never outgrows what one served chunk may hold (it is settled early);
* a batch that holds an event of a *watched* kind (:meth:`Journal.watch`:
  kinds the node witnesses, :mod:`hivemesh.core.witness`) is verified at
  once, after the run it extends: a witness must never vouch for an event
  whose signature might still fail;
* a crash loses at most the unsettled runs, which anti-entropy pulls again
  (the author holds them durably), exactly like the store's pending group;
* a run whose signature fails can only come from a faulty author (the
  channel proved who sent it): the run is dropped, the feed goes back to its
  last verified head, ``bad_signature`` is counted and the author is refused
  (:attr:`Journal.faulty`) until restart. Views have already seen the run,
  as they would see an author that signs two versions of its feed; a
  restart rebuilds them from the store, which never held it.
"""

from __future__ import annotations

import bisect
import contextlib
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Protocol

from hivemesh.core.codec import MAX_BATCH_EVENTS, MAX_FRAME_BYTES
from hivemesh.core.event import Event, decode_event, event_hash
from hivemesh.core.feed import Head, head_message, verify_batch
from hivemesh.core.hlc import MAX_DRIFT_MS, hlc_ms
from hivemesh.core.identity import verify
from hivemesh.core.store import FeedStore
from hivemesh.errors import (
    BadSignature,
    ClockAhead,
    DecodeError,
    ForkError,
    ReplayError,
    UntrustedAuthor,
)

__all__ = ["Journal", "View"]

#: Internal key for views of every kind ("" is never a valid event kind).
_ALL = ""
#: Bytes of frame overhead we keep free when sizing a chunk.
_CHUNK_SLACK = 4096
#: Largest unsettled run in event bytes (it must fit one served chunk).
_RUN_MAX_BYTES = MAX_FRAME_BYTES - _CHUNK_SLACK
_hlc_of = attrgetter("hlc")
_kind_of = attrgetter("kind")


@dataclass(slots=True)
class _Run:
    """Attested batches of one author whose head signature is not yet checked."""

    base: Head  # the verified head the run extends
    events: list[Event]
    sig: bytes  # the author's signature over ``events[-1]``
    nbytes: int


class View(Protocol):
    """A deterministic reducer over journal events."""

    kinds: frozenset[str]

    def apply(self, event: Event) -> None:
        """Fold one event in. Must not raise on bad bodies (count them)."""


class Journal:
    """Feeds held by this node, with verification, persistence and views."""

    def __init__(
        self,
        store: FeedStore,
        *,
        trusted: Callable[[bytes], bool] | None = None,
    ) -> None:
        self.store = store
        self.trusted = trusted
        self.heads: dict[bytes, Head] = {}
        self._signed: dict[bytes, list[int]] = {}
        self._views: dict[str, list[View]] = {}
        self._all_views: list[View] = []
        self._validators: list[Any] = []
        self._apply_fns: dict[str, list[Callable[[Event], None]]] = {}
        self._replay_fns: dict[str, list[Callable[[Event], None]]] = {}
        self._replay_many: list[Callable[[Sequence[Event]], None]] = []
        self.counters: Counter[str] = Counter()
        self.total_events = 0
        self._runs: dict[bytes, _Run] = {}
        #: Authors whose attested head signature failed (refused until restart).
        self.faulty: set[bytes] = set()
        #: The HLC to advance the clock past after the last batch ingested:
        #: its last event's (its largest, when an event lay beyond the bound).
        self.top_hlc = 0
        #: Kinds :meth:`watch` was asked for (never applied unverified).
        self.watched: frozenset[str] = frozenset()
        for author, (seq, h) in store.heads().items():
            self.heads[author] = Head(seq, h)
            self._signed[author] = store.signed_seqs(author)
            self.total_events += seq

    # -- views ---------------------------------------------------------------

    def add_view(self, view: View) -> None:
        """Register ``view`` for its event kinds (``"*"`` means every kind).

        A view with a ``validate_batch(events)`` method also vets remote
        batches *before* they are stored (see :meth:`ingest`), and a view
        with a ``replay(event)`` method is fed stored events through it when
        the node rehydrates (it may skip checks its validation already made);
        one with ``replay_many(events)`` takes each replayed list whole
        instead (it picks out its kinds itself, keeping their order).
        """
        self._all_views.append(view)
        replay = getattr(view, "replay", view.apply)
        many = getattr(view, "replay_many", None) if "*" not in view.kinds else None
        if many is not None:
            self._replay_many.append(many)
        for kind in sorted(view.kinds):
            key = _ALL if kind == "*" else kind
            self._views.setdefault(key, []).append(view)
            self._apply_fns.setdefault(key, []).append(view.apply)
            if many is None:
                self._replay_fns.setdefault(key, []).append(replay)
        if hasattr(view, "validate_batch"):
            self._validators.append(view)

    def watch(self, kinds: Iterable[str], fn: Callable[[Event], None]) -> None:
        """Call ``fn`` for every event of ``kinds`` applied from now on (ingested
        or our own; not replayed). An attested batch that holds such an event
        is verified before it is applied, so ``fn`` never sees an event whose
        signature may still fail (the node witnesses them: core.witness)."""
        for kind in sorted(set(kinds)):
            self._apply_fns.setdefault(kind, []).append(fn)
        self.watched = self.watched | frozenset(kinds)

    def apply_to_views(self, events: Iterable[Event], *, replay: bool = False) -> None:
        """Fold events into the registered views (ingest, own appends, replay)."""
        if replay and self._replay_many:
            if not isinstance(events, (list, tuple)):
                events = list(events)
            for many in self._replay_many:
                many(events)
        fns = self._replay_fns if replay else self._apply_fns
        star = self._apply_fns.get(_ALL, ())
        if not star:  # the common case: a membership test per event, no call
            for ev in events:
                if ev.kind in fns:
                    for fn in fns[ev.kind]:
                        fn(ev)
            return
        get = fns.get
        for ev in events:
            for fn in get(ev.kind, ()):
                fn(ev)
            for fn in star:
                fn(ev)

    # -- reading -------------------------------------------------------------

    def head(self, author: bytes) -> Head:
        """The head we hold for ``author`` (seq 0 if none)."""
        return self.heads.get(author) or Head()

    def version_vector(self) -> dict[bytes, int]:
        """``author -> last seq`` for every feed we hold."""
        return {a: h.seq for a, h in self.heads.items()}

    def missing_for(self, vv: dict[bytes, int]) -> list[tuple[bytes, int, int]]:
        """Ranges ``(author, start, end)`` we hold and a peer with ``vv`` lacks."""
        out = []
        for author in sorted(self.heads):
            ours = self.heads[author].seq
            theirs = vv.get(author, 0)
            if ours > theirs:
                out.append((author, theirs + 1, ours))
        return out

    def read_chunk(self, author: bytes, start: int, end: int) -> tuple[list[bytes], bytes] | None:
        """Events ``start..k`` of ``author`` with ``k <= end`` a signed seq, and
        the signature over ``k``; at most :data:`MAX_BATCH_EVENTS` events and
        about one frame of bytes. None when nothing servable starts at ``start``.
        """
        if author in self._runs:
            self._settle_one(author)
        signed = self._signed.get(author)
        head = self.heads.get(author)
        if not signed or head is None or start > head.seq:
            return None
        end = min(end, head.seq)
        # Smallest signed seq >= end (we must end at a signed seq; go past
        # `end` rather than stop short of it), capped by the batch limit.
        i = bisect.bisect_left(signed, end)
        if i == len(signed):
            return None
        stop = signed[i]
        if stop - start + 1 > MAX_BATCH_EVENTS:
            j = bisect.bisect_right(signed, start + MAX_BATCH_EVENTS - 1) - 1
            if j < 0 or signed[j] < start:
                return None
            stop = signed[j]
        raws = self.store.read_range(author, start, stop)
        size = sum(len(r) for r in raws)
        while size > MAX_FRAME_BYTES - _CHUNK_SLACK:
            j = bisect.bisect_left(signed, stop) - 1
            if j < 0 or signed[j] < start:
                return None
            stop = signed[j]
            raws = raws[: stop - start + 1]
            size = sum(len(r) for r in raws)
        sig = self.store.signature(author, stop)
        if sig is None:  # pragma: no cover - store invariant
            return None
        return raws, sig

    def withhold_signature(self, author: bytes, seq: int) -> bool:
        """Never serve the stored signature over ``author``'s ``seq`` again: an
        audit found it damaged (:func:`hivemesh.stores.replay.audit_signatures`).

        The events it covers stay: a later verified signature covers them
        through the hash chain. :meth:`read_chunk` ends chunks at the other
        signed seqs only, so a peer is never handed a batch it would refuse
        (a range with no other signed seq within the batch limit is not
        served; peers fetch it elsewhere). The feed's head signature is never
        withheld. Returns False if ``seq`` was not a served signed seq."""
        signed = self._signed.get(author)
        head = self.heads.get(author)
        if not signed or head is None or seq == head.seq:
            return False
        i = bisect.bisect_left(signed, seq)
        if i == len(signed) or signed[i] != seq:
            return False
        del signed[i]
        return True

    # -- writing -------------------------------------------------------------

    def ingest(
        self,
        author: bytes,
        raws: Sequence[bytes],
        sig: bytes,
        *,
        attested: bool = False,
        horizon: int | None = None,
    ) -> list[Event]:
        """Verify, persist and apply a signed batch from a peer.

        Returns the events that were new. Raises ReplayError when every event
        was already held, GapError when the batch does not reach our head, and
        the other RemoteProtocolErrors of :func:`verify_batch` for bad input.
        ``attested=True`` means the caller received the batch from ``author``
        itself over an authenticated channel: its signature is checked later,
        by :meth:`settle` (module docs).
        ``horizon`` is the largest plausible HLC (the clock bound,
        :func:`hivemesh.core.hlc.horizon`): a valid batch that carries a larger
        one is neither stored nor applied; :class:`~hivemesh.errors.ClockAhead`
        tells the caller when it becomes plausible (see
        :mod:`hivemesh.core.deferral`).
        """
        if type(author) is not bytes or len(author) != 32:
            raise DecodeError("author must be 32 bytes")
        if type(sig) is not bytes or len(sig) != 64:
            raise DecodeError("signature must be 64 bytes")
        if not raws or type(raws) is not list:
            raise DecodeError("empty or malformed batch")
        if self.trusted is not None and not self.trusted(author):
            raise UntrustedAuthor(f"author {author.hex()[:12]} is not trusted")
        if author in self.faulty:
            raise BadSignature(f"author {author.hex()[:12]} sent an invalid head signature")
        for raw in raws:
            if type(raw) is not bytes:
                raise DecodeError("event must be bytes")
        run = self._runs.get(author)
        if run is not None and (
            not attested
            or len(run.events) + len(raws) > MAX_BATCH_EVENTS
            or run.nbytes + sum(map(len, raws)) > _RUN_MAX_BYTES
        ):
            if not self._settle_one(author):  # the batch chained onto a dropped run
                raise BadSignature(f"author {author.hex()[:12]} sent an invalid head signature")
            run = None
        head = self.heads.get(author) or Head()
        # Fast path for the common gossip duplicate: peek at the last event.
        last = decode_event(raws[-1])
        if last.seq <= head.seq:
            self._check_replay(author, last, sig)
        events: list[Event] | None = None
        top = last.hlc
        if horizon is not None and top <= horizon:
            # The bound rides on decoding: no per-event cost (core.event). An
            # earlier event beyond it: verify the batch in full, then defer.
            with contextlib.suppress(ClockAhead):
                events = verify_batch(
                    author, raws, sig, head, last=last, check_sig=not attested, max_hlc=horizon
                )
        if events is None:
            events = verify_batch(author, raws, sig, head, last=last, check_sig=not attested)
            if horizon is not None:
                top = max(map(_hlc_of, events))
        self.top_hlc = top
        if attested and self.watched and self._holds_watched(events):
            if run is not None:  # verify this batch now, after the run it extends
                if not self._settle_one(author):
                    raise BadSignature(f"author {author.hex()[:12]} sent an invalid head signature")
                run = None
            if not verify(author, sig, head_message(author, last.seq, last.id)):
                raise BadSignature(f"head signature for #{last.seq} does not verify")
            attested = False
        if horizon is not None and top > horizon:
            self._defer(author, events, sig, top, horizon, checked=not attested)
        for validator in self._validators:
            validator.validate_batch(events)
        if not attested:
            self._commit(author, events, sig, durable=False)  # the author holds it too
            return events
        if run is None:
            run = self._runs[author] = _Run(head, [], sig, 0)
        run.events.extend(events)
        run.sig = sig
        run.nbytes += sum(len(e.raw) for e in events)
        self.heads[author] = Head(last.seq, last.id)
        self.total_events += len(events)
        self.apply_to_views(events)
        return events

    def _holds_watched(self, events: list[Event]) -> bool:
        if len(events) == 1:
            return events[0].kind in self.watched
        return not self.watched.isdisjoint(map(_kind_of, events))

    def _defer(
        self,
        author: bytes,
        events: list[Event],
        sig: bytes,
        top: int,
        horizon: int,
        *,
        checked: bool,
    ) -> None:
        """Refuse, for now, a batch that carries an HLC beyond ``horizon``."""
        last = events[-1]
        if not checked and not verify(author, sig, head_message(author, last.seq, last.id)):
            raise BadSignature(f"head signature for #{last.seq} does not verify")
        seq = next(e.seq for e in events if e.hlc > horizon)
        release_ms = hlc_ms(top) - MAX_DRIFT_MS
        raise ClockAhead(
            f"author {author.hex()[:12]} #{seq} is {hlc_ms(top) - hlc_ms(horizon)} ms "
            "beyond the clock bound",
            hlc=top,
            seq=seq,
            release_ms=release_ms,
        )

    @property
    def unsettled(self) -> int:
        """Events applied from attested runs whose signature is not yet checked."""
        runs = self._runs
        return sum(len(r.events) for r in runs.values()) if runs else 0

    def settle(self) -> list[bytes]:
        """Check every unsettled run's head signature and store the good ones
        (``durable=False``); returns the authors whose signature failed."""
        return [a for a in sorted(self._runs) if not self._settle_one(a)]

    def _settle_one(self, author: bytes) -> bool:
        run = self._runs[author]
        last = run.events[-1]
        if verify(author, run.sig, head_message(author, last.seq, last.id)):
            self.store.append(author, run.events, run.sig, durable=False)  # may raise: kept
            del self._runs[author]
            self._signed.setdefault(author, []).append(last.seq)
            return True
        del self._runs[author]
        if run.base.seq:
            self.heads[author] = run.base
        else:
            self.heads.pop(author, None)
        self.total_events -= len(run.events)
        self.faulty.add(author)
        self.counters[BadSignature.code] += 1
        self.counters["attested_events_dropped"] += len(run.events)
        return False

    def _check_replay(self, author: bytes, last: Event, sig: bytes) -> None:
        run = self._runs.get(author)
        if run is not None and last.seq >= run.events[0].seq:
            held_id: bytes | None = run.events[last.seq - run.events[0].seq].id
        else:
            held = self.store.read_range(author, last.seq, last.seq)
            held_id = event_hash(held[0]) if held else None
        if held_id == last.id:
            raise ReplayError(f"#{last.seq} already held")
        if verify(author, sig, head_message(author, last.seq, last.id)):
            raise ForkError(f"author {author.hex()[:12]} signed two events at #{last.seq}")
        raise BadSignature("old event with an invalid signature")

    def append_own(self, events: Sequence[Event], sig: bytes) -> None:
        """Persist and apply our own freshly sealed events (already trusted)."""
        self._commit(events[0].author, events, sig)

    def _commit(
        self, author: bytes, events: Sequence[Event], sig: bytes, *, durable: bool = True
    ) -> None:
        self.store.append(author, events, sig, durable=durable)
        last = events[-1]
        self.heads[author] = Head(last.seq, last.id)
        self._signed.setdefault(author, []).append(last.seq)
        self.total_events += len(events)
        self.apply_to_views(events)
