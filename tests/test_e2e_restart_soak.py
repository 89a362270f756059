"""Restart soak: ``kill -9`` and restart real daemons, many times, on loopback.

Four ``hivemesh up`` processes. Each cycle kills one or two of them with
SIGKILL (no goodbye, no CLOSE) and restarts them at once on the same data
dir and port, booting in parallel, so the restarted nodes dial every peer
they know (each other included) while the survivors redial them: the
simultaneous dials of :mod:`hivemesh.runtime.connections`. After every cycle, with deadlines:

* every node sees every other node ``up`` (SWIM),
* every pair holds *one* channel, the same at both ends (equal channel ids,
  i.e. handshake hashes, and complementary directions),
* that channel is usable: a direct ping succeeds in both directions,
* no flaps: a restarted node never reported a live peer down (the old
  simultaneous-dial race did exactly that, right after boot), and a survivor
  reported each victim down exactly once;
* no node's connection manager gave up on a handover or crashed a reader.

Bounded: 5 cycles; each heal must happen within 10 s (it takes well under a
second; the run time, 10-30 s, is almost all process start-up).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hivemesh.client.swarm import LocalSwarm, wait_until
from hivemesh.errors import HivemeshError

LABELS = ["s0", "s1", "s2", "s3"]
CYCLES = 5


@pytest.fixture
def swarm(tmp_path: Path) -> Iterator[LocalSwarm]:
    with LocalSwarm(tmp_path) as s:
        yield s


def _peers(swarm: LocalSwarm, label: str) -> dict[str, dict[str, Any]]:
    got = swarm.nodes[label].client.call("peers")
    rows = got["peers"] if isinstance(got, dict) else got
    return {row["address"]: row for row in rows}


def _mesh_problems(swarm: LocalSwarm) -> list[str]:
    """What keeps the swarm from being fully meshed right now (empty: nothing)."""
    views = {label: _peers(swarm, label) for label in LABELS}
    problems = []
    for a in LABELS:
        for b in LABELS:
            if a == b:
                continue
            row = views[a].get(swarm.nodes[b].address)
            if row is None or row["state"] != "up":
                problems.append(f"{a} sees {b} {row and row['state']}")
                continue
            ch, back = row["channel"], views[b].get(swarm.nodes[a].address, {}).get("channel")
            if ch is None or back is None:
                problems.append(f"{a}-{b}: no channel at one end")
            elif ch["channel_id"] != back["channel_id"] or ch["direction"] == back["direction"]:
                problems.append(f"{a}-{b}: the ends hold different channels")
    return problems


def _meshed(swarm: LocalSwarm) -> bool:
    try:
        return not _mesh_problems(swarm)
    except HivemeshError:
        return False  # a node's control socket is not up yet


def _wait_meshed(swarm: LocalSwarm, what: str) -> None:
    try:
        wait_until(lambda: _meshed(swarm), 10, what=what, interval_s=0.05)
    except HivemeshError:
        raise AssertionError(f"{what}: {_mesh_problems(swarm)}") from None


def _down_reports(swarm: LocalSwarm, label: str) -> int:
    counters = swarm.status(label)["counters"]
    return int(counters.get("peer_down_reports", 0))


def _ping_all(swarm: LocalSwarm) -> None:
    for a in LABELS:
        for b in LABELS:
            if a != b:
                got = swarm.nodes[a].client.call(
                    "ping", address=swarm.nodes[b].address, timeout_s=3.0
                )
                assert got["rtt_ms"] >= 0


def test_kill_9_and_restart_cycles_leave_every_pair_with_one_usable_channel(
    swarm: LocalSwarm,
) -> None:
    rng = random.Random(20260401)
    first = swarm.start("s0")
    swarm.start_many(LABELS[1:], bootstrap=[first.endpoint])
    _wait_meshed(swarm, "the swarm meshes")
    _ping_all(swarm)
    for cycle in range(CYCLES):
        victims = rng.sample(LABELS, rng.choice([1, 2]))
        before = {label: _down_reports(swarm, label) for label in LABELS}
        for label in victims:
            swarm.kill(label)  # SIGKILL: the peers see EOF, nothing else
        swarm.restart_many(victims)  # booting together: they dial each other too
        what = f"cycle {cycle} ({'+'.join(victims)})"
        _wait_meshed(swarm, f"{what} meshes again")
        _ping_all(swarm)
        for label in LABELS:
            downs = _down_reports(swarm, label)
            if label in victims:  # a fresh process: it never lost a link
                assert downs == 0, f"{what}: restarted {label} reported {downs} peers down"
            else:
                assert downs - before[label] == len(victims), f"{what}: {label} flapped"
    for label in LABELS:
        counters = swarm.status(label)["counters"]
        assert counters.get("handover_expired", 0) == 0, (label, counters)
        assert counters.get("reader_crashed", 0) == 0, (label, counters)
        assert counters.get("on_peer_crashed", 0) == 0, (label, counters)
