"""A hand-edited trust.json that does not parse: the daemon logs and counts
it, keeps the last good trust in force, and its timers keep running (SWIM,
anti-entropy); once the file is fixed, the Peer acts on it."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

import hivemesh

FAST: dict[str, Any] = {
    "sync_interval_ms": 200,
    "reconnect_min_s": 0.05,
    "reconnect_max_s": 0.5,
    "probe_interval_ms": 100,
    "probe_timeout_ms": 50,
    "trust_mode": "open",
    "telemetry": False,
}


async def _until(pred: Any, what: str, timeout_s: float = 15.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not pred():
        if loop.time() > deadline:
            raise AssertionError(f"{what} not reached in {timeout_s}s")
        await asyncio.sleep(0.02)


def test_a_malformed_trust_file_is_logged_counted_and_the_timers_go_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        async with (
            hivemesh.Node(tmp_path / "a", **FAST) as a,
            hivemesh.Node(tmp_path / "b", bootstrap=[a.endpoint], **FAST) as b,
        ):
            await a.wait_peers(1, timeout_s=15)
            d = a.daemon
            good = d.trust.path.read_text() if d.trust.path.exists() else None
            d.trust.path.write_text("{ not json")
            await _until(lambda: d.counters["trust_file_invalid"] > 0, "the bad file is seen")
            probes = d.peer.membership.counters["probes"]
            await _until(
                lambda: d.peer.membership.counters["probes"] > probes + 3,
                "SWIM keeps probing (the timer loop runs)",
            )
            assert d.supervisor.failure is None
            assert d.peer.authorize(b.address)  # the last good trust stays in force
            errors = [r for r in caplog.records if "keeping the trust last read" in r.getMessage()]
            assert len(errors) == 1  # once, not at every tick
            # fixed by hand: revoke b in a valid file; the Peer cuts b off
            a_store = d.trust
            if good is not None:
                d.trust.path.write_text(good)
            else:
                d.trust.path.unlink()
            a_store.revoke(b.address, 1)
            await _until(lambda: b.address not in d.peer.links, "b is cut off")
            assert not d.peer.authorize(b.address)

    with caplog.at_level(logging.ERROR, logger="hivemesh.runtime"):
        asyncio.run(asyncio.wait_for(main(), 60))


def test_max_registers_are_live_in_the_daemon_and_replicate(tmp_path: Path) -> None:
    """README lists max-registers among the views: a ``reg.max`` written on
    one node shows in ``status`` on both."""
    from hivemesh.core.views.registers import MaxRegisterView

    async def main() -> None:
        async with (
            hivemesh.Node(tmp_path / "a", **FAST) as a,
            hivemesh.Node(tmp_path / "b", bootstrap=[a.endpoint], **FAST) as b,
        ):
            await a.wait_peers(1, timeout_s=15)
            await a.append(*MaxRegisterView.encode("fence-1", 7))
            await b.append(*MaxRegisterView.encode("fence-1", 5))
            await _until(lambda: b.status()["registers"].get("fence-1") == 7, "b sees 7")
            assert a.status()["registers"] == {"fence-1": 7}

    asyncio.run(asyncio.wait_for(main(), 60))
