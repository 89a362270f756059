"""Connection manager: one secure channel per peer, dialled and accepted.

Theory of operation
-------------------
The manager keeps at most one :class:`~hivemesh.transports` secure channel per
peer address and hands every received frame to ``on_frame(peer, frame)``,
or, when an ``on_frames`` callback is given, every batch of frames read at
once to ``on_frames(peer, frames)`` (the daemon then flushes once per batch).

* **Dialling.** :meth:`ConnectionManager.want` registers an endpoint to keep a
  channel to: a known ``(address, host, port)`` or a bootstrap ``host:port``
  whose address is learnt from the handshake. One dialler task per endpoint
  retries with exponential backoff (``reconnect_min_s`` doubling to
  ``reconnect_max_s``, jittered) while no channel to that peer is up. Every
  dial has a deadline (``dial_timeout_s``).
* **Accepting.** Inbound channels are authorised by the same ``authorize``
  callback (revoked or unknown addresses are refused in the handshake).
* **Simultaneous dials.** When both ends dial each other, each ends up with
  two channels. Both keep the one dialled by the smaller address and close
  the other; a channel in the same direction as an existing one replaces it
  (the peer restarted). The rule is symmetric, so both ends agree.
* **Send queues and backpressure.** Each channel has a bounded send queue
  (the transport's). :meth:`send` waits when it is full; a peer that does
  not drain within ``slow_peer_timeout_s`` is disconnected and every frame
  still queued for it is counted as ``dropped_slow_peer`` (the core's
  anti-entropy re-sends what mattered after reconnect). Frames for a peer
  with no channel are counted as ``dropped_no_channel``, frames still queued
  when a channel dies as ``dropped_on_close``. Nothing is dropped without a
  counter. While :meth:`send` waits, the daemon's pump waits with it (that is
  the backpressure: inputs are not read faster than outputs drain). In
  practice the wait is short-lived: a peer that stops reading is declared
  down by SWIM within seconds, after which the core stops pushing to it, so
  its queue (4096 frames / 8 MiB) rarely fills at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from hivemesh.core.identity import Identity, short
from hivemesh.errors import (
    ConfigError,
    DeadlineExceeded,
    HivemeshError,
    TransportError,
    UnknownPeer,
    WouldBlock,
)
from hivemesh.transports import ChannelOptions, SecureChannel, TransportCounters, connect, serve

__all__ = ["ConnectionManager", "PeerLink"]

log = logging.getLogger("hivemesh.runtime.connections")

FrameCallback = Callable[[str, bytes], Awaitable[None]]
FramesCallback = Callable[[str, list[bytes]], Awaitable[None]]
PeerCallback = Callable[[str, bool], Awaitable[None]]


@dataclass(slots=True)
class PeerLink:
    """One live channel and its send queue."""

    address: str
    channel: Any
    dialer: str
    endpoint: tuple[str, int] | None
    since_s: float
    task: asyncio.Task[None] | None = None
    closed: bool = False


@dataclass(slots=True)
class _Target:
    host: str
    port: int
    address: str | None
    task: asyncio.Task[None] | None = None
    last_error: str | None = None
    attempts: int = 0


class ConnectionManager:
    """Dial, accept and multiplex one channel per peer (see module docs)."""

    def __init__(
        self,
        identity: Identity,
        *,
        authorize: Callable[[str], bool],
        on_frame: FrameCallback,
        on_peer: PeerCallback,
        dial_timeout_s: float,
        reconnect_min_s: float,
        reconnect_max_s: float,
        slow_peer_timeout_s: float,
        rng: random.Random,
        options: ChannelOptions | None = None,
        on_frames: FramesCallback | None = None,
    ) -> None:
        self.identity = identity
        self.address = identity.address
        self._authorize = authorize
        self._on_frame = on_frame
        self._on_frames = on_frames
        self._on_peer = on_peer
        self._dial_timeout_s = dial_timeout_s
        self._reconnect_min_s = reconnect_min_s
        self._reconnect_max_s = reconnect_max_s
        self._slow_peer_timeout_s = slow_peer_timeout_s
        self._rng = rng
        self._options = options or ChannelOptions()
        self.links: dict[str, PeerLink] = {}
        self.transport_counters = TransportCounters()
        self._targets: dict[tuple[str, int], _Target] = {}
        self._server: Any = None
        self._closing = False
        self.listen_port: int | None = None
        self.counters: Counter[str] = Counter()

    # -- lifecycle -----------------------------------------------------------

    async def listen(self, host: str, port: int) -> int:
        """Start accepting on ``host:port``; returns the bound port."""
        try:
            self._server = await serve(
                host,
                port,
                self.identity,
                authorize=self._authorize,
                on_channel=self._accepted,
                counters=self.transport_counters,
                options=self._options,
            )
        except OSError as exc:
            raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        self.listen_port = _bound_port(self._server, port)
        return self.listen_port

    async def close(self) -> None:
        """Stop dialling and accepting; close every channel."""
        self._closing = True
        for t in list(self._targets.values()):
            if t.task is not None:
                t.task.cancel()
        if self._server is not None:
            with contextlib.suppress(Exception):
                self._server.close()
                wait = getattr(self._server, "wait_closed", None)
                if wait is not None:
                    await asyncio.wait_for(wait(), 2.0)
        links = list(self.links.values())
        await asyncio.gather(
            *(link.channel.wait_sent(1.0) for link in links), return_exceptions=True
        )
        for link in links:
            await self._drop(link, reason="shutdown", notify=False)
        tasks = [t.task for t in self._targets.values() if t.task is not None]
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task

    # -- dialling ------------------------------------------------------------

    def want(self, host: str, port: int, address: str | None = None) -> None:
        """Keep a channel to ``host:port`` (to ``address`` if known)."""
        if address == self.address or self._closing:
            return
        key = (host, port)
        target = self._targets.get(key)
        if target is None:
            target = _Target(host, port, address)
            self._targets[key] = target
        elif address is not None and target.address != address:
            target.address = address
        if target.task is None or target.task.done():
            target.task = asyncio.get_running_loop().create_task(self._dialler(target))

    def forget(self, address: str) -> None:
        """Stop redialling every endpoint of ``address``."""
        for key in sorted(self._targets):
            t = self._targets[key]
            if t.address == address:
                if t.task is not None:
                    t.task.cancel()
                del self._targets[key]

    async def _dialler(self, target: _Target) -> None:
        delay = self._reconnect_min_s
        while not self._closing:
            if target.address is not None and target.address in self.links:
                await asyncio.sleep(delay)  # connected: check again later
                delay = self._reconnect_min_s
                continue
            target.attempts += 1
            self.counters["dials"] += 1
            try:
                channel = await asyncio.wait_for(
                    connect(
                        target.host,
                        target.port,
                        self.identity,
                        expect_address=target.address,
                        authorize=self._authorize,
                        timeout_s=self._dial_timeout_s,
                        counters=self.transport_counters,
                        options=self._options,
                    ),
                    self._dial_timeout_s + 1.0,
                )
            except (OSError, TimeoutError, HivemeshError) as exc:
                code = getattr(exc, "code", "dial_error")
                self.counters[f"dial_failed_{code}"] += 1
                target.last_error = f"{type(exc).__name__}: {exc}"
                await asyncio.sleep(delay * (0.5 + self._rng.random()))
                delay = min(delay * 2, self._reconnect_max_s)
                continue
            target.last_error = None
            peer = channel.peer_address
            if target.address is None:
                target.address = peer
            if peer == self.address:
                channel.close()
                self.forget(peer)
                return
            await self._adopt(channel, dialer=self.address, endpoint=(target.host, target.port))
            delay = self._reconnect_min_s

    async def _accepted(self, channel: Any) -> None:
        await self._adopt(channel, dialer=channel.peer_address, endpoint=None)

    # -- channels ------------------------------------------------------------

    async def _adopt(self, channel: Any, *, dialer: str, endpoint: tuple[str, int] | None) -> None:
        peer: str = channel.peer_address
        if self._closing or not self._authorize(peer):
            channel.close()
            return
        old = self.links.get(peer)
        if old is not None:
            keep_dialer = min(self.address, peer)
            if old.dialer != dialer and old.dialer == keep_dialer:
                self.counters["duplicate_channel_closed"] += 1
                channel.close()
                return
            self.counters["channel_replaced"] += 1
            await self._drop(old, reason="replaced", notify=False)
        link = PeerLink(
            address=peer,
            channel=channel,
            dialer=dialer,
            endpoint=endpoint,
            since_s=time.time(),
        )
        self.links[peer] = link
        link.task = asyncio.get_running_loop().create_task(self._reader(link))
        self.counters["channels_opened"] += 1
        log.info("connected %s (%s)", short(peer), "out" if dialer == self.address else "in")
        if old is None:
            await self._on_peer(peer, True)

    async def _reader(self, link: PeerLink) -> None:
        try:
            on_frames = self._on_frames
            while True:
                frames = await link.channel.recv_batch(64)
                if on_frames is not None:
                    await on_frames(link.address, frames)
                    continue
                for frame in frames:
                    await self._on_frame(link.address, frame)
        except asyncio.CancelledError:
            raise
        except (TransportError, OSError, EOFError) as exc:
            self.counters[f"channel_closed_{getattr(exc, 'code', 'os_error')}"] += 1
        except Exception:  # a bug in a handler must not kill the daemon silently
            log.exception("reader for %s failed", short(link.address))
            self.counters["reader_crashed"] += 1
        await self._drop(link, reason="closed")

    async def _drop(
        self,
        link: PeerLink,
        *,
        reason: str,
        notify: bool = True,
        error: HivemeshError | None = None,
    ) -> None:
        if link.closed:
            return
        link.closed = True
        if link.task is not None and link.task is not asyncio.current_task():
            link.task.cancel()
        lost = link.channel.statistics().send_queue_frames
        if lost:
            self.counters["dropped_on_close"] += lost
        with contextlib.suppress(Exception):
            link.channel.close(error)
        if self.links.get(link.address) is link:
            del self.links[link.address]
            log.info("disconnected %s: %s", short(link.address), reason)
            if notify:
                await self._on_peer(link.address, False)

    async def disconnect(self, address: str, reason: str, *, revoked: bool = False) -> None:
        """Close the channel to ``address`` (revoked, slow, shutting down)."""
        link = self.links.get(address)
        if link is not None:
            error = UnknownPeer(f"trust in {address[:12]} was revoked") if revoked else None
            await self._drop(link, reason=reason, error=error)

    # -- sending -------------------------------------------------------------

    async def send(self, peer: str, frame: bytes) -> bool:
        """Queue ``frame`` for ``peer``, waiting while its queue is full.

        Returns False (and counts why) when the frame could not be queued.
        """
        link = self.links.get(peer)
        if link is None:
            self.counters["dropped_no_channel"] += 1
            return False
        channel: SecureChannel = link.channel
        try:
            channel.send_nowait(frame)
            return True
        except WouldBlock:
            pass
        except TransportError:
            self.counters["dropped_on_close"] += 1
            return False
        self.counters["send_backpressure_waits"] += 1
        try:
            await channel.send(frame, timeout_s=self._slow_peer_timeout_s)
            return True
        except DeadlineExceeded:
            self.counters["dropped_slow_peer"] += 1 + channel.statistics().send_queue_frames
            await self._drop(link, reason="slow peer")
            return False
        except TransportError:
            self.counters["dropped_on_close"] += 1
            return False

    def statistics(self) -> dict[str, Any]:
        """Per-peer channel figures for ``status``."""
        out: dict[str, Any] = {}
        for addr in sorted(self.links):
            link = self.links[addr]
            st = link.channel.statistics()
            out[addr] = {
                "direction": "out" if link.dialer == self.address else "in",
                "endpoint": f"{link.endpoint[0]}:{link.endpoint[1]}" if link.endpoint else None,
                "since_s": round(link.since_s, 3),
                "frames_in": st.frames_in,
                "frames_out": st.frames_out,
                "bytes_in": st.bytes_in,
                "bytes_out": st.bytes_out,
                "send_queue_frames": st.send_queue_frames,
                "send_waits": st.send_waits,
                "frames_dropped": st.frames_dropped,
            }
        return out

    def dial_targets(self) -> list[dict[str, Any]]:
        """Endpoints we keep dialling, with the last error."""
        return [
            {
                "endpoint": f"{t.host}:{t.port}",
                "address": t.address,
                "attempts": t.attempts,
                "last_error": t.last_error,
            }
            for _, t in sorted(self._targets.items())
        ]


def _bound_port(server: Any, requested: int) -> int:
    for attr in ("port", "listen_port"):
        value = getattr(server, attr, None)
        if isinstance(value, int):
            return value
    sockets = getattr(server, "sockets", None)
    if sockets:
        return int(sockets[0].getsockname()[1])
    return requested
