"""The broker interface on Redis: a Redis stream for feeds, pub/sub for the rest.

Keys and channels of swarm ``S``:

* ``hm:S:feeds`` -- the stream; each entry has fields ``a`` (author
  address) and ``d`` (the EVENTS frame). Appended by one Lua script that
  also records the author's last published seq and entry id in the hash
  ``hm:S:heads`` (``<author>`` -> ``"<last seq> <entry id>"``) and skips a
  batch whose last seq is not above it, so a retried publish is stored
  once. Trimmed with ``MAXLEN ~ max_msgs`` and ``MINID ~ now - max_age``
  (Redis >= 6.2) at each append; Redis has no byte limit on a stream, so
  ``max_bytes`` does not apply here.
* ``hm:S:tel`` -- telemetry batches, read through the consumer group
  ``collectors`` that every collector shares (``XREADGROUP``; ``XACK`` and
  ``XDEL`` once stored; entries a crashed collector left pending for 30 s
  are claimed by another with ``XAUTOCLAIM``). Retried publishes are
  stored once (a key per message id for 2 minutes, set with the XADD).
* ``hm:S:node:<address>`` and ``hm:S:hello`` -- pub/sub channels for node
  messages and presence (at most once, like core NATS).

Reading: ``XREAD BLOCK`` from the entry id after the last one handed over,
256 at a time; on any error it reconnects and resumes from there. Entry ids
are ``<ms>-<n>`` and grow along the stream even when the key is deleted and
created again (while the server clock does not go back), so a position
stays valid across a purge; :meth:`RedisEngine.log_id` is therefore fixed.
The pub/sub connection is watched by :meth:`RedisEngine.run` (a supervised
loop of the daemon), which resubscribes after a connection loss and reports
the loss and the recovery through ``on_state``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError, ResponseError

from hivemesh.errors import TransportError
from hivemesh.mesh.engine import (
    DataHandler,
    EngineBase,
    FeedHandler,
    MeshOptions,
    WorkHandler,
    backoff,
)

__all__ = ["RedisEngine"]

log = logging.getLogger("hivemesh.mesh")
_READ = 256

_PUBLISH = """
local head = redis.call('HGET', KEYS[2], ARGV[1])
if head then
  local seq = tonumber(string.match(head, '^(%d+)'))
  if seq >= tonumber(ARGV[2]) then return string.match(head, ' (.+)$') end
end
local id
if tonumber(ARGV[5]) > 0 then
  id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[4], '*', 'a', ARGV[1], 'd', ARGV[3])
else
  id = redis.call('XADD', KEYS[1], '*', 'a', ARGV[1], 'd', ARGV[3])
end
if tonumber(ARGV[6]) > 0 then
  redis.call('XTRIM', KEYS[1], 'MINID', '~', ARGV[6])
end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2] .. ' ' .. id)
return id
"""


_PUBLISH_ONCE = """
if redis.call('SET', KEYS[2], '1', 'NX', 'EX', 120) then
  redis.call('XADD', KEYS[1], '*', 's', ARGV[1], 'd', ARGV[2])
