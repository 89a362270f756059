"""A trusted peer that lies about time, against real node processes.

The daemons are real ``hivemesh up`` processes (open trust mode, so the
attacker is a trusted, authenticated peer). The attacker is this test process:
it holds its own Ed25519 identity, dials a node over the real transport and
sends its own, correctly chained and signed events stamped with whatever HLC
it likes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hivemesh.client.swarm import LocalSwarm, NodeProc, wait_until
from hivemesh.core.event import decode_event
from hivemesh.core.feed import FeedWriter, Head
from hivemesh.core.frames import FrameType, encode_frame
from hivemesh.core.hlc import HLC, MAX_DRIFT_MS, hlc_ms, make_hlc
from hivemesh.core.identity import Identity
from hivemesh.runtime.daemon import now_ms
from hivemesh.stores.sqlite import SQLiteStore
from hivemesh.transports import connect

MAX_HLC = (1 << 63) - 1
OPEN = ["--trust-mode", "open"]


class Liar:
    """A trusted peer's feed, each event stamped with any HLC it likes."""

    def __init__(self, seed: int) -> None:
        self.identity = Identity.from_seed(bytes([seed]) * 32)
        self.writer = FeedWriter(self.identity, Head(), HLC())

    @property
    def address(self) -> str:
        return self.identity.address

    def batch(
        self, hlc: int, kind: str = "app.note", body: Any = None
    ) -> tuple[list[bytes], bytes]:
        self.writer.clock.last = hlc - 1
        self.writer.append(kind, body if body is not None else {"t": hlc}, 0)
        sealed = self.writer.seal()
        assert sealed is not None
        return [e.raw for e in sealed[0]], sealed[1]

    def send(self, node: NodeProc, *batches: tuple[list[bytes], bytes], until: Any) -> Any:
        """Dial ``node``, push ``batches`` straight from their author and keep
        the channel open until ``until()`` (polled) holds; returns its value."""

        async def run() -> Any:
            ch = await connect(
                "127.0.0.1",
                node.port,
                self.identity,
                expect_address=node.address,
                authorize=lambda _addr: True,
                timeout_s=5.0,
            )
            try:
                for raws, sig in batches:
                    await ch.send(
                        encode_frame(FrameType.EVENTS, self.identity.public, raws, sig, 0)
                    )
                return await asyncio.to_thread(wait_until, until, 10.0, what="the node's answer")
            finally:
                ch.close()

        return asyncio.run(run())


def _vv(node: NodeProc) -> dict[str, int]:
    vv: dict[str, int] = node.client.status()["journal"]["version_vector"]
    return vv


@pytest.fixture()
def swarm(tmp_path: Path) -> Iterator[LocalSwarm]:
    with LocalSwarm(tmp_path) as s:
        yield s


def test_a_far_future_event_is_deferred_and_every_node_still_writes_after_a_restart(
    swarm: LocalSwarm,
) -> None:
    a = swarm.start("a", extra_args=OPEN)
    b = swarm.start("b", bootstrap=[a.endpoint], extra_args=OPEN)
    liar = Liar(21)
    now = make_hlc(now_ms())
    status = liar.send(
        a,
        liar.batch(now),
        liar.batch(MAX_HLC),
        liar.batch(now + 1),
        until=lambda: (s := a.client.status())["counters"].get("clock_ahead") and s,
    )
    assert status["clock_ahead"][liar.address]["waiting_from_seq"] == 2
    assert _vv(a)[liar.address] == 1  # neither #2 nor #3 (which waits behind it)
    wait_until(lambda: _vv(b).get(liar.address) == 1, 10, what="b holds the liar's #1")

    swarm.kill("a")  # SIGKILL, then the same data dir again
    a = swarm.restart("a")
    _writes_and_replicates(a, b)
    assert _vv(a)[liar.address] == 1


def test_a_store_from_an_older_version_holding_a_far_future_event_still_writes(
    swarm: LocalSwarm,
) -> None:
    """An older version accepted the event and stored it; the upgraded node
    must start, write and replicate."""
    a = swarm.start("a", extra_args=OPEN)
    b = swarm.start("b", bootstrap=[a.endpoint], extra_args=OPEN)
    wait_until(lambda: swarm.converged(["a", "b"]), 10, what="a and b meet")
    swarm.kill("a", 15)  # SIGTERM: a clean stop
    liar = Liar(22)
    with SQLiteStore(a.data_dir / "store.db") as store:
        for raws, sig in (liar.batch(make_hlc(now_ms())), liar.batch(MAX_HLC)):
            store.append(liar.identity.public, [decode_event(r) for r in raws], sig)
    a = swarm.restart("a")
    assert _vv(a)[liar.address] == 2
    _writes_and_replicates(a, b)
    # b (never held #2) is served #1 by a and defers #2: it waits there too
    wait_until(lambda: _vv(b).get(liar.address) == 1, 10, what="b holds the liar's #1")
    assert b.client.status()["clock_ahead"][liar.address]["waiting_from_seq"] == 2


def _writes_and_replicates(a: NodeProc, b: NodeProc) -> None:
    """``a`` appends (this raised before the fix), with a sane HLC, and ``b`` gets it."""
    ev = a.client.call("append", kind="app.note", body={"after": "restart"})
    assert hlc_ms(ev["hlc"]) <= now_ms() + MAX_DRIFT_MS
    a.client.claim_name("after-restart")
    seq = _vv(a)[a.address]
    wait_until(lambda: _vv(b).get(a.address) == seq, 10, what="b gets a's new writes")


def test_a_backdated_name_claim_does_not_take_over_a_held_name_and_is_counted(
    swarm: LocalSwarm,
) -> None:
    """``b`` holds ``planner``; a minute and more later a trusted peer claims it
    stamped ``hlc=1``. Every node keeps resolving (and messaging) ``b``, and
    ``status`` counts and names the attempt. This waits out the clock bound
    (``MAX_DRIFT_MS``, 60 s): a claim made within it may still be ordered first."""
    a = swarm.start("a", extra_args=OPEN)
    b = swarm.start("b", bootstrap=[a.endpoint], extra_args=OPEN)
    held_since = now_ms()
    b.client.claim_name("planner")
    wait_until(lambda: a.client.call("names").get("planner") == b.address, 10, what="a sees it")
    wait_until(
        lambda: now_ms() > held_since + MAX_DRIFT_MS + 2_000,
        MAX_DRIFT_MS / 1000 + 30,
        what="the name is held for longer than the clock bound",
        interval_s=0.5,
    )
    liar = Liar(23)
    liar.send(
        a,
        liar.batch(1, "name.claim", {"n": "planner"}),
        until=lambda: _vv(a).get(liar.address) == 1,
    )
    assert a.client.call("names")["planner"] == b.address  # the liar's before the fix
    status = a.client.status()
    assert status["counters"]["name_takeovers_refused"] == 1
    (attempt,) = status["name_takeovers"]
    assert (attempt["claimant"], attempt["owner"]) == (liar.address, b.address)
    assert attempt["claimed_hlc"] == 1
    wait_until(
        lambda: b.client.status()["counters"].get("name_takeovers_refused") == 1,
        10,
        what="b gets the claim and counts it too",
    )
    assert b.client.call("names")["planner"] == b.address
    a.client.send("planner", {"to": "the real planner"})  # acknowledged by b
    inbox = wait_until(lambda: b.client.inbox(), 10, what="b's inbox")
    assert inbox[0]["data"] == {"to": "the real planner"}
