"""The leases workload on Peers (``hivemesh sim --workload leases``).

Theory of operation
-------------------
:class:`LeaseCluster` is the simulated cluster (:mod:`hivemesh.sim.cluster`)
with every node's :class:`~hivemesh.core.peer.Peer` a lease voter
(:mod:`hivemesh.core.lease_swarm`; the voter set is every node, configured
alike everywhere) and up to four of them running an application that
acquires, renews and releases leases through the Peer's lease commands
(``LeaseAcquire``, ``LeaseRenew``, ``LeaseRelease``), as ``hivemesh.Node``
does. Lease messages are the Peers' ``LEASE`` frames over the simulated
links, under loss, duplication, reordering, partitions and crashes picked by
the seed; failures are found by the Peers' SWIM.

**The voter log.** A ``LeaseLog`` effect writes to the node's simulated voter
log (in its write cache); a ``LeaseSync`` syncs it ``fsync_ms`` later and
answers with the Peer's ``lease_synced`` input. A crash loses what was not
synced; the next life's Peer starts from the synced log
(:class:`~hivemesh.core.lease_swarm.LeaseSetup`, the voter then quarantined
for its longest TTL), as the daemon's :mod:`hivemesh.stores.voterlog`.

**Checks.** Every application operation is recorded as a
:class:`~hivemesh.verify.linearizability.Op` in simulated (true) time -- a
holder's belief is computed on its own clock, whose offset from true time is
its skew -- and the history is checked by
:func:`~hivemesh.verify.linearizability.check_history` (exclusion,
increasing fencing tokens; no spurious failure in seeds without crashes).
While it believes it holds a lease, an application's side effect goes
through one shared :class:`~hivemesh.leases.FencingGuard`: a valid holder's
token must never be refused.

**The split prepare (holder killed).** Once the random phase is over and the
cluster has converged (perfect network, every node up, voters out of
quarantine), the run replays the failure first seen on real processes
(``kill -9`` of a lease holder's node):

1. node ``h`` acquires ``split`` for a long TTL while the network carries its
   ``LEASE`` frames only to a bare majority of voters, its own among them;
2. node ``h`` crashes (its voter with it), so the live voters are split
   "held" (``majority - 1``) / "free" (the rest): with an odd number of
   voters, neither a free majority nor more than ``n - majority`` held can
   be reached without the dead voter;
3. node ``o`` acquires ``split``: it must fail (busy) before its deadline,
   not end ``unknown`` at the deadline (it did before wave 1's fix);
4. once the TTL has run out on every voter's clock, ``o`` acquires again: ok.

Steps 3 and 4 are checked (``split prepare ...`` violations); the operations
join the history.

**Knobs** (:class:`LeaseWorkload`; the defaults are the CI workload's). The
voter set may be the first ``voters`` nodes only, with ``clients``
applications on the first nodes (voters or not) and ``resources`` resources.
The network and the cluster's faults are the seed's (:func:`lease_options`)
unless given. On top of them: node crashes at ``crash_per_s`` (a Poisson
process while the applications run; the victim is a voter's node, which
restarts ``restart_after_ms`` later from its synced voter log), each node's
clock *rate* off by up to ``max_rate_skew`` (beside its offset; beyond the
drift bound :data:`~hivemesh.leases.DRIFT_RATIO` the checker must flag the
beliefs), and, to show the checks can fail, a broken driver that reports
the voter log synced before it is (``ack_before_sync``: a crash inside the
``fsync_ms`` window loses votes already acknowledged).

*Protocol variants.* The daemon's Peer runs a thrifty proposer (a majority
asked first) with fast acquire, and a voter with a token reserve of
:data:`~hivemesh.core.lease_swarm.TOKEN_RESERVE`. ``thrifty``,
``fast_acquire`` and ``token_reserve`` set other modes of the same
:class:`~hivemesh.core.lease_quorum.Proposer` and
:class:`~hivemesh.core.lease_voter.Voter`, so the protocol's own tests run
them on Peers too: the one place the simulator sets them is
:meth:`LeaseCluster._new_adapter`, on the Peer's voter and proposer before
the Peer takes any input (a :class:`~hivemesh.core.trace.Trace` does not
record them: a variant's trace replays as the daemon's wiring).
"""

