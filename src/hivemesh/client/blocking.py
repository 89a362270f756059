"""A small typed client for a local daemon's control socket.

Blocking (plain :mod:`socket` with deadlines), so the CLI and tests can use
it without an event loop::

    c = Client("~/.hivemesh")
    c.status()["journal"]["events"]
    c.ctx_set("default", "goal", "ship it")

:meth:`Client.run` takes a typed request of :mod:`hivemesh.commands` and
returns its typed reply; :meth:`Client.call` is the same by wire name, with
the plain JSON result. Errors come back as the daemon raised them: the
stable ``code`` of an error response is looked up with
:func:`hivemesh.error_codes.error_class` (never the class name), so
``except UnknownPeer`` works across the socket. A daemon that is not running raises
:class:`~hivemesh.errors.DaemonNotRunning`. A request the daemon would
refuse for its form (too large, nested too deep, text that is not UTF-8:
:mod:`hivemesh.commands.wire`) is refused here first, with the same
typed error, and never half-sent; if the daemon hangs up while a request is
being sent, its answer (say, that it is busy) is still read and
raised rather than a ``BrokenPipeError``.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from hivemesh.commands.wire import encode
from hivemesh.error_codes import error_from_wire
from hivemesh.errors import DaemonNotRunning, DeadlineExceeded, HivemeshError

if TYPE_CHECKING:
    from hivemesh.commands import Command, Reply

__all__ = ["Client"]

_SOCKET_NAME = "ctl.sock"


def _raise(err: dict[str, Any]) -> None:
    raise error_from_wire(err)


def _exchange(
    s: socket.socket, f: BinaryIO, request: bytes, op: str, timeout_s: float, path: Path
) -> dict[str, Any]:
    """Send ``request`` and read the first answer line from ``f`` (see module docs)."""
    # if it hangs up on us mid-request, it may have said why before it did
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        s.sendall(request)
    try:
        line = f.readline()
    except TimeoutError:
        raise DeadlineExceeded(f"{op}: no answer in {timeout_s:.1f}s") from None
    except ConnectionResetError:
        line = b""
    if not line:
        raise DaemonNotRunning(f"daemon at {path} closed the connection")
    try:
        resp = json.loads(line)
    except ValueError:
        raise DaemonNotRunning(f"daemon at {path} answered garbage: {line[:80]!r}") from None
    if not isinstance(resp, dict):
        raise DaemonNotRunning(f"daemon at {path} answered garbage: {line[:80]!r}")
    return resp


class Client:
    """Talk to the daemon whose data dir is ``data_dir``."""

    def __init__(self, data_dir: str | Path, *, timeout_s: float = 10.0) -> None:
        self.data_dir = Path(data_dir).expanduser()
        self.path = self.data_dir / _SOCKET_NAME
        self.timeout_s = timeout_s
        self._ids = itertools.count(1)

    def _connect(self, timeout_s: float) -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout_s)
        try:
            s.connect(str(self.path))
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            s.close()
            raise DaemonNotRunning(f"no daemon answering at {self.path}: {exc}") from None
        except OSError as exc:
            s.close()
            raise DaemonNotRunning(f"cannot reach {self.path}: {exc}") from None
        return s

    def call(self, op: str, timeout_s: float | None = None, **args: Any) -> Any:
        """Run one operation and return its result (or raise its error)."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        if timeout_s is not None:
            args["timeout_s"] = timeout_s
        rid = next(self._ids)
        request = encode({"id": rid, "op": op, "args": args})
        s = self._connect(timeout + 2.0)
        try:
            resp = _exchange(s, s.makefile("rb"), request, op, timeout + 2.0, self.path)
        finally:
            s.close()
        if not resp.get("ok"):
            _raise(resp.get("error") or {})
        return resp.get("result")

    def run(self, request: Command) -> Reply:
        """Run a typed command and return its typed reply (or raise its error)."""
        args = request.to_wire()
        result = self.call(request.op, timeout_s=args.pop("timeout_s", None), **args)
        return type(request).reply.from_wire(result)

    def stream(self, op: str, *, idle_timeout_s: float | None = None, **args: Any) -> Iterator[Any]:
        """Yield the events of a streaming op until the caller stops.

        With ``idle_timeout_s`` the iterator ends when no event came for that
        long; without it, it blocks until the daemon goes away.
        """
        request = encode({"id": 1, "op": op, "args": args})
        s = self._connect(self.timeout_s)
        try:
            f = s.makefile("rb")
            first = _exchange(s, f, request, op, self.timeout_s, self.path)
            if not first.get("ok"):
                _raise(first.get("error") or {"message": "stream refused"})
            s.settimeout(idle_timeout_s)
            while True:
                try:
                    line = f.readline()
                except TimeoutError:
                    return
                if not line:
                    return
                yield json.loads(line)["event"]
        finally:
            s.close()

    def is_running(self) -> bool:
        """True if a daemon answers ``status``."""
        try:
            self.call("status", timeout_s=2.0)
        except HivemeshError:
            return False
        return True

    def wait_running(self, timeout_s: float) -> dict[str, Any]:
        """Poll until the daemon answers and has finished starting (its
        status no longer says ``rehydrating``); returns its status."""
        deadline = time.monotonic() + timeout_s
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                st: dict[str, Any] = self.call("status", timeout_s=2.0)
                if "rehydrating" not in st:
                    return st
                last = None
            except HivemeshError as exc:
                last = exc
            time.sleep(0.05)
        why = last if last is not None else "still rebuilding its views"
        raise DeadlineExceeded(f"daemon at {self.data_dir} not up in {timeout_s}s: {why}")

    # -- typed shortcuts ---------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """The daemon's status record."""
        result: dict[str, Any] = self.call("status")
        return result

    def peers(self) -> list[dict[str, Any]]:
        """Known members and channels."""
        result: list[dict[str, Any]] = self.call("peers")
        return result

    def ctx_get(self, context: str = "default", key: str | None = None) -> Any:
        """A context's state, or one key of it."""
        if key is None:
            return self.call("ctx.get", context=context)
        return self.call("ctx.get", context=context, key=key)

    def ctx_set(self, context: str, key: str, value: Any) -> dict[str, Any]:
        """Set ``key`` in ``context`` (replicated to the swarm)."""
        result: dict[str, Any] = self.call("ctx.set", context=context, key=key, value=value)
        return result

    def ctx_add(
        self, context: str, set_name: str, elements: list[str], *, grow_only: bool = False
    ) -> dict[str, Any]:
        """Add ``elements`` to a set of ``context`` (the add-wins set, or the
        grow-only one); ``{"members", "events"}``."""
        result: dict[str, Any] = self.call(
            "ctx.add", context=context, set=set_name, elements=elements, grow_only=grow_only
        )
        return result

    def ctx_remove(self, context: str, set_name: str, elements: list[str]) -> dict[str, Any]:
        """Remove ``elements`` from an add-wins set of ``context``."""
        result: dict[str, Any] = self.call(
            "ctx.remove", context=context, set=set_name, elements=elements
        )
        return result

    def ctx_members(self, context: str, set_name: str, *, grow_only: bool = False) -> list[str]:
        """The sorted members of a set of ``context``."""
        result: dict[str, Any] = self.call(
            "ctx.members", context=context, set=set_name, grow_only=grow_only
        )
        members: list[str] = result["members"]
        return members

    def claim_name(self, name: str) -> dict[str, Any]:
        """Claim a name for the daemon's node."""
        result: dict[str, Any] = self.call("name.claim", name=name)
        return result

    def send(self, to: str, data: Any, *, timeout_s: float = 10.0) -> dict[str, Any]:
        """Send an acknowledged direct message to an address or a name."""
        result: dict[str, Any] = self.call("send", timeout_s=timeout_s, to=to, data=data)
        return result

    def inbox(self, *, limit: int = 100, remove: bool = False) -> list[dict[str, Any]]:
        """Direct messages received, oldest first (``remove`` takes them out)."""
        result: list[dict[str, Any]] = self.call("inbox", limit=limit, remove=remove)
        return result

    def ping(self, address: str, *, timeout_s: float = 5.0) -> dict[str, Any]:
        """Round-trip time to ``address`` (or a name)."""
        result: dict[str, Any] = self.call("ping", timeout_s=timeout_s, address=address)
        return result

    def revoke(self, address: str) -> None:
        """Revoke ``address`` on this node."""
        self.call("trust.revoke", address=address)

    def stop(self) -> None:
        """Ask the daemon to shut down cleanly."""
        self.call("stop")
