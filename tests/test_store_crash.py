"""kill -9 during appends never loses an acknowledged batch or corrupts the store.

A child process appends signed batches to a SQLiteStore in a loop and prints
``<author hex> <seq>`` after each append returns. The test kills it with
SIGKILL at a random moment, reopens the file and checks that the store opens
cleanly, every acknowledged seq is stored with its signature, and a full
verified replay passes. The same file is reused across iterations, so each
run also recovers from the previous kill's WAL.
"""

from __future__ import annotations

import os
import random
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hivemesh.stores.replay import rehydrate
from hivemesh.stores.sqlite import SQLiteStore

SRC = str(Path(__file__).resolve().parents[1] / "src")

WRITER = r"""
import random, sys
from hivemesh.core.event import GENESIS
from hivemesh.core.feed import FeedWriter, Head
from hivemesh.core.hlc import HLC
from hivemesh.core.identity import Identity
from hivemesh.stores.sqlite import SQLiteStore

path, durability, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
logged = sys.argv[4] == "log"
store = SQLiteStore(path, durability=durability)
store.write_behind = store.append_log = logged  # the daemon's mode
heads = store.heads()
writers = []
for n in range(2):
    ident = Identity.from_seed(bytes([n + 1]) * 32)
    seq, h = heads.get(ident.public, (0, GENESIS))
    writers.append(FeedWriter(ident, Head(seq, h), HLC()))
rng = random.Random(seed)
print("ready", flush=True)
for i in range(5000):  # bounded even if nobody kills us
    w = writers[i % 2]
    for _ in range(rng.randrange(20, 200)):
        w.append("chat.line", {"text": "x" * rng.randrange(200)}, 1_800_000_000_000 + w.head.seq)
    events, sig = w.seal()
    store.append(w.identity.public, events, sig)
    if logged and rng.random() < 0.2:
        store.sync()  # the daemon's group commit: commit, then empty the log
    sys.stdout.write(f"{w.identity.public.hex()} {events[-1].seq}\n")
    sys.stdout.flush()
"""


class Lines:
    """Read a child's stdout line by line with a deadline (no blocking reads)."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        self.fd = proc.stdout.fileno()
        self.buf = b""
        self.lines: list[str] = []

    def _pump(self, timeout_s: float) -> bool:
        ready, _, _ = select.select([self.fd], [], [], timeout_s)
        if not ready:
            return True
        chunk = os.read(self.fd, 65536)
        if not chunk:
            return False
        self.buf += chunk
        *done, self.buf = self.buf.split(b"\n")
        self.lines.extend(x.decode() for x in done)
        return True

    def wait_for_lines(self, n: int, deadline_s: float) -> None:
        end = time.monotonic() + deadline_s
        while len(self.lines) < n:
            left = end - time.monotonic()
            if left <= 0:
                raise AssertionError(f"child printed {len(self.lines)} lines, wanted {n}")
            if not self._pump(min(left, 0.5)):
                raise AssertionError(f"child exited after {self.lines!r:.300}")

    def drain(self, deadline_s: float) -> None:
        end = time.monotonic() + deadline_s
        while time.monotonic() < end and self._pump(min(0.5, end - time.monotonic())):
            pass


def run_and_kill(path: Path, durability: str, mode: str, rng: random.Random) -> dict[str, int]:
    """Start a writer, kill -9 it after a random number of acks; return acks."""
    env = {**os.environ, "PYTHONPATH": SRC}
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), durability, str(rng.randrange(1 << 30)), mode],
        stdout=subprocess.PIPE,
        env=env,
    )
    try:
        out = Lines(proc)
        out.wait_for_lines(1 + rng.randrange(1, 30), deadline_s=60)
        time.sleep(rng.random() * 0.01)  # the fault: land the kill at a random instant
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
        out.drain(deadline_s=5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        assert proc.stdout is not None
        proc.stdout.close()
    assert out.lines[0] == "ready"
    acked: dict[str, int] = {}
    for line in out.lines[1:]:
        author, seq = line.split()
        acked[author] = max(acked.get(author, 0), int(seq))
    return acked


@pytest.mark.parametrize(
    ("durability", "mode"), [("process", "commit"), ("power", "commit"), ("process", "log")]
)
def test_kill_9_never_loses_acknowledged_appends(
    tmp_path: Path, durability: str, mode: str
) -> None:
    path = tmp_path / "crash.db"
    rng = random.Random(f"crash/{durability}/{mode}")
    all_acked: dict[str, int] = {}
    for _ in range(4 if durability == "process" else 2):
        acked = run_and_kill(path, durability, mode, rng)
        assert acked, "the writer acknowledged nothing"
        # The child died holding the database open: recovery has work to do.
        wal, log = Path(f"{path}-wal"), Path(f"{path}-appends")
        assert wal.stat().st_size > 0 or (log.exists() and log.stat().st_size > 0)
        for a, s in acked.items():
            all_acked[a] = max(all_acked.get(a, 0), s)
        with SQLiteStore(path) as store:  # opens cleanly, recovering the WAL
            heads = {a.hex(): seq for a, (seq, _) in store.heads().items()}
            for author, seq in all_acked.items():
                assert heads.get(author, 0) >= seq, f"acknowledged #{seq} of {author[:8]} lost"
                assert store.signature(bytes.fromhex(author), seq) is not None
            stats = rehydrate(store)
            assert stats.events == sum(heads.values())
            store.check()


def test_torn_wal_tail_rolls_back_whole_commits(tmp_path: Path) -> None:
    """A WAL cut short (as by power loss mid-write) loses only whole trailing
    commits: the store still opens and verifies, never half a batch."""
    live = tmp_path / "live.db"
    rng = random.Random("torn-wal")
    acked = run_and_kill(live, "process", "commit", rng)
    wal = Path(f"{live}-wal").read_bytes()
    db = live.read_bytes()
    assert len(wal) > 4096
    full = sum(acked.values())
    counts = []
    for i, cut in enumerate([32, 100, len(wal) // 3, len(wal) // 2, len(wal) - 1, len(wal)]):
        copy = tmp_path / f"copy{i}.db"
        copy.write_bytes(db)
        Path(f"{copy}-wal").write_bytes(wal[:cut])
        with SQLiteStore(copy) as store:
            stats = rehydrate(store)
            assert stats.events == sum(seq for seq, _ in store.heads().values())
            counts.append(stats.events)
    assert counts == sorted(counts)  # a longer WAL never holds less
    assert counts[-1] >= full
