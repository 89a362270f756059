"""The sans-IO Peer: two or three Peers over an in-memory network (a dict of
links and a list of effects), driven the way the daemon and the simulator
drive it. Each test checks one rule the Peer owns (hivemesh.core.peer)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import pytest

from hivemesh.commands.coordination import Claim, ClaimRelease, ClaimReleaseReply, ClaimWait
from hivemesh.commands.messages import Ping
from hivemesh.commands.messages import Send as SendDirect
from hivemesh.commands.names import NameClaim
from hivemesh.commands.node import Append
from hivemesh.commands.peer import FetchBlob, Learn, Request, Resolve, Serve
from hivemesh.commands.trust import TrustRevoke, TrustRevokeReply
from hivemesh.core.direct import DirectConfig
from hivemesh.core.effects import (
    Close,
    Count,
    Deliver,
    Dial,
    Effect,
    Fsync,
    Handle,
    Log,
    MessageOutcome,
    Persist,
    Reply,
    Send,
)
from hivemesh.core.feed import FeedWriter, Head
from hivemesh.core.frames import FrameType, encode_frame
from hivemesh.core.hlc import HLC
from hivemesh.core.identity import Identity
from hivemesh.core.node import NodeConfig
from hivemesh.core.ownfeed import Mark, MemoryMarkStore
from hivemesh.core.peer import Peer, PeerConfig, TrustFile
from hivemesh.core.pex import MembershipConfig, MemberState
from hivemesh.core.store import MemoryStore
from hivemesh.core.trace import Step, Trace, replay
from hivemesh.core.views.blobs import BlobIndex, blob_digest
from hivemesh.errors import DeadlineExceeded, InvalidArgument, NoHandler, UnknownPeer

IDS = [Identity.from_seed(bytes([65 + i]) * 32) for i in range(4)]
FAST = MembershipConfig(
    probe_interval_ms=100,
    probe_timeout_ms=50,
    suspicion_mult=2,
    gossip_interval_ms=20,
    push_pull_interval_ms=3000,
    join_timeout_ms=3000,
)


@dataclass
class Host:
    """One node's durable parts (store, mark) and, while it runs, its Peer."""

    identity: Identity
    store: MemoryStore = field(default_factory=MemoryStore)
    marks: MemoryMarkStore = field(default_factory=lambda: MemoryMarkStore(Mark()))
    peer: Peer | None = None
    effects: list[Effect] = field(default_factory=list)
    inbox: list[Any] = field(default_factory=list)
    handles: list[Handle] = field(default_factory=list)


