"""The swarm voter's group commit: no reply before its change is synced, in order.

The rules are the Peer's (:class:`hivemesh.core.lease_swarm.SwarmLeases`,
sans-IO: its effects are read from a list); the driver's half
(:class:`hivemesh.runtime.leases.VoterDisk`: one real ``fdatasync`` per
event-loop turn, a failure reported) runs on a real voter log in a real loop.
(These tests drove the runtime's ``MeshLeases`` over a stand-in daemon before
the voter and proposer moved into the Peer.)
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from hivemesh.core.effects import Effect, LeaseLog, LeaseSync, Send
from hivemesh.core.frames import decode_frame
from hivemesh.core.identity import address_of
from hivemesh.core.lease_quorum import Acquire
from hivemesh.core.lease_swarm import LeaseSetup, SwarmLeases
from hivemesh.core.lease_voter import Voter
from hivemesh.runtime.leases import VoterDisk

SELF, P1, P2 = (address_of(bytes([i]) * 32) for i in (1, 2, 3))


def machine(fx: list[Effect]) -> SwarmLeases:
    return SwarmLeases(
        SELF,
        LeaseSetup(),
        [SELF, P1, P2],
        0,
        fx=fx,
        authorize=lambda peer: True,
        live=lambda voters: [SELF, *[v for v in voters if v != SELF]],
        members_up=lambda: [P1, P2],
        publish=lambda voters, now_ms: None,
        nonce=lambda: 7,
    )


def trace(fx: list[Effect]) -> list[Any]:
    """The effects as ``("send", peer, kind, rid)``, ``("write", r)``, ``("sync", upto)``."""
    out: list[Any] = []
    for e in fx:
        if isinstance(e, Send):
            _, (_sub, msg) = decode_frame(e.frame)
            out.append(("send", e.peer, msg[0], msg[1]))
        elif isinstance(e, LeaseLog):
            out.append(("write", e.resource))
        elif isinstance(e, LeaseSync):
            out.append(("sync", e.upto))
    fx.clear()
    return out


def test_replies_wait_for_the_sync_and_leave_in_order() -> None:
    fx: list[Effect] = []
    m = machine(fx)
    # two accepts (durable changes) around a prepare (none)
    m.on_frame(P1, [0, ["acc", 1, "r1", 1, "h", 1000, "a/1"]], 0)
    m.on_frame(P2, [0, ["prep", 2, "r1"]], 0)
    m.on_frame(P1, [0, ["acc", 3, "r2", 1, "h", 1000, "a/3"]], 0)
    # nothing answered yet; one sync asked for, then one more for the later write
    assert trace(fx) == [("write", "r1"), ("sync", 1), ("write", "r2"), ("sync", 2)]
    m.synced(1, None, 0)  # the first write is durable: the replies made before r2's
    assert trace(fx) == [("send", P1, "acc_r", 1), ("send", P2, "prep_r", 2)]
    m.synced(2, None, 0)
    assert trace(fx) == [("send", P1, "acc_r", 3)]
    # nothing pending: an answer leaves at once; within the token reserve an
    # accept changes nothing durable, so it needs no sync either
    m.on_frame(P1, [0, ["rel", 4, "r1", 1, "h", "x/4", ""]], 0)
    m.on_frame(P1, [0, ["acc", 5, "r1", 2, "h", 1000, "a/5"]], 0)
    assert trace(fx) == [("send", P1, "rel_r", 4), ("send", P1, "acc_r", 5)]
    assert m.counters["voter_log_write"] == 2


def test_a_failed_sync_stops_the_voter_before_any_reply() -> None:
    fx: list[Effect] = []
    m = machine(fx)
    m.on_frame(P1, [0, ["acc", 1, "r", 1, "h", 1000, "a/1"]], 0)
    m.on_frame(P2, [0, ["prep", 2, "r"]], 0)
    m.synced(1, "OSError: [Errno 5] Input/output error", 0)
    # the accept is in memory but maybe not on disk: a retransmission would be
    # acknowledged from memory alone, so the voter answers nothing any more
    m.on_frame(P1, [0, ["acc", 1, "r", 1, "h", 1000, "a/1"]], 0)
    m.on_frame(P2, [0, ["prep", 3, "other"]], 0)
    assert [t for t in trace(fx) if t[0] == "send"] == []
    assert m.disk_error is not None and m.statistics()["disk_error"] == m.disk_error
    assert m.counters["voter_disk_error"] == 1
    assert m.counters["voter_stopped_disk_error"] == 2


def test_the_own_vote_reaches_the_proposer_only_after_its_sync() -> None:
    fx: list[Effect] = []
    m = machine(fx)
    peers = {P1: Voter(P1), P2: Voter(P2)}
    m.start(99, Acquire("r", "h", 1000), 2000, 0)
    seen: list[Any] = []
    for _ in range(20):  # rounds: the peers answer what reached them, then one sync
        round_ = trace(fx[:])
        seen += round_
        todo, syncs = fx[:], [e for e in fx if isinstance(e, LeaseSync)]
        fx.clear()
        for e in todo:
            if isinstance(e, Send):
                _, (_sub, msg) = decode_frame(e.frame)
                m.on_frame(e.peer, [1, peers[e.peer].receive(msg, 0)], 0)
        done = m.outcomes()
        if done:
            break
        assert not m.outcomes()
        for e in syncs:
            seen.append(("synced", e.upto))
            m.synced(e.upto, None, 0)
        done = m.outcomes()
        if done:
            break
    else:
        raise AssertionError("the acquire did not finish")
    ((rid, outcome),) = done
    assert rid == 99 and outcome.status == "ok" and outcome.token == 1
    # the accept frame to another voter was queued before the own vote's write,
    # and the outcome (which needs the own accept: P2 may be slow) came after the sync
    accept_sent = next(i for i, t in enumerate(seen) if t[0] == "send" and t[2] == "acc")
    assert accept_sent < seen.index(("write", "r")) < seen.index(("synced", 1))


def test_the_driver_syncs_once_per_loop_turn_and_reports_failures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def main() -> None:
        reports: list[tuple[int, str | None]] = []
        disk = VoterDisk(tmp_path, synced=lambda upto, error: reports.append((upto, error)))
        assert disk.open().voter_state is None
        disk.write("r1", 1025, 1000)
        disk.sync_soon(1)
        disk.write("r2", 1025, 1000)
        disk.sync_soon(2)
        assert reports == []
        await asyncio.sleep(0)
        assert reports == [(2, None)] and disk.log.syncs == 1

        def fail() -> bool:
            raise OSError(5, "Input/output error")

        monkeypatch.setattr(disk.log, "sync", fail)
        disk.write("r3", 1025, 1000)
        disk.sync_soon(3)
        await asyncio.sleep(0)
        assert reports[-1][0] == 3 and "Input/output error" in str(reports[-1][1])
        disk.close()
        disk.sync_soon(4)  # closed: nothing reported
        await asyncio.sleep(0)
        assert len(reports) == 2
        again = VoterDisk(tmp_path, synced=lambda upto, error: None).open().voter_state
        assert again is not None and again["max_tokens"]["r1"] == 1025

    asyncio.run(main())
