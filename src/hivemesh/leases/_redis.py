"""Redis lease backend: one Lua script per operation, one round trip each.

Theory of operation
-------------------
Per resource ``R`` two keys share a hash tag (so they live on one cluster slot):

* ``{prefix}{R}}:lease`` -- ``"<token>:<holder>"`` with a ``PX`` expiry, present
  while the lease is held;
* ``{prefix}{R}}:fence`` -- an integer counter that never expires.

``acquire`` runs ``EXISTS lease`` / ``INCR fence`` / ``SET lease PX`` atomically
in one script, so a grant's token is strictly greater than every earlier
grant's, whoever held them. ``renew`` (compare-and-``PEXPIRE``) and ``release``
(compare-and-``DEL``) act only if the stored value is exactly this holder's
``token:holder``.

Guarantees and assumptions: validity is judged by the Redis server's clock
(``PX``). Tokens survive a Redis restart only if the ``fence`` counter does:
run Redis with AOF (``appendfsync everysec`` loses at most ~1 s of writes --
including, in the worst case, counter increments; use ``always`` where tokens
must never repeat after a crash). A single Redis is not replicated: failover to
an asynchronously replicated replica can lose grants (Redlock's known limit).
Connection errors and timeouts raise BackendUnavailable with an unknown
outcome; the client library's automatic retries are disabled because a retried
``acquire`` could be applied twice.

Cost: one round trip per operation, ``EVALSHA`` of a script loaded once per
server (``SCRIPT LOAD`` again only after a ``NOSCRIPT`` reply, which means the
script did not run). Each call's deadline is one ``asyncio.timeout`` around
the whole command; redis-py's own ``socket_timeout`` is left unset, since it
would add a second timer per read and, on Python 3.11, a task per send
(``asyncio.wait_for``). A call cancelled by its deadline mid-command makes
redis-py close that connection, so no reply is ever read by the wrong call.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError, RedisError, ResponseError

from hivemesh.errors import BackendUnavailable, InvalidArgument
from hivemesh.leases._api import LeaseInfo

__all__ = ["RedisLeaseBackend"]

_ACQUIRE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return false end
local t = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], t .. ':' .. ARGV[1], 'PX', ARGV[2])
return t
"""

_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

_SHOW = """
local v = redis.call('GET', KEYS[1])
if not v then return false end
return {v, redis.call('PTTL', KEYS[1])}
"""


class _Script:
    """A Lua script and its SHA1 (what ``EVALSHA`` names it by)."""

    __slots__ = ("sha", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self.sha = hashlib.sha1(text.encode()).hexdigest()  # Redis names scripts so


class RedisLeaseBackend:
    """Leases in one Redis server. URL: ``redis://host:port/db?prefix=hm:``."""

    def __init__(self, url: str, *, prefix: str = "hivemesh:lease:") -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("redis", "rediss"):
            raise InvalidArgument(f"not a redis URL: {url!r}")
        query = parse_qs(parts.query)
        self._prefix = query.get("prefix", [prefix])[0]
        self._url = f"{parts.scheme}://{parts.hostname or '127.0.0.1'}:{parts.port or 6379}"
        db = parts.path.strip("/") or "0"
        if not db.isdigit():
            raise InvalidArgument(f"redis database must be a number, got {db!r}")
        self._url += f"/{db}"
        self._redis = aioredis.Redis(
            host=parts.hostname or "127.0.0.1",
            port=parts.port or 6379,
            db=int(db),
            username=parts.username,
            password=parts.password,
            ssl=parts.scheme == "rediss",
            socket_timeout=None,  # every call has the caller's deadline (see module docs)
            socket_connect_timeout=5.0,
            retry=Retry(NoBackoff(), 0),
            decode_responses=False,
            max_connections=64,
        )
        self._exec: Callable[..., Awaitable[Any]] = self._redis.execute_command
        self._acquire = _Script(_ACQUIRE)
        self._renew = _Script(_RENEW)
        self._release = _Script(_RELEASE)
        self._show = _Script(_SHOW)

    @property
    def url(self) -> str:
        """The server URL (without credentials)."""
        return self._url

    def _keys(self, resource: str) -> list[str]:
        tag = f"{self._prefix}{{{resource}}}"
        return [f"{tag}:lease", f"{tag}:fence"]

    async def _eval(self, script: _Script, keys: list[str], args: list[Any]) -> Any:
        try:
            return await self._exec("EVALSHA", script.sha, len(keys), *keys, *args)
        except NoScriptError:  # a new or flushed server: the script did not run
            await self._exec("SCRIPT", "LOAD", script.text)
            return await self._exec("EVALSHA", script.sha, len(keys), *keys, *args)

    async def _call(
        self, what: str, timeout_s: float, script: _Script, keys: list[str], args: list[Any]
    ) -> Any:
        try:
            async with asyncio.timeout(timeout_s):
                return await self._eval(script, keys, args)
        except TimeoutError as e:
            raise BackendUnavailable(f"redis {what}: no answer within {timeout_s:.3f}s") from e
        except ResponseError as e:
            raise BackendUnavailable(f"redis {what}: server error {e}") from e
        except (RedisError, OSError) as e:
            raise BackendUnavailable(f"redis {what}: {type(e).__name__}: {e}") from e

    async def acquire(
        self, resource: str, holder: str, ttl_ms: int, *, timeout_s: float
    ) -> int | None:
        """Grant if free: SET NX PX + INCR of the token counter in one script."""
        r = await self._call(
            "acquire", timeout_s, self._acquire, self._keys(resource), [holder, ttl_ms]
        )
        return None if r is None else int(r)

    async def renew(
        self, resource: str, holder: str, token: int, ttl_ms: int, *, timeout_s: float
    ) -> bool:
        """Compare-and-PEXPIRE."""
        keys = self._keys(resource)[:1]
        r = await self._call("renew", timeout_s, self._renew, keys, [f"{token}:{holder}", ttl_ms])
        return bool(r)

    async def release(self, resource: str, holder: str, token: int, *, timeout_s: float) -> bool:
        """Compare-and-DEL."""
        keys = self._keys(resource)[:1]
        r = await self._call("release", timeout_s, self._release, keys, [f"{token}:{holder}"])
        return bool(r)

    async def show(self, resource: str, *, timeout_s: float) -> LeaseInfo | None:
        """GET + PTTL in one script."""
        r = await self._call("show", timeout_s, self._show, self._keys(resource)[:1], [])
        if r is None:
            return None
        value, pttl = r
        token, _, holder = bytes(value).decode().partition(":")
        return LeaseInfo(resource, holder, int(token), max(0, int(pttl)))

    async def aclose(self) -> None:
        """Close the connection pool."""
        with contextlib.suppress(RedisError, OSError):
            await self._redis.aclose()
