"""Batches from the future: held back until the receiver's clock allows them.

Theory of operation
-------------------
A peer's clock may run ahead of ours, but only by the clock bound
(:data:`~hivemesh.core.hlc.MAX_DRIFT_MS`, see :mod:`hivemesh.core.hlc`). A
signed batch that carries an HLC beyond ``horizon(now_ms)`` -- the receiver's
*physical* time plus the bound -- is not applied early and not refused:
:meth:`hivemesh.core.journal.Journal.ingest` raises
:class:`~hivemesh.errors.ClockAhead` after checking everything else (chain,
signature), and the node hands the batch to :class:`Deferrals`:

* **Held, bounded.** One batch per author (the one that becomes plausible
  first), at most ``max_bytes`` over all authors. Past the cap only a marker
  is kept (the batch is pulled again after its release time); every drop is
  counted (``deferred_dropped``).
* **The author's feed waits behind it.** The author's head does not move, so
  its later events arrive as gaps; pulls for the author are capped just
  below the implausible event (:meth:`Deferrals.cap`), so anti-entropy can
  still fetch a plausible prefix that another peer holds signed, but does not
  fetch the deferred events again every round. A peer that answered such a
  capped pull with the deferred event anyway (it holds no signature in
  between) is not asked again.
* **Released on time.** :meth:`Deferrals.next_release` joins the node's
  ``next_deadline``; at ``release_ms = hlc_ms(largest hlc) - MAX_DRIFT_MS``
  the node ingests the batch again, now plausible, exactly as if it had
  just arrived. Every replica applies the same events in the end, so views
  still converge; an HLC of ``2**63 - 1`` simply never becomes plausible and
  the author's feed stays frozen at that point everywhere.
* **Attributed.** Deferrals are counted per author
  (:meth:`Deferrals.snapshot`, shown by ``hivemesh status``), so an
  operator can see whose clock is wrong and revoke a malicious author.

Pure bookkeeping: no clock is read here; the node passes ``now_ms`` in.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from hivemesh.core.hlc import hlc_ms
from hivemesh.core.identity import address_of
from hivemesh.errors import ClockAhead

__all__ = ["DEFAULT_MAX_BYTES", "Deferrals", "Deferred"]

#: Bytes of deferred batches held in memory, over all authors.
DEFAULT_MAX_BYTES = 16 << 20


@dataclass(slots=True)
class Deferred:
    """The batch held for one author (``raws is None``: a marker only)."""

    author: bytes
    start: int  # first seq the batch would add to our feed
    seq: int  # first seq that carries an implausible HLC
    hlc: int  # the batch's largest HLC
    release_ms: int
    since_ms: int
    raws: list[bytes] | None
    sig: bytes
    nbytes: int
    #: Peers whose capped pull came back past ``seq`` (not asked again).
    overshot: set[str] = field(default_factory=set)


class Deferrals:
    """Batches beyond the clock bound, per author (see module docs)."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self.held: dict[bytes, Deferred] = {}
        self.nbytes = 0
        #: Deferred batches per author, ever (re-deliveries included).
        self.by_author: Counter[bytes] = Counter()
        self.counters: Counter[str] = Counter()

    def hold(
        self,
        author: bytes,
        exc: ClockAhead,
        start: int,
        raws: list[bytes],
        sig: bytes,
        now_ms: int,
        *,
        pulled_from: str | None = None,
    ) -> None:
        """Keep the batch ``raws`` (its new events begin at ``start``) that
        ``exc`` deferred. ``pulled_from`` names the peer that sent it in
        answer to a pull capped below ``exc.seq`` (that peer cannot serve the
        plausible prefix alone)."""
        self.by_author[author] += 1
        cur = self.held.get(author)
        if cur is not None and (cur.release_ms, cur.seq) <= (exc.release_ms, exc.seq):
            self.counters["deferred_again"] += 1
            if pulled_from is not None:
                cur.overshot.add(pulled_from)
            return
        overshot = set() if cur is None else cur.overshot
        if cur is not None:
            self._forget(cur)
        nbytes = sum(map(len, raws))
        if self.nbytes + nbytes > self.max_bytes:
            self.counters["deferred_dropped"] += 1
            held: list[bytes] | None = None
            nbytes = 0
        else:
            held = list(raws)
            self.nbytes += nbytes
        rec = Deferred(
            author, start, exc.seq, exc.hlc, exc.release_ms, now_ms, held, sig, nbytes, overshot
        )
        if pulled_from is not None:
            rec.overshot.add(pulled_from)
        self.held[author] = rec

    def cap(self, author: bytes, peer: str) -> int | None:
        """The highest seq of ``author`` we may pull from ``peer`` now, or
        ``None`` when nothing of that author is deferred."""
        rec = self.held.get(author)
        if rec is None:
            return None
        return 0 if peer in rec.overshot else rec.seq - 1

    def next_release(self) -> int | None:
        """The earliest release time of a held batch (ms), if any."""
        return min((r.release_ms for r in self.held.values()), default=None)

    def due(self, now_ms: int) -> list[Deferred]:
        """Remove and return the records whose release time has come, by author."""
        out = [self.held[a] for a in sorted(self.held) if self.held[a].release_ms <= now_ms]
        for rec in out:
            self._forget(rec)
        return out

    def _forget(self, rec: Deferred) -> None:
        del self.held[rec.author]
        self.nbytes -= rec.nbytes

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """Per author address: deferrals so far and, while one is held, what waits."""
        out: dict[str, dict[str, Any]] = {}
        for author in sorted(self.by_author):
            row: dict[str, Any] = {"deferred_batches": self.by_author[author]}
            rec = self.held.get(author)
            if rec is not None:
                row.update(
                    waiting_from_seq=rec.seq,
                    hlc_ms=hlc_ms(rec.hlc),
                    release_ms=rec.release_ms,
                    since_ms=rec.since_ms,
                    held_events=0 if rec.raws is None else len(rec.raws),
                )
            out[address_of(author)] = row
        return out
