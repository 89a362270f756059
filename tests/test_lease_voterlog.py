"""The quorum voter's durable log: reopen, torn tails, compaction, corruption."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest

from hivemesh.core import codec
from hivemesh.core.lease_quorum import Voter
from hivemesh.errors import StoreCorrupt
from hivemesh.runtime.voterlog import VoterLog


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
