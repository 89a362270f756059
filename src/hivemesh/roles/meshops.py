"""The planner on a running node: its plan view and control-socket operations.

Theory of operation
-------------------
A node's journal already holds every ``plan.*`` event it replicated; a
:class:`~hivemesh.core.plan.PlanView` over it is the whole plan as that
replica sees it. :func:`plan_view` attaches one view per daemon, created on
first use (a verified replay of the store, then live events), or adopts the
view a role runner registered with :func:`attach_view`.

It holds the daemon's handlers of the plan commands
(:mod:`hivemesh.commands.plan`), which :mod:`hivemesh.runtime.handlers`
names in its table and imports on a node's first plan command:

* ``plan.goal {title, detail?, quorum?, quorum_value?, scorers?, max_depth?,
  settle_ms?, max_attempts?}`` -> ``{"goal": id}``: append a new root goal;
* ``plan.show {goal?}`` -> ``{"goals", "tree", "answer", "digest", "stats",
  "roles"}``: the replica's tree (one goal, or all as ``snapshot``), a digest
  of the whole snapshot, equal on replicas holding the same plan events, and
  how many live agents announced each role;
* ``plan.cancel {goal, reason?}`` -> ``{"cancelled": id}``: append a cancel.

Unknown goals and bad arguments are :class:`~hivemesh.errors.InvalidArgument`.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import weakref
from typing import TYPE_CHECKING, Any

from hivemesh.commands import PlanCancel, PlanCancelReply, PlanGoal, PlanGoalReply, PlanShow, Record
from hivemesh.core.plan import PlanView
from hivemesh.core.plan_events import (
    KIND_CANCEL,
    KIND_GOAL,
    ROLES,
    cancel_body,
    goal_body,
    goal_id,
)
from hivemesh.errors import InvalidArgument

if TYPE_CHECKING:
    from hivemesh.runtime.daemon import Daemon

__all__ = [
    "attach_view",
    "handle_cancel",
    "handle_goal",
    "handle_show",
    "plan_digest",
    "plan_view",
    "show",
]

_VIEWS: weakref.WeakKeyDictionary[Any, PlanView] = weakref.WeakKeyDictionary()


def attach_view(daemon: Daemon, view: PlanView) -> None:
    """Make ``view`` (already added to ``daemon``) the one the ops read."""
    _VIEWS[daemon] = view


def plan_view(daemon: Daemon) -> PlanView:
    """The daemon's plan view (added and replayed on first use)."""
    view = _VIEWS.get(daemon)
    if view is None:
        view = PlanView()
        daemon.add_view(view)
        _VIEWS[daemon] = view
    return view


def plan_digest(snapshot: dict[str, Any]) -> str:
    """A hex digest of a plan snapshot (canonical JSON, BLAKE2b-128)."""
    raw = json.dumps(snapshot, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.blake2b(raw, digest_size=16).hexdigest()


def show(view: PlanView, goal: str | None = None) -> dict[str, Any]:
    """What ``plan.show`` answers (see module docs)."""
    snap = view.snapshot()
    out: dict[str, Any] = {
        "goals": view.goals(),
        "digest": plan_digest(snap),
        "stats": view.stats(),
        "roles": {r: view.live_with_role(r) for r in ROLES},
        "tree": None,
        "answer": None,
    }
    if goal is None:
        out["snapshot"] = snap
        return out
    tree = view.tree(goal)
    if tree is None or tree.get("id") != goal or view.goal(goal) is None:
        raise InvalidArgument(f"no goal {goal!r} in this node's journal")
    out["tree"] = tree
    out["answer"] = view.final_answer(goal)
    return out


async def handle_goal(d: Daemon, req: PlanGoal) -> PlanGoalReply:
    """The daemon's handler of ``plan.goal`` (the request is already checked)."""
    nonce = secrets.token_bytes(16)
    body = goal_body(
        req.title[:300],
        nonce,
        detail=(req.detail or req.title[300:])[:4000],
        quorum=req.quorum,
        quorum_value=float(req.quorum_value),
        scorers=int(req.scorers),
        max_depth=int(req.max_depth),
        settle_ms=int(req.settle_ms),
        max_attempts=int(req.max_attempts),
    )
    plan_view(d)  # so the view sees the goal from its first event
    await d.append(KIND_GOAL, body)
    return PlanGoalReply(goal=goal_id(d.identity.public, nonce))


async def handle_show(d: Daemon, req: PlanShow) -> Record:
    """The daemon's handler of ``plan.show``."""
    return Record(show(plan_view(d), req.goal))


async def handle_cancel(d: Daemon, req: PlanCancel) -> PlanCancelReply:
    """The daemon's handler of ``plan.cancel``."""
    view = plan_view(d)
    if view.node(req.goal) is None:
        raise InvalidArgument(f"no goal or task {req.goal!r} in this node's journal")
    await d.append(KIND_CANCEL, cancel_body(req.goal, req.reason[:300]))
    return PlanCancelReply(cancelled=req.goal)
