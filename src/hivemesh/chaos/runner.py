"""One chaos run: cluster up, workload on, faults by the seed, heal, checks.

Phases, each under a deadline (so a run takes at most its duration plus
about four minutes: 30 s per node start, 60 s for the acknowledged writes
to converge, 30 s for each of the other checks):

1. **Up.** One ``hivemesh up`` per namespace (:mod:`hivemesh.chaos.hosts`);
   the run waits until every node has a channel to every other.
2. **Load and faults.** The workload (:mod:`hivemesh.chaos.workload`) runs
   for ``duration_s`` while the faults of :func:`~hivemesh.chaos.scenarios.schedule`
   start and end on time; every action lands in the timeline.
3. **Heal.** Every network rule is removed, paused nodes continue, dead
   nodes restart, disks get room; the workload stops.
4. **Checks** (each an entry of the report, a failed one an anomaly):

   * ``acked_writes``: every acknowledged context write is on every node;
   * ``views_equal``: every node holds the same ``chaos`` context and the
     same version vector (the journal's heads);
   * ``leases``: :func:`hivemesh.verify.check_history` finds no violation
     of exclusion or token order in the recorded lease calls (safety rules;
     refusals without a witness are reported, not failed: partitions and
     pauses cause them legitimately), and the fenced resource accepted
     tokens in strictly increasing order per grant;
   * ``telemetry``: each acknowledged record is stored exactly once at the
     collector, or inside a gap the collector reports (in broker mode no
     gap: the JetStream queue loses nothing, the run waits up to 75 s);
   * ``alive``: no half-alive daemon: every node answers ``status`` with
     every supervised task running and none stalled or failed, no node
     exited on its own during the run, and no daemon log holds a traceback.

   * ``links`` (scenario ``nat``): within :data:`LINKS_S` every node has a
     link (direct, punched or relayed) to every other one again;
   * ``audit_*`` (scenario ``audit``): the price audit's own checks
     (:mod:`hivemesh.chaos.audit`); the run waits up to
     :data:`AUDIT_FINISH_S` for the audit to finish after the heal.

   * ``plan``: root goals posted from random nodes during the run; every
     acknowledged goal is in every node's plan and every node's plan view
     has the same digest. The planner roles (decomposers, scorers,
     executors with an LLM) do not run in the lab: the tree checked is the
     goals', not a decomposed plan's.
"""

from __future__ import annotations

import contextlib
import importlib.util
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hivemesh.chaos.hosts import ChaosCluster, ChaosNode, ChaosService
from hivemesh.chaos.scenarios import SCENARIOS, Fault, schedule
from hivemesh.chaos.workload import CONTEXT, LeaseWorkload, PlanGoals, Telemetry, Writers
from hivemesh.errors import HivemeshError, InvalidArgument
from hivemesh.verify import check_history

__all__ = ["Check", "Report", "run_scenario"]

#: Bound on the heal-and-converge phase.
CONVERGE_S = 60.0
#: Bound on the audit's finishing after the heal (scenario ``audit``).
AUDIT_FINISH_S = 180.0
#: Bound on the links between every two nodes coming back (scenario ``nat``).
LINKS_S = 60.0
#: The lab's NATS server (scenario ``broker``): port and where it listens.
NATS_PORT = 4222


@dataclass
class Check:
    """One end-of-run check."""

    name: str
    ok: bool
    detail: str