class Net:
    """Peers over perfect in-memory links. ``links`` holds the open pairs;
    a Dial between two running, mutually admitting peers opens one."""

    def __init__(self, n: int, *, config: PeerConfig | None = None, **kw: Any) -> None:
        self.now = 1_000_000
        self.config = config or PeerConfig(membership=FAST)
        self.hosts = [Host(IDS[i]) for i in range(n)]
        self.links: set[frozenset[str]] = set()
        self.inbox_ok = True
        self.trust = kw.get("trust", {})
        traces: dict[int, Trace] = kw.get("traces", {})
        for i in range(n):
            self.boot(i, trace=traces.get(i))

    def addr(self, i: int) -> str:
        return self.hosts[i].identity.address

    def p(self, i: int) -> Peer:
        peer = self.hosts[i].peer
        assert peer is not None
        return peer

    def boot(self, i: int, *, seed: int = 0, trace: Trace | None = None) -> Peer:
        h = self.hosts[i]
        peer = Peer(
            h.identity,
            h.store,
            random.Random(i * 1000 + seed if trace is None else trace.seed),
            now_ms=self.now,
            config=self.config,
            trust=self.trust.get(i),
            marks=h.marks,
            trace=trace,
        )
        peer.rehydrate(_replay(h.store), self.now)
        peer.start([f"10.0.0.{i}:7000"], self.now)
        peer.inbox_room(1000, self.now)
        h.peer = peer
        return peer

    def crash(self, i: int) -> None:
        """The process dies: its links vanish without a word (half-open)."""
        self.hosts[i].peer = None
        self.links = {pair for pair in self.links if self.addr(i) not in pair}

    def index(self, address: str) -> int | None:
        for i, h in enumerate(self.hosts):
            if h.identity.address == address and h.peer is not None:
                return i
        return None

    def connect(self, i: int, j: int) -> None:
        a, b = self.p(i), self.p(j)
        if frozenset((a.address, b.address)) in self.links:
            return
        if not (a.authorize(b.address) and b.authorize(a.address)):
            return
        self.links.add(frozenset((a.address, b.address)))
        a.link_up(b.address, b"boot", self.now)
        b.link_up(a.address, b"boot", self.now)

    def disconnect(self, i: int, address: str) -> None:
        pair = frozenset((self.addr(i), address))
        if pair not in self.links:
            return
        self.links.discard(pair)
        self.p(i).link_down(address, b"boot", self.now)
        j = self.index(address)
        if j is not None:
            self.p(j).link_down(self.addr(i), b"boot", self.now)

    def pump(self) -> None:
        """Carry out every effect until none are left."""
        for _ in range(10_000):
            busy = False
            for i, h in enumerate(self.hosts):
                if h.peer is None:
                    continue
                fx = h.peer.effects()
                h.effects.extend(fx)
                for e in fx:
                    busy = True
                    self.execute(i, e)
            if not busy:
                return
        raise AssertionError("effects never ran dry")

    def execute(self, i: int, e: Effect) -> None:
        me = self.addr(i)
        if isinstance(e, Send):
            j = self.index(e.peer)
            if j is not None and frozenset((me, e.peer)) in self.links:
                self.p(j).receive(me, e.frame, self.now)
        elif isinstance(e, Dial):
            j = self.index(e.address)
            if j is not None:
                self.connect(i, j)
        elif isinstance(e, Close):
            self.disconnect(i, e.peer)
        elif isinstance(e, Fsync):
            self.hosts[i].store.sync()
        elif isinstance(e, Persist):
            self.hosts[i].inbox.extend(e.messages)
            self.p(i).persisted(e.batch, self.inbox_ok, self.now)
        elif isinstance(e, Handle):
            self.hosts[i].handles.append(e)

    def run(self, ms: int) -> None:
        """Advance time by ``ms``, firing every Peer's timer when due."""
        end = self.now + ms
        self.pump()
        while True:
            due = [self.p(i).next_deadline() for i, h in enumerate(self.hosts) if h.peer]
            nxt = min([d for d in due if d is not None], default=end)
            if nxt > end:
                break
            self.now = max(self.now, nxt)
            for h in self.hosts:
                if h.peer is not None and h.peer.next_deadline() <= self.now:
                    h.peer.handle_timer(self.now)
            self.pump()
        self.now = end

    def command(self, i: int, cmd: Any) -> int:
        rid = self.p(i).command(cmd, self.now)
        self.pump()
        return rid

    def reply(self, i: int, rid: int) -> Reply | None:
        got = [e for e in self.hosts[i].effects if isinstance(e, Reply) and e.rid == rid]
        assert len(got) <= 1
        return got[0] if got else None

    def mesh(self) -> None:
        for i in range(len(self.hosts)):
            for j in range(i + 1, len(self.hosts)):
                self.connect(i, j)
        self.run(500)


def _replay(store: MemoryStore) -> list[Any]:
    from hivemesh.core.event import decode_event

    return [decode_event(raw) for _a, raws, _s in store.scan() for raw in raws]


def counted(h: Host, name: str) -> int:
    return sum(e.n for e in h.effects if isinstance(e, Count) and e.name == name)


