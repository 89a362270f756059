"""``mesh://`` leases: the local hivemesh daemon's embedded quorum, over its control socket.

Theory of operation
-------------------
Every hivemesh daemon hosts a quorum voter and a proposer
(:mod:`hivemesh.runtime.leases`); voters talk over the swarm's authenticated
channels, so only trusted members vote. This backend is a thin async client
of one daemon's control socket (``<data_dir>/ctl.sock``, JSON lines): each
operation is one request ``lease.acquire|renew|release|show`` answered after
the daemon's proposer reached a majority (or gave up at the deadline).

URL: ``mesh://`` (the default data dir, ``$HIVEMESH_DATA_DIR`` or
``~/.hivemesh``) or ``mesh:///absolute/data/dir``. Connections are kept in a
small pool (at most :data:`MAX_CONNECTIONS`, one request in flight on each),
opened lazily. Every call has the caller's deadline: the daemon gets a little
less, so its "no majority" answer arrives before we give up; a daemon that
is not running, or does not answer in time, raises
:class:`~hivemesh.errors.BackendUnavailable` (outcome unknown). Errors the
daemon reports (bad input, contention) come back as the same types.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from hivemesh.error_codes import error_class
from hivemesh.errors import BackendUnavailable, DeadlineExceeded, HivemeshError, InvalidArgument
from hivemesh.leases._api import LeaseInfo

__all__ = ["MAX_CONNECTIONS", "MeshLeaseBackend"]

#: Concurrent requests per backend (each uses its own socket connection).
MAX_CONNECTIONS = 16
_LINE_LIMIT = 1024 * 1024

_Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


def _data_dir(url: str) -> Path:
    parts = urlsplit(url)
    if parts.scheme != "mesh":
        raise InvalidArgument(f"not a mesh URL: {url!r}")
    if parts.netloc or parts.query:
        raise InvalidArgument(f"mesh URL takes only a path: mesh:///DATA_DIR, got {url!r}")
    path = unquote(parts.path)
    if not path or path == "/":
        path = os.environ.get("HIVEMESH_DATA_DIR", "~/.hivemesh")
    return Path(path).expanduser()


class MeshLeaseBackend:
    """A :class:`~hivemesh.leases.LeaseBackend` over a local daemon's quorum."""

    def __init__(self, url: str = "mesh://") -> None:
        self.data_dir = _data_dir(url)
        self._sock = self.data_dir / "ctl.sock"
        self._idle: list[_Conn] = []
        self._slots = asyncio.Semaphore(MAX_CONNECTIONS)
        self._next_id = 1
        self._closed = False

    @property
    def url(self) -> str:
        """``mesh://`` and the data dir."""
        return f"mesh://{self.data_dir}"

    async def _call(self, op: str, args: dict[str, Any], timeout_s: float) -> Any:
        if self._closed:
            raise BackendUnavailable("mesh lease backend closed")
        # the daemon's deadline is a bit shorter, so its answer beats ours
        args = dict(args, timeout_s=max(0.001, timeout_s - min(0.1, timeout_s * 0.2)))
        rid, self._next_id = self._next_id, self._next_id + 1
        line = json.dumps({"id": rid, "op": op, "args": args}).encode() + b"\n"
        conn: _Conn | None = None
        try:
            async with asyncio.timeout(timeout_s), self._slots:
                if self._idle:
                    conn = self._idle.pop()
                else:
                    conn = await asyncio.open_unix_connection(str(self._sock), limit=_LINE_LIMIT)
                reader, writer = conn
                writer.write(line)
                await writer.drain()
                raw = await reader.readline()
                if not raw:
                    raise ConnectionResetError("daemon closed the control connection")
                resp = json.loads(raw)
                self._idle.append(conn)
                conn = None
        except TimeoutError as e:
            raise BackendUnavailable(f"mesh {op}: no answer within {timeout_s:.3f}s") from e
        except (OSError, ValueError) as e:
            raise BackendUnavailable(f"mesh {op}: daemon at {self._sock} unreachable: {e}") from e
        finally:
            if conn is not None:  # broken or abandoned mid-request: never reuse
                conn[1].close()
        if not isinstance(resp, dict) or resp.get("id") != rid:
            raise BackendUnavailable(f"mesh {op}: unexpected answer {resp!r:.200}")
        if resp.get("ok"):
            return resp.get("result")
        err = resp.get("error") or {}
        cls = error_class(err.get("code"))  # by its stable code, never the class name
        if cls in (HivemeshError, DeadlineExceeded):
            cls = BackendUnavailable
        raise cls(f"mesh {op}: {err.get('message', '')}")

    async def acquire(
        self, resource: str, holder: str, ttl_ms: int, *, timeout_s: float
    ) -> int | None:
        """The new fencing token, or None if held."""
        res = await self._call(
            "lease.acquire", {"resource": resource, "holder": holder, "ttl_ms": ttl_ms}, timeout_s
        )
        token = res.get("token")
        return token if isinstance(token, int) else None

    async def renew(
        self, resource: str, holder: str, token: int, ttl_ms: int, *, timeout_s: float
    ) -> bool:
        """Majority renew."""
        args = {"resource": resource, "holder": holder, "token": token, "ttl_ms": ttl_ms}
        return bool((await self._call("lease.renew", args, timeout_s)).get("ok"))

    async def release(self, resource: str, holder: str, token: int, *, timeout_s: float) -> bool:
        """Majority release."""
        args = {"resource": resource, "holder": holder, "token": token}
        return bool((await self._call("lease.release", args, timeout_s)).get("ok"))

    async def show(self, resource: str, *, timeout_s: float) -> LeaseInfo | None:
        """Majority read of the current holder."""
        res = await self._call("lease.show", {"resource": resource}, timeout_s)
        if not res.get("held"):
            return None
        return LeaseInfo(
            resource, str(res["holder"]), int(res["fencing_token"]), int(res["remaining_ms"])
        )

    async def aclose(self) -> None:
        """Close pooled connections. Idempotent."""
        self._closed = True
        idle, self._idle = self._idle, []
        for _, writer in idle:
            with contextlib.suppress(Exception):
                writer.close()
