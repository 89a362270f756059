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

At most :data:`MAX_CLIENTS` connections are served at once (more are
refused with an error and counted). Every request runs under a deadline
(``control_timeout_s``, or the request's own ``timeout_s`` plus a second); a
line over :data:`MAX_LINE_BYTES`, bad JSON or an unknown op gets a typed
error and is counted, never a crash.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hivemesh.core.event import Event
from hivemesh.core.identity import address_of
from hivemesh.errors import DeadlineExceeded, HivemeshError, InvalidArgument

if TYPE_CHECKING:
    from hivemesh.runtime.daemon import Daemon


__all__ = ["MAX_LINE_BYTES", "ControlServer", "event_json", "jsonable"]

log = logging.getLogger("hivemesh.runtime.control")

MAX_LINE_BYTES = 1024 * 1024
#: Concurrent control connections; more are refused (counted).
MAX_CLIENTS = 64

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
    "ctx.get": _ctx_get,
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


class ControlServer:
    """Serves the control protocol for one daemon."""

    def __init__(self, daemon: Daemon, path: Path, *, timeout_s: float) -> None:
        self.daemon = daemon
        self.path = path
        self.timeout_s = timeout_s
        self._server: asyncio.base_events.Server | None = None
        self._clients: set[asyncio.Task[Any]] = set()

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

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        counters = self.daemon.counters
        if len(self._clients) >= MAX_CLIENTS:
            counters["control_refused_busy"] += 1
            with contextlib.suppress(Exception):
                await _write(writer, _error(None, InvalidArgument("too many control clients")))
            writer.close()
            return
        self._clients.add(task)
        try:
            while True:
                try:
                    line = await reader.readline()
                except (ValueError, asyncio.LimitOverrunError):
                    counters["control_bad_request"] += 1
                    await _write(writer, _error(None, InvalidArgument("request line too long")))
                    return
                if not line:
                    return
                try:
                    req = json.loads(line)
                    if not isinstance(req, dict) or not isinstance(req.get("op"), str):
                        raise ValueError("request must be an object with an op")
                except ValueError as exc:
                    counters["control_bad_request"] += 1
                    await _write(writer, _error(None, InvalidArgument(f"bad request: {exc}")))
                    continue
                rid = req.get("id")
                args = req.get("args") or {}
                op = req["op"]
                if op in STREAMS:
                    await self._stream(rid, op, args, writer)
                    return
                await _write(writer, await self._call(rid, op, args))
        except (ConnectionError, asyncio.CancelledError):
            pass
        except TimeoutError:  # the client stopped reading its answers
            counters["control_slow_client"] += 1
        finally:
            self._clients.discard(task)
            writer.close()

    async def _call(self, rid: Any, op: str, args: Any) -> dict[str, Any]:
        fn = OPS.get(op)
        if fn is None or not isinstance(args, dict):
            self.daemon.counters["control_bad_request"] += 1
            return _error(rid, InvalidArgument(f"unknown op {op!r} or bad args"))
        timeout = self.timeout_s
        t = args.get("timeout_s")
        if isinstance(t, (int, float)) and not isinstance(t, bool) and t > 0:
            timeout = float(t) + 1.0
        try:
            async with asyncio.timeout(timeout):  # no extra task per request (wait_for's)
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


async def _write(writer: asyncio.StreamWriter, obj: dict[str, Any]) -> None:
    writer.write(json.dumps(obj, separators=(",", ":")).encode() + b"\n")
    t = writer.transport
    if t.is_closing() or t.get_write_buffer_size():  # else drain() would return at once
        async with asyncio.timeout(10.0):
            await writer.drain()
