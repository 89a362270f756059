"""``hivemesh bench audit``: the 50-shop audit by the swarm vs a plain scraper.

*Ours*: :func:`hivemesh.audit.demo.run_audit` without the chaos (no kill):
separate node processes (collector, observer, reflector, supervisor and
``--executors`` executors of ``--slots`` shops each), tools over stdio MCP,
every step journaled and replicated, leases per shop, corrections by the
reflector, the human-only shop answered through ``audit.answer``. Timed from
the supervisor's start to ``audit.done`` (process start-up is reported
apart: it is paid once per swarm, not per audit).

*Baseline*: a plain single-process asyncio scraper over a fresh fixture of
the same seed, with the same concurrency (``executors * slots`` shops at
once) and the same fetch, snapshot and extraction code
(:mod:`hivemesh.webtools`) called in process: retry on a transient failure,
next route on a CAPTCHA, the next strategy when no prices are found, the
operator's code known in advance, prices submitted to the same market
database. No journal, no leases, no MCP, no second process.

Coordination overhead = ours / baseline - 1 (goal <= 15 %). Duplicate
fetches = pages the fixture served whole beyond one per page, from its own
request counters (goal 0). Both runs must read every price of the ground truth.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from hivemesh.bench import BenchResult, Metric
from hivemesh.errors import HivemeshError
from hivemesh.webtools.errors import CaptchaRequired, ExtractError, FetchError

__all__ = ["DESCRIPTION", "add_arguments", "plain_audit", "run"]

DESCRIPTION = "50-shop audit: swarm of node processes vs a plain asyncio scraper"
STRATEGIES = ("auto", "jsonld", "microdata", "table", "blocks")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Bench options."""
    parser.add_argument("--executors", type=int, default=3)
    parser.add_argument("--slots", type=int, default=4, help="shops at once per executor")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--slow-ms", type=int, default=1500, help="mean delay of slow shops")
    parser.add_argument("--runs", type=int, default=1, help="pairs of runs (best of each)")


def _code(url: str, code: str) -> str:
    u = urlsplit(url)
    q = f"{u.query}&code={code}" if u.query else f"code={code}"
    return urlunsplit((u.scheme, u.netloc, u.path, q, u.fragment))


async def plain_audit(ready: dict[str, Any], concurrency: int) -> dict[str, Any]:
    """The baseline scraper over the fixture of ``ready`` (see the module docs)."""
    import httpx  # here: `hivemesh bench` imports every bench module to list it

    from hivemesh.webtools import extract as ex
    from hivemesh.webtools.fetch import Fetcher

    routes = sorted(ready["routes"], key=lambda r: (r != "direct", r))
    fetcher = Fetcher(dict(ready["routes"]), timeout_s=10.0)
    operator = ready["operator"]
    t0 = time.monotonic()
    async with httpx.AsyncClient(trust_env=False, timeout=10.0) as http:
        shops = (await http.get(f"{ready['url']}/shops.json")).json()
        slots = asyncio.Semaphore(concurrency)
        out: dict[str, list[dict[str, Any]]] = {}
        calls = 0

        async def page(url: str, state: dict[str, Any]) -> tuple[list[dict[str, Any]], str | None]:
            nonlocal calls
            for attempt in range(12):
                calls += 1
                try:
                    got = await fetcher.fetch(url, route=routes[state["route"]])
                except CaptchaRequired:
                    state["route"] += 1
                    continue
                except FetchError:
                    await asyncio.sleep(0.15 * 2 ** min(attempt, 4))
                    continue
                doc = ex.parse_html(got.html)
                ex.dom_snapshot(doc)
                for strategy in STRATEGIES:
                    found = ex.extract_prices(doc, strategy=strategy)
                    if found["products"]:
                        return found["products"], ex.next_page_url(doc, got.final_url)
            raise ExtractError(f"{url}: gave up")

        async def shop(s: dict[str, str]) -> None:
            async with slots:
                code = operator["code"] if s["id"] == operator["shop"] else ""
                url: str | None = _code(s["url"], code) if code else s["url"]
                state = {"route": 0}
                products: list[dict[str, Any]] = []
                while url is not None:
                    got, nxt = await page(url, state)
                    products += got
                    url = (_code(nxt, code) if code else nxt) if nxt else None
                body = {
                    "shop": s["id"],
                    "writer": "plain",
                    "token": 1,
                    "prices": [{k: p[k] for k in ("sku", "price", "currency")} for p in products],
                }
                await http.post(ready["market"], json=body)
                out[s["id"]] = products

        await asyncio.gather(*(shop(s) for s in shops))
    await fetcher.aclose()
    return {"seconds": time.monotonic() - t0, "products": out, "calls": calls}


