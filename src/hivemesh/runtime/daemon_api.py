"""The daemon's API for the control socket and :class:`hivemesh.Node`.

A mixin of :class:`~hivemesh.runtime.daemon.Daemon`: the operations a client
asks of a running node (views and subscriptions, context writes, appends,
names, direct messages, status). The pump and the wiring live in
:mod:`hivemesh.runtime.daemon`; the attributes declared below are set there.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from hivemesh import commands as c
from hivemesh.commands.names import NameClaim, NameClaimReply
from hivemesh.commands.peer import AppendMany
from hivemesh.core.event import Event
from hivemesh.core.identity import address_of, public_key_of
from hivemesh.core.node import Node
from hivemesh.core.views.context import Context, ContextView
from hivemesh.core.views.names import NamesView
from hivemesh.errors import DeadlineExceeded, InvalidAddress, InvalidArgument, UnknownPeer
from hivemesh.runtime.clock import now_ms
from hivemesh.runtime.messaging import Messaging, ping, request, send_direct
from hivemesh.runtime.status import Subscription, peers_of, status_of

if TYPE_CHECKING:
    from hivemesh.runtime.daemon import Daemon
    from hivemesh.runtime.rehydration import Rehydration
    from hivemesh.runtime.telemetry import DaemonTelemetry

__all__ = ["DaemonAPI"]

_NAME_POLL_S = 0.5  # wait_resolved re-checks at least this often


class DaemonAPI:
    """Client-facing operations of a :class:`~hivemesh.runtime.daemon.Daemon`."""

    node: Node
    names: NamesView
    context_view: ContextView
    messaging: Messaging
    counters: Counter[str]
    telemetry: DaemonTelemetry
    rehydration: Rehydration
    _subs: list[Subscription]

    @property
    def address(self) -> str:
        """This node's address."""
        return self.node.address

    async def flush(self) -> None:  # pragma: no cover - the Daemon's pump
        raise NotImplementedError

    def call(self, cmd: Any) -> asyncio.Future[Any]:  # pragma: no cover - the Daemon's pump
        raise NotImplementedError

    def call_now(self, cmd: Any) -> Any:  # pragma: no cover - the Daemon's pump
        raise NotImplementedError

    def _schedule_flush(self) -> None:  # pragma: no cover - the Daemon's pump
        raise NotImplementedError

    def _replay(self, store: Any) -> Iterable[Event]:  # pragma: no cover - the Daemon's
        raise NotImplementedError

    def _daemon(self) -> Daemon:
        return self  # type: ignore[return-value]

    def add_view(self, view: Any) -> int:
        """Register an application view (a reducer with ``kinds`` and
        ``apply(event)``); it first gets every stored event of its kinds
        (verified replay), then every new one. Returns the replayed count."""
        kinds = frozenset(view.kinds)
        n = 0
        self.node.settle()  # every applied event is in the store, so none is missed
        for ev in self._replay(self.node.journal.store):
            if "*" in kinds or ev.kind in kinds:
                view.apply(ev)
                n += 1
        self.node.add_view(view)
        return n

    def subscribe(self, kinds: Iterable[str] | None = None) -> Subscription:
        """A bounded queue receiving new events (of ``kinds``, or all)."""
        sub = Subscription(frozenset(kinds) if kinds is not None else None)
        self._subs.append(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        """Stop feeding ``sub``; its drops are added to the counters."""
        if sub in self._subs:
            self._subs.remove(sub)
            self.counters["subscriber_dropped"] += sub.dropped

    def context(self, name: str = "default") -> Context:
        """A handle on a shared context; call :meth:`commit` after writing."""
        return self.context_view.context(name)

    async def commit(self) -> int:
        """Append pending local context writes to our feed and send them."""
        n = self.commit_nowait()
        await self.flush()
        return n

    def commit_nowait(self) -> int:
        """Append pending local context writes (sent by the next flush).

        If the append fails (a full disk, a feed that takes no writes yet),
        the writes it did not store stay pending in the context and go out
        with the next commit that succeeds; the error propagates."""
        items = []
        while (upd := self.context_view.pending_update()) is not None:
            items.append(upd)
        if items:
            me = self.node.identity.public
            before = self.node.journal.head(me).seq
            try:
                self.call_now(AppendMany(tuple(items)))
            except BaseException:
                self.context_view.unexport(items[self.node.journal.head(me).seq - before :])
                raise
        return len(items)

    async def append(self, kind: str, body: Any) -> Event:
        """Append one event of our own and send it."""
        ev: Event = await self.call(c.Append(kind, body))
        return ev

    async def claim_name(self, name: str) -> str:
        """Claim ``name`` for this node; returns the current owner."""
        reply: NameClaimReply = await self.call(NameClaim(name))
        return reply.owner

    def resolve(self, target: str) -> str:
        """An address for ``target`` (an address or a claimed name)."""
        if target.startswith("hm") and len(target) == 58:
            try:
                public_key_of(target)
                return target
            except InvalidAddress:
                pass
        owner = self.names.resolve(target)
        if owner is None:
            raise UnknownPeer(
                f"no node has claimed the name {target!r} (as far as this node knows yet)"
            )
        return owner

    async def wait_resolved(self, target: str, *, timeout_s: float) -> str:
        """:meth:`resolve` ``target``, waiting up to ``timeout_s`` for a name
        that is not known yet (a fresh node learns names as it catches up);
        raises :class:`DeadlineExceeded` then."""
        sub = self.subscribe(NamesView.kinds)
        try:
            async with asyncio.timeout(timeout_s):
                while True:
                    with contextlib.suppress(UnknownPeer):
                        return self.resolve(target)
                    # woken by a name event; the poll covers a full (dropping) queue
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(_NAME_POLL_S):
                            await sub.queue.get()
        except TimeoutError:
            raise DeadlineExceeded(
                f"no node claimed the name {target!r} within {timeout_s}s"
            ) from None
        finally:
            self.unsubscribe(sub)

    def status(self) -> dict[str, Any]:
        """Everything ``hivemesh status`` shows (see :mod:`hivemesh.runtime.status`),
        with every feed's head under ``journal.heads``: ``{address: {"seq",
        "hash"}}``, the hash of the feed's last event (hex) -- equal on two
        nodes exactly when they hold the same history of that feed."""
        st = status_of(self._daemon())
        heads = self.node.journal.heads
        st["journal"]["heads"] = {
            address_of(a): {"seq": h.seq, "hash": h.hash.hex()} for a, h in sorted(heads.items())
        }
        if not self.rehydration.is_complete:  # starting: the parts below do not exist yet
            return st
        st["telemetry"] = self.telemetry.status()  # -- telemetry --
        return st

    def peers(self) -> list[dict[str, Any]]:
        """Known members with their channel figures."""
        return peers_of(self._daemon())

    async def send_direct(self, to: str, data: Any, *, timeout_s: float) -> dict[str, Any]:
        """Send an acknowledged direct message to an address or a name.

        Returns when the receiver acknowledged (it is in its inbox); raises
        :class:`DeadlineExceeded` if no ack came within ``timeout_s``. To the
        name ``metrics-collector`` it is telemetry: returns once the collector
        stored it, or raises its reason (``DaemonTelemetry.submit``).
        """
        if self.telemetry.takes(to):  # -- telemetry --
            return await self.telemetry.submit(data, timeout_s=timeout_s)
        return await send_direct(self._daemon(), to, data, timeout_s=timeout_s)

    def inbox(self, limit: int = 100, *, remove: bool = False) -> list[dict[str, Any]]:
        """Direct messages received, oldest first (removed if ``remove``)."""
        return self.messaging.inbox.list(limit, remove=remove)

    async def request(self, to: str, kind: str, body: Any, *, timeout_s: float) -> Any:
        """Send a request to a handler of ``kind`` on ``to``; return its reply."""
        return await request(self._daemon(), to, kind, body, timeout_s=timeout_s)

    async def ping(self, target: str, *, timeout_s: float) -> dict[str, Any]:
        """Round-trip time to a connected peer (by address or name)."""
        return await ping(self._daemon(), target, timeout_s=timeout_s)

    def invite(self, ttl_s: int = 3600, swarm: str | None = None) -> dict[str, Any]:
        """A single-use invite token for a new node into ``swarm`` (default:
        our home swarm): ``{token, inviter, expires_s, swarm}``."""
        return self._daemon().invites.issue(ttl_s, now_ms(), swarm)

    async def join(self, token: str, *, timeout_s: float) -> dict[str, Any]:
        """Join the swarm of the node that issued ``token``.

        Returns ``{inviter, endpoints, seconds}`` once the inviter admitted
        this node; raises the cause of a refusal (:class:`InviteUsed`,
        :class:`InviteExpired`, :class:`InviteUnknown`, :class:`InviteRevoked`,
        :class:`UnknownPeer`, :class:`PeerIdentityMismatch`, a bad token's
        :class:`InviteError`) or :class:`DeadlineExceeded` after ``timeout_s``
        (see :mod:`hivemesh.runtime.invites`).
        """
        if not 0 < timeout_s <= 3600:
            raise InvalidArgument("timeout_s must be in (0, 3600]")
        d = self._daemon()
        result: dict[str, Any] = await d.invites.join(token, now_ms(), timeout_s=timeout_s)
        return result

    def check_address(self, address: str) -> str:
        """Validate an address argument (raises :class:`InvalidArgument`)."""
        try:
            public_key_of(address)
        except InvalidAddress as exc:
            raise InvalidArgument(str(exc)) from None
        return address
