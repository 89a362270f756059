"""The daemon's start ends with a GC freeze: a fresh node collects only the young
generations first (a full collection cost 25-75 ms before a late joiner's first
event), a node that restored or replayed views collects fully."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest

import hivemesh
import hivemesh.runtime.daemon as daemon_mod
from aiotest import run


class _GcSpy:
    """Stands in for the ``gc`` module inside runtime.daemon: records, then delegates."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def collect(self, *args: Any) -> int:
        self.calls.append(("collect", args))
        return gc.collect(*args)

    def freeze(self) -> None:
        self.calls.append(("freeze", ()))
        gc.freeze()

    def __getattr__(self, name: str) -> Any:
        return getattr(gc, name)


def test_fresh_node_collects_young_generations_restarted_node_collects_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = _GcSpy()
    monkeypatch.setattr(daemon_mod, "gc", spy)

    async def start_stop() -> list[tuple[str, tuple[Any, ...]]]:
        spy.calls.clear()
        async with hivemesh.Node(tmp_path / "n", trust_mode="open"):
            return list(spy.calls)

    async def main() -> None:
        fresh = await start_stop()  # an empty store
        assert fresh == [("collect", (1,)), ("freeze", ())]
        again = await start_stop()  # its own start events are stored now
        assert again == [("collect", (2,)), ("freeze", ())]

    try:
        run(main())
    finally:
        gc.unfreeze()
