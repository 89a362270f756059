"""Scenarios: which faults a run injects, and when, decided by its seed.

A scenario turns ``(seed, nodes, duration)`` into a :class:`Fault` list: each
fault has a start, an end (when it is undone: restart, ``SIGCONT``, heal,
ballast removed) and its targets. The schedule is a pure function of the
seed (``random.Random(f"{seed}/{scenario}")``), so a run is replayed by its
seed; what the processes do under it is not deterministic (real sockets,
real clocks), which is the point of running them.

Network faults never overlap each other (each ends with a heal of every
rule); process faults never hit a node that is already down or paused.

A scenario's ``mode`` says what the cluster is (:mod:`hivemesh.chaos.runner`):
``p2p`` daemons on one segment; ``audit`` the price audit's roles on them
(collector, observer, reflector, supervisor, executors) with the fixture
world in a host of its own; ``broker`` daemons in broker mode on a NATS
server (JetStream) in a host of its own; ``nat`` daemons behind NAT routers
reaching each other over QUIC through a relay or a punched hole.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["CI_SET", "SCENARIOS", "Fault", "Scenario", "schedule"]

NETWORK = (
    "partition",
    "isolate",
    "oneway",
    "bridge",
    "loss",
    "delay",
    "natskill",
    "natscut",
    "conntrack",
)
PROCESS = ("kill", "pause", "clock", "diskfull", "restore")


@dataclass(frozen=True)
class Fault:
    """One fault: ``kind`` on ``targets`` (node indexes) from ``start_s`` to ``end_s``.

    ``groups`` are partition sides (node indexes); ``value`` is the loss
    percent or the clock offset in seconds."""

    kind: str
    start_s: float
    end_s: float
    targets: tuple[int, ...] = ()
    groups: tuple[tuple[int, ...], ...] = ()
    value: float = 0.0

    def describe(self) -> str:
        """One line for the timeline."""
        what = {
            "kill": "kill -9, restart at end",
            "pause": "SIGSTOP, SIGCONT at end",
            "clock": f"restart under faketime {self.value:+.1f} s (kept)",
            "diskfull": "disk filled, freed at end",
            "restore": "kill -9 + store copied; at end kill -9, older copy restored, restart",
            "partition": "partition, heal at end",
            "isolate": "isolated, heal at end",
            "oneway": "one-way cut (first no longer reaches second), heal at end",
            "bridge": "partition with a bridge node in both halves, heal at end",
            "loss": f"{self.value:.0f}% packet loss in, heal at end",
            "delay": f"packets in delayed {self.value:.0f} ms + up to as much jitter "
            "(reordered; NFQUEUE), removed at end",
            "natskill": "nats-server kill -9, restarted (same store) at end",
            "natscut": "cut from the NATS server both ways, reconnected at end",
            "conntrack": "its NAT router forgets every mapping (conntrack -F), again at end",
        }[self.kind]
        nodes = ",".join(f"n{i}" for i in self.targets)
        sides = " | ".join(",".join(f"n{i}" for i in g) for g in self.groups)
        on = f" [{sides}]" if sides else f" {nodes}" if nodes else ""
        return f"{self.kind}{on}: {what} ({self.start_s:.1f}s-{self.end_s:.1f}s)"


@dataclass(frozen=True)
class Scenario:
    """A named mix of fault kinds."""

    name: str
    description: str
    kinds: tuple[str, ...]
    #: faults per run (from, to)
    count: tuple[int, int] = (1, 3)
    #: nodes that get a small disk (index -> yes) when the scenario may fill one
    small_disk: bool = False
    #: what the cluster is: ``p2p``, ``audit``, ``broker`` or ``nat`` (module docs)
    mode: str = "p2p"
    #: the fewest nodes it runs with (fewer asked for: this many)
    min_nodes: int = 3


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("kill-restart", "kill -9 of nodes during writes, then restart", ("kill",), (1, 3)),
        Scenario(
            "partition-writes",
            "a partition (minority or halves) with writes on both sides, then heal",
            ("partition",),
            (1, 2),
        ),
        Scenario(
            "lease-partition",
            "lease holders and voters split by partitions and isolation",
            ("partition", "isolate"),
            (1, 2),
        ),
        Scenario("pause", "SIGSTOP longer than the lease TTL, then SIGCONT", ("pause",), (1, 3)),
        Scenario(
            "split-shapes",
            "isolated node, minority, one-way cuts and a bridge node",
            ("isolate", "partition", "oneway", "bridge"),
            (2, 3),
        ),
        Scenario("loss", "packet loss (nftables numgen random) on some hosts", ("loss",), (1, 2)),
        Scenario(
            "delay",
            "packets delayed and reordered in user space (NFQUEUE) on some hosts",
            ("delay", "loss"),
            (1, 2),
        ),
        Scenario(
            "clock",
            "clock offsets through libfaketime (restart under faketime)",
            ("clock",),
            (1, 2),
        ),
        Scenario(
            "disk-full",
            "a full disk for one node, then room again",
            ("diskfull",),
            (1, 1),
            small_disk=True,
        ),
        Scenario(
            "restore-old",
            "a restart from a store restored from an older copy",
            ("restore",),
            (1, 1),
        ),
        Scenario(
            "mixed",
            "any of the above, overlapping where they can",
            (
                "kill",
                "pause",
                "partition",
                "isolate",
                "oneway",
                "bridge",
                "loss",
                "clock",
                "diskfull",
                "restore",
            ),
            (2, 4),
            small_disk=True,
        ),
        Scenario(
            "audit",
            "the price audit (collector, observer, reflector, supervisor, executors, the "
            "fixture shops in a host of their own) under kills, pauses and partitions",
            ("kill", "pause", "partition", "isolate"),
            (2, 3),
            mode="audit",
            min_nodes=6,
        ),
        Scenario(
            "broker",
            "broker mode (--mesh nats://) on a NATS server in the lab: the server killed "
            "and restarted, a node cut from it and reconnected, nodes killed",
            ("natskill", "natscut", "kill"),
            (2, 3),
            mode="broker",
        ),
        Scenario(
            "nat",
            "nodes behind NAT routers (MASQUERADE and fully-random) over QUIC through a "
            "relay or a punched hole: partitions, NAT mappings flushed, kills",
            ("partition", "isolate", "conntrack", "kill"),
            (2, 3),
            mode="nat",
        ),
    )
}

#: The short set CI runs (pytest -m chaos).
CI_SET = ("kill-restart", "partition-writes", "lease-partition", "audit", "broker", "nat")


def _groups(rnd: random.Random, n: int, kind: str) -> tuple[tuple[int, ...], ...]:
    order = list(range(n))
    rnd.shuffle(order)
    if kind == "bridge" and n >= 3:
        bridge, rest = order[0], order[1:]
        cut = max(1, len(rest) // 2)
        del bridge  # in neither group: it reaches both halves
        return (tuple(sorted(rest[:cut])), tuple(sorted(rest[cut:])))
    cut = rnd.randint(1, n // 2) if n >= 2 else 1
    return (tuple(sorted(order[:cut])), tuple(sorted(order[cut:])))


def schedule(
    scenario: Scenario, seed: int, n: int, duration_s: float, *, ttl_ms: int = 1500
) -> list[Fault]:
    """The faults of one run (module docs)."""
    rnd = random.Random(f"{seed}/{scenario.name}")
    window = (min(2.0, duration_s / 4), max(duration_s - 2.0, duration_s * 0.8))
    faults: list[Fault] = []
    net_free_at = window[0]
    node_free_at = dict.fromkeys(range(n), window[0])
    makers: dict[str, Callable[[float], Fault | None]] = {}

    def span(lo: float, hi: float) -> tuple[float, float] | None:
        # early in what is left, so that later faults still find room
        start = rnd.uniform(lo, max(lo, lo + (window[1] - 1.0 - lo) * 0.4))
        length = rnd.uniform(1.5, 5.0)
        end = min(start + length, window[1])
        return (start, end) if end > start + 0.5 else None

    def network(kind: str) -> Callable[[float], Fault | None]:
        def make(_: float) -> Fault | None:
            nonlocal net_free_at
            got = span(net_free_at, window[1])
            if got is None:
                return None
            start, end = got
            net_free_at = end + 0.5
            if kind in ("partition", "bridge"):
                return Fault(kind, start, end, groups=_groups(rnd, n, kind))
            if kind == "isolate":
                return Fault(kind, start, end, targets=(rnd.randrange(n),))
            if kind == "natskill":
                return Fault(kind, start, end)
            if kind == "natscut":
                return Fault(kind, start, end, targets=(rnd.randrange(n),))
            if kind == "conntrack":  # nodes behind a NAT: n1.. (topology "nat")
                picks = rnd.sample(range(1, n), rnd.randint(1, max(1, (n - 1) // 2)))
                return Fault(kind, start, end, targets=tuple(sorted(picks)))
            if kind == "oneway":
                a, b = rnd.sample(range(n), 2)
                return Fault(kind, start, end, targets=(a, b))
            hosts = tuple(sorted(rnd.sample(range(n), rnd.randint(1, max(1, n // 2)))))
            if kind == "delay":
                return Fault("delay", start, end, targets=hosts, value=rnd.choice((20, 50, 100)))
            return Fault("loss", start, end, targets=hosts, value=rnd.choice((10, 20, 30, 50)))

        return make

    def process(kind: str) -> Callable[[float], Fault | None]:
        def make(_: float) -> Fault | None:
            candidates = [i for i in range(n) if kind != "diskfull" or i == n - 1]
            node = rnd.choice(candidates)
            got = span(node_free_at[node], window[1])
            if got is None:
                return None
            start, end = got
            if kind == "pause":  # longer than the lease TTL, always
                end = start + rnd.uniform(1.5, 3.0) * ttl_ms / 1000
                if end > window[1]:
                    return None
            node_free_at[node] = end + 1.0
            value = rnd.choice((-3.0, -1.5, -0.5, 0.5, 1.5, 3.0)) if kind == "clock" else 0.0
            return Fault(kind, start, end, targets=(node,), value=value)

        return make

    for kind in NETWORK:
        makers[kind] = network(kind)
    for kind in PROCESS:
        makers[kind] = process(kind)
    for _ in range(rnd.randint(*scenario.count)):
        kind = rnd.choice(scenario.kinds)
        fault = makers[kind](0.0)
        if fault is not None:
            faults.append(fault)
    return sorted(faults, key=lambda f: f.start_s)
