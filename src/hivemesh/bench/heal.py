"""``hivemesh bench heal``: a split swarm heals; bytes sent vs the minimum.

20 simulated nodes are split in two halves. While split, each half writes
``--events`` events (spread over its nodes) and converges internally. Then
the partition heals on a perfect network and anti-entropy runs until every
replica holds every feed. The baseline is the *minimum* a perfect protocol
would send: the encoded bytes of every event each node lacked at the heal.
Time is simulated (1 s anti-entropy period); wall time is reported too.
"""

from __future__ import annotations

import argparse
import time

from hivemesh.bench import BenchResult, Metric

DESCRIPTION = "20 simulated nodes heal after a partition: time and bytes vs the minimum"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options for this benchmark."""
    parser.add_argument("--nodes", type=int, default=20)
    parser.add_argument("--events", type=int, default=10_000, help="divergent events per side")
    parser.add_argument("--batch", type=int, default=1, help="events per signed append")
    parser.add_argument("--seed", default="heal")


def run(args: argparse.Namespace) -> BenchResult:
    """Run the benchmark."""
    from hivemesh.sim.cluster import Cluster  # here: listing the benches must stay light
    from hivemesh.sim.options import FaultOptions, NetworkOptions, SimOptions

    opts = SimOptions(
        nodes=args.nodes,
        appends=0,
        sync_interval_ms=1_000,
        want_timeout_ms=3_000,
        network=NetworkOptions(packet_loss_probability=0.0, packet_replay_probability=0.0),
        faults=FaultOptions(0.0, 0.0, 0, 0),
    )
    c = Cluster(args.seed, opts)
    addrs = [n.identity.address for n in c.nodes]
    side = {a: i % 2 for i, a in enumerate(addrs)}
    c.set_partition(side)
    per_node = args.events // (args.nodes // 2)
    for i in range(args.nodes):
        left = per_node
        k = 0
        while left > 0:
            n = min(args.batch, left)
            c.append(i, [("app.note", {"i": k + j, "pad": "x" * 40}) for j in range(n)])
            k += n
            left -= n
            c.run_until(c.now + 1)
    c.run_until(c.now + 20_000)
    # Minimum bytes: every event each node lacks right now, once.
    vv_all: dict[bytes, int] = {}
    for sn in c.nodes:
        assert sn.node is not None
        for a, s in sn.node.journal.version_vector().items():
            vv_all[a] = max(vv_all.get(a, 0), s)
    sizes: dict[bytes, list[int]] = {}
    holder = {}
    for sn in c.nodes:
        for a, _seq in sn.node.journal.version_vector().items():  # type: ignore[union-attr]
            if sn.node.journal.head(a).seq == vv_all[a]:  # type: ignore[union-attr]
                holder[a] = sn
    for a, sn in holder.items():
        sizes[a] = [len(r) for r in sn.store.read_range(a, 1, vv_all[a])]
    minimum = 0
    for sn in c.nodes:
        vv = sn.node.journal.version_vector()  # type: ignore[union-attr]
        for a, top in vv_all.items():
            have = vv.get(a, 0)
            minimum += sum(sizes[a][have:top])
    bytes_before = c.stats["bytes_sent"]
    frames_before = c.stats["frames_sent"]
    heal_start = c.now
    c.set_partition(None)
    c.healing = True
    wall0 = time.perf_counter()
    c.run_until(heal_start + 600_000, stop_when_converged=True)
    wall = time.perf_counter() - wall0
    converged = c.converged()
    sent = c.stats["bytes_sent"] - bytes_before
    ratio = sent / minimum if minimum else 0.0
    heal_ms = c.now - heal_start
    return BenchResult(
        "heal",
        [
            Metric(
                "bytes sent during heal",
                float(sent),
                float(minimum),
                "bytes",
                "minimum",
                higher_is_better=False,
                goal="<= 1.2x minimum",
                goal_met=converged and ratio <= 1.2,
            ),
            Metric(
                "simulated time to converge", float(heal_ms), None, "ms", higher_is_better=False
            ),
            Metric("wall time to converge", wall * 1000, None, "ms", higher_is_better=False),
        ],
        {
            "nodes": args.nodes,
            "events_per_side": per_node * (args.nodes // 2),
            "converged": converged,
            "frames_during_heal": c.stats["frames_sent"] - frames_before,
            "sync_interval_ms": opts.sync_interval_ms,
        },
    )
