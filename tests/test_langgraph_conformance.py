"""The mesh checkpointer against LangGraph's own conformance suite (PyPI:
``langgraph-checkpoint-conformance``): on a lone node, and on one node of a
three-node swarm (every write then waits for another voter)."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

pytest.importorskip("langgraph.checkpoint.conformance")

from langgraph.checkpoint.conformance import checkpointer_test, validate

from aiotest import run
from hivemesh import Node
from hivemesh.commands import LeaseVoters
from hivemesh.faces.langgraph import MeshCheckpointSaver


@pytest.mark.parametrize("nodes", [1, 3])
def test_conformance_base_and_claimed_extended(nodes: int) -> None:
    async def main() -> None:
        with tempfile.TemporaryDirectory(prefix="hm-lg-") as tmp:
            async with contextlib.AsyncExitStack() as stack:
                opts = {"telemetry": False, "trust_mode": "open"}
                node = await stack.enter_async_context(Node(Path(tmp) / "n0", **opts))
                for i in range(1, nodes):
                    peer = Node(Path(tmp) / f"n{i}", bootstrap=[node.endpoint], **opts)
                    await stack.enter_async_context(peer)
                await node.wait_peers(nodes - 1)
                voters = (await node.call(LeaseVoters())).to_wire()["voters"]
                assert len(voters) == nodes

                @checkpointer_test(name=f"MeshCheckpointSaver/{nodes}")
                async def mesh_saver() -> AsyncIterator[MeshCheckpointSaver]:
                    saver = MeshCheckpointSaver(node)
                    yield saver
                    await saver.aclose()

                report = await validate(mesh_saver)
                report.print_report()
                failures = {k: r.failures for k, r in report.results.items() if r.failures}
                assert report.passed_all_base(), failures
                # every capability the saver claims (base and extended) passes
                assert report.passed_all(), failures

    run(main(), timeout_s=120)