def _duplicates(stats: dict[str, Any], truth: dict[str, Any]) -> int:
    """Pages the fixture served whole (outcome ok) beyond one per page."""
    by_shop = stats.get("by_shop", {})
    extra = 0
    for sid, t in truth["shops"].items():
        ok = sum(r.get("ok", 0) for r in by_shop.get(sid, {}).values())
        extra += max(0, ok - t["pages"])
    return extra


def _baseline(root: Path, seed: int, slow_ms: int, concurrency: int) -> dict[str, Any]:
    import os

    import httpx

    from hivemesh.audit.demo import start_fixture

    env = {k: v for k, v in os.environ.items() if not k.startswith("HIVEMESH_")}
    src = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH", "")) if p)
    proc, ready = start_fixture(root, env, seed=seed, slow_ms=slow_ms)
    try:
        got = asyncio.run(plain_audit(ready, concurrency))
        truth = json.loads(Path(ready["ground_truth"]).read_text(encoding="utf-8"))
        with httpx.Client(trust_env=False, timeout=10.0) as http:
            stats = http.get(f"{ready['url']}/_fixture/stats").json()
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        if proc.stdout is not None:
            proc.stdout.close()
    wrong = 0
    for sid, t in truth["shops"].items():
        have = [(p["sku"], p["price"]) for p in got["products"].get(sid, [])]
        wrong += have != [(p["sku"], p["price"]) for p in t["products"]]
    return {**got, "wrong_shops": wrong, "duplicates": _duplicates(stats, truth)}


def run(args: argparse.Namespace) -> BenchResult:
    """Run the bench (see the module docs)."""
    from hivemesh.audit.demo import run_audit

    concurrency = args.executors * args.slots
    ours: list[Any] = []
    base: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="hm-bench-audit-") as tmp:
        for i in range(max(1, args.runs)):
            base.append(_baseline(Path(tmp) / f"plain-{i}", args.seed, args.slow_ms, concurrency))
            got = run_audit(
                root=Path(tmp) / f"swarm-{i}",
                executors=args.executors,
                max_concurrent=args.slots,
                seed=args.seed,
                slow_ms=args.slow_ms,
                kill=False,
            )
            if got.error:
                raise HivemeshError(f"the swarm audit failed: {got.error}")
            truth_path = Path(tmp) / f"swarm-{i}" / "fixture" / "ground-truth.json"
            truth = json.loads(truth_path.read_text(encoding="utf-8"))
            got.fixture_stats["duplicates"] = _duplicates(got.fixture_stats, truth)
            ours.append(got)
    best = min(ours, key=lambda r: r.audit_seconds)
    plain = min(base, key=lambda r: r["seconds"])
    shops = best.summary["shops"]
    overhead = best.audit_seconds / plain["seconds"] - 1
    dup = max(r.fixture_stats["duplicates"] for r in ours)
    return BenchResult(
        "audit",
        metrics=[
            Metric(
                "wall time of the audit",
                best.audit_seconds,
                plain["seconds"],
                "s",
                baseline_name="plain asyncio",
                higher_is_better=False,
                goal="overhead <= 15%",
                goal_met=overhead <= 0.15,
            ),
            Metric(
                "shops per minute",
                shops / best.audit_seconds * 60,
                shops / plain["seconds"] * 60,
                "shops/min",
                baseline_name="plain asyncio",
            ),
            Metric(
                "duplicate page fetches",
                dup,
                max(r["duplicates"] for r in base),
                "pages",
                baseline_name="plain asyncio",
                higher_is_better=False,
                goal="0",
                goal_met=dup == 0,
            ),
        ],
        details={
            "coordination_overhead_pct": round(overhead * 100, 1),
            "concurrency": concurrency,
            "executors": args.executors,
            "swarm_start_up_s": round(best.seconds - best.audit_seconds, 1),
            "swarm_runs_s": [round(r.audit_seconds, 2) for r in ours],
            "plain_runs_s": [round(r["seconds"], 2) for r in base],
            "swarm_tool_calls": best.summary["tool_calls"],
            "plain_fetch_calls": plain["calls"],
            "swarm_mismatches": best.summary["mismatches"],
            "plain_wrong_shops": plain["wrong_shops"],
        },
    )
