"""``hivemesh demo``: the 50-shop price audit on one machine, end to end.

Theory of operation
-------------------
:func:`run_audit` starts, on loopback, the fixture world (``hivemesh fixture
shops``, its own process) and one node process per role (``hivemesh up
--collector`` as the metrics collector, then ``hivemesh audit node`` for the
observer, the reflector, the supervisor and ``executors`` executors), all in
one swarm. The lease voters are fixed before anything starts: the
collector, the observer and the reflector, whose identities are created
first, so every node uses the same voter set and killing or pausing an
executor never costs the lease quorum.

The driver then plays the operator and the chaos monkey, reading the audit
through the observer's control socket (``audit.status``, ``audit.export``):

* every question the agents escalate is answered (``audit.answer``, or the
  ``hivemesh inbox`` and ``hivemesh answer`` commands with ``operator_cli``): the
  human-only shop gets the access code the fixture gave the operator, any
  other question ``skip``;
* once some executor is part-way through a multi-page shop (at least one
  acknowledged page, more to go), it is killed with SIGKILL; its leases
  expire by their TTL and the other executors take over from its last
  acknowledged step;
* optionally (``pause=True``) another executor is stopped (SIGSTOP, by a
  hook right before it submits a shop's prices) until its lease expired and
  the shop was finished by someone else, then resumed: the market database
  refuses its stale fencing token.

When the supervisor writes ``audit.done`` the driver exports the journal,
writes the report (:mod:`hivemesh.audit.report`), checks it against the
fixture's ground truth and asks the collector for a telemetry summary. Every
wait has a deadline; every child process is killed on the way out.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hivemesh.audit.report import build_report, write_report
from hivemesh.client.swarm import LocalSwarm, NodeProc
from hivemesh.core.hlc import LOGICAL_BITS
from hivemesh.errors import DeadlineExceeded, HivemeshError

__all__ = ["AuditRun", "Operator", "Progress", "fixture_operator", "run_audit", "start_fixture"]

Progress = Callable[[dict[str, Any]], None]
#: Who answers an escalation: called with the question and the operator's
#: brief from the fixture (``{"shop", "code"}``: the human-only shop and its
#: access code); returns the answer, or None to leave the question open for
#: another operator (one answering from ``hivemesh dashboard``, say).
Operator = Callable[[dict[str, Any], dict[str, Any]], str | None]


def fixture_operator(question: dict[str, Any], brief: dict[str, Any]) -> str | None:
    """The demo's own operator: the access code for the human-only shop,
    ``skip`` for any other question."""
    return str(brief["code"]) if question["shop"] == brief["shop"] else "skip"


@dataclass
class AuditRun:
    """What one audit run saw (``to_json`` is ``hivemesh demo --json``)."""

    root: str
    ok: bool = False
    seconds: float = 0.0
    audit_seconds: float = 0.0
    report_paths: dict[str, str] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    killed: dict[str, Any] = field(default_factory=dict)
    paused: dict[str, Any] = field(default_factory=dict)
    answers: list[dict[str, Any]] = field(default_factory=list)
    telemetry: Any = None
    fixture_stats: dict[str, Any] = field(default_factory=dict)
    market_log: list[dict[str, Any]] = field(default_factory=list)
    export: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    events: list[str] = field(default_factory=list)
    dashboard: str = ""

    def to_json(self) -> dict[str, Any]:
        """A machine-readable summary (without the full export)."""
        return {
            "ok": self.ok,
            "error": self.error,
            "seconds": round(self.seconds, 2),
            "audit_seconds": round(self.audit_seconds, 2),
            "root": self.root,
            "report": self.report_paths,
            "summary": self.summary,
            "killed": self.killed,
            "paused": self.paused,
            "answers": self.answers,
            "telemetry": self.telemetry,
            "dashboard": self.dashboard,
        }


def _read_line(proc: subprocess.Popen[bytes], timeout_s: float, what: str) -> dict[str, Any]:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    buf = b""
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0 or proc.poll() is not None:
            raise DeadlineExceeded(f"{what} did not start in {timeout_s:g} s")
        r, _, _ = select.select([proc.stdout], [], [], left)
        if r:
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                continue
            buf += chunk
    doc: dict[str, Any] = json.loads(buf.split(b"\n", 1)[0])
    return doc


def _start_child(
    args: list[str], log_path: Path, env: dict[str, str], what: str
) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    """Start ``hivemesh ARGS`` (which prints a JSON ready line); ``(process, ready line)``."""
    cmd = [sys.executable, "-m", "hivemesh", *args]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL, env=env
        )
    try:
        return proc, _read_line(proc, 30.0, what)
    except BaseException:
        proc.kill()
        proc.wait(5)
        raise


def _stop_child(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
    if proc.stdout is not None:
        proc.stdout.close()


def start_fixture(
    root: Path, env: dict[str, str], *, seed: int = 7, slow_ms: int = 1500
) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    """Start ``hivemesh fixture shops`` in its own process; ``(process, ready line)``."""
    out = root / "fixture"
    out.mkdir(parents=True, exist_ok=True)
    args = ["fixture", "shops", "--json", "--seed", str(seed)]
    args += ["--out", str(out), "--slow-ms", str(slow_ms)]
    return _start_child(args, out / "fixture.log", env, "the fixture")


def _identity(data_dir: Path) -> str:
    from hivemesh.stores.keyfile import load_or_create_identity
    from hivemesh.stores.private import secure_data_dir

    secure_data_dir(data_dir)
    return load_or_create_identity(data_dir).address


def _progress_of(st: dict[str, Any]) -> dict[str, Any]:
    """Per-batch progress from an ``audit.status`` answer."""
    return {
        "batches": {n: (d, total) for n, (d, total) in st["batches"].items()},
        "done": st["done"],
        "shops": st["shops"],
        "finished": st["finished"],
        "calls": st["calls"],
        "questions": st["open_questions"],
        "takeovers": st["takeovers"],
    }


def _victim(doc: dict[str, Any], executors: dict[str, str]) -> tuple[str, str] | None:
    """An executor part-way through a multi-page shop: ``(label, shop)``."""
    by_addr = {a: label for label, a in executors.items()}
    acked: dict[tuple[str, str], set[int]] = {}
    for r in doc["tool_results"]:
        if r["products"] and r["outcome"] == "ok" and r["acknowledged"]:
            acked.setdefault((r["author"], r["shop"]), set()).add(int(r["page"]))
    for (author, shop), pages in sorted(acked.items()):
        if shop in doc["done"] or author not in by_addr:
            continue
        if 1 in pages and len(pages) < 3:  # part-way: more pages to go (3+ page shops)
            return by_addr[author], shop
    return None


def run_audit(
    *,
    root: str | Path | None = None,
    executors: int = 3,
    seed: int = 7,
    batch_size: int = 10,
    kill: bool = True,
    pause: bool = False,
    slow_ms: int = 1500,
    lease_ttl_ms: int = 3000,
    max_concurrent: int = 4,
    progress: Progress | None = None,
    operator_cli: bool = False,
    operator: Operator = fixture_operator,
    dashboard_port: int | None = None,
    on_finished: Callable[[AuditRun], None] | None = None,
    say: Callable[[str], None] = lambda _line: None,
    total_timeout_s: float = 240.0,
) -> AuditRun:
    """Run the whole audit (see the module docs). ``operator`` answers the
    escalations (:data:`Operator`; a question it leaves open waits for an
    answer from elsewhere, within ``total_timeout_s``). With
    ``dashboard_port`` the collector serves ``hivemesh dashboard`` on that
    loopback port (0: any) for the run (its URL in ``AuditRun.dashboard``).
    ``on_finished`` is called with the finished run before its processes
    are stopped (to look at the dashboard's last picture, say)."""
    if executors < (3 if kill else 1) + int(pause):
        raise ValueError("need at least 3 executors to kill one (and one more to pause one)")
    tmp = None
    if root is None:
        tmp = tempfile.TemporaryDirectory(prefix="hivemesh-audit-")
        root = tmp.name
    root = Path(root)
    run = AuditRun(root=str(root))
    t0 = time.monotonic()
    deadline = t0 + total_timeout_s
    nodes_root = root / "nodes"
    voters = {
        label: _identity(nodes_root / label) for label in ("collector", "observer", "reflector")
    }
    env = {"HIVEMESH_LEASE_VOTERS": ",".join(voters.values())}
    swarm = LocalSwarm(nodes_root, env=env, start_timeout_s=60.0)
    for key in [k for k in swarm.env if k.startswith("OPENAI_")]:
        del swarm.env[key]  # no LLM, no internet: the reflector's rules decide
    fixture: subprocess.Popen[bytes] | None = None
    dashboard: subprocess.Popen[bytes] | None = None
    release = threading.Event()
    try:
        fixture, ready = start_fixture(root, swarm.env, seed=seed, slow_ms=slow_ms)
        fx = json.dumps(ready)
        say(f"fixture: 50 shops at {ready['url']} (routes: {', '.join(ready['routes'])})")
        collector = swarm.start("collector", extra_args=["--collector"])
        boot = [collector.endpoint]
        say(f"metrics-collector {collector.address[:12]}… up")
        if dashboard_port is not None:
            args = ["dashboard", "--data-dir", str(collector.data_dir), "--json"]
            args += ["--port", str(dashboard_port)]
            log_path = root / "dashboard.log"
            dashboard, ready_dash = _start_child(args, log_path, swarm.env, "the dashboard")
            run.dashboard = str(ready_dash["url"])
            say(f"dashboard: {run.dashboard}")

        def role(label: str, name: str, *extra: str) -> NodeProc:
            args = ["--role", name, "--fixture", fx, "--lease-ttl-ms", str(lease_ttl_ms), *extra]
            return swarm.start(label, bootstrap=boot, command=("audit", "node"), extra_args=args)

        observer = role("observer", "observer")
        role("reflector", "reflector")
        labels = [f"executor-{i + 1}" for i in range(executors)]
        paused_label = labels[-1] if pause else ""
        failures: list[BaseException] = []
        started = threading.Semaphore(0)

        def start_exec(label: str) -> None:
            extra = ["--max-concurrent", str(max_concurrent)]
            if label == paused_label:
                extra += ["--pause-before-submit", "first"]
            try:
                role(label, "executor", *extra)
            except BaseException as exc:  # reported below
                failures.append(exc)
            started.release()
            # The child dies with the thread that spawned it (PR_SET_PDEATHSIG
            # follows the thread), so this thread lives until the run ends.
            release.wait()

        for label in labels:  # in parallel: each starts its MCP server first
            threading.Thread(target=start_exec, args=(label,), daemon=True).start()
        for _ in labels:
            if not started.acquire(timeout=max(1.0, deadline - time.monotonic())):
                raise DeadlineExceeded("the executors did not start in time")
        if failures:
            raise failures[0]
        execs = {label: swarm.nodes[label].address for label in labels}
        say(f"{executors} executors, reflector, observer up; starting the supervisor")
        role("supervisor", "supervisor", "--batch-size", str(batch_size))
        t_audit = time.monotonic()
        client = observer.client
        brief = dict(ready["operator"])
        answered: set[str] = set()
        doc: dict[str, Any] = {}
        while True:
            if time.monotonic() > deadline:
                raise DeadlineExceeded(f"the audit did not finish in {total_timeout_s:g} s")
            try:  # the cheap status each turn; the whole export only when needed
                st = client.call("audit.status", timeout_s=20.0)
                need = st.get("open_questions") or st.get("finished")
                need = (
                    need or (kill and not run.killed) or (pause and not run.paused.get("resumed"))
                )
                if st.get("audit") and need:
                    doc = client.call("audit.export", timeout_s=20.0)
            except HivemeshError:
                time.sleep(0.3)
                continue
            if progress is not None and st.get("audit"):
                progress(_progress_of(st))
            if not doc:
                time.sleep(0.3)
                continue
            open_qs = [q for q in doc["questions"] if q["answer"] is None]
            if operator_cli and open_qs:  # the operator's own commands
                open_qs = _cli(swarm, observer, "inbox", "--questions")
            for q in open_qs:
                if q["id"] not in answered:
                    text = operator(q, brief)
                    if text is None:  # left to another operator
                        continue
                    if operator_cli:
                        _cli(swarm, observer, "answer", q["id"], text)
                    else:
                        client.call("audit.answer", id=q["id"], text=text)
                    answered.add(q["id"])
                    run.answers.append({"id": q["id"], "shop": q["shop"], "answer": text})
                    say(f"operator answered {q['id']} ({q['shop']}): {text}")
            if kill and not run.killed:
                got = _victim(doc, {k: v for k, v in execs.items() if k != paused_label})
                if got is not None:
                    label, shop = got
                    swarm.kill(label)
                    run.killed = {"executor": label, "address": execs[label], "shop": shop}
                    say(f"killed {label} (SIGKILL) part-way through {shop}")
            if pause and paused_label:
                _pause_step(swarm.nodes[paused_label], doc, run, say)
            if doc["finished_hlc"] is not None and (not pause or run.paused.get("resumed")):
                break
            doc = {}
            time.sleep(0.3)
        # the audit's own duration, start to done, by the supervisor's clock
        took_ms = (doc["finished_hlc"] >> LOGICAL_BITS) - (doc["started_hlc"] >> LOGICAL_BITS)
        run.audit_seconds = took_ms / 1000 if took_ms > 0 else time.monotonic() - t_audit
        run.export = doc
        truth = json.loads(Path(ready["ground_truth"]).read_text(encoding="utf-8"))
        report = build_report(doc, ground_truth=truth)
        run.report_paths = write_report(report, root / "report")
        run.summary = report["summary"]
        run.fixture_stats, run.market_log = _fixture_state(ready)
        run.telemetry = _telemetry(swarm.nodes["collector"])
        run.ok = (
            run.summary["mismatches"] == 0 and run.summary["shops_done"] == run.summary["shops"]
        )
        if on_finished is not None:  # the swarm (and its dashboard) still runs meanwhile
            on_finished(run)
    except (HivemeshError, OSError, ValueError, KeyError, subprocess.SubprocessError) as exc:
        run.error = f"{type(exc).__name__}: {exc}"
    finally:
        run.seconds = time.monotonic() - t0
        for node in swarm.nodes.values():  # a paused child would never see SIGTERM
            if node.running and node.proc is not None:
                os.kill(node.proc.pid, signal.SIGCONT)
        swarm.close()
        release.set()
        for child in (dashboard, fixture):
            if child is not None:
                _stop_child(child)
        if tmp is not None:
            run.root = ""
            tmp.cleanup()
    return run


def _cli(swarm: LocalSwarm, node: NodeProc, *args: str) -> Any:
    """Run ``hivemesh ARGS --json --data-dir NODE`` as the operator would."""
    cmd = [sys.executable, "-m", "hivemesh", *args, "--json", "--data-dir", str(node.data_dir)]
    done = subprocess.run(cmd, env=swarm.env, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise HivemeshError(f"hivemesh {args[0]} failed: {done.stdout} {done.stderr}"[:500])
    return json.loads(done.stdout)


def _stopped(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] in ("T", "t")


def _pause_step(
    node: NodeProc, doc: dict[str, Any], run: AuditRun, say: Callable[[str], None]
) -> None:
    """Resume the paused executor once another one finished its shop."""
    mark = node.data_dir / "paused-shop"
    if run.paused.get("resumed") or node.proc is None or not mark.exists():
        return
    if not _stopped(node.proc.pid):
        return
    shop = mark.read_text(encoding="utf-8").strip()
    if not run.paused:
        run.paused = {"executor": node.label, "address": node.address, "shop": shop}
        say(f"{node.label} paused (SIGSTOP) right before submitting {shop}")
    done = doc["done"].get(shop)
    if done is not None and done["agent"] != node.address:
        os.kill(node.proc.pid, signal.SIGCONT)
        run.paused["resumed"] = True
        run.paused["taken_by"] = done["agent"]
        say(f"{shop} finished by another executor; {node.label} resumed with a stale lease")


def _fixture_state(ready: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    import httpx

    with httpx.Client(trust_env=False, timeout=10.0) as http:
        stats = http.get(f"{ready['url']}/_fixture/stats").json()
        log = http.get(f"{ready['url']}/market/log").json()
    return stats, log


def _telemetry(collector: NodeProc) -> Any:
    try:
        return collector.client.call("metrics", what="top", by="tool", timeout_s=20.0)
    except HivemeshError as exc:
        return {"error": str(exc)}
