"""The quorum voter's durable log: reopen, torn tails, compaction, corruption."""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from hivemesh.core import codec
from hivemesh.core.lease_voter import Voter
from hivemesh.errors import StoreCorrupt
from hivemesh.stores.voterlog import VoterLog


def test_changes_survive_reopen_and_restore_a_quarantined_voter(tmp_path: Path) -> None:
    log = VoterLog(tmp_path / "v.log")
    assert log.open() is None  # a new log
    log.append("a", 3, 500)
    log.append("b", 7, 200)
    log.append("a", 4, 100)
    log.close()
    again = VoterLog(tmp_path / "v.log")
    state = again.open()
    assert state == {"max_ttl_ms": 500, "max_tokens": {"a": 4, "b": 7}}
    v = Voter("v", state=state, now_ms=1000)
    assert v.durable("a") == (4, 500)
    # quarantined for the longest TTL: refuses writes until then
    assert v.receive(["acc", 1, "a", 5, "h", 100, "x"], 1200) == ["acc_r", 1, False]
    assert v.receive(["acc", 2, "a", 5, "h", 100, "x"], 1501) == ["acc_r", 2, True]
    again.close()


def test_a_torn_or_corrupt_tail_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "v.log"
    log = VoterLog(path)
    log.open()
    log.append("a", 1, 100)
    pos = log._pos
    log.append("a", 2, 100)
    log.close()
    data = bytearray(path.read_bytes())
    data[pos + 9] ^= 0xFF  # flip a byte of the last record's payload: crc mismatch
    path.write_bytes(bytes(data))
    assert VoterLog(path).open() == {"max_ttl_ms": 100, "max_tokens": {"a": 1}}


def test_a_full_log_is_compacted_without_losing_changes(tmp_path: Path) -> None:
    log = VoterLog(tmp_path / "v.log", size=256)
    log.open()
    for i in range(1, 60):
        log.append(f"r{i % 5}", i, 50 + i)
    assert log.compactions > 2
    log.close()
    state = VoterLog(tmp_path / "v.log").open()
    assert state is not None and state["max_ttl_ms"] == 109
    assert state["max_tokens"] == {
        f"r{k}": max(i for i in range(1, 60) if i % 5 == k) for k in range(5)
    }


def test_a_well_formed_record_with_bad_content_is_a_typed_error(tmp_path: Path) -> None:
    payload = codec.pack(["a", "not-an-int", 5])
    rec = struct.pack("<II", len(payload), zlib.crc32(payload)) + payload
    (tmp_path / "v.log").write_bytes(rec + bytes(64))
    with pytest.raises(StoreCorrupt):
        VoterLog(tmp_path / "v.log").open()


def test_group_commit_writes_then_one_sync_and_compaction_syncs_too(tmp_path: Path) -> None:
    log = VoterLog(tmp_path / "v.log", size=512)
    log.open()
    assert not log.pending and log.sync() is False  # nothing to sync: no fdatasync
    log.write("a", 1, 100)
    log.write("b", 2, 100)
    assert log.pending and log.syncs == 0
    assert log.sync() is True and log.syncs == 1 and not log.pending
    while log.compactions == 1:  # the open's compaction; fill the log until the next
        log.write("a", log.bounds.max_tokens["a"] + 1, 100)
    assert not log.pending  # the compacted file was synced with every change in it
    log.close()
    state = VoterLog(tmp_path / "v.log").open()
    assert state is not None and state["max_tokens"]["b"] == 2


_CRASH_AFTER_SYNC = """
import os, sys
from hivemesh.stores.voterlog import VoterLog
log = VoterLog(sys.argv[1])
log.open()
log.write("r", 1025, 3000)  # the voter's durable change for an accept of token 1
log.sync()
os.kill(os.getpid(), 9)  # killed after the sync, before the reply could leave
"""


def test_a_voter_killed_between_its_sync_and_its_reply_keeps_the_promise(
    tmp_path: Path,
) -> None:
    path = tmp_path / "v.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run(
        [sys.executable, "-c", _CRASH_AFTER_SYNC, str(path)], env=env, timeout=30, check=False
    )
    assert proc.returncode == -signal.SIGKILL
    state = VoterLog(path).open()
    assert state == {"max_ttl_ms": 3000, "max_tokens": {"r": 1025}}
    v = Voter("v", state=state, now_ms=0, token_reserve=1024)
    assert v.receive(["prep", 1, "r"], 10)[2:4] == [1025, "?"]  # quarantined, bound kept
    assert v.receive(["acc", 2, "r", 1025, "h", 100, "x"], 3001) == ["acc_r", 2, False]
    assert v.receive(["acc", 3, "r", 1026, "h", 100, "x"], 3001) == ["acc_r", 3, True]


def test_no_room_to_rewrite_the_log_at_open_is_a_typed_store_error(tmp_path: Path) -> None:
    """Found by tests/test_e2e_diskfull.py: a daemon restarted on a full disk
    died with a bare OSError traceback from this compaction at open. A file
    size limit stands in for the full disk here (EFBIG instead of ENOSPC)."""
    first = VoterLog(tmp_path / "v.log")
    first.open()
    first.append("r", 1, 100)  # a log to rewrite at the restart
    first.close()
    code = (
        "import resource, signal, sys\n"
        "from hivemesh.errors import StoreError\n"
        "from hivemesh.stores.voterlog import VoterLog\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))\n"
        "try:\n"
        f"    VoterLog({str(tmp_path / 'v.log')!r}).open()\n"
        "except StoreError as exc:\n"
        "    print('typed', exc.code)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "typed store_error", out.stderr
    assert not (tmp_path / "v.tmp").exists()


def test_a_fresh_voter_creates_its_log_with_its_first_change(tmp_path: Path) -> None:
    """A voter without a log has promised nothing: open writes no file (a
    fresh node's start paid a 1 MiB write and two syncs); the first change
    creates the log with it, synced, before any reply could leave."""
    path = tmp_path / "v.log"
    log = VoterLog(path)
    assert log.open() is None and log.compactions == 0
    assert not path.exists() and not log.pending and log.sync() is False
    log.write("r", 7, 500)
    assert path.exists() and log.compactions == 1 and not log.pending  # synced with it
    log.write("r", 8, 500)  # then records as usual
    assert log.pending and log.sync() is True
    log.close()
    assert VoterLog(path).open() == {"max_ttl_ms": 500, "max_tokens": {"r": 8}}
