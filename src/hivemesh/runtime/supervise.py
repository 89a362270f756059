"""Supervised asyncio tasks: no loop of a daemon dies quietly.

Theory of operation
-------------------
A daemon is only as alive as its loops: if its timer task ends, the control
socket still answers ``status`` while anti-entropy, SWIM probes and every
timeout have stopped. So every task a daemon starts runs under one
:class:`Supervisor`, and a failure is never silent:

* it is **logged** with its traceback (the cause), and **counted** in the
  daemon's counters (``task_failed_<name>``, shown by ``hivemesh status``,
  with the last error of each task in :meth:`Supervisor.statistics`);
* then it is **handled** as the task's :class:`~hivemesh.core.restarts.Policy`
  says (the rules: :class:`hivemesh.core.restarts.Restarts`): a long-lived
  task (:meth:`Supervisor.spawn`) starts again after a backoff (counted as
  ``task_restarted_<name>``), or the failure is fatal and calls ``on_fatal``
  once with a :class:`TaskFailed`: the daemon stops and its process exits
  non-zero. A long-lived task that *returns* while the supervisor is open
  has ended on its own, which is a failure too.
* Short background jobs (:meth:`Supervisor.spawn_once`: a flush, a trust
  re-check, a disconnect) are logged and counted, and end the daemon only
  if spawned ``fatal``; tasks another part owns (:meth:`Supervisor.watch`:
  a link's reader, a dialler) are logged and counted when they fail.
  Event-loop callbacks (a timer handle) run through :meth:`Supervisor.guard`,
  with the same choice.

A loop can also hang (awaiting something that never comes) instead of
failing. A task spawned with a ``stall_s`` calls :meth:`Supervisor.beat`
as it goes round; a watchdog reports a silence longer than that
(:func:`hivemesh.core.restarts.stalled_for`) once (logged with where the task waits, counted as
``task_stalled_<name>``, ``stalled`` in :meth:`Supervisor.statistics`)
until it beats again. It does not cancel the task: a stall may be
backpressure that ends by itself, and cancelling mid-send would lose what
it holds.

What escapes all of that (a callback nobody guarded, a task nobody awaited)
reaches the event loop's exception handler, which :meth:`Supervisor.install`
replaces: logged as before, and counted as ``loop_exception``.

``CancelledError``, ``KeyboardInterrupt`` and ``SystemExit`` pass through;
any other ``BaseException`` (loro reports a panic as one) is a failure like
an ``Exception``.

Stopping tasks one owns goes through :func:`reap`: cancel, then wait, with
only their ``CancelledError`` suppressed (never ``BaseException``): a task
that fails while it ends raises, and one that had failed before is logged.
"""

from __future__ import annotations

import asyncio
import logging
import time
import types
from collections import Counter
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

from hivemesh.core.restarts import (
    FATAL,
    RESTART,
    RESTART_WATCHED,
    GiveUp,
    Policy,
    Restarts,
    TaskHealth,
)
from hivemesh.errors import HivemeshError

__all__ = [
    "FATAL",
    "RESTART",
    "RESTART_WATCHED",
    "Policy",
    "Supervisor",
    "TaskFailed",
    "reap",
]

log = logging.getLogger("hivemesh.runtime")

_PASS_THROUGH = (asyncio.CancelledError, KeyboardInterrupt, SystemExit)


class TaskFailed(HivemeshError):
    """A supervised task failed in a way its policy calls fatal: the daemon
    stops and its process exits non-zero (the cause is chained)."""

    code = "task_failed"


def _awaiting(task: asyncio.Task[None]) -> str:
    """Where ``task`` waits: its chain of awaits, outermost first, one line each."""
    lines: list[str] = []
    obj: Any = task.get_coro()
    while len(lines) < 32:
        if isinstance(obj, types.CoroutineType):
            frame, obj = obj.cr_frame, obj.cr_await
        elif isinstance(obj, types.GeneratorType):  # a generator-based awaitable
            frame, obj = obj.gi_frame, obj.gi_yieldfrom
        else:  # a future, or nothing: the end of the chain
            break
        if frame is None:
            break
        lines.append(f"\n  {frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}")
    return "".join(lines)


