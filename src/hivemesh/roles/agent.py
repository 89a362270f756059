"""A planner role on a real node: ``hivemesh agent --role ROLE``.

Theory of operation
-------------------
One process is one node (its own identity, store, connections) running one
role, so a role's events form one feed and failure detection on that node
releases exactly that role's claims. :class:`RoleDriver` is the thin pump
between a :class:`hivemesh.Node` and a role (the networked twin of
:class:`~hivemesh.roles.swarm.LocalSwarm`):

* the node folds the journal into a :class:`~hivemesh.core.plan.PlanView`
  (verified replay first, then live events, including ``member.down {a,
  upto}`` from membership); every applied event wakes the pump;
* the pump calls ``role.poll(view, now_ms)`` when woken, when the view's next
  settle deadline passes, or every ``max_idle_ms``; each :class:`Emit` is
  appended through the node (signed, stored, gossiped), each :class:`Job`
  runs as a task whose emits are appended when it finishes;
* an append that fails (an event over the size limit) or a ``poll`` that
  raises is logged and counted in :attr:`RoleDriver.counters`, never fatal
  (a failing poll is retried on the next wake-up).

Why separate processes rather than roles inside ``hivemesh up``: a role's
identity is its node's key, so one role per node keeps claims, votes and
failure detection per role, and a crash of one agent takes out exactly one
role (what the resilience tests kill). ``hivemesh up`` stays a plain node;
it serves ``plan.show``/``plan.goal``/``plan.cancel`` (:mod:`hivemesh.roles.meshops`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from typing import Any

from hivemesh.core.event import Event
from hivemesh.core.plan import PlanView
from hivemesh.errors import ConfigError, HivemeshError
from hivemesh.llm.base import LLMProvider
from hivemesh.roles import meshops
from hivemesh.roles.base import Emit, Job, Role
from hivemesh.roles.decomposer import Decomposer
from hivemesh.roles.executor import Executor, ToolBox
from hivemesh.roles.observer import Observer
from hivemesh.roles.scorer import Scorer
from hivemesh.runtime.supervise import reap

__all__ = ["ROLE_NAMES", "RoleDriver", "make_role"]

log = logging.getLogger("hivemesh.roles.agent")

ROLE_NAMES = ("decomposer", "scorer", "executor", "observer")


def make_role(
    name: str,
    me: bytes,
    llm: LLMProvider | None,
    *,
    strategy: str = "",
    caps: tuple[str, ...] = (),
    max_concurrent: int = 4,
    tools: ToolBox | None = None,
) -> Role:
    """Build the role ``name`` for node key ``me`` (observers need no LLM;
    ``tools`` are an executor's)."""
    if name == "observer":
        return Observer(me)
    if llm is None:
        raise ConfigError(f"role {name} needs an LLM")
    if name == "decomposer":
        return Decomposer(me, llm, strategy=strategy or "by activity")
    if name == "scorer":
        return Scorer(me, llm)
    if name == "executor":
        return Executor(me, llm, caps=caps, max_concurrent=max_concurrent, tools=tools)
    raise ConfigError(f"unknown role {name!r}; one of {', '.join(ROLE_NAMES)}")


class _Waking:
    """Feeds a plan view and wakes the pump on every event."""

    kinds = PlanView.kinds
    witnessed_kinds = PlanView.witnessed_kinds  # the node witnesses claims and results

    def __init__(self, view: PlanView, wake: asyncio.Event) -> None:
        self.view = view
        self.wake = wake

    def apply(self, event: Event) -> None:
        self.view.apply(event)
        self.wake.set()


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class RoleDriver:
    """Polls one role over a running node's plan view (see module docs)."""

    def __init__(self, node: Any, role: Role, *, max_idle_ms: int = 250) -> None:
        self.node = node
        self.role = role
        self.max_idle_ms = max_idle_ms
        self.view = PlanView()
        self.counters: Counter[str] = Counter()
        self._wake = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        node.add_view(_Waking(self.view, self._wake))
        meshops.attach_view(node.daemon, self.view)

    async def _append(self, emit: Emit) -> None:
        try:
            await self.node.append(emit.kind, emit.body)
            self.counters[f"appended.{emit.kind}"] += 1
        except (ValueError, HivemeshError) as exc:  # e.g. an event over the size limit
            self.counters["append_errors"] += 1
            log.warning("%s: dropped %s event: %s", self.role.name, emit.kind, exc)

    async def _run_job(self, job: Job) -> None:
        for emit in await job.run():
            await self._append(emit)
        self._wake.set()

    async def step(self) -> int:
        """Poll the role once and act; returns the number of actions."""
        try:
            actions = self.role.poll(self.view, _now_ms())
        except Exception:  # a role bug must not take the node down: count, retry later
            self.counters["poll_errors"] += 1
            log.exception("%s: poll failed", self.role.name)
            return 0
        for a in actions:
            if isinstance(a, Emit):
                await self._append(a)
            else:
                task = asyncio.get_running_loop().create_task(self._run_job(a))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        return len(actions)

    async def run(self, stop: asyncio.Event) -> None:
        """Pump until ``stop`` is set; then cancel running jobs."""
        try:
            while not stop.is_set():
                self._wake.clear()
                await self.step()
                if self._wake.is_set():
                    continue
                now = _now_ms()
                wait_ms = self.max_idle_ms
                d = self.view.next_deadline(now)
                if d is not None:
                    wait_ms = max(0, min(wait_ms, d - now + 1))
                waiters = [
                    asyncio.ensure_future(self._wake.wait()),
                    asyncio.ensure_future(stop.wait()),
                ]
                try:
                    await asyncio.wait(
                        waiters, timeout=wait_ms / 1000, return_when=asyncio.FIRST_COMPLETED
                    )
                finally:
                    for w in waiters:
                        w.cancel()
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        """Cancel running jobs."""
        await reap(list(self._tasks), "agent job")
