"""The broker interface on NATS: a JetStream stream for feeds, core subjects for the rest.

Subjects of swarm ``S`` (one stream ``HM_S`` holds ``hm.S.feed.*``):

* ``hm.S.feed.<author address>`` -- the author's signed batches (JetStream,
  file storage, the limits of :class:`~hivemesh.mesh.engine.MeshOptions`,
  discard old; message id ``<author>:<first>:<last>`` so a retried publish
  is stored once within the 2-minute duplicate window);
* ``hm.S.node.<address>`` -- envelopes for one node (core NATS);
* ``hm.S.hello`` -- presence envelopes (core NATS);
* ``hm.S.tel.<sender>`` -- telemetry batches in the stream ``HM_S_TEL``
  (work-queue retention: an entry is removed once a collector acknowledged
  it), read by the durable pull consumer ``collectors`` that every collector
  shares (explicit acks, redelivered after ``ack_wait`` 30 s).

Reading: an ephemeral *pull* consumer from the stream sequence after the
last one handed over (``ack_policy`` none: the node's own store is its
durable copy and its cursor). The reader keeps :data:`_PULL_REQUESTS` pull
requests of :data:`_PULL_BATCH` entries outstanding on its own inbox and
hands each entry over as it arrives, so the server streams the next batch
while this one is verified and stored (nats-py's ``fetch`` returns only
once a whole batch arrived: a late joiner waited for the entire stream
before its first event, or for the fetch's timeout). At most
``_PULL_REQUESTS * _PULL_BATCH`` entries (each under 1 MiB) are in flight,
so the reader's queue (:data:`_PULL_QUEUE`, twice that) and nats-py's
pending limits never overflow (if the queue did, the consumer would be
made again); the consumer sequence of every entry is checked too. The
inbox is read through a callback and ``asyncio.timeout``: nats-py's
``next_msg`` (``asyncio.wait_for`` on Python 3.11) can swallow a
cancellation that meets an arriving message, which left a node stopped
during a catch-up reading on until it was killed. An
idle reader's requests expire every :data:`_PULL_EXPIRES_S` (the server
says so: 408) and are renewed; silence beyond that, a status other than
the expected ones, or any error (server restarted, consumer gone,
connection lost) drops the consumer and makes a new one from the same
position after a short backoff, so no entry is skipped and none is handed
over twice by this reader. nats-py reconnects by itself (unbounded
attempts, 50 ms apart); ``on_state`` reports the connection going and
coming back.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

import nats
import nats.errors
import nats.js.errors
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)

from hivemesh.errors import DeadlineExceeded, PeerUnreachable, TransportError
from hivemesh.mesh.engine import (
    DataHandler,
    EngineBase,
    FeedHandler,
    MeshOptions,
    WorkHandler,
    backoff,
    tls_context,
)

__all__ = ["NatsEngine"]

log = logging.getLogger("hivemesh.mesh")
_PULL_BATCH = 16  # entries per pull request
_PULL_REQUESTS = 2  # requests outstanding: one streams while the other is handled
_PULL_EXPIRES_S = 5.0  # an idle reader's requests expire (and are renewed) this often
_PULL_SILENCE_S = _PULL_EXPIRES_S + 2.0  # nothing, not even an expiry, by then: restart
_PULL_QUEUE = 2 * _PULL_REQUESTS * _PULL_BATCH  # twice what the requests can bring


#: How nats-server words a refused user, password, token, NKey or certificate.
_AUTH_REFUSED = "authorization violation"


class NatsEngine(EngineBase):
    """:class:`~hivemesh.mesh.engine.BrokerEngine` on NATS JetStream (module docs)."""

    broker = "nats"
    timeouts = (TimeoutError, nats.errors.TimeoutError)

    def __init__(self, options: MeshOptions) -> None:
        super().__init__(options)
        s = options.swarm
        self.stream = f"HM_{s}"
        self._feed_prefix = self.name("feed", "")
        self.tel_stream = f"HM_{s}_TEL"
        self._tel_prefix = self.name("tel", "")
        self._nc: Any = None
        self._js: Any = None
        self._on_state: Callable[[bool], None] = lambda up: None
        #: the last connection error nats-py reported (it reconnects by itself)
        self.last_error = ""
        self._read_pos = 0  # the last stream sequence consume_feeds handed over
        self._created = ""  # the stream's creation time as read by start, until used

    async def start(
        self,
        me: str,
        on_node: DataHandler,
        on_presence: DataHandler,
        on_state: Callable[[bool], None],
    ) -> None:
        """Connect, make sure the stream exists, subscribe (see module docs)."""
        o = self.options
        self._on_state = on_state

        async def disconnected() -> None:
            on_state(False)

        async def reconnected() -> None:
            on_state(True)

        refused = asyncio.Event()
        refusal: list[str] = []

        async def error(exc: Exception) -> None:
            self.errors += 1
            self.last_error = f"{type(exc).__name__}: {exc}"[:200]
            if self._nc is None and _AUTH_REFUSED in str(exc).lower() and not refusal:
                # the server said no (then drops the connection, a later error): retrying
                # until the deadline changes nothing, and the refusal is the reason to give
                refusal.append(self.last_error)
                refused.set()

        kw: dict[str, Any] = {}
        if o.username:
            kw.update(user=o.username, password=o.password or "")
        if o.creds:
            kw["user_credentials"] = o.creds
        if o.nkey:
            kw["nkeys_seed"] = o.nkey
        if o.tls:
            kw["tls"] = tls_context(o)
        scheme = "tls" if o.tls else "nats"
        try:
            async with asyncio.timeout(o.timeout_s):
                connecting = asyncio.ensure_future(
                    nats.connect(
                        servers=[f"{scheme}://{o.host}:{o.port}"],
                        connect_timeout=min(2.0, o.timeout_s),
                        allow_reconnect=True,
                        max_reconnect_attempts=-1,
                        reconnect_time_wait=0.05,
                        disconnected_cb=disconnected,
                        reconnected_cb=reconnected,
                        error_cb=error,
                        **kw,
                    )
                )
                said_no = asyncio.ensure_future(refused.wait())
                try:
                    await asyncio.wait((connecting, said_no), return_when=asyncio.FIRST_COMPLETED)
                finally:
                    said_no.cancel()
                if not connecting.done():  # nats-py would retry a refused NKey until the deadline
                    connecting.cancel()
                    with contextlib.suppress(asyncio.CancelledError, nats.errors.Error, OSError):
                        await connecting
                    raise PeerUnreachable(f"nats connect: {refusal[0]}")
                self._nc = connecting.result()
                self._js = self._nc.jetstream(timeout=o.timeout_s)
                await self._ensure_stream()

                async def node_cb(msg: Any) -> None:
                    await on_node(msg.data)

                async def hello_cb(msg: Any) -> None:
                    await on_presence(msg.data)

                await self._nc.subscribe(self._node_prefix + me, cb=node_cb)
                await self._nc.subscribe(self._hello, cb=hello_cb)
        except (TimeoutError, nats.errors.Error, OSError) as exc:
            await self.close()
            reason = refusal[0] if refusal else self.last_error
            if reason:  # e.g. an authorization violation: say it, not "timeout"
                raise PeerUnreachable(f"nats connect: {reason}") from exc
            raise self._wrap("connect", exc) from exc

    async def _ensure_stream(self) -> None:
        o = self.options
        cfg = StreamConfig(
            name=self.stream,
            subjects=[self._feed_prefix + "*"],
            storage=StorageType.FILE,
            discard=DiscardPolicy.OLD,
            max_age=o.max_age_s or None,
            max_bytes=o.max_bytes,
            max_msgs=o.max_msgs,
            duplicate_window=120.0,
        )
        try:
            info = await self._js.stream_info(self.stream)
        except nats.js.errors.NotFoundError:
            with contextlib.suppress(nats.js.errors.BadRequestError):  # created meanwhile
                await self._js.add_stream(cfg)
        else:
            self._created = str(info.created or "")

    async def run(self) -> None:
        """Nothing to do: nats-py runs its own reader and reconnects by itself."""
        await asyncio.Event().wait()

    async def close(self) -> None:
        """Close the connection (pending publishes are flushed briefly)."""
        nc, self._nc, self._js = self._nc, None, None
        if nc is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2.0):
                    await nc.close()

    def _conn(self) -> Any:
        if self._nc is None:
            raise PeerUnreachable("nats: not connected")
        return self._nc

    async def send_node(self, to: str, data: bytes) -> None:
        """Publish on ``hm.S.node.<to>`` (buffered by nats-py while reconnecting)."""
        try:
            await self._conn().publish(self._node_prefix + to, data)
        except (nats.errors.Error, OSError) as exc:
            raise self._wrap("publish", exc) from exc

    async def send_presence(self, data: bytes) -> None:
        """Publish on ``hm.S.hello``."""
        try:
            await self._conn().publish(self._hello, data)
        except (nats.errors.Error, OSError) as exc:
            raise self._wrap("publish", exc) from exc

    async def publish_feed(self, author: str, first: int, last: int, data: bytes) -> str:
        """JetStream publish with a message id; the stream sequence once acknowledged."""
        self._conn()
        try:
            ack = await self._js.publish(
                self._feed_prefix + author,
                data,
                timeout=self.options.timeout_s,
                stream=self.stream,
                headers={"Nats-Msg-Id": f"{author}:{first}:{last}"},
            )
        except (TimeoutError, nats.errors.Error, OSError) as exc:
            raise self._wrap("feed publish", exc) from exc
        return str(ack.seq)

    async def last_feed(self, author: str) -> bytes | None:
        """The stream's last message on the author's subject."""
        self._conn()
        try:
            msg = await self._js.get_last_msg(self.stream, self._feed_prefix + author)
        except nats.js.errors.NotFoundError:
            return None
        except (TimeoutError, nats.errors.Error, OSError) as exc:
            raise self._wrap("get last", exc) from exc
        data: bytes = msg.data or b""
        return data

    async def log_id(self) -> str:
        """The stream's creation time (the first call after :meth:`start`
        answers from the stream's info read there: one round trip less
        before a late joiner's first read)."""
        self._conn()
        if self._created:
            created, self._created = self._created, ""
            return created
        try:
            info = await self._js.stream_info(self.stream)
        except nats.js.errors.NotFoundError:
            await self._ensure_stream()
            info = await self._js.stream_info(self.stream)
        except (TimeoutError, nats.errors.Error, OSError) as exc:
            raise self._wrap("stream info", exc) from exc
        return str(info.created or "")

    async def consume_feeds(self, after: str | None, on_msg: FeedHandler) -> None:
        """Pull from the stream after ``after``, forever (module docs)."""
        self._read_pos = int(after) if after else 0
        failures = 0
        while True:
            before = self._read_pos
            try:
                await self._pull(on_msg)
            except asyncio.CancelledError:
                raise
            except (TransportError, nats.errors.Error, OSError, TimeoutError) as exc:
                self.errors += 1
                log.debug("feed consumer restarts after %s: %s", type(exc).__name__, exc)
            if self._read_pos != before:  # it read: the next failure backs off from the start
                failures = 0
            await backoff(failures)
            failures += 1

    async def _pull(self, on_msg: FeedHandler) -> None:
        """Hand ``on_msg`` the stream's entries after ``_read_pos``, read by one
        new consumer with pull requests kept outstanding (module docs); raises
        a TransportError (or a nats error) when the consumer fails."""
        pos = self._read_pos
        nc = self._conn()
        if not nc.is_connected:
            raise PeerUnreachable("nats: reconnecting")
        inbox = nc.new_inbox()
        # nats-py hands the inbox's messages to this callback in order (module docs)
        arrived: asyncio.Queue[Any] = asyncio.Queue(_PULL_QUEUE)
        overflow = False

        async def deliver(msg: Any) -> None:
            nonlocal overflow
            try:
                arrived.put_nowait(msg)
            except asyncio.QueueFull:  # never while the requests bound what comes
                overflow = True

        sub = await nc.subscribe(inbox, cb=deliver)
        try:
            info = await self._js.add_consumer(
                self.stream,
                ConsumerConfig(
                    deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                    opt_start_seq=pos + 1,
                    ack_policy=AckPolicy.NONE,
                    inactive_threshold=60.0,
                    max_waiting=4 * _PULL_REQUESTS,
                    filter_subject=self._feed_prefix + "*",
                ),
            )
            pull = f"$JS.API.CONSUMER.MSG.NEXT.{self.stream}.{info.name}"
            request = json.dumps(
                {"batch": _PULL_BATCH, "expires": int(_PULL_EXPIRES_S * 1e9)}
            ).encode()
            waiting: deque[int] = deque()  # entries each outstanding request may still bring
            delivered = 0  # the consumer's sequence: every entry is one more
            prefix = len(self._feed_prefix)
            while True:
                while len(waiting) < _PULL_REQUESTS:
                    await nc.publish(pull, request, reply=inbox)
                    waiting.append(_PULL_BATCH)
                self.requested.set()  # (nats-py's flusher writes them at our next wait)
                try:
                    async with asyncio.timeout(_PULL_SILENCE_S):
                        msg = await arrived.get()
                except TimeoutError:
                    raise DeadlineExceeded("nats pull: no entry and no expiry") from None
                if overflow:
                    raise PeerUnreachable("nats pull: more arrived than was asked for")
                status = msg.headers.get("Status") if msg.headers else None
                if status is not None:
                    if status in ("404", "408") and waiting:  # a request ended (expired)
                        waiting.popleft()
                        continue
                    if status == "100":  # idle heartbeat
                        continue
                    what = msg.headers.get("Description", "") if msg.headers else ""
                    raise PeerUnreachable(f"nats pull: status {status} {what}".strip())
                meta = msg.metadata
                delivered += 1
                if meta.sequence.consumer != delivered:  # an entry was lost on the way
                    raise PeerUnreachable(f"nats pull: entry {delivered} of the consumer missing")
                if waiting:
                    waiting[0] -= 1
                    if not waiting[0]:
                        waiting.popleft()
                seq = int(meta.sequence.stream)
                if seq <= pos:
                    continue
                self.backlog = int(meta.num_pending or 0)
                await on_msg(str(seq), msg.subject[prefix:], msg.data)
                pos = self._read_pos = seq
        finally:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1.0):
                    await sub.unsubscribe()

    async def _ensure_tel_stream(self) -> None:
        try:
            await self._js.stream_info(self.tel_stream)
        except nats.js.errors.NotFoundError:
            cfg = StreamConfig(
                name=self.tel_stream,
                subjects=[self._tel_prefix + "*"],
                storage=StorageType.FILE,
                retention=RetentionPolicy.WORK_QUEUE,
                max_bytes=self.options.max_bytes,
                duplicate_window=120.0,
            )
            with contextlib.suppress(nats.js.errors.BadRequestError):  # created meanwhile
                await self._js.add_stream(cfg)

    async def publish_telemetry(self, sender: str, msg_id: str, data: bytes) -> None:
        """JetStream publish into the collectors' work queue (deduplicated by ``msg_id``)."""
        self._conn()
        try:
            async with asyncio.timeout(self.options.timeout_s):
                await self._ensure_tel_stream()
                await self._js.publish(
                    self._tel_prefix + sender,
                    data,
                    stream=self.tel_stream,
                    headers={"Nats-Msg-Id": msg_id},
                )
        except (TimeoutError, nats.errors.Error, OSError) as exc:
            raise self._wrap("telemetry publish", exc) from exc

    async def consume_telemetry(self, consumer: str, on_record: WorkHandler) -> None:
        """Fetch from the shared durable consumer; ack what ``on_record`` finished."""
        failures = 0
        while True:
            try:
                self._conn()
                await self._ensure_tel_stream()
                sub = await self._js.pull_subscribe(
                    self._tel_prefix + "*",
                    durable="collectors",
                    stream=self.tel_stream,
                    config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, ack_wait=30.0),
                )
                while True:
                    try:
                        msgs = await sub.fetch(batch=16, timeout=1.0)
                    except nats.errors.TimeoutError:
                        continue
                    failures = 0
                    for msg in msgs:
                        if await on_record(msg.data):
                            await msg.ack_sync(timeout=self.options.timeout_s)
                        else:
                            await msg.nak(delay=0.5)
            except asyncio.CancelledError:
                raise
            except (TransportError, nats.errors.Error, OSError, TimeoutError) as exc:
                self.errors += 1
                log.debug("telemetry consumer restarts after %s: %s", type(exc).__name__, exc)
            await backoff(failures)
            failures += 1
