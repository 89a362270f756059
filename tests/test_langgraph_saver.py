"""MeshCheckpointSaver on one real node: the conflict causes, large checkpoints,
the sync face, and the chain view's independence from arrival order."""

from __future__ import annotations

import asyncio
import operator
import os
import random
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest

pytest.importorskip("langgraph.graph")

from langgraph.checkpoint.conformance.test_utils import (
    generate_checkpoint,
    generate_config,
    generate_metadata,
)
from langgraph.graph import END, START, StateGraph

import hivemesh
from aiotest import eventually, run
from hivemesh import Node
from hivemesh.core.event import Event
from hivemesh.errors import LocalProtocolError
from hivemesh.faces.langgraph import ChainView, CheckpointConflict, MeshCheckpointSaver
from hivemesh.faces.langgraph.chain import KIND_PART


class State(TypedDict):
    log: Annotated[list[str], operator.add]
    blob: str


def graph(saver: MeshCheckpointSaver) -> Any:
    g = StateGraph(State)
    g.add_node("a", lambda s: {"log": ["a"], "blob": "x" * 600_000})  # > 2 event bodies
    g.add_node("b", lambda s: {"log": ["b"]})
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    g.add_edge("b", END)
    return g.compile(checkpointer=saver)


async def put(saver: MeshCheckpointSaver, thread: str, parent: str | None) -> str:
    cfg = generate_config(thread, checkpoint_id=parent)
    cp = generate_checkpoint()
    stored = await saver.aput(cfg, cp, generate_metadata(), {})
    return str(stored["configurable"]["checkpoint_id"])


def test_conflicts_large_state_and_the_sync_face() -> None:
    async def main() -> None:
        with tempfile.TemporaryDirectory(prefix="hm-lg-") as tmp:
            async with Node(Path(tmp) / "n", telemetry=False) as node:
                one = MeshCheckpointSaver(node, lease_ttl_ms=2000)
                two = MeshCheckpointSaver(node, lease_ttl_ms=2000)
                assert one.view is two.view  # one view per node, however many savers
                c1 = await put(one, "t", None)
                c2 = await put(one, "t", c1)
                # another writer while the first holds the thread: refused at once
                with pytest.raises(CheckpointConflict, match="being written"):
                    await put(two, "t", c2)
                await one.aclose()
                # the thread is free, but this writer extends a checkpoint that is
                # no longer the head: refused (it would fork the chain at c1)
                with pytest.raises(CheckpointConflict, match="moved on"):
                    await put(two, "t", c1)
                c3 = await put(two, "t", c2)  # from the head: fine
                assert two.view.latest("t", "").checkpoint_id == c3  # type: ignore[union-attr]
                assert two.view.forks("t") == []
                assert one.conflicts == {} and two.conflicts == {"held": 1, "stale": 1}
                await two.adelete_thread("t")  # gone on every replica; the thread starts anew
                assert two.view.latest("t", "") is None and list(two.view.threads()) == []
                c4 = await put(two, "t", None)
                assert two.view.latest("t", "").checkpoint_id == c4  # type: ignore[union-attr]
                await two.aclose()

                # a real graph through the sync face (LangGraph's sync invoke runs on a
                # worker thread); its 600 kB state travels as parts
                saver = MeshCheckpointSaver(node)
                g = graph(saver)
                cfg: Any = {"configurable": {"thread_id": "big"}}
                out = await asyncio.to_thread(g.invoke, {"log": [], "blob": ""}, cfg)
                assert out["log"] == ["a", "b"] and len(out["blob"]) == 600_000
                back = await saver.aget_tuple(cfg)
                assert (
                    back is not None and len(back.checkpoint["channel_values"]["blob"]) == 600_000
                )
                with pytest.raises(LocalProtocolError):
                    saver.get_tuple(cfg)  # a sync call on the node's own loop would deadlock
                await saver.aclose()

                # the view is a function of the set of events, not of their order
                recorder = Recorder()
                node.add_view(recorder)  # replays the stored events into it
                assert_order_free(recorder.events)

    run(main(), timeout_s=90)


class Recorder:
    kinds = ChainView.kinds

    def __init__(self) -> None:
        self.events: list[Event] = []

    def apply(self, ev: Event) -> None:
        self.events.append(ev)


def summary(view: ChainView) -> list[Any]:
    out = []
    for t in view.threads():
        for ns in ("",):
            out.append([(r.checkpoint_id, r.parent_id, r.token) for r in view.checkpoints(t, ns)])
            latest = view.latest(t, ns)
            out.append(None if latest is None else latest.checkpoint_id)
    return out


def assert_order_free(events: list[Event]) -> None:
    assert sum(ev.kind == KIND_PART for ev in events) >= 3  # the large state's chunks
    base = ChainView()
    for ev in events:
        base.apply(ev)
    rng = random.Random("lg-view")
    for _ in range(20):
        shuffled = events[:]
        rng.shuffle(shuffled)
        view = ChainView()
        for ev in shuffled + shuffled[: len(shuffled) // 3]:  # with duplicates too
            view.apply(ev)
        assert summary(view) == summary(base)


def test_the_readme_langgraph_snippet_runs_as_written(tmp_path: Path) -> None:
    text = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    tail = text[text.index("### LangGraph") :]
    match = re.search(r"```python\n(.*?)```", tail, re.S)
    assert match is not None
    (tmp_path / "graph.py").write_text(match.group(1))
    env = {k: v for k, v in os.environ.items() if not k.startswith("HIVEMESH_")}
    env["PYTHONPATH"] = str(Path(hivemesh.__file__).resolve().parent.parent)
    out = subprocess.run(
        [sys.executable, "graph.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "'log': ['planned', 'acted']" in out.stdout, out.stdout


def test_a_lease_lost_while_confirming_is_a_conflict_never_a_fork() -> None:
    """A writer's lease runs out between its append and its confirmation, and
    another writer takes the thread: the first gets ``checkpoint_conflict``
    (outcome unknown), the second must extend what is now the head, the
    chain stays one line."""

    async def main() -> None:
        with tempfile.TemporaryDirectory(prefix="hm-lg-") as tmp:
            async with Node(Path(tmp) / "n", telemetry=False) as node:
                taken = asyncio.Event()

                class Slow(MeshCheckpointSaver):
                    async def _confirm(self, thread: str, token: int, seq: int) -> None:
                        if thread == "slow":
                            await taken.wait()  # the lease runs out meanwhile
                        await super()._confirm(thread, token, seq)

                a = Slow(node, lease_ttl_ms=300)
                b = MeshCheckpointSaver(node, lease_wait_s=5)
                a1 = await put(a, "t", None)
                pending = asyncio.ensure_future(put(a, "slow", None))
                await asyncio.sleep(0)
                # "slow" is a's too: a's write there is appended, not confirmed
                await eventually(lambda: b.view.latest("slow", "") is not None, "a's append")
                orphan = b.view.latest("slow", "")
                assert orphan is not None
                # b waits out a's lease, catches up, and must extend the head it finds
                with pytest.raises(CheckpointConflict, match="moved on"):
                    await put(b, "slow", None)
                c_b = await put(b, "slow", orphan.checkpoint_id)
                taken.set()
                with pytest.raises(CheckpointConflict, match="lost"):
                    await pending
                assert a.conflicts == {"lease_lost": 1}
                head = b.view.latest("slow", "")
                assert head is not None and head.checkpoint_id == c_b
                assert head.token > orphan.token
                assert b.view.forks("slow") == []
                assert b.view.latest("t", "").checkpoint_id == a1  # type: ignore[union-attr]
                await b.aclose()

    run(main(), timeout_s=60)
