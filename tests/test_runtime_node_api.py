"""The Python API: two in-process nodes on loopback (real sockets, real SQLite)."""

from __future__ import annotations

import asyncio
import stat
from pathlib import Path
from typing import Any

import pytest

import hivemesh
from hivemesh.errors import (
    DeadlineExceeded,
    InviteUsed,
    LocalProtocolError,
    NoHandler,
    UnknownPeer,
)

# two loopback nodes that bootstrap from each other: open trust (nodes are private by default)
FAST = {
    "sync_interval_ms": 200,
    "reconnect_min_s": 0.05,
    "reconnect_max_s": 0.5,
    "trust_mode": "open",
}


async def _until(pred, timeout_s: float = 10.0, what: str = "condition"):  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        value = pred()
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"{what} not reached in {timeout_s}s")
        await asyncio.sleep(0.02)


def test_context_replicates_and_subscribe_sees_it(tmp_path: Path) -> None:
    async def main() -> None:
        async with (
            hivemesh.Node(tmp_path / "a", **FAST) as a,
            hivemesh.Node(tmp_path / "b", bootstrap=[a.endpoint], **FAST) as b,
        ):
            assert b.address in await a.wait_peers(1, timeout_s=10)
            events = b.subscribe("ctx.update")
            waiter = asyncio.ensure_future(events.__anext__())
            with a.context("task-42") as ctx:
                ctx["status"] = "running"
                ctx.list("log").append("started")
            ev = await asyncio.wait_for(waiter, 10)
            assert ev.author == a.address and ev.kind == "ctx.update"
            await _until(lambda: b.read_context("task-42").get("kv") == {"status": "running"})
            assert b.read_context("task-42")["list"] == {"log": ["started"]}
            await events.aclose()
            assert b.status()["counters"].get("subscriber_dropped", 0) == 0

    asyncio.run(main())


def test_private_nodes_join_by_invite_from_python(tmp_path: Path) -> None:
    """The default (private) trust from the Python API: invite, join, refusal."""
    private = {k: v for k, v in FAST.items() if k != "trust_mode"}

    async def main() -> None:
        async with (
            hivemesh.Node(tmp_path / "a", **private) as a,
            hivemesh.Node(tmp_path / "b", **private) as b,
            hivemesh.Node(tmp_path / "c", **private) as c,
        ):
            token = a.invite(ttl_s=60)
            joined = await b.join(token, timeout_s=10)
            assert joined["inviter"] == a.address
            assert b.address in await a.wait_peers(1, timeout_s=10)
            with pytest.raises(InviteUsed):
                await c.join(token, timeout_s=10)
            assert c.address not in a.daemon.conns.links

    asyncio.run(main())


def test_state_survives_restart_and_control_socket_is_private(tmp_path: Path) -> None:
    async def main() -> None:
        async with hivemesh.Node(tmp_path / "a") as a:
            with a.context() as ctx:
                ctx["k"] = 1
            await a.flush()
            addr = a.address
            mode = stat.S_IMODE((tmp_path / "a" / "ctl.sock").stat().st_mode)
            assert mode == 0o600
        assert not (tmp_path / "a" / "ctl.sock").exists()
        async with hivemesh.Node(tmp_path / "a") as a2:
            assert a2.address == addr
            assert a2.read_context()["kv"] == {"k": 1}
            assert a2.status()["journal"]["rehydrated"] >= 2

    asyncio.run(main())


def test_client_talks_to_an_in_process_node(tmp_path: Path) -> None:
    async def main() -> None:
        async with hivemesh.Node(tmp_path / "a") as a:
            client = hivemesh.Client(tmp_path / "a")
            st = await asyncio.to_thread(client.status)
            assert st["address"] == a.address
            r = await asyncio.to_thread(client.ctx_set, "default", "x", [1, 2])
            assert r["seq"] >= 2
            assert a.read_context()["kv"]["x"] == [1, 2]

    asyncio.run(main())


def test_send_by_name_is_acknowledged_and_lands_in_the_inbox(tmp_path: Path) -> None:
    async def main() -> None:
        async with (
            hivemesh.Node(tmp_path / "a", **FAST) as a,
            hivemesh.Node(tmp_path / "b", bootstrap=[a.endpoint], name="collector", **FAST) as b,
        ):
            await _until(lambda: a.daemon.names.resolve("collector") == b.address)
            await _until(lambda: b.address in a.daemon.conns.links)
            receipt = await a.send("collector", {"tokens": 7}, timeout_s=5)
            assert receipt["acked"] and receipt["to"] == b.address
            msgs = b.inbox()
            assert [m["data"] for m in msgs] == [{"tokens": 7}]
            assert msgs[0]["sender"] == a.address
            with pytest.raises(UnknownPeer):
                await a.send("nobody", 1)

    asyncio.run(main())


