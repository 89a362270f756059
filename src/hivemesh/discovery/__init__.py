"""Finding peers without a registry: bootstrap entries and mDNS on the LAN.

Peer exchange over the mesh itself is membership gossip: every alive record
carries the member's endpoints (see :mod:`hivemesh.core.pex`).
"""

from __future__ import annotations

from hivemesh.discovery.bootstrap import Bootstrap as Bootstrap
from hivemesh.discovery.bootstrap import BootstrapPeer as BootstrapPeer
from hivemesh.discovery.bootstrap import format_peer as format_peer
from hivemesh.discovery.bootstrap import parse_endpoint as parse_endpoint
from hivemesh.discovery.bootstrap import parse_peer as parse_peer

__all__ = ["Bootstrap", "BootstrapPeer", "format_peer", "parse_endpoint", "parse_peer"]
