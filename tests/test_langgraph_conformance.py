"""The mesh checkpointer against LangGraph's own conformance suite (PyPI:
``langgraph-checkpoint-conformance``), on a real node."""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

pytest.importorskip("langgraph.checkpoint.conformance")

from langgraph.checkpoint.conformance import checkpointer_test, validate

from aiotest import run
from hivemesh import Node
from hivemesh.faces.langgraph import MeshCheckpointSaver


def test_conformance_base_and_claimed_extended() -> None:
    async def main() -> None:
        with tempfile.TemporaryDirectory(prefix="hm-lg-") as tmp:
            async with Node(Path(tmp) / "n", telemetry=False) as node:

                @checkpointer_test(name="MeshCheckpointSaver")
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
