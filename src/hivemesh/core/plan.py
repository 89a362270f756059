"""The plan view: a deterministic reducer from ``plan.*`` events to a goal tree.

Theory of operation
-------------------
:meth:`PlanView.apply` only *collects*: each valid event becomes a record in
a grow-only set keyed by derived ids (duplicates by event id are ignored,
invalid bodies are counted by reason and dropped). Everything a reader sees
is then a pure function of those sets, rebuilt lazily after a change:
therefore any order or duplication of the same events gives the same tree.

The tree is built from each root goal down (rules in
:mod:`hivemesh.core.plan_rules`). A node whose accepted proposal is a split
gets children ``child_id(node, proposal, i)``; a child is a leaf when the
proposal marks it atomic or it sits at ``max_depth``; an accepted *atomic*
proposal turns the node itself into a leaf. Every node has one *task*: a
leaf's task is to execute it, an inner node's task is to synthesise its
children's results (claimable once all children are finished). A task is
blocked until the sibling tasks it depends on are done; a failed dependency
fails it. A claim is void once released (``plan.task.release``) or covered
by the membership layer's ``member.down {a, upto}`` (claim seq <= upto). Life of a node, as data::

    inner: open -> split -> synthesis -> done | failed      (any -> cancelled)
    leaf:  blocked -> ready -> claimed -> done | failed      (any -> cancelled)

A task's claims and results are ordered by witnesses, not by their authors'
HLCs alone (:mod:`hivemesh.core.witness`; nodes witness every
``plan.task.claim`` and ``plan.task.result`` they receive from others): each
is ordered by ``max(hlc, first_witness - settle_ms)`` with the goal's
``settle_ms``, so a backdated claim or result cannot overturn one that had
settled before any honest node saw it. The snapshot's claim and result
``hlc`` are these ordering HLCs (an honest record's own). :meth:`stats`
counts ``claim_takeovers_refused`` and ``result_takeovers_refused``: tasks
where a record's own HLC would have won but its witnesses came too late.

Only the *action* queries (:meth:`open_goals`, :meth:`claimable`,
:meth:`claim_won`) take ``now_ms``: they hold back from acting until a
decision is ``settle_ms`` old, so late competing events rarely flip it. The
snapshot never depends on ``now_ms``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from hivemesh.core.event import Event
from hivemesh.core.hlc import hlc_ms
from hivemesh.core.plan_events import (
    ALL_KINDS,
    KIND_CLAIM,
    KIND_RESULT,
    Cancel,
    Claim,
    Down,
    GoalCreate,
    Hello,
    Proposal,
    Release,
    Result,
    Vote,
    child_id,
    parse,
)
from hivemesh.core.plan_rules import (
    Liveness,
    ProposalOutcome,
    VoteRec,
    accepted_result,
    decide,
    evaluate,
)
from hivemesh.core.witness import KIND_WITNESS, WitnessIndex
from hivemesh.errors import InvalidPlanEvent

__all__ = ["NodeState", "PlanView", "TaskInfo"]

_TERMINAL = frozenset({"done", "failed", "cancelled"})


@dataclass
class NodeState:
    """One node of the derived tree (rebuilt on change; do not mutate)."""

    id: str
    root: str
    parent: str | None
    depth: int
    title: str
    detail: str
    caps: tuple[str, ...]
    deps: tuple[str, ...] = ()
    leaf: bool | None = None  # None: not decided yet
    status: str = "open"
    proposals: list[ProposalOutcome] = field(default_factory=list)
    accepted: str | None = None
    decided_hlc: int | None = None
    ready_hlc: int = 0
    children: list[str] = field(default_factory=list)
    claims: list[tuple[int, bytes, str, bool]] = field(default_factory=list)
    winner: tuple[int, bytes, str] | None = None
    result: tuple[int, bytes, str] | None = None
    duplicates: int = 0
    attempts: int = 0
    cancelled: str | None = None

    @property
    def done_hlc(self) -> int:
        """HLC of the accepted result (0 if none)."""
        return self.result[0] if self.result else 0


@dataclass(frozen=True)
class TaskInfo:
    """A task an executor may claim, with everything needed to run it."""

    task: str
    root: str
    kind: str  # "execute" | "synthesise"
    title: str
    detail: str
    caps: tuple[str, ...]
    ready_hlc: int
    path: tuple[str, ...]
    inputs: tuple[tuple[str, str], ...]  # (title, result) of deps or children


def _text(n: NodeState) -> str:
    return n.result[2] if n.result is not None else f"({n.status})"


class PlanView:
    """The journal view of every plan. Register with ``journal.add_view``."""

    kinds = ALL_KINDS | {KIND_WITNESS}
    #: Kinds the node must witness for this view's order (core.witness).
    witnessed_kinds = frozenset({KIND_CLAIM, KIND_RESULT})

    def __init__(self) -> None:
        self._witnesses = WitnessIndex()
        self._result_seq: dict[bytes, int] = {}  # result event id -> its seq
        self._takeovers: Counter[str] = Counter()
        self._seen: set[bytes] = set()
        self._goals: dict[str, tuple[int, bytes, GoalCreate]] = {}
        self._proposals: dict[str, dict[str, tuple[int, bytes, Proposal]]] = {}
        self._votes: dict[str, list[VoteRec]] = {}
        self._claims: dict[str, dict[str, tuple[int, bytes, int]]] = {}
        self._results: dict[str, list[tuple[int, bytes, bytes, Result]]] = {}
        self._releases: dict[str, list[tuple[int, bytes, Release]]] = {}
        self._cancels: dict[str, tuple[int, bytes, Cancel]] = {}
        self._marks: set[tuple[int, int, bytes]] = set()
        self._caps: dict[bytes, tuple[int, tuple[str, ...]]] = {}
        self._roles: dict[bytes, tuple[int, tuple[str, ...]]] = {}
        self._down: dict[bytes, int] = {}
        self._down_upto: dict[bytes, int] = {}
        self.invalid: Counter[str] = Counter()
        self.duplicates_applied = 0
        self._nodes: dict[str, NodeState] | None = None
        self._live: Liveness | None = None

    # -- ingest ------------------------------------------------------------------

    def apply(self, event: Event) -> None:
        """Fold one event in. Never raises on bad input (counts it instead)."""
        if event.kind == KIND_WITNESS:
            self._witnesses.apply(event)
            self._nodes = None
            return
        if event.id in self._seen:
            self.duplicates_applied += 1
            return
        self._seen.add(event.id)
        try:
            rec = parse(event)
        except InvalidPlanEvent as exc:
            self.invalid[str(exc)] += 1
            return
        key = (event.hlc, event.id)
        if isinstance(rec, GoalCreate):
            cur = self._goals.get(rec.id)
            if cur is None or key < (cur[0], cur[1]):
                self._goals[rec.id] = (event.hlc, event.id, rec)
        elif isinstance(rec, Proposal):
            self._proposals.setdefault(rec.goal, {})[rec.id] = (event.hlc, event.author, rec)
        elif isinstance(rec, Vote):
            self._votes.setdefault(rec.proposal, []).append(
                VoteRec(event.hlc, event.author, event.id, rec)
            )
        elif isinstance(rec, Claim):
            self._claims.setdefault(rec.task, {})[rec.id] = (event.hlc, event.author, event.seq)
        elif isinstance(rec, Result):
            self._results.setdefault(rec.task, []).append((event.hlc, event.author, event.id, rec))
            self._result_seq[event.id] = event.seq
        elif isinstance(rec, Release):
            self._releases.setdefault(rec.claim, []).append((event.hlc, event.author, rec))
        elif isinstance(rec, Cancel):
            cur_c = self._cancels.get(rec.node)
            if cur_c is None or (event.hlc, event.author) < (cur_c[0], cur_c[1]):
                self._cancels[rec.node] = (event.hlc, event.author, rec)
        elif isinstance(rec, Hello):
            if "scorer" in rec.roles:
                self._marks.add((event.hlc, 0, event.author))
            cur_h = self._caps.get(event.author)
            if cur_h is None or event.hlc > cur_h[0]:
                self._caps[event.author] = (event.hlc, rec.caps)
                self._roles[event.author] = (event.hlc, rec.roles)
        elif isinstance(rec, Down):
            self._marks.add((event.hlc, 1, rec.node))
            self._down[rec.node] = max(event.hlc, self._down.get(rec.node, 0))
            if rec.upto is not None:
                self._down_upto[rec.node] = max(rec.upto, self._down_upto.get(rec.node, 0))
        self._nodes = None

    # -- derived tree --------------------------------------------------------------

    def _tree(self) -> dict[str, NodeState]:
        if self._nodes is None:
            self._live = None
            self._takeovers.clear()
            nodes: dict[str, NodeState] = {}
            for gid in sorted(self._goals):
                hlc, _eid, g = self._goals[gid]
                root = NodeState(gid, gid, None, 0, g.title, g.detail, ())
                root.ready_hlc = hlc
                self._build(root, g, nodes, blocked=False, failed=False, cancelled=None)
            self._nodes = nodes
        return self._nodes

    def liveness(self, fallback: int) -> Liveness:
        """Scorer liveness from hello/down marks."""
        if self._live is None or self._live._fallback != fallback:
            self._live = Liveness(self._marks, fallback)
        return self._live

    def _build(
        self,
        n: NodeState,
        g: GoalCreate,
        nodes: dict[str, NodeState],
        *,
        blocked: bool,
        failed: bool,
        cancelled: str | None,
    ) -> None:
        """Derive ``n`` and its subtree. ``blocked``/``failed``/``cancelled``
        come down from ancestors (an ancestor's unfinished or failed
        dependency holds back or dooms everything below it)."""
        nodes[n.id] = n
        own_cancel = self._cancels.get(n.id)
        n.cancelled = (own_cancel[2].reason or "cancelled") if own_cancel else cancelled
        deps = [nodes[d] for d in n.deps]  # earlier siblings: already built
        n.ready_hlc = max([n.ready_hlc, *(d.done_hlc for d in deps)])
        failed = failed or any(d.status in ("failed", "cancelled") for d in deps)
        blocked = blocked or any(d.status != "done" for d in deps)
        if n.depth >= g.max_depth:
            n.leaf = True
        if n.leaf is not True:
            self._decide(n, g)
        if n.leaf is False and n.accepted is not None:
            acc = self._proposals[n.id][n.accepted][2]
            kids: list[NodeState] = []
            for i, sub in enumerate(acc.subgoals):
                c = NodeState(
                    child_id(n.id, acc.id, i),
                    n.root,
                    n.id,
                    n.depth + 1,
                    sub.title,
                    sub.detail,
                    sub.caps,
                    deps=tuple(kids[d].id for d in sub.deps),
                    leaf=True if sub.atomic else None,
                )
                c.ready_hlc = max(n.decided_hlc or 0, n.ready_hlc)
                kids.append(c)
                self._build(c, g, nodes, blocked=blocked, failed=failed, cancelled=n.cancelled)
            n.children = [c.id for c in kids]
        self._task_state(n)
        n.status = self._status(n, g, nodes, blocked=blocked, failed=failed)

    def _status(
        self,
        n: NodeState,
        g: GoalCreate,
        nodes: dict[str, NodeState],
        *,
        blocked: bool,
        failed: bool,
    ) -> str:
        """The life-cycle state, by precedence: done, cancelled, failed, then
        open (undecided) / blocked, claimed, ready (leaf) / synthesis, split."""
        if n.result is not None:
            return "done"
        if n.cancelled is not None:
            return "cancelled"
        if failed:
            return "failed"
        if n.leaf is None:
            return "open"
        if n.leaf is True:
            if n.attempts >= g.max_attempts:
                return "failed"
            if blocked:
                return "blocked"
            return "claimed" if n.winner is not None else "ready"
        kids = [nodes[c] for c in n.children]
        if not all(k.status in _TERMINAL for k in kids):
            return "split"
        if n.attempts >= g.max_attempts:
            return "failed"
        n.ready_hlc = max([n.ready_hlc, *(k.done_hlc for k in kids)])
        return "synthesis"

    def _decide(self, n: NodeState, g: GoalCreate) -> None:
        props = self._proposals.get(n.id, {})
        live = self.liveness(g.quorum.scorers)
        outs = [
            evaluate(p, hlc, self._votes.get(pid, ()), g.quorum, live)
            for pid, (hlc, _a, p) in sorted(props.items())
        ]
        n.proposals = outs
        win = decide(outs, g.settle_ms)
        if win is None or win.decided is None:
            return
        n.accepted = win.proposal
        n.decided_hlc = win.decided[0]
        n.leaf = props[win.proposal][2].atomic

    def _task_state(self, n: NodeState) -> None:
        """Claims (winner, releases, failed attempts) and the accepted result,
        each ordered by its witnesses (module docs)."""
        claims = self._claims.get(n.id, {})
        window = self._goals[n.root][2].settle_ms
        order = self._witnesses.order
        rows: list[tuple[int, bytes, str, bool]] = []
        own: list[tuple[int, bytes, str]] = []  # live claims by their own HLC
        attempts = 0
        for cid in sorted(claims):
            hlc, author, seq = claims[cid]
            rels = [r for r in self._releases.get(cid, ()) if r[2].task == n.id]
            if any(r[2].failed for r in rels):
                attempts += 1
            down = seq <= self._down_upto.get(author, 0)  # covered by member.down
            rows.append((order(author, seq, hlc, window), author, cid, bool(rels) or down))
            if not (rels or down):
                own.append((hlc, author, cid))
        rows.sort()
        n.claims = rows
        n.attempts = attempts
        live = [(h, a, c) for h, a, c, rel in rows if not rel]
        n.winner = min(live) if live else None
        if live and min(own)[2] != min(live)[2]:
            self._takeovers["claim_takeovers_refused"] += 1
        results = self._results.get(n.id, ())
        claimers = {a for _h, a, _c, _r in rows}
        ordered = [(order(a, self._result_seq[i], h, window), a, i, r) for h, a, i, r in results]
        acc, dups = accepted_result(ordered, claimers)
        n.duplicates = dups
        if acc is not None:
            n.result = (acc[0], acc[1], acc[3].text)
            first = accepted_result(results, claimers)[0]
            if first is not None and first[2] != acc[2]:
                self._takeovers["result_takeovers_refused"] += 1

    # -- queries -------------------------------------------------------------------

    def goals(self) -> list[str]:
        """Root goal ids, sorted."""
        return sorted(self._goals)

    def goal(self, root: str) -> GoalCreate | None:
        """The creation record (config) of root goal ``root``."""
        g = self._goals.get(root)
        return g[2] if g else None

    def node(self, node_id: str) -> NodeState | None:
        """The derived state of one node, if it is in a tree."""
        return self._tree().get(node_id)

    def nodes(self) -> list[NodeState]:
        """Every node of every tree, in id order."""
        t = self._tree()
        return [t[k] for k in sorted(t)]

    def proposal(self, pid: str) -> tuple[int, bytes, Proposal] | None:
        """``(hlc, author, proposal)`` for a proposal id, if known."""
        for props in self._proposals.values():
            if pid in props:
                return props[pid]
        return None

    def proposals_for(self, node_id: str) -> list[tuple[int, bytes, Proposal]]:
        """Every proposal for ``node_id``, in id order."""
        props = self._proposals.get(node_id, {})
        return [props[k] for k in sorted(props)]

    def votes_for(self, pid: str) -> list[VoteRec]:
        """Every vote on proposal ``pid``, in ``(hlc, author)`` order."""
        return sorted(self._votes.get(pid, ()), key=lambda r: (r.hlc, r.author, r.eid))

    def settled(self, node_id: str, now_ms: int) -> bool:
        """True once ``node_id``'s decision is at least ``settle_ms`` old."""
        n = self.node(node_id)
        if n is None or n.decided_hlc is None:
            return False
        g = self._goals[n.root][2]
        return now_ms >= hlc_ms(n.decided_hlc) + g.settle_ms

    def _active(self, n: NodeState, now_ms: int) -> bool:
        """A node exists for acting: root, or child of a settled decision."""
        if n.cancelled is not None:
            return False
        return n.parent is None or self.settled(n.parent, now_ms)

    def open_goals(self, now_ms: int, *, speculative: bool = True) -> list[NodeState]:
        """Nodes that need a (new) proposal or votes: undecided, not terminal.

        With ``speculative`` (the default) children of a decision that has not
        settled yet are included: planning them early has no side effects and
        is merely wasted if the decision flips. Execution never speculates."""
        return [
            n
            for n in self.nodes()
            if n.leaf is None
            and n.accepted is None
            and n.status not in _TERMINAL
            and n.cancelled is None
            and (speculative or self._active(n, now_ms))
        ]

    def live_with_role(self, role: str) -> int:
        """Nodes whose latest ``plan.hello`` names ``role`` and that are not
        marked down since."""
        return sum(
            1
            for a, (h, roles) in self._roles.items()
            if role in roles and h > self._down.get(a, -1)
        )

    def next_round(self, node_id: str) -> int | None:
        """Round number a decomposer should propose for, or None (wait)."""
        n = self.node(node_id)
        if n is None or n.accepted is not None or n.leaf is not None:
            return None
        props = self.proposals_for(node_id)
        if not props:
            return 0
        if n.proposals and all(o.rejected for o in n.proposals):
            return max(p.round for _h, _a, p in props) + 1
        return None

    def path(self, node_id: str) -> tuple[str, ...]:
        """Titles from the root down to ``node_id``."""
        t = self._tree()
        out: list[str] = []
        cur = t.get(node_id)
        while cur is not None:
            out.append(cur.title)
            cur = t.get(cur.parent) if cur.parent else None
        return tuple(reversed(out))

    def task_info(self, task: str) -> TaskInfo | None:
        """What an executor needs to run ``task`` (None if it has no runnable task)."""
        t = self._tree()
        n = t.get(task)
        if n is None:
            return None
        if n.leaf is True:
            deps = list(n.deps)
            anc = t.get(n.parent) if n.parent else None
            while anc is not None:
                deps += anc.deps
                anc = t.get(anc.parent) if anc.parent else None
            inputs = tuple((t[d].title, _text(t[d])) for d in deps)
            kind = "execute"
        elif n.leaf is False and n.children:
            inputs = tuple((t[c].title, _text(t[c])) for c in n.children)
            kind = "synthesise"
        else:
            return None
        return TaskInfo(
            n.id, n.root, kind, n.title, n.detail, n.caps, n.ready_hlc, self.path(n.id), inputs
        )

    def claimable(self, now_ms: int, *, speculative: bool = False) -> list[TaskInfo]:
        """Tasks anyone may claim now, earliest ``ready_hlc`` first.

        With ``speculative``, tasks under a decision that has not settled yet
        are included: *claiming* them early has no side effect, and
        :meth:`claim_won` still holds execution back until both the decision
        and the claim have settled (the two windows overlap)."""
        out: list[TaskInfo] = []
        for n in self.nodes():
            if n.winner is not None or n.result is not None:
                continue
            if n.cancelled is not None or not (speculative or self._active(n, now_ms)):
                continue
            if (n.leaf is True and n.status == "ready") or (
                n.leaf is False and n.status == "synthesis"
            ):
                info = self.task_info(n.id)
                if info is not None:
                    out.append(info)
        out.sort(key=lambda ti: (ti.ready_hlc, ti.task))
        return out

    def claim_won(self, task: str, claim: str, now_ms: int) -> bool:
        """True if ``claim`` is the winning live claim on ``task``, settled, and
        the decision that created the task has settled too."""
        n = self.node(task)
        if n is None or n.winner is None or n.winner[2] != claim or n.result is not None:
            return False
        if n.status in ("cancelled", "failed") or not self._active(n, now_ms):
            return False
        return now_ms >= hlc_ms(n.winner[0]) + self._goals[n.root][2].settle_ms

    def claims_by(self, author: bytes) -> list[tuple[str, str]]:
        """Live ``(task, claim id)`` pairs held by ``author`` on unfinished tasks."""
        out = []
        for n in self.nodes():
            if n.result is not None:
                continue
            for _h, a, cid, rel in n.claims:
                if a == author and not rel:
                    out.append((n.id, cid))
        return out

    def next_deadline(self, now_ms: int) -> int | None:
        """Earliest time after ``now_ms`` at which a settle window closes (a
        decision, a winning claim or a proposal's gathering window), or None.
        Drivers re-poll roles then even if no event arrives."""
        best: int | None = None
        for n in self.nodes():
            settle = self._goals[n.root][2].settle_ms
            stamps = [n.decided_hlc or 0, n.winner[0] if n.winner else 0]
            if n.accepted is None:
                stamps += [h for h, _a, _p in self._proposals.get(n.id, {}).values()]
            for h in stamps:
                t = hlc_ms(h) + settle
                if h and t > now_ms and (best is None or t < best):
                    best = t
        return best

    def capabilities(self, author: bytes) -> tuple[str, ...]:
        """Capabilities ``author`` last advertised."""
        c = self._caps.get(author)
        return c[1] if c else ()

    def final_answer(self, root: str) -> str | None:
        """The synthesised answer of a root goal, once done."""
        n = self.node(root)
        return n.result[2] if n is not None and n.result is not None else None

    # -- snapshot ------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """The whole plan as plain data; identical on replicas with the same events."""
        t = self._tree()
        return {"goals": [self._snap(t, gid) for gid in self.goals()]}

    def tree(self, root: str) -> dict[str, Any] | None:
        """Plain-data tree of one root goal."""
        t = self._tree()
        return self._snap(t, root) if root in t else None

    def _snap(self, t: dict[str, NodeState], nid: str) -> dict[str, Any]:
        n = t[nid]
        out: dict[str, Any] = {
            "id": n.id,
            "title": n.title,
            "detail": n.detail,
            "depth": n.depth,
            "kind": {True: "leaf", False: "goal", None: "undecided"}[n.leaf],
            "status": n.status,
            "deps": list(n.deps),
            "caps": list(n.caps),
            "proposals": [
                {
                    "id": o.proposal,
                    "votes": o.votes,
                    "accepts": o.accepts,
                    "score_total": o.score_total,
                    "decided_hlc": o.decided[0] if o.decided else None,
                    "rejected": o.rejected,
                }
                for o in n.proposals
            ],
            "accepted": n.accepted,
            "decided_hlc": n.decided_hlc,
            "claims": [
                {"id": c, "author": a.hex(), "hlc": h, "released": r} for h, a, c, r in n.claims
            ],
            "result": None
            if n.result is None
            else {"text": n.result[2], "author": n.result[1].hex(), "hlc": n.result[0]},
            "duplicates": n.duplicates,
            "attempts": n.attempts,
            "cancelled": n.cancelled,
            "children": [self._snap(t, c) for c in n.children],
        }
        if n.parent is None:
            g = self._goals[n.id][2]
            out["config"] = {
                "quorum": [g.quorum.mode, g.quorum.value, g.quorum.scorers],
                "max_depth": g.max_depth,
                "max_subgoals": g.max_subgoals,
                "settle_ms": g.settle_ms,
                "max_attempts": g.max_attempts,
            }
        return out

    def stats(self) -> dict[str, Any]:
        """Counters: invalid events by reason, duplicates applied, tasks by status."""
        by_status = Counter(n.status for n in self.nodes())
        known = {pid for props in self._proposals.values() for pid in props}
        tree = self._tree()
        return {
            "invalid": dict(sorted(self.invalid.items())),
            "duplicates_applied": self.duplicates_applied,
            "events": len(self._seen),
            "nodes": dict(sorted(by_status.items())),
            "orphan_votes": sum(len(v) for p, v in self._votes.items() if p not in known),
            "orphan_claims": sum(len(c) for t, c in self._claims.items() if t not in tree),
            "duplicate_results": sum(n.duplicates for n in tree.values()),
            **{
                k: self._takeovers[k]
                for k in ("claim_takeovers_refused", "result_takeovers_refused")
            },
        }