@dataclass
class Report:
    """What a run found (``to_json`` for ``--json``)."""

    scenario: str
    seed: int
    nodes: int
    duration_s: float
    timeline: list[tuple[float, str]] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)
    faults: list[str] = field(default_factory=list)
    error: str = ""
    wall_s: float = 0.0

    @property
    def verdict(self) -> str:
        """``pass``, ``fail`` (a check failed) or ``error`` (the run itself broke)."""
        if self.error:
            return "error"
        return "pass" if self.checks and all(c.ok for c in self.checks) else "fail"

    @property
    def anomalies(self) -> list[str]:
        """The failed checks (and the run's own error)."""
        out = [f"{c.name}: {c.detail}" for c in self.checks if not c.ok]
        return [*out, self.error] if self.error else out

    def replay(self) -> str:
        """The command that runs the same schedule again."""
        return (
            f"hivemesh chaos --scenario {self.scenario} --nodes {self.nodes} "
            f"--duration {self.duration_s:g} --seed {self.seed}"
        )

    def to_json(self) -> dict[str, Any]:
        """A JSON-able summary."""
        return {
            "verdict": self.verdict,
            "scenario": self.scenario,
            "seed": self.seed,
            "nodes": self.nodes,
            "duration_s": self.duration_s,
            "replay": self.replay(),
            "faults": self.faults,
            "timeline": [[round(t, 2), e] for t, e in self.timeline],
            "checks": [c.__dict__ for c in self.checks],
            "anomalies": self.anomalies,
            "stats": self.stats,
            "wall_s": round(self.wall_s, 1),
        }

    def render(self) -> str:
        """A human-readable report."""
        lines = [
            f"chaos {self.scenario} seed {self.seed}: {self.verdict.upper()} "
            f"({self.nodes} nodes, {self.duration_s:g} s, wall {self.wall_s:.0f} s)",
            "timeline:",
            *(f"  {t:6.2f}s  {e}" for t, e in self.timeline),
            "checks:",
            *(f"  {'ok  ' if c.ok else 'FAIL'} {c.name}: {c.detail}" for c in self.checks),
        ]
        if self.error:
            lines.append(f"error: {self.error}")
        lines.append(f"replay: {self.replay()}")
        return "\n".join(lines)


