"""The price audit as chaos workload: its roles on the lab's nodes, the
operator, and the audit's own checks.

Layout (scenario ``audit``, at least 6 nodes): the fixture world
(``hivemesh fixture shops``: the shops, their proxy routes and the fenced
market database) runs in a host of its own on the public segment; ``n0`` is
``hivemesh up --collector`` (the telemetry collector), ``n1`` the observer,
``n2`` the reflector, ``n3`` the supervisor and every further node an
executor (``hivemesh audit node --role ...``). Every node is a full daemon:
the chaos workload's context writes, leases, telemetry and goals run on
them beside the audit, and the faults hit any of them.

:class:`AuditOperator` plays the operator through the control socket of
whichever role node is up (the observer first): it answers every
escalation as ``hivemesh demo`` does (the access code for the human-only
shop, ``skip`` for any other) and follows the audit's progress.

:func:`audit_checks` are the audit's checks as chaos checks (what
``hivemesh demo --json`` and ``tests/test_e2e_audit.py`` check, under
faults):

* ``audit_done``: the audit finished, and it is the one audit that was
  started (a restarted supervisor continues the audit; it must not start
  another);
* ``audit_shops``: every shop audited exactly once (one ``done`` record) or
  its failure escalated and answered ``skip``; nothing else;
* ``audit_results``: no lost or duplicated result: one holder per fencing
  token and shop, one good fetch per page per token, every done shop's
  record has as many products as the ground truth and its token among the
  market's accepted submissions, the market's accepted tokens never going
  backwards per shop;
* ``audit_prices``: no price differs from the ground truth, and the
  report's mismatch count (:func:`hivemesh.audit.report.build_report`) is
  exactly the skipped shops' products (counted correctly);
* ``audit_views``: every node's export of the audit (done shops, their
  tokens, skipped shops, answers) is the same.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import sys
import threading
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from hivemesh.chaos.hosts import ChaosCluster, ChaosNode, ChaosService
from hivemesh.errors import HivemeshError

__all__ = [
    "AUDIT_SHOPS",
    "AuditOperator",
    "audit_checks",
    "audit_digest",
    "judge_audit",
    "market_log",
    "setup_audit",
]

#: Shops in the chaos audit's world: the 50-shop audit (23 is the least that holds every
#: behaviour: CAPTCHA, slow, flaky, layout change, sloppy HTML, human-only).
AUDIT_SHOPS = 50
#: The executors' lease TTL (ms).
AUDIT_LEASE_TTL_MS = 3000
ROLE_OF = {0: "collector", 1: "observer", 2: "reflector", 3: "supervisor"}


def role(i: int) -> str:
    """The role of node ``i`` (module docs)."""
    return ROLE_OF.get(i, "executor")


def setup_audit(
    cluster: ChaosCluster, seed: int, *, shops: int = AUDIT_SHOPS
) -> tuple[ChaosService, dict[str, Any]]:
    """Start the fixture in a host of its own and give every node its role's
    command; ``(fixture service, its ready line)``. The nodes are not started."""
    out = cluster.root / "fixture"
    out.mkdir(parents=True, exist_ok=True)
    svc = cluster.add_service(
        "shops", [sys.executable, "-m", "hivemesh", "fixture", "shops", "--json"]
    )
    svc.argv += ["--host", svc.host.ip, "--shops", str(shops), "--seed", str(seed % 1000)]
    svc.argv += ["--out", str(out), "--slow-ms", "400"]
    cluster.start_service(svc)
    fx = json.dumps(svc.ready, sort_keys=True)
    for i, node in enumerate(cluster.nodes):
        r = role(i)
        if r == "collector":
            node.collector = True
            continue
        node.command = ("audit", "node")
        node.args = ["--role", r, "--fixture", fx, "--lease-ttl-ms", str(AUDIT_LEASE_TTL_MS)]
        if r == "supervisor":
            node.args += ["--batch-size", "8"]
        if r == "executor":
            node.args += ["--max-concurrent", "3"]
    return svc, svc.ready


class AuditOperator:
    """Answers the audit's escalations and follows its progress (module docs)."""

    def __init__(self, nodes: list[ChaosNode], ready: dict[str, Any], interval_s: float = 0.5):
        #: role nodes, the observer first: whichever is up answers
        self.nodes = nodes
        self.brief = dict(ready["operator"])
        self.interval_s = interval_s
        self.status: dict[str, Any] = {}
        self.audits_seen: list[str] = []
        self.answers: list[dict[str, Any]] = []
        self.errors: Counter[str] = Counter()
        self._answered: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def finished(self) -> bool:
        """The latest status says the audit is finished."""
        return bool(self.status.get("finished"))

    def start(self) -> None:
        """Follow and answer from a thread until stopped."""
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop following."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)

    def _reader(self) -> ChaosNode | None:
        return next((n for n in self.nodes if n.running and not n.paused), None)

    def _run(self) -> None:
        from hivemesh.audit.demo import fixture_operator

        for _ in range(100_000):
            if self._stop.wait(self.interval_s):
                return
            node = self._reader()
            if node is None:
                continue
            try:
                client = node.client(timeout_s=5.0)
                st = client.call("audit.status")
                if st.get("audit") and st["audit"] not in self.audits_seen:
                    self.audits_seen.append(str(st["audit"]))
                self.status = st
                if not st.get("open_questions"):
                    continue
                doc = client.call("audit.export")
                for q in doc["questions"]:
                    if q["answer"] is not None or q["id"] in self._answered:
                        continue
                    text = fixture_operator(q, self.brief)
                    if text is None:
                        continue
                    client.call("audit.answer", id=q["id"], text=text)
                    self._answered.add(q["id"])
                    self.answers.append({"id": q["id"], "shop": q["shop"], "answer": text})
            except (HivemeshError, OSError, KeyError, TypeError) as exc:
                self.errors[getattr(exc, "code", type(exc).__name__)] += 1