def test_three_peers_meet_through_links_and_replicate() -> None:
    net = Net(3)
    net.mesh()
    rid = net.command(0, Append("app.note", {"x": 1}))
    assert net.reply(0, rid) is not None
    net.run(100)
    for i in (1, 2):
        assert net.p(i).node.journal.head(IDS[0].public).seq >= 1
        assert net.p(i).member_state(net.addr(0)) is MemberState.UP
        assert any(
            isinstance(e, Deliver) and any(ev.kind == "app.note" for ev in e.events)
            for e in net.hosts[i].effects
        )


def test_a_hello_makes_the_others_dial_the_new_endpoint() -> None:
    net = Net(2)
    net.mesh()
    dials = [e for e in net.hosts[1].effects if isinstance(e, Dial) and e.address == net.addr(0)]
    assert ("10.0.0.0:7000",) in [d.endpoints for d in dials]


def test_swim_down_releases_the_crashed_holders_claims_and_drops_the_peer() -> None:
    net = Net(3)
    net.mesh()
    net.command(0, Claim("job-1"))
    net.run(600)  # settled everywhere
    winner = net.p(1).claims.winner("job-1")
    assert winner is not None and winner.author == IDS[0].public
    net.crash(0)
    net.run(FAST.detection_bound_ms(3) + 500)
    for i in (1, 2):
        p = net.p(i)
        assert p.member_state(net.addr(0)) is MemberState.DOWN
        assert net.addr(0) not in p.node.peers
        assert p.claims.winner("job-1") is None  # released by member.down
        assert counted(net.hosts[i], "member_down") == 1
        # its link never ended (half-open) and carried nothing since: closed
        assert Close(net.addr(0), "half-open") in net.hosts[i].effects
        assert counted(net.hosts[i], "dropped_silent_link") == 1


def test_a_restarted_node_releases_the_claims_of_its_previous_life() -> None:
    net = Net(2)
    net.mesh()
    net.command(0, Claim("job-1"))
    net.run(600)
    assert net.p(0).claims.own_live(IDS[0].public) == [("job-1", 2)]
    net.crash(0)
    peer = net.boot(0, seed=1)  # same store and mark: a new life
    assert peer.claims.own_live(IDS[0].public) == []
    assert counted(net.hosts[0], "claims_abandoned") == 0  # counted on the new Peer
    assert peer.counters["claims_abandoned"] == 1
    net.connect(0, 1)
    net.run(2500)  # anti-entropy brings the release
    assert net.p(1).claims.winner("job-1") is None


def test_wait_decided_answers_once_the_claim_settles_and_times_out_without_one() -> None:
    net = Net(2)
    net.mesh()
    net.command(1, Claim("job-1"))
    rid = net.command(0, ClaimWait("job-1", timeout_s=5.0))
    assert net.reply(0, rid) is None
    net.run(PeerConfig().claim_settle_ms + 50)
    got = net.reply(0, rid)
    assert got is not None and got.value.winner == net.addr(1) and not got.value.ours
    rid = net.command(0, ClaimWait("nobody", timeout_s=0.3))
    net.run(400)
    got = net.reply(0, rid)
    assert got is not None and isinstance(got.error, DeadlineExceeded)


def test_resolve_waits_for_a_name_to_be_claimed_and_times_out_without_one() -> None:
    net = Net(2)
    net.mesh()
    rid = net.command(0, Resolve(net.addr(1)))  # an address is its own answer
    assert net.reply(0, rid) == Reply(rid, net.addr(1))
    rid = net.command(0, Resolve("collector"))  # no wait: unknown at once
    got = net.reply(0, rid)
    assert got is not None and isinstance(got.error, UnknownPeer)
    rid = net.command(0, Resolve("collector", timeout_s=5.0))
    net.run(50)
    assert net.reply(0, rid) is None  # nobody claimed it yet: waiting
    net.command(1, NameClaim("collector"))
    net.run(200)  # the claim replicates
    assert net.reply(0, rid) == Reply(rid, net.addr(1))
    rid = net.command(0, Resolve("nobody", timeout_s=0.3))
    net.run(400)
    got = net.reply(0, rid)
    assert got is not None and isinstance(got.error, DeadlineExceeded)


