"""``hivemesh bench langgraph``: a graph's step time with the mesh checkpointer vs LangGraph's own.

The swarm: ``--nodes - 1`` ``hivemesh up`` processes on loopback plus one
in-process :class:`hivemesh.Node` in this process, which runs the graph;
every node is a lease voter. The graph: a line of ``--steps`` trivial nodes,
run with ``durability="sync"`` (each step's checkpoint is stored before the
next step starts), on a fresh thread each run. Runs of three checkpointers
interleave, so machine noise hits them alike:

* *ours* -- :class:`~hivemesh.faces.langgraph.MeshCheckpointSaver`: the
  thread's lease, a majority barrier when it is taken, and every write
  confirmed (a majority holds it, the lease renewed on the quorum);
* *baseline* -- LangGraph's ``InMemorySaver`` (one process, nothing shared,
  nothing durable): the floor of the graph runtime itself;
* *unfenced* (details) -- :class:`UnfencedSaver`, the same storage with the
  rule taken out (no lease, no head check; the write still waits for a
  majority): the price of never forking, beside the price of replication.

Reported: milliseconds per step (median over runs of each run's mean), the
ratio, and the latency of ``aput`` (p50/p99) for ours.
"""

from __future__ import annotations

import argparse
import asyncio
import operator
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypedDict

from hivemesh.bench import BenchResult, Metric
from hivemesh.commands import LeaseVoters, SyncMajority

DESCRIPTION = "LangGraph ms/step with MeshCheckpointSaver (3 nodes) vs InMemorySaver"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``hivemesh bench langgraph``."""
    parser.add_argument("--nodes", type=int, default=3, help="swarm size (default 3)")
    parser.add_argument("--steps", type=int, default=10, help="nodes in the graph (default 10)")
    parser.add_argument("--runs", type=int, default=15, help="runs per checkpointer (default 15)")
    parser.add_argument("--max-s", type=float, default=60.0, help="stop after this long")


class _State(TypedDict):
    log: Annotated[list[str], operator.add]


def _graph(steps: int, checkpointer: Any) -> Any:
    from langgraph.graph import END, START, StateGraph

    g = StateGraph(_State)
    prev = START
    for i in range(steps):
        g.add_node(f"n{i}", lambda s, i=i: {"log": [f"n{i}"]})
        g.add_edge(prev, f"n{i}")
        prev = f"n{i}"
    g.add_edge(prev, END)
    return g.compile(checkpointer=checkpointer)


def unfenced_saver_class() -> type:
    """The class of a MeshCheckpointSaver with the no-fork rule taken out (see
    module docs): the naive shared saver, for this bench and the tests."""
    from hivemesh.faces.langgraph import MeshCheckpointSaver

    class UnfencedSaver(MeshCheckpointSaver):
        """MeshCheckpointSaver without the rule (a naive shared saver): no
        lease, no head check, no renewal; each write still waits for a majority."""

        async def _fence(self, thread: str) -> tuple[int, bool]:
            return 0, False

        def _check_head(self, thread: str, ns: str, parent: str | None) -> None:
            return None

        async def _confirm(self, thread: str, token: int, seq: int) -> None:
            await self.node.call(SyncMajority(own_seq=seq, timeout_s=self.sync_timeout_s))

    return UnfencedSaver


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


async def _measure(args: argparse.Namespace, root: str, endpoint: str) -> dict[str, Any]:
    from langgraph.checkpoint.memory import InMemorySaver

    from hivemesh import Node
    from hivemesh.faces.langgraph import MeshCheckpointSaver

    node = Node(Path(root) / "writer", bootstrap=[endpoint], telemetry=False, trust_mode="open")
    async with node:
        await node.wait_peers(args.nodes - 1, timeout_s=30)
        voters = (await node.call(LeaseVoters())).to_wire()["voters"]
        ours = MeshCheckpointSaver(node)
        puts: list[float] = []
        real_put = ours.aput

        async def timed_put(*a: Any, **kw: Any) -> Any:
            t = time.perf_counter()
            try:
                return await real_put(*a, **kw)
            finally:
                puts.append((time.perf_counter() - t) * 1000)

        ours.aput = timed_put  # type: ignore[method-assign]
        savers: dict[str, Any] = {
            "ours": ours,
            "baseline": InMemorySaver(),
            "unfenced": unfenced_saver_class()(node),
        }
        graphs = {k: _graph(args.steps, s) for k, s in savers.items()}
        per_step: dict[str, list[float]] = {k: [] for k in savers}
        stop = time.perf_counter() + args.max_s
        order: list[str] = list(graphs)
        for run in range(-1, args.runs):  # run -1 warms up (lease, imports, caches)
            for k in order[run % 3 :] + order[: run % 3]:
                cfg = {"configurable": {"thread_id": f"{k}-{run}"}}
                t = time.perf_counter()
                out = await graphs[k].ainvoke({"log": []}, cfg, durability="sync")
                ms = (time.perf_counter() - t) * 1000
                if len(out["log"]) != args.steps:
                    raise RuntimeError(f"{k}: the graph ran {len(out['log'])} steps")
                if run >= 0:
                    per_step[k].append(ms / args.steps)
            if run == -1:
                puts.clear()
            if time.perf_counter() > stop:
                break
        await ours.aclose()
        return {"per_step": per_step, "puts": puts, "voters": len(voters)}


def run(args: argparse.Namespace) -> BenchResult:
    """Run the benchmark."""
    from hivemesh.client.swarm import LocalSwarm

    with tempfile.TemporaryDirectory(prefix="hm-bench-lg-") as root, LocalSwarm(root) as swarm:
        first = swarm.start("d0")
        for i in range(1, args.nodes - 1):
            swarm.start(f"d{i}", bootstrap=[first.endpoint])
        got = asyncio.run(_measure(args, root, first.endpoint))
    med: Callable[[str], float] = lambda k: statistics.median(got["per_step"][k])  # noqa: E731
    puts = got["puts"]
    return BenchResult(
        "langgraph",
        [
            Metric(
                "ms per graph step (durability=sync)",
                med("ours"),
                med("baseline"),
                "ms",
                baseline_name="InMemorySaver",
                higher_is_better=False,
            ),
            Metric(
                "ms per step, the rule taken out",
                med("unfenced"),
                med("baseline"),
                "ms",
                baseline_name="InMemorySaver",
                higher_is_better=False,
            ),
        ],
        {
            "swarm": f"{got['voters']} voters on loopback (this process's node writes)",
            "runs x steps": f"{len(got['per_step']['ours'])} x {args.steps}",
            "aput p50 / p99 ms (ours)": f"{_pct(puts, 0.5):.2f} / {_pct(puts, 0.99):.2f}",
            "the rule's cost per step ms (ours - unfenced)": (
                f"{med('ours') - med('unfenced'):.2f}"
            ),
        },
    )
