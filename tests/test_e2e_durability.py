"""Durability of a real daemon under faults: ``kill -9`` at seeded random
points while writes are in flight, and store files truncated or bit-flipped
while it is down. The rule in every case: never silent corruption. The
restarted node either refuses to start with a clear typed error (then the
operator's recovery, setting the store aside, gets everything back from a
peer), or it starts and holds every acknowledged write (recovering its own
feed from its peer where its store lost some), and its peer never sees a
fork of its feed.

One swarm of two nodes per test; every wait is a condition with a deadline.
Wall time ≈ 60-90 s on a quiet machine (marked ``e2e_slow``).
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from hivemesh.client.swarm import LocalSwarm, NodeProc, wait_until
from hivemesh.errors import HivemeshError, StoreCorrupt

SEED = 18

# The longest group-commit delay: a kill lands between appends and their commit.
ENV = {"HIVEMESH_COMMIT_DELAY_MS": "1000"}


class Writer(threading.Thread):
    """Writes ``d/<prefix><i>`` until stopped; remembers what was acknowledged."""

    def __init__(self, node: NodeProc, prefix: str, acked: dict[str, int]) -> None:
        super().__init__(daemon=True)
        self.node, self.prefix, self.acked = node, prefix, acked
        self.stop = threading.Event()
        self.errors: list[str] = []

    def run(self) -> None:
        client = self.node.client
        i = 0
        while not self.stop.is_set() and i < 5000:
            try:
                client.ctx_set("d", f"{self.prefix}{i}", i)
            except HivemeshError as exc:  # the kill: not acknowledged, fine
                self.errors.append(type(exc).__name__)
                return
            self.acked[f"{self.prefix}{i}"] = i
            i += 1


def holds_all(node: NodeProc, acked: dict[str, int]) -> bool:
    kv: dict[str, Any] = node.client.ctx_get("d").get("kv", {})
    return all(kv.get(k) == v for k, v in acked.items())


def wait_whole(node: NodeProc, peer: NodeProc, acked: dict[str, int], what: str) -> None:
    wait_until(
        lambda: node.client.status()["own_feed"]["state"] == "writable",
        30,
        what=f"{what}: own feed writable again",
    )
    wait_until(lambda: holds_all(node, acked), 20, what=f"{what}: every ack on the node")
    wait_until(lambda: holds_all(peer, acked), 20, what=f"{what}: every ack on the peer")
    assert peer.client.status()["counters"].get("fork", 0) == 0, what


@pytest.mark.e2e_slow
def test_kill_9_at_random_points_during_writes_loses_nothing_acknowledged(
    tmp_path: Path,
) -> None:
    rnd = random.Random(f"{SEED}/kill")
    acked: dict[str, int] = {}
    with LocalSwarm(tmp_path, env=ENV) as swarm:
        node = swarm.start("w")
        peer = swarm.start("p", bootstrap=[node.endpoint])
        wait_until(lambda: peer.client.status()["peers_connected"] >= 1, 15, what="link")
        for cycle in range(6):
            writers = [Writer(node, f"c{cycle}w{j}-", acked) for j in range(2)]
            for w in writers:
                w.start()
            time.sleep(rnd.uniform(0.05, 0.8))  # the fault's moment, from the seed
            swarm.kill("w")
            for w in writers:
                w.stop.set()
                w.join(10)
            assert all(not w.is_alive() for w in writers)
            node = swarm.restart("w")
            wait_whole(node, peer, acked, f"cycle {cycle}")
        assert len(acked) > 20, "the writers barely wrote: the test proved little"
        assert node.client.status()["journal"]["log_recovered"] >= 0


DAMAGE = [
    ("store.db", "truncate"),
    ("store.db", "flip"),
    ("store.db", "zero-page"),
    ("store.db", "truncate-head"),
    ("store.db-wal", "truncate"),
    ("store.db-wal", "flip"),
    ("store.db-appends", "truncate"),
    ("store.db-appends", "flip"),
    ("feed.mark", "truncate"),
    ("feed.mark", "flip"),
]


def damage(path: Path, how: str, rnd: random.Random) -> str:
    """Truncate ``path`` at a random length or flip one random bit; say what."""
    data = bytearray(path.read_bytes())
    if not data:
        return "empty: nothing to damage"
    if how.startswith("truncate"):
        cut = rnd.randrange(min(len(data), 100) if how == "truncate-head" else len(data))
        path.write_bytes(bytes(data[:cut]))
        return f"truncated {len(data)} -> {cut}"
    if how == "zero-page":
        page = rnd.randrange(max(1, len(data) // 4096)) * 4096
        data[page : page + 4096] = bytes(len(data[page : page + 4096]))
        path.write_bytes(bytes(data))
        return f"page at {page} of {len(data)} zeroed"
    i, bit = rnd.randrange(len(data)), rnd.randrange(8)
    data[i] ^= 1 << bit
    path.write_bytes(bytes(data))
    return f"bit {bit} of byte {i} of {len(data)} flipped"


def set_store_aside(node: NodeProc) -> None:
    """The operator's recovery from a refused store: keep the key and the
    mark, move the store's files away (the node then recovers its feed)."""
    aside = node.data_dir / "store-aside"
    aside.mkdir(exist_ok=True)
    for f in node.data_dir.glob("store.db*"):
        f.rename(aside / f"{f.name}.{time.monotonic_ns()}")


@pytest.mark.e2e_slow
def test_damaged_store_files_are_refused_clearly_or_recovered(tmp_path: Path) -> None:
    rnd = random.Random(f"{SEED}/damage")
    acked: dict[str, int] = {}
    outcomes: list[str] = []
    with LocalSwarm(tmp_path, env=ENV) as swarm:
        node = swarm.start("w")
        peer = swarm.start("p", bootstrap=[node.endpoint])
        wait_until(lambda: peer.client.status()["peers_connected"] >= 1, 15, what="link")
        for n, (name, how) in enumerate(DAMAGE):
            for i in range(15):
                node.client.ctx_set("d", f"d{n}-{i}", i)
                acked[f"d{n}-{i}"] = i
            wait_until(lambda: holds_all(peer, acked), 20, what="the peer has the writes")
            swarm.kill("w")
            target = node.data_dir / name
            did = damage(target, how, rnd) if target.exists() else "absent"
            try:
                node = swarm.restart("w")
                outcome = "started"
            except StoreCorrupt as exc:  # a clear, typed refusal naming the file
                assert str(node.data_dir) in str(exc), exc
                outcome = f"refused ({exc.code})"
                set_store_aside(node)
                node = swarm.restart("w")
            wait_whole(node, peer, acked, f"{name} {how} ({did}), {outcome}")
            outcomes.append(f"{name} {how}: {did}: {outcome}")
        print("\n".join(outcomes))
    # both paths ran: a store that is gone is refused, a torn tail is recovered
    assert any("refused" in o for o in outcomes), outcomes
    assert any("started" in o for o in outcomes), outcomes
