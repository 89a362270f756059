"""The supervisor: starts an audit and routes its shops in batches.

Theory of operation
-------------------
A :class:`Supervisor` appends ``audit.start`` (the shop list with URLs, the
routes, the market database, the batch size) and then publishes the shops
as ``audit.batch`` events of ``batch_size`` (10 by default). It keeps at
most ``window * batch_size`` published shops unsettled (not done, not
skipped by the operator): the next batch is published as soon as it fits,
so executors work the audit in order, never starve while a slow shop
finishes, and the progress reads per batch. When
every shop is settled it appends ``audit.done``. Only the supervisor that
started an audit may publish its batches (the view ignores anyone else's),
and everything it decides comes from the journal, so a restarted supervisor
continues where its feed left off: without an explicit ``audit_id`` it
takes up the latest unfinished audit its own node started (its shops and
batch size) instead of starting another.
"""

from __future__ import annotations

import asyncio
import secrets
from collections import Counter
from typing import Any

from hivemesh.audit import events as ev
from hivemesh.audit.live import LiveView
from hivemesh.errors import InvalidArgument

__all__ = ["Supervisor"]


class Supervisor:
    """Starts one audit and publishes its batches (see the module docs)."""

    name = "supervisor"

    def __init__(
        self,
        node: Any,
        live: LiveView,
        *,
        shops: list[dict[str, str]],
        routes: list[str],
        market: str,
        batch_size: int = 10,
        window: int = 3,
        audit_id: str | None = None,
    ) -> None:
        if not 1 <= batch_size <= 1000 or not 1 <= window <= 1000:
            raise InvalidArgument("batch_size and window must be 1..1000")
        if not shops:
            raise InvalidArgument("an audit needs at least one shop")
        self.node = node
        self.live = live
        self.shops = shops
        self.routes = routes
        self.market = market
        self.batch_size = batch_size
        self.window = window
        self.audit_id = audit_id or secrets.token_hex(6)
        self._resume = audit_id is None
        self.counters: Counter[str] = Counter()

    def batches(self) -> list[list[str]]:
        """The shop ids, cut into batches."""
        ids = [s["id"] for s in self.shops]
        return [ids[i : i + self.batch_size] for i in range(0, len(ids), self.batch_size)]

    async def start(self) -> str:
        """Append ``audit.start`` (once); the audit id. A restarted supervisor
        continues its node's unfinished audit (module docs)."""
        view = self.live.view
        mine = [
            a
            for a in view.audits.values()
            if a.supervisor == self.node.address and a.finished is None
        ]
        if self._resume and mine and self.audit_id not in view.audits:
            audit = max(mine, key=lambda a: a.hlc)
            self.audit_id = audit.id
            self.shops = [{"id": s, "url": audit.urls[s]} for s in audit.shops]
            self.batch_size = audit.batch_size
            self.counters["resumed"] += 1
        if self.audit_id not in view.audits:
            await self.node.append(
                ev.START,
                {
                    "audit": self.audit_id,
                    "shops": self.shops,
                    "routes": self.routes,
                    "market": self.market,
                    "batch_size": self.batch_size,
                },
            )
        return self.audit_id

    async def step(self) -> bool:
        """Publish what is due; True once the audit is done."""
        view = self.live.view
        audit = view.audits.get(self.audit_id)
        if audit is None:
            return False
        if audit.finished is not None:
            return True
        batches = self.batches()
        unsettled = sum(
            1 for s in audit.published() if s not in audit.done and not view.skipped(audit, s)
        )
        n = len(audit.batches)
        while n < len(batches) and unsettled + len(batches[n]) <= self.window * self.batch_size:
            await self.node.append(ev.BATCH, {"audit": self.audit_id, "n": n, "shops": batches[n]})
            self.counters["batches"] += 1
            unsettled += len(batches[n])
            n += 1
        if len(audit.batches) == len(batches) and view.settled(audit):
            await self.node.append(ev.DONE, {"audit": self.audit_id, "shops": len(audit.done)})
            return True
        return False

    async def run(self, stop: asyncio.Event) -> None:
        """Start the audit and route it until done or ``stop``."""
        await self.start()
        while not stop.is_set():
            if await self.step():
                return
            await self.live.wait(0.5)
