"""Bootstrap peers: ``ADDRESS@host:port`` strings from config and invites.

A bootstrap entry names a node *and* where to dial it:
``hm...@192.0.2.7:7000``, ``hm...@[2001:db8::1]:7000`` or several endpoints
``hm...@10.0.0.5:7000,node5.lan:7000``. The address is checked (prefix,
length, checksum) and every endpoint must be ``host:port`` with a port in
1..65535; anything else is a :class:`~hivemesh.errors.ConfigError` naming
the entry. No registry and no special node: any member can be a bootstrap
peer, and after the first contact membership's peer exchange takes over.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from hivemesh.core.identity import public_key_of
from hivemesh.core.pex import MAX_ENDPOINT_CHARS, MAX_ENDPOINTS
from hivemesh.errors import ConfigError, InvalidAddress
from hivemesh.trust import Invite

__all__ = ["Bootstrap", "BootstrapPeer", "format_peer", "parse_endpoint", "parse_peer"]


@dataclass(frozen=True, slots=True)
class BootstrapPeer:
    """A node to contact first: its address and dialable endpoints."""

    address: str
    endpoints: tuple[str, ...]


def parse_endpoint(text: str) -> tuple[str, int]:
    """Split ``host:port`` or ``[v6]:port`` into ``(host, port)``; raises ConfigError."""
    text = text.strip()
    if not 0 < len(text) <= MAX_ENDPOINT_CHARS:
        raise ConfigError(f"endpoint {text!r:.80} has a bad length")
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or not rest.startswith(":"):
            raise ConfigError(f"endpoint {text!r}: want [ipv6]:port")
        port_text = rest[1:]
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep or ":" in host:
            raise ConfigError(f"endpoint {text!r}: want host:port (bracket IPv6 hosts)")
    if not host or any(c.isspace() for c in host):
        raise ConfigError(f"endpoint {text!r}: empty or invalid host")
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ConfigError(f"endpoint {text!r}: port must be 1..65535")
    return host, int(port_text)


def parse_peer(text: str) -> BootstrapPeer:
    """Parse ``ADDRESS@host:port[,host:port...]``; raises ConfigError."""
    address, sep, eps = text.strip().partition("@")
    if not sep:
        raise ConfigError(f"bootstrap peer {text!r:.80}: want ADDRESS@host:port")
    try:
        public_key_of(address)
    except InvalidAddress as exc:
        raise ConfigError(f"bootstrap peer {text!r:.80}: {exc}") from None
    endpoints = []
    for ep in eps.split(","):
        host, port = parse_endpoint(ep)
        endpoints.append(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    if len(endpoints) > MAX_ENDPOINTS:
        raise ConfigError(f"bootstrap peer {address[:12]}: at most {MAX_ENDPOINTS} endpoints")
    return BootstrapPeer(address, tuple(dict.fromkeys(endpoints)))


def format_peer(peer: BootstrapPeer) -> str:
    """The ``ADDRESS@host:port,...`` form of ``peer`` (inverse of parse_peer)."""
    return f"{peer.address}@{','.join(peer.endpoints)}"


class Bootstrap:
    """An ordered, de-duplicated set of bootstrap peers (endpoints merged)."""

    def __init__(self, self_address: str | None = None) -> None:
        self._self = self_address
        self._peers: dict[str, list[str]] = {}

    @classmethod
    def from_config(cls, entries: Iterable[str], self_address: str | None = None) -> Bootstrap:
        """Build from config strings; raises ConfigError on the first bad one."""
        boot = cls(self_address)
        for entry in entries:
            boot.add(parse_peer(entry))
        return boot

    def add(self, peer: BootstrapPeer) -> None:
        """Add ``peer`` (ignored if it is this node); endpoints are merged."""
        if peer.address == self._self:
            return
        eps = self._peers.setdefault(peer.address, [])
        for ep in peer.endpoints:
            if ep not in eps and len(eps) < MAX_ENDPOINTS:
                eps.append(ep)

    def add_invite(self, invite: Invite) -> None:
        """Add the inviter of a verified invite."""
        self.add(BootstrapPeer(invite.inviter, invite.endpoints))

    def peers(self) -> list[BootstrapPeer]:
        """Peers in insertion order."""
        return [BootstrapPeer(a, tuple(eps)) for a, eps in self._peers.items()]

    def __len__(self) -> int:
        return len(self._peers)
