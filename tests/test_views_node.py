"""Views wired into real core nodes over an in-memory link (runs once merged with the node)."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest

node_mod = pytest.importorskip("hivemesh.core.node")
frames_mod = pytest.importorskip("hivemesh.core.frames")

from hivemesh.core.identity import Identity  # noqa: E402
from hivemesh.core.store import MemoryStore  # noqa: E402
from hivemesh.core.views import (  # noqa: E402
    BlobIndex,
    ContextView,
    MaxRegisterView,
    NamesView,
    standard_views,
)
from hivemesh.core.views.blobs import (  # noqa: E402
    BLOB_TAGS,
    TAG_GET,
    TAG_WANT,
    BlobFetcher,
    blob_digest,
    serve,
)

encode_frame = frames_mod.encode_frame


class Cluster:
    def __init__(self, n: int) -> None:
        self.ids = [Identity.from_seed(bytes([i + 1]) * 32) for i in range(n)]
        self.nodes: list[Any] = []
        self.views: list[list[Any]] = []
        self.stores: list[dict[bytes, bytes]] = [{} for _ in range(n)]
        self.fetchers = [BlobFetcher(random.Random(100 + i)) for i in range(n)]
        for i, ident in enumerate(self.ids):
            node = node_mod.Node(ident, MemoryStore(), random.Random(i), now_ms=0)
            vs = standard_views(ident.public)
            for v in vs:
                node.add_view(v)
            for t in BLOB_TAGS:
                node.register_handler(t, self._blob_handler(i, t))
            self.nodes.append(node)
            self.views.append(vs)
        for a in self.nodes:
            for b in self.nodes:
                if a is not b:
                    a.add_peer(b.address)
        self.by_addr = {n.address: n for n in self.nodes}
        self.now = 1_000

    def _blob_handler(self, i: int, t: int) -> Any:
        def handle(peer: str, fields: list[Any], now_ms: int) -> None:
            frame = [t, *fields]
            if t in (TAG_WANT, TAG_GET):
                reply = serve(frame, self.stores[i].get)
                if reply is not None:
                    self.nodes[i].send(peer, encode_frame(reply[0], *reply[1:]))
            else:
                self.fetchers[i].receive(peer, frame, now_ms)

        return handle

    def ctx(self, i: int) -> ContextView:
        view = self.views[i][0]
        assert isinstance(view, ContextView)
        return view

    def publish(self, i: int) -> None:
        while (u := self.ctx(i).pending_update()) is not None:
            self.nodes[i].append(u[0], u[1], self.now)

    def settle(self, max_rounds: int = 500) -> None:
        for _ in range(max_rounds):
            moved = False
            for i, node in enumerate(self.nodes):
                for peer, frame in self.fetchers[i].outbox():
                    for p in node.peers() if peer is None else [peer]:
                        node.send(p, encode_frame(frame[0], *frame[1:]))
                for peer, raw in node.outbox():
                    moved = True
                    self.by_addr[peer].receive(node.address, raw, self.now)
            self.now += 10
            for i, node in enumerate(self.nodes):
                node.handle_timer(self.now)
                deadline = self.fetchers[i].next_deadline()
                if deadline is not None and deadline <= self.now:
                    self.fetchers[i].handle_timer(self.now)
            if not moved and not any(f.active() for f in self.fetchers):
                return
        raise AssertionError("cluster did not settle")


def test_views_agree_across_nodes_and_blobs_fetch() -> None:
    c = Cluster(3)
    ctx0 = c.ctx(0).context("task-1")
    ctx0["status"] = "running"
    ctx0.list("chat").append("hi from 0")
    c.ctx(1).context("task-1").counter("steps").add(2)
    c.publish(0)
    c.publish(1)
    c.nodes[2].append(*NamesView.claim("metrics-collector"), c.now)
    c.nodes[0].append(*MaxRegisterView.encode("lease/browser", 5), c.now)
    data = random.Random(1).randbytes(3 * 1024 * 1024 + 7)
    c.stores[1][blob_digest(data)] = data
    c.nodes[1].append(*BlobIndex.encode_put(data, "image/png", "shot-1"), c.now)
    c.settle()

    digests = {tuple(v.digest() for v in vs) for vs in c.views}
    assert len(digests) == 1
    assert sum((v.rejected for vs in c.views for v in vs), Counter()) == Counter()
    snap = c.ctx(2).snapshot()["task-1"]
    assert snap == {
        "kv": {"status": "running"},
        "list": {"chat": ["hi from 0"]},
        "counter": {"steps": 2},
    }
    names, regs, index = c.views[0][2], c.views[1][1], c.views[2][3]
    assert names.resolve("metrics-collector") == c.ids[2].address
    assert regs.value("lease/browser") == 5

    h = index.by_name("shot-1")
    assert h == blob_digest(data) and index.holders(h) == [c.ids[1].address]
    assert c.fetchers[2].want(h, c.now, sources=index.holders(h))
    c.settle()
    assert c.fetchers[2].completed() == [(h, data)]