from __future__ import annotations

import contextlib
import heapq
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from hivemesh.commands.coordination import LeaseAcquire, LeaseRelease, LeaseRenew
from hivemesh.core.effects import Effect, LeaseLog, LeaseSync, Reply
from hivemesh.core.frames import FrameType
from hivemesh.core.lease_quorum import Outcome
from hivemesh.core.lease_swarm import TOKEN_RESERVE, LeaseSetup
from hivemesh.core.lease_voter import DurableBounds
from hivemesh.core.peer import PeerConfig
from hivemesh.leases import DRIFT_MS, DRIFT_RATIO, FencingGuard
from hivemesh.leases.errors import StaleFencingToken
from hivemesh.sim.cluster import Cluster, SimNode, SimResult
from hivemesh.sim.options import FaultOptions, NetworkOptions, SimOptions
from hivemesh.sim.peer_adapter import PeerAdapter
from hivemesh.verify.linearizability import Op, check_history

__all__ = ["SPLIT_TTL_MS", "LeaseCluster", "LeaseWorkload", "lease_options"]

#: The split-prepare scenario's lease: long enough that only the fix answers
#: before the competing acquire's deadline.
SPLIT_TTL_MS = 3_000
_SPLIT = "split"
_ACT = 3000  # heap event kind: a client's next step (far from the cluster's own)
_SYNC = 3001  # heap event kind: a voter log's sync completes
_KILL = 3002  # heap event kind: a voter's node crashes (``crash_per_s``)
_REVIVE = 3003  # heap event kind: ... and restarts
#: Client operations' deadline, TTLs, and the time a voter log's sync takes.
TIMEOUT_MS = 1_000
TTLS_MS = (300, 600, 1_200)
FSYNC_MS = 2


def lease_options(nodes: int, seed: str) -> SimOptions:
    """The workload's options for ``seed`` (network loss and crash and
    partition rates picked by the seed)."""
    r = random.Random(f"{seed}/lease-variant")
    return SimOptions(
        nodes=nodes,
        appends=0,
        active_ms=12_000,
        heal_ms=30_000,
        network=NetworkOptions(
            one_way_delay_mean_ms=2,
            one_way_delay_jitter_ms=r.choice((3, 10)),
            packet_loss_probability=r.choice((0.0, 0.05, 0.1, 0.2)),
            packet_replay_probability=0.05,
        ),
        faults=FaultOptions(
            partition_probability=r.choice((0.0, 0.2)),
            crash_probability=r.choice((0.0, 0.3, 0.5)),
            forgeries=0,
            clock_skew_max_ms=2_000,
        ),
    )


@dataclass(frozen=True, slots=True)
class LeaseWorkload:
    """What the applications do, and the faults and protocol variants on
    top of the cluster's (module docs). The defaults are the CI workload's:
    the daemon's wiring, with the network and faults the seed picks."""

    #: The voter set: the first ``voters`` nodes (None: every node).
    voters: int | None = None
    #: Applications, on the first nodes (at most one a node).
    clients: int = 4
    ops_per_client: int = 20
    #: Resources the applications pick from (None: the seed picks 1 or 2).
    resources: int | None = None
    ttls_ms: tuple[int, ...] = TTLS_MS
    #: Each application operation's deadline.
    timeout_ms: int = TIMEOUT_MS
    #: The network and the cluster's faults (None: :func:`lease_options`'s).
    network: NetworkOptions | None = None
    faults: FaultOptions | None = None
    #: Crashes of voters' nodes per simulated second, while applications run.
    crash_per_s: float = 0.0
    restart_after_ms: tuple[int, int] = (5, 300)
    #: Each node's clock runs at ``1 + r``, ``r`` uniform in +-this.
    max_rate_skew: float = 0.0
    #: A voter log's sync takes this long.
    fsync_ms: int = FSYNC_MS
    #: A broken driver: the voter log is reported synced at once (its
    #: writes reach the disk ``fsync_ms`` later).
    ack_before_sync: bool = False
    #: Protocol variants (module docs; the defaults are the daemon's).
    thrifty: bool = True
    fast_acquire: bool = True
    token_reserve: int = TOKEN_RESERVE
    #: End with the split prepare (module docs).
    split_prepare: bool = True