class _Run:
    def __init__(self, cluster: ChaosCluster, report: Report, t0: float) -> None:
        self.cluster = cluster
        self.report = report
        self.t0 = t0
        self.writers: Writers | None = None
        self.copies: dict[int, Path] = {}
        #: the lab's NATS server (scenario ``broker``)
        self.nats: ChaosService | None = None

    def log(self, event: str) -> None:
        self.report.timeline.append((time.monotonic() - self.t0, event))

    def node(self, i: int) -> ChaosNode:
        return self.cluster.nodes[i]

    def restart(self, node: ChaosNode) -> None:
        try:
            self.cluster.start(node)
            self.log(f"{node.label} restarted")
        except HivemeshError as exc:  # refused, typed: it stays down until the heal
            self.log(f"{node.label} refused to start: {exc.code}: {str(exc)[:160]}")

    # -- faults --------------------------------------------------------------

    def apply(self, f: Fault) -> None:
        faults = self.cluster.faults
        assert faults is not None
        hosts = [self.node(i).host for i in f.targets]
        if f.kind == "kill":
            self.cluster.kill(self.node(f.targets[0]))
        elif f.kind == "pause":
            self.cluster.pause(self.node(f.targets[0]))
        elif f.kind == "clock":
            node = self.node(f.targets[0])
            self.cluster.kill(node)
            node.clock_offset_s = f.value
            self.restart(node)
        elif f.kind == "diskfull":
            node = self.node(f.targets[0])
            if node.small_disk:
                self.cluster.fill_disk(node)
        elif f.kind == "restore":
            node = self.node(f.targets[0])
            self.cluster.kill(node)
            self.copies[f.targets[0]] = self.cluster.snapshot_store(node)
            self.restart(node)
        elif f.kind == "natskill":
            assert self.nats is not None
            self.cluster.stop_service(self.nats, signal.SIGKILL)
        elif f.kind == "natscut":
            assert self.nats is not None
            faults.cut(hosts[0], self.nats.host)
        elif f.kind == "conntrack":
            for i in f.targets:
                nat = self.node(i).nat
                if nat is not None:
                    nat.flush_conntrack()
        elif f.kind in ("partition", "bridge"):
            faults.partition(*[[self.node(i).host for i in g] for g in f.groups])
        elif f.kind == "isolate":
            faults.isolate(hosts[0])
        elif f.kind == "oneway":
            faults.drop(hosts[0], hosts[1])
        elif f.kind == "loss":
            for h in hosts:
                faults.loss(h, int(f.value))
        elif f.kind == "delay":
            if importlib.util.find_spec("netfilterqueue") is None:
                self.log("delay skipped: the netfilterqueue package is not installed")
                return
            if shutil.which("iptables") is None:  # its NFQUEUE target is iptables'
                self.log("delay skipped: iptables is not installed")
                return
            for i in f.targets:
                self.cluster.delay(self.node(i), f.value, f.value, self.report.seed)
        self.log("start " + f.describe())

    def undo(self, f: Fault) -> None:
        faults = self.cluster.faults
        assert faults is not None
        if f.kind == "kill":
            self.restart(self.node(f.targets[0]))
        elif f.kind == "pause":
            self.cluster.resume(self.node(f.targets[0]))
        elif f.kind == "diskfull":
            self.cluster.free_disk(self.node(f.targets[0]))
        elif f.kind == "restore":
            node = self.node(f.targets[0])
            copy = self.copies.get(f.targets[0])
            if copy is not None:
                self._restore(node, copy)
        elif f.kind == "natskill":
            self._start_nats()
        elif f.kind == "conntrack":
            for i in f.targets:
                nat = self.node(i).nat
                if nat is not None:
                    nat.flush_conntrack()
        elif f.kind in ("partition", "bridge", "isolate", "oneway", "loss", "natscut"):
            faults.heal()
        elif f.kind == "delay":
            for i in f.targets:
                self.cluster.undelay(self.node(i))
        self.log(f"end {f.kind} {','.join(f'n{i}' for i in f.targets)}".rstrip())

    def _restore(self, node: ChaosNode, copy: Path) -> None:
        """Kill, put the older store back, restart: the node must recover its
        feed from its peers. Its writer waits while its feed reaches a peer
        (an ack on no other node would be the operator's loss, not ours)."""
        writers = self.writers
        if writers is not None:
            writers.hold(node.label)
        try:
            self._wait_replicated(node, 10.0)
            self.cluster.kill(node)
            self.cluster.restore_store(node, copy)
            self.log(f"{node.label} store restored from the older copy")
            self.restart(node)
        finally:
            if writers is not None:
                writers.release(node.label)

    def _wait_replicated(self, node: ChaosNode, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            own = self.cluster.status(node)
            if own is None:
                return False
            seq = own["journal"]["own_seq"]
            for other in self.cluster.nodes:
                st = self.cluster.status(other, 2.0) if other is not node else None
                if st and st["journal"]["version_vector"].get(node.address, 0) >= seq:
                    return True
            time.sleep(0.1)
        return False

    def _start_nats(self) -> None:
        assert self.nats is not None
        if self.nats.running:
            return
        try:
            self.cluster.start_service(self.nats)
            self.log("nats-server restarted")
        except HivemeshError as exc:
            self.log(f"nats-server did not restart: {exc.code}: {str(exc)[:160]}")

    # -- heal -------------------------------------------------------------------

    def heal_all(self) -> None:
        assert self.cluster.faults is not None
        self.cluster.faults.heal()
        if self.nats is not None:
            self._start_nats()
        for node in self.cluster.nodes:
            self.cluster.undelay(node)
            if node.small_disk:
                self.cluster.free_disk(node)
            if node.paused:
                self.cluster.resume(node)
        for node in self.cluster.nodes:
            if not node.running:
                self.cluster.kill(node)  # reaps it: an exit of its own is counted
                self.restart(node)
        self.log("heal: network healed, paused continued, dead restarted, disks freed")


def _wait(check: Callable[[], bool], timeout_s: float, interval_s: float = 0.25) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(HivemeshError, OSError, KeyError, TypeError):
            if check():
                return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)


def _ctx(node: ChaosNode) -> dict[str, Any]:
    got: dict[str, Any] = node.client(10.0).ctx_get(CONTEXT).get("kv", {})
    return got