def test_release_claim_and_bad_commands_answer_with_typed_replies() -> None:
    net = Net(1)
    net.command(0, Claim("job-1"))
    rid = net.command(0, ClaimRelease("job-1"))
    assert net.reply(0, rid) == Reply(rid, ClaimReleaseReply(released=1))
    rid = net.command(0, Claim(""))
    got = net.reply(0, rid)
    assert got is not None and isinstance(got.error, InvalidArgument)
    rid = net.command(0, object())
    got = net.reply(0, rid)
    assert got is not None and isinstance(got.error, InvalidArgument)


def test_settle_stores_attested_runs_and_closes_a_peer_with_a_bad_signature() -> None:
    cfg = PeerConfig(
        membership=FAST, node=NodeConfig(defer_direct_verify=True, settle_delay_ms=None)
    )
    net = Net(2, config=cfg)
    net.mesh()
    b = net.p(1)
    w = FeedWriter(IDS[3], Head(), HLC())
    w.append("app.note", {"i": 1}, net.now)
    sealed = w.seal()
    assert sealed is not None
    raws = [e.raw for e in sealed[0]]
    # IDS[3] is a linked peer of b that sends its own batch with a bad signature
    b.link_up(IDS[3].address, b"x", net.now)
    b.settle(net.now)  # what came from peer 0 so far
    b.receive(
        IDS[3].address,
        encode_frame(FrameType.EVENTS, IDS[3].public, raws, IDS[0].sign(b"x"), 0),
        net.now,
    )
    assert b.node.journal.unsettled == 1
    b.effects()
    b.settle(net.now)
    fx = b.effects()
    assert Close(IDS[3].address, "invalid head signature") in fx
    assert fx[-1] == Fsync() or Fsync() in fx
    assert b.node.journal.head(IDS[3].public).seq == 0


def test_revoking_in_the_trust_file_closes_and_forgets_the_peer() -> None:
    a0, a1 = IDS[0].address, IDS[1].address
    trust = {0: TrustFile(trusted=frozenset({a1})), 1: TrustFile(trusted=frozenset({a0}))}
    net = Net(2, config=PeerConfig(membership=FAST, trust_mode="invite"), trust=trust)
    net.mesh()
    assert a1 in net.p(0).node.peers
    net.p(0).trust_changed(TrustFile(revoked=frozenset({a1})), net.now)
    net.pump()
    assert Close(a1, "revoked", code=UnknownPeer.code, forget=True) in net.hosts[0].effects
    assert a1 not in net.p(0).node.peers and not net.p(0).authorize(a1)
    assert counted(net.hosts[0], "disconnected_revoked") == 1


def test_endpoints_the_driver_finds_are_dialled_only_if_the_peer_admits_them() -> None:
    a0, a1, a2 = IDS[0].address, IDS[1].address, IDS[2].address
    trust = {0: TrustFile(trusted=frozenset({a1}), revoked=frozenset({a2}))}
    net = Net(1, config=PeerConfig(membership=FAST, trust_mode="invite"), trust=trust)
    p = net.p(0)
    p.command(Learn(a1, ("10.0.0.1:7000", "udp:10.0.0.1:7000")), net.now)
    p.command(Learn(a2, ("10.0.0.2:7000",)), net.now)  # revoked
    p.command(Learn(IDS[3].address, ("10.0.0.3:7000",)), net.now)  # not trusted (invite mode)
    p.command(Learn(a0, ("10.0.0.0:7000",)), net.now)  # this node itself
    p.command(Learn(a1, ()), net.now)  # nowhere to dial
    dials = [e for e in p.effects() if isinstance(e, Dial)]
    assert dials == [Dial(a1, ("10.0.0.1:7000", "udp:10.0.0.1:7000"))]


