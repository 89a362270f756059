"""The dashboard names each peer's link by its path (TCP, QUIC, punched, relayed)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

from hivemesh import commands as c
from hivemesh.faces.dashboard.hub import Hub
from hivemesh.faces.dashboard.live import Live

PEERS = [
    {"address": "a" * 52, "state": "up", "path": "direct UDP", "rtt_ms": 0.8,
     "channel": {"direction": "out", "endpoint": "10.0.0.2:7000", "path": "udp"}},
    {"address": "b" * 52, "state": "up", "path": "relayed via ccccccccccc", "rtt_ms": None,
     "channel": {"direction": "in", "endpoint": None, "path": "relay:" + "c" * 52}},
    {"address": "d" * 52, "state": "up", "path": "direct TCP", "rtt_ms": None,
     "channel": {"direction": "out", "endpoint": "10.0.0.4:7000", "path": "tcp"}},
    {"address": "e" * 52, "state": "suspect"},
]  # fmt: skip


class _Source:
    label = "test"

    async def run(self, request: c.Command) -> Any:
        assert isinstance(request, c.Peers)
        return SimpleNamespace(data=PEERS)

    async def watch(self) -> AsyncIterator[dict[str, Any]]:
        if False:  # pragma: no cover
            yield {}


def test_each_peer_shows_its_path_and_the_links_own_rtt_before_the_pings() -> None:
    live = Live(_Source(), Hub())
    live._rtt = {"d" * 52: 1.5, "b" * 52: 7.0}
    rows = {r["address"][0]: r for r in asyncio.run(live._peers())}
    assert rows["a"]["link"]["type"] == "direct UDP"
    assert rows["a"]["rtt_ms"] == 0.8  # QUIC's smoothed RTT
    assert rows["b"]["link"]["type"] == "relayed via ccccccccccc"
    assert rows["b"]["rtt_ms"] == 7.0  # no RTT of its own: the dashboard's ping
    assert rows["d"]["link"]["type"] == "direct TCP" and rows["d"]["rtt_ms"] == 1.5
    assert rows["e"]["link"]["type"].startswith("none")