def run_scenario(
    scenario: str,
    *,
    seed: int,
    nodes: int = 3,
    duration_s: float = 15.0,
    root: Path | None = None,
    keep: bool = False,
    progress: Callable[[str], None] | None = None,
) -> Report:
    """Run one scenario (module docs); the report. Cleans up on every path
    (a failed run keeps its daemons' logs: ``stats["logs"]``)."""
    if scenario not in SCENARIOS:
        raise InvalidArgument(f"unknown scenario {scenario!r}; known: {sorted(SCENARIOS)}")
    if not 3 <= nodes <= 9:
        raise InvalidArgument("nodes must be 3..9 (a lease quorum needs a majority of 3+)")
    sc = SCENARIOS[scenario]
    nodes = max(nodes, sc.min_nodes)
    ttl_ms = 1500
    plan = schedule(sc, seed, nodes, duration_s, ttl_ms=ttl_ms)
    report = Report(scenario, seed, nodes, duration_s, faults=[f.describe() for f in plan])
    t_start = time.monotonic()
    made_root = root is None
    base = Path(tempfile.mkdtemp(prefix="hivemesh-chaos-")) if root is None else root
    small = frozenset({nodes - 1}) if sc.small_disk else frozenset()
    say = progress or (lambda _m: None)
    try:
        topology = "nat" if sc.mode == "nat" else "flat"
        timeout = 60.0 if sc.mode == "audit" else 30.0
        with ChaosCluster(
            base, nodes, small_disks=small, topology=topology, start_timeout_s=timeout
        ) as cluster:
            run = _Run(cluster, report, t_start)
            _execute(run, cluster, plan, report, duration_s, ttl_ms, say, sc.mode)
    except HivemeshError as exc:
        report.error = f"{exc.code}: {exc}"
    except Exception as exc:  # the runner's own failure: reported, never silent
        report.error = f"{type(exc).__name__}: {exc}"
    finally:
        report.wall_s = time.monotonic() - t_start
        if keep:
            report.stats["data_dirs"] = str(base)  # data dirs and daemon logs
        elif made_root:
            if report.verdict != "pass":  # the daemons' logs stay, for the diagnosis
                logs = base.with_name(base.name + "-logs")
                logs.mkdir(exist_ok=True)
                for f in base.glob("*.log"):
                    shutil.copy2(f, logs / f.name)
                report.stats["logs"] = str(logs)
            shutil.rmtree(base, ignore_errors=True)
    return report


def _setup(run: _Run, cluster: ChaosCluster, mode: str, seed: int) -> Any:
    """What a mode adds before the nodes start (:mod:`hivemesh.chaos.scenarios`);
    the audit's fixture ready line (mode ``audit``), else None."""
    nodes = cluster.nodes
    if mode == "broker":
        store = cluster.root / "nats-store"
        store.mkdir(exist_ok=True)
        svc = cluster.add_service("nats", [], ready_text="Server is ready")
        svc.argv = ["nats-server", "-js", "-a", svc.host.ip, "-p", str(NATS_PORT),
                    "-sd", str(store), "-n", f"chaos-{seed}"]  # fmt: skip
        cluster.start_service(svc)
        run.nats = svc
        url = f"nats://{svc.host.ip}:{NATS_PORT}?swarm=chaos{seed}"
        for node in nodes:
            node.args = ["--mesh", url]
            node.bootstrap = []  # the broker's presence finds them
        run.log(f"nats-server (JetStream) up at {svc.host.ip}:{NATS_PORT}")
    elif mode == "nat":
        relay = nodes[0]
        relay.env = {"HIVEMESH_UDP": "true", "HIVEMESH_RELAY_ROLE": "true"}
        for node in nodes[1:]:
            node.bootstrap = [relay.endpoint]
            node.env = {"HIVEMESH_UDP": "true",
                        "HIVEMESH_RELAYS": f"{relay.address}@{relay.endpoint}"}  # fmt: skip
        kinds = ", ".join(
            f"{m.label} behind {'fully-random' if m.nat.symmetric else 'MASQUERADE'}"
            for m in nodes[1:]
            if m.nat is not None
        )
        run.log(f"n0 public with the relay role; {kinds}")
    elif mode == "audit":
        from hivemesh.chaos.audit import setup_audit

        svc, ready = setup_audit(cluster, seed)
        run.log(f"fixture shops up at {ready['url']}")
        return svc
    return None


