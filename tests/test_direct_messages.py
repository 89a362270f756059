"""Acknowledged direct messages over a seeded lossy in-memory network."""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable

import pytest

from hivemesh.core.direct import Direct, DirectAcked, DirectConfig, DirectFailed
from hivemesh.core.frames import FrameType, encode_frame
from hivemesh.core.identity import Identity
from hivemesh.core.node import Node
from hivemesh.core.store import MemoryStore
from hivemesh.errors import InvalidArgument, QueueFull

FAR = 10**12


class Net:
    """Nodes with Direct attached; timed delivery with seeded loss and delay."""

    def __init__(
        self,
        seed: int,
        n: int,
        *,
        loss: float = 0.0,
        cfg: DirectConfig | None = None,
        admit: dict[int, Callable[[str], bool]] | None = None,
    ):
        self.rng = random.Random(f"{seed}/net")
        self.loss = loss
        self.now = 0
        self.heap: list[tuple[int, int, str, str, bytes]] = []
        self.order = 0
        self.down: set[str] = set()
        self.nodes: list[Node] = []
        self.directs: dict[str, Direct] = {}
        for i in range(1, n + 1):
            node = Node(
                Identity.from_seed(bytes([i]) * 32),
                MemoryStore(),
                random.Random(f"{seed}/{i}"),
                now_ms=0,
            )
            self.nodes.append(node)
            self.directs[node.address] = Direct(
                node, random.Random(f"{seed}/{i}/d"), cfg, admit=(admit or {}).get(i - 1)
            )

    def link(self, a: int, b: int) -> None:
        self.nodes[a].add_peer(self.nodes[b].address)
        self.nodes[b].add_peer(self.nodes[a].address)

    def d(self, i: int) -> Direct:
        return self.directs[self.nodes[i].address]

    def run(self, duration_ms: int) -> None:
        end = self.now + duration_ms
        for _ in range(1_000_000):
            for node in self.nodes:
                for dst, frame in node.outbox():
                    if self.rng.random() >= self.loss:
                        self.order += 1
                        t = self.now + 1 + self.rng.randrange(20)
                        heapq.heappush(self.heap, (t, self.order, node.address, dst, frame))
            times = [self.heap[0][0]] if self.heap else []
            for d in self.directs.values():
                dl = d.next_deadline()
                if dl is not None and d.pending():
                    times.append(dl)
            t = min(times, default=FAR)
            if t > end:
                self.now = end
                return
            self.now = max(self.now, t)
            by_addr = {n.address: n for n in self.nodes}
            while self.heap and self.heap[0][0] <= self.now:
                _, _, src, dst, frame = heapq.heappop(self.heap)
                if dst in by_addr and src not in self.down and dst not in self.down:
                    by_addr[dst].receive(src, frame, self.now)
            for a in sorted(self.directs):
                d = self.directs[a]
                dl = d.next_deadline()
                if a not in self.down and dl is not None and dl <= self.now:
                    d.handle_timer(self.now)
        raise AssertionError("did not finish")


def test_every_message_delivered_once_and_acked_under_loss() -> None:
    net = Net(1, 2, loss=0.3)
    net.link(0, 1)
    a, b = net.d(0), net.d(1)
    ids = [a.send(b.address, {"i": i}, net.now) for i in range(200)]
    net.run(60_000)
    results = a.results()
    assert sorted(r.msg_id for r in results) == sorted(ids)
    assert all(isinstance(r, DirectAcked) for r in results)
    got = b.drain_inbox()
    assert sorted(m.data["i"] for m in got) == list(range(200))
    assert {m.sender for m in got} == {a.address}
    assert a.counters["retransmits"] > 0 and b.counters["duplicate"] > 0
    assert b.inbox() == []


def test_relay_through_a_common_peer() -> None:
    net = Net(2, 3)
    net.link(0, 1)
    net.link(1, 2)  # 0 and 2 are not peers
    a, relay, c = net.d(0), net.d(1), net.d(2)
    msg_id = a.send(c.address, "over the hill", net.now)
    net.run(5_000)
    [res] = a.results()
    assert isinstance(res, DirectAcked) and res.msg_id == msg_id
    [msg] = c.drain_inbox()
    assert (msg.sender, msg.data, msg.relayed_by) == (a.address, "over the hill", relay.address)
    assert relay.counters["relayed"] == 2  # the message and its ack
    assert relay.inbox() == []


def test_no_second_hop() -> None:
    net = Net(3, 4)
    net.link(0, 1)
    net.link(1, 2)
    net.link(2, 3)
    a = net.d(0)
    a.send(net.nodes[3].address, 1, net.now, deadline_ms=3000)
    net.run(5_000)
    [res] = a.results()
    assert isinstance(res, DirectFailed) and res.reason == "deadline"
    assert net.d(1).counters["unroutable"] >= 1
    assert net.d(3).inbox() == []


