"""Connection manager: one secure channel per peer, dialled and accepted.

Theory of operation
-------------------
The manager keeps at most one :class:`~hivemesh.transports` secure channel per
peer address (its *link*) and hands every batch of frames read at once to
``on_frames(peer, frames)`` (the daemon then flushes once per batch).
``on_frames_now(peer, frames) -> bool`` gets them straight from the read
callback while the link's reader is idle with nothing queued; when it
returns False they take the reader's path, in order.
``on_peer(peer, up)`` reports links coming and going, one call at a time
and in order: inline in the dialler, acceptor or reader that saw the change,
or from a small task when it was seen inside :meth:`send` (the daemon sends
holding its flush lock, and ``on_peer`` flushes), so a callback may send.

* **Dialling.** :meth:`ConnectionManager.want` registers an endpoint
  (``(address, host, port)``, or a bootstrap ``host:port`` whose address the
  handshake tells); *when* each is dialled is :class:`hivemesh.core.dialer.Dialer`'s
  schedule: one ``dialler`` task sleeps until its next deadline or a change
  and starts every dial due, each under ``dial_timeout_s``. An endpoint that
  *turns us away* (:data:`~hivemesh.core.dialer.REFUSALS`: ``unknown_peer``, a refusal CLOSE such as
  ``invite_used``, another node than the one dialled) is reported to
  ``on_refused(address, error)``, logged once per cause and shown as the
  target's ``refused`` code.
* **Accepting.** Inbound channels are authorised by the same ``authorize``
  callback (revoked or unknown addresses are refused in the handshake).
* **Which channel is the link** is decided by :meth:`hivemesh.core.links.Lives.adopt`
  (tables in its module docs): a new boot id replaces a restarted peer's
  half-open link at once (CLOSE ``peer_restarted``, reported down and up, no
  failure detector needed); a channel of an earlier life is refused (CLOSE
  ``stale_boot``); of two channels of one life (simultaneous dials) both ends
  keep the smaller :func:`~hivemesh.core.links.channel_rank` and *retire* the
  other (half-closed: it keeps reading, its unsent frames move to the winner,
  ``frames_moved``); a peer that retires our only link starts a *handover* of
  up to ``handover_s`` holding frames for it (bounded like a send queue)
  until its winner comes, else they count as ``dropped_on_close`` and the
  peer is reported down. This module carries out the plan.
* **Dead channels are noticed promptly.** A channel ends on EOF, a CLOSE or
  an error; its reader task then drops the link and wakes the dialler. A link
  whose channel ended is also dropped by the first :meth:`send` to it, even
  if its reader is still busy delivering an earlier batch. A *half-open*
  channel (the peer's host vanished without a FIN) never ends by itself: it
  is replaced as soon as the restarted peer's channel arrives (above), and
  otherwise closed by the Peer when SWIM declares the member down and the
  link has been silent (:mod:`hivemesh.core.peer`).
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
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from hivemesh.core.dialer import REFUSALS, Dialer, DialPolicy, Endpoint, Outcome, dial_outcome
from hivemesh.core.identity import Identity, short
from hivemesh.core.links import Handover, Held, Link, Lives, New, Old, State, channel_rank
from hivemesh.errors import (
    ChannelSuperseded,
    ConfigError,
    DeadlineExceeded,
    HivemeshError,
    PeerIdentityMismatch,
    PeerRestarted,
    StaleBoot,
    TransportError,
    UnknownPeer,
    WouldBlock,
)
from hivemesh.runtime.clock import now_ms
from hivemesh.runtime.hostutil import handshake_slots
from hivemesh.runtime.supervise import reap
from hivemesh.transports import (
    ChannelOptions,
    Listener,
    SecureChannel,
    TransportCounters,
    connect,
    serve,
)
from hivemesh.transports.channel import CLOSE_GRACE_S
from hivemesh.transports.streams import PROCESS_BOOT_ID

__all__ = ["ConnectionManager", "PeerLink", "channel_rank"]

log = logging.getLogger("hivemesh.runtime.connections")

FramesCallback = Callable[[str, list[bytes]], Awaitable[None]]
FramesNowCallback = Callable[[str, list[bytes]], bool]
PeerCallback = Callable[[str, bool], Awaitable[None]]
RefusedCallback = Callable[[str, HivemeshError], None]


@dataclass(slots=True, eq=False)
class PeerLink:
    """One channel to a peer: the peer's link, or a retired duplicate still draining."""

    address: str
    channel: SecureChannel
    dialer: str
    endpoint: tuple[str, int] | None
    since_s: float
    rank: tuple[int, bytes] = (0, b"")
    opened_mono: float = 0.0
    task: asyncio.Task[None] | None = None
    closed: bool = False
    busy: bool = False  # its reader task is handling a batch
    boot_id: bytes = b""  # the peer's, proven in the handshake


