"""A LangGraph worker on its own in-process hivemesh node (tests/test_e2e_langgraph.py).

Usage: ``python lg_worker.py DATA_DIR BOOTSTRAP PEERS [--naive]``. It starts a
node, waits for ``PEERS`` other members, fixes the lease voter set, prints
``{"ev": "ready", ...}`` and then obeys lines on stdin:

* ``run THREAD`` -- run the graph from the start on ``THREAD``;
* ``resume THREAD`` -- continue ``THREAD`` from its last checkpoint;
* ``report THREAD`` -- catch up with a majority, print the thread's checkpoints
  and the forks the chain view sees;
* ``quit``.

Every outcome is one JSON line on stdout. The graph: ``STEPS`` nodes in a
line, each sleeps ``STEP_S`` and appends its name (and this worker's
address) to the state. ``--naive`` uses a saver with the fencing taken out
(:func:`hivemesh.bench.langgraph.unfenced_saver_class`: no lease, no head
check, no renewal): the shared-database checkpointer whose writers both succeed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import operator
import sys
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph

from hivemesh import Node
from hivemesh.bench.langgraph import unfenced_saver_class
from hivemesh.commands import LeaseVoters, SyncMajority
from hivemesh.errors import HivemeshError
from hivemesh.faces.langgraph import MeshCheckpointSaver

STEPS = 6
STEP_S = 0.4


class State(TypedDict):
    steps: Annotated[list[str], operator.add]
    by: Annotated[list[str], operator.add]


def emit(doc: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()


def build(me: str) -> Any:
    g = StateGraph(State)
    prev = START
    for i in range(1, STEPS + 1):
        name = f"s{i}"

        async def step(state: State, name: str = name) -> dict[str, list[str]]:
            emit({"ev": "running", "step": name})
            await asyncio.sleep(STEP_S)
            return {"steps": [name], "by": [me]}

        g.add_node(name, step)
        g.add_edge(prev, name)
        prev = name
    g.add_edge(prev, END)
    return g


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("data_dir")
    ap.add_argument("bootstrap")
    ap.add_argument("peers", type=int)
    ap.add_argument("--naive", action="store_true")
    args = ap.parse_args()
    async with Node(args.data_dir, bootstrap=[args.bootstrap], telemetry=False) as node:
        await node.wait_peers(args.peers, timeout_s=30)
        # the swarm is formed: fix the voter set now (every worker sees all members)
        voters = (await node.call(LeaseVoters())).to_wire()["voters"]
        cls = unfenced_saver_class() if args.naive else MeshCheckpointSaver
        saver = cls(node, lease_ttl_ms=3000, lease_wait_s=10.0)
        graph = build(node.address).compile(checkpointer=saver)
        emit({"ev": "ready", "address": node.address, "voters": voters, "holder": saver.holder})
        loop = asyncio.get_running_loop()
        while True:
            line = (await loop.run_in_executor(None, sys.stdin.readline)).split()
            if not line or line[0] == "quit":
                break
            cmd, thread = line[0], line[1]
            cfg: Any = {"configurable": {"thread_id": thread}}
            try:
                if cmd == "report":
                    await node.call(SyncMajority(pull=True, timeout_s=10))
                    recs = saver.view.checkpoints(thread, "")
                    emit(
                        {
                            "ev": "report",
                            "checkpoints": [
                                [r.checkpoint_id, r.parent_id, r.holder, r.token] for r in recs
                            ],
                            "forks": saver.view.forks(thread),
                        }
                    )
                    continue
                if cmd == "race":  # both racers start at once: no waiting for the other
                    saver.lease_wait_s = 0.0
                start = None if cmd == "resume" else {"steps": [], "by": []}
                state = await graph.ainvoke(start, cfg, durability="sync")
                emit({"ev": "done", "state": state})
            except HivemeshError as e:
                emit({"ev": "error", "code": e.code, "message": str(e)})
        await saver.aclose()


if __name__ == "__main__":
    asyncio.run(main())
