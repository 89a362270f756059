"""The market report: Markdown, CSV and JSON from an exported audit (pure + files).

:func:`build_report` turns :func:`hivemesh.audit.ops.export` data (and,
optionally, the fixture's ground truth) into one report: one row per shop
and product (price, currency, time, evidence blob hash, the agent that
produced it, how many tool calls it took), the escalated shops with the
operator's answers, the takeovers, and a summary (tool calls and outcomes,
corrections by action, mismatches against the ground truth).
:func:`write_report` writes ``report.md``, ``report.csv`` and
``report.json`` into a directory.
"""

from __future__ import annotations

import csv
import io
import json
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

from hivemesh.core.hlc import LOGICAL_BITS

__all__ = ["COLUMNS", "build_report", "render_markdown", "write_report"]

COLUMNS = ("shop", "sku", "name", "price", "currency", "time", "evidence", "agent", "attempts")


def _iso(hlc: int) -> str:
    ms = hlc >> LOGICAL_BITS
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


def build_report(
    doc: dict[str, Any], *, ground_truth: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The report as plain data (see the module docs)."""
    rows: list[dict[str, Any]] = []
    for shop, done in sorted(doc["done"].items()):
        for p in done.get("products", []):
            rows.append(
                {
                    "shop": shop,
                    "sku": p.get("sku"),
                    "name": p.get("name"),
                    "price": p.get("price"),
                    "currency": p.get("currency"),
                    "time": _iso(int(done["hlc"])),
                    "evidence": p.get("blob", ""),
                    "agent": done["agent"],
                    "attempts": done.get("attempts", 0),
                }
            )
    mismatches: list[dict[str, Any]] = []
    if ground_truth is not None:
        got = {(r["shop"], r["sku"]): (r["price"], r["currency"]) for r in rows}
        for shop, truth in sorted(ground_truth["shops"].items()):
            for p in truth["products"]:
                have = got.pop((shop, p["sku"]), None)
                if have != (p["price"], truth["currency"]):
                    mismatches.append(
                        {"shop": shop, "sku": p["sku"], "want": p["price"], "got": have}
                    )
        mismatches += [
            {"shop": s, "sku": k, "want": None, "got": v} for (s, k), v in sorted(got.items())
        ]
    outcomes = Counter(f"{r['tool']}:{r['outcome']}" for r in doc["tool_results"])
    errors = Counter(r["error"] for r in doc["tool_results"] if r["outcome"] == "error")
    actions = Counter(c["action"] for c in doc["corrections"])
    summary = {
        "audit": doc["audit"],
        "shops": len(doc["shops"]),
        "shops_done": len(doc["done"]),
        "shops_skipped": len(doc["skipped"]),
        "products": len(rows),
        "agents": len({d["agent"] for d in doc["done"].values()}),
        "tool_calls": len(doc["tool_calls"]),
        "tool_outcomes": dict(sorted(outcomes.items())),
        "errors": dict(sorted(errors.items())),
        "corrections": dict(sorted(actions.items())),
        "repeated_corrections": sum(1 for c in doc["corrections"] if c.get("repeat")),
        "escalations": len(doc["questions"]),
        "takeovers": len(doc["takeovers"]),
        "checked": ground_truth is not None,
        "mismatches": len(mismatches),
    }
    return {
        "summary": summary,
        "rows": rows,
        "escalations": doc["questions"],
        "takeovers": doc["takeovers"],
        "mismatches": mismatches[:200],
    }


def render_markdown(report: dict[str, Any]) -> str:
    """The report as Markdown."""
    s = report["summary"]
    out = [
        f"# Market report — audit {s['audit']}",
        "",
        f"{s['shops_done']} of {s['shops']} shops audited ({s['products']} products) by "
        f"{s['agents']} agents; {s['tool_calls']} tool calls, {s['escalations']} escalations, "
        f"{s['takeovers']} takeovers.",
    ]
    if s["checked"]:
        verdict = "every price matches" if not s["mismatches"] else f"{s['mismatches']} mismatches"
        out.append(f"Checked against the fixture's ground truth: {verdict}.")
    out += ["", "## Corrections", ""]
    out += [f"- {a}: {n}" for a, n in s["corrections"].items()] or ["- none"]
    out += ["", "## Escalations", ""]
    for q in report["escalations"]:
        out.append(
            f"- **{q['shop']}** ({q['id']}): {q['question']} — answer: {q['answer'] or '(open)'}"
        )
    if not report["escalations"]:
        out.append("- none")
    out += ["", "## Takeovers", ""]
    for t in report["takeovers"]:
        out.append(
            f"- {t['shop']}: {t['by'][:12]}… took over from "
            f"{', '.join(a[:12] + '…' for a in t['from'])}, reused pages {t['reused']}, "
            f"redid {t['redo']}"
        )
    if not report["takeovers"]:
        out.append("- none")
    out += ["", "## Prices", "", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in report["rows"]:
        cells = [str(r[c]) for c in COLUMNS]
        cells[6], cells[7] = cells[6][:16], cells[7][:12]
        out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(out) + "\n"


def _csv(report: dict[str, Any]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(COLUMNS), lineterminator="\n")
    w.writeheader()
    w.writerows(report["rows"])
    return buf.getvalue()


def write_report(report: dict[str, Any], out_dir: str | os.PathLike[str]) -> dict[str, str]:
    """Write ``report.md``, ``report.csv`` and ``report.json``; their paths."""
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    files = {
        "markdown": ("report.md", render_markdown(report)),
        "csv": ("report.csv", _csv(report)),
        "json": ("report.json", json.dumps(report, indent=1, sort_keys=True, ensure_ascii=False)),
    }
    paths = {}
    for key, (name, text) in files.items():
        tmp = d / f".{name}.tmp"
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(d / name)
        paths[key] = str(d / name)
    return paths
