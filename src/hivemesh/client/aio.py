"""An asyncio client for a local daemon's control socket (for the faces).

The blocking :class:`~hivemesh.client.blocking.Client` suits the CLI; the
faces that serve other programs (the MCP server, the A2A server, the live
plan watcher) run on an event loop and use this one::

    client = AsyncClient("~/.hivemesh")
    reply = await client.run(CtxSet(key="goal", value="ship it"))
    async for event in client.stream(CtxWatch(context="default")):
        ...

Each request opens its own connection (a Unix socket, so cheap) under a
bounded number of concurrent requests, and has a deadline: the command's
own ``timeout_s`` plus a margin, else the client's ``timeout_s``. Errors
come back typed by their stable code (:func:`hivemesh.error_codes.error_from_wire`);
a request the daemon would refuse for its form is refused here first, with
the same typed error (:mod:`hivemesh.commands.wire`). A daemon that is
not there raises :class:`~hivemesh.errors.DaemonNotRunning`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

from hivemesh.commands import Command, Reply
from hivemesh.commands.wire import MAX_LINE_BYTES, encode
from hivemesh.error_codes import error_from_wire
from hivemesh.errors import DaemonNotRunning, DeadlineExceeded

__all__ = ["AsyncClient"]

_SOCKET_NAME = "ctl.sock"
#: Most requests in flight at once from one client.
MAX_CONCURRENT = 16
#: Extra time past a command's own deadline for its answer to arrive.
_MARGIN_S = 2.0


class AsyncClient:
    """Talk to the daemon whose data dir is ``data_dir`` (see module docs)."""

    def __init__(self, data_dir: str | Path, *, timeout_s: float = 10.0) -> None:
        self.data_dir = Path(data_dir).expanduser()
        self.path = self.data_dir / _SOCKET_NAME
        self.timeout_s = timeout_s
        self._ids = itertools.count(1)
        self._slots = asyncio.Semaphore(MAX_CONCURRENT)

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            return await asyncio.open_unix_connection(str(self.path), limit=2 * MAX_LINE_BYTES)
        except OSError as exc:
            raise DaemonNotRunning(f"no daemon answering at {self.path}: {exc}") from None

    async def _first(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes
    ) -> dict[str, Any]:
        writer.write(request)
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            await writer.drain()  # if it hung up, it may have said why first
        try:
            line = await reader.readline()
        except (ConnectionResetError, ValueError) as exc:
            raise DaemonNotRunning(f"daemon at {self.path} broke the connection: {exc}") from None
        if not line:
            raise DaemonNotRunning(f"daemon at {self.path} closed the connection")
        try:
            resp = json.loads(line)
        except ValueError:
            raise DaemonNotRunning(
                f"daemon at {self.path} answered garbage: {line[:80]!r}"
            ) from None
        if not isinstance(resp, dict):
            raise DaemonNotRunning(f"daemon at {self.path} answered garbage: {line[:80]!r}")
        if not resp.get("ok"):
            raise error_from_wire(resp.get("error") or {"message": "refused"})
        return resp

    async def call(self, op: str, args: dict[str, Any], timeout_s: float | None = None) -> Any:
        """Run operation ``op`` with JSON ``args``; its JSON result (or its typed error)."""
        own = args.get("timeout_s")
        deadline = (own if isinstance(own, (int, float)) else timeout_s or self.timeout_s) + (
            _MARGIN_S
        )
        request = encode({"id": next(self._ids), "op": op, "args": args})
        async with self._slots:
            writer: asyncio.StreamWriter | None = None
            try:
                async with asyncio.timeout(deadline):
                    reader, writer = await self._open()
                    resp = await self._first(reader, writer, request)
            except TimeoutError:
                raise DeadlineExceeded(f"{op}: no answer in {deadline:.1f}s") from None
            finally:
                if writer is not None:
                    writer.close()
        return resp.get("result")

    async def run(self, request: Command) -> Reply:
        """Run a typed command; its typed reply (or its typed error)."""
        result = await self.call(request.op, request.to_wire(), request.deadline_s())
        return type(request).reply.from_wire(result)

    async def stream(self, request: Command) -> AsyncGenerator[Any, None]:
        """The events of a streaming command until the daemon ends it or the
        caller stops iterating (the connection is closed then)."""
        line = encode({"id": next(self._ids), "op": request.op, "args": request.to_wire()})
        writer: asyncio.StreamWriter | None = None
        try:
            async with asyncio.timeout(self.timeout_s + _MARGIN_S):
                reader, writer = await self._open()
                await self._first(reader, writer, line)
            while True:
                raw = await reader.readline()
                if not raw:
                    return
                yield json.loads(raw)["event"]
        except TimeoutError:
            raise DeadlineExceeded(f"{request.op}: the stream did not open in time") from None
        finally:
            if writer is not None:
                writer.close()
