"""Drop what a test swarm left on the shared NATS and Redis servers.

A broker-mode swarm creates JetStream streams (``HM_<swarm>``,
``HM_<swarm>_TEL``, the lease bucket ``KV_hm_<swarm>_leases``) or Redis keys
(``hm:<swarm>:*``, ``hm_<swarm>_leases*``). A file stream reserves its
``max_bytes`` (1 GiB by default) against the server's JetStream store, so
swarms left behind by test runs end in "insufficient storage resources".
Every test that makes a swarm on a shared server drops it when it is done.
"""

from __future__ import annotations

import asyncio
from urllib.parse import parse_qs, urlsplit

__all__ = ["drop_swarm"]


def drop_swarm(url: str | None, timeout_s: float = 10.0) -> int:
    """Delete every stream/bucket (NATS) or key (Redis) of the swarm named in
    ``url``'s ``swarm=`` query; returns how many were deleted."""
    if url is None:
        return 0
    parts = urlsplit(url)
    swarm = parse_qs(parts.query).get("swarm", [""])[0]
    if not swarm:
        return 0
    if parts.scheme.startswith("nats"):
        return asyncio.run(asyncio.wait_for(_drop_nats(parts, swarm), timeout_s))
    return _drop_redis(parts, swarm, timeout_s)


async def _drop_nats(parts: object, swarm: str) -> int:
    import nats

    host, port = parts.hostname or "127.0.0.1", parts.port or 4222  # type: ignore[attr-defined]
    nc = await nats.connect(f"nats://{host}:{port}", connect_timeout=5)
    try:
        js = nc.jetstream(timeout=5.0)
        mine = {f"HM_{swarm}", f"HM_{swarm}_TEL", f"KV_hm_{swarm}_leases"}
        dropped = 0
        for info in await js.streams_info():
            if info.config.name in mine:
                await js.delete_stream(info.config.name)
                dropped += 1
        return dropped
    finally:
        await nc.close()


def _drop_redis(parts: object, swarm: str, timeout_s: float) -> int:
    import redis

    host, port = parts.hostname or "127.0.0.1", parts.port or 6379  # type: ignore[attr-defined]
    db = int((parts.path or "/0").strip("/") or 0)  # type: ignore[attr-defined]
    r = redis.Redis(host=host, port=port, db=db, socket_timeout=timeout_s)
    try:
        keys = [*r.scan_iter(f"hm:{swarm}:*", count=500), *r.scan_iter(f"hm_{swarm}_leases*")]
        return int(r.delete(*keys)) if keys else 0
    finally:
        r.close()
