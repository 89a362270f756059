"""The daemon and the simulator run the same wiring (issue 12).

Forward: three real daemons on loopback (real sockets, real SQLite) record
one node's Peer inputs and effects; the simulator's driver
(:class:`~hivemesh.sim.peer_adapter.PeerAdapter`, the one object through
which the simulator calls a Peer) takes that trace's inputs through its own
methods, and its effects must equal the daemon's at every drain. An adapter
method that hands an input to the Peer otherwise than the daemon does
(another argument, an extra settle, a dropped call) breaks this.

Converse: a simulated run (crashes, partitions, forgeries) records every
life of every Peer; :func:`hivemesh.core.trace.replay` rebuilds each and
must get the same effects. A simulator step that changes a Peer around its
inputs (an append written on ``peer.node``, a settle on a delay of its own)
breaks this.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import hivemesh
from aiotest import eventually, run
from hivemesh.core.effects import Deliver, Fsync, LeaseLog, Reply, Send
from hivemesh.core.trace import feed, replay
from hivemesh.sim.campaign import default_options
from hivemesh.sim.cluster import Cluster
from hivemesh.sim.disk import DiskStore
from hivemesh.sim.peer_adapter import PeerAdapter

#: quick timers, every node admitted (the trace covers the Peer, not trust)
OPTS: dict[str, Any] = dict(
    sync_interval_ms=200, probe_interval_ms=100, probe_timeout_ms=50, suspicion_mult=2
) | {"reconnect_min_s": 0.05, "reconnect_max_s": 0.5, "trust_mode": "open", "telemetry": False}


def test_a_daemons_trace_through_the_simulators_driver_gives_the_same_effects(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        a = hivemesh.Node(tmp_path / "a", trace_peer=True, **OPTS)
        await a.start()
        try:
            async with (
                hivemesh.Node(tmp_path / "b", bootstrap=[a.endpoint], **OPTS) as b,
                hivemesh.Node(tmp_path / "c", bootstrap=[a.endpoint], **OPTS) as c,
            ):
                await a.wait_peers(2, timeout_s=15)
                with b.context("shared") as ctx:  # a remote context write
                    ctx["k"] = "v"
                peer = a.daemon.peer
                b_key = b.daemon.identity.public
                await eventually(
                    lambda: peer.node.journal.head(b_key).seq >= 2, "b's write at a", 15
                )
                with a.context("shared") as actx:  # a local one: command(AppendMany)
                    actx["mine"] = 1
                assert await a.claims.claim("job-1") >= 1
                await c.send(a.address, {"note": "hi"}, timeout_s=10)  # a direct message
                assert [m["data"] for m in a.inbox()] == [{"note": "hi"}]
                await a.send(b.address, {"note": "back"}, timeout_s=10)
                async with a.leases.hold("printer", ttl_ms=2000) as held:
                    assert held.lease.fencing_token >= 1
                await asyncio.sleep(0.5)  # timers, anti-entropy, the group commit
        finally:
            identity = a.daemon.identity
            trace = a.daemon.trace
            await a.close()
        assert trace is not None
        kinds = Counter(s.method for s in trace.steps)
        # every input the simulator itself gives a Peer is in the trace
        for kind in ("start", "link_up", "handle_timer", "settle", "command"):
            assert kinds[kind] > 0, (kind, kinds)
        assert kinds["persisted"] > 0  # c's message stored in a's inbox
        assert kinds["receive"] + kinds["receive_many"] > 0
        drained = [e for s in trace.steps for e in s.effects]
        assert any(isinstance(e, Send) for e in drained)
        assert any(isinstance(e, Fsync) for e in drained)
        assert any(isinstance(e, LeaseLog) for e in drained)
        assert any(isinstance(e, Reply) for e in drained)
        delivered = [ev for e in drained if isinstance(e, Deliver) for ev in e.events]
        assert any(ev.kind == "ctx.update" for ev in delivered)
        ops = {s.args[0].op for s in trace.steps if s.method == "command"}
        assert {"ctx.commit", "claim", "send", "lease.acquire"} <= ops, ops

        adapter = PeerAdapter.from_trace(trace, identity, DiskStore())
        assert feed(adapter, trace.steps) == []
        # and the Peer the adapter drove ended where the daemon's did
        assert adapter.node.journal.version_vector() == peer.node.journal.version_vector()

    run(main(), 90)


@pytest.mark.parametrize("workload", ["journal", "claims"])
def test_a_simulated_runs_traces_replay_to_the_same_effects(workload: str) -> None:
    """Every life of every node of one faulty simulated run (loss,
    partitions, crashes, restarts, forgeries; claims settled and executed)
    replays."""
    c = Cluster("11", default_options(5, workload), trace=True)
    res = c.run()
    assert res.violations == []
    assert c.traces is not None and c.stats["crashes"] > 0
    lives = sorted(c.traces)
    assert any(inc > 1 for _i, inc in lives)  # restarted lives too
    for index, inc in lives:
        trace, store = c.traces[index, inc]
        diffs = replay(trace, c.nodes[index].identity, store)
        assert diffs == [], (index, inc, diffs)
        kinds = {s.method for s in trace.steps}
        assert {"rehydrate", "start", "link_up", "receive", "handle_timer", "command"} <= kinds
        if trace.inputs() > 200:  # lived long enough for a group commit
            assert "settle" in kinds, (index, inc)