def test_unreachable_fails_with_no_route_and_backoff() -> None:
    cfg = DirectConfig(retry_initial_ms=100, retry_max_ms=800, deadline_ms=5000)
    net = Net(4, 2, cfg=cfg)
    a, b = net.d(0), net.d(1)
    a.send(b.address, "x", net.now)
    net.run(10_000)
    [res] = a.results()
    assert isinstance(res, DirectFailed) and res.reason == "no_route"
    # 0, 100, 300, 700, 1500, 2300, ...: backoff doubles to 800 then stays.
    assert res.attempts == 1 + 3 + (5000 - 1500) // 800 + 1
    assert res.at_ms == 5000


def test_crashed_peer_fails_with_deadline() -> None:
    net = Net(5, 2, cfg=DirectConfig(deadline_ms=2000))
    net.link(0, 1)
    net.down.add(net.nodes[1].address)
    net.d(0).send(net.nodes[1].address, "x", net.now)
    net.run(3_000)
    [res] = net.d(0).results()
    assert isinstance(res, DirectFailed) and res.reason == "deadline" and res.attempts > 2


def test_a_link_coming_up_resends_at_once_what_waited_for_it() -> None:
    """A peer that restarted behind a half-open link: messages sent into the
    dead link back off to retry_max_ms; its new link resends them at once."""
    cfg = DirectConfig(retry_initial_ms=100, retry_max_ms=4000, deadline_ms=30_000)
    net = Net(9, 4, cfg=cfg)
    net.link(0, 1)
    a, b, c, d = net.d(0), net.nodes[1].address, net.nodes[2].address, net.nodes[3].address
    net.down.add(b)  # half-open: frames vanish, nothing says so
    net.link(1, 2)
    a.send(b, "for b", net.now)
    a.send(c, "for c, relayed by b", net.now)
    net.run(5_000)  # retries at 100, 300, 700, 1500, 3100: the next at 6300
    assert a.results() == [] and a.pending() == 2
    net.down.discard(b)  # b is back (its new life's link is up)
    assert a.link_up(d, net.now) == 0  # neither is for d or went through it
    assert a.link_up(b, net.now) == 2  # b's, and the one b relays
    assert a.counters["resent_on_link_up"] == 2
    net.run(200)  # well before the backoff's next retry
    assert sorted(r.to for r in a.results() if isinstance(r, DirectAcked)) == sorted([b, c])
    assert a.link_up(b, net.now) == 0  # nothing left to resend
    net.nodes[0].remove_peer(b)  # a has no peer left
    a.send(c, "no route at all", net.now)
    net.run(1_000)
    assert a.pending() == 1
    assert a.link_up(d, net.now) == 1  # it had no route: any new link may carry it


def test_full_inbox_is_backpressure_not_loss() -> None:
    net = Net(6, 2, cfg=DirectConfig(inbox_capacity=2))
    net.link(0, 1)
    a, b = net.d(0), net.d(1)
    for i in range(5):
        a.send(b.address, i, net.now)
    net.run(2_000)
    assert len(b.inbox()) == 2 and b.counters["inbox_full"] > 0
    assert len(a.results()) == 2 and a.pending() == 3
    got = [m.data for m in b.drain_inbox()]
    for _ in range(3):
        net.run(5_000)
        got += [m.data for m in b.drain_inbox()]
    assert sorted(got) == list(range(5))
    assert a.pending() == 0


def test_ack_when_stored_waits_for_the_application() -> None:
    net = Net(7, 2, cfg=DirectConfig(ack_when_stored=True, retry_initial_ms=50))
    net.link(0, 1)
    a, b = net.d(0), net.d(1)
    first, second = a.send(b.address, "one", net.now), a.send(b.address, "two", net.now)
    net.run(1_000)  # received and retransmitted, not stored: no ack, no second copy
    assert sorted(m.data for m in b.inbox()) == ["one", "two"] and a.results() == []
    assert b.counters["duplicate_unstored"] > 0
    taken = sorted(b.drain_inbox(), key=lambda m: m.data)
    b.stored(taken[:1])  # "one" is durable; storing "two" failed
    b.release(taken[1:])
    net.run(1_000)
    assert [r.msg_id for r in a.results()] == [first] and a.pending() == 1
    again = b.drain_inbox()  # the retransmission of "two", taken as new
    assert [m.data for m in again] == ["two"]
    b.stored(again)
    net.run(1_000)
    assert [r.msg_id for r in a.results()] == [second] and a.pending() == 0


def test_send_limits() -> None:
    net = Net(7, 2, cfg=DirectConfig(max_pending=2, max_data_bytes=100))
    a, b = net.d(0), net.d(1)
    with pytest.raises(InvalidArgument):
        a.send(b.address, "x" * 200, 0)
    with pytest.raises(InvalidArgument):
        a.send("hmnope", 1, 0)
    with pytest.raises(InvalidArgument):
        a.send(a.address, 1, 0)
    with pytest.raises(InvalidArgument):
        a.send(b.address, {1, 2}, 0)
    a.send(b.address, 1, 0)
    a.send(b.address, 2, 0)
    with pytest.raises(QueueFull):
        a.send(b.address, 3, 0)


