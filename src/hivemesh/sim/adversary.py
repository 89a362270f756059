"""A trusted peer with far-future and backdated clocks (``hivemesh sim --workload clock``).

Theory of operation
-------------------
:class:`ClockAdversaryCluster` is the journal workload with its last node
turned against the others. That node is a trusted member, chains and signs
its own feed correctly, runs the same core, and lies about time:

* **far future** -- after ``FUTURE_FROM_MS`` it stamps some events beyond the
  clock bound: up to ``FUTURE_MAX_MS`` past it (plausible, and released,
  later in the run) and, once, ``2**63 - 1`` (never plausible: its feed
  stops there for everyone else; one seed in five does this first);
* **backdated claims** -- from ``active_ms - ATTACK_WINDOW_MS`` on, when the
  honest nodes have held their names (``svc-<i>``, claimed in the first
  seconds) for longer than the ordering window, it claims each of them,
  and one free name, stamped ``hlc=1``.

Its other appends are plain notes nobody acknowledges (they may wait behind
its far-future events forever). The honest nodes run the journal workload
under the standard faults (crashes and restarts included).

Checks, besides the simulator's own (over the honest nodes only):

* **honest nodes keep writing** -- no honest append ever fails;
* **clock bound** -- no honest node's clock exceeds its physical time plus
  ``MAX_DRIFT_MS`` and no honest node applies an event stamped beyond that
  (both checked after every input: the events its Peer delivers);
* **names** -- the adversary owns no name on which an honest node holds a
  live claim that another honest node first applied more than the window
  plus twice the largest clock skew before the adversary claimed it
  (the bound :mod:`hivemesh.core.witness` promises);
* **counted** -- every honest replica lists each such refused attempt in
  :meth:`~hivemesh.core.views.names.NamesView.takeovers`.
"""

from __future__ import annotations

import random
from typing import Any

from hivemesh.core.effects import Deliver, Effect
from hivemesh.core.event import Event
from hivemesh.core.hlc import HLC, MAX_DRIFT_MS, hlc_ms, horizon, make_hlc
from hivemesh.core.views import NamesView
from hivemesh.core.views.names import KIND_CLAIM
from hivemesh.sim.cluster import Cluster, SimNode, SimResult
from hivemesh.sim.options import SimOptions

__all__ = ["ATTACK_WINDOW_MS", "FUTURE_FROM_MS", "FUTURE_MAX_MS", "ClockAdversaryCluster"]

_HONEST_CLAIM, _ADVERSARY = 2000, 2001  # heap event kinds, far from the simulator's own
#: The adversary's far-future stamps start after the honest names are claimed.
FUTURE_FROM_MS = 5_000
#: How far past the clock bound a releasable far-future stamp goes.
FUTURE_MAX_MS = 20_000
#: The backdated claims come in this last stretch of the active phase.
ATTACK_WINDOW_MS = 15_000
_HONEST_CLAIMS_BY_MS = 3_000
_MAX_HLC = (1 << 63) - 1


