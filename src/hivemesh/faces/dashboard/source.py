"""Where the dashboard reads its node: typed commands and a stream of events.

A :class:`Source` is the dashboard's one way into a node. It runs typed
commands of :mod:`hivemesh.commands` (``peers``, ``plan.show``,
``audit.answer``...) and yields the node's new journal events as plain JSON
(the shape of ``events.watch``: ``author, seq, hlc, kind, id, body``). The
dashboard decides nothing about the node: everything it shows is a
command's answer.

Two sources:

* :class:`ControlSource` talks to a daemon's control socket (``hivemesh
  dashboard --data-dir``): commands through the blocking
  :class:`~hivemesh.client.blocking.Client` on a worker thread, each under
  the client's deadline, and the event stream over an asyncio connection
  to the same socket (``events.watch``);
* :class:`NodeSource` wraps an in-process :class:`hivemesh.Node`
  (``Node.call``, ``Node.subscribe``).

A stream that ends (the daemon stopped or restarted) ends the iterator;
whoever reads it (:mod:`hivemesh.faces.dashboard.live`, under a supervisor)
opens it again with a backoff.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from hivemesh.client.blocking import Client
from hivemesh.commands.wire import MAX_LINE_BYTES, encode
from hivemesh.error_codes import error_from_wire
from hivemesh.errors import DaemonNotRunning, DeadlineExceeded

if TYPE_CHECKING:
    from hivemesh.commands import Command, Reply
    from hivemesh.node import Node

__all__ = ["ControlSource", "NodeSource", "Source"]


class Source(Protocol):
    """What the dashboard reads a node through (see module docs)."""

    #: Shown on the page: where the node lives.
    label: str

    async def run(self, request: Command) -> Reply:
        """Run one typed command; its typed reply, or its typed error."""
        ...

    def watch(self) -> AsyncIterator[dict[str, Any]]:
        """New journal events as JSON until the node goes away."""
        ...


class ControlSource:
    """A daemon reached through its control socket in ``data_dir``."""

    def __init__(self, data_dir: str | Path, *, timeout_s: float = 10.0) -> None:
        self.client = Client(data_dir, timeout_s=timeout_s)
        self.label = str(self.client.data_dir)
        self.timeout_s = timeout_s

    async def run(self, request: Command) -> Reply:
        """Run ``request`` on a worker thread (the client has its own deadline)."""
        return await asyncio.to_thread(self.client.run, request)

    async def watch(self) -> AsyncIterator[dict[str, Any]]:
        """``events.watch`` over the control socket (see module docs)."""
        path = str(self.client.path)
        try:
            async with asyncio.timeout(self.timeout_s):
                reader, writer = await asyncio.open_unix_connection(path, limit=MAX_LINE_BYTES)
        except (OSError, TimeoutError) as exc:
            raise DaemonNotRunning(f"no daemon answering at {path}: {exc}") from None
        try:
            writer.write(encode({"id": 1, "op": "events.watch", "args": {}}))
            try:
                async with asyncio.timeout(self.timeout_s):
                    await writer.drain()
                    first = json.loads(await reader.readline() or b"null")
            except TimeoutError:
                raise DeadlineExceeded(f"events.watch: no answer in {self.timeout_s} s") from None
            if not isinstance(first, dict):
                raise DaemonNotRunning(f"daemon at {path} closed the stream")
            if not first.get("ok"):
                raise error_from_wire(first.get("error") or {})
            while line := await reader.readline():  # no deadline: quiet swarms are quiet
                msg = json.loads(line)
                if isinstance(msg, dict) and isinstance(msg.get("event"), dict):
                    yield msg["event"]
        finally:
            writer.close()


class NodeSource:
    """An in-process :class:`hivemesh.Node` (it must be started)."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.label = str(node.config.data_dir)

    async def run(self, request: Command) -> Reply:
        """``Node.call``."""
        return await self.node.call(request)

    async def watch(self) -> AsyncIterator[dict[str, Any]]:
        """``Node.subscribe`` (every kind), as plain JSON."""
        from hivemesh.commands import jsonable

        async for ev in self.node.subscribe():
            yield {
                "author": ev.author,
                "seq": ev.seq,
                "hlc": ev.hlc,
                "kind": ev.kind,
                "id": ev.id,
                "body": jsonable(ev.body),
            }
