"""The planner on a running node: its plan view and control-socket operations.

Theory of operation
-------------------
A node's journal already holds every ``plan.*`` event it replicated; a
:class:`~hivemesh.core.plan.PlanView` over it is the whole plan as that
replica sees it. :func:`plan_view` attaches one view per daemon, created on
first use (a verified replay of the store, then live events), or adopts the
view a role runner registered with :func:`attach_view`.

Importing this module registers control operations (through
:func:`hivemesh.runtime.control.register_op`, the runtime's hook for
subsystems; the ``hivemesh`` CLI imports it via its ``plan`` command, so a
``hivemesh up`` daemon and every ``hivemesh agent`` serve them):

* ``plan.goal {title, detail?, quorum?, quorum_value?, scorers?, max_depth?,
  settle_ms?, max_attempts?}`` -> ``{"goal": id}``: append a new root goal;
* ``plan.show {goal?}`` -> ``{"goals", "tree", "answer", "digest", "stats"}``:
  the replica's tree (one goal, or all as ``snapshot``) and a digest of the
  whole snapshot, equal on replicas holding the same plan events;
* ``plan.cancel {goal, reason?}`` -> ``{"cancelled": id}``: append a cancel.

Unknown goals and bad arguments are :class:`~hivemesh.errors.InvalidArgument`.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import weakref
from typing import TYPE_CHECKING, Any

from hivemesh.core.plan import PlanView
from hivemesh.core.plan_events import (
    KIND_CANCEL,
    KIND_GOAL,
    MAX_DEPTH,
    cancel_body,
    goal_body,
    goal_id,
)
from hivemesh.errors import InvalidArgument
from hivemesh.runtime.control import register_op

if TYPE_CHECKING:
    from hivemesh.runtime.daemon import Daemon

__all__ = ["attach_view", "plan_digest", "plan_view", "show"]

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


def _str(args: dict[str, Any], name: str, default: str | None = None) -> str:
    v = args.get(name, default)
    if not isinstance(v, str) or (default is None and not v):
        raise InvalidArgument(f"argument {name!r} must be a non-empty string")
    return v


def _num(args: dict[str, Any], name: str, default: float, lo: float, hi: float) -> float:
    v = args.get(name, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
        raise InvalidArgument(f"argument {name!r} must be a number in [{lo}, {hi}]")
    return float(v)


async def _goal(d: Daemon, args: dict[str, Any]) -> Any:
    title = _str(args, "title")
    quorum = _str(args, "quorum", "majority")
    if quorum not in ("count", "majority", "fraction"):
        raise InvalidArgument("quorum must be count, majority or fraction")
    nonce = secrets.token_bytes(16)
    body = goal_body(
        title[:300],
        nonce,
        detail=(_str(args, "detail", "") or title[300:])[:4000],
        quorum=quorum,
        quorum_value=_num(args, "quorum_value", 0, 0, 1000),
        scorers=int(_num(args, "scorers", 3, 1, 1000)),
        max_depth=int(_num(args, "max_depth", 3, 1, MAX_DEPTH)),
        settle_ms=int(_num(args, "settle_ms", 200, 0, 60_000)),
        max_attempts=int(_num(args, "max_attempts", 3, 1, 100)),
    )
    plan_view(d)  # so the view sees the goal from its first event
    await d.append(KIND_GOAL, body)
    return {"goal": goal_id(d.identity.public, nonce)}


async def _show(d: Daemon, args: dict[str, Any]) -> Any:
    goal = args.get("goal")
    if goal is not None and not isinstance(goal, str):
        raise InvalidArgument("argument 'goal' must be a string")
    return show(plan_view(d), goal)


async def _cancel(d: Daemon, args: dict[str, Any]) -> Any:
    goal = _str(args, "goal")
    view = plan_view(d)
    if view.node(goal) is None:
        raise InvalidArgument(f"no goal or task {goal!r} in this node's journal")
    await d.append(KIND_CANCEL, cancel_body(goal, _str(args, "reason", "cancelled")[:300]))
    return {"cancelled": goal}


register_op("plan.goal", _goal)
register_op("plan.show", _show)
register_op("plan.cancel", _cancel)