def market_log(svc: ChaosService) -> list[dict[str, Any]] | None:
    """The fixture's market log (every submission), read inside its host
    (the lab's addresses are not routed from outside); None: no answer."""
    url = f"{svc.ready['url']}/market/log"
    code = (
        "import sys, urllib.request\n"
        "sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())\n"
    )
    with contextlib.suppress(HivemeshError, OSError, ValueError):
        out = svc.host.run([sys.executable, "-c", code, url], timeout_s=20.0)
        got = json.loads(out.stdout)
        if isinstance(got, list):
            return got
    return None


def audit_digest(doc: dict[str, Any]) -> str:
    """What every node must agree on: the audit, its done shops with their
    tokens and agents, the skipped shops and the answers."""
    core = {
        "audit": doc["audit"],
        "finished": doc["finished_hlc"] is not None,
        "done": sorted((s, d.get("token"), d["agent"]) for s, d in doc["done"].items()),
        "skipped": doc["skipped"],
        "answers": sorted((q["id"], q["answer"]) for q in doc["questions"]),
    }
    return hashlib.sha256(json.dumps(core, sort_keys=True).encode()).hexdigest()[:16]


def _export(node: ChaosNode) -> dict[str, Any] | None:
    with contextlib.suppress(HivemeshError, OSError):
        got: dict[str, Any] = node.client(timeout_s=20.0).call("audit.export")
        return got
    return None


def audit_checks(
    cluster: ChaosCluster,
    operator: AuditOperator,
    truth_path: Path,
    market: list[dict[str, Any]] | None,
) -> tuple[list[tuple[str, bool, str]], dict[str, Any]]:
    """The audit's checks on a cluster (module docs): every role node's
    export, judged by :func:`judge_audit`."""
    readers = [n for i, n in enumerate(cluster.nodes) if role(i) != "collector"]
    docs = {n.label: d for n in readers if (d := _export(n)) is not None}
    truth = json.loads(truth_path.read_text(encoding="utf-8"))
    checks, stats = judge_audit(docs, len(readers), operator.audits_seen, truth, market)
    stats["audit_answers"] = len(operator.answers)
    return checks, stats