def _start_order(cluster: ChaosCluster, mode: str) -> list[ChaosNode]:
    if mode != "audit":
        return list(cluster.nodes)
    # the supervisor last: the audit starts as soon as it is up
    from hivemesh.chaos.audit import role

    return sorted(cluster.nodes, key=lambda m: role(cluster.nodes.index(m)) == "supervisor")


def _execute(
    run: _Run,
    cluster: ChaosCluster,
    plan: list[Fault],
    report: Report,
    duration_s: float,
    ttl_ms: int,
    say: Callable[[str], None],
    mode: str = "p2p",
) -> None:
    n = cluster.n
    say("starting nodes")
    collector = cluster.nodes[0]
    collector.collector = True
    fixture = _setup(run, cluster, mode, report.seed)
    for node in _start_order(cluster, mode):
        if mode in ("broker", "nat"):
            cluster.start(node)  # its own bootstrap list (node.bootstrap)
        else:
            cluster.start(node, bootstrap=[m for m in cluster.nodes if m is not node])
    run.log(f"{n} nodes up")
    connect_s = 30.0 if mode == "p2p" else 90.0
    if not _wait(
        lambda: all(
            (st := cluster.status(m)) is not None and st["peers_connected"] >= n - 1
            for m in cluster.nodes
        ),
        connect_s,
    ):
        raise InvalidArgument(f"the nodes did not connect to each other within {connect_s:g} s")
    run.log("all connected")
    interval = 0.25 if mode == "audit" else 0.05
    writers = Writers(cluster.nodes, report.seed, interval_s=interval)
    leases = LeaseWorkload(cluster.nodes, report.seed, clients=3, ttl_ms=ttl_ms)
    telemetry = Telemetry(cluster.nodes[1:], report.seed)
    goals = PlanGoals(cluster.nodes, report.seed)
    operator = None
    if fixture is not None:
        from hivemesh.chaos.audit import AuditOperator

        operator = AuditOperator(cluster.nodes[1:], fixture.ready)
        operator.start()
    run.writers = writers
    for w in (writers, leases, telemetry, goals):
        w.start()
    run.t0 = time.monotonic()
    report.timeline = [(0.0, f"workload started ({n} nodes)")]
    events: list[tuple[float, int, Fault, bool]] = []
    for k, f in enumerate(plan):
        events += [(f.start_s, k, f, True), (f.end_s, k, f, False)]
    events.sort(key=lambda e: (e[0], e[1], e[3]))
    stop = threading.Event()
    try:
        for at, _, fault, begin in events:
            delay = at - (time.monotonic() - run.t0)
            if delay > 0:
                stop.wait(delay)
            say(("start " if begin else "end ") + fault.kind)
            (run.apply if begin else run.undo)(fault)
        rest = duration_s - (time.monotonic() - run.t0)
        if rest > 0:
            stop.wait(rest)
        run.heal_all()
        writers.stop()
        leases.stop()
        telemetry.stop()
        goals.stop()
        run.log("workload stopped")
        say("converging")
        _checks(run, cluster, report, writers, leases, telemetry, goals, mode)
        if mode == "nat":  # every node links to every other one again, somehow
            _links_check(run, cluster, report)
        if operator is not None:
            say("audit finishing")
            _audit_checks(run, cluster, report, operator, fixture)
    finally:
        if operator is not None:
            operator.stop()


def _links_check(run: _Run, cluster: ChaosCluster, report: Report) -> None:
    n = cluster.n

    def unlinked() -> dict[str, list[str]]:
        paths = _paths(cluster)
        out = {k: [q for q, v in p.items() if v == "None"] for k, p in paths.items()}
        out.update({m.label: ["?"] for m in cluster.nodes if len(paths.get(m.label, {})) < n - 1})
        return {k: v for k, v in out.items() if v}

    linked = _wait(lambda: not unlinked(), LINKS_S, 1.0)
    paths = _paths(cluster)
    report.stats["paths"] = paths
    kinds = sorted({v.split(" via")[0] for p in paths.values() for v in p.values()})
    run.log("every node links to every other" if linked else "links missing")
    detail = (
        f"every node links to every other ({', '.join(kinds)})"
        if linked
        else f"peers without a link after {LINKS_S:g} s: {unlinked()}"
    )
    report.checks.append(Check("links", linked, detail))