class ClockAdversaryCluster(Cluster):
    """The journal workload plus one trusted peer that lies about time."""

    def __init__(self, seed: str, opts: SimOptions) -> None:
        self.adv_rng = random.Random(f"{seed}/adversary")
        self.problems: list[str] = []
        self._broken: set[tuple[int, str]] = set()  # (node, check) already reported
        self._first_seen: dict[bytes, int] = {}  # honest claim id -> first applied by another
        self._honest_claims: dict[bytes, tuple[str, bytes, int]] = {}  # id -> name, author, hlc
        # (name, sim time, seq) of each backdated claim
        self._attacks: list[tuple[str, int, int]] = []
        self._checked = 0  # backdated claims on a protected name (see the names check)
        super().__init__(seed, opts)

    @property
    def adversary(self) -> SimNode:
        """The lying node (the last one)."""
        return self.nodes[-1]

    @property
    def honest(self) -> list[SimNode]:
        """Every node but the adversary."""
        return self.nodes[:-1]

    def converged(self) -> bool:
        """The simulator's test, and no honest node still holds a deferred
        batch that becomes plausible within the run."""
        end = self.opts.active_ms + self.opts.heal_ms + self.opts.faults.clock_skew_max_ms
        for sn in self.honest:
            if sn.node is not None and any(
                rec.release_ms <= end for rec in sn.node.deferrals.held.values()
            ):
                return False
        return super().converged()

    # -- schedule -----------------------------------------------------------------

    def _plan(self) -> None:
        super()._plan()
        rng, active = self.adv_rng, self.opts.active_ms
        for sn in self.honest:
            self._at(rng.randrange(_HONEST_CLAIMS_BY_MS), _HONEST_CLAIM, sn.index)
        attack_from = active - ATTACK_WINDOW_MS
        for _ in range(4):  # each released before the attack: the claims do not wait behind it
            at = rng.randrange(FUTURE_FROM_MS, attack_from - FUTURE_MAX_MS - 5_000)
            self._at(at, _ADVERSARY, "future")
        for sn in self.honest:
            self._at(rng.randrange(attack_from, active - 1_000), _ADVERSARY, f"svc-{sn.index}")
        self._at(rng.randrange(attack_from, active - 1_000), _ADVERSARY, "free-name")
        never_at = FUTURE_FROM_MS if rng.random() < 0.2 else active - 500
        self._at(never_at, _ADVERSARY, "never")

    def _dispatch(self, kind: int, data: Any) -> None:
        try:
            if kind == _HONEST_CLAIM:
                if self.nodes[data].node is not None:
                    self.append(data, [NamesView.claim(f"svc-{data}")])
            elif kind == _ADVERSARY:
                if self.adversary.node is not None:
                    self._lie(data)
            else:
                super()._dispatch(kind, data)
        except ValueError as exc:  # an append (a workload write, a witness) failed
            self._report(self.adversary, f"write {kind}", f"an honest node could not write: {exc}")

    # -- the adversary --------------------------------------------------------------

    def _lie(self, what: str) -> None:
        sn = self.adversary
        now = self.now + sn.skew_ms
        if what == "future":
            ahead = MAX_DRIFT_MS + 1 + self.adv_rng.randrange(FUTURE_MAX_MS)
            self._stamped(sn, "app.note", {"future": ahead}, make_hlc(now + ahead))
        elif what == "never":
            self._stamped(sn, "app.note", {"future": "never"}, _MAX_HLC)
        else:
            assert sn.node is not None
            self._attacks.append((what, self.now, sn.node.writer.head.seq + 1))
            self._stamped(sn, *NamesView.claim(what), 1)
        self._note("lie", what)

    def _stamped(self, sn: SimNode, kind: str, body: Any, hlc: int) -> None:
        """The adversary appends one event of its own stamped ``hlc``."""
        assert sn.node is not None
        writer = sn.node.writer
        honest_clock = writer.clock
        writer.clock = HLC(hlc - 1)
        try:
            sn.node.append(kind, body, 0)
        finally:
            writer.clock = honest_clock
        self._flush(sn)

    def _acknowledge(self, sn: SimNode, events: list[Event]) -> None:
        """As the simulator's, but nobody holds replicas to the adversary's
        events (they may wait behind one of its far-future ones for ever)."""
        if sn is not self.adversary:
            super()._acknowledge(sn, events)

    def _workload_append(self, sn: SimNode) -> None:
        if sn is self.adversary:
            self.append(sn.index, [("app.note", {"adversary": self.now})])
            return
        super()._workload_append(sn)

    # -- the checks made after every input --------------------------------------------

    def _flush(self, sn: SimNode) -> None:
        super()._flush(sn)  # the events applied come as Deliver effects (_effect)
        node = sn.node
        if node is not None and sn is not self.adversary:
            now = self.now + sn.skew_ms
            if hlc_ms(node.clock.last) > now + MAX_DRIFT_MS:
                self._report(sn, "clock", f"node {sn.index}'s clock was dragged past the bound")

    def _effect(self, sn: SimNode, e: Effect) -> None:
        if type(e) is not Deliver or sn is self.adversary:
            return
        limit = horizon(self.now + sn.skew_ms)
        for ev in e.events:
            if ev.hlc > limit:
                self._report(sn, "early", f"node {sn.index} applied an event beyond the bound")
            self._saw(sn, ev)

    def _saw(self, sn: SimNode, ev: Event) -> None:
        if ev.kind != KIND_CLAIM or ev.author == self.adversary.identity.public:
            return
        if ev.author == sn.identity.public:
            name = ev.body.get("n") if isinstance(ev.body, dict) else None
            self._honest_claims.setdefault(ev.id, (str(name), ev.author, ev.hlc))
        else:
            self._first_seen.setdefault(ev.id, self.now)

    def _report(self, sn: SimNode, check: str, problem: str) -> None:
        if (sn.index, check) not in self._broken:
            self._broken.add((sn.index, check))
            self.problems.append(problem)

    # -- the end of the run ---------------------------------------------------------

    def run(self) -> SimResult:
        """Run, then add the adversary's checks to the simulator's."""
        result = super().run()
        result.violations.extend(self.problems + self._name_problems())
        result.stats["backdated_claims"] = len(self._attacks)
        result.stats["backdated_claims_checked"] = self._checked
        return result

    def _name_problems(self) -> list[str]:
        skew = self.opts.faults.clock_skew_max_ms
        liar = self.adversary.identity
        out: list[str] = []
        for name, made_at, seq in self._attacks:
            protected = [
                (hlc, author)
                for cid, (n, author, hlc) in self._honest_claims.items()
                if n == name
                and cid in self._first_seen
                and self._first_seen[cid] + NamesView.window_ms + 2 * skew < made_at
            ]
            if not protected:
                continue
            # an attempt to report: its own stamp would have won (ties go to the smaller key)
            attempt = (1, liar.public) < min(protected)
            self._checked += 1
            for sn in self.honest:
                if sn.node is None or sn.node.journal.head(liar.public).seq < seq:
                    continue  # it waits behind a far-future event of the adversary
                view = next(v for v in sn.views if isinstance(v, NamesView))
                taken = [t for t in view.takeovers() if t["claimant"] == liar.address]
                if view.resolve(name) == liar.address:
                    out.append(f"node {sn.index}: the adversary took {name} with a backdated claim")
                elif attempt and not any(t["name"] == name for t in taken):
                    out.append(f"node {sn.index}: the backdated claim on {name} is not reported")
        return out
