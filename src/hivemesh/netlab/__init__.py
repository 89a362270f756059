"""A network lab of Linux namespaces for tests and campaigns (needs root).

Hosts are network namespaces joined by veth pairs to a bridge that lives in
a namespace of its own; NAT routers (port-preserving MASQUERADE, or
symmetric with ``fully-random``) put hosts behind them; faults cut, partition
and drop with nftables. Everything is removed on every exit path. Where
namespaces cannot be made, :func:`unavailable_reason` says why (tests skip
with it). See :mod:`hivemesh.netlab.lab` for the layout and an example.

This is a test helper: nothing in a node imports it.
"""

from __future__ import annotations

from hivemesh.netlab._run import unavailable_reason as unavailable_reason
from hivemesh.netlab.cleanup import cleanup_stale as cleanup_stale
from hivemesh.netlab.cleanup import lab_namespaces as lab_namespaces
from hivemesh.netlab.errors import NetlabCommandFailed as NetlabCommandFailed
from hivemesh.netlab.errors import NetlabError as NetlabError
from hivemesh.netlab.errors import NetlabUnavailable as NetlabUnavailable
from hivemesh.netlab.faults import Faults as Faults
from hivemesh.netlab.lab import PUBLIC_NET as PUBLIC_NET
from hivemesh.netlab.lab import Host as Host
from hivemesh.netlab.lab import Lab as Lab
from hivemesh.netlab.lab import Nat as Nat

__all__ = [
    "PUBLIC_NET",
    "Faults",
    "Host",
    "Lab",
    "Nat",
    "NetlabCommandFailed",
    "NetlabError",
    "NetlabUnavailable",
    "cleanup_stale",
    "lab_namespaces",
    "unavailable_reason",
]
