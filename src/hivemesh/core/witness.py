"""Witnesses: when other nodes first saw an event, written into the journal.

Theory of operation
-------------------
An event's HLC is its author's word. Where the *earliest* record wins -- a
name, a claim, a plan task's claim and result, the lease voter set -- that
word is not enough: a trusted peer could stamp its ``name.claim`` ``hlc=1``
and own every name. So receivers testify, in their own feeds.

**Witnessing.** Views that order records by time declare the kinds they
need witnessed (``witnessed_kinds``). When a node applies another author's
event of such a kind, it appends in the same step (before anyone can query
its views) one ``witness`` event ``{"c": [[author, seq], ...]}`` of its own:
"I held ``author``'s feed up to ``seq``", stamped with its own clock. One
witness covers every author of one received batch; an event some other
node has witnessed already is not witnessed again. Replayed events are never
witnessed: a restart does not testify again to what it saw before.

**Ordering.** The *first witness* of event ``s`` of author ``a`` is the
smallest HLC of a ``witness`` by an author other than ``a`` that covers
``a`` up to a seq ``>= s`` (:meth:`WitnessIndex.first_seen`). A view orders
such a record by::

    order_hlc = max(hlc, first_witness - window)

or by its own ``hlc`` while nobody has witnessed it (:meth:`WitnessIndex.order`).

* *From the journal alone.* Same events, same order, on every replica,
  whatever the arrival order (the index keeps the minimum per seq).
* *Monotone.* More witnesses only lower the first witness, so a record only
  moves earlier, never before its own ``hlc``: a late joiner, or a node back
  from a partition, that witnesses old records late does not reorder them.
* *Honest records keep their own time.* An honest record is witnessed within
  the propagation delay plus clock skew, less than ``window``.
* *Backdating buys at most* ``window``. A record first seen by an honest
  node at time ``T`` is ordered no earlier than ``T - window`` (less that
  node's clock skew), so it cannot beat an honest record made and witnessed
  more than ``window`` before ``T``.
* *Visible.* A record ordered after its own ``hlc`` was backdated (or unseen
  for longer than ``window``, e.g. written alone in a partition); views
  report those that lost what their own timestamp would have won.

Why not also refuse a feed whose HLC goes backwards (a rule on the feed
alone, like the foreign-operations rule)? It would not stop a liar that
stamps its whole feed early, which witnesses handle anyway; and it would
freeze the feed of an honest node that an older version left stamped far
ahead (it rehydrated a far-future event and wrote past it): such a node must
be able to continue with sane stamps (:meth:`hivemesh.core.hlc.HLC.restore`).

Limits (see docs/threat-model.md): a swarm whose only other witness is the
attacker cannot tell its word from the honest one's; colluding trusted peers
can witness each other's backdated records early; records stored before this
rule existed carry no witness and keep their own ``hlc``.
"""

from __future__ import annotations

import bisect
from collections import Counter
from typing import Any

from hivemesh.core.event import Event
from hivemesh.core.hlc import LOGICAL_BITS
from hivemesh.errors import DecodeError

__all__ = ["KIND_WITNESS", "MAX_COVER", "WitnessIndex", "witness_bodies"]

KIND_WITNESS = "witness"
#: Most ``[author, seq]`` pairs in one witness event.
MAX_COVER = 1024


def witness_bodies(cover: dict[bytes, int]) -> list[dict[str, Any]]:
    """The bodies of the witness events covering ``author -> seq``, sorted."""
    pairs = [[a, cover[a]] for a in sorted(cover)]
    return [{"c": pairs[i : i + MAX_COVER]} for i in range(0, len(pairs), MAX_COVER)]


def _parse(body: Any) -> list[tuple[bytes, int]]:
    pairs = body.get("c") if type(body) is dict and len(body) == 1 else None
    if type(pairs) is not list or not 0 < len(pairs) <= MAX_COVER:
        raise DecodeError("witness body must be {c: [[author, seq], ...]}")
    out = []
    for p in pairs:
        if not (
            type(p) is list
            and len(p) == 2
            and type(p[0]) is bytes
            and len(p[0]) == 32
            and type(p[1]) is int
            and p[1] >= 1
        ):
            raise DecodeError("witness entries are [32-byte author, seq >= 1]")
        out.append((p[0], p[1]))
    return out


class WitnessIndex:
    """First-witness times per author and seq, from ``witness`` events.

    Per covered author it keeps the *staircase* of ``(seq, hlc)`` points not
    dominated by another (one with a seq at least as high and an HLC at
    most as low): seqs and HLCs both ascend, so the first witness of seq
    ``s`` is the HLC of the first point with seq ``>= s``.
    """

    kinds = frozenset({KIND_WITNESS})

    def __init__(self, rejected: Counter[str] | None = None) -> None:
        self._seqs: dict[bytes, list[int]] = {}
        self._hlcs: dict[bytes, list[int]] = {}
        #: Malformed witness events, by error code (shared with a host view).
        self.rejected: Counter[str] = Counter() if rejected is None else rejected

    def apply(self, event: Event) -> None:
        """Fold one ``witness`` event in (malformed bodies are counted)."""
        try:
            cover = _parse(event.body)
        except DecodeError as exc:
            self.rejected[exc.code] += 1
            return
        for author, seq in cover:
            if author != event.author:  # nobody witnesses their own word
                self._add(author, seq, event.hlc)

    def _add(self, author: bytes, seq: int, hlc: int) -> None:
        seqs = self._seqs.setdefault(author, [])
        hlcs = self._hlcs.setdefault(author, [])
        i = bisect.bisect_left(seqs, seq)
        if i < len(seqs) and hlcs[i] <= hlc:
            return  # an earlier witness already covers this much
        # drop the points this one dominates: seq <= ours and hlc >= ours
        j = bisect.bisect_left(hlcs, hlc, 0, i)
        end = i + 1 if i < len(seqs) and seqs[i] == seq else i
        seqs[j:end] = [seq]
        hlcs[j:end] = [hlc]

    def first_seen(self, author: bytes, seq: int) -> int | None:
        """The smallest HLC at which another node held ``author`` up to
        ``seq`` or beyond, or None if nobody has said so."""
        seqs = self._seqs.get(author)
        if not seqs:
            return None
        i = bisect.bisect_left(seqs, seq)
        return self._hlcs[author][i] if i < len(seqs) else None

    def order(self, author: bytes, seq: int, hlc: int, window_ms: int) -> int:
        """The HLC by which to order ``author``'s event ``seq`` stamped ``hlc``:
        ``max(hlc, first_seen - window_ms)``, or ``hlc`` if unwitnessed."""
        seen = self.first_seen(author, seq)
        if seen is None:
            return hlc
        return max(hlc, seen - (window_ms << LOGICAL_BITS))

    def snapshot(self) -> dict[str, list[list[int]]]:
        """Per author (hex): the staircase ``[[seq, first-witness hlc], ...]``."""
        return {
            a.hex(): [[s, h] for s, h in zip(self._seqs[a], self._hlcs[a], strict=True)]
            for a in sorted(self._seqs)
        }