@dataclass
class _Client:
    """One node's application: its lease, and its operation in flight."""

    index: int
    rng: random.Random
    ops_left: int
    lease: tuple[str, int, int, int] | None = None  # resource, token, ttl, belief (local ms)
    renews_left: int = 0
    #: rid, kind, resource, invoked (sim ms), invoked (local ms), ttl, token
    #: presented (renew, release; None: acquire)
    inflight: tuple[int, str, str, int, int, int, int | None] | None = None
    on_outcome: Callable[[str, Op, Outcome | None], None] | None = None

    @property
    def name(self) -> str:
        return f"c{self.index}"


@dataclass
class _VoterLog:
    """A node's simulated voter log: synced state, and the writes not yet synced."""

    synced: DurableBounds | None = None  # None: nothing synced yet
    cached: list[tuple[str, int, int]] = field(default_factory=list)
    writes: int = 0  # writes asked for in this life (LeaseSync counts them)

    def state(self) -> dict[str, Any] | None:
        return None if self.synced is None else self.synced.state()

    def sync(self) -> None:
        """The cached writes reach the disk: folded as the daemon's log folds them."""
        if self.synced is None:
            self.synced = DurableBounds()
        for resource, bound, ttl in self.cached:
            self.synced.change(resource, bound, ttl)
        self.cached.clear()


