"""SWIM membership in the simulator (``hivemesh sim --workload membership``).

Theory of operation
-------------------
:class:`SwimNet` runs real :class:`~hivemesh.core.membership.Membership`
machines over one heap of timed frames: seeded loss, delay (so reordering)
and duplication, directed cuts (partitions, broken links), crashed nodes
(silent) and stalled ones (their event loop blocked: input queues up, timers
do not run). Time jumps from frame to frame and from deadline to deadline.
It is the one SWIM network of the project: the membership tests and
``hivemesh bench swim`` drive it too.

:class:`MembershipCluster` is the campaign's workload. ``n`` nodes join
through the first; then, for ``ACTIVE_MS`` of simulated time under 0-10%
loss, the seed crashes nodes (some restart as a fresh process, some stay
dead), partitions the network into two sides, cuts single links and stalls
event loops. Then the network heals and every crashed node but the dead
ones restarts. Checks:

* **convergence** -- within three push-pull intervals plus the detection
  bound of the joins (gossip may miss a join under loss: the push-pull
  exchange repairs it), and as long after the heal, every live node sees
  every other live node up, and every dead node
  down or not at all (a partition heals by refutation through the push-pull
  exchange with down members);
* **completeness** -- then one more node crashes, on a perfect network: every
  live member marks it down within
  :meth:`~hivemesh.core.pex.MembershipConfig.detection_bound_ms`;
* **accuracy** -- no live node is ever marked down while the network is
  perfect and nothing is stalled (stat ``false_down``: downs of live nodes
  under loss, partitions and stalls, which SWIM allows, are counted, not
  failed).

The timing is memberlist's LAN configuration, the daemon's default.
"""

from __future__ import annotations

import hashlib
import heapq
import random
from collections.abc import Callable

from hivemesh.core.identity import address_of
from hivemesh.core.membership import MemberChange, Membership, MembershipConfig, MemberState
from hivemesh.sim.cluster import SimResult
from hivemesh.sim.options import SimOptions

__all__ = ["ACTIVE_MS", "MembershipCluster", "SwimNet", "swim_address"]

#: The faulty phase of the membership workload.
ACTIVE_MS = 40_000


def swim_address(i: int) -> str:
    """The address of simulated member ``i`` (1..255)."""
    return address_of(bytes([i]) * 32)


