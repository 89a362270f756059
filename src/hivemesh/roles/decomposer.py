"""Decomposer: proposes splits of open goals, one proposal per goal and round.

For each open goal whose round needs a proposal (no proposal yet, or every
proposal rejected) and for which this node has not proposed in that round,
ask the LLM for a split organised by this decomposer's *strategy* (by place,
by activity, by day, ...), feeding in the notes scorers left on rejected
proposals. The reply is cleaned up (dependencies on later or unknown
siblings dropped, titles trimmed) and emitted as ``plan.propose``. After
``max_rounds`` rejected rounds, or ``max_failures`` failed LLM calls on a
goal, it proposes the goal as atomic so the plan cannot stall.
"""

from __future__ import annotations

from typing import Any

from hivemesh.core.plan import NodeState, PlanView
from hivemesh.core.plan_events import KIND_PROPOSE, propose_body
from hivemesh.llm.base import LLMProvider
from hivemesh.roles.base import FALLBACK, Action, Emit, RoleBase, clip
from hivemesh.roles.prompts import decompose_messages, decompose_schema

__all__ = ["Decomposer"]


def clean_subgoals(raw: list[dict[str, Any]], limit: int, last_level: bool) -> list[dict[str, Any]]:
    """LLM subgoals -> valid ``plan.propose`` subgoals (drops bad deps)."""
    out: list[dict[str, Any]] = []
    for i, s in enumerate(raw[:limit]):
        deps = sorted({d for d in s.get("depends_on", []) if isinstance(d, int) and 0 <= d < i})
        caps = sorted({str(c)[:40] for c in s.get("capabilities", []) if str(c).strip()})[:16]
        out.append(
            {
                "title": clip(str(s["title"]).strip()[:300], 600) or f"step {i + 1}",
                "detail": clip(str(s.get("detail", ""))[:4000], 1500),
                "deps": deps,
                "atomic": bool(s.get("atomic", False)) or last_level,
                "caps": caps,
            }
        )
    return out


class Decomposer(RoleBase):
    """Proposes splits; ``strategy`` is a phrase such as ``"by activity"``."""

    name = "decomposer"

    def __init__(
        self,
        me: bytes,
        llm: LLMProvider,
        *,
        strategy: str = "by activity",
        max_rounds: int = 3,
        timeout_s: float | None = None,
        retry_after_ms: int = 1000,
    ) -> None:
        super().__init__(me, retry_after_ms=retry_after_ms)
        self.llm = llm
        self.strategy = strategy
        self.max_rounds = max_rounds
        self.timeout_s = timeout_s
        self._proposed: set[tuple[str, int]] = set()

    def _mine(self, view: PlanView, node: str, rnd: int) -> bool:
        if (node, rnd) in self._proposed:
            return True
        return any(a == self.me and p.round == rnd for _h, a, p in view.proposals_for(node))

    def poll(self, view: PlanView, now_ms: int) -> list[Action]:
        """Start one proposal job per open goal and round not yet proposed."""
        out: list[Action] = self.greeting()
        for n in view.open_goals(now_ms):
            rnd = view.next_round(n.id)
            if rnd is None or self._mine(view, n.id, rnd):
                continue
            key = f"{n.id}/{rnd}"
            if self.busy(key, now_ms):
                continue
            g = view.goal(n.root)
            assert g is not None
            if rnd >= self.max_rounds or self.failures[key] >= self.max_failures:
                self._proposed.add((n.id, rnd))
                self.counters["atomic_fallback"] += 1
                out.append(
                    Emit(KIND_PROPOSE, propose_body(n.id, rnd, [], strategy=FALLBACK, atomic=True))
                )
                continue
            out.append(self.job(key, now_ms, self._work(view, n, rnd, g.max_depth, g.max_subgoals)))
        return out

    def _work(
        self, view: PlanView, n: NodeState, rnd: int, max_depth: int, max_subgoals: int
    ) -> Any:
        notes = [
            v.vote.notes
            for _h, _a, p in view.proposals_for(n.id)
            for v in view.votes_for(p.id)
            if v.vote.notes and not v.vote.accept
        ]
        messages = decompose_messages(
            title=n.title,
            detail=n.detail,
            path=view.path(n.id),
            depth=n.depth,
            max_depth=max_depth,
            strategy=self.strategy,
            max_subgoals=max_subgoals,
            notes=notes,
        )
        schema = decompose_schema(max_subgoals)
        last_level = n.depth + 1 >= max_depth

        async def work() -> list[Emit]:
            res = await self.llm.complete(messages, schema=schema, timeout_s=self.timeout_s)
            subs = clean_subgoals(res.parsed["subgoals"], max_subgoals, last_level)
            atomic = bool(res.parsed.get("atomic", False)) or not subs
            self._proposed.add((n.id, rnd))
            self.counters["proposals"] += 1
            body = propose_body(
                n.id, rnd, [] if atomic else subs, strategy=self.strategy[:40], atomic=atomic
            )
            return [Emit(KIND_PROPOSE, body)]

        return work
