"""NATS JetStream KV lease backend: compare-and-swap on the key revision.

Theory of operation
-------------------
One KV bucket (``history=1``, file storage) holds one key per resource. The
value is JSON ``{"h": holder, "x": expiry_wall_ms, "t": token}``; a released
lease is a *tombstone* value with ``"h": ""`` -- the key is never deleted or
purged, so its history (and the stream sequence) keeps growing.

* ``acquire``: read the key; if it is absent, a tombstone, or expired
  (``now > x + max_skew_ms``), write the new holder with ``create`` (key
  absent) or ``update(last=revision)`` (compare-and-swap). The *revision of
  that write* is the fencing token (stored as ``"t": 0`` meaning "my own
  revision"; renewals copy it into ``"t"``). KV revisions are stream sequence
  numbers: strictly increasing per bucket, never reused while the stream
  exists, across server restarts (file storage), so every grant of a resource
  gets a token above every earlier grant of it.
* ``renew`` / ``release``: read, check holder and token and that it has not
  expired, then CAS with the revision read. A concurrent write makes the CAS
  fail, so two writers can never both succeed from the same revision.
* Each backend object caches the revision and value of its own last read or
  write per key and tries the CAS straight from the cache (one round trip for
  the common acquire-after-own-release and release-after-own-grant); a stale
  cache only makes the CAS fail, and then it reads. Decisions are identical to
  read-then-CAS because CAS pins the revision the decision was made on.

nats-server 2.9 has no per-key TTL, so the expiry lives in the value and is
judged on the *clients'* wall clocks: a lease written at wall time ``w`` with
``ttl_ms`` is taken over only when another client's wall clock exceeds
``w + ttl_ms + max_skew_ms``. Safety therefore assumes client wall clocks
agree within ``max_skew_ms`` (NTP-synchronised hosts, default 100 ms) and do
not jump; the holder's own belief is shorter still (see ``hivemesh.leases``).
Deleting the bucket resets revisions and breaks fencing: never do that in use.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

import nats
import nats.errors
import nats.js.errors
from nats.js.api import KeyValueConfig, StorageType

from hivemesh.errors import BackendUnavailable, InvalidArgument
from hivemesh.leases._api import LeaseInfo, skew_ms_from

__all__ = ["NatsLeaseBackend"]

_CACHE_MAX = 4096
_KEY_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


def nats_key(resource: str) -> str:
    """Map a resource name onto the NATS key alphabet (``=XX`` escapes, reversible)."""
    return "".join(c if c in _KEY_SAFE else f"={ord(c):02X}" for c in resource)


def _encode(value: dict[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


class NatsLeaseBackend:
    """Leases in a JetStream KV bucket. URL: ``nats://host:port/BUCKET?skew_ms=100``."""

    def __init__(
        self,
        url: str,
        *,
        bucket: str = "hivemesh_leases",
        max_skew_ms: int = 100,
        wall_ms: Callable[[], int] = _wall_ms,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("nats", "tls"):
            raise InvalidArgument(f"not a nats URL: {url!r}")
        query = parse_qs(parts.query)
        self._bucket = parts.path.strip("/") or bucket
        if not all(c in _KEY_SAFE for c in self._bucket):
            raise InvalidArgument(f"invalid NATS bucket name {self._bucket!r}")
        self._skew_ms = skew_ms_from(query, max_skew_ms, url)
        self._server = f"{parts.scheme}://{parts.hostname or '127.0.0.1'}:{parts.port or 4222}"
        self._user = parts.username
        self._password = parts.password
        self._wall_ms = wall_ms
        self._nc: Any = None
        self._kv: Any = None
        self._lock = asyncio.Lock()
        self._closed = False
        self._cache: dict[str, tuple[int, dict[str, Any]]] = {}
        #: Connection errors reported by nats-py (it reconnects by itself).
        self.connection_errors = 0

    @property
    def url(self) -> str:
        """The server URL and bucket (without credentials)."""
        return f"{self._server}/{self._bucket}"

    async def _connect(self) -> Any:
        if self._kv is not None:
            return self._kv
        async with self._lock:
            if self._kv is not None:
                return self._kv
            if self._closed:
                raise BackendUnavailable("nats backend is closed")
            nc = await nats.connect(
                servers=[self._server],
                user=self._user,
                password=self._password,
                connect_timeout=2,
                allow_reconnect=True,
                max_reconnect_attempts=-1,
                reconnect_time_wait=0.05,
                error_cb=self._on_error,
            )
            try:
                js = nc.jetstream(timeout=5.0)
                try:
                    kv = await js.key_value(self._bucket)
                except nats.js.errors.BucketNotFoundError:
                    kv = await js.create_key_value(
                        KeyValueConfig(bucket=self._bucket, history=1, storage=StorageType.FILE)
                    )
            except BaseException:
                await nc.close()
                raise
            self._nc, self._kv = nc, kv
            return kv

    async def _on_error(self, err: Exception) -> None:
        self.connection_errors += 1

    async def _run(self, what: str, timeout_s: float, op: Callable[[Any], Any]) -> Any:
        try:
            async with asyncio.timeout(timeout_s):
                kv = await self._connect()
                return await op(kv)
        except TimeoutError as e:
            raise BackendUnavailable(f"nats {what}: no answer within {timeout_s:.3f}s") from e
        except (nats.errors.Error, OSError) as e:
            raise BackendUnavailable(f"nats {what}: {type(e).__name__}: {e}") from e

    async def _read(self, kv: Any, key: str) -> tuple[int, dict[str, Any]] | None:
        try:
            entry = await kv.get(key)
        except nats.js.errors.KeyNotFoundError:
            self._cache.pop(key, None)
            return None
        try:
            value = json.loads(entry.value)
            if not isinstance(value, dict):
                raise ValueError("not an object")
        except ValueError as e:
            raise BackendUnavailable(f"nats: unreadable lease value under {key!r}: {e}") from e
        self._remember(key, int(entry.revision), value)
        return int(entry.revision), value

    def _remember(self, key: str, rev: int, value: dict[str, Any]) -> None:
        self._cache.pop(key, None)
        self._cache[key] = (rev, value)
        if len(self._cache) > _CACHE_MAX:
            del self._cache[next(iter(self._cache))]

    async def _cas(self, kv: Any, key: str, value: dict[str, Any], last: int) -> int | None:
        """Write ``value`` if the key is still at revision ``last``; its new revision or None."""
        try:
            rev = int(await kv.update(key, _encode(value), last=last))
        except nats.js.errors.KeyWrongLastSequenceError:
            self._cache.pop(key, None)
            return None
        except BaseException:
            self._cache.pop(key, None)  # unknown outcome: the cache may be wrong now
            raise
        self._remember(key, rev, value)
        return rev

    def _free(self, value: dict[str, Any], now: int) -> bool:
        return not value.get("h") or now > int(value.get("x", 0)) + self._skew_ms

    @staticmethod
    def _token(rev: int, value: dict[str, Any]) -> int:
        t = int(value.get("t", 0))
        return t if t else rev

    @staticmethod
    def _mine(rev: int, value: dict[str, Any], holder: str, token: int, now: int) -> bool:
        return (
            value.get("h") == holder
            and NatsLeaseBackend._token(rev, value) == token
            and now <= int(value.get("x", 0))
        )

    async def acquire(
        self, resource: str, holder: str, ttl_ms: int, *, timeout_s: float
    ) -> int | None:
        """Grant if free or expired (create / CAS); the write's revision is the token.

        The revision and value of this client's last read or write of the key
        are cached: when they say "free", the CAS is tried straight away (one
        round trip); a stale cache only makes the CAS fail, then we read.
        """
        key = nats_key(resource)

        async def op(kv: Any) -> int | None:
            cached = self._cache.get(key)
            now = self._wall_ms()
            if cached is not None and self._free(cached[1], now):
                rev = await self._cas(kv, key, {"h": holder, "x": now + ttl_ms, "t": 0}, cached[0])
                if rev is not None:
                    return rev
            cur = await self._read(kv, key)
            now = self._wall_ms()
            value = {"h": holder, "x": now + ttl_ms, "t": 0}
            if cur is None:
                try:
                    rev = int(await kv.create(key, _encode(value)))
                except nats.js.errors.KeyWrongLastSequenceError:
                    return None
                self._remember(key, rev, value)
                return rev
            if not self._free(cur[1], now):
                return None
            return await self._cas(kv, key, value, cur[0])

        result: int | None = await self._run("acquire", timeout_s, op)
        return result

    async def _cas_if_mine(
        self,
        what: str,
        resource: str,
        holder: str,
        token: int,
        new: Callable[[int], dict[str, Any]],
        timeout_s: float,
    ) -> bool:
        key = nats_key(resource)

        async def op(kv: Any) -> bool:
            cached = self._cache.get(key)
            now = self._wall_ms()
            if (
                cached is not None
                and self._mine(*cached, holder, token, now)
                and await self._cas(kv, key, new(now), cached[0]) is not None
            ):
                return True
            cur = await self._read(kv, key)
            now = self._wall_ms()
            if cur is None or not self._mine(*cur, holder, token, now):
                return False
            return await self._cas(kv, key, new(now), cur[0]) is not None

        ok: bool = await self._run(what, timeout_s, op)
        return ok

    async def renew(
        self, resource: str, holder: str, token: int, ttl_ms: int, *, timeout_s: float
    ) -> bool:
        """CAS the expiry forward if still ours and unexpired."""
        return await self._cas_if_mine(
            "renew",
            resource,
            holder,
            token,
            lambda now: {"h": holder, "x": now + ttl_ms, "t": token},
            timeout_s,
        )

    async def release(self, resource: str, holder: str, token: int, *, timeout_s: float) -> bool:
        """CAS a tombstone in if still ours and unexpired."""
        return await self._cas_if_mine(
            "release", resource, holder, token, lambda now: {"h": "", "x": 0, "t": 0}, timeout_s
        )

    async def show(self, resource: str, *, timeout_s: float) -> LeaseInfo | None:
        """The current unexpired holder, or None."""
        key = nats_key(resource)

        async def op(kv: Any) -> LeaseInfo | None:
            cur = await self._read(kv, key)
            if cur is None:
                return None
            rev, v = cur
            left = int(v.get("x", 0)) - self._wall_ms()
            if not v.get("h") or left < 0:
                return None
            return LeaseInfo(resource, str(v["h"]), self._token(rev, v), left)

        info: LeaseInfo | None = await self._run("show", timeout_s, op)
        return info

    async def aclose(self) -> None:
        """Drain and close the connection."""
        self._closed = True
        nc, self._nc, self._kv = self._nc, None, None
        if nc is not None:
            try:
                async with asyncio.timeout(2.0):
                    await nc.close()
            except (TimeoutError, nats.errors.Error, OSError):
                pass
