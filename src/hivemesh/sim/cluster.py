"""The simulated cluster: N real core nodes on one heap of timed events.

Theory of operation
-------------------
Everything nondeterministic is drawn from streams derived from one seed
string: ``{seed}/net`` (delays, loss, duplication), ``{seed}/faults``
(partitions, crashes, skew, forgeries), ``{seed}/work`` (appends) and
``{seed}/node/i`` (each node's own randomness). Time is a number on the heap;
it jumps from event to event. Each node sees ``sim time + its clock skew``.

A run has two phases. In the *active* phase the workload appends events
while the network loses, duplicates and reorders frames, partitions come and
go, nodes crash (their in-memory state is discarded; their store, like a disk,
survives) and restart by replaying their store, and an adversary injects
forged frames. In the *heal* phase the network is perfect, every node is up,
and anti-entropy must bring every replica to the same journal and views.

Two more faults hit a node's own feed (off unless the options enable them;
the journal campaign does). *Restore*: a node crashes and restarts on the
last backup of its store (or none: deleted), sometimes cut off from every
peer. *Damaged log*: a node cut off by a partition writes, crashes, and its
store loses its last own batches; it restarts still cut off. Its mark (kept
beside the key, like the store, across the crash) must make it recover its
feed before writing. Where no replica holds what was lost (it was written
while cut off), an *operator* accepts the loss ``operator_delay_ms`` into the
heal phase, as ``hivemesh feed accept-loss`` would; those events are then
given up on the record and excluded from the durability check.

Every node is the daemon's sans-IO :class:`~hivemesh.core.peer.Peer`, driven
through its :class:`~hivemesh.sim.peer_adapter.PeerAdapter` (frames, link
changes, timers, commands, the group commit in; effects and the next
deadline out): the one place where the simulator wires a node. Its own SWIM
finds crashes (``swim``: memberlist's LAN timing unless the options say
otherwise); the Peers run in ``invite`` trust mode in one swarm, and the run
starts with the vouches an invite flow writes (the founder, node 0, brings
every other node in, and each brings in the founder).
Stores are a simulated disk with a write cache (:mod:`hivemesh.sim.disk`),
synced by a group commit (the adapter's ``settle``, whose ``Fsync`` syncs
the disk) ``commit_delay_ms`` after replicated batches or unsettled runs
arrive; a crash may lose the cache. Clocks may step and processes pause
(:class:`~hivemesh.sim.options.FaultOptions`).

**Links.** Frames travel only over links, which the network brings up and
down as the daemon's connection manager does. A node listens at
``sim<i>:1`` and, at boot, keeps dialling every other node (its configured
peers); a ``Dial`` effect adds an address it keeps dialling, a ``Close``
effect drops the link (``forget``: stop dialling it). A dial succeeds when its target is
up and not cut off by a partition: one round trip later both sides get
``link_up`` (with the boot id of the other's life); a failed one is retried
with backoff. A close is ``link_down`` on the closing side at once and on the
other side one delay later (if the notice crosses the network); a dropped
link is redialled while its address is still dialled. A crash drops the
crashed node's side only: its peers hold a half-open link until their SWIM
closes it or the restarted node's dial replaces it. A frame is lost if its
sender has no link to its target, or if the target's link on arrival is not
to the life that sent it.

The checkers (:mod:`hivemesh.sim.checkers`) then look for violations. A
digest of the whole trace (every delivery, drop, crash) is returned so two
runs of a seed can be compared byte for byte.
"""

from __future__ import annotations

import hashlib
import heapq
import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from hivemesh.core.causal import causal_merge
from hivemesh.core.claims import ClaimsView
from hivemesh.core.effects import Close, Dial, Effect, Fsync, Send
from hivemesh.core.event import Event, decode_event, encode_event
from hivemesh.core.feed import head_message
from hivemesh.core.frames import FrameType, encode_frame
from hivemesh.core.identity import Identity
from hivemesh.core.membership import MembershipConfig
from hivemesh.core.node import Node, NodeConfig
from hivemesh.core.ownfeed import FeedState, Mark, MemoryMarkStore
from hivemesh.core.peer import PeerConfig, TrustFile
from hivemesh.core.store import MemoryStore
from hivemesh.core.trace import Trace
from hivemesh.core.views import ContextView, MaxRegisterView, NamesView, View
from hivemesh.core.views.trust import KIND_TRUST_ADD
from hivemesh.errors import FeedNotWritable
from hivemesh.sim.disk import DiskStore
from hivemesh.sim.options import SimOptions
from hivemesh.sim.peer_adapter import SWARM, PeerAdapter
from hivemesh.sim.views import EventSetDigest

__all__ = ["Cluster", "SimNode", "SimResult", "replay_store"]

(
    _DELIVER,
    _TIMER,
    _APPEND,
    _CRASH,
    _RESTART,
    _PARTITION,
    _HEAL,
    _FORGE,
    _PHASE,
    _TRY,
    _CHECK,
    _DIAL,
    _BACKUP,
    _RESTORE,
    _DAMAGE,
    _OPERATOR,
    _COMMIT,
    _PAUSE,
    _JUMP,
    _LINK,
    _UNLINK,
) = range(21)