def test_blobs_are_announced_and_fetched_on_demand(tmp_path: Path) -> None:
    import os

    async def main() -> None:
        async with (
            hivemesh.Node(tmp_path / "a", **FAST) as a,
            hivemesh.Node(tmp_path / "b", bootstrap=[a.endpoint], **FAST) as b,
        ):
            await _until(lambda: b.address in a.daemon.node.peers)
            data = os.urandom(2_500_000)  # three chunks
            digest = await a.put_blob(data, mime="image/png", name="screenshot")
            await _until(lambda: b.daemon.peer.blob_index.by_name("screenshot") is not None)
            assert b.daemon.node.journal.store.get_blob(bytes.fromhex(digest)) is None
            got = await b.get_blob("screenshot", timeout_s=10)
            assert got == data
            # now held (and verified) locally on b
            assert b.daemon.node.journal.store.get_blob(bytes.fromhex(digest)) == data
            assert b.status()["blobs"]["known"] == 1
            with pytest.raises(DeadlineExceeded):
                await b.get_blob("00" * 32, timeout_s=1)

    asyncio.run(main())


def test_a_subscriber_that_falls_behind_is_counted_not_silent(tmp_path: Path) -> None:
    async def main() -> None:
        async with hivemesh.Node(tmp_path / "a") as a:
            events = a.subscribe("app.tick")
            waiter = asyncio.ensure_future(events.__anext__())
            for i in range(1100):  # the queue holds 1024
                await a.append("app.tick", i)
            first = await asyncio.wait_for(waiter, 5)
            assert first.body == 0
            dropped = a.status()["counters"]["subscriber_dropped"]
            # 1024 queued, at most one already taken by the waiter, the rest counted
            assert 1100 - 1024 - 1 <= dropped <= 1100 - 1024
            assert a.status()["dropped_total"] >= dropped
            await events.aclose()

    asyncio.run(main())


def test_an_application_view_sees_stored_and_new_events(tmp_path: Path) -> None:
    class Tally:
        kinds = frozenset({"app.vote"})

        def __init__(self) -> None:
            self.votes: dict[str, int] = {}

        def apply(self, ev: Any) -> None:
            self.votes[ev.body] = self.votes.get(ev.body, 0) + 1

    async def main() -> None:
        async with hivemesh.Node(tmp_path / "a") as a:
            await a.append("app.vote", "yes")
            await a.append("app.other", "ignored")
        async with hivemesh.Node(tmp_path / "a") as a:
            tally = Tally()
            assert a.add_view(tally) == 1  # replayed from the store
            await a.append("app.vote", "yes")
            await a.append("app.vote", "no")
            assert tally.votes == {"yes": 2, "no": 1}

    asyncio.run(main())


def test_request_reply_bypasses_the_inbox(tmp_path: Path) -> None:
    async def main() -> None:
        async with (
            hivemesh.Node(tmp_path / "a", name="metrics-collector", **FAST) as a,
            # b's own telemetry would be requests to metrics-collector too: off here
            hivemesh.Node(tmp_path / "b", bootstrap=[a.endpoint], telemetry=False, **FAST) as b,
        ):
            seen: list[tuple[str, Any]] = []

            async def collect(sender: str, body: Any) -> dict[str, Any]:
                seen.append((sender, body))
                if body == "boom":
                    raise ValueError("bad batch")
                return {"ok": True, "acked_through": len(body)}

            a.on_message("metrics", collect)
            await _until(lambda: b.daemon.names.resolve("metrics-collector") == a.address)
            await b.wait_peers(1, timeout_s=10)
            reply = await b.request("metrics-collector", "metrics", [1, 2, 3], timeout_s=5)
            assert reply == {"ok": True, "acked_through": 3}
            assert seen == [(b.address, [1, 2, 3])]
            failed = await b.request("metrics-collector", "metrics", "boom", timeout_s=5)
            assert failed["ok"] is False and "bad batch" in failed["error"]
            assert a.inbox() == [] and b.inbox() == []  # neither went to an inbox
            t0 = asyncio.get_running_loop().time()
            with pytest.raises(NoHandler, match="nobody-handles-this"):  # answered, not timed out
                await a.request(b.address, "nobody-handles-this", 1, timeout_s=5)
            assert asyncio.get_running_loop().time() - t0 < 2.0
            assert b.inbox() == []  # an unhandled request is answered, not left in the inbox

    asyncio.run(main())


def test_node_not_started_is_a_local_error(tmp_path: Path) -> None:
    node = hivemesh.Node(tmp_path / "a")
    with pytest.raises(LocalProtocolError):
        _ = node.address


def test_a_subscription_exists_when_subscribe_returns(tmp_path: Path) -> None:
    """Events applied before the consumer first reads are not missed (the
    async-generator version registered only at its first ``__anext__``)."""

    async def main() -> None:
        async with hivemesh.Node(tmp_path / "a") as a:
            events = a.subscribe("app.tick")
            for i in range(3):
                await a.append("app.tick", i)
            got = [(await asyncio.wait_for(events.__anext__(), 5)).body for _ in range(3)]
            assert got == [0, 1, 2]
            await events.aclose()
            assert a.daemon._subs == []
            with pytest.raises(StopAsyncIteration):
                await events.__anext__()
            leaked = a.subscribe("app.tick")
            assert len(a.daemon._subs) == 1
            del leaked  # left without aclose: unregistered when collected
            assert a.daemon._subs == []

    asyncio.run(main())
