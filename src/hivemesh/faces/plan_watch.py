"""The live plan tree in a terminal: ``hivemesh plan watch`` and the observer agent.

Theory of operation
-------------------
A watcher shows the plan trees a node holds, redrawn as they change. It
reads them from a :class:`TreeSource` (the local node's ``plan.show`` over
the control socket, or an observer agent's own
:class:`~hivemesh.core.plan.PlanView`) and redraws

* when the source says something changed (plan events from the node's
  ``events.watch`` stream, or the observer's view applying an event), and
* every :data:`REFRESH_S` anyway: a status can change with time alone
  (a settle window closing), with no event to announce it.

Both sources build the tree from the journal, so a watcher started late, or
on a node that joined late, shows the whole tree: the node replays its
journal into the plan view before it answers.

On a terminal the trees are a rich ``Live`` display, coloured by status. On
anything else (a pipe, a file, a CI log) each change prints the plain-text
tree once, under a ``-- plan`` header line, and nothing is printed while
the text stays the same. ``until_done`` ends the watch when every shown
goal is done, failed or cancelled; ``once`` prints the current trees and
returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TextIO

from hivemesh.core.plan_events import ALL_KINDS as PLAN_KINDS
from hivemesh.errors import ConnectionClosed, InvalidArgument
from hivemesh.roles.observer import render_rich, render_text

__all__ = [
    "REFRESH_S",
    "TERMINAL",
    "ClientSource",
    "TreeDisplay",
    "TreeSource",
    "finished",
    "watch",
]

#: Redraw at least this often (statuses also change with time alone).
REFRESH_S = 0.5
#: Statuses of a finished goal.
TERMINAL = ("done", "failed", "cancelled")


class TreeSource(Protocol):
    """Where a watcher gets trees from."""

    async def trees(self) -> list[dict[str, Any]]:
        """The trees to show now (snapshot nodes of :meth:`PlanView.tree`)."""
        ...

    async def changed(self, timeout_s: float) -> None:
        """Return when something changed, or after ``timeout_s``."""
        ...


class ClientSource:
    """Trees from a running node (``plan.show``), woken by its plan events.

    ``goal`` picks one goal; without it every goal the node holds is shown.
    A goal the node does not hold yet (it may still be catching up) shows
    as no tree until it arrives.
    """

    def __init__(self, client: Any, goal: str | None = None) -> None:
        from hivemesh.commands import EventsWatch

        self.client = client
        self.goal = goal
        self._dirty = asyncio.Event()
        self._events = client.stream(EventsWatch(kinds=tuple(sorted(PLAN_KINDS))))
        self._reader: asyncio.Task[None] | None = None

    async def _read(self) -> None:
        async for _ev in self._events:
            self._dirty.set()
        raise ConnectionClosed("the node ended its event stream")

    async def trees(self) -> list[dict[str, Any]]:
        """The chosen goal's tree, or every goal's."""
        from hivemesh.commands import PlanShow

        if self._reader is None:
            self._reader = asyncio.ensure_future(self._read())
        if self.goal is not None:
            try:
                return [(await self.client.run(PlanShow(goal=self.goal))).to_wire()["tree"]]
            except InvalidArgument:  # not in this node's journal (yet: it may be catching up)
                return []
        trees: list[dict[str, Any]] = (await self.client.run(PlanShow())).to_wire()["snapshot"][
            "goals"
        ]
        return trees

    async def changed(self, timeout_s: float) -> None:
        """Plan events arrived, or ``timeout_s`` passed (a failed stream raises)."""
        reader = self._reader
        if reader is not None and reader.done():
            reader.result()  # raises why the stream ended
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._dirty.wait()
        self._dirty.clear()

    async def aclose(self) -> None:
        """Stop following the node."""
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionClosed):
                await self._reader
        await self._events.aclose()


class TreeDisplay:
    """Draws trees on ``out``: rich Live on a terminal, text blocks otherwise."""

    def __init__(self, out: TextIO, *, width: int = 60, clock: Callable[[], float] = time.time):
        self.out = out
        self.width = width
        self.rich = out.isatty()
        self._clock = clock
        self._live: Any = None
        self._last = ""
        self.frames = 0

    def text(self, trees: list[dict[str, Any]]) -> str:
        """The plain-text form of ``trees``."""
        if not trees:
            return "(no goals yet)"
        blocks = [render_text(t, width=self.width) for t in trees]
        return "\n\n".join(blocks)

    def show(self, trees: list[dict[str, Any]]) -> None:
        """Draw ``trees`` if they look different from the last drawing."""
        text = self.text(trees)
        if text == self._last:
            return
        self._last = text
        self.frames += 1
        if self.rich:
            self._show_rich(trees)
            return
        stamp = time.strftime("%H:%M:%S", time.localtime(self._clock()))
        done = sum(1 for t in trees if t["status"] in TERMINAL)
        print(f"-- plan {stamp}: {len(trees)} goal(s), {done} finished", file=self.out)
        print(text, file=self.out, flush=True)

    def _show_rich(self, trees: list[dict[str, Any]]) -> None:
        from rich.console import Console, Group
        from rich.live import Live
        from rich.text import Text

        body: Any = (
            Group(*(render_rich(t, width=self.width) for t in trees))
            if trees
            else Text("(no goals yet)")
        )
        if self._live is None:
            self._live = Live(body, console=Console(file=self.out), refresh_per_second=4)
            self._live.start()
        else:
            self._live.update(body)

    def close(self) -> None:
        """End a Live display (the last drawing stays on the terminal)."""
        if self._live is not None:
            self._live.stop()
            self._live = None


def finished(trees: list[dict[str, Any]]) -> bool:
    """True if there are trees and every one is done, failed or cancelled."""
    return bool(trees) and all(t["status"] in TERMINAL for t in trees)


async def watch(
    source: TreeSource,
    display: TreeDisplay,
    *,
    once: bool = False,
    until_done: bool = False,
    timeout_s: float | None = None,
    stop: Callable[[], Awaitable[bool]] | None = None,
) -> list[dict[str, Any]]:
    """Redraw ``source``'s trees on ``display`` (see module docs); returns the
    last trees. ``timeout_s`` bounds the whole watch
    (:class:`~hivemesh.errors.DeadlineExceeded` past it, with ``until_done``)."""
    from hivemesh.errors import DeadlineExceeded

    loop = asyncio.get_running_loop()
    deadline = None if timeout_s is None else loop.time() + timeout_s
    while True:
        trees = await source.trees()
        display.show(trees)
        if once or (until_done and finished(trees)):
            return trees
        if stop is not None and await stop():
            return trees
        wait = REFRESH_S
        if deadline is not None:
            left = deadline - loop.time()
            if left <= 0:
                if until_done:
                    raise DeadlineExceeded(f"the plan did not finish in {timeout_s}s")
                return trees
            wait = min(wait, left)
        await source.changed(wait)