class SwimNet:
    """Timed delivery of SWIM frames with seeded loss, delay and duplication;
    crashed nodes go silent, stalled ones queue their input."""

    def __init__(
        self,
        seed: int | str,
        *,
        loss: float = 0.0,
        cfg: MembershipConfig | None = None,
        delay_ms: int = 10,
        dup: float = 0.0,
    ) -> None:
        self.seed = seed
        self.dup = dup
        self.cfg = cfg if cfg is not None else MembershipConfig.lan()
        self.loss = loss
        self.delay_ms = delay_ms
        self.rng = random.Random(f"{seed}/net")
        self.now = 0
        self.heap: list[tuple[int, int, str, str, bytes]] = []
        self.order = 0
        #: Live members by address.
        self.nodes: dict[str, Membership] = {}
        #: Every change any member reported: (observer, change).
        self.log: list[tuple[str, MemberChange]] = []
        #: Directed (src, dst) pairs whose frames are dropped.
        self.cut: set[tuple[str, str]] = set()
        #: Stalled members and the input waiting for them.
        self.stalled: dict[str, list[tuple[str, bytes]]] = {}
        self.frames = 0
        self.gen = 0

    def add(self, i: int, *, incarnation: int = 0) -> Membership:
        """Start member ``i`` (a fresh process: a restart is another ``add``)."""
        a = swim_address(i)
        self.gen += 1
        m = Membership(
            a,
            [f"10.0.0.{i}:7000"],
            random.Random(f"{self.seed}/{i}/{self.gen}"),
            self.cfg,
            self.now,
            self._sender(a),
            incarnation=incarnation,
        )
        self.nodes[a] = m
        return m

    def _sender(self, src: str) -> Callable[[str, bytes], None]:
        return lambda dst, frame: self._send(src, dst, frame)

    def crash(self, m: Membership) -> None:
        """Member ``m`` stops: no more input, timers or output."""
        del self.nodes[m.address]
        self.stalled.pop(m.address, None)

    def stall(self, m: Membership) -> None:
        """Block ``m``'s event loop: input queues up, timers wait."""
        self.stalled.setdefault(m.address, [])

    def resume(self, m: Membership) -> None:
        """End a stall the worst way round: timers first, then the queued input."""
        m.handle_timer(self.now)
        for src, frame in self.stalled.pop(m.address):
            m.receive(src, frame, self.now)

    def _send(self, src: str, dst: str, frame: bytes) -> None:
        self.frames += 1
        if (src, dst) in self.cut or self.rng.random() < self.loss:
            return
        for _ in range(2 if self.rng.random() < self.dup else 1):
            self.order += 1
            t = self.now + 1 + self.rng.randrange(self.delay_ms)
            heapq.heappush(self.heap, (t, self.order, src, dst, frame))

    def run(
        self,
        duration_ms: int,
        until: Callable[[], bool] | None = None,
        *,
        news_only: bool = False,
    ) -> bool:
        """Advance up to ``duration_ms``; stop early (True) once ``until()``.
        With ``news_only`` (for a condition on the members' states, such as
        :meth:`all_see`) it is asked again only after some member changed.

        Each member's next deadline sits on a timer heap, refreshed after
        every input it takes, so one event costs one member's work however
        many members there are."""
        end = self.now + duration_ms
        timers: list[tuple[int, str]] = []
        due: dict[str, int] = {}

        def arm(a: str) -> None:
            m = self.nodes.get(a)
            if m is None or a in self.stalled:
                due.pop(a, None)
                return
            d = m.next_deadline()
            if due.get(a) != d:
                due[a] = d
                heapq.heappush(timers, (d, a))

        for a in sorted(self.nodes):  # members may have been touched from outside
            self.log.extend((a, ch) for ch in self.nodes[a].changes())
            arm(a)
        seen = -1
        for _ in range(50_000_000):
            if until is not None and (not news_only or seen != len(self.log)):
                seen = len(self.log)
                if until():
                    return True
            while timers and due.get(timers[0][1]) != timers[0][0]:
                heapq.heappop(timers)  # stale: re-armed since, crashed or stalled
            t = timers[0][0] if timers else end + 1
            if self.heap:
                t = min(t, self.heap[0][0])
            if t > end:
                self.now = end
                return until is not None and until()
            self.now = now = max(self.now, t)
            touched: list[str] = []
            heap, nodes, stalled = self.heap, self.nodes, self.stalled
            while heap and heap[0][0] <= now:
                _, _, src, dst, frame = heapq.heappop(heap)
                if dst in stalled:
                    stalled[dst].append((src, frame))
                elif src in nodes and dst in nodes:
                    nodes[dst].receive(src, frame, now)
                    touched.append(dst)
            while timers and timers[0][0] <= now:
                _, a = heapq.heappop(timers)
                m = nodes.get(a)
                if m is not None and a not in stalled and m.next_deadline() <= now:
                    m.handle_timer(now)
                due.pop(a, None)
                touched.append(a)
            for a in sorted(set(touched)) if len(touched) > 1 else touched:
                m = nodes.get(a)
                if m is not None and a not in stalled:
                    chs = m.changes()
                    if chs:
                        self.log.extend((a, ch) for ch in chs)
                arm(a)
        raise AssertionError("simulation did not finish")

    def view(self, observer: Membership, target: str) -> MemberState | None:
        """What ``observer`` believes of ``target`` (None: never heard of it)."""
        return observer.state_of(target)

    def all_see(self, target: str, state: MemberState) -> Callable[[], bool]:
        """A condition: every live member but ``target`` sees it in ``state``."""

        def check() -> bool:
            return all(self.view(m, target) is state for a, m in self.nodes.items() if a != target)

        return check

    def everyone_up(self, dead: frozenset[str] = frozenset()) -> Callable[[], bool]:
        """A condition: every live member sees every other live member up and
        every address in ``dead`` down (or never heard of it: a member that
        restarted after its death need not learn of it)."""

        def check() -> bool:
            for a, m in self.nodes.items():
                for b in self.nodes:
                    if b != a and self.view(m, b) is not MemberState.UP:
                        return False
                for b in dead:
                    if self.view(m, b) not in (MemberState.DOWN, None):
                        return False
            return True

        return check


