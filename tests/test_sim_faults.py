"""Store and clock faults in the simulator: a crash that loses the write
cache (lost fsync, torn write), clock steps, paused processes."""

from __future__ import annotations

import random
from dataclasses import replace

from hivemesh.core.event import GENESIS, encode_event
from hivemesh.core.feed import head_message
from hivemesh.core.identity import Identity
from hivemesh.core.ownfeed import Mark, MemoryMarkStore
from hivemesh.sim.campaign import default_options, run_campaign
from hivemesh.sim.cluster import Cluster, SimNode
from hivemesh.sim.disk import DiskStore
from hivemesh.sim.options import FaultOptions, SimOptions

ME = Identity.from_seed(b"\x07" * 32)


def _batches(sizes: list[int]) -> list[tuple[list[object], bytes]]:
    out: list[tuple[list[object], bytes]] = []
    prev, seq = GENESIS, 0
    for size in sizes:
        evs = []
        for _ in range(size):
            seq += 1
            ev = encode_event(ME.public, seq, prev, seq, "app.note", {"i": seq})
            evs.append(ev)
            prev = ev.id
        out.append((evs, ME.sign(head_message(ME.public, seq, prev))))
    return out


def test_power_loss_drops_the_cache_and_keeps_what_was_synced() -> None:
    disk = DiskStore()
    (a, sa), (b, sb), (c, sc) = _batches([2, 3, 2])
    disk.append(ME.public, a, sa, durable=False)  # type: ignore[arg-type]
    disk.sync()
    disk.append(ME.public, b, sb, durable=False)  # type: ignore[arg-type]
    disk.append(ME.public, c, sc, durable=False)  # type: ignore[arg-type]
    backup = disk.copy()
    assert backup.heads()[ME.public][0] == 2  # a backup holds what is on disk only
    assert disk.power_loss(random.Random(1), torn=False) == 2
    assert disk.heads()[ME.public][0] == 2 and disk.cached == []


def test_a_torn_write_keeps_the_feed_up_to_a_signed_event() -> None:
    for seed in range(8):
        disk = DiskStore()
        (a, sa), (b, sb) = _batches([2, 4])
        disk.append(ME.public, a, sa)  # type: ignore[arg-type]
        disk.append(ME.public, b, sb, durable=False)  # type: ignore[arg-type]
        disk.power_loss(random.Random(seed), torn=True)
        seq = disk.heads()[ME.public][0]
        assert seq in disk.signed_seqs(ME.public) and seq == 2


def test_a_durable_append_syncs_the_cache_first() -> None:
    disk = DiskStore()
    (a, sa), (b, sb) = _batches([2, 1])
    disk.append(ME.public, a, sa, durable=False)  # type: ignore[arg-type]
    disk.append(ME.public, b, sb)  # type: ignore[arg-type]
    assert disk.power_loss(random.Random(0), torn=True) == 0
    assert disk.heads()[ME.public][0] == 3


FAULTY = replace(
    default_options(5),
    faults=replace(
        FaultOptions(forgeries=0),
        partition_probability=0.2,
        lost_fsync_probability=1.0,
        clock_jump_probability=0.25,
        pause_probability=0.25,
    ),
    commit_delay_ms=1_000,  # a long group commit: crashes find batches in the cache
)


def test_lost_fsyncs_clock_steps_and_pauses_converge() -> None:
    summary = run_campaign(range(1, 31), FAULTY, jobs=2)
    assert summary["violations"] == 0, summary["examples"]
    t = summary["totals"]
    # crashes that find replicated batches still in the write cache (fewer
    # than before the Peers: frames need links, and SWIM closes silent ones)
    assert t.get("lost_fsyncs", 0) + t.get("torn_writes", 0) >= 3, t
    assert t["clock_jumps"] > 5 and t["pauses"] > 5, t


class ForgetfulCluster(Cluster):
    """A broken disk: the power loss takes the node's own acknowledged
    batches too, and the own-feed mark with them (as if neither had been
    synced). The node then writes its feed again from the start: a fork."""

    def _crash(self, sn: SimNode) -> None:
        if sn.node is not None:
            sn.store.truncate(sn.identity.public, 0)
            sn.marks = MemoryMarkStore(Mark())
        super()._crash(sn)


def test_losing_acknowledged_writes_is_caught() -> None:
    opts = replace(FAULTY, faults=replace(FAULTY.faults, partition_probability=0.5))
    bad = run_campaign(range(1, 9), opts, factory=ForgetfulCluster)
    assert bad["violations"] > 0


def test_a_paused_node_takes_no_input_until_it_resumes() -> None:
    c = Cluster("3", SimOptions(nodes=3, appends=0, faults=FaultOptions(forgeries=0)))
    c.nodes[1].paused_until = 5_000
    c.append(0, [("app.note", {"x": 1})])
    c.run_until(4_900)
    me = c.nodes[0].identity.public
    head = c.nodes[0].node.journal.head(me).seq if c.nodes[0].node else 0
    held = [n.node.journal.head(me).seq if n.node else -1 for n in c.nodes]
    assert head >= 2 and held == [head, 0, head]  # the invite vouches, a hello, the note
    assert c.nodes[1].links == {}  # no handshake either
    c.run_until(5_600)
    assert c.nodes[1].node is not None and c.nodes[1].node.journal.head(me).seq == head
