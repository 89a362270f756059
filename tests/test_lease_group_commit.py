"""The swarm voter's group commit: no reply before its change is synced, in order.

:class:`~hivemesh.runtime.leases.MeshLeases` over a stand-in daemon (unit
test: the channels are recorders, the voter log is a real file whose writes
and syncs are traced) in a real event loop.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from hivemesh.core.frames import decode_frame
from hivemesh.core.identity import address_of
from hivemesh.core.lease_quorum import Acquire
from hivemesh.core.lease_voter import Voter
from hivemesh.core.pex import MemberState
from hivemesh.runtime import leases as mesh_leases
from hivemesh.runtime.voterlog import VoterLog

SELF, P1, P2 = (address_of(bytes([i]) * 32) for i in (1, 2, 3))


class TracedLog(VoterLog):
    """A real voter log that records writes and syncs (and can fail a sync)."""

    trace: list[Any]
    fail_sync = False

    def write(self, resource: str, max_token: int, max_ttl_ms: int) -> None:
        super().write(resource, max_token, max_ttl_ms)
        self.trace.append(("write", resource))

    def sync(self) -> bool:
        if self.fail_sync:
            raise OSError(5, "Input/output error")
        synced = super().sync()
        if synced:
            self.trace.append("sync")
        return synced


class Channel:
    def __init__(self, peer: str, trace: list[Any], sent: list[tuple[str, Any]]) -> None:
        self.peer, self.trace, self.sent = peer, trace, sent

    def send_now(self, frame: bytes) -> None:
        _, (_sub, msg) = decode_frame(frame)
        self.trace.append(("send", self.peer, msg[0], msg[1]))
        self.sent.append((self.peer, msg))


def daemon(tmp_path: Path, trace: list[Any], sent: list[tuple[str, Any]]) -> Any:
    links = {p: SimpleNamespace(channel=Channel(p, trace, sent)) for p in (P1, P2)}
    node = SimpleNamespace(
        add_view=lambda view: None,
        register_handler=lambda ftype, fn: None,
        send=lambda peer, frame: trace.append(("via_flush", peer)),
    )
    return SimpleNamespace(
        address=SELF,
        config=SimpleNamespace(data_dir=tmp_path, lease_voters=[SELF, P1, P2]),
        node=node,
        conns=SimpleNamespace(links=links),
        peer=SimpleNamespace(member_state=lambda a: MemberState.UP),
        authorize=lambda peer: True,
        _started=True,
        _schedule_flush=lambda: None,
    )


@pytest.fixture
def traced(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    trace: list[Any] = []
    TracedLog.trace = trace
    TracedLog.fail_sync = False
    monkeypatch.setattr(mesh_leases, "VoterLog", TracedLog)
    return trace


def test_replies_wait_for_one_sync_per_loop_turn_and_leave_in_order(
    tmp_path: Path, traced: list[Any]
) -> None:
    sent: list[tuple[str, Any]] = []

    async def main() -> None:
        ml = mesh_leases.MeshLeases(daemon(tmp_path, traced, sent))
        # one loop turn: two accepts (durable changes) around a prepare (none)
        ml._on_frame(P1, [0, ["acc", 1, "r1", 1, "h", 1000, "a/1"]], 0)
        ml._on_frame(P2, [0, ["prep", 2, "r1"]], 0)
        ml._on_frame(P1, [0, ["acc", 3, "r2", 1, "h", 1000, "a/3"]], 0)
        assert traced == [("write", "r1"), ("write", "r2")]  # nothing answered yet
        await asyncio.sleep(0)
        assert traced[2:] == [
            "sync",  # one for both accepts
            ("send", P1, "acc_r", 1),
            ("send", P2, "prep_r", 2),  # after the accept it may depend on
            ("send", P1, "acc_r", 3),
        ]
        del traced[:]
        # nothing pending: an answer leaves at once; within the token reserve an
        # accept changes nothing durable, so it needs no sync either
        ml._on_frame(P1, [0, ["rel", 4, "r1", 1, "h", "x/4", ""]], 0)
        ml._on_frame(P1, [0, ["acc", 5, "r1", 2, "h", 1000, "a/5"]], 0)
        assert traced == [("send", P1, "rel_r", 4), ("send", P1, "acc_r", 5)]
        assert ml.log.syncs == 1 and ml.counters["voter_fsync"] == 1
        ml.close()

    asyncio.run(main())


def test_a_failed_sync_stops_the_voter_before_any_reply(tmp_path: Path, traced: list[Any]) -> None:
    sent: list[tuple[str, Any]] = []

    async def main() -> None:
        ml = mesh_leases.MeshLeases(daemon(tmp_path, traced, sent))
        TracedLog.fail_sync = True
        ml._on_frame(P1, [0, ["acc", 1, "r", 1, "h", 1000, "a/1"]], 0)
        ml._on_frame(P2, [0, ["prep", 2, "r"]], 0)
        await asyncio.sleep(0)
        TracedLog.fail_sync = False
        # the accept is in memory but maybe not on disk: a retransmission would be
        # acknowledged from memory alone, so the voter answers nothing any more
        ml._on_frame(P1, [0, ["acc", 1, "r", 1, "h", 1000, "a/1"]], 0)
        ml._on_frame(P2, [0, ["prep", 3, "other"]], 0)
        await asyncio.sleep(0)
        assert sent == [] and ml.disk_error is not None
        assert ml.counters["voter_disk_error"] == 1
        assert ml.counters["voter_stopped_disk_error"] == 2
        ml.close()

    asyncio.run(main())


def test_the_own_vote_reaches_the_proposer_only_after_its_sync(
    tmp_path: Path, traced: list[Any]
) -> None:
    sent: list[tuple[str, Any]] = []
    peers = {P1: Voter(P1), P2: Voter(P2)}

    async def main() -> None:
        ml = mesh_leases.MeshLeases(daemon(tmp_path, traced, sent))
        ml.voters()
        proposer = ml._proposer
        assert proposer is not None
        receive = proposer.receive

        def traced_receive(voter: str, msg: Any, now_ms: int) -> None:
            traced.append(("proposer got", voter == SELF, msg[0]))
            receive(voter, msg, now_ms)

        proposer.receive = traced_receive  # type: ignore[method-assign]
        task = asyncio.create_task(ml.run(Acquire("r", "h", 1000), 2.0))
        while not task.done():  # the peers answer whatever reaches them
            while sent:
                peer, msg = sent.pop(0)
                ml._on_frame(peer, [1, peers[peer].receive(msg, 0)], 0)
            await asyncio.sleep(0)
        outcome = task.result()
        assert outcome.status == "ok" and outcome.token == 1
        own_accept = traced.index(("proposer got", True, "acc_r"))
        assert traced.index("sync") < own_accept
        # the frame to the other voter left before the own vote's disk work
        accept_sent = next(i for i, t in enumerate(traced) if t[:3] == ("send", P1, "acc"))
        assert accept_sent < traced.index(("write", "r"))
        ml.close()

    asyncio.run(main())


def test_closing_drops_unsynced_replies_and_later_requests_quietly(
    tmp_path: Path, traced: list[Any]
) -> None:
    sent: list[tuple[str, Any]] = []
    errors: list[dict[str, Any]] = []

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: errors.append(ctx))
        ml = mesh_leases.MeshLeases(daemon(tmp_path, traced, sent))
        ml._on_frame(P1, [0, ["acc", 1, "r", 1, "h", 1000, "a/1"]], 0)
        ml.close()  # the daemon stops before the commit ran
        ml._on_frame(P1, [0, ["prep", 2, "r"]], 0)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert sent == [] and errors == []
        assert ml.counters["voter_closed"] == 1 and ml.statistics()["disk_error"] is None

    asyncio.run(main())
