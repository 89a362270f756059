"""The data dir is private: 0700, and every file in it 0600, whatever the umask.

Real ``hivemesh init`` and ``hivemesh up`` processes under a permissive
umask (022), on a data dir created beforehand with mode 0755. The nodes do
enough to create every kind of file (journal and its WAL and append log,
inbox, telemetry spool, the collector's store, lease voter state, trust
list, key, lock, config); then every file is 0600. Loosened again while the
node is down (a restore from a backup), they are made private at the next
start, with a warning in the log.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import hivemesh
from hivemesh.client.swarm import LocalSwarm, NodeProc, wait_until

SRC = str(Path(hivemesh.__file__).resolve().parent.parent)


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)  # children inherit it: the common default
    try:
        yield
    finally:
        os.umask(old)


def modes(data_dir: Path) -> dict[str, int]:
    """``{relative path: mode}`` of the dir and everything in it."""
    out = {".": stat.S_IMODE(data_dir.stat().st_mode)}
    for path in sorted(data_dir.rglob("*")):
        if not path.is_symlink():
            out[str(path.relative_to(data_dir))] = stat.S_IMODE(path.lstat().st_mode)
    return out


def loose(data_dir: Path) -> dict[str, str]:
    """Entries other users may read, write or enter."""
    return {p: f"{m:04o}" for p, m in modes(data_dir).items() if m & 0o077}


def exercise(swarm: LocalSwarm, a: NodeProc, b: NodeProc) -> None:
    """Make the nodes write every kind of file they keep."""
    wait_until(lambda: a.client.peers() and b.client.peers(), 10, what="linked")
    a.client.claim_name("files-a")
    wait_until(lambda: b.client.call("names").get("files-a"), 10, what="name known")
    b.client.send("files-a", {"hello": 1}, timeout_s=10)  # a's inbox
    a.client.ctx_set("default", "k", "v")
    a.client.call("trust.admit", address=b.address)  # a's trust.json
    a.client.call("lease.acquire", resource="r", holder=a.address, ttl_ms=500)
    wait_until(lambda: (a.data_dir / "metrics.duckdb").exists(), 15, what="the collector's store")


def test_the_data_dir_and_every_file_in_it_are_private(tmp_path: Path, umask_022: None) -> None:
    a_dir = tmp_path / "a"
    a_dir.mkdir()
    a_dir.chmod(0o755)  # created beforehand, looser than we want
    init = subprocess.run(
        [sys.executable, "-m", "hivemesh", "init", "--data-dir", str(a_dir)],
        env={"PYTHONPATH": SRC, "PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert init.returncode == 0, init.stderr
    assert loose(a_dir) == {}
    assert ". 0755 -> 0700" in init.stderr  # it said so
    with LocalSwarm(tmp_path) as swarm:
        a = swarm.start("a", extra_args=["--collector"])
        b = swarm.start("b", bootstrap=[a.endpoint])
        exercise(swarm, a, b)
        for node in (a, b):
            assert loose(node.data_dir) == {}, node.label
        names = set(modes(a.data_dir))
        for expected in (
            "node.key",
            "config.toml",
            "daemon.lock",
            "store.db",
            "store.db-wal",
            "store.db-shm",
            "store.db-appends",
            "inbox.db",
            "inbox.db-wal",
            "telemetry-spool.sqlite3",
            "telemetry-spool.sqlite3-wal",
            "metrics.duckdb",
            "lease_voter.log",
            "trust.json",
        ):
            assert expected in names, sorted(names)

        # down, restored from a backup with loose modes, started again
        swarm.kill("a", signal.SIGTERM)
        log_size = (a.data_dir / "daemon.log").stat().st_size
        a.data_dir.chmod(0o755)
        for name in names - {"."}:  # a clean stop removed the SQLite WALs
            if (a.data_dir / name).exists():
                (a.data_dir / name).chmod(0o644)
        swarm.restart("a")
        assert loose(a.data_dir) == {}
        log = (a.data_dir / "daemon.log").read_bytes()[log_size:].decode()
        warning = next(line for line in log.splitlines() if "made private" in line)
        assert " WARNING " in warning
        assert "store.db 0644 -> 0600" in warning and "node.key 0644 -> 0600" in warning
        assert ". 0755 -> 0700" in warning
        assert a.client.status()["inbox"] == 1  # and it works as before
