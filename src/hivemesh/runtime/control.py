"""The local control socket: JSON lines over a 0600 unix socket.

Theory of operation
-------------------
``hivemesh`` commands and other local tools talk to a running daemon through
``<data_dir>/ctl.sock``. The socket is created with mode 0600 (umask set
around ``bind``), so only the node's user can drive it. The protocol is one
JSON object per line:

request (``op`` is a command's wire name, ``args`` its fields; see
:mod:`hivemesh.commands`)::

    {"id": 1, "op": "status", "args": {}}

response::

    {"id": 1, "ok": true, "result": ...}
    {"id": 1, "ok": false, "error": {"type": "UnknownPeer", "code": "unknown_peer",
                                      "message": "..."}}

Every request is looked up in :data:`hivemesh.commands.COMMANDS` and
validated into its typed request before anything runs; the daemon's one
handler for it (:mod:`hivemesh.runtime.handlers`) answers a typed reply,
encoded here. Clients map an error by its stable ``code`` (``type`` is
informative only).

Streaming operations (``ctx.watch``, ``events.watch``) answer
``{"id": 1, "ok": true, "result": {"stream": true}}`` and then send
``{"id": 1, "event": {...}}`` lines until the client hangs up.

Limits, so that no local client can wedge the daemon or lock out the CLI:

* At most :data:`MAX_CLIENTS` connections at once. A connection that is idle
  (waiting for its next request line) for ``control_timeout_s`` is closed;
  when all slots are taken, a newcomer takes the slot of the connection that
  has been idle longest (it is told so and closed). Only when every slot is
  busy with a request or a stream is a newcomer refused, with
  :class:`~hivemesh.errors.PeerBusy` (``control_refused_busy``). At most
  :data:`MAX_STREAMS` of the slots hold streams, so requests always find room.
* Every request runs under a deadline (``control_timeout_s``, or the
  request's own ``timeout_s`` plus a second).
* Malformed input gets a typed error with a stable code and is counted
  (``control_bad_request`` and ``control_bad_request_<code>``), never a
  crash or a silent hang-up: a line over :data:`MAX_LINE_BYTES`
  (``too_large``; the rest of the line is read and dropped, so the client
  is never cut off mid-write), JSON nested too deep (``too_deep``), text
  that is not UTF-8 (``bad_encoding``), a command that is not in the table
  (``unknown_command``), a field of the wrong type, missing, unknown or out
  of range, and anything else that is not a request (``invalid_argument``). The limits are
  :mod:`hivemesh.commands.wire`'s, which the client checks first.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hivemesh.commands import Command, command_class
from hivemesh.commands.wire import MAX_LINE_BYTES, decode
from hivemesh.errors import (
    DeadlineExceeded,
    HivemeshError,
    InputTooLarge,
    InvalidArgument,
    LocalProtocolError,
    PeerBusy,
)
from hivemesh.runtime.handlers import execute, open_stream
from hivemesh.runtime.supervise import reap

if TYPE_CHECKING:
    from hivemesh.runtime.daemon import Daemon


__all__ = ["MAX_LINE_BYTES", "ControlServer"]

log = logging.getLogger("hivemesh.runtime.control")

#: Concurrent control connections (see the module docs for who gets a slot).
MAX_CLIENTS = 64
#: Of those, the most that may hold a stream (``ctx.watch``, ``events.watch``).
MAX_STREAMS = 48


@dataclass(eq=False, slots=True)
class _Conn:
    """One control connection: idle (waiting for a request line) or busy."""

    idle_since: float
    idle: bool = True
    streaming: bool = False
    evicted: bool = False
    deadline: asyncio.Timeout | None = None  # armed while idle


class ControlServer:
    """Serves the control protocol for one daemon."""

    def __init__(self, daemon: Daemon, path: Path, *, timeout_s: float) -> None:
        self.daemon = daemon
        self.path = path
        self.timeout_s = timeout_s
        self._server: asyncio.base_events.Server | None = None
        self._clients: dict[asyncio.Task[Any], _Conn] = {}

    async def start(self) -> None:
        """Bind the socket with mode 0600 (replacing a stale one)."""
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        old = os.umask(0o177)
        try:
            self._server = await asyncio.start_unix_server(
                self._serve, path=str(self.path), limit=MAX_LINE_BYTES
            )
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)

    async def close(self) -> None:
        """Stop accepting, end client sessions, remove the socket file."""
        if self._server is not None:
            self._server.close()
        await reap(list(self._clients), "control client")
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def _make_room(self) -> bool:
        """Free a slot for a newcomer if all are taken: evict the connection
        idle longest. False if every slot is busy."""
        if len(self._clients) < MAX_CLIENTS:
            return True
        idle = [c for c in self._clients.values() if c.idle and not c.evicted]
        if not idle:
            return False
        victim = min(idle, key=lambda c: c.idle_since)
        victim.evicted = True
        if victim.deadline is not None:
            victim.deadline.reschedule(asyncio.get_running_loop().time())
        self.daemon.counters["control_evicted_idle"] += 1
        return True

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        counters = self.daemon.counters
        loop = asyncio.get_running_loop()
        if not self._make_room():
            counters["control_refused_busy"] += 1
            with contextlib.suppress(Exception):
                busy = PeerBusy(f"the daemon is serving {MAX_CLIENTS} control clients; retry")
                await _write(writer, _error(None, busy))
            writer.close()
            return
        conn = self._clients[task] = _Conn(loop.time())
        try:
            while True:
                conn.idle, conn.idle_since = True, loop.time()
                try:
                    async with asyncio.timeout(self.timeout_s) as conn.deadline:
                        line = await _read_line(reader)
                except TimeoutError:
                    if not conn.evicted:  # evictions were counted when decided
                        counters["control_idle_timeout"] += 1
                    why = "another client needed the slot" if conn.evicted else "idle"
                    msg = f"control connection closed: {why} (send a request within "
                    await _write(writer, _error(None, DeadlineExceeded(f"{msg}{self.timeout_s}s)")))
                    return
                except InputTooLarge as exc:
                    await self._bad_request(writer, None, exc)
                    continue
                # (an eviction that lost the race with this line is void)
                conn.idle, conn.deadline, conn.evicted = False, None, False
                if not line:
                    return
                try:
                    req = decode(line)
                    if not isinstance(req, dict) or not isinstance(req.get("op"), str):
                        raise InvalidArgument("a request is an object with an op")
                except InvalidArgument as exc:
                    await self._bad_request(writer, None, exc)
                    continue
                rid = req.get("id")
                try:
                    cmd = command_class(req["op"]).from_wire(req.get("args"))
                except InvalidArgument as exc:
                    await self._bad_request(writer, rid, exc)
                    continue
                if cmd.stream:
                    streams = sum(c.streaming for c in self._clients.values())
                    if streams >= MAX_STREAMS:
                        counters["control_refused_busy"] += 1
                        busy = PeerBusy(f"the daemon is serving {MAX_STREAMS} streams; retry")
                        await _write(writer, _error(rid, busy))
                        return
                    conn.streaming = True
                    await self._stream(rid, cmd, writer)
                    return
                await _write(writer, await self._call(rid, cmd))
        except (ConnectionError, asyncio.CancelledError):
            pass
        except TimeoutError:  # the client stopped reading its answers
            counters["control_slow_client"] += 1
        finally:
            self._clients.pop(task, None)
            writer.close()

    def _count_bad(self, exc: HivemeshError) -> None:
        counters = self.daemon.counters
        counters["control_bad_request"] += 1
        counters[f"control_bad_request_{exc.code}"] += 1

    async def _bad_request(
        self, writer: asyncio.StreamWriter, rid: Any, exc: HivemeshError
    ) -> None:
        self._count_bad(exc)
        await _write(writer, _error(rid, exc))

    async def _call(self, rid: Any, cmd: Command) -> dict[str, Any]:
        try:
            reply = await execute(self.daemon, cmd)  # under the command's deadline
        except InvalidArgument as exc:  # a value the daemon refused: counted like a bad request
            self._count_bad(exc)
            return _error(rid, exc)
        except HivemeshError as exc:
            return _error(rid, exc)
        except Exception as exc:  # a bug: report it, keep serving
            log.exception("control command %s failed", cmd.op)
            self.daemon.counters["control_internal_error"] += 1
            return {
                "id": rid,
                "ok": False,
                "error": {"type": type(exc).__name__, "code": "internal", "message": str(exc)},
            }
        return {"id": rid, "ok": True, "result": reply.to_wire()}

    async def _stream(self, rid: Any, cmd: Command, writer: asyncio.StreamWriter) -> None:
        events = open_stream(self.daemon, cmd)
        try:
            await _write(writer, {"id": rid, "ok": True, "result": {"stream": True}})
            async for event in events:
                await _write(writer, {"id": rid, "event": event})
        finally:
            await events.aclose()  # type: ignore[attr-defined]


def _error(rid: Any, exc: HivemeshError) -> dict[str, Any]:
    return {
        "id": rid,
        "ok": False,
        "error": {"type": type(exc).__name__, "code": exc.code, "message": str(exc)},
    }


async def _read_line(reader: asyncio.StreamReader) -> bytes:
    """One request line (b"" at EOF). A line over the reader's limit is read
    to its end and dropped, then :class:`InputTooLarge` is raised."""
    dropped = 0
    while True:  # bounded in time by the caller's deadline
        try:
            line = await reader.readuntil(b"\n")
        except asyncio.IncompleteReadError as exc:
            line = exc.partial  # the last line may lack its newline
        except asyncio.LimitOverrunError as exc:
            # exc.consumed bytes hold no newline: drop them and read on
            await reader.readexactly(exc.consumed)
            dropped += exc.consumed
            continue
        if not dropped:
            return line
        raise InputTooLarge(
            f"request line of {dropped + len(line)} bytes is over the control socket's "
            f"{MAX_LINE_BYTES} (use a blob for large data)"
        )


async def _write(writer: asyncio.StreamWriter, obj: dict[str, Any]) -> None:
    try:
        text = json.dumps(obj, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError) as exc:  # a result we cannot send: a bug
        log.error("control answer for request %r cannot be encoded: %s", obj.get("id"), exc)
        text = json.dumps(_error(obj.get("id"), LocalProtocolError(f"unencodable answer: {exc}")))
    writer.write(text.encode() + b"\n")
    t = writer.transport
    if t.is_closing() or t.get_write_buffer_size():  # else drain() would return at once
        async with asyncio.timeout(10.0):
            await writer.drain()
