"""Regression tests for what the chaos campaigns found (root not needed).

* ``audit`` scenario, seed 2 (2026-12-02): the supervisor killed with
  ``kill -9`` and restarted started a *second* audit (a fresh random id)
  instead of continuing its own: every shop was audited again (17 shops
  submitted twice to the market) and the first audit never finished. A
  restarted supervisor now takes up its node's unfinished audit.
* ``nat`` scenario, seed 600 (2026-12-02): the relay node killed and
  restarted; the nodes behind NATs reconnected to it over TCP but their
  relay client never re-opened its relay channel (nor reserved again), so
  no NATed node could reach another one for good (60 s after the heal: no
  link n1-n2, n1-n3, n2-n3; the writes still converged through n0). The
  traversal now re-opens an ended relay channel every few seconds.
* ``nat`` scenario, seed 700: n3 restarted while partitioned from the relay:
  its relay was dropped after the failed first dial and never tried again
  (no link n3-n1, n3-n2 60 s after the heal). A relay that could not be
  reached at the start is now kept and tried again like an ended one.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from hivemesh import Node
from hivemesh.audit import events as ev
from hivemesh.audit.live import LiveView
from hivemesh.core.identity import Identity
from hivemesh.errors import HivemeshError
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


@pytest.mark.parametrize("relay_down_at_start", [False, True])
def test_a_relay_client_reserves_again_once_its_relay_restarted(relay_down_at_start: bool) -> None:
    quic = pytest.importorskip("hivemesh.transports.quic", reason="aioquic is not installed")
    from hivemesh.transports.relay import RelayClient, RelayService
    from hivemesh.transports.traversal import Traversal

    a_id, b_id, c_id = (Identity.from_seed(bytes([i]) * 32) for i in (1, 2, 3))
    host = "127.0.0.1"

    async def ignore(ch: object) -> None:
        return None

    async def relay_at(port: int) -> Any:
        return await quic.QuicEndpoint.open(
            host, port, c_id, authorize=lambda a: True, on_channel=ignore,
            on_relay_channel=RelayService().handle,
        )  # fmt: skip

    async def scenario() -> None:
        relay = await relay_at(0)
        port = relay.port
        inbound: list[object] = []

        async def adopt(ch: object) -> None:
            inbound.append(ch)

        b_ep = await quic.QuicEndpoint.open(host, 0, b_id, authorize=lambda a: True,
                                            on_channel=adopt)  # fmt: skip
        a_ep = await quic.QuicEndpoint.open(host, 0, a_id, authorize=lambda a: True,
                                            on_channel=ignore)  # fmt: skip
        trav = Traversal(b_ep, b_id, authorize=lambda a: True, on_inbound=adopt,
                         on_outbound=adopt, has_direct=lambda p: False)  # fmt: skip
        trav.upgrades.revive_s = 0.2
        try:
            if relay_down_at_start:
                relay.close()
                with pytest.raises((HivemeshError, OSError, TimeoutError)):
                    await trav.add_relay(c_id.address, host, port)
                client = trav.relays[c_id.address]  # kept, to be tried again
            else:
                client = await trav.add_relay(c_id.address, host, port)
                assert client.is_up and client.reserved
                relay.close()
                await _wait(lambda: not client.is_up, "the relay channel ended")
            relay = await relay_at(port)  # the relay (re)started, nothing reserved on it
            for _ in range(200):  # the daemon ticks once a second; here faster
                trav.tick()
                if client.is_up and client.reserved:
                    break
                await asyncio.sleep(0.05)
            assert client.is_up and client.reserved
            assert trav.counters.snapshot().get("relay_revived", 0) >= 1
            a = RelayClient(a_ep, a_id, c_id.address, (host, port), authorize=lambda x: True,
                            on_channel=ignore)  # fmt: skip
            await a.start(reserve=False)
            ch, _ = await a.open(b_id.address, timeout_s=5.0)  # b is reachable again
            assert ch.peer_address == b_id.address
            a.close()
        finally:
            trav.close()
            for ep in (a_ep, b_ep, relay):
                ep.close()

    asyncio.run(scenario())
