"""Regression tests for what the chaos campaigns found (root not needed).

* ``audit`` scenario, seed 2 (2026-12-02): the supervisor killed with
  ``kill -9`` and restarted started a *second* audit (a fresh random id)
  instead of continuing its own: every shop was audited again (17 shops
  submitted twice to the market) and the first audit never finished. A
  restarted supervisor now takes up its node's unfinished audit.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from hivemesh import Node
from hivemesh.audit import events as ev
from hivemesh.audit.live import LiveView
from hivemesh.roles.supervisor import Supervisor

SHOPS = [{"id": f"s{i}", "url": f"http://127.0.0.1:1/s{i}/"} for i in range(5)]


def _supervisor(node: Node, live: LiveView, shops: list[dict[str, str]]) -> Supervisor:
    return Supervisor(node, live, shops=shops, routes=["direct"], market="m", batch_size=2)


async def _wait(cond: object, what: str, timeout_s: float = 10.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not cond():  # type: ignore[operator]
            await asyncio.sleep(0.02)


def test_a_restarted_supervisor_continues_its_audit_instead_of_starting_another(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        async with Node(tmp_path, trust_mode="open") as node:
            live = LiveView.attach(node)
            first = await _supervisor(node, live, SHOPS).start()
            await _wait(lambda: first in live.view.audits, "the audit in the view")
        async with Node(tmp_path, trust_mode="open") as node:  # the restart
            live = LiveView.attach(node)
            again = _supervisor(node, live, SHOPS[::-1])  # even with another order
            assert await again.start() == first
            assert [s["id"] for s in again.shops] == [s["id"] for s in SHOPS]
            assert again.counters["resumed"] == 1 and len(live.view.audits) == 1
            await node.append(ev.DONE, {"audit": first, "shops": 0})
            await _wait(lambda: live.view.audits[first].finished is not None, "done")
            fresh = await _supervisor(node, live, SHOPS).start()  # a finished one stays done
            assert fresh != first
            await _wait(lambda: len(live.view.audits) == 2, "a second audit")
            explicit = Supervisor(node, live, shops=SHOPS, routes=["direct"], market="m",
                                  audit_id="given")  # fmt: skip
            assert await explicit.start() == "given"

    asyncio.run(scenario())
