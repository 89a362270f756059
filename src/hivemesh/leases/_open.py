"""``open_backend(url)``: pick a lease backend by URL scheme."""

from __future__ import annotations

from urllib.parse import urlsplit

from hivemesh.errors import InvalidArgument
from hivemesh.extras import missing
from hivemesh.leases._api import LeaseBackend

__all__ = ["SCHEMES", "open_backend"]

#: URL schemes open_backend understands.
SCHEMES = ("etcd", "etcds", "mesh", "nats", "quorum", "redis", "rediss")


def open_backend(url: str) -> LeaseBackend:
    """A lease backend for ``url``; connections are made lazily on first use.

    * ``redis://host:port/db?prefix=...`` -- :class:`RedisLeaseBackend`
    * ``nats://host:port/BUCKET?skew_ms=100`` -- :class:`NatsLeaseBackend`
    * ``etcd://host:port/PREFIX?skew_ms=100`` -- :class:`EtcdLeaseBackend`
      (etcd leases with keep-alive; ``etcds://`` for TLS)

    * ``quorum://IP:PORT,IP:PORT,...`` -- :class:`QuorumLeaseBackend` (UDP voters,
      see :class:`VoterServer` / :class:`LocalQuorum`; no external service)
    * ``mesh://`` or ``mesh:///DATA_DIR`` -- :class:`MeshLeaseBackend`: the
      embedded quorum of the local hivemesh daemon's swarm

    Unknown schemes raise InvalidArgument.
    """
    if not isinstance(url, str):
        raise InvalidArgument(f"backend URL must be a string, got {type(url).__name__}")
    scheme = urlsplit(url).scheme
    try:
        if scheme in ("redis", "rediss"):
            from hivemesh.leases._redis import RedisLeaseBackend

            return RedisLeaseBackend(url)
        if scheme in ("nats", "tls"):
            from hivemesh.leases._nats import NatsLeaseBackend

            return NatsLeaseBackend(url)
    except ModuleNotFoundError as exc:  # the redis / nats extra is not installed
        raise missing(exc, f"the {scheme}:// lease backend") from None
    if scheme in ("etcd", "etcds"):
        from hivemesh.leases._etcd import EtcdLeaseBackend

        return EtcdLeaseBackend(url)
    if scheme == "quorum":
        from hivemesh.leases._quorum import QuorumLeaseBackend

        return QuorumLeaseBackend(url)
    if scheme == "mesh":
        from hivemesh.leases._mesh import MeshLeaseBackend

        return MeshLeaseBackend(url)
    raise InvalidArgument(f"unknown lease backend scheme {scheme!r} in {url!r}; use {SCHEMES}")