def test_only_pushed_events_tell_the_driver_that_no_deadline_moved() -> None:
    net = Net(2)
    net.mesh()
    a0 = net.addr(0)
    net.p(0).command(Append("app.note", {"x": 1}), net.now)
    pushed = [
        e.frame
        for e in net.p(0).effects()
        if isinstance(e, Send) and e.frame[2:3] == bytes([FrameType.EVENTS])
    ]
    assert pushed
    assert net.p(1).receive_many(a0, pushed, net.now) is False
    ping = encode_frame(FrameType.RT_PING, 7)
    assert net.p(1).receive_many(a0, [*pushed, ping], net.now) is True
    assert net.p(1).receive_many(a0, [], net.now) is False


def test_a_revoke_command_publishes_and_cuts_the_peer_off() -> None:
    net = Net(2)
    net.mesh()
    # the driver records the revocation in trust.json first, then tells the Peer
    net.p(0).trust_changed(TrustFile(revoked=frozenset({net.addr(1)})), net.now)
    rid = net.command(0, TrustRevoke(net.addr(1)))
    assert net.reply(0, rid) == Reply(rid, TrustRevokeReply(revoked=net.addr(1)))
    assert any(
        isinstance(e, Deliver) and any(ev.kind == "trust.revoke" for ev in e.events)
        for e in net.hosts[0].effects
    )
    assert net.addr(1) not in net.p(0).node.peers


def test_blobs_are_fetched_from_their_announced_holder() -> None:
    net = Net(2)
    net.mesh()
    data = b"screenshot" * 1000
    digest = blob_digest(data)
    net.hosts[1].store.put_blob(digest, data)
    kind, body = BlobIndex.encode_put(data, "image/png", "shot")
    net.command(1, Append(kind, body))
    net.run(100)
    rid = net.command(0, FetchBlob(digest, timeout_s=2.0))
    net.run(200)
    assert net.reply(0, rid) == Reply(rid, data)
    assert net.hosts[0].store.get_blob(digest) == data
    rid = net.command(0, FetchBlob(b"\x01" * 32, timeout_s=0.3))
    net.run(5000)
    got = net.reply(0, rid)
    assert got is not None and isinstance(got.error, DeadlineExceeded)


def test_direct_messages_answer_at_their_ack() -> None:
    net = Net(2)
    net.mesh()
    rid = net.command(0, SendDirect(net.addr(1), {"hi": 1}, timeout_s=2.0))
    net.run(100)
    got = net.reply(0, rid)
    assert got is not None and got.value is not None and got.value["acked"] is True
    assert any(isinstance(e, MessageOutcome) and e.acked for e in net.hosts[0].effects)
    assert [m.data for m in net.hosts[1].inbox] == [{"hi": 1}]  # persisted by the driver


def test_requests_are_handled_by_the_driver_and_answered() -> None:
    cfg = PeerConfig(membership=FAST, direct=DirectConfig(ack_when_stored=True))
    net = Net(2, config=cfg)
    net.mesh()
    net.command(1, Serve("add"))
    rid = net.command(0, Request(net.addr(1), "add", [2, 3], timeout_s=2.0))
    net.run(50)
    (h,) = net.hosts[1].handles
    assert (h.kind, h.data, h.plain) == ("add", [2, 3], False)
    net.p(1).handled(h.key, 5, None, net.now)
    net.run(50)
    assert net.reply(0, rid) == Reply(rid, 5)
    # a kind nobody serves is refused at once, typed
    rid = net.command(0, Request(net.addr(1), "mul", 1, timeout_s=2.0))
    net.run(50)
    got = net.reply(0, rid)
    assert got is not None and isinstance(got.error, NoHandler)
    # no reply in time
    net.command(1, Serve("slow"))
    rid = net.command(0, Request(net.addr(1), "slow", 1, timeout_s=0.3))
    net.run(400)
    got = net.reply(0, rid)
    assert got is not None and isinstance(got.error, DeadlineExceeded)