def judge_audit(
    docs: dict[str, dict[str, Any]],
    readers: int,
    audits_seen: list[str],
    truth: dict[str, Any],
    market: list[dict[str, Any]] | None,
) -> tuple[list[tuple[str, bool, str]], dict[str, Any]]:
    """The audit's checks (module docs) over the exports ``docs`` (node label
    -> ``audit.export``) of ``readers`` role nodes, the audit ids the
    operator saw, the fixture's ground truth and its market log:
    ``[(name, ok, detail)]`` and stats. Pure."""
    from hivemesh.audit.report import build_report

    out: list[tuple[str, bool, str]] = []
    if not docs:
        return [("audit_done", False, "no node answered audit.export")], {}
    doc = next(iter(docs.values()))
    finished = doc["finished_hlc"] is not None
    started = audits_seen
    one = started == [doc["audit"]]
    out.append(
        (
            "audit_done",
            finished and one,
            f"audit {doc['audit']} "
            + ("finished" if finished else "NOT finished")
            + ("" if one else f"; audits seen by the operator: {started} (more than one started)"),
        )
    )
    shops = {s["id"] for s in doc["shops"]}
    done, skipped = set(doc["done"]), set(doc["skipped"])
    escalated = {q["shop"] for q in doc["questions"]}
    bad = sorted(shops - done - skipped)
    both = sorted(done & skipped)
    unescalated = sorted(skipped - escalated)
    out.append(
        (
            "audit_shops",
            not bad and not both and not unescalated and done | skipped == shops,
            f"{len(shops)} shops: {len(done)} audited once, {len(skipped)} escalated and "
            f"skipped, {len(doc['questions'])} questions, {len(doc['takeovers'])} takeovers"
            + (f"; neither audited nor skipped: {bad}" if bad else "")
            + (f"; audited and skipped: {both}" if both else "")
            + (f"; skipped without an escalation: {unescalated}" if unescalated else ""),
        )
    )
    problems: list[str] = []
    holders: dict[tuple[str, Any], set[str]] = defaultdict(set)
    for c in doc["tool_calls"]:
        holders[(c["shop"], c["token"])].add(c["author"])
    problems += [f"{k}: token used by {sorted(v)}" for k, v in holders.items() if len(v) > 1]
    fetches: Counter[tuple[str, Any, Any]] = Counter(
        (r["shop"], r["page"], r["token"])
        for r in doc["tool_results"]
        if r["tool"] == "web.fetch_page" and r["outcome"] == "ok"
    )
    problems += [f"{k}: fetched {n} times under one token" for k, n in fetches.items() if n > 1]
    for shop, d in doc["done"].items():
        want = len(truth["shops"][shop]["products"])
        if len(d.get("products", [])) != want:
            problems.append(f"{shop}: {len(d.get('products', []))} products, truth {want}")
    redone = 0
    if market is None:
        problems.append("the market log could not be read")
    else:
        accepted: dict[str, list[int]] = defaultdict(list)
        for s in market:
            if s["accepted"]:
                accepted[s["shop"]].append(int(s["token"]))
        for shop, toks in accepted.items():
            if any(b < a for a, b in itertools.pairwise(toks)):
                problems.append(f"{shop}: the market accepted tokens going backwards {toks}")
            redone += len(set(toks)) > 1
        for shop, d in doc["done"].items():
            if int(d.get("token", -1)) not in accepted.get(shop, []):
                problems.append(f"{shop}: done under token {d.get('token')} the market never took")
    out.append(
        (
            "audit_results",
            not problems,
            f"{len(doc['tool_calls'])} tool calls, {len(doc['tool_results'])} results, "
            f"{sum(fetches.values())} good fetches; {redone} shops submitted again by a "
            "takeover (higher token, accepted)"
            + "".join(f"; {p}" for p in problems[:4])
            + (f" (+{len(problems) - 4} more)" if len(problems) > 4 else ""),
        )
    )
    report = build_report(doc, ground_truth=truth)
    wrong = [m for m in report["mismatches"] if m["shop"] not in skipped]
    skipped_products = sum(len(truth["shops"][s]["products"]) for s in skipped)
    counted = report["summary"]["mismatches"] == skipped_products + len(wrong)
    out.append(
        (
            "audit_prices",
            not wrong and counted,
            f"{report['summary']['products']} prices, {len(wrong)} differ from the ground truth; "
            f"the report counts {report['summary']['mismatches']} mismatches "
            f"(the {skipped_products} products of skipped shops)"
            + "".join(f"; {m}" for m in wrong[:3])
            + ("" if counted else "; the report's count is WRONG"),
        )
    )
    digests = {label: audit_digest(d) for label, d in docs.items()}
    same = len(set(digests.values())) == 1 and len(docs) == readers
    out.append(
        (
            "audit_views",
            same,
            f"the same audit on all {len(docs)} role nodes"
            if same
            else f"digests differ or nodes did not answer: {digests}",
        )
    )
    stats = {
        "audit_shops": len(shops),
        "audit_done": len(done),
        "audit_skipped": len(skipped),
        "audit_takeovers": len(doc["takeovers"]),
        "audit_tool_calls": len(doc["tool_calls"]),
        "audit_resubmitted": redone,
    }
    return out, stats
