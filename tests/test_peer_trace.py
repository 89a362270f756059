"""The daemon's driver and a plain replay drive the same Peer: record the
inputs a running daemon's Peer gets (three in-process nodes on loopback,
real sockets, real SQLite), replay them into a fresh Peer over a memory
store, and compare every effect (hivemesh.core.trace)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import hivemesh
from hivemesh.core.effects import Close, Deliver, Dial, LeaseLog, Redeem, Send, TrustEdit
from hivemesh.core.frames import decode_frame
from hivemesh.core.store import MemoryStore
from hivemesh.core.trace import replay
from hivemesh.errors import InviteUsed

FAST: dict[str, Any] = {
    "sync_interval_ms": 200,
    "reconnect_min_s": 0.05,
    "reconnect_max_s": 0.5,
    "probe_interval_ms": 100,
    "probe_timeout_ms": 50,
    "suspicion_mult": 2,
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


def test_a_daemons_recorded_inputs_replay_to_the_same_effects(tmp_path: Path) -> None:
    async def main() -> None:
        a = hivemesh.Node(tmp_path / "a", trace_peer=True, **FAST)
        await a.start()
        try:
            async with (
                hivemesh.Node(tmp_path / "b", bootstrap=[a.endpoint], **FAST) as b,
            ):
                c = hivemesh.Node(tmp_path / "c", bootstrap=[a.endpoint], **FAST)
                await c.start()
                await a.wait_peers(2, timeout_s=15)
                with b.context("shared") as ctx:
                    ctx["k"] = "v"
                peer = a.daemon.peer
                await _until(
                    lambda: peer.node.journal.head(b.daemon.identity.public).seq >= 2,
                    "b's write reaches a",
                )

                async def add(sender: str, body: Any) -> Any:
                    return sum(body)

                a.on_message("add", add)
                assert await b.request(a.address, "add", [2, 3], timeout_s=10) == 5
                await b.send(a.address, {"note": "hi"}, timeout_s=10)
                assert [m["data"] for m in a.inbox()] == [{"note": "hi"}]
                await b.daemon.ping(a.address, timeout_s=10)
                # local writes: each is a Peer command, so the replay makes them too
                with a.context("shared") as actx:
                    actx["mine"] = 1
                assert await a.claims.claim("job-1") >= 1
                assert await a.claim_name("alpha")
                await a.daemon.append("app.note", {"x": 1})
                # leases: a proposes (its own vote is synced to its voter log
                # first); b proposes and a votes, below (once c is gone, a is
                # the one other voter b's thrifty rounds can ask)
                async with a.leases.hold("printer", ttl_ms=2000) as held:
                    assert held.lease.fencing_token >= 1
                c_address = c.address
                await c.close()  # a sees the link go and c leave
                await _until(
                    lambda: (
                        peer.member_state(c_address) is not None
                        and peer.member_state(c_address).value in ("left", "down")
                    ),  # type: ignore[union-attr]
                    "a marks c gone",
                )
                lease = await b.leases.try_acquire("printer", ttl_ms=2000)
                await b.leases.release(lease)
                await asyncio.sleep(0.5)  # timers, anti-entropy, the group commit
        finally:
            identity = a.daemon.identity
            trace = a.daemon.trace
            await a.close()
        assert trace is not None
        kinds = {s.method for s in trace.steps}
        assert {"start", "link_up", "link_down", "receive_many", "settle", "handle_timer"} <= kinds
        assert {"command", "persisted", "handled", "inbox_room", "lease_synced"} <= kinds
        drained = [e for s in trace.steps for e in s.effects]
        assert any(isinstance(e, Send) for e in drained)
        assert any(isinstance(e, Dial) for e in drained)
        delivered = [ev for e in drained if isinstance(e, Deliver) for ev in e.events]
        assert any(ev.kind == "ctx.update" for ev in delivered)
        assert not any(isinstance(e, Close) and e.code for e in drained)
        assert any(isinstance(e, LeaseLog) for e in drained)
        ops = {s.args[0].op for s in trace.steps if s.method == "command"}
        assert {"ctx.commit", "claim", "name.claim", "append", "lease.acquire"} <= ops
        lease_frames = [e for e in drained if isinstance(e, Send) and e.frame[2] == 40]
        assert {decode_frame(e.frame)[1][0] for e in lease_frames} == {0, 1}  # asked, answered
        assert replay(trace, identity, MemoryStore()) == []

    asyncio.run(asyncio.wait_for(main(), 90))


def test_invites_and_joins_replay_to_the_same_effects(tmp_path: Path) -> None:
    """An inviter and a joiner (private trust) record their Peers: a join,
    then a stranger on probation whose proof is of the used invite (its link
    closed with the cause); both replays give the recorded effects."""
    private = {**FAST, "trust_mode": "invite"}

    async def main() -> None:
        a = hivemesh.Node(tmp_path / "a", trace_peer=True, **private)
        b = hivemesh.Node(tmp_path / "b", trace_peer=True, **private)
        c = hivemesh.Node(tmp_path / "c", **private)
        await a.start()
        try:
            await b.start()
            await c.start()
            token = a.invite(ttl_s=600)
            joined = await b.join(token, timeout_s=15)
            assert joined["inviter"] == a.address
            await _until(lambda: a.daemon.peer.member_state(b.address) is not None, "a sees b")
            with pytest.raises(InviteUsed):
                await c.join(token, timeout_s=15)
        finally:
            traces = [(n.daemon.identity, n.daemon.trace) for n in (a, b)]
            for n in (c, b, a):
                await n.close()
        (a_id, a_trace), (b_id, b_trace) = traces
        assert a_trace is not None and b_trace is not None
        a_kinds = {s.method for s in a_trace.steps}
        assert {"admit_channel", "redeemed", "link_up"} <= a_kinds
        a_fx = [e for s in a_trace.steps for e in s.effects]
        assert any(isinstance(e, Redeem) for e in a_fx)
        assert any(isinstance(e, Close) and e.code == "invite_used" for e in a_fx)
        b_fx = [e for s in b_trace.steps for e in s.effects]
        assert any(isinstance(e, TrustEdit) and e.note == "inviter" for e in b_fx)
        assert {s.args[0].op for s in b_trace.steps if s.method == "command"} >= {"join.start"}
        assert replay(a_trace, a_id, MemoryStore()) == []
        assert replay(b_trace, b_id, MemoryStore()) == []

    asyncio.run(asyncio.wait_for(main(), 90))
