"""Planner decision rules: quorum acceptance, claim winners, accepted results.

Theory of operation
-------------------
Every rule here is a pure function of a *set* of records, so two replicas
holding the same events decide the same thing whatever order the events
arrived in. Time enters only through event HLCs; no wall clock is read.

**Acceptance.** For each proposal, a scorer's vote is its earliest vote
``(hlc, event id)`` on that proposal; a vote stamped before the proposal (a
badly skewed clock) counts as cast at the proposal's own HLC. Walking the proposal's
votes and the ``plan.down`` marks in ``(hlc, author)`` order, the proposal is
*decided* at the first point ``t`` where its accept votes up to ``t`` reach
``quorum.required(live(t))``; ``live(t)`` is the number of scorers whose last
``plan.hello``/``plan.down`` at or before ``t`` is a hello, and at least the
configured ``scorers`` minus those marked down. Proposals decided within ``settle_ms``
of the earliest decision are *competing* and evaluated together: the winner
is the one with the best mean score, then the smallest proposal id.

**Rejection.** A proposal is rejected when, even if every live scorer that has
not voted accepted it, it could not reach quorum. When all proposals of a
goal are rejected, decomposers propose a new round.

**Claims.** The live (unreleased) claim with the smallest ``(hlc, author, id)``
wins. **Results.** A task's accepted result is the earliest
``(hlc, author, id)`` result written by any node that claimed it; every other
such result is a duplicate. Results from non-claimers are ignored.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction

from hivemesh.core.hlc import hlc_ms, make_hlc
from hivemesh.core.plan_events import Proposal, Quorum, Result, Vote

__all__ = [
    "Liveness",
    "ProposalOutcome",
    "VoteRec",
    "accepted_result",
    "decide",
    "evaluate",
]


@dataclass(frozen=True, slots=True)
class VoteRec:
    """A vote with its ordering fields."""

    hlc: int
    author: bytes
    eid: bytes
    vote: Vote


class Liveness:
    """Which scorers are alive at a given HLC, from hello/down marks."""

    def __init__(self, marks: Iterable[tuple[int, int, bytes]], fallback: int) -> None:
        # marks: (hlc, 0 = hello as scorer / 1 = down, author)
        self._marks = sorted(marks)
        self._fallback = fallback
        self.down_points = sorted((h, a) for h, k, a in self._marks if k == 1)

    def live(self, hlc: int) -> int:
        """Live scorers at ``hlc``: those whose last mark is a hello, but never
        fewer than the configured count minus the scorers marked down (so a
        scorer that has not said hello yet still counts)."""
        state: dict[bytes, bool] = {}
        for h, k, a in self._marks:
            if h > hlc:
                break
            if k == 0:
                state[a] = True
            elif a in state:
                state[a] = False
        alive = sum(1 for v in state.values() if v)
        return max(alive, self._fallback - (len(state) - alive))


@dataclass(frozen=True, slots=True)
class ProposalOutcome:
    """How one proposal stands under the full vote set."""

    proposal: str
    votes: int
    accepts: int
    score_total: int
    decided: tuple[int, bytes] | None
    rejected: bool

    @property
    def mean_score(self) -> Fraction:
        """Mean total score (0..30) of its votes, exact."""
        return Fraction(self.score_total, self.votes) if self.votes else Fraction(0)


def evaluate(
    proposal: Proposal,
    proposal_hlc: int,
    votes: Iterable[VoteRec],
    quorum: Quorum,
    liveness: Liveness,
) -> ProposalOutcome:
    """Decision point and rejection status of one proposal."""
    best: dict[bytes, VoteRec] = {}
    for v in votes:
        if v.vote.goal != proposal.goal:
            continue
        if v.hlc < proposal_hlc:  # a skewed clock; the vote cannot predate what it scores
            v = VoteRec(proposal_hlc, v.author, v.eid, v.vote)
        cur = best.get(v.author)
        if cur is None or (v.hlc, v.eid) < (cur.hlc, cur.eid):
            best[v.author] = v
    ordered = sorted(best.values(), key=lambda r: (r.hlc, r.author, r.eid))
    points: list[tuple[int, bytes, int]] = [(r.hlc, r.author, 1) for r in ordered]
    points += [(h, a, 0) for h, a in liveness.down_points if h >= proposal_hlc]
    points.sort()
    accepts_by = {r.author for r in ordered if r.vote.accept}
    decided: tuple[int, bytes] | None = None
    count = 0
    counted: set[bytes] = set()
    for hlc, author, is_vote in points:
        if is_vote and author in accepts_by and author not in counted:
            counted.add(author)
            count += 1
        if count >= max(1, quorum.required(liveness.live(hlc))):
            decided = (hlc, author)
            break
    accepts = len(accepts_by)
    rejected = False
    if decided is None:
        live_now = liveness.live(1 << 63)
        remaining = max(0, live_now - len(ordered))
        rejected = accepts + remaining < max(1, quorum.required(live_now))
    return ProposalOutcome(
        proposal=proposal.id,
        votes=len(ordered),
        accepts=accepts,
        score_total=sum(r.vote.total for r in ordered),
        decided=decided,
        rejected=rejected,
    )


def decide(outcomes: Iterable[ProposalOutcome], settle_ms: int) -> ProposalOutcome | None:
    """The winning proposal among competing decided ones, or None."""
    decided = [o for o in outcomes if o.decided is not None]
    if not decided:
        return None
    first = min(o.decided for o in decided if o.decided is not None)
    window = make_hlc(hlc_ms(first[0]) + settle_ms + 1) - 1
    competing = [o for o in decided if o.decided is not None and o.decided[0] <= window]
    return min(competing, key=lambda o: (-o.mean_score, o.proposal))


def accepted_result(
    results: Iterable[tuple[int, bytes, bytes, Result]],
    claimers: set[bytes],
) -> tuple[tuple[int, bytes, bytes, Result] | None, int]:
    """``(accepted, duplicates)`` among results written by claimers."""
    valid = sorted(
        (r for r in results if r[1] in claimers),
        key=lambda r: (r[0], r[1], r[2]),
    )
    if not valid:
        return None, 0
    return valid[0], len(valid) - 1
