"""``sync.majority`` on three real in-process nodes: a confirmed write is held by
a majority, a pull barrier brings it in, and without a majority it fails in time."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import pytest

from aiotest import run
from hivemesh import Node
from hivemesh.commands import LeaseVoters, SyncMajority
from hivemesh.errors import BackendUnavailable, InvalidArgument


def holds(node: Node, author: bytes, seq: int) -> bool:
    return node.daemon.node.journal.head(author).seq >= seq


def test_majority_barriers() -> None:
    async def main() -> None:
        with tempfile.TemporaryDirectory(prefix="hm-sync-") as tmp:
            opts = {"telemetry": False, "trust_mode": "open"}
            a = Node(Path(tmp) / "a", **opts)
            await a.start()
            b = Node(Path(tmp) / "b", bootstrap=[a.endpoint], **opts)
            c = Node(Path(tmp) / "c", bootstrap=[a.endpoint], **opts)
            nodes = [a, b, c]
            try:
                await b.start()
                await c.start()
                for n in nodes:
                    await n.wait_peers(2)
                for n in nodes:
                    assert len((await n.call(LeaseVoters())).to_wire()["voters"]) == 3
                me = a.daemon.identity.public
                ev = await a.append("app.note", {"n": 1})
                got = await a.call(SyncMajority(own_seq=ev.seq, timeout_s=5))
                assert got.majority == 2 and len(got.answered) >= 2  # type: ignore[attr-defined]
                assert holds(b, me, ev.seq) or holds(c, me, ev.seq)
                # c's pull barrier: afterwards c holds everything a majority held
                await c.call(SyncMajority(pull=True, timeout_s=5))
                assert holds(c, me, ev.seq)
                with pytest.raises(InvalidArgument):
                    await a.call(SyncMajority(own_seq=ev.seq + 1000))
                # two of three voters gone: no majority, a typed failure within the deadline
                await b.close()
                await c.close()
                ev = await a.append("app.note", {"n": 2})
                t0 = time.monotonic()
                with pytest.raises(BackendUnavailable):
                    await a.call(SyncMajority(own_seq=ev.seq, timeout_s=1.5))
                assert time.monotonic() - t0 < 4
            finally:
                for n in reversed(nodes):
                    await n.close()

    run(main(), timeout_s=60)
