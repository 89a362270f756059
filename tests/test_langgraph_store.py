"""MeshStore: LangGraph's BaseStore over a real node (and LWW across two)."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("langgraph.store.base")

from langgraph.store.base import MatchCondition

from aiotest import eventually, run
from hivemesh import Node
from hivemesh.errors import InputTooLarge, InvalidArgument
from hivemesh.faces.langgraph import MeshStore


def test_store_ops_on_one_node() -> None:
    async def main() -> None:
        with tempfile.TemporaryDirectory(prefix="hm-lgs-") as tmp:
            async with Node(Path(tmp) / "n", telemetry=False) as node:
                store = MeshStore(node)
                await store.aput(("users", "u1", "prefs"), "color", {"v": "blue", "n": 3})
                await store.aput(("users", "u1", "prefs"), "size", {"v": "xl", "n": 7})
                await store.aput(("users", "u2"), "color", {"v": "red", "n": 5})
                item = await store.aget(("users", "u1", "prefs"), "color")
                assert item is not None and item.value == {"v": "blue", "n": 3}
                first = item.created_at
                await store.aput(("users", "u1", "prefs"), "color", {"v": "green", "n": 4})
                item = await store.aget(("users", "u1", "prefs"), "color")
                assert item is not None and item.value["v"] == "green"
                assert item.created_at == first and item.updated_at >= first

                found = await store.asearch(("users",), filter={"n": {"$gte": 4}})
                assert sorted(i.value["v"] for i in found) == ["green", "red", "xl"]
                found = await store.asearch(("users", "u1"), filter={"v": "xl"})
                assert [i.key for i in found] == ["size"]
                assert len(await store.asearch(("users",), limit=2)) == 2
                assert len(await store.asearch(("users",), limit=2, offset=2)) == 1

                assert await store.alist_namespaces(prefix=("users",)) == [
                    ("users", "u1", "prefs"),
                    ("users", "u2"),
                ]
                assert await store.alist_namespaces(max_depth=2) == [
                    ("users", "u1"),
                    ("users", "u2"),
                ]
                cond = MatchCondition(match_type="suffix", path=("*", "prefs"))
                assert await store.alist_namespaces(suffix=cond.path) == [("users", "u1", "prefs")]

                await store.adelete(("users", "u2"), "color")
                assert await store.aget(("users", "u2"), "color") is None
                assert await store.alist_namespaces(prefix=("users", "u2")) == []

                with pytest.raises(InputTooLarge):
                    await store.aput(("big",), "k", {"x": b"\0" * 300_000})
                with pytest.raises(InvalidArgument):
                    await store.aput(("ns",), "k", {"x": object()})
                assert await store.aget(("big",), "k") is None

                # the sync face, from a worker thread (as LangGraph's sync invoke calls it)
                got = await asyncio.to_thread(store.get, ("users", "u1", "prefs"), "size")
                assert got is not None and got.value["v"] == "xl"
                await asyncio.to_thread(store.put, ("t",), "k", {"a": 1})
                assert (await store.aget(("t",), "k")).value == {"a": 1}  # type: ignore[union-attr]

    run(main(), timeout_s=60)


def test_store_replicates_between_two_nodes() -> None:
    async def main() -> None:
        with tempfile.TemporaryDirectory(prefix="hm-lgs-") as tmp:
            async with Node(Path(tmp) / "a", telemetry=False, trust_mode="open") as a:  # noqa: SIM117 - b needs a's endpoint
                async with Node(
                    Path(tmp) / "b", telemetry=False, trust_mode="open", bootstrap=[a.endpoint]
                ) as b:
                    await a.wait_peers(1)
                    await b.wait_peers(1)
                    sa, sb = MeshStore(a), MeshStore(b)
                    await sa.aput(("mem",), "fact", {"text": "the sky is blue"})
                    item = None

                    def seen() -> bool:
                        nonlocal item
                        item = sb.view.item(("mem",), "fact")
                        return item is not None

                    await eventually(seen, "b sees a's item", timeout_s=10)
                    await sb.aput(("mem",), "fact", {"text": "updated on b"})
                    await eventually(
                        lambda: _text(sa) == "updated on b", "a sees b's update", timeout_s=10
                    )

    run(main(), timeout_s=60)


def _text(store: MeshStore) -> str | None:
    item = store.view.item(("mem",), "fact")
    return None if item is None else str(item.value["text"])