def test_ids_are_deterministic_and_unique() -> None:
    ids1 = [Net(8, 2).d(0).send(Net(8, 2).nodes[1].address, i, 0) for i in range(1)]
    ids2 = [Net(8, 2).d(0).send(Net(8, 2).nodes[1].address, i, 0) for i in range(1)]
    assert ids1 == ids2
    net = Net(8, 2)
    ids = [net.d(0).send(net.nodes[1].address, i, 0) for i in range(50)]
    assert len(set(ids)) == 50
    other = Net(9, 2)
    assert other.d(0).send(other.nodes[1].address, 0, 0) != ids[0]


@pytest.mark.parametrize(
    "fields",
    [
        (FrameType.DIRECT, "id", "hmx", "hmy", 1, 0),
        (FrameType.DIRECT, 5, None, None, 1, 0),
        (FrameType.DIRECT_ACK, "id"),
        (FrameType.DIRECT_ACK, "x" * 100, "a", "b", 0),
    ],
)
def test_garbage_is_counted(fields: tuple[object, ...]) -> None:
    net = Net(10, 2)
    net.link(0, 1)
    net.nodes[1].receive(net.nodes[0].address, encode_frame(*fields), 0)
    assert net.nodes[1].counters["malformed"] == 1
    assert net.d(1).inbox() == []


def test_forged_sender_is_refused_without_relaying() -> None:
    net = Net(11, 3, cfg=DirectConfig(max_hops=0))
    net.link(0, 1)
    x, y, z = (n.address for n in net.nodes)
    net.nodes[1].receive(x, encode_frame(FrameType.DIRECT, "1-1", z, y, "hi", 0), 0)
    assert net.nodes[1].counters["forged_sender"] == 1
    assert net.d(1).inbox() == []


def test_a_relay_cannot_forge_a_sender() -> None:
    """A relayed message must carry the claimed sender's signature."""
    net = Net(12, 3)
    net.link(0, 1)
    net.link(1, 2)
    x, relay, z = (n.address for n in net.nodes)
    # the relay (node 1) claims node 0 sent something to node 2: unsigned ...
    net.nodes[2].receive(relay, encode_frame(FrameType.DIRECT, "1-1", x, z, "pay me", 1), 0)
    # ... or signed by the relay itself
    forged = net.nodes[1].identity.sign(b"hivemesh/direct/v1")
    frame = encode_frame(FrameType.DIRECT, "1-2", x, z, "pay me", 1, forged)
    net.nodes[2].receive(relay, frame, 0)
    assert net.nodes[2].counters["forged_sender"] == 2
    assert net.d(2).inbox() == []


def test_a_relay_cannot_alter_a_signed_message() -> None:
    net = Net(13, 3)
    net.link(0, 1)
    net.link(1, 2)
    a, c = net.d(0), net.d(2)
    a.send(c.address, "original", 0)
    frames = net.nodes[0].outbox()
    assert len(frames) == 1 and frames[0][0] == net.nodes[1].address
    tampered = frames[0][1].replace(b"original", b"tampered")
    net.nodes[1].receive(net.nodes[0].address, tampered, 0)
    for _dst, frame in net.nodes[1].outbox():
        net.nodes[2].receive(net.nodes[1].address, frame, 1)
    assert net.nodes[2].counters["forged_sender"] == 1
    assert c.inbox() == []


def test_a_relay_cannot_fake_an_acknowledgement() -> None:
    net = Net(14, 3)
    net.link(0, 1)
    net.link(1, 2)
    a, c = net.d(0), net.d(2)
    msg_id = a.send(c.address, "hello", 0)
    net.nodes[0].outbox()  # the relay swallows the message ...
    fake = encode_frame(FrameType.DIRECT_ACK, msg_id, a.address, c.address, 0)
    net.nodes[0].receive(net.nodes[1].address, fake, 1)  # ... and acks it itself
    assert net.nodes[0].counters["forged_sender"] == 1
    assert a.results() == [] and a.pending() == 1


def test_a_relayed_message_from_a_sender_we_do_not_admit_is_refused() -> None:
    """The relay is a member of two swarms: the destination admits the relay,
    not the sender behind it (a node of the relay's other swarm)."""
    stranger = Identity.from_seed(bytes([1]) * 32).address  # node 0
    net = Net(14, 3, admit={2: lambda a: a != stranger})
    net.link(0, 1)
    net.link(1, 2)
    z = net.nodes[2].address
    net.d(0).send(z, "hello from the other swarm", 0)
    net.run(2000)
    assert net.d(2).inbox() == []
    assert net.nodes[2].counters["untrusted_author"] >= 1
    assert net.d(1).counters["relayed"] >= 1  # it did reach the destination
    net.d(1).send(z, "hello from the relay", 0)  # the relay itself is admitted
    net.run(2000)
    assert [m.data for m in net.d(2).inbox()] == ["hello from the relay"]