class LeaseCluster(Cluster):
    """The leases workload (module docs)."""

    #: The voters' clocks never read below zero (a new voter's "not
    #: quarantined" is a time before any clock reading: -1).
    epoch_ms = 1_000_000

    def __init__(
        self, seed: str, opts: SimOptions, *, workload: LeaseWorkload | None = None
    ) -> None:
        """``opts``: only ``nodes`` is read (the rest: :func:`lease_options`
        and ``workload``)."""
        w = self.workload = workload or LeaseWorkload()
        self._logs: dict[int, _VoterLog] = {}
        self.guard = FencingGuard()
        self.ops: list[Op] = []
        self.problems: list[str] = []
        self.lease_crashes = 0
        self.log_writes_lost = 0  # voter log writes a crash lost (not synced)
        self._cut_lease: set[tuple[int, int]] = set()  # (src, dst) dropping LEASE frames
        lease_opts = self.options(opts.nodes, seed)
        if w.network is not None:
            lease_opts = replace(lease_opts, network=w.network)
        if w.faults is not None:
            lease_opts = replace(lease_opts, faults=w.faults)
        r = random.Random(f"{seed}/lease-variant/resources")
        count = r.choice((1, 1, 2)) if w.resources is None else w.resources
        self.resources = [f"res{i}" for i in range(count)]
        self.clients = [
            _Client(i, random.Random(f"{seed}/client/{i}"), w.ops_per_client)
            for i in range(min(opts.nodes, w.clients))
        ]
        #: The voters' nodes (indices).
        self.voter_nodes = list(range(min(opts.nodes, w.voters or opts.nodes)))
        self._crash_rng = random.Random(f"{seed}/lease-crash")
        #: Each node's clock rate, less one (module docs), and its offset
        #: from the rate accumulated up to ``_ticked``.
        r = random.Random(f"{seed}/lease-clock")
        self._rates = [r.uniform(-1, 1) * w.max_rate_skew for _ in range(opts.nodes)]
        self._ticked = 0
        super().__init__(seed, lease_opts)

    @staticmethod
    def options(nodes: int, seed: str) -> SimOptions:
        """This run's options (:func:`lease_options`; a test may harden them)."""
        return lease_options(nodes, seed)

    # -- the Peers' lease wiring -------------------------------------------------------

    def _peer_config(self, sn: SimNode) -> PeerConfig:
        voters = tuple(sorted(self.nodes[i].identity.address for i in self.voter_nodes))
        return replace(super()._peer_config(sn), lease_voters=voters)

    def _lease_setup(self, sn: SimNode) -> LeaseSetup:
        log = self._logs.setdefault(sn.index, _VoterLog())
        log.writes = 0
        return LeaseSetup(voter_state=log.state())

    def _new_adapter(self, sn: SimNode) -> PeerAdapter:
        """This life's Peer, its lease voter and proposer set to the
        workload's protocol variant (module docs)."""
        adapter = super()._new_adapter(sn)
        w = self.workload
        leases = adapter.peer.leases
        leases.voter.token_reserve = w.token_reserve
        if not (w.thrifty and w.fast_acquire):
            leases.voters(self.now + sn.skew_ms)  # the proposer, on the configured set
            p = leases.proposer
            assert p is not None
            p.fanout = p.fanout if w.thrifty else 0
            p.fast_acquire = w.fast_acquire
        return adapter

    def _effect(self, sn: SimNode, e: Effect) -> None:
        if type(e) is LeaseLog:
            log = self._logs[sn.index]
            log.cached.append((e.resource, e.bound, e.max_ttl_ms))
            log.writes += 1
        elif type(e) is LeaseSync:
            self._at(self.now + self.workload.fsync_ms, _SYNC, (sn.index, sn.incarnation, e.upto))
            if self.workload.ack_before_sync:  # the broken driver (module docs)
                assert sn.adapter is not None
                sn.adapter.lease_synced(e.upto, None, self.now + sn.skew_ms)
        elif type(e) is Reply:
            c = self._client(sn.index)
            if c is None or c.inflight is None or c.inflight[0] != e.rid:
                return
            if isinstance(e.value, Outcome):
                self._outcome(c, e.value)
            else:  # refused before it ran: the workload's own mistake
                self.problems.append(f"lease command refused: {e.error!r}")
                self._record(c, None)

    def _send(self, src: SimNode, dst: SimNode, frame: bytes) -> None:
        cut = (src.index, dst.index) in self._cut_lease
        if cut and len(frame) > 2 and frame[2] == FrameType.LEASE:
            self.stats["lease_frames_cut"] += 1
            return
        super()._send(src, dst, frame)

    def _crash(self, sn: SimNode) -> None:
        if sn.node is not None:
            log = self._logs[sn.index]
            self.log_writes_lost += len(log.cached)
            log.cached.clear()  # the unsynced voter log writes are lost
            self.lease_crashes += 1
            c = self._client(sn.index)
            if c is not None and c.inflight is not None:  # it never learns the outcome
                self._record(c, None)
            if c is not None:
                c.lease = None
        super()._crash(sn)

    def _boot(self, sn: SimNode) -> None:
        super()._boot(sn)
        c = self._client(sn.index)
        if c is not None and sn.incarnation > 1 and c.on_outcome is None:
            self._at(self.now + c.rng.randrange(50), _ACT, c.index)

    def _dispatch(self, kind: int, data: Any) -> None:
        self._tick_clocks()
        if kind == _ACT:
            c = self._client(data)
            if c is not None and c.on_outcome is None:
                self._act(c)
        elif kind == _SYNC:
            index, incarnation, upto = data
            sn = self.nodes[index]
            if sn.adapter is None or sn.incarnation != incarnation:
                return
            self._logs[index].sync()
            if not self.workload.ack_before_sync:  # (it was reported synced already)
                sn.adapter.lease_synced(upto, None, self.now + sn.skew_ms)
                self._flush(sn)
        elif kind in (_KILL, _REVIVE):
            self._crash_fault(kind, data)
        else:
            super()._dispatch(kind, data)

    def _tick_clocks(self) -> None:
        """Each node's clock offset grows (or shrinks) with its rate: every
        reading after this sees ``now * (1 + rate)`` plus its offset."""
        if self._ticked == self.now or not any(self._rates):
            return
        before, self._ticked = self._ticked, self.now
        for sn, rate in zip(self.nodes, self._rates, strict=True):
            sn.skew_ms += math.floor(rate * self.now) - math.floor(rate * before)

    def _true_ms(self, index: int, local_ms: float, at: int, at_local_ms: int) -> float:
        """When (sim ms) node ``index``'s clock reads ``local_ms``, given
        that it read ``at_local_ms`` at ``at``."""
        rate = self._rates[index]
        if not rate:
            return local_ms - (at_local_ms - at)
        return at + (local_ms - at_local_ms) / (1 + rate)

    def _crash_fault(self, kind: int, index: int) -> None:
        """A voter's node crashes (``crash_per_s``), or restarts."""
        w = self.workload
        if kind == _REVIVE:
            sn = self.nodes[index]
            if sn.adapter is None and not self.healing:
                self._boot(sn)
                self._note("restart", index)
            return
        if self.healing or not self._busy():
            return
        r = self._crash_rng
        sn = self.nodes[r.choice(self.voter_nodes)]
        if sn.adapter is not None:
            self._crash(sn)
            self._at(self.now + r.randint(*w.restart_after_ms), _REVIVE, sn.index)
        self._at(self.now + 1 + int(r.expovariate(w.crash_per_s) * 1000), _KILL, None)

    def _client(self, index: int) -> _Client | None:
        return self.clients[index] if index < len(self.clients) else None

    # -- the applications -----------------------------------------------------------------

    def _local(self, c: _Client) -> int:
        self._tick_clocks()
        return self.now + self.nodes[c.index].skew_ms

    def _start(self, c: _Client, kind: str, cmd: Any, ttl: int) -> None:
        sn = self.nodes[c.index]
        assert sn.adapter is not None
        c.ops_left -= 1
        cmd = replace(cmd, timeout_s=self.workload.timeout_ms / 1000)
        local = self._local(c)
        rid = sn.adapter.command(cmd, local)
        token = getattr(cmd, "token", None)  # a renew's or release's, known before any answer
        c.inflight = (rid, kind, cmd.resource, self.now, local, ttl, token)
        self._flush(sn)

    def _act(self, c: _Client) -> None:
        sn = self.nodes[c.index]
        if c.inflight is not None or sn.adapter is None:
            return
        if c.lease is None:
            if c.ops_left <= 0:
                return
            ttl = c.rng.choice(self.workload.ttls_ms)
            resource = c.rng.choice(self.resources)
            self._start(c, "acquire", LeaseAcquire(resource, c.name, ttl), ttl)
            return
        resource, token, ttl, belief = c.lease
        if self._local(c) < belief:
            with contextlib.suppress(StaleFencingToken):  # counted by guard.rejected
                self.guard.check(token, resource)  # the side effect, fenced
                self.stats["lease_fenced_effects"] += 1
        if c.renews_left > 0 and c.ops_left > 0:
            c.renews_left -= 1
            self._start(c, "renew", LeaseRenew(resource, c.name, token, ttl), ttl)
        elif c.rng.random() < 0.8 and c.ops_left > 0:
            self._start(c, "release", LeaseRelease(resource, c.name, token), 0)
        else:
            c.lease = None  # abandon: let it expire
            self._at(self.now + c.rng.randrange(20), _ACT, c.index)

    def _outcome(self, c: _Client, ev: Outcome) -> None:
        assert c.inflight is not None
        kind = c.inflight[1]
        status, op = self._record(c, ev)
        if c.on_outcome is not None:
            c.on_outcome(status, op, ev)
            return
        if kind in ("acquire", "renew") and status == "ok":
            if kind == "acquire":
                c.renews_left = c.rng.randint(0, 3)
            assert c.lease is not None
            self._at(self.now + c.rng.randrange(int(c.lease[2] * 0.45)), _ACT, c.index)
        else:  # an application backs off before it tries again (dueling prepares)
            self._at(self.now + 50 + c.rng.randrange(400), _ACT, c.index)

    def _record(self, c: _Client, ev: Outcome | None) -> tuple[str, Op]:
        """Close ``c``'s operation in flight with ``ev`` (None: its node
        crashed first: unknown); its history entry."""
        assert c.inflight is not None
        _, kind, resource, invoked, invoked_local, ttl, presented = c.inflight
        c.inflight = None
        if ev is None:
            # A renew or release records the token it presented even when its
            # node died first: the checker cuts the grant's belief at the
            # release's invocation (the holder stopped acting), and must be
            # able to match it to the grant (CI seed 8283: a release applied at
            # every voter, the node crashed before the reply, and the next
            # holder's grant was reported as overlapping the released lease).
            status, token = "unknown", presented
        else:
            status = "unknown" if ev.status == "fail" and ev.partial else ev.status
            token = ev.token
        # the holder believes its lease on its own clock (rate and offset)
        belief_local = int(invoked_local + ttl * (1 - DRIFT_RATIO) - DRIFT_MS)
        ok = status == "ok"
        valid_until = None
        if ok and kind != "release":
            valid_until = self._true_ms(c.index, belief_local, invoked, invoked_local)
        op = Op(c.name, kind, resource, invoked, self.now, status, token, ttl, valid_until)  # type: ignore[arg-type]
        self.ops.append(op)
        if ok and kind in ("acquire", "renew"):
            assert token is not None
            c.lease = (resource, token, ttl, belief_local)
        else:
            c.lease = None
        return status, op

    def _busy(self) -> bool:
        return any(c.ops_left > 0 or c.inflight is not None for c in self.clients)

    # -- the run ------------------------------------------------------------------------

    def _plan(self) -> None:
        super()._plan()
        for c in self.clients:
            self._at(500 + c.rng.randrange(1_000), _ACT, c.index)  # links and SWIM first
        w = self.workload
        if w.crash_per_s > 0:
            self._at(500 + int(self._crash_rng.expovariate(w.crash_per_s) * 1000), _KILL, None)

    def converged(self) -> bool:
        """The cluster's test, with every application done."""
        return not self._busy() and super().converged()

    def _run_while(self, more: Callable[[], bool], for_ms: int) -> None:
        """Process heap events while ``more()``, for at most ``for_ms``."""
        end = self.now + for_ms
        while more() and self._heap and self._heap[0][0] <= end:
            t, _, kind, data = heapq.heappop(self._heap)
            self.now = t
            self._dispatch(kind, data)
        if more():
            self.now = max(self.now, end)

    def run(self) -> SimResult:
        """Run the random phase, then the split prepare, then the checks."""
        res = super().run()
        crashes = self.lease_crashes  # of the random phase (the split kills one more)
        if not res.violations and self.healing and self.workload.split_prepare:
            self._split_prepare()
        # A restarted voter refuses, quarantined, without a witness: no spurious
        # check under crashes (as in the quorum lease tests).
        spurious = crashes == 0
        net = self.opts.network
        slack = 2 * (net.one_way_delay_mean_ms + 4 * net.one_way_delay_jitter_ms) + 60
        found = check_history(self.ops, slack_ms=slack, spurious=spurious, replicated=True)
        res.violations += [f"{v.rule}: {v.detail}" for v in found] + self.problems
        if self.guard.rejected:
            res.violations.append(
                f"{self.guard.rejected} fenced effects refused a valid holder's token"
            )
        res.stats.update(
            lease_ops=len(self.ops),
            lease_ok=sum(1 for op in self.ops if op.outcome == "ok"),
            lease_unknown=sum(1 for op in self.ops if op.outcome == "unknown"),
            lease_split_prepares=int(any(op.resource == _SPLIT for op in self.ops)),
            lease_crashes=self.lease_crashes,
            lease_log_writes_lost=self.log_writes_lost,
        )
        res.stats["lease_fenced_effects"] = self.stats["lease_fenced_effects"]
        self.trace.update(repr(self.ops).encode())
        res.trace_digest = self.trace.hexdigest()
        return res

    # -- the split prepare (module docs) ---------------------------------------------------

    def _split_prepare(self) -> None:
        voters = self.voter_nodes
        n = len(voters)
        timeout = self.workload.timeout_ms
        slow = 1 + 2 * self.workload.max_rate_skew  # the slowest clock against the fastest
        candidates = [
            c for c in self.clients if c.index in voters and self.nodes[c.index].adapter is not None
        ]
        others = [c for c in self.clients if self.nodes[c.index].adapter is not None]
        if not candidates or len(others) < 2 or n < 3:
            return
        r = random.Random(f"{self.seed}/split")
        # every voter out of quarantine and every lease of the random phase run out
        self.run_until(self.now + int(2 * max(self.workload.ttls_ms) * slow) + 2 * DRIFT_MS + 500)
        if len(candidates) == len(others):  # (as it was when every node voted)
            h, other = r.sample(candidates, 2)
        else:
            h = r.choice(candidates)
            other = r.choice([c for c in others if c is not h])
        majority = n // 2 + 1
        rest = [i for i in voters if i != h.index]
        granted = {h.index, *r.sample(rest, majority - 1)}
        self._cut_lease = {(h.index, i) for i in voters if i not in granted}
        got: list[tuple[str, Op]] = []

        def keep(status: str, op: Op, _ev: Outcome | None) -> None:
            got.append((status, op))

        h.on_outcome = other.on_outcome = keep
        h.lease = other.lease = None
        self._start(h, "acquire", LeaseAcquire(_SPLIT, h.name, SPLIT_TTL_MS), SPLIT_TTL_MS)
        self._run_while(lambda: not got, 10 * timeout)
        if not got or got[0][0] != "ok":
            self.problems.append(f"split prepare: the holder's acquire ended {got[:1]}")
            return
        self._crash(self.nodes[h.index])  # kill -9: its voter and its application
        self._cut_lease = set()
        invoked = self.now
        self._start(other, "acquire", LeaseAcquire(_SPLIT, other.name, 100), 100)
        self._run_while(lambda: len(got) < 2, 10 * timeout)
        if len(got) < 2 or got[1][0] != "fail" or got[1][1].complete_ms >= invoked + timeout:
            self.problems.append(
                "split prepare: an acquire of a lease held at a bare majority whose holder's "
                f"node died ended {got[1][0] if len(got) > 1 else 'never'} "
                f"after {(got[1][1].complete_ms if len(got) > 1 else self.now) - invoked:.0f} ms "
                f"(must fail as held before its {timeout} ms deadline)"
            )
            return
        self.run_until(self.now + int(SPLIT_TTL_MS * slow) + 2 * DRIFT_MS + 100)
        self._start(other, "acquire", LeaseAcquire(_SPLIT, other.name, 100), 100)
        self._run_while(lambda: len(got) < 3, 10 * timeout)
        if len(got) < 3 or got[2][0] != "ok":
            self.problems.append(
                "split prepare: once the dead holder's lease ran out, acquiring it ended "
                f"{got[2][0] if len(got) > 2 else 'never'} (must be ok)"
            )
