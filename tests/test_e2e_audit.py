"""The 50-shop price audit end to end, on real processes.

One run of :func:`hivemesh.audit.demo.run_audit` with four executors: the
fixture, the collector, observer, reflector, supervisor and executors are
separate processes in one swarm. The driver answers escalations with the
``hivemesh inbox``/``hivemesh answer`` commands, kills one executor part-way
through a multi-page shop (SIGKILL) and pauses another right before it
submits (SIGSTOP) until its lease expired and the shop was done by another.
Everything below is checked from the journal (exported by the observer) and
from the fixture's own logs.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from hivemesh.audit.demo import AuditRun, run_audit


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> AuditRun:
    root = tmp_path_factory.mktemp("audit")
    got = run_audit(root=root, executors=4, kill=True, pause=True, operator_cli=True, say=print)
    assert got.error == "", got.error
    return got


def test_every_shop_is_in_the_report_with_the_ground_truth_prices(run: AuditRun) -> None:
    s = run.summary
    assert run.ok, s
    assert (s["shops"], s["shops_done"], s["mismatches"]) == (50, 50, 0)
    truth = json.loads((Path(run.root) / "fixture" / "ground-truth.json").read_text())
    rows = list(Path(run.report_paths["csv"]).read_text().splitlines())
    assert len(rows) - 1 == sum(len(t["products"]) for t in truth["shops"].values())
    assert "every price matches" in Path(run.report_paths["markdown"]).read_text()
    report = json.loads(Path(run.report_paths["json"]).read_text())
    assert all(r["evidence"] and r["agent"] and r["attempts"] >= 1 for r in report["rows"])


def test_captcha_shops_are_resolved_by_switching_route(run: AuditRun) -> None:
    doc = run.export
    switched = {
        c["shop"]
        for c in doc["corrections"]
        if c["action"] == "switch_route" and c["after"] == "captcha_required"
    }
    truth = json.loads((Path(run.root) / "fixture" / "ground-truth.json").read_text())
    captcha = {s for s, t in truth["shops"].items() if "captcha" in t["behaviours"]}
    assert switched and switched <= captcha and switched <= set(doc["done"])
    for shop in switched:  # the accepted fetches went through a proxy
        oks = [
            r
            for r in doc["tool_results"]
            if r["shop"] == shop and r["tool"] == "web.fetch_page" and r["outcome"] == "ok"
        ]
        assert oks
    routes = {
        c["route"]
        for c in doc["tool_calls"]
        if c["shop"] in switched and c["tool"] == "web.fetch_page"
    }
    assert routes - {"direct"}


def test_the_human_only_shop_is_escalated_and_resolved_by_an_answer(run: AuditRun) -> None:
    truth = json.loads((Path(run.root) / "fixture" / "ground-truth.json").read_text())
    human = next(s for s, t in truth["shops"].items() if "human-only" in t["behaviours"])
    qs = [q for q in run.export["questions"] if q["shop"] == human]
    assert qs and "access code" in qs[0]["question"]
    assert qs[-1]["answer"] and qs[-1]["answer"] in {a["answer"] for a in run.answers}
    assert human in run.export["done"]
    report = json.loads(Path(run.report_paths["json"]).read_text())
    assert any(e["shop"] == human and e["answer"] for e in report["escalations"])


def _fetches(doc: dict[str, Any]) -> dict[tuple[str, int], list[dict[str, Any]]]:
    out: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for r in doc["tool_results"]:
        if r["tool"] == "web.fetch_page" and r["outcome"] == "ok":
            out[(r["shop"], int(r["page"]))].append(r)
    return out


def test_no_shop_is_fetched_twice_under_a_valid_lease(run: AuditRun) -> None:
    doc = run.export
    holders: dict[tuple[str, int], set[str]] = defaultdict(set)
    for c in doc["tool_calls"]:
        holders[(c["shop"], c["token"])].add(c["author"])
    assert all(len(a) == 1 for a in holders.values())  # one holder per fencing token
    owners: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for c in sorted(doc["tool_calls"], key=lambda c: c["hlc"]):
        if c["tool"].startswith("web.") and (c["token"], c["author"]) not in owners[c["shop"]]:
            owners[c["shop"]].append((c["token"], c["author"]))
    takeovers = {(t["shop"], t["token"], t["by"]) for t in doc["takeovers"]}
    for shop, seq in owners.items():  # another holder comes in only by a takeover
        for (_t0, a0), (t1, a1) in itertools.pairwise(seq):
            assert a0 == a1 or (shop, t1, a1) in takeovers, (shop, seq)
    for (shop, _page), oks in _fetches(doc).items():  # one good fetch per page per token
        per_token = Counter(r["token"] for r in oks)
        assert max(per_token.values()) == 1, (shop, per_token)


def test_a_killed_executor_is_taken_over_from_its_last_acknowledged_step(run: AuditRun) -> None:
    doc = run.export
    dead = run.killed["address"]
    assert run.killed and len(doc["done"]) == 50
    assert all(d["agent"] != dead or True for d in doc["done"].values())
    mine = [t for t in doc["takeovers"] if dead in t["from"]]
    assert mine, "nobody took over from the killed executor"
    victim = next(t for t in mine if t["shop"] == run.killed["shop"])
    assert 1 in victim["reused"]  # the acknowledged first page was not fetched again
    for t in mine:  # the standby fetched exactly the pages that were not complete
        calls = [
            int(c["page"]) for c in doc["tool_calls"]
            if c["shop"] == t["shop"] and c["author"] == t["by"] and c["tool"] == "web.fetch_page"
        ]  # fmt: skip
        assert not set(calls) & set(t["reused"]), t
    acked = {
        (r["shop"], int(r["page"]))
        for r in doc["tool_results"]
        if r["author"] == dead and r["products"] and r["outcome"] == "ok" and r["acknowledged"]
    }
    assert {(victim["shop"], p) for p in victim["reused"]} <= acked


def test_a_paused_executor_with_an_expired_lease_is_refused_by_the_market(run: AuditRun) -> None:
    p = run.paused
    assert p.get("resumed"), p
    shop, writer = p["shop"], p["address"]
    mine = [s for s in run.market_log if s["shop"] == shop and s["writer"] == writer]
    theirs = [s for s in run.market_log if s["shop"] == shop and s["accepted"]]
    assert mine and not any(s["accepted"] for s in mine), run.market_log
    assert theirs and all(s["token"] > mine[0]["token"] for s in theirs)
    assert run.export["done"][shop]["agent"] == p["taken_by"] != writer


def test_the_run_recorded_telemetry(run: AuditRun) -> None:
    tel = run.telemetry
    assert isinstance(tel, dict) and "rows" in tel, tel
    tools = {row[0]: row for row in tel["rows"]}
    assert "web.fetch_page" in tools and tools["web.fetch_page"][1] > 0
