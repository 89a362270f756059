"""What a planner role is: a polled object that reads the plan and returns work.

Theory of operation
-------------------
A role never touches the network or the journal. A driver (the node runtime,
or :mod:`hivemesh.roles.swarm` in-process) calls :meth:`Role.poll` with the
current :class:`~hivemesh.core.plan.PlanView` and ``now_ms`` whenever the view
changed or ``view.next_deadline(now_ms)`` passed. ``poll`` returns actions:

* :class:`Emit` -- an event ``(kind, body)`` to append to this node's feed now;
* :class:`Job` -- a coroutine (an LLM call) the driver runs concurrently;
  it resolves to more :class:`Emit` s, appended when it finishes.

Roles are idempotent across polls: they remember in-flight and finished work
locally *and* check the view for events they wrote before (so a restarted
role, whose memory is gone, does not repeat what its feed already says).
Every LLM failure is caught inside the job, logged and counted; the role
backs off and retries on a later poll, or falls back, so nothing is stuck on
a bad reply.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from hivemesh.core.plan import PlanView
from hivemesh.core.plan_events import (
    KIND_DOWN,
    KIND_HELLO,
    KIND_RELEASE,
    down_body,
    hello_body,
    release_body,
)

__all__ = ["FALLBACK", "Action", "Emit", "Job", "Role", "RoleBase", "clip", "failure_events"]

log = logging.getLogger("hivemesh.roles")

#: Strategy name of the "do the goal directly" proposal a decomposer makes
#: after failed rounds or failed LLM calls.
FALLBACK = "fallback"


@dataclass(frozen=True, slots=True)
class Emit:
    """An event this node should append."""

    kind: str
    body: dict[str, Any]


@dataclass(slots=True)
class Job:
    """Concurrent work; ``run()`` returns the events to append afterwards."""

    key: str
    run: Callable[[], Awaitable[list[Emit]]] = field(repr=False)


Action = Emit | Job


class Role(Protocol):
    """The driver-facing surface of every role."""

    name: str
    me: bytes

    def poll(self, view: PlanView, now_ms: int) -> list[Action]:
        """Decide what to do now."""
        ...


class RoleBase:
    """Shared bookkeeping: in-flight keys, failure backoff, counters."""

    name = "role"

    def __init__(self, me: bytes, *, retry_after_ms: int = 1000, max_failures: int = 3) -> None:
        self.me = me
        self.retry_after_ms = retry_after_ms
        self.max_failures = max_failures
        self.inflight: set[str] = set()
        self.failures: Counter[str] = Counter()
        self.last_error: dict[str, str] = {}
        self._retry_at: dict[str, int] = {}
        self.counters: Counter[str] = Counter()
        self._greeted = False

    def hello(self) -> Emit:
        """This role's ``plan.hello`` advertisement."""
        return Emit(KIND_HELLO, hello_body([self.name]))

    def greeting(self) -> list[Action]:
        """The hello, on the first poll only (a restart says hello again)."""
        if self._greeted:
            return []
        self._greeted = True
        return [self.hello()]

    def busy(self, key: str, now_ms: int) -> bool:
        """True while ``key`` runs or waits out its failure backoff."""
        return key in self.inflight or now_ms < self._retry_at.get(key, 0)

    def job(
        self,
        key: str,
        now_ms: int,
        work: Callable[[], Awaitable[list[Emit]]],
        on_error: Callable[[Exception], list[Emit]] | None = None,
    ) -> Job:
        """Wrap ``work`` so failures are logged, counted and backed off."""
        self.inflight.add(key)

        async def run() -> list[Emit]:
            try:
                out = await work()
                self.failures.pop(key, None)
                return out
            except Exception as exc:  # any LLM/tool failure must not kill the role
                code = getattr(exc, "code", type(exc).__name__)
                self.counters[f"error.{code}"] += 1
                self.failures[key] += 1
                self.last_error[key] = f"{code}: {exc}"[:300]
                self._retry_at[key] = now_ms + self.retry_after_ms * self.failures[key]
                log.warning("%s %s failed (%s): %s", self.name, key[:12], code, exc)
                return on_error(exc) if on_error is not None else []
            finally:
                self.inflight.discard(key)

        return Job(key, run)


def clip(text: str, max_bytes: int) -> str:
    """``text`` cut to at most ``max_bytes`` of UTF-8 (events have a size limit)."""
    raw = text.encode()
    if len(raw) <= max_bytes:
        return text
    return raw[:max_bytes].decode(errors="ignore") + " [...]"


def failure_events(view: PlanView, node: bytes) -> list[Emit]:
    """What a node that saw ``node`` fail writes: a ``plan.down`` mark (shrinks
    scorer quorums) and a release of each claim ``node`` holds on unfinished
    tasks (so they are re-claimed).

    Where the membership layer already writes ``member.down {a, upto}``, the
    plan view honours that directly (claims up to ``upto`` are void, the
    scorer no longer counts) and this helper is not needed."""
    out = [Emit(KIND_DOWN, down_body(node))]
    for task, claim in view.claims_by(node):
        out.append(Emit(KIND_RELEASE, release_body(task, claim, reason="claimer down")))
    return out
