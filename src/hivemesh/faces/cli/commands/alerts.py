"""``hivemesh alerts``: list the health monitor's alerts from the local collector store."""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from typing import Any

from hivemesh.client.cli import add_common
from hivemesh.errors import HivemeshError
from hivemesh.faces.cli.commands.metrics import _emit, _live, _open

__all__ = ["register"]


def register(sub: Any) -> None:
    """Add the ``alerts`` subcommand."""
    p = sub.add_parser("alerts", help="list firing (or all) fleet-health alerts")
    p.add_argument("--all", action="store_true", help="include resolved alerts")
    p.add_argument("--store", default=None, help="collector DuckDB file")
    add_common(p)  # --data-dir: ask the running collector node of this dir
    p.set_defaults(func=_alerts)


def _when(ms: Any) -> str:
    if ms is None:
        return ""
    return dt.datetime.fromtimestamp(int(ms) / 1000, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _alerts(args: argparse.Namespace) -> int:
    try:
        alerts = _live(args, "alerts", all=args.all)
        if alerts is None:
            store = _open(args)
            try:
                alerts = store.alerts(active_only=not args.all)
            finally:
                store.close()
    except (HivemeshError, FileNotFoundError) as exc:
        print(f"hivemesh alerts: {exc}", file=sys.stderr)
        return 1
    names = ["status", "severity", "rule", "subject", "summary", "since", "updated"]
    rows = [
        (a["status"], a["severity"], a["rule"], a["subject"], a["summary"],
         _when(a["started_ms"]), _when(a["updated_ms"]))
        for a in alerts
    ]  # fmt: skip
    if args.json:
        _emit(args, list(alerts[0]) if alerts else names, [list(a.values()) for a in alerts])
    else:
        _emit(args, names, rows)
    return 0
