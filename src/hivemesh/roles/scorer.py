"""Scorer: votes on every proposal of an open goal, competing ones together.

Once a proposal is ``settle_ms`` old (so its competitors from other
decomposers have had time to arrive), or as soon as every live decomposer
has proposed in the round, the scorer sends *all* proposals of
that goal it has not voted on to the LLM in one call and emits one
``plan.vote`` per proposal: three 0..10 scores, notes, and ``accept`` when
every score reaches ``threshold``. Proposals the model skipped are retried on
a later poll. After ``max_failures`` failed calls on a batch the scorer
*rejects* it with a note saying why, so the round can end rather than wait
forever; decomposers then propose again and finally fall back to "do it
directly", which scorers accept without asking the model.
"""

from __future__ import annotations

from typing import Any

from hivemesh.core.hlc import hlc_ms
from hivemesh.core.plan import NodeState, PlanView
from hivemesh.core.plan_events import KIND_VOTE, Proposal, vote_body
from hivemesh.llm.base import LLMProvider
from hivemesh.roles.base import FALLBACK, Action, Emit, RoleBase
from hivemesh.roles.prompts import score_messages, score_schema

__all__ = ["Scorer", "describe_proposal"]


def describe_proposal(p: Proposal) -> list[str]:
    """Human-readable lines of a proposal, for prompts and the observer."""
    if p.atomic:
        return ["(do the goal directly as one step)"]
    lines = []
    for i, s in enumerate(p.subgoals):
        extra = f" (after {', '.join(str(d) for d in s.deps)})" if s.deps else ""
        kind = " [atomic]" if s.atomic else ""
        lines.append(f"{i}. {s.title}{kind}{extra}: {s.detail}"[:600])
    return lines


class Scorer(RoleBase):
    """Scores proposals; accepts when each of the three scores >= ``threshold``."""

    name = "scorer"

    def __init__(
        self,
        me: bytes,
        llm: LLMProvider,
        *,
        threshold: int = 6,
        timeout_s: float | None = None,
        retry_after_ms: int = 1000,
    ) -> None:
        super().__init__(me, retry_after_ms=retry_after_ms)
        self.llm = llm
        self.threshold = threshold
        self.timeout_s = timeout_s
        self._voted: set[str] = set()
        self._scoring: set[str] = set()

    def _pending(self, view: PlanView, n: NodeState, now_ms: int, settle_ms: int) -> list[Proposal]:
        props = view.proposals_for(n.id)
        last = max((p.round for _h, _a, p in props), default=0)
        # Competitors still expected? Skip the gathering wait once every live
        # decomposer has proposed in the latest round.
        authors = {a for _h, a, p in props if p.round == last}
        everyone = len(authors) >= max(1, view.live_with_role("decomposer"))
        out = []
        for hlc, _a, p in props:
            if p.id in self._voted or p.id in self._scoring:
                continue
            if not everyone and now_ms < hlc_ms(hlc) + settle_ms:
                continue
            if any(v.author == self.me for v in view.votes_for(p.id)):
                self._voted.add(p.id)
                continue
            out.append(p)
        return out

    def poll(self, view: PlanView, now_ms: int) -> list[Action]:
        """Start one scoring job per goal with unvoted, settled proposals."""
        out: list[Action] = self.greeting()
        for n in view.open_goals(now_ms):
            g = view.goal(n.root)
            assert g is not None
            props = self._pending(view, n, now_ms, g.settle_ms)
            for p in [p for p in props if p.atomic and p.strategy == FALLBACK]:
                props.remove(p)  # "do it directly" after failed rounds: no LLM needed
                out.append(self._verdict(p, n.id, True, 5, "fallback: do the goal directly"))
            if not props:
                continue
            key = f"{n.id}/" + ",".join(p.id[:8] for p in props)
            if self.busy(key, now_ms):
                continue
            if self.failures[key] >= self.max_failures:
                # Reject rather than abstain, so the round ends and the
                # decomposers move on (eventually to the fallback) instead of
                # waiting for votes that will never come.
                reason = f"scorer could not evaluate ({self.last_error.get(key, 'LLM error')})"
                out += [self._verdict(p, n.id, False, 0, reason) for p in props]
                self.counters["rejected_unscored"] += len(props)
                continue
            self._scoring.update(p.id for p in props)
            out.append(self.job(key, now_ms, self._work(view, n, props)))
        return out

    def _verdict(self, p: Proposal, goal: str, accept: bool, score: int, notes: str) -> Emit:
        self._voted.add(p.id)
        self.counters["votes"] += 1
        body = vote_body(
            p.id,
            goal,
            accept=accept,
            concreteness=score,
            non_overlap=score,
            completeness=score,
            notes=notes[:4000],
        )
        return Emit(KIND_VOTE, body)

    def _work(self, view: PlanView, n: NodeState, props: list[Proposal]) -> Any:
        messages = score_messages(
            title=n.title, path=view.path(n.id), proposals=[describe_proposal(p) for p in props]
        )
        schema = score_schema(len(props))

        async def work() -> list[Emit]:
            try:
                res = await self.llm.complete(messages, schema=schema, timeout_s=self.timeout_s)
            finally:
                self._scoring.difference_update(p.id for p in props)
            out: list[Emit] = []
            seen: set[int] = set()
            for s in res.parsed["scores"]:
                i = s["proposal"]
                if i in seen or not 0 <= i < len(props):
                    continue
                seen.add(i)
                c, o, m = s["concreteness"], s["non_overlap"], s["completeness"]
                self._voted.add(props[i].id)
                self.counters["votes"] += 1
                body = vote_body(
                    props[i].id,
                    n.id,
                    accept=min(c, o, m) >= self.threshold,
                    concreteness=c,
                    non_overlap=o,
                    completeness=m,
                    notes=str(s.get("notes", ""))[:4000],
                )
                out.append(Emit(KIND_VOTE, body))
            return out

        return work
