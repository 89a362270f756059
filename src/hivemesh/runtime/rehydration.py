"""The daemon's start-up replay: checkpoint, causal replay in slices, progress.

Theory of operation
-------------------
:meth:`Rehydration.run` rebuilds the views of a starting daemon:

1. **Checkpoint.** The view checkpoint beside the store
   (:mod:`hivemesh.stores.viewcheckpoint`) is loaded and checked against the
   store; if it is usable the context view starts from it and skips the
   events it covers. One that is unusable is logged as a warning with its
   reason, counted (``view_checkpoint_ignored`` and
   ``view_checkpoint_ignored_<reason>``) and left aside: everything is
   replayed.
2. **Replay.** Every stored event is verified and applied in causal order
   (:func:`~hivemesh.stores.replay.verify_causal`), in slices of at most
   :data:`SLICE_EVENTS` events or :data:`SLICE_S` seconds, with a return to
   the event loop between slices: the control socket is already open and
   answers meanwhile. :attr:`Rehydration.done` / :attr:`Rehydration.total`
   say how far it is (``status`` shows ``rehydrating: {done, total}``).
   Control operations other than ``status`` wait, within their own
   deadline, until the daemon finished starting (:meth:`Rehydration.wait`;
   the daemon calls :meth:`Rehydration.complete` once links, membership and
   messaging exist too).
   The replay verifies each feed's whole hash chain and only its head
   signature (``signatures="head"``: the chain carries the head's signature
   to every earlier event; the argument is in :mod:`hivemesh.stores.replay`,
   "Head signatures"). Counted: ``rehydrate_signatures_verified`` and
   ``rehydrate_signatures_covered``. A store that fails verification raises
   :class:`~hivemesh.errors.StoreCorrupt` (the daemon does not start), counted
   as ``rehydrate_store_corrupt`` first.
3. **Signature audit.** The signatures the replay did not verify are then
   verified in a worker thread (:func:`~hivemesh.stores.replay.audit_signatures`;
   libsodium releases the GIL), off the event loop and after the views are
   complete. They make no event more or less authentic, but the node serves
   them to peers: each damaged one is logged as an error, counted
   (``store_signature_invalid``) and withheld from serving
   (:meth:`~hivemesh.core.journal.Journal.withhold_signature`).
   ``status`` shows the audit's state (``signature_audit``).
4. **New checkpoint.** When the context view imported more than
   :data:`~hivemesh.stores.viewcheckpoint.TAIL_EVENTS` events, a checkpoint
   is written at once, so the next start skips them.

The daemon also writes one at a clean stop (:meth:`Rehydration.save`).
Nothing here touches the network: links are opened only after the views are
complete, so no remote batch is vetted against half-built views.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from hivemesh.core.event import Event
from hivemesh.errors import HivemeshError, StoreCorrupt, ViewCheckpointInvalid
from hivemesh.runtime.clock import now_ms
from hivemesh.stores import viewcheckpoint
from hivemesh.stores.replay import DeferredSig, SigTally, audit_signatures, verify_causal

if TYPE_CHECKING:
    from hivemesh.runtime.daemon import Daemon

__all__ = [
    "SLICE_EVENTS",
    "SLICE_S",
    "Rehydration",
    "gc_paused",
    "replay_events",
    "replay_slices",
]

log = logging.getLogger("hivemesh.runtime")

#: Events applied between two returns to the event loop, at most.
SLICE_EVENTS = 512
#: Time spent applying events between two returns to the event loop, about.
SLICE_S = 0.02


def replay_events(store: Any, tally: SigTally | None = None) -> Iterator[Event]:
    """Every stored event, verified (chains, head signatures), in causal
    order (flattened :func:`~hivemesh.stores.replay.verify_causal`)."""
    for run in verify_causal(store, "head", tally):
        yield from run


def replay_slices(
    store: Any, size: int = SLICE_EVENTS, tally: SigTally | None = None
) -> Iterator[list[Event]]:
    """:func:`replay_events` in lists of ``size`` events (the last may be
    shorter): the causal runs joined, so views take many events per call
    (:meth:`~hivemesh.core.views.ContextView.replay_many`)."""
    out: list[Event] = []
    for run in verify_causal(store, "head", tally):
        out += run
        if len(out) >= size:
            while len(out) >= size:
                yield out[:size]
                out = out[size:]
    if out:
        yield out


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off for the block (back as it was after).

    A replay allocates millions of objects that reference counting frees
    (events, bodies, lists: no cycles), and the collector's passes over a
    growing heap cost ~2% of a shared-document replay for nothing (callgrind,
    20,000 updates). The daemon collects and freezes its heap once it is
    up anyway."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class Rehydration:
    """Progress and outcome of one daemon's rehydration."""

    def __init__(self, daemon: Daemon) -> None:
        self.d = daemon
        #: Events applied so far, and stored events in all.
        self.done = 0
        self.total = 0
        #: ``"none"``, ``"loaded"`` or ``"ignored: <why>"``.
        self.checkpoint = "none"
        self.seconds = 0.0
        #: Signatures verified by the replay, and those the chain covered.
        self.signatures_verified = 0
        self.signatures_covered = 0
        #: ``"none"``, ``"running"``, ``"ok"`` or ``"<n> damaged"``.
        self.audit = "none"
        self._running = False
        self._complete = asyncio.Event()

    @property
    def running(self) -> bool:
        """True while the replay runs (the views are incomplete)."""
        return self._running

    @property
    def is_complete(self) -> bool:
        """True once the daemon finished starting (:meth:`complete`)."""
        return self._complete.is_set()

    def complete(self) -> None:
        """The daemon finished starting: operations waiting in :meth:`wait` go on."""
        self._complete.set()

    def progress(self) -> dict[str, int]:
        """``{"done": n, "total": m}`` for ``status``."""
        return {"done": self.done, "total": self.total}

    def snapshot(self) -> dict[str, Any]:
        """What ``status`` shows about the last rehydration."""
        ctx = self.d.context_view
        return {
            "events": self.done,
            "seconds": round(self.seconds, 3),
            "checkpoint": self.checkpoint,
            "ctx_imports": ctx.imports,
            "ctx_imports_pending": ctx.imports_pending,
            "ctx_skipped": ctx.replay_skipped,
            "signatures_verified": self.signatures_verified,
            "signatures_covered": self.signatures_covered,
            "signature_audit": self.audit,
        }

    async def wait(self) -> None:
        """Return once the daemon finished starting, its views complete (at
        once if it has). Control operations other than ``status`` call it."""
        if not self._complete.is_set():
            await self._complete.wait()

    async def run(self, store: Any) -> int:
        """Rebuild the views (see the module docs); returns events replayed."""
        d = self.d
        self._running = True
        t0 = time.perf_counter()
        try:
            self.total = d.node.journal.total_events
            self._restore(store)
            n = 0
            tally = SigTally()
            slices = replay_slices(store, tally=tally)
            try:
                with gc_paused():
                    n = await self._replay(slices)
            except StoreCorrupt:
                d.counters["rehydrate_store_corrupt"] += 1
                raise
            self.seconds = time.perf_counter() - t0
            self.signatures_verified = tally.verified
            self.signatures_covered = tally.covered
            d.counters["rehydrate_signatures_verified"] += tally.verified
            d.counters["rehydrate_signatures_covered"] += tally.covered
            if tally.deferred:
                self.audit = "running"
                where = f"{getattr(store, 'path', '')}: " if getattr(store, "path", "") else ""
                d.supervisor.spawn_once("signature_audit", self._audit(tally.deferred, where))
            if d.context_view.imports > viewcheckpoint.TAIL_EVENTS:
                self.save()
            return n
        finally:
            self._running = False

    async def _replay(self, slices: Iterator[list[Event]]) -> int:
        """Apply ``slices`` into the Peer, returning to the event loop every
        :data:`SLICE_S` seconds or so."""
        d = self.d
        n = 0
        while True:
            deadline = time.perf_counter() + SLICE_S
            while time.perf_counter() < deadline:
                chunk = next(slices, None)
                if chunk is None:
                    return n
                n += d.peer.rehydrate(chunk, now_ms())
                self.done = n
            await asyncio.sleep(0)  # the control socket answers meanwhile

    async def _audit(self, deferred: list[DeferredSig], where: str) -> None:
        """Verify the signatures the replay left aside, in a worker thread
        (see the module docs, step 3)."""
        d = self.d
        bad = await asyncio.to_thread(audit_signatures, deferred, where)
        d.counters["store_signatures_audited"] += len(deferred)
        for (author, seq, _h, _sig), exc in bad:
            d.counters["store_signature_invalid"] += 1
            withheld = d.node.journal.withhold_signature(author, seq)
            log.error("%s (events are intact; %s)", exc, "not served" if withheld else "kept")
        self.audit = f"{len(bad)} damaged" if bad else "ok"

    def _restore(self, store: Any) -> None:
        d = self.d
        path = viewcheckpoint.checkpoint_path(d.config.store_path)
        try:
            ckpt = viewcheckpoint.load(path, d.identity.public, store)
            if ckpt is None:
                return
            d.context_view.restore(ckpt.views.get("ctx"), ckpt.covered)
        except (ViewCheckpointInvalid, HivemeshError) as exc:
            if not isinstance(exc, ViewCheckpointInvalid):
                exc = ViewCheckpointInvalid(f"malformed context state: {exc}", "format")
            self.checkpoint = f"ignored: {exc}"
            d.counters["view_checkpoint_ignored"] += 1
            d.counters[f"view_checkpoint_ignored_{exc.reason}"] += 1
            log.warning("view checkpoint %s not used (%s): replaying the whole journal", path, exc)
            return
        self.checkpoint = "loaded"
        d.counters["view_checkpoint_loaded"] += 1

    def save(self) -> bool:
        """Write a checkpoint of the views as they stand, covering the
        journal's heads; False (counted) when the views cannot give one or
        the write fails. The caller makes sure the views hold exactly the
        stored events (after a replay, or at a clean stop once settled)."""
        d = self.d
        state = d.context_view.checkpoint()
        if state is None:
            d.counters["view_checkpoint_skipped"] += 1
            return False
        heads = {a: (h.seq, h.hash) for a, h in d.node.journal.heads.items() if h.seq}
        path = viewcheckpoint.checkpoint_path(d.config.store_path)
        try:
            viewcheckpoint.save(path, d.identity.public, heads, {"ctx": state})
        except OSError as exc:
            d.counters["view_checkpoint_write_failed"] += 1
            log.warning("view checkpoint %s not written: %s", path, exc)
            return False
        d.counters["view_checkpoint_saved"] += 1
        return True
