"""Dialling for :class:`~hivemesh.runtime.connections.ConnectionManager`.

A mixin: one dialler task per endpoint the node wants a channel to. While a
link to the peer is up the dialler sleeps on an event that the link's end
sets (no polling); it dials while none is, backing off exponentially
(``reconnect_min_s`` doubling to ``reconnect_max_s``, jittered) after failed
dials -- a peer that refused us as busy included -- and after links that
ended soon after they opened. Every dial has a deadline. An endpoint that
turns out to be this node itself (say, its own address in its bootstrap
list) is dropped at once, with one INFO line. The attributes declared below
are set by the manager.

An endpoint that *turns us away* (:data:`REFUSALS`: the handshake answered
``unknown_peer``, an open channel was closed with a refusal code such as
``invite_used``, or the node there is not the one we dialled) is reported to
``on_refused(address, error)``, logged once per cause, shown as the
target's ``refused`` code and ``last_error``, and redialled with a longer
backoff (up to :data:`REFUSED_BACKOFF_MULT` times ``reconnect_max_s``): it
will not change its mind every second.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from hivemesh.core.identity import Identity, short
from hivemesh.errors import (
    ChannelSuperseded,
    HivemeshError,
    InviteError,
    PeerIdentityMismatch,
    SelfConnection,
    UnknownPeer,
)
from hivemesh.transports import ChannelOptions, TransportCounters, connect

__all__ = ["REFUSALS", "REFUSED_BACKOFF_MULT", "Dialling", "Target"]

log = logging.getLogger("hivemesh.runtime.connections")

#: Errors by which an endpoint turns us away (as opposed to failing to answer).
REFUSALS = (UnknownPeer, InviteError, PeerIdentityMismatch)
#: A refused dial backs off up to this many times ``reconnect_max_s``.
REFUSED_BACKOFF_MULT = 6


@dataclass(slots=True)
class Target:
    """An endpoint to keep a channel to, and how dialling it went."""

    host: str
    port: int
    address: str | None
    task: asyncio.Task[None] | None = None
    last_error: str | None = None
    attempts: int = 0
    refused: str | None = None  # the code of the last refusal, until a link opens


class Dialling:
    """The dialling half of the connection manager (see module docs)."""

    identity: Identity
    address: str
    boot_id: bytes
    links: dict[str, Any]
    counters: Counter[str]
    transport_counters: TransportCounters
    _authorize: Callable[[str], bool]
    _closing: bool
    _dial_timeout_s: float
    _reconnect_min_s: float
    _reconnect_max_s: float
    _handover_s: float
    _rng: random.Random
    _options: ChannelOptions
    _targets: dict[tuple[str, int], Target]
    _handovers: dict[str, Any]
    _changed: dict[str, asyncio.Event]
    _on_refused: Callable[[str, HivemeshError], None] | None
    _spawn: Callable[[str, Coroutine[Any, Any, None]], asyncio.Task[None]]

    def _adopt(self, channel: Any, *, dialer: str, endpoint: tuple[str, int] | None) -> None:
        raise NotImplementedError  # pragma: no cover - the manager's

    async def _deliver(self) -> None:
        raise NotImplementedError  # pragma: no cover - the manager's

    def want(self, host: str, port: int, address: str | None = None) -> None:
        """Keep a channel to ``host:port`` (to ``address`` if known)."""
        if address == self.address or self._closing:
            return
        key = (host, port)
        target = self._targets.get(key)
        if target is None:
            target = Target(host, port, address)
            self._targets[key] = target
        elif address is not None and target.address != address:
            target.address = address
        if target.task is None or target.task.done():
            target.task = self._spawn("dialler", self._dialler(target))

    def forget(self, address: str) -> None:
        """Stop redialling every endpoint of ``address``."""
        for key in sorted(self._targets):
            t = self._targets[key]
            if t.address == address:
                if t.task is not None:
                    t.task.cancel()
                del self._targets[key]

    def _jittered(self, delay_s: float) -> float:
        return delay_s * (0.5 + self._rng.random())

    async def _wait_change(self, address: str, timeout_s: float) -> None:
        """Sleep until the link to ``address`` changes (or ``timeout_s``)."""
        event = self._changed.setdefault(address, asyncio.Event())
        # asyncio.timeout, not wait_for: wait_for (3.11) can swallow a
        # cancellation that races with the event being set.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await event.wait()

    def _wake(self, address: str) -> None:
        event = self._changed.pop(address, None)
        if event is not None:
            event.set()

    async def _dialler(self, target: Target) -> None:
        delay = self._reconnect_min_s
        while not self._closing:
            addr = target.address
            if addr is not None and (addr in self.links or addr in self._handovers):
                link = self.links.get(addr)
                await self._wait_change(addr, self._reconnect_max_s)
                if link is not None and self.links.get(addr) is not link:  # it ended
                    lived_s = time.monotonic() - link.opened_mono
                    if lived_s < 2 * self._reconnect_max_s:  # flapping: back off
                        await asyncio.sleep(self._jittered(delay))
                        delay = min(delay * 2, self._reconnect_max_s)
                    else:
                        delay = self._reconnect_min_s
                continue
            target.attempts += 1
            self.counters["dials"] += 1
            try:
                async with asyncio.timeout(self._dial_timeout_s + 1.0):
                    channel = await connect(
                        target.host,
                        target.port,
                        self.identity,
                        expect_address=target.address,
                        authorize=self._authorize,
                        timeout_s=self._dial_timeout_s,
                        counters=self.transport_counters,
                        options=self._options,
                        boot_id=self.boot_id,
                    )
            except SelfConnection:
                # Our own endpoint (bootstrap lists are often shared by every node).
                self.counters["dial_self_skipped"] += 1
                log.info("%s:%d is this node itself: not dialling it", target.host, target.port)
                self._targets.pop((target.host, target.port), None)
                return
            except ChannelSuperseded:
                # The peer accepted us and retired the channel at once: it holds
                # a better one to us, which reaches us as our link shortly.
                self.counters["dial_superseded"] += 1
                if addr is not None and addr not in self.links:
                    await self._wait_change(addr, self._handover_s)
                continue
            except (OSError, TimeoutError, HivemeshError) as exc:
                code = getattr(exc, "code", "dial_error")
                self.counters[f"dial_failed_{code}"] += 1
                target.last_error = f"{type(exc).__name__}: {exc}"
                limit = self._reconnect_max_s
                if isinstance(exc, REFUSALS):
                    self._refused(addr, exc, target)
                    limit *= REFUSED_BACKOFF_MULT
                await asyncio.sleep(self._jittered(delay))
                delay = min(delay * 2, limit)
                continue
            except Exception as exc:  # a bug on the dial path: log, count, back off, dial again
                log.exception("dialling %s:%d failed", target.host, target.port)
                self.counters["dial_crashed"] += 1
                target.last_error = f"{type(exc).__name__}: {exc}"
                await asyncio.sleep(self._jittered(delay))
                delay = min(delay * 2, self._reconnect_max_s)
                continue
            target.last_error = target.refused = None
            peer = channel.peer_address
            if target.address is None:
                target.address = peer
            if peer == self.address:
                channel.close()
                self.forget(peer)
                return
            self._adopt(channel, dialer=self.address, endpoint=(target.host, target.port))
            await self._deliver()
            if peer not in self.links and peer not in self._handovers:
                # closed at once (refused after the handshake): not a busy loop
                await asyncio.sleep(self._jittered(delay))
                delay = min(delay * 2, self._reconnect_max_s)

    def _refused(
        self, address: str | None, error: HivemeshError, target: Target | None = None
    ) -> None:
        """An endpoint turned us away: count, log once per cause, report (module docs)."""
        self.counters[f"refused_{error.code}"] += 1
        if target is not None and (address is None or isinstance(error, PeerIdentityMismatch)):
            targets = [target]  # that endpoint only (another may be the node we want)
        else:
            targets = [t for t in self._targets.values() if t.address == address]
        if not targets or any(t.refused != error.code for t in targets):
            where = short(address) if address else f"{target.host}:{target.port}" if target else "?"
            log.warning("%s turned this node away: %s [%s]", where, error, error.code)
        for t in targets:
            t.refused, t.last_error = error.code, f"{type(error).__name__}: {error}"
        if address is not None and self._on_refused is not None:
            self._on_refused(address, error)

    def dial_targets(self) -> list[dict[str, Any]]:
        """Endpoints we keep dialling, with the last error."""
        return [
            {
                "endpoint": f"{t.host}:{t.port}",
                "address": t.address,
                "attempts": t.attempts,
                "last_error": t.last_error,
                "refused": t.refused,
            }
            for _, t in sorted(self._targets.items())
        ]