def _paths(cluster: ChaosCluster) -> dict[str, dict[str, str]]:
    """``label -> peer label -> path`` (``direct TCP``, ``punched``, ``relayed via ...``)."""
    label = {m.address: m.label for m in cluster.nodes}
    out: dict[str, dict[str, str]] = {}
    for m in cluster.nodes:
        with contextlib.suppress(HivemeshError, OSError):
            out[m.label] = {
                label.get(p["address"], p["address"][:8]): str(p.get("path"))
                for p in m.client(10.0).peers()
            }
    return out


def _audit_checks(
    run: _Run, cluster: ChaosCluster, report: Report, operator: Any, fixture: ChaosService
) -> None:
    from hivemesh.chaos.audit import audit_checks, audit_digest, market_log

    finished = _wait(lambda: operator.finished, AUDIT_FINISH_S, 0.5)
    run.log("audit finished" if finished else f"audit NOT finished within {AUDIT_FINISH_S:g} s")
    readers = cluster.nodes[1:]

    def same() -> bool:
        docs = [m.client(20.0).call("audit.export") for m in readers]
        return len({audit_digest(d) for d in docs}) == 1

    if finished:
        _wait(same, 30.0, 0.5)
    truth = Path(str(fixture.ready["ground_truth"]))
    got, stats = audit_checks(cluster, operator, truth, market_log(fixture))
    report.checks += [Check(name, ok, detail) for name, ok, detail in got]
    report.stats.update(stats)
    report.stats["audit_operator_errors"] = dict(operator.errors)