#: Heap events addressed to one node, which wait while that node is paused:
#: kind -> where the node's index is in the event's data.
_FOR_NODE = {
    _DELIVER: 1,
    _TIMER: 0,
    _APPEND: None,
    _TRY: None,
    _CHECK: 0,
    _DIAL: 0,
    _LINK: 2,  # the dialled side (the dialling side was awake to dial)
    _UNLINK: 0,
}


#: The first bytes of every EVENTS frame.
_EVENTS_HEAD = encode_frame(FrameType.EVENTS)[:3]


def replay_store(store: MemoryStore) -> Iterator[Event]:
    """Stored events in causal order, as the daemon replays (the store was
    verified on ingest; :mod:`hivemesh.core.causal`)."""
    feeds = (iter([[decode_event(raw) for raw in raws]]) for _a, raws, _s in store.scan())
    for run in causal_merge(feeds):
        yield from run


@dataclass
class SimNode:
    """One replica: identity, durable store, and (when up) its core node."""

    index: int
    identity: Identity
    store: DiskStore
    skew_ms: int
    #: This life's wiring (None while the node is down).
    adapter: PeerAdapter | None = None
    digest: EventSetDigest = field(default_factory=EventSetDigest)
    claims: ClaimsView = field(default_factory=ClaimsView)
    views: list[View] = field(default_factory=list)
    timer_at: int | None = None
    incarnation: int = 0
    #: The own feed's mark, beside the key: survives crashes and restores.
    marks: MemoryMarkStore = field(default_factory=lambda: MemoryMarkStore(Mark()))
    #: The last backup of the store (restore scenario).
    backup: DiskStore | None = None
    #: Until when the node's process is paused (sim time).
    paused_until: int = 0
    #: A group commit is scheduled.
    commit_pending: bool = False
    #: Counters of earlier incarnations (the checkers look at every life).
    past_counters: Counter[str] = field(default_factory=Counter)
    #: This life's links: address -> the boot id of the life it reaches.
    links: dict[str, bytes] = field(default_factory=dict)
    #: Addresses this life keeps dialling -> failed attempts in a row.
    dialling: dict[str, int] = field(default_factory=dict)
    #: Addresses with a dial attempt scheduled or in flight.
    dial_pending: set[str] = field(default_factory=set)

    @property
    def endpoint(self) -> str:
        """Where this node listens."""
        return f"sim{self.index}:1"

    @property
    def boot_id(self) -> bytes:
        """The id of this life (a link up names the life it reaches)."""
        return f"{self.index}/{self.incarnation}".encode()

    @property
    def node(self) -> Node | None:
        """This life's core node, for inspection (None while down)."""
        return self.adapter.node if self.adapter is not None else None


@dataclass
class SimResult:
    """Outcome of one seed."""

    seed: str
    violations: list[str]
    trace_digest: str
    stats: dict[str, Any]


