"""An in-process driver for planner roles over a :class:`LocalJournal`.

This is the thin pump the node runtime will replace: poll every role when
the journal changed or the earliest settle deadline passed, append what they
emit, run their jobs as asyncio tasks and append the jobs' results. Each
member reads either the swarm's shared :class:`PlanView` or a view of its
own (fed by the same journal). :meth:`crash` models a process dying: its
jobs are cancelled and it stops polling; what it already wrote stays.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from hivemesh.core.plan import PlanView
from hivemesh.roles.base import Emit, Job, Role
from hivemesh.roles.local import LocalJournal

__all__ = ["LocalSwarm"]

log = logging.getLogger("hivemesh.roles.swarm")


@dataclass
class _Member:
    role: Role
    view: PlanView
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    alive: bool = True


class LocalSwarm:
    """Roles, one journal, one asyncio loop."""

    def __init__(self, journal: LocalJournal, *, max_idle_ms: int = 100) -> None:
        self.journal = journal
        self.view = PlanView()
        journal.add_view(self.view)
        self.max_idle_ms = max_idle_ms
        self.members: list[_Member] = []
        self._changed = asyncio.Event()
        self.polls = 0
        self.append_errors = 0

    def add(self, role: Role, *, own_view: bool = False) -> PlanView:
        """Add a role; returns the view it reads."""
        view = self.view
        if own_view:
            view = PlanView()
            self.journal.add_view(view)
        self.members.append(_Member(role, view))
        self._changed.set()
        return view

    def append(self, author: bytes, emit: Emit) -> None:
        """Append one event on behalf of ``author`` and wake the pump. An event
        that cannot be encoded (over the size limit) is logged and counted."""
        try:
            self.journal.append(author, emit.kind, emit.body)
        except ValueError as exc:
            self.append_errors += 1
            log.warning("dropped %s event: %s", emit.kind, exc)
            return
        self._changed.set()

    def crash(self, me: bytes) -> None:
        """Stop every member whose node is ``me`` and cancel its jobs."""
        for m in self.members:
            if m.role.me == me and m.alive:
                m.alive = False
                for t in list(m.tasks):
                    t.cancel()

    async def _run_job(self, m: _Member, job: Job) -> None:
        try:
            emits = await job.run()
        except asyncio.CancelledError:
            return
        if m.alive:
            for e in emits:
                self.append(m.role.me, e)

    def step(self) -> int:
        """Poll every live member once; returns the number of actions."""
        now = self.journal.clock_ms()
        n = 0
        for m in self.members:
            if not m.alive:
                continue
            self.polls += 1
            for a in m.role.poll(m.view, now):
                n += 1
                if isinstance(a, Emit):
                    self.append(m.role.me, a)
                else:
                    task = asyncio.get_running_loop().create_task(self._run_job(m, a))
                    m.tasks.add(task)
                    task.add_done_callback(m.tasks.discard)
        return n

    async def run_until(self, done: Callable[[], bool], timeout_s: float) -> bool:
        """Pump until ``done()`` or the timeout; True if done."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout_s
        while not done():
            if loop.time() >= end:
                return False
            self._changed.clear()
            self.step()
            if self._changed.is_set():
                continue
            now = self.journal.clock_ms()
            waits = [self.max_idle_ms]
            for v in {id(m.view): m.view for m in self.members if m.alive}.values():
                d = v.next_deadline(now)
                if d is not None:
                    waits.append(d - now)
            wait_ms = min(waits)
            wait_s = max(0.0, min(wait_ms / 1000.0, end - loop.time()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), wait_s + 0.001)
        return True

    async def aclose(self) -> None:
        """Cancel every running job."""
        tasks = [t for m in self.members for t in m.tasks]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
