"""The public Python API: run a hivemesh node inside your asyncio program.

::

    import asyncio
    import hivemesh

    async def main() -> None:
        async with hivemesh.Node("./agent-a", bootstrap=["10.0.0.5:7420"]) as node:
            with node.context("task-42") as ctx:    # writes are published on exit
                ctx["status"] = "running"
            await node.wait_name("planner")         # names arrive as it catches up
            await node.send("planner", {"ask": "next step?"})
            async for ev in node.subscribe("ctx.update"):
                print(ev.author, ev.kind)

    asyncio.run(main())

A :class:`Node` is the same daemon as ``hivemesh up`` (its own identity,
store, connections and control socket in ``data_dir``), running on the
caller's event loop. ``hivemesh status --data-dir ./agent-a`` works against
it too.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from hivemesh.commands import COMMANDS, Command, Reply
from hivemesh.config import Config, load_config
from hivemesh.core.event import Event
from hivemesh.core.identity import address_of
from hivemesh.core.views.context import Context
from hivemesh.errors import DeadlineExceeded, InvalidArgument, LocalProtocolError, UnknownCommand
from hivemesh.leases import LeaseClient
from hivemesh.runtime.daemon import Daemon
from hivemesh.runtime.handlers import execute
from hivemesh.runtime.leases import MeshClaims
from hivemesh.runtime.status import Subscription
from hivemesh.telemetry.recorder import Metrics

__all__ = ["EventRecord", "Events", "Node"]


@dataclass(frozen=True, slots=True)
class EventRecord:
    """A journal event as seen by an application."""

    author: str
    seq: int
    hlc: int
    kind: str
    body: Any
    id: str

    @classmethod
    def of(cls, ev: Event) -> EventRecord:
        """Build from a core event."""
        return cls(address_of(ev.author), ev.seq, ev.hlc, ev.kind, ev.body, ev.id.hex())


class Events:
    """An async iterator over a node's new events (:meth:`Node.subscribe`).

    Registered with the daemon when made, so nothing applied after
    :meth:`Node.subscribe` returns is missed; :meth:`aclose` unregisters it
    and adds its drops to the node's counters."""

    def __init__(self, daemon: Daemon, kinds: tuple[str, ...]) -> None:
        self._daemon = daemon
        self._sub: Subscription | None = daemon.subscribe(kinds or None)

    def __aiter__(self) -> Events:
        return self

    async def __anext__(self) -> EventRecord:
        if self._sub is None:
            raise StopAsyncIteration
        return EventRecord.of(await self._sub.queue.get())

    async def aclose(self) -> None:
        """Stop receiving; further iteration ends at once."""
        if self._sub is not None:
            self._daemon.unsubscribe(self._sub)
            self._sub = None

    def __del__(self) -> None:  # a consumer that left its loop without aclose
        if self._sub is not None:
            self._daemon.unsubscribe(self._sub)


