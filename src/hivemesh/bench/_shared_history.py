"""A multi-author shared-context history, as real nodes write it.

Used by ``hivemesh bench rehydrate`` (its shared-document workload) and by
the rehydration tests. ``authors`` writers share one context. Each turn one
writer catches up with what the others sent (all of it but for a random
lag of a few updates, as replication delivers it), its clock observing their
timestamps as a node's does at ingest, then writes a run of 1-8 updates,
each its own ``ctx.update`` event (a map set or a counter increment;
concurrent list appends would make the writers themselves quadratic), and
seals its feed into a signed batch once it holds enough unsealed events
(``batch``: 1 seals every run), which sends them. The result is a journal
whose ``(hlc, author)`` order is causal and whose per-feed order is not.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from loro import CounterSpan, ExportMode, IdSpan, LoroDoc

from hivemesh.core.event import Event
from hivemesh.core.feed import FeedWriter, Head
from hivemesh.core.hlc import HLC
from hivemesh.core.identity import Identity
from hivemesh.core.views import MaxRegisterView, NamesView
from hivemesh.core.views.context import KIND_UPDATE, peer_id_of

__all__ = ["CONTEXT", "SharedBatch", "shared_history"]

#: The context every writer shares.
CONTEXT = "shared"


@dataclass(slots=True)
class _Writer:
    feed: FeedWriter
    doc: LoroDoc
    peer: int
    seen: int = 0  # events of the global sequence caught up with
    exported: int = 0  # own operations exported so far
    unsent: list[tuple[bytes, int]] = field(default_factory=list)  # (update, hlc) unsealed


#: One signed batch: ``(author, events, signature)``.
SharedBatch = tuple[bytes, list[Event], bytes]


def shared_history(
    updates: int, authors: int = 5, seed: int = 1, *, others: float = 0.0, batch: int = 1
) -> Iterator[SharedBatch]:
    """Yield the signed batches of ``updates`` context updates from
    ``authors`` writers (see the module docstring), in writing order. With
    ``others`` > 0, about that share of the events are of other views' kinds
    instead (name claims and releases, register raises, chat lines). A
    writer seals its feed once it holds ``batch`` unsealed events or more
    (a node's group commit), and only then do the others see them.

    Each writer edits a plain loro doc under its author's peer id
    (:func:`~hivemesh.core.views.context.peer_id_of`) and exports only its
    own operations, as :class:`~hivemesh.core.views.ContextView` does."""
    rng = random.Random(f"{seed}/shared")
    writers = []
    for _ in range(authors):
        identity = Identity.from_seed(rng.randbytes(32))
        doc = LoroDoc()  # type: ignore[no-untyped-call]
        doc.peer_id = peer = peer_id_of(identity.public)
        writers.append(_Writer(FeedWriter(identity, Head(), HLC()), doc, peer))
    log: list[tuple[int, bytes, int]] = []  # (writer, update, hlc), in writing order
    now_ms = 1_800_000_000_000
    written = 0
    while written < updates:
        k = rng.randrange(authors)
        w = writers[k]
        upto = max(w.seen, len(log) - rng.randrange(0, 12))
        news = [(u, h) for j, u, h in log[w.seen : upto] if j != k]
        w.seen = upto
        if news:  # replication: the others' updates reach this writer
            w.doc.import_batch([u for u, _ in news])
            now_ms += 1
            w.feed.clock.observe(max(h for _, h in news), now_ms)
        for _ in range(min(rng.randrange(1, 9), updates - written)):
            now_ms += rng.randrange(2)
            if rng.random() < others:
                w.feed.append(*_other(rng, written), now_ms)
                written += 1
                continue
            if rng.random() < 0.95:
                w.doc.get_map("kv").insert(f"k{rng.randrange(64)}", written)
            else:
                w.doc.get_counter("n").increment(1)
            w.doc.commit()
            end = w.exported + 1
            span = IdSpan(w.peer, CounterSpan(w.exported, end))
            update = w.doc.export(ExportMode.UpdatesInRange([span]))
            w.exported = end
            ev = w.feed.append(KIND_UPDATE, {"c": CONTEXT, "u": update}, now_ms)
            w.unsent.append((update, ev.hlc))
            written += 1
        if w.feed.unsealed >= batch or written >= updates:
            yield from _seal(k, w, log)
    for k, w in enumerate(writers):
        yield from _seal(k, w, log)


def _seal(k: int, w: _Writer, log: list[tuple[int, bytes, int]]) -> Iterator[SharedBatch]:
    sealed = w.feed.seal()
    if sealed is not None:
        yield w.feed.identity.public, sealed[0], sealed[1]
    log.extend((k, u, h) for u, h in w.unsent)  # sent: the others may now see them
    w.unsent.clear()


def _other(rng: random.Random, i: int) -> tuple[str, Any]:
    r = rng.random()
    if r < 0.3:
        return NamesView.claim(f"n{rng.randrange(6)}")
    if r < 0.4:
        return NamesView.release(f"n{rng.randrange(6)}")
    if r < 0.7:
        return MaxRegisterView.encode(f"r{rng.randrange(4)}", rng.randrange(1000))
    return "chat.line", {"text": f"line {i}"}
