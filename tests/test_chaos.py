"""The chaos runner: CI's short set on real daemons in network namespaces
(``-m chaos``, root; 20-60 s a scenario), and its parts that need no root.

The short set: ``kill -9`` and restart, a partition with writes on both
sides, leases under partitions, broker mode on a NATS server in the lab,
nodes behind NATs over QUIC (relay, punching) and the price audit under
faults. A longer campaign is one command::

    hivemesh chaos --scenario all --runs 10 --seed 1 --json
"""

from __future__ import annotations

import importlib.util
import itertools
import shutil
import sys
import time
from pathlib import Path
from typing import Any

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


#: (seed, nodes, duration) per scenario of the short set: the new modes'
#: seeds pick the faults that matter there (broker: the NATS server killed,
#: a node killed, a node cut from NATS; nat: a partition across the NATs and
#: a NAT's mappings flushed, 4 nodes so two of them punch; audit: the
#: supervisor killed and restarted, then paused, and the reflector
#: partitioned off while the 50-shop audit runs).
CI_RUNS = {
    "kill-restart": (1, 3, 12.0),
    "partition-writes": (1, 3, 12.0),
    "lease-partition": (1, 3, 12.0),
    "broker": (1, 3, 12.0),
    "nat": (5, 4, 12.0),
    "audit": (4, 6, 15.0),
}


@pytest.mark.chaos
@pytest.mark.parametrize("scenario", CI_SET)
def test_ci_short_set(scenario: str) -> None:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    if scenario == "nat":
        pytest.importorskip("aioquic", reason="aioquic is not installed")
    if scenario == "broker" and shutil.which("nats-server") is None:
        pytest.skip("nats-server is not installed")
    from hivemesh.chaos import run_scenario

    seed, nodes, duration = CI_RUNS[scenario]
    report = run_scenario(scenario, seed=seed, nodes=nodes, duration_s=duration)
    text = report.render()
    assert report.verdict == "pass", text
    assert report.faults, text  # the seed injected something
    assert any(e.startswith("start ") for _, e in report.timeline), text
    assert report.stats["acked_writes"] > 50, text
    assert report.stats["lease_calls"] > 10, text
    names = {c.name for c in report.checks}
    if scenario == "audit":
        assert {"audit_done", "audit_shops", "audit_results", "audit_prices"} <= names, text
        assert report.stats["audit_done"] + report.stats["audit_skipped"] == 50, text
    if scenario == "broker":
        assert any("nats-server restarted" in e for _, e in report.timeline), text
    if scenario == "nat":  # every node links to every other again: relayed, punched or direct
        assert "links" in names, text
        paths = report.stats["paths"]
        assert any(v.startswith("relayed") for p in paths.values() for v in p.values()), paths


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
        pytest.fail("netfilterqueue is not installed (scripts/services.d/chaos.sh builds it)")
    if shutil.which("iptables") is None:
        pytest.fail("iptables is not installed (scripts/services.d/chaos.sh installs it)")
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


def test_the_new_modes_schedule_their_own_faults() -> None:
    """broker: the NATS server killed, a node cut from it, kills; nat:
    partitions, NAT mappings flushed (only nodes behind a NAT: n1..), kills;
    audit: at least 6 nodes (collector, observer, reflector, supervisor, 2
    executors)."""
    broker = {f.kind for seed in range(30) for f in schedule(SCENARIOS["broker"], seed, 3, 12)}
    assert broker == {"natskill", "natscut", "kill"}
    nat = [f for seed in range(30) for f in schedule(SCENARIOS["nat"], seed, 4, 12)]
    assert {f.kind for f in nat} == {"partition", "isolate", "conntrack", "kill"}
    assert all(0 not in f.targets and f.targets for f in nat if f.kind == "conntrack")
    assert SCENARIOS["audit"].mode == "audit" and SCENARIOS["audit"].min_nodes == 6
    assert {"audit", "broker", "nat"} <= set(CI_SET)


def _audit_doc() -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    """A finished two-shop audit that passes every check: s1 done by a
    after a takeover from b, s2 escalated and skipped."""
    truth = {
        "shops": {
            "s1": {"currency": "EUR", "products": [{"sku": "k1", "price": "1.00"}]},
            "s2": {"currency": "EUR", "products": [{"sku": "k2", "price": "2.00"}]},
        }
    }
    doc: dict[str, Any] = {
        "audit": "a1",
        "finished_hlc": 99,
        "shops": [{"id": "s1", "url": "u1"}, {"id": "s2", "url": "u2"}],
        "done": {
            "s1": {
                "token": 5,
                "agent": "A",
                "hlc": 9,
                "attempts": 1,
                "products": [{"sku": "k1", "price": "1.00", "currency": "EUR"}],
            },
        },
        "skipped": ["s2"],
        "questions": [{"id": "q1", "shop": "s2", "answer": "skip"}],
        "takeovers": [{"shop": "s1", "token": 5, "by": "A"}],
        "tool_calls": [
            {"shop": "s1", "page": 1, "tool": "web.fetch_page", "token": 4, "author": "B"},
            {"shop": "s1", "page": 1, "tool": "web.fetch_page", "token": 5, "author": "A"},
        ],
        "tool_results": [
            {
                "shop": "s1",
                "page": 1,
                "tool": "web.fetch_page",
                "token": 5,
                "outcome": "ok",
                "error": None,
                "author": "A",
                "acknowledged": True,
                "products": 1,
            },
        ],
        "corrections": [],
    }
    market = [
        {"shop": "s1", "writer": "B", "token": 4, "accepted": True},
        {"shop": "s1", "writer": "A", "token": 5, "accepted": True},
    ]
    return doc, truth, market


def test_the_audit_checks_pass_a_good_audit_and_each_can_fail() -> None:
    import copy

    from hivemesh.chaos.audit import judge_audit

    doc, truth, market = _audit_doc()

    def failed(d: dict[str, Any], *, seen: list[str] | None = None, m: Any = market,
               other: dict[str, Any] | None = None) -> set[str]:  # fmt: skip
        docs = {"n1": d, "n2": other if other is not None else d}
        checks, _ = judge_audit(docs, 2, ["a1"] if seen is None else seen, truth, m)
        return {name for name, ok, _ in checks if not ok}

    assert failed(doc) == set()
    bad = copy.deepcopy(doc)
    bad["finished_hlc"] = None
    assert "audit_done" in failed(bad)
    assert failed(doc, seen=["a1", "a2"]) == {"audit_done"}  # a second audit was started
    bad = copy.deepcopy(doc)
    bad["skipped"] = []  # s2 neither audited nor skipped
    assert "audit_shops" in failed(bad)
    bad = copy.deepcopy(doc)
    bad["tool_calls"].append({**bad["tool_calls"][1], "author": "C"})  # one token, two holders
    assert failed(bad) == {"audit_results"}
    bad = copy.deepcopy(doc)
    bad["tool_results"].append(dict(bad["tool_results"][0]))  # fetched twice under one token
    assert "audit_results" in failed(bad)
    assert failed(doc, m=[*market, {"shop": "s1", "writer": "B", "token": 4,
                                    "accepted": True}]) == {"audit_results"}  # fmt: skip
    assert failed(doc, m=market[:1]) == {"audit_results"}  # done under a token never taken
    assert failed(doc, m=None) == {"audit_results"}
    bad = copy.deepcopy(doc)
    bad["done"]["s1"]["products"][0]["price"] = "1.01"
    assert "audit_prices" in failed(bad)
    other = copy.deepcopy(doc)
    other["questions"][0]["answer"] = None
    assert failed(doc, other=other) == {"audit_views"}
