"""Planner event kinds, strict body validation, and derived identifiers.

Theory of operation
-------------------
The plan is written as ``plan.*`` events into ordinary feeds. This module is
the one gate between a msgpack body and the reducer in
:mod:`hivemesh.core.plan`: :func:`parse` turns an :class:`Event` into a small
frozen record or raises :class:`~hivemesh.errors.InvalidPlanEvent` (the view
counts it by reason and ignores the event). Nothing here depends on other
events, so validation is order-independent; references to goals, proposals
and claims that have not arrived yet are resolved later by the reducer.

Identifiers are derived, never chosen freely, so every replica agrees:

* a root goal id is ``H("goal", author, nonce)``;
* a proposal id and a claim id are a prefix of the carrying event's id;
* a child id is ``H("child", parent id, accepted proposal id, index)``.

The ``*_body`` helpers build valid bodies for writers (roles, the CLI).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hivemesh.core.event import Event
from hivemesh.errors import InvalidPlanEvent

__all__ = [
    "ALL_KINDS",
    "KIND_CANCEL",
    "KIND_CLAIM",
    "KIND_DOWN",
    "KIND_GOAL",
    "KIND_HELLO",
    "KIND_MEMBER_DOWN",
    "KIND_PROPOSE",
    "KIND_RELEASE",
    "KIND_RESULT",
    "KIND_VOTE",
    "MAX_CAPS",
    "MAX_DEPTH",
    "MAX_SUBGOALS",
    "QUORUM_MODES",
    "ROLES",
    "Cancel",
    "Claim",
    "Down",
    "GoalCreate",
    "Hello",
    "PlanRecord",
    "Proposal",
    "Quorum",
    "Release",
    "Result",
    "Subgoal",
    "Vote",
    "cancel_body",
    "child_id",
    "claim_body",
    "down_body",
    "goal_body",
    "goal_id",
    "hello_body",
    "parse",
    "propose_body",
    "release_body",
    "result_body",
    "vote_body",
]

KIND_GOAL = "plan.goal.create"
KIND_PROPOSE = "plan.propose"
KIND_VOTE = "plan.vote"
KIND_CLAIM = "plan.task.claim"
KIND_RESULT = "plan.task.result"
KIND_RELEASE = "plan.task.release"
KIND_CANCEL = "plan.goal.cancel"
KIND_HELLO = "plan.hello"
KIND_DOWN = "plan.down"
#: The membership layer's failure report, honoured by the plan view too.
KIND_MEMBER_DOWN = "member.down"
ALL_KINDS = frozenset(
    {
        KIND_GOAL,
        KIND_PROPOSE,
        KIND_VOTE,
        KIND_CLAIM,
        KIND_RESULT,
        KIND_RELEASE,
        KIND_CANCEL,
        KIND_HELLO,
        KIND_DOWN,
        KIND_MEMBER_DOWN,
    }
)

#: Hard caps (a goal's own config may only be stricter).
MAX_SUBGOALS = 64
MAX_DEPTH = 8
MAX_CAPS = 16
QUORUM_MODES = ("count", "majority", "fraction")
ROLES = ("decomposer", "scorer", "executor", "observer")

_ID_HEX = 32  # 16-byte ids, hex
_MAX_TITLE = 300
_MAX_TEXT = 4_000
_MAX_RESULT = 64 * 1024
_MAX_CAP = 40
_MAX_SCORE = 10


def _h(*parts: bytes) -> str:
    h = hashlib.blake2b(digest_size=16, person=b"hivemesh/plan")
    for p in parts:
        h.update(len(p).to_bytes(4, "big"))
        h.update(p)
    return h.hexdigest()


def goal_id(author: bytes, nonce: bytes) -> str:
    """The id of the root goal created by ``author`` with ``nonce``."""
    return _h(b"goal", author, nonce)


def child_id(parent: str, proposal: str, index: int) -> str:
    """The id of child ``index`` of ``parent`` under the accepted ``proposal``."""
    return _h(b"child", parent.encode(), proposal.encode(), index.to_bytes(2, "big"))


def event_ref(event: Event) -> str:
    """The proposal/claim id carried by ``event`` (prefix of its event id)."""
    return event.id[:16].hex()


# -- records -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Quorum:
    """Acceptance quorum: ``count`` votes, ``majority`` or ``fraction`` (per mille)
    of the live scorers; ``scorers`` sizes the denominator when no scorer has
    announced itself with ``plan.hello``."""

    mode: str
    value: int
    scorers: int

    def required(self, live: int) -> int:
        """Accept votes needed with ``live`` scorers alive."""
        if self.mode == "count":
            return self.value
        if self.mode == "majority":
            return live // 2 + 1
        return max(1, (self.value * live + 999) // 1000)


@dataclass(frozen=True, slots=True)
class GoalCreate:
    """A new root goal and the rules its whole tree follows."""

    id: str
    title: str
    detail: str
    quorum: Quorum
    max_depth: int
    max_subgoals: int
    settle_ms: int
    max_attempts: int


@dataclass(frozen=True, slots=True)
class Subgoal:
    """One proposed child: deps are indices of *earlier* siblings."""

    title: str
    detail: str
    deps: tuple[int, ...]
    atomic: bool
    caps: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Proposal:
    """A proposed split of ``goal`` (or, with ``atomic``, "do it directly")."""

    id: str
    goal: str
    round: int
    strategy: str
    atomic: bool
    subgoals: tuple[Subgoal, ...]


@dataclass(frozen=True, slots=True)
class Vote:
    """One scorer's verdict on one proposal; scores are 0..10."""

    proposal: str
    goal: str
    accept: bool
    concreteness: int
    non_overlap: int
    completeness: int
    notes: str

    @property
    def total(self) -> int:
        """Sum of the three scores (0..30)."""
        return self.concreteness + self.non_overlap + self.completeness


