"""A real daemon killed with SIGKILL between its appends and their group
commit keeps every acknowledged write: it is in the store's append log, and
the restarted daemon commits it before it serves anything."""

from __future__ import annotations

from pathlib import Path

from hivemesh.client.swarm import LocalSwarm
from hivemesh.stores.appendlog import read_records


def test_writes_acknowledged_before_the_group_commit_survive_kill_9(tmp_path: Path) -> None:
    # The longest group-commit delay: the kill lands before any commit of the writes.
    with LocalSwarm(tmp_path, env={"HIVEMESH_COMMIT_DELAY_MS": "1000"}) as swarm:
        node = swarm.start("n0")
        for i in range(5):
            node.client.ctx_set("logged", f"k{i}", i)  # returns once durable
        swarm.kill("n0")
        log = node.data_dir / "store.db-appends"
        assert read_records(log.read_bytes()).records, "the writes were committed already"
        node = swarm.restart("n0")
        assert node.client.ctx_get("logged")["kv"] == {f"k{i}": i for i in range(5)}
        assert not log.exists() or not read_records(log.read_bytes()).records
        assert node.client.status()["journal"]["log_recovered"] >= 1
