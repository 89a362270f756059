"""The broker interface: what a shared log engine must offer broker mode.

Two halves, each engine maps them onto its own primitives:

* **The feed log** -- durable, ordered, shared by the swarm: every node
  appends its own feed's signed batches under its own subject
  (:meth:`BrokerEngine.publish_feed`, acknowledged once durable on the
  broker), and every node reads the whole log from a position
  (:meth:`BrokerEngine.consume_feeds`). Positions are opaque strings
  (a JetStream stream sequence, a Redis stream entry id) that increase along
  the log; :meth:`BrokerEngine.log_id` names the log's incarnation, so a
  node notices a log deleted and created again and reads it from the start.
* **Node messages** -- at-most-once delivery to one node
  (:meth:`BrokerEngine.send_node`) or to the swarm's presence channel
  (:meth:`BrokerEngine.send_presence`): SWIM, direct messages, anti-entropy,
  lease votes, presence. Losses there are the protocols' business (they
  retransmit), exactly as on a lossy link.

* **Telemetry** -- a durable work queue shared by every collector
  (:meth:`BrokerEngine.publish_telemetry`, :meth:`BrokerEngine.consume_telemetry`):
  each entry goes to one collector and stays in the queue until that
  collector acknowledges it; one that is not acknowledged in time (the
  collector crashed) goes to another.

Engines: :mod:`hivemesh.mesh.nats_engine` (JetStream stream + core NATS
subjects) and :mod:`hivemesh.mesh.redis_engine` (Redis Streams + pub/sub).
:func:`parse_mesh_url` reads the shared URL options.
"""

from __future__ import annotations

import asyncio
import re
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import parse_qs, urlsplit

from hivemesh.errors import ConfigError, DeadlineExceeded, PeerUnreachable, TransportError

__all__ = [
    "BrokerEngine",
    "EngineBase",
    "FeedHandler",
    "MeshOptions",
    "backoff",
    "parse_mesh_url",
    "tls_context",
]

#: ``on_msg(position, author_address, data)`` for one log entry.
FeedHandler = Callable[[str, str, bytes], Awaitable[None]]
#: ``on_data(data)`` for one node message.
DataHandler = Callable[[bytes], Awaitable[None]]
#: ``on_record(data) -> done``: a telemetry entry for one collector; True
#: acknowledges it (stored, or refused for good), False has it delivered again.
WorkHandler = Callable[[bytes], Awaitable[bool]]

_RETRY_S = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0)


async def backoff(failures: int) -> None:
    """Sleep before retry number ``failures`` (50 ms doubling to 2 s): how every
    reconnecting loop of broker mode waits."""
    await asyncio.sleep(_RETRY_S[min(failures, len(_RETRY_S) - 1)])


_SWARM_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
_SCHEMES = ("nats", "tls", "redis", "rediss")


@dataclass(frozen=True, slots=True)
class MeshOptions:
    """A parsed ``--mesh`` URL. Retention limits apply to the feed log.

    ``max_age_s``: entries older than this are dropped (default 7 days; 0:
    no limit); ``max_bytes``: the log's size cap (default 1 GiB; -1: none);
    ``max_msgs``: its entry cap (-1: none; Redis: the ``MAXLEN ~`` trim,
    default 1,000,000). When a limit drops entries a node never read, it
    gets them from peers (anti-entropy over node messages) or reports a gap
    (docs/broker.md).
    """

    url: str  # without credentials
    engine: str  # "nats" or "redis"
    swarm: str
    host: str
    port: int
    username: str | None = None
    password: str | None = None
    tls: bool = False
    creds: str | None = None  # NATS: a .creds file (JWT + NKey seed)
    nkey: str | None = None  # NATS: an NKey seed file
    ca: str | None = None  # TLS: trust this CA file (else the system's)
    cert: str | None = None  # TLS: client certificate file (mutual TLS) ...
    key: str | None = None  # ... and its private key file
    db: int = 0  # Redis database
    max_age_s: float = 7 * 86_400.0
    max_bytes: int = 1 << 30
    max_msgs: int = -1
    timeout_s: float = 5.0