class Node:
    """An in-process node (see module docs).

    ``data_dir`` holds the identity, journal and control socket (created if
    missing). ``listen`` defaults to ``127.0.0.1:0`` (loopback, any port);
    other settings are the fields of :class:`hivemesh.config.Config`, and a
    ``config.toml`` in ``data_dir`` and ``HIVEMESH_*`` variables apply too.
    """

    def __init__(
        self,
        data_dir: str | Path,
        *,
        listen: str = "127.0.0.1:0",
        bootstrap: list[str] | tuple[str, ...] = (),
        name: str | None = None,
        **settings: Any,
    ) -> None:
        overrides: dict[str, Any] = dict(settings)
        overrides.update(listen=listen, name=name)
        if bootstrap:
            overrides["bootstrap"] = tuple(bootstrap)
        self.config: Config = load_config(data_dir, overrides=overrides)
        self._daemon: Daemon | None = None

    @property
    def daemon(self) -> Daemon:
        """The running daemon (raises if the node is not started)."""
        if self._daemon is None:
            raise LocalProtocolError("the node is not running: use `async with Node(...)`")
        return self._daemon

    @property
    def address(self) -> str:
        """This node's address."""
        return self.daemon.address

    @property
    def port(self) -> int:
        """The TCP port the node accepts peers on."""
        return self.daemon.listen_port

    @property
    def endpoint(self) -> str:
        """``host:port`` other nodes can bootstrap from."""
        return f"{self.config.listen_endpoint()[0]}:{self.port}"

    async def start(self) -> None:
        """Open the store, listen and join (``async with`` calls this)."""
        if self._daemon is None:
            daemon = Daemon(self.config)
            await daemon.start()
            self._daemon = daemon

    async def close(self) -> None:
        """Shut down cleanly (``async with`` calls this)."""
        if self._daemon is not None:
            daemon, self._daemon = self._daemon, None
            await daemon.stop()

    async def __aenter__(self) -> Node:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def wait_peers(self, n: int = 1, *, timeout_s: float = 30.0) -> list[str]:
        """Wait until at least ``n`` members are up and connected; returns them.

        Raises :class:`~hivemesh.errors.DeadlineExceeded` after ``timeout_s``.
        """
        daemon = self.daemon
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            up = [
                p["address"]
                for p in daemon.peers()
                if p["state"] == "up" and p["channel"] is not None
            ]
            if len(up) >= n:
                return up
            if loop.time() >= deadline:
                raise DeadlineExceeded(f"{len(up)} of {n} peers up after {timeout_s}s")
            await asyncio.sleep(0.02)

    # -- shared context ----------------------------------------------------------

    @contextlib.contextmanager
    def context(self, name: str = "default") -> Iterator[Context]:
        """A handle on shared context ``name``; writes are published on exit.

        Reads inside the block see the local replica (including the block's
        own writes). The writes become one signed event when the block ends
        (even if it raises: what was written is kept, as in a dict).
        """
        daemon = self.daemon
        try:
            yield daemon.context(name)
        finally:
            daemon.commit_nowait()

    def read_context(self, name: str = "default") -> dict[str, Any]:
        """A snapshot of context ``name`` as plain data."""
        snap: dict[str, Any] = self.daemon.context_view.snapshot().get(name, {})
        return snap

    async def flush(self) -> None:
        """Publish pending writes and wait until they are queued to peers."""
        await self.daemon.commit()

    # -- journal -------------------------------------------------------------------

    def add_view(self, view: Any) -> int:
        """Fold the journal into ``view`` -- any object with ``kinds`` (a set of
        event kinds, ``"*"`` for all) and ``apply(event)`` -- now and from now
        on: stored events are replayed (verified) first, in per-author order.
        Views must not depend on the interleaving across authors. Returns the
        number of events replayed."""
        return self.daemon.add_view(view)

    async def append(self, kind: str, body: Any) -> EventRecord:
        """Append an application event of ``kind`` to this node's feed."""
        return EventRecord.of(await self.daemon.append(kind, body))

    def subscribe(self, *kinds: str) -> Events:
        """New events (of ``kinds``, or every kind), as they are applied.

        The subscription exists when this returns: an event applied after
        the call is delivered, even if the consumer has not started reading
        yet. The queue behind it is bounded; if the consumer falls behind,
        excess events are counted in
        ``status()["counters"]["subscriber_dropped"]``. Close it with
        ``await events.aclose()`` (or leave its ``async for``) to stop.
        """
        return Events(self.daemon, kinds)

    # -- names, messages, state ---------------------------------------------------

    def invite(self, *, ttl_s: int = 3600) -> str:
        """A single-use invite token another node joins with (:meth:`join`):
        nodes are private by default."""
        return str(self.daemon.invite(ttl_s)["token"])

    async def join(self, token: str, *, timeout_s: float = 30.0) -> Mapping[str, Any]:
        """Join the swarm of the node that issued ``token``; returns once it
        admitted us, or raises the typed cause of its refusal
        (:meth:`hivemesh.runtime.daemon.Daemon.join`)."""
        return await self.daemon.join(token, timeout_s=timeout_s)

    async def claim_name(self, name: str) -> bool:
        """Claim ``name``; True if this node now owns it."""
        return await self.daemon.claim_name(name) == self.address

    def resolve(self, name_or_address: str) -> str:
        """The address behind a name (or the address itself); raises
        :class:`~hivemesh.errors.UnknownPeer` if no claim for it is known yet."""
        return self.daemon.resolve(name_or_address)

    async def wait_name(self, name: str, *, timeout_s: float = 30.0) -> str:
        """Wait until ``name`` resolves (see :meth:`resolve`); returns the address.

        A node that just started knows only the names in its own journal; the
        swarm's name claims reach it as it catches up, usually within a sync
        interval or two. Call this before the first :meth:`send` or
        :meth:`request` to a name. Raises
        :class:`~hivemesh.errors.DeadlineExceeded` after ``timeout_s``.
        """
        return await self.daemon.wait_resolved(name, timeout_s=timeout_s)

    async def send(self, to: str, data: Any, *, timeout_s: float = 10.0) -> Mapping[str, Any]:
        """Send an acknowledged direct message to an address or a name
        (a name must be known: see :meth:`wait_name`). Returns the receipt
        (``acked``, ``to``, ``msg_id``, ``rtt_ms``, ...) once the receiver has
        it in its durable inbox; to ``metrics-collector``: telemetry, returned
        once stored (see :meth:`hivemesh.telemetry.app.TelemetryApp.submit`)."""
        return await self.daemon.send_direct(to, data, timeout_s=timeout_s)

    async def request(self, to: str, kind: str, body: Any, *, timeout_s: float = 10.0) -> Any:
        """Ask the node ``to`` (address or name) to handle ``body`` with its
        handler for ``kind``; returns the handler's reply. Raises
        :class:`~hivemesh.errors.NoHandler` if that node has no handler for
        ``kind``, :class:`~hivemesh.errors.DeadlineExceeded` if no reply in time."""
        return await self.daemon.request(to, kind, body, timeout_s=timeout_s)

    def on_message(self, kind: str, handler: Callable[[str, Any], Awaitable[Any]]) -> None:
        """Answer requests of ``kind``: ``await handler(sender_address, body)``
        is sent back as the reply (an exception becomes ``{"ok": False, ...}``)."""
        self.daemon.messaging.on_message(kind, handler)

    def inbox(self, limit: int = 100) -> list[dict[str, Any]]:
        """Direct messages received, oldest first."""
        return self.daemon.inbox(limit)

    async def put_blob(
        self, data: bytes, *, mime: str = "application/octet-stream", name: str | None = None
    ) -> str:
        """Store ``data`` as a content-addressed blob and announce it; returns
        its digest (hex). Only the announcement is gossiped; others fetch the
        bytes on demand."""
        return (await self.daemon.put_blob(data, mime, name)).hex()

    async def get_blob(self, ref: str, *, timeout_s: float = 30.0) -> bytes:
        """The bytes of blob ``ref`` (hex digest or blob name), fetched from
        a holder if not held locally and verified against the digest."""
        return await self.daemon.get_blob(ref, timeout_s=timeout_s)

    @property
    def metrics(self) -> Metrics:  # -- telemetry --
        """Record telemetry (``record``, ``count``, ``timer``, ``track_llm``,
        ``track_tool``, ``track_task``); delivered to the node named
        ``metrics-collector`` (see :mod:`hivemesh.telemetry.app`)."""
        from hivemesh.telemetry.app import TelemetryApp

        return self.daemon.app(TelemetryApp).metrics

    async def call(self, request: Command) -> Reply:
        """Run a typed command of :mod:`hivemesh.commands` on this node and
        return its typed reply: the same table, validation, handler, deadline
        and errors as the control socket and the ``hivemesh`` CLI::

            reply = await node.call(CtxSet(key="goal", value="ship it"))
            reply.seq
        """
        cls = type(request)
        if COMMANDS.get(cls.op) is not cls:
            raise UnknownCommand(f"{cls.__name__} is not a command of hivemesh.commands")
        if cls.stream:
            raise InvalidArgument(f"{cls.op} is a stream: use Node.subscribe")
        # validated exactly as a request from the socket is
        return await execute(self.daemon, cls.from_wire(request.to_wire()))

    def status(self) -> dict[str, Any]:
        """The same record as ``hivemesh status --json``."""
        return self.daemon.status()

    def peers(self) -> list[dict[str, Any]]:
        """The same list as ``hivemesh peers --json``."""
        return self.daemon.peers()

    # -- leases and claims (see hivemesh.runtime.leases) ----------------------------

    @property
    def leases(self) -> LeaseClient:
        """Leases with fencing tokens on the swarm's embedded quorum.

        A :class:`~hivemesh.leases.LeaseClient` whose holder id is this
        node's address: ``async with node.leases.hold("r") as held: ...``.
        """
        return self.daemon.leases  # in broker mode: on the broker's KV

    @property
    def claims(self) -> MeshClaims:
        """Optimistic claims: ``await node.claims.claim(r)``, then
        ``await node.claims.wait_decided(r)`` -> the winner's address;
        ``release(r)``, ``done(r)``. A crashed winner's claims are released
        when failure detection writes ``member.down``."""
        return self.daemon.claims