@dataclass(frozen=True, slots=True)
class Claim:
    """Intent to run ``task`` (a leaf, or the synthesis of an inner node)."""

    id: str
    task: str


@dataclass(frozen=True, slots=True)
class Result:
    """The outcome of ``task``."""

    task: str
    text: str


@dataclass(frozen=True, slots=True)
class Release:
    """Voids claim ``claim`` on ``task``; ``failed`` counts an attempt."""

    task: str
    claim: str
    failed: bool
    reason: str


@dataclass(frozen=True, slots=True)
class Cancel:
    """Cancels ``node`` and everything below it."""

    node: str
    reason: str


@dataclass(frozen=True, slots=True)
class Hello:
    """A node announces its roles and executor capabilities."""

    roles: tuple[str, ...]
    caps: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Down:
    """Failure detection marked ``node`` down (it may say hello again later).

    From the membership layer's ``member.down {a, upto}``, ``upto`` is the
    last seq of ``node``'s feed the reporter had seen: claims by ``node`` up
    to it are void (as in :mod:`hivemesh.core.claims`). ``plan.down`` has no
    ``upto`` and only shrinks scorer quorums."""

    node: bytes
    upto: int | None = None


# -- field checks ----------------------------------------------------------------


def _bad(reason: str) -> InvalidPlanEvent:
    return InvalidPlanEvent(reason)


