"""The public surface of membership, direct, trust and discovery changes only on purpose."""

from __future__ import annotations

import importlib

import pytest

EXPECTED = {
    "hivemesh.core.membership": [
        "Member", "MemberChange", "MemberState", "Membership", "MembershipConfig",
    ],
    "hivemesh.core.direct": [
        "Direct", "DirectAcked", "DirectConfig", "DirectFailed", "DirectResult", "InboxMessage",
    ],
    "hivemesh.trust": [
        "INVITE_MEMORY_S", "INVITE_PREFIX", "MAX_INVITE_RECORDS", "Invite", "TrustStore",
        "accept_invite", "is_swarm_id", "join_proof", "make_invite",
    ],
    "hivemesh.discovery": [
        "Bootstrap", "BootstrapPeer", "format_peer", "parse_endpoint", "parse_peer",
    ],
    "hivemesh.discovery.mdns": ["SERVICE_TYPE", "Discovered", "LanDiscovery"],
}  # fmt: skip


@pytest.mark.parametrize("module", sorted(EXPECTED))
def test_exports(module: str) -> None:
    mod = importlib.import_module(module)
    assert mod.__all__ == EXPECTED[module]
    for name in mod.__all__:
        assert getattr(mod, name).__doc__ or name.isupper() or name == "DirectResult"
