"""The transport's public surface changes only on purpose (httpx style)."""

from __future__ import annotations

import hivemesh.errors
import hivemesh.transports

EXPECTED = [
    "ChannelOptions",
    "ChannelStatistics",
    "Listener",
    "SecureChannel",
    "TransportCounters",
    "connect",
    "serve",
]


def test_transports_exports() -> None:
    assert hivemesh.transports.__all__ == EXPECTED
    for name in EXPECTED:
        assert getattr(hivemesh.transports, name).__module__.startswith("hivemesh.transports")


def test_transport_errors_are_in_the_one_tree() -> None:
    names = hivemesh.errors.__all__
    assert names == sorted(names)
    for name in ("BadRecord", "PeerUnreachable", "WouldBlock"):
        assert name in names and name in (hivemesh.errors.__doc__ or "")
    assert issubclass(hivemesh.errors.BadRecord, hivemesh.errors.RemoteProtocolError)
    assert issubclass(hivemesh.errors.WouldBlock, hivemesh.errors.TransportError)
    assert issubclass(hivemesh.errors.PeerUnreachable, hivemesh.errors.TransportError)