def parse_mesh_url(url: str) -> MeshOptions:
    """Parse ``nats://[user:pass@]host:4222?swarm=NAME&max_age_s=..``
    (``tls://`` for TLS, with ``ca=FILE`` to trust a private CA and
    ``cert=FILE&key=FILE`` for a client certificate; ``creds=FILE`` or ``nkey=FILE`` for NATS
    credentials) or ``redis://[user:pass@]host:6379/DB?swarm=NAME``
    (``rediss://`` for TLS); raises :class:`~hivemesh.errors.ConfigError`."""
    if not isinstance(url, str):
        raise ConfigError("mesh URL must be a string")
    parts = urlsplit(url)
    if parts.scheme not in _SCHEMES:
        raise ConfigError(f"mesh URL scheme must be one of {_SCHEMES}, got {url!r}")
    engine = "redis" if parts.scheme.startswith("redis") else "nats"
    try:
        port = parts.port or (6379 if engine == "redis" else 4222)
    except ValueError:
        raise ConfigError(f"bad port in mesh URL {url!r}") from None
    q = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    known = {"swarm", "max_age_s", "max_bytes", "max_msgs", "timeout_s", "creds", "nkey"}
    known |= {"ca", "cert", "key"}
    unknown = set(q) - known
    if unknown:
        raise ConfigError(f"unknown mesh URL options {sorted(unknown)} in {url!r}")
    swarm = q.get("swarm", "hivemesh")
    if not _SWARM_RE.fullmatch(swarm):
        raise ConfigError(f"swarm name {swarm!r}: 1-64 chars of [A-Za-z0-9_-]")
    db = 0
    if engine == "redis":
        path = parts.path.strip("/") or "0"
        if not path.isdigit():
            raise ConfigError(f"redis database must be a number in {url!r}")
        db = int(path)
    try:
        max_age_s = float(q.get("max_age_s", 7 * 86_400.0))
        max_bytes = int(q.get("max_bytes", 1 << 30))
        default_msgs = 1_000_000 if engine == "redis" else -1
        max_msgs = int(q.get("max_msgs", default_msgs))
        timeout_s = float(q.get("timeout_s", 5.0))
    except ValueError:
        raise ConfigError(f"mesh URL limits must be numbers in {url!r}") from None
    if max_age_s < 0 or timeout_s <= 0 or max_bytes == 0 or max_msgs == 0:
        raise ConfigError(f"mesh URL limits out of range in {url!r}")
    if ("cert" in q) != ("key" in q):
        raise ConfigError(f"mesh URL: cert and key go together in {url!r}")
    if any(k in q for k in ("ca", "cert")) and parts.scheme not in ("tls", "rediss"):
        raise ConfigError(f"mesh URL: ca/cert need tls:// or rediss:// in {url!r}")
    host = parts.hostname or "127.0.0.1"
    clean = f"{parts.scheme}://{host}:{port}"
    if engine == "redis":
        clean += f"/{db}"
    return MeshOptions(
        url=f"{clean}?swarm={swarm}",
        engine=engine,
        swarm=swarm,
        host=host,
        port=port,
        username=parts.username,
        password=parts.password,
        tls=parts.scheme in ("tls", "rediss"),
        creds=q.get("creds"),
        nkey=q.get("nkey"),
        ca=q.get("ca"),
        cert=q.get("cert"),
        key=q.get("key"),
        db=db,
        max_age_s=max_age_s,
        max_bytes=max_bytes,
        max_msgs=max_msgs,
        timeout_s=timeout_s,
    )