def _checks(
    run: _Run,
    cluster: ChaosCluster,
    report: Report,
    writers: Writers,
    leases: LeaseWorkload,
    telemetry: Telemetry,
    goals: PlanGoals,
    mode: str = "p2p",
) -> None:
    nodes = cluster.nodes
    acked = dict(writers.acked)

    def holds_all() -> bool:
        return all(all(kv.get(k) == v for k, v in acked.items()) for kv in (_ctx(m) for m in nodes))

    ok = _wait(holds_all, CONVERGE_S)
    run.log("acknowledged writes everywhere" if ok else "acknowledged writes NOT everywhere")
    missing: dict[str, int] = {}
    if not ok:
        for m in nodes:
            with contextlib.suppress(HivemeshError, OSError):
                kv = _ctx(m)
                missing[m.label] = sum(kv.get(k) != v for k, v in acked.items())
    report.checks.append(
        Check("acked_writes", ok, f"{len(acked)} acknowledged writes"
              + ("" if ok else f"; missing per node {missing}"))
    )  # fmt: skip

    def equal() -> bool:
        views = [_ctx(m) for m in nodes]
        sts = [cluster.status(m) for m in nodes]
        vvs = [s["journal"]["version_vector"] if s else None for s in sts]
        return all(v == views[0] for v in views) and all(v == vvs[0] for v in vvs)

    ok = _wait(equal, 30.0)
    report.checks.append(Check("views_equal", ok, "same context and version vector on all"
                               if ok else "views or version vectors differ"))  # fmt: skip

    acked_goals = set(goals.acked)

    def same_plan() -> bool:
        views = [PlanGoals.view(m) for m in nodes]
        return all(v == views[0] for v in views) and acked_goals <= views[0][1]

    ok = _wait(same_plan, 30.0)
    report.checks.append(
        Check("plan", ok, f"{len(acked_goals)} acknowledged goals; "
              + ("the same plan (digest) on every node" if ok else "plans differ or miss goals"))
    )  # fmt: skip

    safety = check_history(leases.ops, slack_ms=300.0, spurious=False, replicated=True)
    spurious = check_history(leases.ops, slack_ms=300.0, replicated=True)
    n_spurious = len(spurious) - len(safety)
    fenced = leases.resource.violations()
    grants = sum(o.kind == "acquire" and o.outcome == "ok" for o in leases.ops)
    report.checks.append(
        Check(
            "leases",
            not safety and not fenced,
            f"{len(leases.ops)} calls, {grants} grants, {len(leases.resource.accepted)} effects "
            f"accepted, {leases.stale_refused} stale effects fenced off of {leases.stalls} "
            f"stalls, {n_spurious} refusals without a witness (reported only)"
            + "".join(f"; {v.rule}: {v.detail}" for v in safety[:3])
            + "".join(f"; fencing: {v}" for v in fenced[:3]),
        )
    )

    collector = nodes[0]

    def telemetry_settled() -> bool:
        stored = telemetry.stored(collector)
        gaps = telemetry.gaps(collector)
        if stored is None or gaps is None:
            return False
        for agent, values in telemetry.acked.items():
            ranges = gaps.get(telemetry.address[agent], [])
            for value, seq in values.items():
                if stored.get((agent, value), 0) == 0 and (
                    queued or not any(a <= seq <= b for a, b in ranges)
                ):
                    return False
        return True

    # In broker mode a record the sender's spool handed to the JetStream queue
    # is never lost (docs/broker.md): each must be stored, none may be a gap;
    # a batch a killed collector held comes back after the queue's 30 s ack wait.
    queued = mode == "broker"
    settled = _wait(telemetry_settled, 75.0 if queued else 30.0, 0.5)
    stored = telemetry.stored(collector) or {}
    gaps = telemetry.gaps(collector) or {}
    dup = {k: c for k, c in stored.items() if c > 1 and k[1] in telemetry.acked.get(k[0], {})}
    n_acked = sum(len(v) for v in telemetry.acked.values())
    in_gaps = sum(len(r) for r in gaps.values())
    report.checks.append(
        Check(
            "telemetry",
            settled and not dup,
            f"{n_acked} acknowledged records, {sum(1 for c in stored.values() if c == 1)} stored "
            f"once, {len(dup)} duplicated, gaps reported {in_gaps}"
            + (
                ""
                if settled
                else "; some acknowledged records not stored (broker: the queue loses none)"
                if queued
                else "; some acknowledged records neither stored nor in a gap"
            ),
        )
    )

    half: list[str] = []
    for m in nodes:
        st = cluster.status(m, 10.0)
        if st is None:
            half.append(f"{m.label}: " + ("exited" if not m.running else "no status answer"))
            continue
        for name, task in st.get("tasks", {}).items():
            if not task.get("running") or task.get("stalled"):
                half.append(f"{m.label}: task {name} {task}")
        own = st.get("own_feed", {}).get("state")
        if own != "writable":
            half.append(f"{m.label}: own feed {own}")
        failed = {k: v for k, v in st.get("counters", {}).items() if k.startswith("task_failed")}
        if failed:
            half.append(f"{m.label}: supervised tasks failed {failed}")
    self_exits = [f"{m.label} exited on its own ({code})" for m in nodes for code in m.exits]
    for m in nodes:  # an exception logged with its traceback is a bug, even if survived
        log = cluster.log_tail(m, 10_000_000)
        if "Traceback" in log:
            after = log[log.rindex("Traceback") :].splitlines()[1:]
            last = next((ln for ln in after if ln and not ln[0].isspace()), "?")[:200]
            half.append(f"{m.label}: traceback in its log ({log.count('Traceback')}): {last}")
    report.checks.append(
        Check("alive", not half and not self_exits,
              "every daemon answers with every task running" if not half and not self_exits
              else "; ".join(half + self_exits))
    )  # fmt: skip
    report.stats = {
        "acked_writes": len(acked),
        "write_errors": dict(sorted(writers.failed.items())),
        "lease_calls": len(leases.ops),
        "lease_errors": dict(sorted(leases.errors.items())),
        "effects": len(leases.resource.accepted),
        "stale_fenced": leases.stale_refused,
        "telemetry_acked": n_acked,
        "faults": len(report.faults),
        "restarts": sum(max(0, m.starts - 1) for m in nodes),
        "start_refusals": [f"{m.label}: {c}" for m in nodes for c in m.refusals],
        "plan_goals": len(acked_goals),
    }