class Supervisor:
    """Runs, watches and restarts a daemon's tasks (module docs).

    ``counters`` receives the ``task_*`` counters; ``on_fatal`` is called at
    most once, with the :class:`TaskFailed` that ends the daemon.
    """

    def __init__(
        self,
        counters: Counter[str],
        on_fatal: Callable[[TaskFailed], None],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.counters = counters
        self._on_fatal = on_fatal
        self._clock = clock
        self._tasks: set[asyncio.Task[None]] = set()
        self._loops: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._old_handler: Any = None
        self._handler: Any = None
        self._stats: dict[str, TaskHealth] = {}
        self._closing = False
        #: the failure that ended the daemon, if one did
        self.failure: TaskFailed | None = None

    # -- starting work -----------------------------------------------------------

    def spawn(
        self,
        name: str,
        factory: Callable[[], Coroutine[Any, Any, None]],
        policy: Policy = RESTART,
    ) -> asyncio.Task[None]:
        """Run the long-lived task ``factory()`` under ``policy`` until :meth:`close`."""
        self._stats.setdefault(name, TaskHealth())
        task = self._track(self._keep(name, factory, policy), name)
        self._loops.add(task)
        task.add_done_callback(self._loops.discard)
        if policy.stall_s is not None:
            watchdog = self._track(self._watch(name, task, policy.stall_s), f"{name}_watchdog")
            self._loops.add(watchdog)
            watchdog.add_done_callback(self._loops.discard)
        return task

    def beat(self, name: str) -> None:
        """Task ``name`` is making progress (see :attr:`Policy.stall_s`)."""
        stats = self._stats.get(name)
        if stats is not None and stats.beat(self._clock()):
            log.warning("the %s task is making progress again", name)

    def spawn_once(
        self, name: str, coro: Coroutine[Any, Any, None], *, fatal: bool = False
    ) -> asyncio.Task[None]:
        """Run the short job ``coro``; a failure is logged and counted (and,
        if ``fatal``, ends the daemon)."""
        task = self._track(coro, name)
        task.add_done_callback(lambda t: self._finished_once(name, t, fatal))
        return task

    def watch(self, name: str, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run ``coro`` as a task its owner keeps, cancels and awaits (a link's
        reader, a dialler): a failure is logged and counted when it happens,
        not when the owner gets round to awaiting it."""
        task = asyncio.get_running_loop().create_task(coro, name=f"hm-{name}")
        task.add_done_callback(lambda t: self._finished_once(name, t, False))
        return task

    def guard(
        self, name: str, fn: Callable[..., None], *, fatal: bool = False
    ) -> Callable[..., None]:
        """``fn`` wrapped for an event-loop callback (``call_later``): a failure
        is logged and counted (and, if ``fatal``, ends the daemon)."""

        def guarded(*args: Any) -> None:
            try:
                fn(*args)
            except _PASS_THROUGH:
                raise
            except BaseException as exc:
                self._failed(name, exc)
                if fatal:
                    self._fatal(name, exc, "")

        return guarded

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        """Count what reaches ``loop``'s exception handler (``loop_exception``)."""

        def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
            self.counters["loop_exception"] += 1
            loop.default_exception_handler(context)

        self._loop, self._old_handler = loop, loop.get_exception_handler()
        self._handler = handler
        loop.set_exception_handler(handler)

    # -- stopping ------------------------------------------------------------------

    def closing(self) -> None:
        """From now on a task that returns has finished, not failed."""
        self._closing = True

    async def stop_loops(self, timeout_s: float = 5.0) -> None:
        """Cancel the long-lived tasks and wait (at most ``timeout_s``) for them."""
        await self._cancel(self._loops, timeout_s)

    async def close(self, timeout_s: float = 5.0) -> None:
        """Cancel every task, wait (at most ``timeout_s``) for them to end, and
        give the event loop its exception handler back."""
        await self._cancel(self._tasks, timeout_s)
        loop, self._loop = self._loop, None
        if loop is not None and loop.get_exception_handler() is self._handler:
            loop.set_exception_handler(self._old_handler)  # unless another took it since

    async def _cancel(self, tasks: set[asyncio.Task[None]], timeout_s: float) -> None:
        self._closing = True
        me = asyncio.current_task()
        doomed = [t for t in tasks if t is not me]
        for task in doomed:
            task.cancel()
        if doomed:
            await asyncio.wait(doomed, timeout=timeout_s)

    async def drain(self, timeout_s: float = 5.0) -> None:
        """Wait (at most ``timeout_s``) for the short jobs running now."""
        tasks = [t for t in self._tasks if not t.done() and t is not asyncio.current_task()]
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_s)

    # -- what it saw -----------------------------------------------------------------

    def statistics(self) -> dict[str, dict[str, Any]]:
        """Each long-lived task: running, failures, restarts, last error, and
        (for a task that beats) whether it is stalled."""
        now = self._clock()
        return {name: s.snapshot(now) for name, s in sorted(self._stats.items())}

    # -- internals -------------------------------------------------------------------

    def _track(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro, name=f"hm-{name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _watch(self, name: str, task: asyncio.Task[None], stall_s: float) -> None:
        """Report ``task`` once per stall: no :meth:`beat` for ``stall_s``."""
        stats = self._stats[name]
        while not task.done():
            await asyncio.sleep(stall_s / 4)
            quiet_s = stats.stall(self._clock(), stall_s)
            if quiet_s is not None:
                self.counters[f"task_stalled_{name}"] += 1
                where = _awaiting(task)
                log.error("the %s task made no progress for %.1f s, at:%s", name, quiet_s, where)

    async def _keep(
        self, name: str, factory: Callable[[], Coroutine[Any, Any, None]], policy: Policy
    ) -> None:
        stats = self._stats[name]
        restarts = Restarts(policy)
        while True:
            stats.started(self._clock())
            try:
                await factory()
                if self._closing:
                    return
                raise RuntimeError(f"the {name} task returned while the node runs")
            except _PASS_THROUGH:
                raise
            except BaseException as exc:
                stats.running = False
                if self._closing:
                    return
                self._failed(name, exc)
                verdict = restarts.failed(self._clock())
                if isinstance(verdict, GiveUp):
                    self._fatal(name, exc, verdict.why)
                    return
                delay = verdict.delay_s
                log.warning("restarting the %s task in %.2f s", name, delay)
                await asyncio.sleep(delay)
                stats.restarts += 1
                self.counters[f"task_restarted_{name}"] += 1
            finally:
                stats.running = False

    def _finished_once(self, name: str, task: asyncio.Task[None], fatal: bool) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None:
            return
        self._failed(name, exc)
        if fatal:
            self._fatal(name, exc, "")

    def _failed(self, name: str, exc: BaseException) -> None:
        stats = self._stats.setdefault(name, TaskHealth())
        stats.failed(f"{type(exc).__name__}: {exc}")
        self.counters[f"task_failed_{name}"] += 1
        log.error("the %s task failed: %s", name, stats.last_error, exc_info=exc)

    def _fatal(self, name: str, exc: BaseException, why: str) -> None:
        self.counters[f"task_fatal_{name}"] += 1
        if self.failure is not None:
            return
        failure = TaskFailed(f"the {name} task failed{why}: {type(exc).__name__}: {exc}")
        failure.__cause__ = exc
        self.failure = failure
        log.critical("%s: stopping the node", failure)
        self._on_fatal(failure)


async def reap(tasks: Iterable[asyncio.Task[Any]], what: str = "task") -> None:
    """Cancel ``tasks`` and wait until each has ended.

    Only their cancellation is suppressed: an error a task raises while it
    ends propagates (a bug in its cleanup), and a task that had already
    failed is logged here (at debug level when a supervisor's ``watch``
    reported it already: its exception is then retrieved). Our own
    cancellation while waiting propagates too.
    """
    tasks = list(tasks)
    for task in tasks:
        task.cancel()
    for task in tasks:
        if task.done():
            if not task.cancelled() and task.exception() is not None:
                log.debug("%s %s had failed: %r", what, task.get_name(), task.exception())
            continue
        try:
            await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # we are cancelled ourselves, not only the task
