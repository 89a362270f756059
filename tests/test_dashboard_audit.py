"""The dashboard in a real headless Chromium during ``hivemesh demo`` (the
price audit), served by the demo's metrics collector (``hivemesh demo
--dashboard``: ``run_audit(dashboard_port=...)``).

The demo's own operator answers every escalation except the human-only
shop's, which is left to the page: the test types the access code into the
escalation's form in the browser. The audit can only finish (every shop's
prices equal to the fixture's ground truth) if that answer went through.
Along the way the page must show the swarm's peers with their round-trip
times, the audit's progress moving, telemetry charts with data, the
executor the demo kills going down and the collector's alert about it, and
no JavaScript error at all. A screenshot is kept as an artifact.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from dashboard_helpers import open_page
from hivemesh.audit.demo import AuditRun, run_audit
from hivemesh.client.swarm import wait_until

pytestmark = [pytest.mark.timeout(400), pytest.mark.e2e_slow]

PROGRESS = "[data-testid=audit-progress]"


def _text(page: Any, selector: str) -> str:
    node = page.query_selector(selector)
    return "" if node is None else str(node.inner_text())


def test_the_page_follows_the_audit_and_answers_the_human_only_escalation(
    tmp_path: Path,
) -> None:
    root = tmp_path / "audit"
    brief: dict[str, Any] = {}
    left: list[str] = []

    def operator(question: dict[str, Any], got: dict[str, Any]) -> str | None:
        brief.update(got)
        if question["shop"] == got["shop"]:
            if question["id"] not in left:
                left.append(question["id"])
            return None  # the page answers this one
        return "skip"

    said: list[str] = []
    done: dict[str, AuditRun] = {}
    checked = threading.Event()  # the swarm stays up until the page was checked
    runner = threading.Thread(
        target=lambda: done.update(
            run=run_audit(
                root=root,
                operator=operator,
                dashboard_port=0,
                say=said.append,
                on_finished=lambda _run: checked.wait(120),
                total_timeout_s=280.0,
            )
        ),
        daemon=True,  # the demo's children die with this thread (PR_SET_PDEATHSIG)
    )
    t0 = time.monotonic()
    runner.start()
    said_url = wait_until(
        lambda: next((line for line in said if line.startswith("dashboard: ")), None),
        90,
        what="the demo serves its dashboard",
    )
    try:
        shots = _watch_and_answer(said_url.removeprefix("dashboard: "), tmp_path, left, brief)
    except BaseException as exc:  # say what the demo was doing when the page check failed
        late = done.get("run")
        why = late.error if late is not None else "still running"
        raise AssertionError(f"{exc}\ndemo ({why}) said last: {said[-8:]}") from exc
    finally:
        checked.set()
    runner.join(60)
    assert not runner.is_alive()
    run = done["run"]
    assert run.ok, run.error
    assert all(a["shop"] != brief["shop"] for a in run.answers)  # the driver left it
    answers = run.export["questions"]
    assert [q["answer"] for q in answers if q["id"] == left[0]] == [brief["code"]]
    assert all(s.stat().st_size > 10_000 for s in shots)
    print(f"audit with the dashboard: {time.monotonic() - t0:.1f} s; screenshot {shots}")


def _watch_and_answer(
    url: str, tmp_path: Path, left: list[str], brief: dict[str, Any]
) -> list[Path]:
    deadline = time.monotonic() + 300

    def upto(cap_s: float) -> float:
        """``cap_s``, or what is left of the test's own deadline if less."""
        return max(5.0, min(cap_s, deadline - time.monotonic()))

    with open_page(url) as b:
        page = b.page
        # the swarm's peers, healthy, with a measured round-trip time
        b.wait_for(
            "document.querySelectorAll('[data-testid=peer-row][data-state=up]').length >= 5",
            upto(90),
        )
        b.wait_for(
            "[...document.querySelectorAll('[data-testid=peer-rtt]')]"
            ".some(td => td.textContent.endsWith(' ms'))",
            upto(30),
        )
        # the audit's progress (checked again at the end: it moves, live, no reload)
        b.wait_for(f"document.querySelector('{PROGRESS}')", upto(120))
        first = _text(page, PROGRESS)
        # the human-only shop's escalation shows up; answer it from the page
        wait_until(lambda: left, upto(200), what="the human-only shop escalates")
        qid = left[0]
        card = f"[data-testid=escalation][data-id='{qid}']"
        b.wait_for(f'document.querySelector("{card}[data-state=open]")', upto(30))
        assert brief["shop"] in _text(page, card)
        page.fill(f"{card} [data-testid=answer-input]", str(brief["code"]))
        page.click(f"{card} [data-testid=answer-button]")
        b.wait_for(f'document.querySelector("{card}[data-state=answered]")', upto(30))
        assert str(brief["code"]) in _text(page, f"{card} [data-testid=escalation-answer]")
        # telemetry charts drawn from the collector's records
        b.wait_for("document.querySelectorAll('#chart-latency svg polyline').length >= 3", upto(60))
        b.wait_for("document.querySelectorAll('#chart-tools svg rect').length >= 1", upto(60))
        # the demo kills an executor: the page shows it down, and the collector's alert
        b.wait_for("document.querySelector('[data-testid=peer-row][data-state=down]')", upto(60))
        b.wait_for(
            "[...document.querySelectorAll('[data-testid=alert]')]"
            ".some(a => a.textContent.includes('node_down'))",
            upto(60),
        )
        shots = b.screenshot(tmp_path / "dashboard-audit.png")  # live, mid-audit
        # the audit finishes, which needed the page's answer
        b.wait_for(f"document.querySelector('{PROGRESS} .badge.done')", upto(150))
        final = _text(page, PROGRESS)
        assert "50/50 shops" in final and final != first
        assert b.errors == [], b.errors
    return shots
