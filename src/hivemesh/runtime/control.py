"""The local control socket: JSON lines over a 0600 unix socket.

Theory of operation
-------------------
``hivemesh`` commands and other local tools talk to a running daemon through
``<data_dir>/ctl.sock``. The socket is created with mode 0600 (umask set
around ``bind``), so only the node's user can drive it. The protocol is one
JSON object per line:

request::

    {"id": 1, "op": "status", "args": {}}

response::

    {"id": 1, "ok": true, "result": ...}
    {"id": 1, "ok": false, "error": {"type": "UnknownPeer", "code": "unknown_peer",
                                      "message": "..."}}

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
  that is not UTF-8 (``bad_encoding``), anything else that is not a request
  or names no op (``invalid_argument``). The limits are
  :mod:`hivemesh.runtime.wirejson`'s, which the client checks first.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hivemesh.core.event import Event
from hivemesh.core.identity import address_of
from hivemesh.errors import (
    DeadlineExceeded,
    HivemeshError,
    InputTooLarge,
    InvalidArgument,
    LocalProtocolError,
    PeerBusy,
)
from hivemesh.runtime.wirejson import MAX_LINE_BYTES, decode

if TYPE_CHECKING:
    from hivemesh.runtime.daemon import Daemon


__all__ = ["MAX_LINE_BYTES", "ControlServer", "event_json", "jsonable"]

log = logging.getLogger("hivemesh.runtime.control")

#: Concurrent control connections (see the module docs for who gets a slot).
MAX_CLIENTS = 64
#: Of those, the most that may hold a stream (``ctx.watch``, ``events.watch``).
MAX_STREAMS = 48

Op = Callable[["Daemon", dict[str, Any]], Awaitable[Any]]


def jsonable(obj: Any) -> Any:
    """``obj`` with bytes as ``{"$bytes": base64}`` so it fits in JSON."""
    if isinstance(obj, bytes):
        return {"$bytes": base64.b64encode(obj).decode("ascii")}
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    return obj


def event_json(ev: Event) -> dict[str, Any]:
    """An event as plain JSON data."""
    return {
        "author": address_of(ev.author),
        "seq": ev.seq,
        "hlc": ev.hlc,
        "kind": ev.kind,
        "id": ev.id.hex(),
        "body": jsonable(ev.body),
    }


def _arg(args: dict[str, Any], name: str, kind: type, default: Any = ...) -> Any:
    if name not in args:
        if default is ...:
            raise InvalidArgument(f"missing argument {name!r}")
        return default
    value = args[name]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise InvalidArgument(f"argument {name!r} must be {kind.__name__}")
    return value


async def _status(d: Daemon, args: dict[str, Any]) -> Any:
    return d.status()


async def _peers(d: Daemon, args: dict[str, Any]) -> Any:
    return d.peers()


async def _ctx_get(d: Daemon, args: dict[str, Any]) -> Any:
    name = _arg(args, "context", str, "default")
    ctx = d.context(name)
    key = _arg(args, "key", str, None)
    if key is None:
        return jsonable(d.context_view.snapshot().get(name, {}))
    return {"key": key, "found": key in ctx, "value": jsonable(ctx.get(key))}


async def _ctx_set(d: Daemon, args: dict[str, Any]) -> Any:
    name = _arg(args, "context", str, "default")
    key = _arg(args, "key", str)
    if "value" not in args:
        raise InvalidArgument("missing argument 'value'")
    ctx = d.context(name)
    ctx[key] = args["value"]
    n = await d.commit()
    return {
        "context": name,
        "key": key,
        "events": n,
        "seq": d.node.journal.head(d.identity.public).seq,
    }


def _set_handle(d: Daemon, args: dict[str, Any]) -> Any:
    """The set named in ``args``: the add-wins set, or the grow-only one with ``grow_only``."""
    ctx = d.context(_arg(args, "context", str, "default"))
    name = _arg(args, "set", str)
    return ctx.gset(name) if _arg(args, "grow_only", bool, False) else ctx.orset(name)


def _elements(args: dict[str, Any]) -> list[str]:
    elements: list[str] = _arg(args, "elements", list)
    if not elements or not all(isinstance(e, str) for e in elements):
        raise InvalidArgument("elements must be a non-empty list of strings")
    return elements


async def _ctx_add(d: Daemon, args: dict[str, Any]) -> Any:
    handle = _set_handle(d, args)
    for element in _elements(args):
        handle.add(element)
    return {"members": handle.members(), "events": await d.commit()}


async def _ctx_remove(d: Daemon, args: dict[str, Any]) -> Any:
    if args.get("grow_only"):
        raise InvalidArgument("a grow-only set has no remove")
    handle = _set_handle(d, args)
    for element in _elements(args):
        handle.discard(element)
    return {"members": handle.members(), "events": await d.commit()}


async def _ctx_members(d: Daemon, args: dict[str, Any]) -> Any:
    return {"members": _set_handle(d, args).members()}


async def _name_claim(d: Daemon, args: dict[str, Any]) -> Any:
    name = _arg(args, "name", str)
    owner = await d.claim_name(name)
    return {"name": name, "owner": owner, "ours": owner == d.address}


async def _names(d: Daemon, args: dict[str, Any]) -> Any:
    return d.names.snapshot()


async def _revoke(d: Daemon, args: dict[str, Any]) -> Any:
    addr = d.check_address(_arg(args, "address", str))
    await d.revoke(addr)
    return {"revoked": addr}


async def _admit(d: Daemon, args: dict[str, Any]) -> Any:
    addr = d.check_address(_arg(args, "address", str))
    d.admit(addr)
    return {"trusted": addr}


async def _trust_list(d: Daemon, args: dict[str, Any]) -> Any:
    t = d.trust
    return {
        "mode": d.config.trust_mode,
        "trusted": t.trusted(),
        "revoked": t.revoked(),
        "swarms": t.swarms(),
    }


async def _invite(d: Daemon, args: dict[str, Any]) -> Any:
    return d.invite(_arg(args, "ttl_s", int, 3600), _arg(args, "swarm", str, None))


async def _join(d: Daemon, args: dict[str, Any]) -> Any:
    # answers before this request's own deadline (timeout_s + 1 s, else control_timeout_s)
    default_s = max(1.0, d.config.control_timeout_s - 1.0)
    timeout_s = _timeout(args) if "timeout_s" in args else default_s
    return await d.join(_arg(args, "token", str), timeout_s=timeout_s)


async def _send(d: Daemon, args: dict[str, Any]) -> Any:
    to = _arg(args, "to", str)
    if "data" not in args:
        raise InvalidArgument("missing argument 'data'")
    timeout_s = _timeout(args)
    return await d.send_direct(to, args["data"], timeout_s=timeout_s)


async def _inbox(d: Daemon, args: dict[str, Any]) -> Any:
    limit = _arg(args, "limit", int, 100)
    if not 0 < limit <= 10_000:
        raise InvalidArgument("limit must be 1..10000")
    remove = _arg(args, "remove", bool, False)
    return jsonable(d.inbox(limit, remove=remove))


async def _ping(d: Daemon, args: dict[str, Any]) -> Any:
    return await d.ping(_arg(args, "address", str), timeout_s=_timeout(args))


def _timeout(args: dict[str, Any]) -> float:
    t = args.get("timeout_s", 10.0)
    if not isinstance(t, (int, float)) or isinstance(t, bool) or not 0 < t <= 3600:
        raise InvalidArgument("timeout_s must be a number in (0, 3600]")
    return float(t)


async def _append(d: Daemon, args: dict[str, Any]) -> Any:
    kind = _arg(args, "kind", str)
    if kind.startswith(("ctx.", "name.", "node.")):
        raise InvalidArgument(f"kind {kind!r} is reserved; use the matching command")
    ev = await d.append(kind, args.get("body"))
    return event_json(ev)


async def _stop(d: Daemon, args: dict[str, Any]) -> Any:
    asyncio.get_running_loop().call_soon(d.request_stop)
    return {"stopping": True}


OPS: dict[str, Op] = {
    "append": _append,
    "ctx.add": _ctx_add,
    "ctx.get": _ctx_get,
    "ctx.members": _ctx_members,
    "ctx.remove": _ctx_remove,
    "ctx.set": _ctx_set,
    "inbox": _inbox,
    "invite": _invite,
    "join": _join,
    "name.claim": _name_claim,
    "names": _names,
    "peers": _peers,
    "ping": _ping,
    "send": _send,
    "status": _status,
    "stop": _stop,
    "trust.admit": _admit,
    "trust.list": _trust_list,
    "trust.revoke": _revoke,
}
STREAMS = ("ctx.watch", "events.watch")


def register_op(name: str, op: Op) -> None:
    """Add an operation (used by subsystems wired into the daemon)."""
    OPS[name] = op


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
        for t in list(self._clients):
            t.cancel()
        for t in list(self._clients):
            with contextlib.suppress(BaseException):
                await t
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
                args = req.get("args") or {}
                op = req["op"]
                if op in STREAMS:
                    streams = sum(c.streaming for c in self._clients.values())
                    if streams >= MAX_STREAMS:
                        counters["control_refused_busy"] += 1
                        busy = PeerBusy(f"the daemon is serving {MAX_STREAMS} streams; retry")
                        await _write(writer, _error(rid, busy))
                        return
                    conn.streaming = True
                    await self._stream(rid, op, args, writer)
                    return
                await _write(writer, await self._call(rid, op, args))
        except (ConnectionError, asyncio.CancelledError):
            pass
        except TimeoutError:  # the client stopped reading its answers
            counters["control_slow_client"] += 1
        finally:
            self._clients.pop(task, None)
            writer.close()

    async def _bad_request(
        self, writer: asyncio.StreamWriter, rid: Any, exc: HivemeshError
    ) -> None:
        counters = self.daemon.counters
        counters["control_bad_request"] += 1
        counters[f"control_bad_request_{exc.code}"] += 1
        await _write(writer, _error(rid, exc))

    async def _call(self, rid: Any, op: str, args: Any) -> dict[str, Any]:
        fn = OPS.get(op)
        if fn is None or not isinstance(args, dict):
            self.daemon.counters["control_bad_request"] += 1
            self.daemon.counters[f"control_bad_request_{InvalidArgument.code}"] += 1
            return _error(rid, InvalidArgument(f"unknown op {op!r:.80} or bad args"))
        timeout = self.timeout_s
        t = args.get("timeout_s")
        if isinstance(t, (int, float)) and not isinstance(t, bool) and t > 0:
            timeout = float(t) + 1.0
        try:
            async with asyncio.timeout(timeout):  # no extra task per request (wait_for's)
                if op != "status":  # the rest needs complete views (runtime.rehydration)
                    await self.daemon.rehydration.wait()
                result = await fn(self.daemon, args)
        except TimeoutError:
            return _error(rid, DeadlineExceeded(f"{op} did not finish in {timeout:.1f}s"))
        except HivemeshError as exc:
            return _error(rid, exc)
        except Exception as exc:  # a bug: report it, keep serving
            log.exception("control op %s failed", op)
            self.daemon.counters["control_internal_error"] += 1
            return {
                "id": rid,
                "ok": False,
                "error": {"type": type(exc).__name__, "code": "internal", "message": str(exc)},
            }
        return {"id": rid, "ok": True, "result": result}

    async def _stream(self, rid: Any, op: str, args: Any, writer: asyncio.StreamWriter) -> None:
        d = self.daemon
        await d.rehydration.wait()
        if not isinstance(args, dict):
            await _write(writer, _error(rid, InvalidArgument("bad args")))
            return
        if op == "ctx.watch":
            ctx_name = args.get("context", "default")
            if not isinstance(ctx_name, str):
                await _write(writer, _error(rid, InvalidArgument("context must be a string")))
                return
            sub = d.subscribe(["ctx.update"])
        else:
            kinds = args.get("kinds")
            if kinds is not None and not (
                isinstance(kinds, list) and all(isinstance(k, str) for k in kinds)
            ):
                await _write(writer, _error(rid, InvalidArgument("kinds must be strings")))
                return
            sub = d.subscribe(kinds)
        try:
            await _write(writer, {"id": rid, "ok": True, "result": {"stream": True}})
            if op == "ctx.watch":
                snap = d.context_view.snapshot().get(ctx_name, {})
                await _write(
                    writer, {"id": rid, "event": {"context": ctx_name, "state": jsonable(snap)}}
                )
            while True:
                ev = await sub.queue.get()
                if op == "ctx.watch":
                    if not isinstance(ev.body, dict) or ev.body.get("c") != ctx_name:
                        continue
                    snap = d.context_view.snapshot().get(ctx_name, {})
                    msg = {
                        "context": ctx_name,
                        "author": address_of(ev.author),
                        "state": jsonable(snap),
                    }
                    await _write(writer, {"id": rid, "event": msg})
                else:
                    await _write(writer, {"id": rid, "event": event_json(ev)})
        finally:
            d.unsubscribe(sub)


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