#: ``spawn(name, coro)``: start a task (see ``ConnectionManager(spawn=...)``).
Spawn = Callable[[str, Coroutine[Any, Any, None]], asyncio.Task[None]]


def _create_task(name: str, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
    return asyncio.get_running_loop().create_task(coro, name=f"hm-{name}")


class ConnectionManager:
    """Dial, accept and multiplex one channel per peer (see module docs)."""

    def __init__(
        self,
        identity: Identity,
        *,
        authorize: Callable[[str], bool],
        on_frames: FramesCallback,
        on_peer: PeerCallback,
        dial_timeout_s: float,
        reconnect_min_s: float,
        reconnect_max_s: float,
        slow_peer_timeout_s: float,
        rng: random.Random,
        options: ChannelOptions | None = None,
        on_frames_now: FramesNowCallback | None = None,
        handover_s: float | None = None,
        linger_s: float = CLOSE_GRACE_S,
        on_refused: RefusedCallback | None = None,
        boot_id: bytes = PROCESS_BOOT_ID,
        spawn: Spawn | None = None,
    ) -> None:
        #: starts the readers, diallers and notifier (a daemon passes its
        #: supervisor's ``watch``: a task that fails is logged and counted)
        self._spawn: Spawn = spawn or _create_task
        self.identity = identity
        self.address = identity.address
        #: This node's boot id, proven in every handshake (one per node start).
        self.boot_id = boot_id
        self._authorize = authorize
        self._on_frames = on_frames
        self._on_frames_now = on_frames_now
        self._on_peer = on_peer
        #: ``on_refused(peer, error)``: the peer refused us (module docs, Dialling)
        self._on_refused = on_refused
        self._dial_timeout_s = dial_timeout_s
        self._reconnect_min_s = reconnect_min_s
        self._reconnect_max_s = reconnect_max_s
        self._slow_peer_timeout_s = slow_peer_timeout_s
        #: how long a peer's retired link waits for the winning channel
        self._handover_s = dial_timeout_s + 1.0 if handover_s is None else handover_s
        self._linger_s = linger_s
        self._dials = Dialer(
            self.address,
            DialPolicy(
                reconnect_min_ms=int(reconnect_min_s * 1000),
                reconnect_max_ms=int(reconnect_max_s * 1000),
                handover_ms=int(self._handover_s * 1000),
            ),
            rng,
        )
        self._dialling: dict[Endpoint, asyncio.Task[None]] = {}  # dials in flight
        self._dial_wake = asyncio.Event()  # the schedule changed
        self._dial_loop: asyncio.Task[None] | None = None
        self._options = options or ChannelOptions()
        #: the live link per peer address
        self.links: dict[str, PeerLink] = {}
        self.transport_counters = TransportCounters()
        self.counters: Counter[str] = Counter()
        self.listen_port: int | None = None
        self._retired: set[PeerLink] = set()  # losers of a tie-break, still draining
        self._handovers: dict[str, tuple[Handover, asyncio.TimerHandle]] = {}
        self._lives = Lives()  # the peers' boot ids, in the order first seen
        self._events: deque[tuple[str, bool]] = deque()  # on_peer calls, in order
        self._notify_lock = asyncio.Lock()
        self._notifier: asyncio.Task[None] | None = None
        self._server: Listener | None = None
        self._closing = False

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
                max_pending_handshakes=handshake_slots(),
                boot_id=self.boot_id,
            )
        except OSError as exc:
            raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        self.listen_port = self._server.port
        return self.listen_port

    async def close(self) -> None:
        """Stop dialling and accepting; close every channel."""
        self._closing = True
        dials = [*self._dialling.values(), *([self._dial_loop] if self._dial_loop else [])]
        for task in dials:
            task.cancel()
        if self._server is not None:
            with contextlib.suppress(Exception):
                self._server.close()
                await asyncio.wait_for(self._server.wait_closed(), 2.0)
        links = list(self.links.values())
        await asyncio.gather(
            *(link.channel.wait_sent(1.0) for link in links), return_exceptions=True
        )
        for addr in sorted(self._handovers):
            self._end_handover(addr, notify=False)
        readers = [link.task for link in (*links, *self._retired) if link.task is not None]
        for link in links:
            await self._drop(link, reason="shutdown", notify=False)
        for link in list(self._retired):
            link.channel.close()
        for task in readers:
            task.cancel()
        if self._notifier is not None:
            self._notifier.cancel()
        await reap([*dials, *readers, *([self._notifier] if self._notifier else [])], "link")

    async def _accepted(self, channel: SecureChannel) -> None:
        self._adopt(channel, dialer=channel.peer_address, endpoint=None)
        await self._deliver()

    async def adopt_inbound(self, channel: SecureChannel) -> None:
        """Take a channel the peer opened over another transport (QUIC, a relay)."""
        await self._accepted(channel)

    async def adopt_outbound(self, channel: SecureChannel) -> None:
        """Take a channel this node opened over another transport (QUIC, a relay)."""
        self._adopt(channel, dialer=self.address, endpoint=channel.remote_endpoint)
        await self._deliver()

    # -- dialling: the schedule is core.dialer's; this starts the dials --------

    def want(self, host: str, port: int, address: str | None = None) -> None:
        """Keep a channel to ``host:port`` (to ``address`` if known)."""
        if self._closing:
            return
        self._dials.want(host, port, address, now_ms())
        self._kick()

    def forget(self, address: str) -> None:
        """Stop redialling every endpoint of ``address``."""
        for ep in self._dials.forget(address):
            task = self._dialling.pop(ep, None)
            if task is not None:
                task.cancel()

    def dial_targets(self) -> list[dict[str, Any]]:
        """Endpoints we keep dialling, with the last error."""
        return self._dials.targets()

    def _unlinked(self, address: str, opened_mono: float) -> None:
        """The link to ``address`` ended: the schedule says when to redial."""
        if self._closing:
            return
        lived_ms = int((time.monotonic() - opened_mono) * 1000)
        self._dials.unlinked(address, lived_ms, now_ms())
        self._kick()

    def _kick(self) -> None:
        """Wake the dial loop (starting it if it is not running)."""
        if self._dial_loop is None or self._dial_loop.done():
            self._dial_loop = self._spawn("dialler", self._run_dials())
        self._dial_wake.set()

    async def _run_dials(self) -> None:
        """Start every dial that is due; sleep until the next, or a change."""
        while not self._closing:
            self._dial_wake.clear()
            for ep in self._dials.due(now_ms()):
                self._dialling[ep] = self._spawn("dialler", self._dial(ep))
            deadline = self._dials.next_deadline()
            delay_s = None if deadline is None else max(0, deadline - now_ms()) / 1000
            # asyncio.timeout, not wait_for: wait_for (3.11) can swallow a
            # cancellation that races with the event being set.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay_s):
                    await self._dial_wake.wait()

    async def _dial(self, ep: Endpoint) -> None:
        """Dial ``ep`` once and report how it went to the schedule."""
        target = self._dials.target(ep)
        addr = target.address if target is not None else None
        host, port = ep
        self.counters["dials"] += 1
        outcome, peer, error = Outcome.FAILED, None, None
        try:
            async with asyncio.timeout(self._dial_timeout_s + 1.0):
                channel = await connect(
                    host,
                    port,
                    self.identity,
                    expect_address=addr,
                    authorize=self._authorize,
                    timeout_s=self._dial_timeout_s,
                    counters=self.transport_counters,
                    options=self._options,
                    boot_id=self.boot_id,
                )
        except (OSError, TimeoutError, HivemeshError) as exc:  # how it went: core.dialer's
            outcome, counter = dial_outcome(exc)
            self.counters[counter] += 1
            if outcome is Outcome.SELF:  # bootstrap lists are often shared by every node
                log.info("%s:%d is this node itself: not dialling it", host, port)
            elif outcome is not Outcome.SUPERSEDED:
                error = f"{type(exc).__name__}: {exc}"
            if outcome is Outcome.REFUSED:
                assert isinstance(exc, HivemeshError)
                self._refused(addr, exc, ep)
        except asyncio.CancelledError:
            raise  # forgotten, or closing
        except Exception as exc:  # a bug on the dial path: log, count, back off, dial again
            log.exception("dialling %s:%d failed", host, port)
            self.counters["dial_crashed"] += 1
            outcome, error = Outcome.CRASHED, f"{type(exc).__name__}: {exc}"
        else:
            outcome, peer = Outcome.OPENED, channel.peer_address
            if peer == self.address:
                channel.close()
            else:
                self._adopt(channel, dialer=self.address, endpoint=ep)
        if self._dialling.get(ep) is asyncio.current_task():
            del self._dialling[ep]
        if not self._closing:
            self._dials.dialled(ep, outcome, now_ms(), peer=peer, error=error)
            self._kick()
        if outcome is Outcome.OPENED:
            await self._deliver()

    def _refused(
        self, address: str | None, error: HivemeshError, endpoint: Endpoint | None
    ) -> None:
        """An endpoint turned us away: count, log once per cause, report (module docs)."""
        self.counters[f"refused_{error.code}"] += 1
        text = f"{type(error).__name__}: {error}"
        wrong = isinstance(error, PeerIdentityMismatch)
        if self._dials.refused(address, error.code, text, endpoint, wrong_node=wrong):
            where = (
                short(address) if address else f"{endpoint[0]}:{endpoint[1]}" if endpoint else "?"
            )
            log.warning("%s turned this node away: %s [%s]", where, error, error.code)
        if address is not None and self._on_refused is not None:
            self._on_refused(address, error)

    # -- channels ------------------------------------------------------------

    def _adopt(
        self, channel: SecureChannel, *, dialer: str, endpoint: tuple[str, int] | None
    ) -> None:
        """Take a freshly handshaken channel: it becomes the link, retires,
        replaces a restarted peer's link or is refused (module docs)."""
        peer: str = channel.peer_address
        if self._closing or not self._authorize(peer):
            channel.close()
            return
        link = PeerLink(
            address=peer,
            channel=channel,
            dialer=dialer,
            endpoint=endpoint,
            since_s=time.time(),
            rank=channel_rank(
                self.address,
                peer,
                dialer,
                channel.handshake_hash,
                relayed=channel.path.startswith("relay"),
            ),
            opened_mono=time.monotonic(),
            boot_id=channel.peer_boot_id,
        )
        link.task = self._spawn("reader", self._reader(link))
        if self._on_frames_now is not None:
            channel.consumer = lambda frames: self._consume(link, frames)
        self.counters["channels_opened"] += 1
        old = self.links.get(peer)
        held = self._handovers.pop(peer, None)
        plan = self._lives.adopt(
            peer,
            link.boot_id,
            link.rank,
            None if old is None else Link(old.boot_id, old.rank, _state(old.channel)),
            handover=None if held is None else held[0].boot_id,
            sending=channel.is_sending,
        )
        self.counters.update(plan.counters)
        if plan.new is not New.LINK:
            if held is not None:  # untouched (the newcomer is not the link)
                self._handovers[peer] = held
            link.closed = True
            if plan.new is New.DRAIN:  # retired by the peer before we got here
                self._retired.add(link)  # its reader still delivers what arrived
            elif plan.new is New.REFUSE:
                self._refuse_stale(link)
            elif old is not None:
                self._retire(link, winner=old)
            return
        if old is not None and plan.old is Old.RESTARTED:
            log.info(
                "%s restarted (boot %s, was %s): replacing its link",
                short(peer),
                link.boot_id[:4].hex(),
                old.boot_id[:4].hex(),
            )
            self._discard(old, "restarted", PeerRestarted("the peer restarted"))
        elif old is not None and plan.old is Old.ENDED:
            self._discard(old, "ended")
        self.links[peer] = link
        if old is not None and plan.old is Old.RETIRE:
            self._retire(old, winner=link)
        elif old is not None and plan.old is Old.HANDED_OVER:
            old.closed = True
            self._move(old.channel.take_unsent(), link)
        if held is not None:
            held[1].cancel()
            if plan.held is Held.MOVE:
                self._move(list(held[0].frames), link)
            else:
                self.counters["dropped_on_close"] += len(held[0].frames)
                log.info("%s restarted during a handover: starting over", short(peer))
        self._dials.linked(peer)
        log.info("connected %s (%s)", short(peer), "out" if dialer == self.address else "in")
        if plan.down:
            self._notify(peer, False)
        if plan.up:
            self._notify(peer, True)

    def _refuse_stale(self, link: PeerLink) -> None:
        """``link`` comes from an earlier life of the peer than its open link."""
        log.info(
            "refused a channel from an earlier life of %s (boot %s)",
            short(link.address),
            link.boot_id[:4].hex(),
        )
        link.channel.close(StaleBoot("a later life of this node is linked"))

    def _retire(self, loser: PeerLink, *, winner: PeerLink) -> None:
        """Half-close the losing duplicate; its unsent frames move to the winner."""
        loser.closed = True
        self._retired.add(loser)
        loser.channel.retire(
            ChannelSuperseded(f"a better channel to {loser.address[:12]} exists"),
            linger_s=self._linger_s,
        )
        self._move(loser.channel.take_unsent(), winner)

    def _move(self, frames: list[bytes], link: PeerLink) -> None:
        """Queue ``frames`` on ``link`` without waiting; count what did not fit."""
        if not frames:
            return
        moved = 0
        for frame in frames:
            try:
                link.channel.send_nowait(frame)
                moved += 1
            except (WouldBlock, TransportError):
                pass
        self.counters["frames_moved"] += moved
        self.counters["dropped_on_close"] += len(frames) - moved

    def _discard(self, link: PeerLink, reason: str, error: HivemeshError | None = None) -> None:
        """Close and forget a link without reporting it (the caller reports)."""
        link.closed = True
        if self.links.get(link.address) is link:
            del self.links[link.address]
        ch = link.channel
        lost = len(ch.take_unsent()) or ch.statistics().send_queue_frames
        if lost:
            self.counters["dropped_on_close"] += lost
        with contextlib.suppress(Exception):
            ch.close(error)  # the transport counts unsent and unread frames too
        log.info("disconnected %s: %s", short(link.address), reason)

    def _consume(self, link: PeerLink, frames: list[bytes]) -> bool:
        """The channel's inline consumer (module docs)."""
        if link.busy or self._on_frames_now is None:  # the reader holds earlier frames
            return False
        try:
            done = self._on_frames_now(link.address, frames)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException:  # a bug (or a loro panic) in a handler: log, count, redial
            log.exception("inline handler for %s failed", short(link.address))
            self.counters["reader_crashed"] += 1
            link.channel.close()  # its reader then drops the link
            return True
        self.counters["frames_inline"] += len(frames) if done else 0
        return done

    async def _reader(self, link: PeerLink) -> None:
        try:
            while True:
                frames = await link.channel.recv_batch(64)
                link.busy = True
                try:
                    await self._on_frames(link.address, frames)
                finally:
                    link.busy = False
        except asyncio.CancelledError:
            raise
        except (TransportError, OSError, EOFError) as exc:
            reason = link.channel.close_reason
            code = reason.code if isinstance(reason, HivemeshError) else None
            if code is None:
                code = exc.code if isinstance(exc, HivemeshError) else "os_error"
            self.counters[f"channel_closed_{code}"] += 1
            if link.channel.peer_close_code is not None and isinstance(reason, REFUSALS):
                self._refused(link.address, reason, None)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException:  # a bug (or a loro panic) in a handler: log, count, redial
            log.exception("reader for %s failed", short(link.address))
            self.counters["reader_crashed"] += 1
        self._retired.discard(link)
        await self._drop(link, reason="closed")
        await self._deliver()

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
        ch = link.channel
        if (
            notify
            and not self._closing
            and isinstance(ch.close_reason, ChannelSuperseded)
            and self.links.get(link.address) is link
        ):
            # The peer retired our only link: its winner is on the way (module docs).
            link.closed = True
            del self.links[link.address]
            self._start_handover(link.address, ch.take_unsent(), link.boot_id, link.opened_mono)
            return
        was_link = self.links.get(link.address) is link
        self._discard(link, reason, error)
        if was_link:
            self._unlinked(link.address, link.opened_mono)
            if notify:
                self._notify(link.address, False)

    def _start_handover(
        self, address: str, frames: list[bytes], boot_id: bytes, opened_mono: float
    ) -> None:
        timer = asyncio.get_running_loop().call_later(self._handover_s, self._end_handover, address)
        opts = self._options
        handover = Handover(opts.send_queue_frames, opts.send_queue_bytes, boot_id, opened_mono)
        self._handovers[address] = (handover, timer)
        self.counters["handover_started"] += 1
        for frame in frames:
            if not handover.hold(frame):
                self.counters["dropped_on_close"] += 1
        log.info("link to %s retired by the peer: waiting for its winner", short(address))

    def _end_handover(self, address: str, notify: bool = True) -> None:
        """No winning channel came in time: count the held frames, report the peer down."""
        held = self._handovers.pop(address, None)
        if held is None:
            return
        handover, timer = held
        timer.cancel()
        self.counters["handover_expired"] += 1
        self.counters["dropped_on_close"] += len(handover.frames)
        if address not in self.links and not self._closing:
            self._unlinked(address, handover.opened_mono)
        if notify and address not in self.links:
            log.info("disconnected %s: no channel after handover", short(address))
            self._notify(address, False)

    def _notify(self, address: str, up: bool) -> None:
        """Queue an ``on_peer`` report; a task delivers it unless a caller that
        may wait (a dialler, the acceptor, a reader) does so first, inline."""
        self.counters["peer_up_reports" if up else "peer_down_reports"] += 1
        self._events.append((address, up))
        if self._notifier is None or self._notifier.done():
            self._notifier = self._spawn("on_peer", self._deliver())

    async def _deliver(self) -> None:
        """Run queued ``on_peer`` reports, one at a time, in order.

        Never called from :meth:`send` (the daemon sends while holding its
        flush lock, and ``on_peer`` flushes): there the task delivers.
        """
        async with self._notify_lock:
            while self._events:
                peer, up = self._events.popleft()
                try:
                    await self._on_peer(peer, up)
                except Exception:  # a bug in the callback must not stop later reports
                    log.exception("on_peer(%s, %s) failed", short(peer), up)
                    self.counters["on_peer_crashed"] += 1

    async def disconnect(
        self,
        address: str,
        reason: str,
        *,
        revoked: bool = False,
        error: HivemeshError | None = None,
    ) -> None:
        """Close the channel to ``address`` (revoked, slow, shutting down); the
        peer's CLOSE carries ``error``'s code (``unknown_peer`` if ``revoked``)."""
        self._end_handover(address, notify=False)
        link = self.links.get(address)
        if link is not None:
            if revoked:
                error = UnknownPeer(f"trust in {address[:12]} was revoked")
            await self._drop(link, reason=reason, error=error)

    # -- sending -------------------------------------------------------------

    def send_fast(self, peer: str, frame: bytes) -> bool:
        """Hand ``frame`` to an open channel to ``peer`` without waiting; False
        when that is not possible at once (then :meth:`send` takes it: it
        waits for room, holds it across a handover, or counts the drop)."""
        link = self.links.get(peer)
        if link is None or not link.channel.is_sending:
            return False
        try:
            link.channel.send_nowait(frame)
        except (WouldBlock, TransportError):
            return False
        return True

    async def send(self, peer: str, frame: bytes) -> bool:
        """Queue ``frame`` for ``peer``, waiting while its queue is full.

        Returns False (and counts why) when the frame could not be queued.
        Never calls ``on_peer`` itself (reports go through the notifier task).
        """
        link = self.links.get(peer)
        if link is not None and not link.channel.is_sending:
            await self._drop(link, reason="closed")  # ended; its reader has not run yet
            link = self.links.get(peer)
        if link is None:
            held = self._handovers.get(peer)
            if held is not None and held[0].hold(frame):
                self.counters["frames_held_for_handover"] += 1
                return True
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
                "channel_id": link.channel.handshake_hash[:8].hex(),
                "path": link.channel.path,
                "boot_id": link.boot_id.hex(),
                "frames_in": st.frames_in,
                "frames_out": st.frames_out,
                "bytes_in": st.bytes_in,
                "bytes_out": st.bytes_out,
                "send_queue_frames": st.send_queue_frames,
                "send_waits": st.send_waits,
                "frames_dropped": st.frames_dropped,
            }
        return out


def _state(channel: SecureChannel) -> State:
    """A link's channel as the link rule sees it (core.links.State)."""
    if channel.is_sending:
        return State.OPEN
    superseded = isinstance(channel.close_reason, ChannelSuperseded)
    return State.SUPERSEDED if superseded else State.ENDED