end
return 1
"""


class RedisEngine(EngineBase):
    """:class:`~hivemesh.mesh.engine.BrokerEngine` on Redis Streams (module docs)."""

    broker = "redis"
    sep = ":"

    def __init__(self, options: MeshOptions) -> None:
        super().__init__(options)
        self.stream = self.name("feeds")
        self._heads = self.name("heads")
        self._tel = self.name("tel")
        self._redis = aioredis.Redis(
            host=options.host,
            port=options.port,
            db=options.db,
            username=options.username,
            password=options.password,
            ssl=options.tls,
            ssl_ca_certs=options.ca,
            ssl_certfile=options.cert,
            ssl_keyfile=options.key,
            socket_connect_timeout=min(2.0, options.timeout_s),
            socket_timeout=None,  # every call has its own deadline
            retry=Retry(NoBackoff(), 0),
            max_connections=32,
        )
        self._publish = self._redis.register_script(_PUBLISH)
        self._publish_once = self._redis.register_script(_PUBLISH_ONCE)
        self._me = ""
        self._on_node: DataHandler | None = None
        self._on_presence: DataHandler | None = None
        self._on_state: Callable[[bool], None] = lambda up: None
        self._pubsub: Any = None
        self._up = asyncio.Event()

    async def _call(self, what: str, coro: Any) -> Any:
        try:
            async with asyncio.timeout(self.options.timeout_s):
                return await coro
        except (TimeoutError, RedisError, OSError) as exc:
            raise self._wrap(what, exc) from exc

    async def start(
        self,
        me: str,
        on_node: DataHandler,
        on_presence: DataHandler,
        on_state: Callable[[bool], None],
    ) -> None:
        """Connect and subscribe (the messages flow once :meth:`run` runs)."""
        self._me, self._on_node, self._on_presence = me, on_node, on_presence
        self._on_state = on_state
        await self._subscribe()

    async def _subscribe(self) -> None:
        ps = self._redis.pubsub(ignore_subscribe_messages=True)
        try:
            await self._call("subscribe", ps.subscribe(self._node_prefix + self._me, self._hello))
        except TransportError:
            with contextlib.suppress(Exception):
                await ps.aclose()  # type: ignore[no-untyped-call]
            raise
        self._pubsub = ps
        self._up.set()

    async def run(self) -> None:
        """Deliver pub/sub messages; resubscribe after a connection loss."""
        failures = 0
        while True:
            try:
                if self._pubsub is None:
                    await self._subscribe()
                    self._on_state(True)
                ps = self._pubsub
                while True:
                    msg = await ps.get_message(timeout=1.0)
                    failures = 0
                    if msg is None or msg.get("type") != "message":
                        continue
                    handler = self._on_presence if msg["channel"] == self._hello.encode() else None
                    handler = handler or self._on_node
                    if handler is not None:
                        await handler(bytes(msg["data"]))
            except (TransportError, RedisError, OSError) as exc:
                self.errors += 1
                log.debug("redis pub/sub reconnects after %s", exc)
                if self._pubsub is not None:
                    self._on_state(False)
                    with contextlib.suppress(Exception):
                        await self._pubsub.aclose()
                    self._pubsub = None
            await backoff(failures)
            failures += 1

    async def close(self) -> None:
        """Close the pub/sub connection and the pool. Idempotent."""
        ps, self._pubsub = self._pubsub, None
        with contextlib.suppress(Exception):
            async with asyncio.timeout(2.0):
                if ps is not None:
                    await ps.aclose()
                await self._redis.aclose()

    async def send_node(self, to: str, data: bytes) -> None:
        """PUBLISH on ``hm:S:node:<to>``."""
        await self._call("publish", self._redis.publish(self._node_prefix + to, data))

    async def send_presence(self, data: bytes) -> None:
        """PUBLISH on ``hm:S:hello``."""
        await self._call("publish", self._redis.publish(self._hello, data))

    async def publish_feed(self, author: str, first: int, last: int, data: bytes) -> str:
        """XADD (with trimming) unless this batch is already in (module docs)."""
        o = self.options
        min_id = 0
        if o.max_age_s:
            min_id = max(0, int((time.time() - o.max_age_s) * 1000))
        entry = await self._call(
            "feed publish",
            self._publish(
                keys=[self.stream, self._heads],
                args=[author, last, data, max(o.max_msgs, 0), int(o.max_msgs > 0), min_id],
            ),
        )
        return bytes(entry).decode() if isinstance(entry, bytes) else str(entry)

    async def last_feed(self, author: str) -> bytes | None:
        """The entry the heads hash names for ``author``, if the stream still has it."""
        head = await self._call("heads", self._redis.hget(self._heads, author))
        if head is None:
            return None
        entry_id = bytes(head).decode().partition(" ")[2]
        found = await self._call("xrange", self._redis.xrange(self.stream, entry_id, entry_id))
        if not found:
            return None
        return bytes(found[0][1][b"d"])

    async def log_id(self) -> str:
        """Fixed: entry ids stay ordered across a purge (module docs)."""
        return "redis"

    async def consume_feeds(self, after: str | None, on_msg: FeedHandler) -> None:
        """XREAD BLOCK from after ``after``, forever (module docs)."""
        pos = after or "0-0"
        failures = 0
        while True:
            try:
                self.requested.set()  # the XREAD below goes out at once
                async with asyncio.timeout(1.0 + self.options.timeout_s):
                    got: Any = await self._redis.xread({self.stream: pos}, count=_READ, block=1000)
                failures = 0
                for _key, entries in got or ():
                    for entry_id, fields in entries:
                        eid = bytes(entry_id).decode()
                        author = bytes(fields.get(b"a", b"")).decode()
                        await on_msg(eid, author, bytes(fields.get(b"d", b"")))
                        pos = eid
            except (TimeoutError, RedisError, OSError) as exc:
                self.errors += 1
                log.debug("redis feed reader reconnects after %s", exc)
                await backoff(failures)
                failures += 1

    async def publish_telemetry(self, sender: str, msg_id: str, data: bytes) -> None:
        """XADD to the collectors' stream, once per ``msg_id`` within 2 minutes."""
        await self._call(
            "telemetry publish",
            self._publish_once(keys=[self._tel, f"{self._tel}:id:{msg_id}"], args=[sender, data]),
        )

    async def consume_telemetry(self, consumer: str, on_record: WorkHandler) -> None:
        """XREADGROUP as ``consumer`` of the group ``collectors``; XACK+XDEL when done."""
        failures = 0
        group = "collectors"
        while True:
            try:
                with contextlib.suppress(ResponseError):  # BUSYGROUP: it exists already
                    async with asyncio.timeout(self.options.timeout_s):
                        await self._redis.xgroup_create(self._tel, group, id="0", mkstream=True)
                while True:
                    claimed: Any = await self._call(
                        "xautoclaim",
                        self._redis.xautoclaim(self._tel, group, consumer, 30_000, count=16),
                    )
                    entries = list(claimed[1]) if claimed else []
                    if not entries:
                        async with asyncio.timeout(1.0 + self.options.timeout_s):
                            got: Any = await self._redis.xreadgroup(
                                group, consumer, {self._tel: ">"}, count=16, block=1000
                            )
                        entries = [e for _k, es in got or () for e in es]
                    failures = 0
                    for entry_id, fields in entries:
                        if not fields:
                            continue
                        if await on_record(bytes(fields.get(b"d", b""))):
                            await self._call("xack", self._redis.xack(self._tel, group, entry_id))
                            await self._call("xdel", self._redis.xdel(self._tel, entry_id))
            except (TransportError, TimeoutError, RedisError, OSError) as exc:
                self.errors += 1
                log.debug("redis telemetry consumer restarts after %s", exc)
            await backoff(failures)
            failures += 1