def test_a_plain_message_is_acked_only_after_its_handler_and_an_unstored_one_is_retried() -> None:
    cfg = PeerConfig(membership=FAST, direct=DirectConfig(ack_when_stored=True))
    net = Net(2, config=cfg)
    net.mesh()
    net.command(1, Serve("metrics", plain=True))
    rid = net.command(0, SendDirect(net.addr(1), {"type": "metrics", "n": 1}, timeout_s=5.0))
    net.run(50)
    (h,) = net.hosts[1].handles
    assert h.plain and net.reply(0, rid) is None  # not acked while the handler runs
    net.p(1).handled(h.key, None, None, net.now)
    net.run(50)
    got = net.reply(0, rid)
    assert got is not None and got.error is None
    # the durable inbox fails once: released unacked, the retransmission is stored
    net.inbox_ok = False
    rid = net.command(0, SendDirect(net.addr(1), {"note": 1}, timeout_s=5.0))
    net.run(20)
    net.inbox_ok = True
    net.run(2000)
    got = net.reply(0, rid)
    assert got is not None and got.error is None
    assert net.p(1).mailbox.counters["inbox_store_failed"] >= 1


def test_ping_answers_at_the_pong_and_times_out_without_one() -> None:
    net = Net(2)
    net.mesh()
    rid = net.command(0, Ping(net.addr(1), timeout_s=0.5))
    net.run(10)
    assert net.reply(0, rid) == Reply(rid, None)
    net.crash(1)
    rid = net.command(0, Ping(net.addr(1), timeout_s=0.5))
    net.run(600)
    got = net.reply(0, rid)
    assert got is not None and isinstance(got.error, DeadlineExceeded)
    rid = net.command(0, Ping(IDS[3].address, timeout_s=0.5))  # never linked
    got = net.reply(0, rid)
    assert got is not None and isinstance(got.error, UnknownPeer)
    assert "state: unknown" in str(got.error)


def test_the_same_inputs_give_the_same_effects() -> None:
    def scenario() -> list[list[Effect]]:
        net = Net(3)
        net.mesh()
        net.command(0, Claim("job"))
        net.run(800)
        net.crash(2)
        net.run(FAST.detection_bound_ms(3))
        return [h.effects for h in net.hosts]

    first, second = scenario(), scenario()
    assert first == second
    assert sum(1 for fx in first for e in fx if isinstance(e, Log)) > 0


def test_a_recorded_trace_replays_to_the_same_effects_and_a_changed_one_does_not() -> None:
    trace = Trace(seed=7)
    net = Net(3, traces={0: trace})
    net.mesh()
    net.command(0, Claim("job"))
    net.run(800)
    net.crash(2)
    net.run(FAST.detection_bound_ms(3))
    net.p(0).trust_changed(TrustFile(revoked=frozenset({net.addr(1)})), net.now)
    net.pump()
    assert trace.inputs() > 50
    assert any(s.method == "receive" for s in trace.steps)
    assert replay(trace, IDS[0], MemoryStore()) == []
    # a trace with one input left out does not replay to the same effects
    n = next(i for i, s in enumerate(trace.steps) if s.method == "handle_timer")
    cut = Trace(trace.seed, trace.steps[:n] + trace.steps[n + 1 :], trace.setup)
    assert replay(cut, IDS[0], MemoryStore()) != []
    bad = Trace(trace.seed, [Step("close_everything")], trace.setup)
    with pytest.raises(ValueError, match="not a Peer input"):
        replay(bad, IDS[0], MemoryStore())


def test_status_shows_every_feeds_head_and_sums_the_lost_work() -> None:
    from hivemesh.core.answers import dropped_total, peer_status

    net = Net(2)
    net.mesh()
    net.command(0, Append("app.note", {"n": 1}))
    net.run(200)
    a, b = (peer_status(net.p(i))["journal"]["heads"] for i in (0, 1))
    assert a == b and a[net.addr(0)]["seq"] >= 1 and len(a[net.addr(0)]["hash"]) == 64
    counters = {"dropped_no_channel": 2, "events_undelivered": 1, "subscriber_dropped": 3, "x": 9}
    assert dropped_total(counters, {"frames_dropped": 4, "frames_in": 7}) == 10
