"""Claims: optimistic intent registration in the journal.

Theory of operation
-------------------
For cheap work where a rare duplicate is acceptable (and detected), a node
does not ask anyone's permission: it appends ``claim.intent {r: resource}``
to its feed, waits a *settle window*, and then works on the resource if its
claim is the earliest live one by ``(hlc, author)``. Everyone computes the
same winner from the same events, so no leader and no round trips.

* A claim is *live* until its author releases it (``claim.release``), the
  resource is finished (``claim.done``), or a failure report
  ``member.down {a: author, upto: seq}`` covers it (claim seq <= upto: the
  reporter had seen it, so the report is causally after it; comparing clocks
  instead would let a skewed reporter miss claims). An author that restarts
  releases its own earlier live claims (:meth:`ClaimsView.own_live`). All
  rules depend only on the set of events, so every replica agrees in any
  arrival order.
* :meth:`ClaimsView.decided` returns the winner once its claim is older than
  the settle window (judged by the caller's ``now_ms``). The window must
  exceed the usual propagation delay; a claim that arrives later than that
  with an earlier timestamp can make two nodes work on one resource. That
  case is *detected*: two ``claim.done`` events from different authors are
  reported by :meth:`ClaimsView.duplicates`.
* *Earliest* is not the author's word alone: a claim is ordered by
  ``max(hlc, first_witness - window_ms)`` (:mod:`hivemesh.core.witness`;
  nodes witness every ``claim.intent`` they receive from others), with
  ``window_ms`` the settle window. An honest claim keeps its own ``hlc``; a
  backdated one is ordered no earlier than a settle window before an honest
  node first saw it, so it cannot overturn a claim that had settled by then.
  :meth:`ClaimsView.takeovers` lists live claims whose own ``hlc`` would
  have won but whose first witness came too late.

For work that must never run twice use a lease with a fencing token
(:mod:`hivemesh.leases`) instead.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from hivemesh.core.event import Event
from hivemesh.core.hlc import hlc_ms
from hivemesh.core.witness import KIND_WITNESS, WitnessIndex
from hivemesh.errors import InvalidArgument

__all__ = ["DEFAULT_WINDOW_MS", "Claim", "ClaimsView", "check_resource"]

_MAX_RESOURCE = 256
#: How much earlier than its first witness a claim may be ordered: the settle
#: window (swarm-wide: every replica must order claims alike).
DEFAULT_WINDOW_MS = 500


def check_resource(resource: object) -> str:
    """``resource`` if a claim may name it (1-256 chars), else InvalidArgument."""
    if not isinstance(resource, str) or not 0 < len(resource) <= _MAX_RESOURCE:
        raise InvalidArgument(f"claim resource must be 1-256 chars, got {resource!r:.80}")
    return resource


@dataclass(frozen=True, order=True, slots=True)
class Claim:
    """One claim as its author stamped it (the view orders it by witnesses)."""

    hlc: int
    author: bytes
    seq: int


@dataclass(slots=True)
class _Resource:
    claims: list[Claim] = field(default_factory=list)
    released: set[tuple[bytes, int]] = field(default_factory=set)  # (author, claim seq)
    done_by: dict[bytes, int] = field(default_factory=dict)  # author -> hlc


class ClaimsView:
    """Deterministic winner per resource from claim events."""

    kinds = frozenset({"claim.intent", "claim.release", "claim.done", "member.down", KIND_WITNESS})
    #: Kinds the node must witness for this view's order (core.witness).
    witnessed_kinds = frozenset({"claim.intent"})

    def __init__(self, window_ms: int = DEFAULT_WINDOW_MS) -> None:
        self.window_ms = window_ms
        self._res: dict[str, _Resource] = {}
        self._down: dict[bytes, int] = {}  # author -> highest seq covered by a down report
        self.rejected: Counter[str] = Counter()
        self.witnesses = WitnessIndex(self.rejected)

    def apply(self, event: Event) -> None:
        """Fold one claim, failure or witness event in; bad bodies are counted."""
        body = event.body
        if event.kind == KIND_WITNESS:
            self.witnesses.apply(event)
            return
        if event.kind == "member.down":
            who = body.get("a") if isinstance(body, dict) else None
            upto = body.get("upto") if isinstance(body, dict) else None
            if type(who) is not bytes or len(who) != 32 or type(upto) is not int:
                self.rejected["malformed"] += 1
                return
            self._down[who] = max(self._down.get(who, 0), upto)
            return
        r = body.get("r") if isinstance(body, dict) else None
        if type(r) is not str or not 0 < len(r) <= _MAX_RESOURCE:
            self.rejected["malformed"] += 1
            return
        res = self._res.setdefault(r, _Resource())
        if event.kind == "claim.intent":
            res.claims.append(Claim(event.hlc, event.author, event.seq))
        elif event.kind == "claim.release":
            seq = body.get("seq")
            if type(seq) is not int:
                self.rejected["malformed"] += 1
                return
            res.released.add((event.author, seq))
        else:  # claim.done
            res.done_by.setdefault(event.author, event.hlc)

    def _live(self, r: str) -> list[Claim]:
        res = self._res.get(r)
        if res is None or res.done_by:
            return []
        out = []
        for c in res.claims:
            if (c.author, c.seq) in res.released:
                continue
            if c.seq <= self._down.get(c.author, 0):
                continue
            out.append(c)
        return sorted(out, key=lambda c: (self.order_hlc(c), c.author, c.seq))

    def order_hlc(self, c: Claim) -> int:
        """The HLC ``c`` is ordered by: its own, unless first witnessed more
        than ``window_ms`` later (module docs)."""
        return self.witnesses.order(c.author, c.seq, c.hlc, self.window_ms)

    def winner(self, r: str) -> Claim | None:
        """The earliest live claim on ``r`` (None if unclaimed or done)."""
        live = self._live(r)
        return live[0] if live else None

    def decided(self, r: str, now_ms: int, settle_ms: int) -> bytes | None:
        """The winning author once its claim is older than ``settle_ms``."""
        w = self.winner(r)
        if w is None or now_ms - hlc_ms(self.order_hlc(w)) < settle_ms:
            return None
        return w.author

    def takeovers(self) -> list[tuple[str, Claim, Claim]]:
        """``(resource, claim, winner)`` for every live claim whose own ``hlc``
        would win but whose first witness came too late (backdated)."""
        out = []
        for r in sorted(self._res):
            live = self._live(r)
            for c in live[1:]:
                if (c.hlc, c.author, c.seq) < (live[0].hlc, live[0].author, live[0].seq):
                    out.append((r, c, live[0]))
        return out

    def own_live(self, author: bytes) -> list[tuple[str, int]]:
        """``(resource, claim seq)`` of ``author``'s live claims (to release on restart)."""
        return [(r, c.seq) for r in sorted(self._res) for c in self._live(r) if c.author == author]

    def is_done(self, r: str) -> bool:
        """Someone reported ``r`` finished."""
        res = self._res.get(r)
        return bool(res and res.done_by)

    def is_claimed(self, r: str) -> bool:
        """``r`` has a live claim or is done."""
        return self.is_done(r) or self.winner(r) is not None

    def duplicates(self) -> dict[str, int]:
        """Resources finished by more than one author -> extra executions."""
        return {
            r: len(res.done_by) - 1 for r, res in sorted(self._res.items()) if len(res.done_by) > 1
        }

    def snapshot(self) -> dict[str, dict[str, object]]:
        """Per resource: winner (hex), done, live claim count."""
        out: dict[str, dict[str, object]] = {}
        for r in sorted(self._res):
            w = self.winner(r)
            out[r] = {
                "winner": w.author.hex() if w else None,
                "done_by": sorted(a.hex() for a in self._res[r].done_by),
                "live": len(self._live(r)),
            }
        return out
