"""Bootstrap entry parsing."""

from __future__ import annotations

import pytest

from hivemesh.core.identity import Identity
from hivemesh.discovery import Bootstrap, BootstrapPeer, format_peer, parse_peer
from hivemesh.errors import ConfigError
from hivemesh.trust import accept_invite, make_invite

A = Identity.from_seed(b"a" * 32).address
B = Identity.from_seed(b"b" * 32).address


def test_parse_forms() -> None:
    assert parse_peer(f"{A}@127.0.0.1:7000") == BootstrapPeer(A, ("127.0.0.1:7000",))
    assert parse_peer(f" {A}@[::1]:7000,node.lan:7001 ").endpoints == (
        "[::1]:7000",
        "node.lan:7001",
    )
    peer = parse_peer(f"{A}@h:1,h:1")
    assert peer.endpoints == ("h:1",)
    assert parse_peer(format_peer(peer)) == peer


@pytest.mark.parametrize(
    "text",
    [
        "",
        "127.0.0.1:7000",
        f"{A}@",
        f"{A}@host",
        f"{A}@host:0",
        f"{A}@host:70000",
        f"{A}@host:x",
        f"{A}@::1:7000",
        f"{A}@[::1]7000",
        f"{A}@:7000",
        f"{A[:-1]}x@h:1",
        "hmshort@h:1",
        f"{A}@" + ",".join(f"h{i}:1" for i in range(9)),
    ],
)
def test_bad_entries_are_config_errors(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_peer(text)


def test_bootstrap_merges_and_skips_self() -> None:
    boot = Bootstrap.from_config([f"{A}@h:1", f"{B}@h:2", f"{A}@h:3", f"{A}@h:1"], self_address=B)
    assert boot.peers() == [BootstrapPeer(A, ("h:1", "h:3"))]
    ident = Identity.from_seed(b"c" * 32)
    boot.add_invite(accept_invite(make_invite(ident, ["10.1.1.1:9"], 60, 0, bytes(16)), 1))
    assert [p.address for p in boot.peers()] == [A, ident.address] and len(boot) == 2
