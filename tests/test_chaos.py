"""The chaos runner: CI's short set on real daemons in network namespaces
(``-m chaos``, root; ≈ 20 s a scenario), and its parts that need no root.

The short set: ``kill -9`` and restart, a partition with writes on both
sides, and leases under partitions. A longer campaign is one command::

    hivemesh chaos --scenario all --runs 10 --seed 1 --json
"""

from __future__ import annotations

import importlib.util
import itertools
import sys
import time
from pathlib import Path

import pytest

from hivemesh.chaos import CI_SET, SCENARIOS, schedule
from hivemesh.chaos.workload import FencedResource
from hivemesh.netlab import unavailable_reason


def test_a_schedule_is_a_function_of_the_seed() -> None:
    for name, sc in SCENARIOS.items():
        a = schedule(sc, 7, 5, 15.0)
        assert a == schedule(sc, 7, 5, 15.0), name
        assert all(0 < f.start_s < f.end_s <= 15.0 for f in a), name
        assert all(f.kind in sc.kinds for f in a), name
    split = SCENARIOS["split-shapes"]
    shapes = {f.kind for seed in range(40) for f in schedule(split, seed, 5, 15)}
    assert shapes == {"isolate", "partition", "oneway", "bridge"}
    runs = [schedule(split, seed, 5, 15) for seed in range(40)]
    assert sum(len(r) >= 2 for r in runs) >= 30  # most runs get the faults they ask for


def test_network_faults_never_overlap_and_pauses_outlast_the_ttl() -> None:
    for seed in range(60):
        faults = schedule(SCENARIOS["mixed"], seed, 5, 20.0, ttl_ms=1500)
        net = [f for f in faults if f.kind in ("partition", "isolate", "oneway", "bridge", "loss")]
        for a, b in itertools.pairwise(net):
            assert b.start_s >= a.end_s, (seed, a, b)
        for f in faults:
            if f.kind == "pause":
                assert f.end_s - f.start_s > 1.5, (seed, f)


def test_the_fenced_resource_check_can_fail() -> None:
    res = FencedResource()
    assert res.effect("r", 3, "a") and res.effect("r", 3, "a") and res.effect("r", 5, "b")
    assert not res.effect("r", 4, "a")  # fenced off: a newer holder was there
    assert res.violations() == []
    res.accepted.append((0.0, "r", 2, "c"))  # what a broken guard would have let through
    res.accepted.append((0.0, "r", 5, "d"))
    assert len(res.violations()) == 2


@pytest.mark.chaos
@pytest.mark.parametrize("scenario", CI_SET)
def test_ci_short_set(scenario: str) -> None:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    from hivemesh.chaos import run_scenario

    report = run_scenario(scenario, seed=1, nodes=3, duration_s=12.0)
    text = report.render()
    assert report.verdict == "pass", text
    assert report.faults, text  # the seed injected something
    assert any(e.startswith("start ") for _, e in report.timeline), text
    assert report.stats["acked_writes"] > 50, text
    assert report.stats["lease_calls"] > 10, text


PROBE = (
    "import socket, sys, time\n"
    "s = socket.create_connection((sys.argv[1], 7000), timeout=10)\n"
    "t = time.monotonic()\n"
    "for _ in range(10):\n"
    "    s.sendall(b'x'); s.recv(1)\n"
    "print((time.monotonic() - t) * 100)\n"
)
ECHO = (
    "import socket\n"
    "l = socket.create_server(('0.0.0.0', 7000)); c, _ = l.accept()\n"
    "while (d := c.recv(1)):\n"
    "    c.sendall(d)\n"
)


@pytest.mark.chaos
def test_the_delay_fault_delays_what_a_host_receives(tmp_path: Path) -> None:
    """NFQUEUE in user space (no netem here): 100 ms (+ up to 50) on every
    packet into b; a round trip from a takes that long, and is quick again
    once the fault is removed."""
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    if importlib.util.find_spec("netfilterqueue") is None:
        pytest.skip("the netfilterqueue package is not installed (extra: chaos)")
    from hivemesh.chaos.hosts import ChaosCluster

    with ChaosCluster(tmp_path, 2) as cluster:
        a, b = cluster.nodes

        def round_trip_ms() -> float:
            server = b.host.popen([sys.executable, "-c", ECHO])
            try:
                deadline = time.monotonic() + 10
                while True:  # the server listens once the port answers
                    out = a.host.run([sys.executable, "-c", PROBE, b.host.ip], check=False)
                    if out.returncode == 0 or time.monotonic() > deadline:
                        break
                    server.kill()
                    server.wait(5)
                    server = b.host.popen([sys.executable, "-c", ECHO])
                assert out.returncode == 0, out.stderr
                return float(out.stdout)
            finally:
                server.kill()
                server.wait(5)

        assert round_trip_ms() < 50
        cluster.delay(b, 100, 50, seed=1)
        assert 100 <= round_trip_ms() < 400
        cluster.undelay(b)
        assert round_trip_ms() < 50
