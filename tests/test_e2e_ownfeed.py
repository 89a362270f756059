"""A node never forks its own feed, and acknowledged means durable -- with
real ``hivemesh up`` processes on loopback.

A node's store is deleted, restored from an older copy, or its append log
is damaged, with and without a peer in reach. The node must not write until
it holds its whole feed again (recovered from peers), must say why (a typed
error, ``status``, the log, the CLI's exit code), and an operator can accept
a loss that no peer can repair. Nothing acknowledged may be lost, and no
peer may ever count a fork.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hivemesh.client.swarm import LocalSwarm, NodeProc, wait_until
from hivemesh.errors import HivemeshError
from hivemesh.stores.appendlog import read_records

STORE_FILES = ("store.db", "store.db-wal", "store.db-shm", "store.db-appends")


def store_files(node: NodeProc) -> list[Path]:
    return [node.data_dir / name for name in STORE_FILES if (node.data_dir / name).exists()]


def delete_store(node: NodeProc) -> None:
    for path in store_files(node):
        path.unlink()


def back_up(node: NodeProc, to: Path) -> None:
    to.mkdir()
    for path in store_files(node):
        shutil.copy2(path, to / path.name)


def restore(node: NodeProc, backup: Path) -> None:
    delete_store(node)
    for path in backup.iterdir():
        shutil.copy2(path, node.data_dir / path.name)


def own_feed(node: NodeProc) -> dict[str, object]:
    st = node.client.status()
    own: dict[str, object] = st["own_feed"]
    return own


def write(node: NodeProc, keys: range, acknowledged: dict[str, int], ctx: str = "d") -> None:
    for i in keys:
        node.client.ctx_set(ctx, f"k{i}", i)
        acknowledged[f"k{i}"] = i


def write_when_writable(node: NodeProc, keys: range, acknowledged: dict[str, int]) -> None:
    """:func:`write`, the first key retried while the node refuses writes."""
    first = keys[0]
    wait_until(lambda: node.client.ctx_set("d", f"k{first}", first), 15, what="a write accepted")
    acknowledged[f"k{first}"] = first
    write(node, keys[1:], acknowledged)


def refused(node: NodeProc, why: str) -> None:
    """A write is refused with the typed error saying ``why``."""
    with pytest.raises(HivemeshError) as exc:
        node.client.ctx_set("d", "refused", 1)
    assert exc.value.code == "feed_recovering" and why in str(exc.value)


def holds_all(node: NodeProc, acknowledged: dict[str, int], ctx: str = "d") -> bool:
    kv = node.client.ctx_get(ctx).get("kv", {})
    return all(kv.get(k) == v for k, v in acknowledged.items())


def cli(node: NodeProc, *args: str) -> subprocess.CompletedProcess[str]:
    src = str(Path(__file__).resolve().parents[1] / "src")
    return subprocess.run(
        [sys.executable, "-m", "hivemesh", *args, "--data-dir", str(node.data_dir)],
        env={**os.environ, "PYTHONPATH": src},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def no_forks(*nodes: NodeProc) -> None:
    for n in nodes:
        counters = n.client.status()["counters"]
        assert counters.get("fork", 0) == 0, (n.label, counters)
        assert counters.get("own_feed_conflict", 0) == 0, (n.label, counters)


def converged_on(swarm: LocalSwarm, node: NodeProc, peer: NodeProc) -> None:
    own = node.client.status()["journal"]["own_seq"]
    wait_until(
        lambda: peer.client.status()["journal"]["version_vector"].get(node.address) == own,
        15,
        what=f"{peer.label} holds {node.label}'s feed up to #{own}",
    )


def pair(swarm: LocalSwarm) -> tuple[NodeProc, NodeProc]:
    """n0, and n1 bootstrapped from it."""
    n0 = swarm.start("n0")
    return n0, swarm.start("n1", bootstrap=[n0.endpoint])


@pytest.mark.parametrize("peer_reachable", [True, False])
def test_a_node_whose_store_was_deleted_recovers_from_its_peer_before_it_writes(
    tmp_path: Path, peer_reachable: bool
) -> None:
    acknowledged: dict[str, int] = {}
    with LocalSwarm(tmp_path) as swarm:
        n0, n1 = pair(swarm)
        write(n0, range(20), acknowledged)
        converged_on(swarm, n0, n1)
        before = n0.client.status()["journal"]["own_seq"]
        if not peer_reachable:
            swarm.kill("n1", signal.SIGTERM)
        swarm.kill("n0")
        delete_store(n0)
        n0 = swarm.restart("n0")
        if not peer_reachable:
            refused(n0, "own feed behind its mark: the store holds #0")  # today: accepted
            swarm.restart("n1")
        write_when_writable(n0, range(20, 30), acknowledged)  # today: a fork; n1 drops them
        wait_until(lambda: holds_all(n1, acknowledged), 15, what="n1 holds every write")
        no_forks(n0, n1)
        assert holds_all(n0, acknowledged)
        assert n0.client.status()["journal"]["own_seq"] > before
        assert own_feed(n0)["state"] == "writable"
        converged_on(swarm, n0, n1)


def backed_up_then_wrote(
    swarm: LocalSwarm, backup: Path, acknowledged: dict[str, int]
) -> tuple[NodeProc, NodeProc]:
    """n0 writes k0..k4, its store is backed up (after a clean stop), then it
    writes k5..k14; n1 holds them all."""
    n0, n1 = pair(swarm)
    write(n0, range(5), acknowledged)
    swarm.kill("n0", signal.SIGTERM)
    back_up(n0, backup)
    n0 = swarm.restart("n0")
    write(n0, range(5, 15), acknowledged)
    converged_on(swarm, n0, n1)
    return n0, n1


def test_a_store_restored_from_an_older_copy_with_its_peer_in_reach_recovers_at_once(
    tmp_path: Path,
) -> None:
    acknowledged: dict[str, int] = {}
    with LocalSwarm(tmp_path) as swarm:
        n0, n1 = backed_up_then_wrote(swarm, tmp_path / "backup", acknowledged)
        swarm.kill("n0", signal.SIGTERM)
        restore(n0, tmp_path / "backup")
        n0 = swarm.restart("n0")
        write_when_writable(n0, range(15, 20), acknowledged)  # today: a fork; n1 drops them
        wait_until(lambda: holds_all(n1, acknowledged), 15, what="n1 holds every write")
        assert holds_all(n0, acknowledged)
        no_forks(n0, n1)


def test_a_store_restored_from_an_older_copy_waits_for_its_peer_then_writes(
    tmp_path: Path,
) -> None:
    acknowledged: dict[str, int] = {}
    with LocalSwarm(tmp_path) as swarm:
        n0, n1 = backed_up_then_wrote(swarm, tmp_path / "backup", acknowledged)
        swarm.kill("n1", signal.SIGTERM)  # the peer is out of reach ...
        swarm.kill("n0", signal.SIGTERM)
        restore(n0, tmp_path / "backup")  # ... when the operator restores the backup
        n0 = swarm.restart("n0")
        refused(n0, "own feed behind its mark")  # today: accepted, and n1 sees a fork
        own = own_feed(n0)
        assert (
            own["state"] == "recovering" and own["target"] and "accept-loss" in str(own["reason"])
        )
        done = cli(n0, "ctx", "set", "refused", "2")
        assert done.returncode == 4 and "own feed behind its mark" in done.stderr
        shown = cli(n0, "status")
        assert shown.returncode == 0 and "RECOVERING: writes refused" in shown.stdout
        assert (
            "refuses writes: own feed behind its mark" in (n0.data_dir / "daemon.log").read_text()
        )
        swarm.restart("n1")  # the peer is back: the node recovers, then writes
        write_when_writable(n0, range(15, 20), acknowledged)
        wait_until(lambda: holds_all(n1, acknowledged), 15, what="n1 holds every write")
        assert holds_all(n0, acknowledged)
        assert "refused" not in n1.client.ctx_get("d")["kv"]
        no_forks(n0, n1)


def test_a_loss_no_peer_can_repair_needs_the_operator_and_is_loud(tmp_path: Path) -> None:
    acknowledged: dict[str, int] = {}
    with LocalSwarm(tmp_path) as swarm:
        n0 = swarm.start("n0")
        write(n0, range(5), acknowledged)
        swarm.kill("n0", signal.SIGTERM)
        back_up(n0, tmp_path / "backup")
        n0 = swarm.restart("n0")
        write(n0, range(5, 10), {})  # only n0 ever held these
        swarm.kill("n0", signal.SIGTERM)
        restore(n0, tmp_path / "backup")
        n0 = swarm.restart("n0")
        refused(n0, "own feed behind its mark")
        unconfirmed = cli(n0, "feed", "accept-loss")  # without --yes: nothing happens
        assert unconfirmed.returncode == 2 and own_feed(n0)["state"] == "recovering"  # bad input
        done = cli(n0, "feed", "accept-loss", "--yes")
        assert done.returncode == 0 and "accepted the loss of own feed" in done.stdout
        own = own_feed(n0)
        assert own["state"] == "writable" and own["accepted_loss"]
        assert "OPERATOR ACCEPTED THE LOSS" in (n0.data_dir / "daemon.log").read_text()
        write(n0, range(10, 15), acknowledged)
        n1 = swarm.start("n1", bootstrap=[n0.endpoint])
        wait_until(lambda: holds_all(n1, acknowledged), 15, what="n1 holds the new writes")
        no_forks(n0, n1)


@pytest.mark.parametrize("peer_has_them", [True, False])
def test_an_append_log_damaged_while_no_peer_is_reachable_loses_no_acknowledged_write(
    tmp_path: Path, peer_has_them: bool
) -> None:
    """A burst of writes sits in the append log (the longest group-commit
    delay); the node is killed, the log damaged and the node restarted with
    no peer in reach. It must refuse writes (today: it writes on with the
    burst gone, only ``log_torn_bytes`` to show). With a peer that got the
    burst it recovers it once the peer is back; else the operator decides."""
    acknowledged: dict[str, int] = {}
    env = {"HIVEMESH_COMMIT_DELAY_MS": "1000"}
    with LocalSwarm(tmp_path, env=env) as swarm:
        n0, n1 = pair(swarm)
        write(n0, range(5), acknowledged)
        converged_on(swarm, n0, n1)
        if not peer_has_them:
            swarm.kill("n1", signal.SIGTERM)
        burst = range(5, 10)
        for _attempt in range(5):  # the burst must be in the log when the kill lands
            write(n0, burst, acknowledged)
            if peer_has_them:
                wait_until(lambda: holds_all(n1, acknowledged), 10, what="n1 holds the burst")
            swarm.kill("n0")  # SIGKILL: the log is not committed
            if read_records(log_bytes(n0)).records:
                break
            n0 = swarm.restart("n0")  # the commit landed first: once more
        else:
            pytest.fail("five bursts were all committed before the kill")
        log = n0.data_dir / "store.db-appends"
        data = bytearray(log.read_bytes())
        data[20] ^= 0xFF  # damage the first record: it and all after it are torn off
        log.write_bytes(bytes(data))
        if peer_has_them:
            swarm.kill("n1", signal.SIGTERM)
        n0 = swarm.restart("n0")
        refused(n0, "own feed behind its mark")
        st = n0.client.status()
        assert st["journal"]["log_torn_bytes"] > 0
        assert st["own_feed"]["state"] == "recovering"
        assert "append log was damaged" in (n0.data_dir / "daemon.log").read_text()
        if peer_has_them:
            swarm.restart("n1")
            write_when_writable(n0, range(10, 15), acknowledged)
            assert holds_all(n0, acknowledged)  # the burst is back
        else:
            assert cli(n0, "feed", "accept-loss", "--yes").returncode == 0
            kv = n0.client.ctx_get("d")["kv"]
            lost = {k for k in acknowledged if k not in kv}
            assert lost and lost <= {f"k{i}" for i in burst}  # given up, on the record
            for k in lost:
                del acknowledged[k]
            swarm.restart("n1")
            write(n0, range(10, 15), acknowledged)
        wait_until(lambda: holds_all(n1, acknowledged), 15, what="n1 holds every write")
        no_forks(n0, n1)


def log_bytes(node: NodeProc) -> bytes:
    try:
        return (node.data_dir / "store.db-appends").read_bytes()
    except FileNotFoundError:
        return b""
