"""Multi-process tests on loopback: real `hivemesh up` processes, real sockets.

One swarm per module (starting processes costs ~0.5 s each); the tests run in
order and each leaves the swarm in the state the next expects. Every wait is
a condition with a deadline; teardown kills every child.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hivemesh.client.swarm import FAST_TIMINGS, LocalSwarm, wait_until

PROBE_INTERVAL_MS = int(FAST_TIMINGS["HIVEMESH_PROBE_INTERVAL_MS"])
LABELS = ["n0", "n1", "n2", "n3", "n4"]


@pytest.fixture(scope="module")
def swarm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSwarm]:
    root: Path = tmp_path_factory.mktemp("swarm")
    with LocalSwarm(root) as s:
        yield s


def _alive_members(swarm: LocalSwarm, label: str) -> set[str]:
    members = swarm.status(label)["members"]
    return {a for a, m in members.items() if m["state"] == "up"}


def test_five_nodes_form_a_swarm_from_one_bootstrap_address(swarm: LocalSwarm) -> None:
    first = swarm.start("n0")
    for label in LABELS[1:]:
        swarm.start(label, bootstrap=[first.endpoint])
    addresses = {swarm.nodes[label].address for label in LABELS}
    for label in LABELS:
        others = addresses - {swarm.nodes[label].address}
        wait_until(
            lambda label=label, others=others: _alive_members(swarm, label) >= others,
            15,
            what=f"{label} sees the 4 others up",
        )
    # each node announced itself once; everyone holds every feed
    vv = wait_until(swarm.converged, 10, what="journals converge")
    assert set(vv) == addresses


def test_context_written_on_one_node_appears_on_all(swarm: LocalSwarm) -> None:
    swarm.nodes["n3"].client.ctx_set("default", "goal", {"text": "ship it", "n": 1})
    for label in LABELS:
        got = wait_until(
            lambda label=label: (
                swarm.nodes[label].client.ctx_get("default", "goal")["found"]
                and swarm.nodes[label].client.ctx_get("default", "goal")
            ),
            10,
            what=f"goal visible on {label}",
        )
        assert got["value"] == {"text": "ship it", "n": 1}


def test_late_joiner_gets_the_whole_journal(swarm: LocalSwarm) -> None:
    for i in range(30):
        swarm.nodes[LABELS[i % 5]].client.ctx_set("work", f"k{i}", i)
    for i in range(600):  # a journal of some size, in every node's feed
        swarm.nodes[LABELS[i % 5]].client.call("append", kind="app.note", body={"i": i})
    wait_until(swarm.converged, 15, what="journals converge before the late joiner")
    late = swarm.start("late", bootstrap=[swarm.nodes["n2"].endpoint])
    vv = wait_until(lambda: swarm.converged(), 15, what="late joiner converges")
    assert late.address in vv
    state = late.client.ctx_get("work")
    assert state["kv"] == {f"k{i}": i for i in range(30)}
    total = sum(vv.values())
    assert total > 630
    assert late.client.status()["journal"]["events"] == total


def test_kill_9_is_detected_as_down_within_the_configured_time(swarm: LocalSwarm) -> None:
    victim = "n4"
    swarm.nodes[victim].client.ctx_set("default", "before-kill", "written by n4")
    wait_until(swarm.converged, 10, what="n4's last write replicated")
    observers = [label for label in swarm.nodes if label != victim]
    # the SWIM worst case for this swarm size and the configured timings
    bound_s = max(swarm.status(label)["detection_bound_ms"] for label in observers) / 1000
    assert bound_s <= 15 * PROBE_INTERVAL_MS / 1000 * 4  # sanity: fast timings are in force
    killed_at = time.monotonic()
    swarm.kill(victim)
    for label in observers:
        wait_until(
            lambda label=label: swarm.member_state(label, victim) == "down",
            bound_s + 5,
            what=f"{label} detects {victim} down",
        )
    elapsed = time.monotonic() - killed_at
    assert elapsed < bound_s + 1.0, f"detected after {elapsed:.1f}s, bound {bound_s:.1f}s"


def test_restarted_node_catches_up_with_nothing_lost(swarm: LocalSwarm) -> None:
    victim = "n4"
    # writes continue while n4 is down
    for i in range(20):
        swarm.nodes[LABELS[i % 4]].client.ctx_set("during", f"d{i}", i)
    wait_until(
        lambda: swarm.converged([label for label in swarm.nodes if label != victim]),
        10,
        what="survivors converge",
    )
    before = swarm.status("n0")["journal"]["version_vector"]
    node = swarm.restart(victim)
    vv = wait_until(swarm.converged, 15, what="restarted node catches up")
    # nothing lost: every event the survivors held is there, and n4's own
    # feed survived kill -9 (its pre-kill write is in its store and the swarm)
    for author, seq in before.items():
        assert vv[author] >= seq
    assert node.client.ctx_get("default", "before-kill")["value"] == "written by n4"
    assert node.client.ctx_get("during")["kv"] == {f"d{i}": i for i in range(20)}
    st = node.client.status()
    assert st["journal"]["rehydrated"] >= 1
    for label in LABELS[:4]:
        wait_until(
            lambda label=label: swarm.member_state(label, victim) == "up",
            10,
            what=f"{label} sees {victim} up again",
        )


def test_clean_shutdown_on_sigterm_flushes_and_removes_socket(swarm: LocalSwarm) -> None:
    import signal

    node = swarm.nodes["late"]
    seq = node.client.ctx_set("default", "last-words", "bye")["seq"]
    swarm.kill("late", signal.SIGTERM)
    assert node.proc is not None and node.proc.returncode == 0
    assert not (node.data_dir / "ctl.sock").exists()
    swarm.restart("late")
    st = node.client.status()
    assert st["journal"]["own_seq"] == seq


def test_nodes_find_each_other_by_mdns_on_loopback(tmp_path: Path) -> None:
    """No bootstrap at all: two nodes advertise and browse on 127.0.0.1."""
    with LocalSwarm(tmp_path) as s:
        a = s.start("a", extra_args=["--mdns"])
        b = s.start("b", extra_args=["--mdns"])
        wait_until(
            lambda: s.member_state("a", "b") == "up" and s.member_state("b", "a") == "up",
            20,
            what="a and b find each other over mDNS",
        )
        a.client.ctx_set("default", "found-by", "mdns")
        wait_until(lambda: b.client.ctx_get("default", "found-by")["found"], 10, what="replication")
