"""etcd lease backend: one etcd lease per grant, compare-and-swap on the key's revision.

Theory of operation
-------------------
One key per resource, ``{prefix}{resource}``, whose value is JSON
``{"h": holder, "x": expiry_wall_ms, "t": token}`` and which is attached to
an *etcd lease* granted for that grant.

* ``acquire``: grant an etcd lease of ``ceil((ttl_ms + max_skew_ms) / 1000)``
  seconds (etcd counts whole seconds and raises short TTLs to its minimum),
  then one transaction: *if the key's* ``mod_revision`` *is still R* (0: the
  key is absent) *put the new holder attached to that lease, else return the
  key*. ``R`` is this client's last view of the key (0 at first); a failed
  compare brings the current value back in the same round trip, and if that
  value is free (released, or expired on our wall clock by more than
  ``max_skew_ms``) the transaction is retried once from it. The
  **fencing token** is the revision of the put that granted the lease (the
  key's ``mod_revision`` then): etcd revisions are cluster-wide, strictly
  increasing, persisted and never reused (compaction drops history, not the
  counter), so every grant of a resource carries a token above every earlier
  grant of it, across holders, crashes and etcd restarts. Renewals keep the
  token in ``"t"`` (``0`` there means "my own mod_revision").
* ``renew``: **keep-alive** of the grant's etcd lease (so etcd keeps the key
  at least ``ttl_ms + max_skew_ms`` from now on *its* clock), then a
  transaction on the ``mod_revision`` last seen that writes the new expiry.
* ``release``: a transaction on the ``mod_revision`` that deletes the key,
  then a revoke of its etcd lease (best effort: the lease would lapse anyway).

Why both an etcd lease and an expiry in the value: etcd leases have
whole-second granularity and a minimum TTL of ``1.5 x`` the election timeout,
while hivemesh leases may be 50 ms long. The etcd lease makes a crashed
holder's key vanish by the *server's* clock (no one has to clean it up);
the expiry in the value gives millisecond precision for takeover, judged on
the clients' wall clocks like the NATS KV backend, so the same assumption
holds: client wall clocks agree within ``max_skew_ms`` (default 100 ms). The
etcd lease always outlives the value's expiry (it is granted and kept alive
for ``ttl + skew`` rounded up), so a key never disappears while its holder
may still believe in it.

The client is etcd's own JSON gateway for the v3 API (``/v3/kv/txn``,
``/v3/lease/grant``, ...), stable since etcd 3.4, over httpx (already a
dependency of hivemesh). We do not use the ``etcd3``/``aetcd`` gRPC clients:
``etcd3`` 0.12 is unmaintained and pins an old protobuf runtime, ``aetcd``
pulls in grpcio (tens of MB, native wheels) for six unary calls; the gateway
costs one HTTP/1.1 request per call on a kept-alive connection. Each call
has one ``asyncio.timeout`` deadline; on expiry or a connection error it
raises BackendUnavailable with an unknown outcome (httpx does not retry).
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx

from hivemesh.errors import BackendUnavailable, InvalidArgument
from hivemesh.leases._api import LeaseInfo, skew_ms_from

__all__ = ["EtcdLeaseBackend"]

_CACHE_MAX = 4096
#: (mod_revision, value, etcd lease id) of this client's last view of a key
_Seen = tuple[int, dict[str, Any], int]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


def _encode(value: dict[str, Any]) -> str:
    return _b64(json.dumps(value, separators=(",", ":")).encode())


class EtcdLeaseBackend:
    """Leases in etcd (v3 API). URL: ``etcd://host:2379/PREFIX?skew_ms=100``
    (``etcds://`` for TLS; ``user:password@`` for etcd authentication)."""

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "hivemesh/lease/",
        max_skew_ms: int = 100,
        wall_ms: Callable[[], int] = _wall_ms,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("etcd", "etcds"):
            raise InvalidArgument(f"not an etcd URL: {url!r}")
        if not parts.hostname:
            raise InvalidArgument(f"etcd URL needs a host: {url!r}")
        try:
            port = parts.port or 2379
        except ValueError as e:
            raise InvalidArgument(f"bad port in {url!r}") from e
        query = parse_qs(parts.query)
        path = parts.path.strip("/")
        self._prefix = f"{path}/" if path else prefix
        self._skew_ms = skew_ms_from(query, max_skew_ms, url)
        http = "https" if parts.scheme == "etcds" else "http"
        self._base = f"{http}://{parts.hostname}:{port}"
        self._url = f"{parts.scheme}://{parts.hostname}:{port}/{self._prefix.rstrip('/')}"
        self._auth = (parts.username, parts.password or "") if parts.username else None
        self._token: str | None = None
        self._wall_ms = wall_ms
        self._http = httpx.AsyncClient(
            base_url=self._base,
            timeout=httpx.Timeout(None),  # every call has the caller's deadline
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=16),
            transport=httpx.AsyncHTTPTransport(retries=0),
        )
        self._cache: dict[str, _Seen] = {}
        self._closed = False

    @property
    def url(self) -> str:
        """The server URL and key prefix (without credentials)."""
        return self._url

    # -- the gateway -------------------------------------------------------------

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if self._closed:
            raise BackendUnavailable("etcd backend is closed")
        headers = {}
        if self._auth is not None:
            if self._token is None:
                user, password = self._auth
                r = await self._http.post(
                    "/v3/auth/authenticate", json={"name": user, "password": password}
                )
                if r.status_code != 200:
                    raise BackendUnavailable(f"etcd authentication failed: HTTP {r.status_code}")
                self._token = str(r.json().get("token", ""))
            headers["Authorization"] = self._token
        r = await self._http.post(path, json=body, headers=headers)
        if r.status_code != 200:
            if r.status_code == 401:
                self._token = None  # expired: authenticate again next call
            raise BackendUnavailable(f"etcd {path}: HTTP {r.status_code} {r.text[:200]}")
        out = r.json()
        if not isinstance(out, dict):
            raise BackendUnavailable(f"etcd {path}: unexpected reply {out!r:.200}")
        if "error" in out:
            raise BackendUnavailable(f"etcd {path}: {out['error']}")
        return out.get("result", out) if path == "/v3/lease/keepalive" else out

    async def _run(self, what: str, timeout_s: float, op: Callable[[], Any]) -> Any:
        try:
            async with asyncio.timeout(timeout_s):
                return await op()
        except TimeoutError as e:
            raise BackendUnavailable(f"etcd {what}: no answer within {timeout_s:.3f}s") from e
        except (httpx.HTTPError, OSError, ValueError) as e:
            raise BackendUnavailable(f"etcd {what}: {type(e).__name__}: {e}") from e

    def _key(self, resource: str) -> str:
        return _b64(f"{self._prefix}{resource}".encode())

    def _remember(self, key: str, seen: _Seen | None) -> None:
        self._cache.pop(key, None)
        if seen is None:
            return
        self._cache[key] = seen
        if len(self._cache) > _CACHE_MAX:
            del self._cache[next(iter(self._cache))]

    @staticmethod
    def _parse(kv: dict[str, Any]) -> _Seen:
        value = json.loads(base64.b64decode(kv.get("value", "")))
        if not isinstance(value, dict):
            raise ValueError("lease value is not an object")
        return int(kv.get("mod_revision", 0)), value, int(kv.get("lease", 0))

    async def _txn(self, key: str, rev: int, success: dict[str, Any]) -> tuple[bool, int, _Seen]:
        """If ``key`` is at ``rev`` (0: absent) run ``success``; returns
        (succeeded, the txn's revision, the key now: as written or as found)."""
        out = await self._post(
            "/v3/kv/txn",
            {
                "compare": [
                    {"target": "MOD", "key": key, "result": "EQUAL", "mod_revision": str(rev)}
                ],
                "success": [success],
                "failure": [{"request_range": {"key": key}}],
            },
        )
        revision = int(out["header"]["revision"])
        if out.get("succeeded"):
            return True, revision, (revision, {}, 0)
        kvs = out["responses"][0].get("response_range", {}).get("kvs", [])
        return False, revision, self._parse(kvs[0]) if kvs else (0, {}, 0)

    async def _read(self, key: str) -> _Seen:
        out = await self._post("/v3/kv/range", {"key": key})
        kvs = out.get("kvs", [])
        seen = self._parse(kvs[0]) if kvs else (0, {}, 0)
        self._remember(key, seen if seen[0] else None)
        return seen

    # -- rules -------------------------------------------------------------------

    def _free(self, value: dict[str, Any], now: int) -> bool:
        return not value.get("h") or now > int(value.get("x", 0)) + self._skew_ms

    @staticmethod
    def _token_of(rev: int, value: dict[str, Any]) -> int:
        t = int(value.get("t", 0))
        return t if t else rev

    def _mine(self, seen: _Seen, holder: str, token: int, now: int) -> bool:
        rev, value, _lease = seen
        return (
            rev > 0
            and value.get("h") == holder
            and self._token_of(rev, value) == token
            and now <= int(value.get("x", 0))
        )

    def _lease_s(self, ttl_ms: int) -> int:
        return max(1, math.ceil((ttl_ms + self._skew_ms) / 1000))

    # -- the protocol ------------------------------------------------------------

    async def acquire(
        self, resource: str, holder: str, ttl_ms: int, *, timeout_s: float
    ) -> int | None:
        """Grant an etcd lease, then put the holder if the key is free (module docs)."""
        key = self._key(resource)

        async def op() -> int | None:
            seen = self._cache.get(key, (0, {}, 0))
            if not self._free(seen[1], self._wall_ms()):
                seen = await self._read(key)
                if not self._free(seen[1], self._wall_ms()):
                    return None
            grant = await self._post("/v3/lease/grant", {"TTL": str(self._lease_s(ttl_ms))})
            lease_id = int(grant["ID"])
            for _ in range(2):
                value = {"h": holder, "x": self._wall_ms() + ttl_ms, "t": 0}
                put = {"request_put": {"key": key, "value": _encode(value), "lease": str(lease_id)}}
                ok, revision, now_seen = await self._txn(key, seen[0], put)
                if ok:
                    self._remember(key, (revision, value, lease_id))
                    return revision
                self._remember(key, now_seen if now_seen[0] else None)
                seen = now_seen
                if not self._free(seen[1], self._wall_ms()):
                    break
            await self._post("/v3/lease/revoke", {"ID": str(lease_id)})
            return None

        result: int | None = await self._run("acquire", timeout_s, op)
        return result

    async def _if_mine(
        self,
        what: str,
        resource: str,
        holder: str,
        token: int,
        act: Callable[[str, _Seen], Any],
        timeout_s: float,
    ) -> bool:
        key = self._key(resource)

        async def op() -> bool:
            seen = self._cache.get(key)
            if seen is None or not self._mine(seen, holder, token, self._wall_ms()):
                seen = await self._read(key)
            for _ in range(2):
                if not self._mine(seen, holder, token, self._wall_ms()):
                    return False
                done, seen = await act(key, seen)
                if done:
                    return True
            return False

        ok: bool = await self._run(what, timeout_s, op)
        return ok

    async def renew(
        self, resource: str, holder: str, token: int, ttl_ms: int, *, timeout_s: float
    ) -> bool:
        """Keep the etcd lease alive, then CAS the new expiry in."""

        async def act(key: str, seen: _Seen) -> tuple[bool, _Seen]:
            rev, _value, lease_id = seen
            alive = await self._post("/v3/lease/keepalive", {"ID": str(lease_id)})
            if int(alive.get("TTL", 0)) * 1000 < ttl_ms + self._skew_ms:
                # The etcd lease is gone (or too short to cover the renewal):
                # the key may vanish under us, so do not extend the belief.
                self._remember(key, None)
                return False, (0, {}, 0)
            value = {"h": holder, "x": self._wall_ms() + ttl_ms, "t": token}
            put = {"request_put": {"key": key, "value": _encode(value), "lease": str(lease_id)}}
            ok, revision, now_seen = await self._txn(key, rev, put)
            written = (revision, value, lease_id) if ok else now_seen
            self._remember(key, written if written[0] else None)
            return ok, written

        return await self._if_mine("renew", resource, holder, token, act, timeout_s)

    async def release(self, resource: str, holder: str, token: int, *, timeout_s: float) -> bool:
        """CAS-delete the key, then revoke its etcd lease."""

        async def act(key: str, seen: _Seen) -> tuple[bool, _Seen]:
            rev, _value, lease_id = seen
            ok, _revision, now_seen = await self._txn(
                key, rev, {"request_delete_range": {"key": key}}
            )
            if ok:
                self._remember(key, None)
                if lease_id:
                    await self._post("/v3/lease/revoke", {"ID": str(lease_id)})
                return True, (0, {}, 0)
            self._remember(key, now_seen if now_seen[0] else None)
            return False, now_seen

        return await self._if_mine("release", resource, holder, token, act, timeout_s)

    async def show(self, resource: str, *, timeout_s: float) -> LeaseInfo | None:
        """The current unexpired holder, or None."""
        key = self._key(resource)

        async def op() -> LeaseInfo | None:
            rev, value, _lease = await self._read(key)
            left = int(value.get("x", 0)) - self._wall_ms()
            if not rev or not value.get("h") or left < 0:
                return None
            return LeaseInfo(resource, str(value["h"]), self._token_of(rev, value), left)

        info: LeaseInfo | None = await self._run("show", timeout_s, op)
        return info

    async def aclose(self) -> None:
        """Close the HTTP connections. Idempotent."""
        self._closed = True
        try:
            async with asyncio.timeout(2.0):
                await self._http.aclose()
        except (TimeoutError, httpx.HTTPError, OSError):
            pass
