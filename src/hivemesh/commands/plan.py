"""Commands of the leaderless planner: add a goal, show the plan, cancel."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from hivemesh.commands._base import Command, Reply
from hivemesh.commands.node import WRITE_ERRORS
from hivemesh.errors import InvalidArgument

__all__ = ["PlanCancel", "PlanCancelReply", "PlanGoal", "PlanGoalReply", "PlanShow"]

#: The deepest goal tree (the core's ``plan_events.MAX_DEPTH``; a test keeps them equal).
MAX_PLAN_DEPTH = 8


def _in(name: str, value: float, lo: float, hi: float) -> None:
    if not lo <= value <= hi:
        raise InvalidArgument(f"argument {name!r} must be a number in [{lo}, {hi}]")


@dataclass(frozen=True, slots=True)
class PlanGoalReply(Reply):
    """The new root goal's id."""

    goal: str


@dataclass(frozen=True, slots=True)
class PlanGoal(Command):
    """Append a new root goal."""

    op: ClassVar[str] = "plan.goal"
    reply: ClassVar[type[Reply]] = PlanGoalReply
    errors: ClassVar[tuple[str, ...]] = WRITE_ERRORS
    title: str
    detail: str = ""
    quorum: str = "majority"
    quorum_value: float = 0
    scorers: float = 3
    max_depth: float = 3
    settle_ms: float = 200
    max_attempts: float = 3

    def check(self) -> None:
        """Quorum rule and numeric ranges."""
        if not self.title:
            raise InvalidArgument("argument 'title' must be a non-empty string")
        if self.quorum not in ("count", "majority", "fraction"):
            raise InvalidArgument("quorum must be count, majority or fraction")
        _in("quorum_value", self.quorum_value, 0, 1000)
        _in("scorers", self.scorers, 1, 1000)
        _in("max_depth", self.max_depth, 1, MAX_PLAN_DEPTH)
        _in("settle_ms", self.settle_ms, 0, 60_000)
        _in("max_attempts", self.max_attempts, 1, 100)


@dataclass(frozen=True, slots=True)
class PlanShow(Command):
    """The replica's plan: ``{goals, tree, answer, digest, stats}`` (and
    ``snapshot`` without ``goal``); an unknown goal is ``invalid_argument``."""

    op: ClassVar[str] = "plan.show"
    goal: str | None = None


@dataclass(frozen=True, slots=True)
class PlanCancelReply(Reply):
    """The goal or task cancelled."""

    cancelled: str


@dataclass(frozen=True, slots=True)
class PlanCancel(Command):
    """Append a cancel of goal or task ``goal``."""

    op: ClassVar[str] = "plan.cancel"
    reply: ClassVar[type[Reply]] = PlanCancelReply
    errors: ClassVar[tuple[str, ...]] = WRITE_ERRORS
    goal: str
    reason: str = "cancelled"

    def check(self) -> None:
        """A goal id."""
        if not self.goal:
            raise InvalidArgument("argument 'goal' must be a non-empty string")