class BrokerEngine(Protocol):
    """A broker engine (module docs). Every call has a deadline
    (``MeshOptions.timeout_s`` unless given) and raises
    :class:`~hivemesh.errors.TransportError` subclasses on failure."""

    options: MeshOptions

    async def start(
        self,
        me: str,
        on_node: DataHandler,
        on_presence: DataHandler,
        on_state: Callable[[bool], None],
    ) -> None:
        """Connect; deliver messages for ``me`` and presence messages;
        report connection loss and recovery with ``on_state``."""
        ...

    async def run(self) -> None:
        """The engine's own background work, if any (a supervised loop of the
        node: e.g. reading Redis pub/sub); returns never."""
        ...

    async def close(self) -> None:
        """Disconnect. Idempotent."""
        ...

    async def send_node(self, to: str, data: bytes) -> None:
        """At-most-once message to node ``to``."""
        ...

    async def send_presence(self, data: bytes) -> None:
        """At-most-once message to every node of the swarm."""
        ...

    async def publish_feed(self, author: str, first: int, last: int, data: bytes) -> str:
        """Append ``data`` (``author``'s batch ``first..last``) to the log;
        returns its position once the broker has it durably. Publishing the
        same ``(author, first, last)`` twice stores it once where the engine
        can deduplicate (JetStream's message id); a duplicate is harmless
        to readers either way."""
        ...

    async def last_feed(self, author: str) -> bytes | None:
        """The last entry ``author`` published that the log still holds."""
        ...

    async def log_id(self) -> str:
        """The log's incarnation (changes when it is deleted and created again)."""
        ...

    #: While ``on_msg`` runs: how many entries the log holds after the one
    #: handed over (0 when caught up or when the engine cannot tell).
    backlog: int

    #: Set once :meth:`consume_feeds` has asked the broker for its first
    #: entries (they are on their way while the caller does other work).
    requested: asyncio.Event

    async def consume_feeds(self, after: str | None, on_msg: FeedHandler) -> None:
        """Read the log from just after position ``after`` (None: its start)
        and hand each entry to ``on_msg``, in order, until cancelled;
        reconnects by itself and resumes after the last entry handed over
        (setting :attr:`backlog` before each call where the engine knows it)."""
        ...

    async def publish_telemetry(self, sender: str, msg_id: str, data: bytes) -> None:
        """Put one telemetry batch in the collectors' queue; returns once durable."""
        ...

    async def consume_telemetry(self, consumer: str, on_record: WorkHandler) -> None:
        """As collector ``consumer``, take entries from the shared queue and
        acknowledge each one ``on_record`` says is done, until cancelled."""
        ...


class EngineBase:
    """What the engines share: their options, the swarm's names (``hm`` +
    swarm + parts, joined by the broker's separator), the counters
    :class:`BrokerEngine` promises and how a failed call becomes a
    :class:`~hivemesh.errors.TransportError`."""

    #: the broker's name in error messages, and its name separator
    broker = ""
    sep = "."
    #: exceptions that mean "no answer in time" (else: unreachable)
    timeouts: tuple[type[BaseException], ...] = (TimeoutError,)

    def __init__(self, options: MeshOptions) -> None:
        self.options = options
        self._node_prefix = self.name("node", "")
        self._hello = self.name("hello")
        #: connection errors seen (each followed by a reconnect)
        self.errors = 0
        #: entries after the one being handed to consume_feeds' handler (0: cannot tell)
        self.backlog = 0
        #: consume_feeds asked the broker for its first entries
        self.requested = asyncio.Event()

    def name(self, *parts: str) -> str:
        """``hm<sep><swarm><sep>part...`` (a subject, channel or key)."""
        return self.sep.join(("hm", self.options.swarm, *parts))

    def _wrap(self, what: str, exc: BaseException) -> TransportError:
        if isinstance(exc, self.timeouts):
            return DeadlineExceeded(
                f"{self.broker} {what}: no answer within {self.options.timeout_s}s"
            )
        return PeerUnreachable(f"{self.broker} {what}: {type(exc).__name__}: {exc}")


def tls_context(o: MeshOptions) -> ssl.SSLContext:
    """The client TLS context of ``o``: the system's CAs or ``o.ca``, and
    ``o.cert``/``o.key`` as client certificate (files read now)."""
    try:
        ctx = ssl.create_default_context(cafile=o.ca)
        if o.cert is not None:
            ctx.load_cert_chain(o.cert, o.key)
    except OSError as exc:  # a missing or unreadable file (ssl.SSLError is one too)
        raise ConfigError(f"mesh TLS files: {exc}") from None
    return ctx