class MembershipCluster:
    """The ``membership`` workload of a seed campaign (module docs)."""

    def __init__(self, seed: str, opts: SimOptions) -> None:
        self.seed = seed
        self.n = opts.nodes
        self.rng = random.Random(f"{seed}/swim-faults")
        self.net = SwimNet(seed, loss=self.rng.choice((0.0, 0.05, 0.1)), dup=0.02, delay_ms=20)
        self.violations: list[str] = []
        self.stats: dict[str, int] = {}
        self.incarnation: dict[int, int] = {}

    def _count(self, name: str, k: int = 1) -> None:
        self.stats[name] = self.stats.get(name, 0) + k

    def run(self) -> SimResult:
        """Join, faults, heal, crash one more; check."""
        net, n, cfg = self.net, self.n, self.net.cfg
        first = net.add(1)
        for i in range(2, n + 1):
            net.add(i).join(first.address, first.endpoints, net.now)
        # gossip may miss a join under loss; the push-pull exchange repairs it:
        # the same bound as after a heal (three push-pull rounds + detection)
        bound = 3 * cfg.push_pull_interval_ms + cfg.detection_bound_ms(n)
        if not net.run(bound, net.everyone_up(), news_only=True):
            self.violations.append(f"{n} members did not all see each other up after joining")
        dead = self._active_phase()
        self._heal(dead)
        self._final_crash(dead)
        self._count("swim_frames", net.frames)
        digest = hashlib.blake2b(digest_size=16)
        for observer, ch in net.log:
            digest.update(f"{observer}:{ch.address}:{ch.state.value}:{ch.incarnation};".encode())
        return SimResult(self.seed, self.violations, digest.hexdigest(), dict(self.stats))

    def _active_phase(self) -> set[int]:
        """Crashes, restarts, partitions, broken links and stalls; the indexes
        of the nodes that stay dead."""
        net, n, rng, cfg = self.net, self.n, self.rng, self.net.cfg
        down: dict[int, int] = {}  # index -> restart time (or -1: stays dead)
        stalled: dict[int, int] = {}  # index -> resume time
        # accuracy is demanded once no fault has acted for this long
        quiet = cfg.suspicion_timeout_ms(n, 0) + 3 * cfg.probe_interval_ms
        last_fault = net.now
        end = net.now + ACTIVE_MS
        heal_at = -1
        while net.now < end:
            marked = len(net.log)
            calm = not (down or stalled or net.cut or net.loss) and net.now >= last_fault + quiet
            net.run(min(rng.randrange(1_000, 5_000), end - net.now))
            for observer, ch in net.log[marked:]:
                if ch.state is MemberState.DOWN and ch.address in net.nodes:
                    self._count("false_down")
                    if calm:
                        self.violations.append(
                            f"{observer[:12]} marked live {ch.address[:12]} down "
                            "on a perfect network"
                        )
            for i, t in sorted(down.items()):
                if 0 <= t <= net.now:
                    del down[i]
                    self._restart(i)
                    last_fault = net.now
            for i, t in sorted(stalled.items()):
                if t <= net.now:
                    del stalled[i]
                    net.resume(net.nodes[swim_address(i)])
                    last_fault = net.now
            if 0 <= heal_at <= net.now:
                net.cut.clear()
                heal_at = -1
                last_fault = net.now
            live = [i for i in range(1, n + 1) if i not in down and i not in stalled]
            if len(live) <= n // 2 + 1:
                continue  # keep a majority running
            roll = rng.random()
            victim = rng.choice(live)
            last_fault = net.now
            if roll < 0.3:
                down[victim] = -1 if rng.random() < 0.3 else net.now + rng.randrange(500, 8_000)
                net.crash(net.nodes[swim_address(victim)])
                self._count("crashes")
            elif roll < 0.5 and heal_at < 0:
                side = {swim_address(i) for i in range(1, n + 1) if rng.random() < 0.5}
                other = {swim_address(i) for i in range(1, n + 1)} - side
                net.cut |= {(x, y) for x in side for y in other}
                net.cut |= {(y, x) for x in side for y in other}
                heal_at = net.now + rng.randrange(2_000, 15_000)
                self._count("partitions")
            elif roll < 0.65 and heal_at < 0:
                a, b = (swim_address(i) for i in rng.sample(range(1, n + 1), 2))
                net.cut |= {(a, b), (b, a)}
                heal_at = net.now + rng.randrange(2_000, 15_000)
                self._count("broken_links")
            elif roll < 0.8:
                stalled[victim] = net.now + rng.randrange(1_000, 8_000)
                net.stall(net.nodes[swim_address(victim)])
                self._count("stalls")
        for i in sorted(stalled):
            net.resume(net.nodes[swim_address(i)])
        for i, t in sorted(down.items()):
            if t >= 0:
                self._restart(i)
        return {i for i, t in down.items() if t < 0}

    def _restart(self, i: int) -> None:
        """Member ``i`` comes back as a fresh process and joins through every
        live member: as a daemon whose configured peers are all the others
        does (each link that comes up to a member it does not know is a join).
        One contact only could leave it orphaned, knowing nobody alive and
        known by nobody, if that contact died for good."""
        m = self.net.add(i)
        for j in range(1, self.n + 1):
            a = swim_address(j)
            if j != i and a in self.net.nodes:
                m.join(a, [], self.net.now)
        self._count("restarts")

    def _heal(self, dead: set[int]) -> None:
        net = self.net
        net.cut.clear()
        net.loss = 0.0
        cfg = net.cfg
        bound = 3 * cfg.push_pull_interval_ms + cfg.detection_bound_ms(self.n)
        gone = frozenset(swim_address(i) for i in dead)
        t0 = net.now
        if not net.run(bound, net.everyone_up(gone), news_only=True):
            self.violations.append(
                f"membership did not converge within {bound} ms of the heal "
                f"({len(net.nodes)} live, {len(dead)} dead)"
            )
        self._count("heal_ms", net.now - t0)

    def _final_crash(self, dead: set[int]) -> None:
        net = self.net
        live = sorted(i for i in range(1, self.n + 1) if i not in dead)
        if len(live) < 3 or self.violations:
            return
        victim = net.nodes[swim_address(self.rng.choice(live))]
        # The active phase's accuracy rule: a DOWN counts as false only once no
        # fault has acted for a suspicion timeout and three probe rounds. The heal
        # ends at the first moment every member sees every other up, when a
        # suspicion raised before it (a stale duplicate delivered late, news the
        # suspect has not heard yet) can still run out; wait that long first.
        cfg = net.cfg
        settled = len(net.log)
        net.run(cfg.suspicion_timeout_ms(self.n, 0) + 3 * cfg.probe_interval_ms)
        for _observer, ch in net.log[settled:]:
            if ch.state is MemberState.DOWN and ch.address in net.nodes:
                self._count("false_down")
        marked = len(net.log)
        net.crash(victim)
        t0 = net.now
        bound = net.cfg.detection_bound_ms(len(live))
        if not net.run(bound, net.all_see(victim.address, MemberState.DOWN), news_only=True):
            self.violations.append(f"a crash was not seen by every member within {bound} ms")
        self._count("detect_ms", net.now - t0)
        self._no_false_down(marked, {victim.address})

    def _no_false_down(self, since: int, crashed: set[str]) -> None:
        for observer, ch in self.net.log[since:]:
            # a member that is dead for good may be learnt of late and then
            # marked down: that is no false DOWN (only live members count)
            live = ch.address in self.net.nodes
            if ch.state is MemberState.DOWN and ch.address not in crashed and live:
                self.violations.append(
                    f"{observer[:12]} marked live {ch.address[:12]} down on a perfect network"
                )
                return