def _map(body: Any, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict[str, Any]:
    if type(body) is not dict:
        raise _bad("body_not_map")
    keys = set(body)
    missing = [k for k in required if k not in keys]
    if missing:
        raise _bad("missing_field")
    if keys - set(required) - set(optional):
        raise _bad("unknown_field")
    return body


def _str(v: Any, limit: int, *, empty: bool = False) -> str:
    if type(v) is not str or len(v) > limit or (not empty and not v.strip()):
        raise _bad("bad_string")
    return v


def _int(v: Any, lo: int, hi: int) -> int:
    if type(v) is not int or not lo <= v <= hi:
        raise _bad("bad_int")
    return v


def _bool(v: Any) -> bool:
    if type(v) is not bool:
        raise _bad("bad_bool")
    return v


def _id(v: Any) -> str:
    if type(v) is not str or len(v) != _ID_HEX or v.strip("0123456789abcdef"):
        raise _bad("bad_id")
    return v


def _strs(v: Any, limit_n: int, limit_each: int) -> tuple[str, ...]:
    if type(v) is not list or len(v) > limit_n:
        raise _bad("bad_list")
    return tuple(sorted({_str(x, limit_each) for x in v}))


def _goal(ev: Event) -> GoalCreate:
    b = _map(
        ev.body,
        ("nonce", "title", "quorum", "max_depth", "max_subgoals", "settle_ms", "max_attempts"),
        ("detail",),
    )
    nonce = b["nonce"]
    if type(nonce) is not bytes or not 8 <= len(nonce) <= 32:
        raise _bad("bad_nonce")
    q = _map(b["quorum"], ("mode", "value", "scorers"))
    mode = q["mode"]
    if mode not in QUORUM_MODES:
        raise _bad("bad_quorum")
    scorers = _int(q["scorers"], 1, 1000)
    value = _int(q["value"], 0 if mode == "majority" else 1, 1000)
    quorum = Quorum(mode, value, scorers)
    return GoalCreate(
        id=goal_id(ev.author, nonce),
        title=_str(b["title"], _MAX_TITLE),
        detail=_str(b.get("detail", ""), _MAX_TEXT, empty=True),
        quorum=quorum,
        max_depth=_int(b["max_depth"], 0, MAX_DEPTH),
        max_subgoals=_int(b["max_subgoals"], 1, MAX_SUBGOALS),
        settle_ms=_int(b["settle_ms"], 0, 600_000),
        max_attempts=_int(b["max_attempts"], 1, 100),
    )


def _subgoal(v: Any, index: int) -> Subgoal:
    s = _map(v, ("title",), ("detail", "deps", "atomic", "caps"))
    deps_raw = s.get("deps", [])
    if type(deps_raw) is not list or len(deps_raw) > MAX_SUBGOALS:
        raise _bad("bad_deps")
    deps = tuple(sorted({_int(d, 0, MAX_SUBGOALS) for d in deps_raw}))
    if any(d >= index for d in deps):
        raise _bad("dep_not_earlier")
    return Subgoal(
        title=_str(s["title"], _MAX_TITLE),
        detail=_str(s.get("detail", ""), _MAX_TEXT, empty=True),
        deps=deps,
        atomic=_bool(s.get("atomic", False)),
        caps=_strs(s.get("caps", []), MAX_CAPS, _MAX_CAP),
    )


def _propose(ev: Event) -> Proposal:
    b = _map(ev.body, ("goal", "round", "subgoals"), ("strategy", "atomic"))
    subs = b["subgoals"]
    if type(subs) is not list:
        raise _bad("bad_subgoals")
    atomic = _bool(b.get("atomic", False))
    if atomic and subs:
        raise _bad("atomic_with_subgoals")
    if not atomic and not subs:
        raise _bad("no_subgoals")
    if len(subs) > MAX_SUBGOALS:
        raise _bad("too_many_subgoals")
    return Proposal(
        id=event_ref(ev),
        goal=_id(b["goal"]),
        round=_int(b["round"], 0, 1000),
        strategy=_str(b.get("strategy", "default"), _MAX_CAP),
        atomic=atomic,
        subgoals=tuple(_subgoal(s, i) for i, s in enumerate(subs)),
    )


def _vote(ev: Event) -> Vote:
    b = _map(
        ev.body,
        ("proposal", "goal", "accept", "concreteness", "non_overlap", "completeness"),
        ("notes",),
    )
    return Vote(
        proposal=_id(b["proposal"]),
        goal=_id(b["goal"]),
        accept=_bool(b["accept"]),
        concreteness=_int(b["concreteness"], 0, _MAX_SCORE),
        non_overlap=_int(b["non_overlap"], 0, _MAX_SCORE),
        completeness=_int(b["completeness"], 0, _MAX_SCORE),
        notes=_str(b.get("notes", ""), _MAX_TEXT, empty=True),
    )


def _claim(ev: Event) -> Claim:
    b = _map(ev.body, ("task",))
    return Claim(id=event_ref(ev), task=_id(b["task"]))


def _result(ev: Event) -> Result:
    b = _map(ev.body, ("task", "text"))
    return Result(task=_id(b["task"]), text=_str(b["text"], _MAX_RESULT, empty=True))


def _release(ev: Event) -> Release:
    b = _map(ev.body, ("task", "claim"), ("failed", "reason"))
    return Release(
        task=_id(b["task"]),
        claim=_id(b["claim"]),
        failed=_bool(b.get("failed", False)),
        reason=_str(b.get("reason", ""), _MAX_TEXT, empty=True),
    )


def _cancel(ev: Event) -> Cancel:
    b = _map(ev.body, ("node",), ("reason",))
    return Cancel(node=_id(b["node"]), reason=_str(b.get("reason", ""), _MAX_TEXT, empty=True))


def _hello(ev: Event) -> Hello:
    b = _map(ev.body, ("roles",), ("caps",))
    roles = _strs(b["roles"], len(ROLES), _MAX_CAP)
    if any(r not in ROLES for r in roles):
        raise _bad("unknown_role")
    return Hello(roles=roles, caps=_strs(b.get("caps", []), MAX_CAPS, _MAX_CAP))


def _down(ev: Event) -> Down:
    b = _map(ev.body, ("node",))
    node = b["node"]
    if type(node) is not bytes or len(node) != 32:
        raise _bad("bad_node")
    return Down(node=node)


def _member_down(ev: Event) -> Down:
    body = ev.body
    if type(body) is not dict:  # the membership layer's kind: extra keys tolerated
        raise _bad("body_not_map")
    node, upto = body.get("a"), body.get("upto")
    if type(node) is not bytes or len(node) != 32:
        raise _bad("bad_node")
    return Down(node=node, upto=_int(upto, 0, (1 << 63) - 1))


PlanRecord = GoalCreate | Proposal | Vote | Claim | Result | Release | Cancel | Hello | Down

_PARSERS: dict[str, Callable[[Event], PlanRecord]] = {
    KIND_GOAL: _goal,
    KIND_PROPOSE: _propose,
    KIND_VOTE: _vote,
    KIND_CLAIM: _claim,
    KIND_RESULT: _result,
    KIND_RELEASE: _release,
    KIND_CANCEL: _cancel,
    KIND_HELLO: _hello,
    KIND_DOWN: _down,
    KIND_MEMBER_DOWN: _member_down,
}


def parse(event: Event) -> PlanRecord:
    """Validate ``event``'s body into a record; :class:`InvalidPlanEvent` if bad."""
    parser = _PARSERS.get(event.kind)
    if parser is None:
        raise _bad("unknown_kind")
    return parser(event)


# -- body builders (for writers) ---------------------------------------------------


def goal_body(
    title: str,
    nonce: bytes,
    *,
    detail: str = "",
    quorum: str = "majority",
    quorum_value: float = 0,
    scorers: int = 3,
    max_depth: int = 3,
    max_subgoals: int = 12,
    settle_ms: int = 50,
    max_attempts: int = 3,
) -> dict[str, Any]:
    """A ``plan.goal.create`` body. ``quorum_value`` is a count for ``count``
    and a fraction in (0, 1] for ``fraction``."""
    value = int(quorum_value)
    if quorum == "fraction":
        value = max(1, min(1000, round(quorum_value * 1000)))
    return {
        "nonce": nonce,
        "title": title,
        "detail": detail,
        "quorum": {"mode": quorum, "value": value, "scorers": scorers},
        "max_depth": max_depth,
        "max_subgoals": max_subgoals,
        "settle_ms": settle_ms,
        "max_attempts": max_attempts,
    }


def propose_body(
    goal: str,
    round: int,
    subgoals: list[dict[str, Any]],
    *,
    strategy: str = "default",
    atomic: bool = False,
) -> dict[str, Any]:
    """A ``plan.propose`` body; each subgoal is ``{title, detail, deps, atomic, caps}``."""
    return {
        "goal": goal,
        "round": round,
        "strategy": strategy,
        "atomic": atomic,
        "subgoals": subgoals,
    }


def vote_body(
    proposal: str,
    goal: str,
    *,
    accept: bool,
    concreteness: int,
    non_overlap: int,
    completeness: int,
    notes: str = "",
) -> dict[str, Any]:
    """A ``plan.vote`` body."""
    return {
        "proposal": proposal,
        "goal": goal,
        "accept": accept,
        "concreteness": concreteness,
        "non_overlap": non_overlap,
        "completeness": completeness,
        "notes": notes,
    }


def claim_body(task: str) -> dict[str, Any]:
    """A ``plan.task.claim`` body."""
    return {"task": task}


def result_body(task: str, text: str) -> dict[str, Any]:
    """A ``plan.task.result`` body."""
    return {"task": task, "text": text}


def release_body(
    task: str, claim: str, *, failed: bool = False, reason: str = ""
) -> dict[str, Any]:
    """A ``plan.task.release`` body."""
    return {"task": task, "claim": claim, "failed": failed, "reason": reason}


def cancel_body(node: str, reason: str = "") -> dict[str, Any]:
    """A ``plan.goal.cancel`` body."""
    return {"node": node, "reason": reason}


def hello_body(roles: list[str], caps: list[str] | None = None) -> dict[str, Any]:
    """A ``plan.hello`` body."""
    return {"roles": sorted(roles), "caps": sorted(caps or [])}


def down_body(node: bytes) -> dict[str, Any]:
    """A ``plan.down`` body."""
    return {"node": node}
