"""A peer that restarts behind a half-open link is noticed at once (real processes).

Two ``hivemesh up`` processes, A and B (A's address the smaller, so the link
A dials has the best rank of the pair's tie-break). A reaches B only through
a small userspace TCP relay started here (B advertises the relay's endpoint).
Then the relay *freezes* -- it stops forwarding and accepting but never
closes A's socket, as a host that vanished or a NAT that forgot the mapping --
and B is killed with SIGKILL: A's link is half-open, nothing will ever end it.
B restarts on the same data dir (same identity) and dials A directly.

With boot ids, A sees a new life of B in the handshake and replaces the
half-open link at once, and B's writes reach A within moments. Without them,
B's fresh channel lost the tie-break to the half-open link again and again,
until SWIM declared B down and the link was dropped as silent.

Membership probes at the production default (every 1 s) with suspicion x30
(the default is x4): a process start takes 3-5 s on a loaded test machine,
and has been seen to take 10 s under a full CI run (x8 was not enough),
and the detection window must stay clearly longer than that, or the failure
detector would drop the half-open link before the restarted B is even up to
dial, and the test could not tell the two mechanisms apart. It checks that
the failure detector played no part (B never went down at A).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hivemesh.client.swarm import LocalSwarm, wait_until
from hivemesh.stores.keyfile import load_or_create_identity

HOST = "127.0.0.1"
#: Membership probes at the production default, a longer suspicion (module
#: docs); dialling stays quick.
SWIM = {
    "HIVEMESH_PROBE_INTERVAL_MS": "1000",
    "HIVEMESH_PROBE_TIMEOUT_MS": "500",
    "HIVEMESH_SUSPICION_MULT": "30",
}
#: "At once": a bound far below both the SWIM detection time and the
#: slow-peer timeout (both checked against the figures the node reports).
AT_ONCE_S = 2.5


class Relay:
    """A userspace TCP relay on loopback, run on its own event loop in a thread.

    :meth:`freeze` stops it dead: no more forwarding or accepting, and no
    socket is closed, so the dialler's side stays half-open (its writes sit in
    kernel buffers; it sees no FIN and no reset) until :meth:`close`.
    """

    def __init__(self) -> None:
        self.target_port = 0
        self.frozen = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._transports: list[asyncio.WriteTransport] = []
        self.port = 0

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    def start(self) -> int:
        self._thread.start()
        self._server = self._call(asyncio.start_server(self._handle, HOST, 0))
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._transports.append(writer.transport)
        if self.frozen or not self.target_port:
            return  # held open, never answered
        try:
            up_reader, up_writer = await asyncio.open_connection(HOST, self.target_port)
        except OSError:
            writer.close()
            return
        self._transports.append(up_writer.transport)
        await asyncio.gather(
            self._pipe(reader, up_writer), self._pipe(up_reader, writer), return_exceptions=True
        )

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            data = await reader.read(65536)
            if self.frozen:
                return  # swallow it; never close the other side
            if not data:
                writer.close()
                return
            writer.write(data)
            await writer.drain()

    async def _freeze(self) -> None:
        self.frozen = True
        assert self._server is not None
        self._server.close()  # no new connections (the sockets already open stay)
        for transport in self._transports:
            if isinstance(transport, asyncio.ReadTransport) and not transport.is_closing():
                transport.pause_reading()

    def freeze(self) -> None:
        self._call(self._freeze())

    async def _close(self) -> None:
        for transport in self._transports:
            transport.abort()
        if self._server is not None:
            self._server.close()

    def close(self) -> None:
        if self._thread.is_alive():
            with contextlib.suppress(Exception):
                self._call(self._close())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        if not self._thread.is_alive():
            self._loop.close()


@pytest.fixture
def relay() -> Iterator[Relay]:
    r = Relay()
    r.start()
    try:
        yield r
    finally:
        r.close()  # after the swarm (fixtures end in reverse order)


@pytest.fixture
def swarm(tmp_path: Path, relay: Relay) -> Iterator[LocalSwarm]:
    with LocalSwarm(tmp_path, env=SWIM) as s:
        yield s


def _ordered_labels(root: Path) -> tuple[str, str]:
    """Create two identities; return (label of the smaller address, the other)."""
    first = load_or_create_identity(root / "n1").address
    second = load_or_create_identity(root / "n2").address
    return ("n1", "n2") if first < second else ("n2", "n1")


def _link(swarm: LocalSwarm, observer: str, subject: str) -> dict[str, Any] | None:
    rows = swarm.nodes[observer].client.call("peers")
    rows = rows["peers"] if isinstance(rows, dict) else rows
    for row in rows:
        if row["address"] == swarm.nodes[subject].address:
            channel: dict[str, Any] | None = row["channel"]
            return channel
    return None


def _sees(swarm: LocalSwarm, label: str, key: str, value: str) -> bool:
    got = swarm.nodes[label].client.ctx_get("default", key)
    return bool(got["found"] and got["value"] == value)


def test_a_restart_behind_a_half_open_link_is_noticed_at_once(
    swarm: LocalSwarm, relay: Relay
) -> None:
    a, b = _ordered_labels(swarm.root)
    nb = swarm.start(b, extra_args=["--advertise", f"{HOST}:{relay.port}"])
    relay.target_port = nb.port
    na = swarm.start(a, bootstrap=[f"{nb.address}@{HOST}:{relay.port}"])

    def via_relay() -> dict[str, Any] | None:
        ch = _link(swarm, a, b)
        return ch if ch and ch["endpoint"] == f"{HOST}:{relay.port}" else None

    old = wait_until(via_relay, 20, what="A's link to B runs through the relay")
    nb.client.ctx_set("default", "before", "1")
    wait_until(lambda: _sees(swarm, a, "before", "1"), 10, what="B's write reaches A")
    status_a = na.client.status()
    detection_s = status_a["detection_bound_ms"] / 1000

    relay.freeze()
    swarm.kill(b, signal.SIGKILL)  # B is gone; A's socket to the relay stays open
    killed = time.monotonic()
    nb.bootstrap = [f"{na.address}@{na.endpoint}"]
    swarm.restart(b)  # same identity, a new boot id; it dials A directly
    ready = time.monotonic()

    def replaced() -> dict[str, Any] | None:
        ch = _link(swarm, a, b)
        return ch if ch and ch["channel_id"] != old["channel_id"] else None

    link = wait_until(replaced, 30, what="A replaces the half-open link", interval_s=0.02)
    linked = time.monotonic()
    nb.client.ctx_set("default", "after", "2")
    wait_until(lambda: _sees(swarm, a, "after", "2"), 30, what="B's new write reaches A")
    written = time.monotonic()
    print(
        f"restart ready {ready - killed:.2f}s after the kill; link replaced "
        f"{linked - ready:.3f}s after B was ready; B's write at A {written - linked:.3f}s "
        f"later; SWIM detection bound {detection_s:.1f}s, slow-peer timeout 10s"
    )
    assert linked - ready < AT_ONCE_S < min(detection_s, 10.0) / 2
    assert written - linked < AT_ONCE_S
    assert link["boot_id"] == nb.client.status()["boot_id"] and link["direction"] == "in"
    counters = na.client.status()["counters"]
    assert counters["peer_restarted"] == 1
    # not the failure detector's doing: B never went down at A
    assert counters.get("member_down", 0) == 0
    assert counters.get("dropped_silent_link", 0) == 0