class Cluster:
    """Drive ``opts.nodes`` Peers through one seeded fault schedule."""

    #: Added to every node's clock (a workload whose machines must never
    #: read a negative time sets it: a daemon's clock is anchored at wall-clock time).
    epoch_ms = 0

    def __init__(self, seed: str, opts: SimOptions, *, trace: bool = False) -> None:
        """``trace``: every life's Peer records a :class:`~hivemesh.core.trace.Trace`
        (kept in :attr:`traces`, for :func:`~hivemesh.core.trace.replay`; tests)."""
        if opts.swim is None:
            opts = replace(opts, swim=MembershipConfig.lan())
        #: (node index, incarnation) -> that life's trace and a copy of its
        #: store as the Peer was built on it (``trace`` only)
        self.traces: dict[tuple[int, int], tuple[Trace, DiskStore]] | None = {} if trace else None
        self.seed = seed
        self.opts = opts
        self.net_rng = random.Random(f"{seed}/net")
        self.fault_rng = random.Random(f"{seed}/faults")
        self.work_rng = random.Random(f"{seed}/work")
        key_rng = random.Random(f"{seed}/keys")
        self.now = 0
        self._heap: list[tuple[int, int, int, Any]] = []
        self._seq = 0
        self.trace = hashlib.blake2b(digest_size=16)
        self.stats: Counter[str] = Counter()
        self.bytes_by_type: Counter[str] = Counter()
        self.partition: dict[str, int] | None = None
        self.healing = False
        self.acknowledged: list[Event] = []
        #: Ids of acknowledged events an operator gave up (see module docs).
        self.given_up: set[bytes] = set()
        self.backup_rng = random.Random(f"{seed}/backup")
        self.forged: list[bytes] = []
        self.seen_frames: list[bytes] = []
        self.executions: list[tuple[str, int]] = []
        skew = opts.faults.clock_skew_max_ms
        self.nodes = [
            SimNode(
                i,
                Identity.from_seed(key_rng.randbytes(32)),
                DiskStore(),
                self.epoch_ms + (self.fault_rng.randint(-skew, skew) if skew else 0),
            )
            for i in range(opts.nodes)
        ]
        self.members = frozenset(n.identity.public for n in self.nodes)
        self.by_addr = {n.identity.address: n for n in self.nodes}
        for n in self.nodes:
            self._boot(n)
        # the invite flow's vouches: the founder brings everyone in, each the founder
        founder = self.nodes[0].identity.address
        vouches = [
            (KIND_TRUST_ADD, {"address": n.identity.address, "swarm": SWARM})
            for n in self.nodes[1:]
        ]
        self.append(0, vouches)
        for sn in self.nodes[1:]:
            self.append(sn.index, [(KIND_TRUST_ADD, {"address": founder, "swarm": SWARM})])

    # -- scheduling --------------------------------------------------------------

    def _at(self, t: int, kind: int, data: Any = None) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, data))

    def _note(self, *parts: object) -> None:
        self.trace.update(repr((self.now, *parts)).encode())

    # -- node life ---------------------------------------------------------------

    def _config(self) -> NodeConfig:
        return NodeConfig(
            sync_interval_ms=self.opts.sync_interval_ms,
            want_timeout_ms=self.opts.want_timeout_ms,
            defer_direct_verify=True,  # the simulated network names the true sender
        )

    def _new_adapter(self, sn: SimNode) -> PeerAdapter:
        """This life's Peer, behind its adapter."""
        assert self.opts.swim is not None
        seed = random.Random(f"{self.seed}/node/{sn.index}/{sn.incarnation}").getrandbits(128)
        trace = None
        if self.traces is not None:
            trace = Trace(seed)
            self.traces[sn.index, sn.incarnation] = (trace, sn.store.copy())
        members = frozenset(n.identity.address for n in self.nodes)
        return PeerAdapter(
            sn.identity,
            sn.store,
            random.Random(seed),
            self.now + sn.skew_ms,
            config=self._peer_config(sn),
            trust=TrustFile(trusted=members - {sn.identity.address}, swarms=(SWARM,)),
            marks=sn.marks,
            leases=self._lease_setup(sn),
            trace=trace,
        )

    def _peer_config(self, sn: SimNode) -> PeerConfig:
        """The Peer's configuration (a workload may add to it)."""
        assert self.opts.swim is not None
        return PeerConfig(
            # settled at the group commit, as the daemon's (module docs)
            node=replace(self._config(), settle_delay_ms=None),
            membership=self.opts.swim,
            trust_mode="invite",
            claim_settle_ms=self.opts.claim_settle_ms,
        )

    def _lease_setup(self, sn: SimNode) -> Any:
        """The lease voter's durable state for this life (None: a new one;
        the leases workload keeps a voter log: :mod:`hivemesh.sim.leases`)."""
        return None

    def _boot(self, sn: SimNode) -> None:
        sn.incarnation += 1
        sn.links.clear()
        sn.dialling.clear()
        sn.dial_pending.clear()
        adapter = self._new_adapter(sn)
        sn.digest, sn.claims, sn.views = adapter.digest, adapter.claims, adapter.views
        adapter.boot(replay_store(sn.store), [sn.endpoint], self.now + sn.skew_ms)
        sn.adapter = adapter
        for view in sn.views:  # loro imports a replay left waiting (none in causal order)
            if isinstance(view, ContextView):
                self.stats["replay_imports"] += view.imports
                self.stats["replay_imports_pending"] += view.imports_pending
        sn.timer_at = None
        sn.commit_pending = False
        if not adapter.writable:
            self.stats["boots_recovering"] += 1
            self._note("recovering", sn.index, adapter.node.feed_gate.held.seq)
        for other in self.nodes:  # it keeps dialling every configured peer
            if other is not sn:
                self._want(sn, other.identity.address)
        self._flush(sn)

    def _flush(self, sn: SimNode) -> None:
        """Carry out ``sn``'s effects; schedule its group commit and timer."""
        adapter = sn.adapter
        if adapter is None:
            return
        while fx := adapter.effects():
            for e in fx:
                if type(e) is Send:
                    self._send(sn, self.by_addr[e.peer], e.frame)
                elif type(e) is Fsync:
                    sn.store.sync()
                elif type(e) is Dial:
                    self._want(sn, e.address)
                elif type(e) is Close:
                    self._close(sn, e)
                else:
                    self._effect(sn, e)
            if sn.adapter is not adapter:
                return  # an effect crashed it
        if not sn.commit_pending and (sn.store.cached or adapter.node.journal.unsettled):
            sn.commit_pending = True
            self._at(self.now + self.opts.commit_delay_ms, _COMMIT, (sn.index, sn.incarnation))
        deadline = adapter.next_deadline() - sn.skew_ms
        if sn.timer_at is None or deadline < sn.timer_at:
            sn.timer_at = max(deadline, self.now)
            self._at(sn.timer_at, _TIMER, (sn.index, sn.incarnation))

    def _effect(self, sn: SimNode, e: Effect) -> None:
        """An effect the network and disk do not carry out (logs, counts,
        deliveries, replies; a workload may act on some)."""

    # -- links (module docs) ---------------------------------------------------------

    def _delay(self) -> int:
        net = self.opts.network
        return net.one_way_delay_mean_ms + self.net_rng.randrange(net.one_way_delay_jitter_ms + 1)

    def _cut(self, a: SimNode, b: SimNode) -> bool:
        p = self.partition
        return not self.healing and p is not None and p[a.identity.address] != p[b.identity.address]

    def _want(self, sn: SimNode, address: str) -> None:
        """``sn`` keeps a link to ``address`` (dials now unless linked)."""
        if address == sn.identity.address or address not in self.by_addr:
            return
        sn.dialling.setdefault(address, 0)
        if address not in sn.links:
            self._redial(sn, address, 0)

    def _redial(self, sn: SimNode, address: str, after_ms: int) -> None:
        if address in sn.dialling and address not in sn.dial_pending:
            sn.dial_pending.add(address)
            self._at(self.now + after_ms, _DIAL, (sn.index, sn.incarnation, address))

    def _dial(self, index: int, incarnation: int, address: str) -> None:
        """A dial attempt: a round trip later both sides have the link."""
        sn = self.nodes[index]
        if sn.adapter is None or sn.incarnation != incarnation:
            return
        sn.dial_pending.discard(address)
        dst = self.by_addr[address]
        if address not in sn.dialling or sn.links.get(address) == dst.boot_id:
            return
        if dst.adapter is None or self._cut(sn, dst):
            failed = sn.dialling[address] = min(sn.dialling[address] + 1, 4)
            self.stats["dials_failed"] += 1
            sn.dial_pending.add(address)
            backoff = (250 << failed) + self.net_rng.randrange(250)
            self._at(self.now + backoff, _DIAL, (sn.index, sn.incarnation, address))
            return
        sn.dial_pending.add(address)  # the handshake is in flight
        rtt = self._delay() + self._delay()
        self._at(self.now + rtt, _LINK, (sn.index, sn.incarnation, dst.index, dst.incarnation))

    def _link(self, index: int, incarnation: int, dst_index: int, dst_incarnation: int) -> None:
        """A handshake completed: the link is up on both sides."""
        sn, dst = self.nodes[index], self.nodes[dst_index]
        if sn.adapter is None or sn.incarnation != incarnation:
            return
        if sn.paused_until > self.now:  # the dialling side answers when it resumes
            self._at(sn.paused_until, _LINK, (index, incarnation, dst_index, dst_incarnation))
            return
        address = dst.identity.address
        sn.dial_pending.discard(address)
        if dst.adapter is None or dst.incarnation != dst_incarnation:
            self._redial(sn, address, 250)  # it went away meanwhile
            return
        sn.dialling[address] = 0
        self.stats["links_up"] += 1
        self._note("link", index, dst_index)
        for a, b, endpoint in ((sn, dst, dst.endpoint), (dst, sn, None)):
            if a.links.get(b.identity.address) == b.boot_id:
                continue
            a.links[b.identity.address] = b.boot_id
            assert a.adapter is not None
            a.adapter.link_up(b.identity.address, b.boot_id, self.now + a.skew_ms, endpoint)
            self._flush(a)

    def _close(self, sn: SimNode, e: Close) -> None:
        """``sn``'s Peer closes its link to ``e.peer`` (module docs)."""
        if e.forget:
            sn.dialling.pop(e.peer, None)
        boot_id = sn.links.get(e.peer)
        if boot_id is None:
            return
        self.stats["links_closed"] += 1
        self._note("close", sn.index, e.peer[:8])
        del sn.links[e.peer]
        assert sn.adapter is not None
        sn.adapter.link_down(e.peer, boot_id, self.now + sn.skew_ms)
        dst = self.by_addr[e.peer]
        if dst.adapter is not None and not self._cut(sn, dst):
            self._at(
                self.now + self._delay(), _UNLINK, (dst.index, sn.identity.address, sn.boot_id)
            )
        self._redial(sn, e.peer, 1_000)

    def _unlink(self, index: int, address: str, boot_id: bytes) -> None:
        """The other side of a closed link learns of it."""
        sn = self.nodes[index]
        if sn.adapter is None or sn.links.get(address) != boot_id:
            return
        del sn.links[address]
        sn.adapter.link_down(address, boot_id, self.now + sn.skew_ms)
        self._redial(sn, address, 1_000)
        self._flush(sn)

    def _send(self, src: SimNode, dst: SimNode, frame: bytes) -> None:
        net = self.opts.network
        self.stats["frames_sent"] += 1
        self.bytes_by_type[str(frame[2] if len(frame) > 2 else -1)] += len(frame)
        self.stats["bytes_sent"] += len(frame)
        if src.links.get(dst.identity.address) is None:
            self.stats["frames_unlinked"] += 1
            return
        life = (src.index, dst.index, frame, src.boot_id)
        if not self.healing:
            if (
                self.partition
                and self.partition[src.identity.address] != self.partition[dst.identity.address]
            ):
                self.stats["frames_partitioned"] += 1
                return
            if self.net_rng.random() < net.packet_loss_probability:
                self.stats["frames_lost"] += 1
                return
            if self.net_rng.random() < net.packet_replay_probability:
                delay = net.one_way_delay_mean_ms + self.net_rng.randrange(
                    net.one_way_delay_jitter_ms * 4 + 1
                )
                self._at(self.now + delay, _DELIVER, life)
                self.stats["frames_duplicated"] += 1
        self._at(self.now + self._delay(), _DELIVER, life)
        if len(self.seen_frames) < 64 and frame[:3] == _EVENTS_HEAD:
            self.seen_frames.append(frame)

    # -- the run -----------------------------------------------------------------

    def _plan(self) -> None:
        o, f = self.opts, self.opts.faults
        active = o.active_ms
        for _ in range(o.appends):
            self._at(self.work_rng.randrange(active), _APPEND, self.work_rng.randrange(o.nodes))
        t = 0
        while t < active:
            t += self.fault_rng.randrange(1_000, 6_000)
            if t >= active:
                break
            self._plan_fault(t, self.fault_rng.random())
        if f.restore_probability:
            for i in range(o.nodes):
                t = self.backup_rng.randrange(f.backup_interval_ms)
                while t < active:
                    self._at(t, _BACKUP, i)
                    t += f.backup_interval_ms // 2 + self.backup_rng.randrange(f.backup_interval_ms)
        for _ in range(f.forgeries):
            self._at(self.fault_rng.randrange(active), _FORGE, self.fault_rng.randrange(o.nodes))
        self._at(active, _PHASE, None)
        if f.restore_probability or f.log_damage_probability:
            t = active + f.operator_delay_ms
            while t < active + o.heal_ms:
                self._at(t, _OPERATOR, None)
                t += 2_000
        for i in range(o.nodes if o.claim_tasks else 0):
            self._at(self.work_rng.randrange(1_000), _TRY, i)

    def _plan_fault(self, t: int, roll: float) -> None:
        """The fault that ``roll`` picks at ``t`` (the options' probabilities
        share the interval [0, 1) in this order; the rest is no fault)."""
        o, f, rng = self.opts, self.opts.faults, self.fault_rng
        active = o.active_ms
        shares = (
            f.partition_probability,
            f.crash_probability,
            f.restore_probability,
            f.log_damage_probability,
            f.clock_jump_probability,
            f.pause_probability,
        )
        pick, edge = len(shares), 0.0
        for i, share in enumerate(shares):
            edge += share
            if roll < edge:
                pick = i
                break
        if pick == 0:
            self._at(t, _PARTITION, rng.random())
            self._at(min(active, t + rng.randrange(500, 5_000)), _HEAL, None)
        elif pick == 1:
            victim = rng.randrange(o.nodes)
            self._at(t, _CRASH, victim)
            self._at(min(active, t + rng.randrange(200, 5_000)), _RESTART, victim)
        elif pick == 2:
            victim = rng.randrange(o.nodes)
            cut_off = rng.random() < 0.5
            self._at(t, _CRASH, victim)
            back = min(active, t + rng.randrange(200, 3_000))
            self._at(back, _RESTORE, (victim, cut_off))
            if cut_off:
                self._at(min(active, back + rng.randrange(500, 4_000)), _HEAL, None)
        elif pick == 3:
            self._plan_damage(t, rng.randrange(o.nodes))
        elif pick == 4:
            step = rng.randint(-f.clock_jump_max_ms, f.clock_jump_max_ms)
            self._at(t, _JUMP, (rng.randrange(o.nodes), step))
        elif pick == 5:
            length = rng.randrange(200, 6_000)
            self._at(t, _PAUSE, (rng.randrange(o.nodes), length))

    def run(self) -> SimResult:
        """Run both phases, then the checkers."""
        from hivemesh.sim.checkers import check_cluster

        self._plan()
        self.run_until(self.opts.active_ms + self.opts.heal_ms, stop_when_converged=True)
        self.stats["converged_at_ms"] = self.now
        for sn in self.nodes:  # own feeds pulled back after a restore or a damaged log
            counters = sn.past_counters + (sn.node.counters if sn.node else Counter())
            if counters["own_events_recovered"]:
                self.stats["own_events_recovered"] += counters["own_events_recovered"]
        if self.opts.claim_tasks:
            self.stats["claim_executions"] = len(self.executions)
            self.stats["claim_duplicates"] = len(self.executions) - len(
                {t for t, _ in self.executions}
            )
        violations = check_cluster(self)
        self.trace.update(repr(sorted(self.stats.items())).encode())
        return SimResult(self.seed, violations, self.trace.hexdigest(), dict(self.stats))

    def run_until(self, end_ms: int, *, stop_when_converged: bool = False) -> None:
        """Process heap events up to ``end_ms`` (or until converged, checked
        each simulated second once healing)."""
        next_check = self.now + 1_000
        while self._heap and self._heap[0][0] <= end_ms:
            t, _, kind, data = heapq.heappop(self._heap)
            self.now = t
            self._dispatch(kind, data)
            if stop_when_converged and self.healing and t >= next_check:
                next_check = t + 1_000
                if self.converged():
                    return
        if not stop_when_converged or not self._heap:
            self.now = max(self.now, end_ms)

    def append(self, index: int, items: list[tuple[str, Any]]) -> None:
        """Append events on node ``index`` now (benchmarks and tests)."""
        sn = self.nodes[index]
        if sn.adapter is None:
            raise ValueError(f"node {index} is down")
        self._acknowledge(sn, sn.adapter.append(items, self.now + sn.skew_ms))
        self._flush(sn)

    def _acknowledge(self, sn: SimNode, events: list[Event]) -> None:
        """``sn`` told its application that ``events`` are appended: the
        durability check holds every replica to them."""
        self.acknowledged.extend(events)

    def set_partition(self, groups: dict[str, int] | None) -> None:
        """Impose a partition (address -> group) or heal (None)."""
        self.partition = groups

    @property
    def honest(self) -> list[SimNode]:
        """The replicas whose agreement the checkers demand (every node here;
        an adversarial workload leaves its adversary out)."""
        return self.nodes

    def converged(self) -> bool:
        """Every replica holds the same feeds, every signature settled, and
        every node writes its own feed."""
        if any(n.node.journal.unsettled for n in self.honest if n.node):
            return False
        if any(not n.node.feed_gate.writable for n in self.honest if n.node):
            return False
        vvs = [n.node.journal.version_vector() for n in self.honest if n.node]
        if self.opts.claim_tasks and len({t for t, _ in self.executions}) < self.opts.claim_tasks:
            return False
        return all(v == vvs[0] for v in vvs)

    def _dispatch(self, kind: int, data: Any) -> None:
        where = _FOR_NODE.get(kind, -1)
        if where != -1:
            paused = self.nodes[data if where is None else data[where]]
            if paused.paused_until > self.now:
                self._wait_for_resume(paused, kind, data)
                return
        if kind == _DELIVER:
            src, dst, frame, boot_id = data
            sn = self.nodes[dst]
            adapter = sn.adapter
            if adapter is None:
                self.stats["frames_to_crashed"] += 1
                return
            sender = self.nodes[src].identity.address
            if sn.links.get(sender) != boot_id:
                self.stats["frames_unlinked"] += 1
                return
            # _note("d", src, dst, digest), spelt out: one per delivered frame
            digest = hashlib.blake2b(frame, digest_size=8).hexdigest()
            self.trace.update(f"({self.now}, 'd', {src}, {dst}, '{digest}')".encode())
            adapter.receive(sender, frame, self.now + sn.skew_ms)
            self._flush(sn)
        elif kind == _TIMER:
            index, incarnation = data
            sn = self.nodes[index]
            if sn.node is None or sn.incarnation != incarnation or sn.timer_at != self.now:
                return
            sn.timer_at = None
            assert sn.adapter is not None
            sn.adapter.handle_timer(self.now + sn.skew_ms)
            self._flush(sn)
        elif kind == _APPEND:
            sn = self.nodes[data]
            if sn.node is None:
                return
            self._workload_append(sn)
        elif kind == _CRASH:
            self._crash(self.nodes[data])
        elif kind in (_TRY, _CHECK):
            self._claims_step(kind, data)
        elif kind == _DIAL:
            self._dial(*data)
        elif kind == _LINK:
            self._link(*data)
        elif kind == _UNLINK:
            self._unlink(*data)
        elif kind == _RESTART:
            sn = self.nodes[data]
            if sn.node is None:
                self._boot(sn)
                self._note("restart", data)
        elif kind == _PARTITION:
            self._partition(data)
        elif kind == _HEAL:
            self.partition = None
            self._note("heal")
        elif kind == _FORGE:
            self._forge(self.nodes[data])
        elif kind in (_BACKUP, _RESTORE, _DAMAGE, _OPERATOR):
            self._own_feed_fault(kind, data)
        elif kind in (_COMMIT, _PAUSE, _JUMP):
            self._process_fault(kind, data)
        elif kind == _PHASE:
            self.healing = True
            self.partition = None
            for sn in self.nodes:
                if sn.node is None:
                    self._boot(sn)
            self._note("phase-heal")

    def _workload_append(self, sn: SimNode) -> None:
        """One step of the journal workload: a note, a context write (map,
        list, counter, text, sets), a name claim or a max-register bump,
        through the real view APIs."""
        assert sn.node is not None
        now = self.now + sn.skew_ms
        r = self.work_rng.randrange(1 << 30)
        roll = r % 10
        items: list[tuple[str, Any]]
        if roll < 4:
            ctx_view = next(v for v in sn.views if isinstance(v, ContextView))
            ctx = ctx_view.context("shared")
            try:
                if roll == 0:
                    ctx[f"k{r % 7}"] = r
                elif roll == 1:
                    ctx.list("chat").append(f"{sn.index}:{r}")
                elif roll == 2:
                    ctx.counter("n").add(1)
                elif r & 0x100:  # the sets: adds and removes of a few shared names
                    name = f"agent-{(r >> 9) % 5}"
                    ctx.gset("seen").add(name)
                    if (r >> 12) % 3:
                        ctx.orset("present").add(name)
                    else:
                        ctx.orset("present").discard(name)
                else:
                    ctx.text("notes").append(f"[{sn.index}]")
            except FeedNotWritable:  # refused before the doc changed
                self.stats["appends_refused"] += 1
                return
            items = []
            while (upd := ctx_view.pending_update()) is not None:
                items.append(upd)
        elif roll == 4:
            items = [NamesView.claim(f"role-{r % 3}")]
        elif roll == 5:
            items = [MaxRegisterView.encode(f"fence-{r % 2}", r % 1000)]
        else:
            items = [("app.note", {"n": sn.index, "r": r})]
        if not items:
            return
        try:
            assert sn.adapter is not None
            events = sn.adapter.append(items, now)
        except FeedNotWritable:
            self.stats["appends_refused"] += 1
            return
        self._acknowledge(sn, events)
        self._note("a", sn.index, events[-1].seq)
        self._flush(sn)

    # -- the claims workload -------------------------------------------------------

    def _claims_step(self, kind: int, data: Any) -> None:
        o = self.opts
        if kind == _TRY:
            index = data
            sn = self.nodes[index]
            if o.claim_tasks and sn.node is not None and sn.node.feed_gate.writable:
                # An executor's loop: first run anything we have won, then claim more.
                me = sn.identity.public
                for task, _seq in sn.claims.own_live(me):
                    if sn.claims.decided(task, self.now + sn.skew_ms, o.claim_settle_ms) == me:
                        self._execute(sn, task)
                free = [f"t{k}" for k in range(o.claim_tasks) if not sn.claims.is_claimed(f"t{k}")]
                if free:
                    task = free[self.work_rng.randrange(len(free))]
                    self.append(index, [("claim.intent", {"r": task})])
                    self._at(self.now + o.claim_settle_ms, _CHECK, (index, task, sn.incarnation))
            if o.claim_tasks:
                self._at(self.now + 200 + self.work_rng.randrange(800), _TRY, index)
            return
        index, task, incarnation = data
        sn = self.nodes[index]
        if sn.node is None or sn.incarnation != incarnation or sn.claims.is_done(task):
            return
        if not sn.node.feed_gate.writable:
            self._at(self.now + 200, _CHECK, data)
            return
        winner = sn.claims.decided(task, self.now + sn.skew_ms, o.claim_settle_ms)
        if winner == sn.identity.public:
            self._execute(sn, task)
        elif winner is None and sn.claims.winner(task) is not None:
            self._at(self.now + 200, _CHECK, data)

    def _execute(self, sn: SimNode, task: str) -> None:
        self.executions.append((task, sn.index))
        self._note("exec", task, sn.index)
        self.append(sn.index, [("claim.done", {"r": task})])

    # -- faults of a node's own feed (module docs) -----------------------------------

    def _crash(self, sn: SimNode) -> None:
        if sn.node is None:
            return
        sn.past_counters.update(sn.node.counters)
        sn.adapter = None
        sn.timer_at = None
        sn.commit_pending = False
        sn.paused_until = 0
        sn.links.clear()  # its side only: its peers' links to it are half-open now
        sn.dialling.clear()
        sn.dial_pending.clear()
        f = self.opts.faults
        if f.lost_fsync_probability and self.fault_rng.random() < f.lost_fsync_probability:
            torn = self.fault_rng.random() < f.torn_write_probability
            if sn.store.power_loss(self.fault_rng, torn=torn):
                self.stats["torn_writes" if torn else "lost_fsyncs"] += 1
        sn.store.sync()  # what the crash did not lose reached the disk
        self.stats["crashes"] += 1
        self._note("crash", sn.index)

    def _cut_off(self, sn: SimNode) -> None:
        addrs = sorted(self.by_addr)
        self.partition = {a: int(a == sn.identity.address) for a in addrs}
        self.stats["partitions"] += 1
        self._note("cut-off", sn.index)

    def _plan_damage(self, t: int, victim: int) -> None:
        """Cut ``victim`` off, let it write, crash it with a damaged log,
        restart it still cut off, heal later."""
        active = self.opts.active_ms
        self._at(t, _DAMAGE, (victim, "cut"))
        for dt in (100, 300, 600):
            self._at(t + dt, _APPEND, victim)
        tear = t + 800
        self._at(tear, _DAMAGE, (victim, "tear"))
        back = tear + self.fault_rng.randrange(200, 2_000)
        self._at(min(active, back), _RESTART, victim)
        self._at(min(active, back + self.fault_rng.randrange(500, 4_000)), _HEAL, None)

    def _own_feed_fault(self, kind: int, data: Any) -> None:
        if kind == _BACKUP:
            sn = self.nodes[data]
            if sn.node is not None:
                sn.backup = sn.store.copy()
            return
        if kind == _RESTORE:
            index, cut_off = data
            sn = self.nodes[index]
            if sn.node is not None:
                return
            sn.store = sn.backup.copy() if sn.backup is not None else DiskStore()
            self.stats["restores"] += 1
            if cut_off:
                self._cut_off(sn)
            self._boot(sn)
            self._note("restore", index, cut_off)
            return
        if kind == _DAMAGE:
            index, stage = data
            sn = self.nodes[index]
            if stage == "cut":
                if sn.node is not None:
                    self._cut_off(sn)
                return
            if sn.node is None or self.partition is None:
                return  # already down, or healed meanwhile: no damage this time
            self._crash(sn)
            me = sn.identity.public
            signed = sn.store.signed_seqs(me)
            lose = self.fault_rng.randrange(1, 5)
            keep = signed[-lose - 1] if len(signed) > lose else 0
            sn.store.truncate(me, keep)
            self.stats["log_damages"] += 1
            self._note("damage", index, keep)
            return
        self._operator()

    def _wait_for_resume(self, sn: SimNode, kind: int, data: Any) -> None:
        """An event for a paused node happens when it resumes (in order)."""
        if kind == _TIMER:
            if sn.timer_at != self.now or sn.incarnation != data[1]:
                return  # stale
            sn.timer_at = sn.paused_until
        self._at(sn.paused_until, kind, data)

    def _process_fault(self, kind: int, data: Any) -> None:
        """The group commit's sync, a paused process, a clock step."""
        index, arg = data
        sn = self.nodes[index]
        if kind == _COMMIT:
            if sn.adapter is not None and sn.incarnation == arg:
                sn.commit_pending = False
                sn.adapter.settle(self.now + sn.skew_ms)
                self._flush(sn)
            return
        if sn.node is None:
            return
        if kind == _PAUSE:
            sn.paused_until = max(sn.paused_until, self.now + arg)
            self.stats["pauses"] += 1
            self._note("pause", index, arg)
            return
        bound = 2 * self.opts.faults.clock_skew_max_ms
        e = self.epoch_ms
        sn.skew_ms = max(e - bound, min(e + bound, sn.skew_ms + arg))
        self.stats["clock_jumps"] += 1
        self._note("jump", index, sn.skew_ms)
        sn.timer_at = None  # re-armed on the new clock
        self._flush(sn)

    def _operator(self) -> None:
        """Accept a loss no live replica can repair (module docs)."""
        for sn in self.nodes:
            node = sn.node
            if node is None or node.feed_gate.state is not FeedState.RECOVERING:
                continue
            me = sn.identity.public
            held = node.journal.head(me).seq
            best = max(n.node.journal.head(me).seq for n in self.nodes if n.node is not None)
            if best > held:
                continue  # someone holds it: the node must recover it itself
            assert sn.adapter is not None
            sn.adapter.accept_feed_loss(self.now + sn.skew_ms)
            lost = {ev.id for ev in self.acknowledged if ev.author == me and ev.seq > held}
            self.given_up |= lost
            self.stats["operator_accepted_loss"] += 1
            self.stats["events_given_up"] += len(lost)
            self._note("operator", sn.index, held)
            self._flush(sn)

    def _partition(self, roll: float) -> None:
        addrs = sorted(self.by_addr)
        if roll < 0.5:
            victim = addrs[self.fault_rng.randrange(len(addrs))]
            self.partition = {a: int(a == victim) for a in addrs}
        else:
            self.partition = {a: self.fault_rng.randrange(2) for a in addrs}
        self.stats["partitions"] += 1
        self._note("partition", sorted(self.partition.items()))

    # -- the adversary ---------------------------------------------------------------

    def _forge(self, target: SimNode) -> None:
        if target.node is None:
            return
        rng = self.fault_rng
        victim = self.nodes[rng.randrange(len(self.nodes))]
        head = target.node.journal.head(victim.identity.public)
        choice = rng.randrange(3)
        if choice == 0:  # a real author's next event, signed by the wrong key
            ev = encode_event(
                victim.identity.public, head.seq + 1, head.hash, 1, "app.note", {"forged": 1}
            )
            sig = Identity.from_seed(rng.randbytes(32)).sign(head_message(ev.author, ev.seq, ev.id))
            frame = encode_frame(FrameType.EVENTS, ev.author, [ev.raw], sig, 0)
            self.forged.append(ev.id)
        elif choice == 1:  # a well-formed feed by an author nobody trusts
            outsider = Identity.from_seed(rng.randbytes(32))
            ev = encode_event(outsider.public, 1, b"\x00" * 32, 1, "app.note", {"spam": 1})
            sig = outsider.sign(head_message(ev.author, ev.seq, ev.id))
            frame = encode_frame(FrameType.EVENTS, ev.author, [ev.raw], sig, 0)
            self.forged.append(ev.id)
        else:  # a real frame seen on the wire with one byte flipped
            if not self.seen_frames:
                return
            original = self.seen_frames[rng.randrange(len(self.seen_frames))]
            pos = rng.randrange(len(original))
            frame = original[:pos] + bytes([original[pos] ^ 0x5A]) + original[pos + 1 :]
        self.stats["forgeries"] += 1
        before = sum(target.node.counters.values())
        assert target.adapter is not None
        target.adapter.receive("hmadversary", frame, self.now + target.skew_ms)
        if sum(target.node.counters.values()) == before:
            self.stats["forgeries_unnoticed"] += 1
        self._flush(target)
