"""``hivemesh metrics``: query a local collector store (DuckDB).

Subcommands: ``top [--by agent|model|tool] [--since 1h]``, ``failures``
(failure rate per agent and per tool), ``query SQL``, ``gaps`` (missing
ranges per sender) and ``senders``. The store path comes from ``--store``,
else ``$HIVEMESH_METRICS_STORE``, else ``$HIVEMESH_HOME/metrics.duckdb``
(``~/.hivemesh``). The file is opened read-only; DuckDB refuses while a
running collector holds it for writing, and the command says so. With
``--data-dir DIR`` the query goes instead to the running collector node of
that data dir, through its control socket (``hivemesh up --collector``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hivemesh.errors import HivemeshError

__all__ = ["default_store_path", "register", "render_table"]


def default_store_path() -> str:
    """Where the collector's DuckDB file is by default."""
    env = os.environ.get("HIVEMESH_METRICS_STORE")
    if env:
        return env
    home = os.environ.get("HIVEMESH_HOME") or str(Path.home() / ".hivemesh")
    return str(Path(home) / "metrics.duckdb")


def render_table(names: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain fixed-width table."""
    cells = [[str(n) for n in names]] + [["" if v is None else str(v) for v in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(names))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _emit(args: argparse.Namespace, names: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    if args.json:
        print(json.dumps([dict(zip(names, r, strict=True)) for r in rows], default=str))
    else:
        print(render_table(names, rows))


def _open(args: argparse.Namespace) -> Any:
    from hivemesh.telemetry.store import MetricsStore

    path = args.store or default_store_path()
    if not Path(path).exists():
        raise FileNotFoundError(f"no metrics store at {path} (use --store)")
    try:
        return MetricsStore(path, read_only=True)
    except HivemeshError as exc:
        if "lock" in str(exc).lower():
            raise type(exc)(
                f"{exc} -- a running collector holds the store (DuckDB allows one writer "
                "process); query a copy or stop the collector"
            ) from exc
        raise


def register(sub: Any) -> None:
    """Add the ``metrics`` subcommand."""
    p = sub.add_parser("metrics", help="query the local telemetry collector store")
    p.add_argument("--store", default=None, help="DuckDB file (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--data-dir", default=None, help="ask the running collector node of this dir")
    msub = p.add_subparsers(dest="metrics_cmd", metavar="QUERY", required=True)
    t = msub.add_parser("top", help="records, failures, tokens, p50/p99 per agent, model or tool")
    t.add_argument("--by", choices=("agent", "model", "tool", "sender", "name"), default="agent")
    t.add_argument("--since", default=None, help="e.g. 15m, 1h, 2d")
    t.add_argument("--limit", type=int, default=20)
    t.set_defaults(func=_top)
    f = msub.add_parser("failures", help="failure rate per agent and per tool")
    f.add_argument("--since", default=None)
    f.set_defaults(func=_failures)
    q = msub.add_parser("query", help="run SQL against the store (tables: metrics, senders, ...)")
    q.add_argument("sql")
    q.set_defaults(func=_query)
    g = msub.add_parser("gaps", help="missing sequence ranges (true losses) per sender")
    g.set_defaults(func=_gaps)
    s = msub.add_parser("senders", help="per-sender stored count, gaps, pending, backlog")
    s.set_defaults(func=_senders)
    for sp in (t, f, q, g, s):
        sp.add_argument("--store", default=argparse.SUPPRESS)
        sp.add_argument("--json", action="store_true", default=argparse.SUPPRESS)
        sp.add_argument("--data-dir", default=argparse.SUPPRESS)


def _live(args: argparse.Namespace, what: str, **kw: Any) -> Any:
    """Ask the running collector of ``--data-dir`` (None without ``--data-dir``)."""
    if not getattr(args, "data_dir", None):
        return None
    from hivemesh.runtime.client import Client

    return Client(args.data_dir, timeout_s=30.0).call("metrics", what=what, **kw)


def _reports_live(args: argparse.Namespace) -> list[Any] | None:
    from hivemesh.telemetry.collector import SenderReport

    got = _live(args, "senders")
    if got is None:
        return None
    return [
        SenderReport(
            sender=r["sender"], stored=r["stored"], max_seq=r["max_seq"],
            gaps=[(lo, hi) for lo, hi in r["gaps"]],
            pending=(r["pending"][0], r["pending"][1]) if r["pending"] else None,
            backlog=r["backlog"], last_seen_ms=r["last_seen_ms"],
        )
        for r in got
    ]  # fmt: skip


def _guard(func: Any) -> Any:
    def run(args: argparse.Namespace) -> int:
        try:
            return int(func(args))
        except (HivemeshError, FileNotFoundError) as exc:
            print(f"hivemesh metrics: {exc}", file=sys.stderr)
            return 1

    return run


def _since_ms(args: argparse.Namespace) -> int | None:
    from hivemesh.telemetry.store import parse_since

    return parse_since(args.since) if args.since else None


@_guard
def _top(args: argparse.Namespace) -> int:
    got = _live(args, "top", by=args.by, since_ms=_since_ms(args), limit=args.limit)
    if got is not None:
        _emit(args, got["columns"], got["rows"])
        return 0
    store = _open(args)
    try:
        now = int(time.time() * 1000)
        names, rows = store.top(args.by, _since_ms(args), now, args.limit)
    finally:
        store.close()
    _emit(args, names, rows)
    return 0


@_guard
def _failures(args: argparse.Namespace) -> int:
    out: list[tuple[Any, ...]] = []
    for by in ("agent", "tool"):
        live = _live(args, "top", by=by, since_ms=_since_ms(args), limit=1000)
        if live is not None:
            names, rows = live["columns"], live["rows"]
        else:
            store = _open(args)
            try:
                names, rows = store.top(by, _since_ms(args), int(time.time() * 1000), 1000)
            finally:
                store.close()
        for r in rows:
            d = dict(zip(names, r, strict=True))
            out.append((by, d[by], d["records"], d["failures"], d["failure_rate"]))
    out.sort(key=lambda r: (r[0], -(r[4] or 0), str(r[1])))
    _emit(args, ["by", "key", "records", "failures", "failure_rate"], out)
    return 0


@_guard
def _query(args: argparse.Namespace) -> int:
    got = _live(args, "query", sql=args.sql)
    if got is not None:
        _emit(args, got["columns"], got["rows"])
        return 0
    store = _open(args)
    try:
        names, rows = store.query(args.sql)
    finally:
        store.close()
    _emit(args, names, rows)
    return 0


def _reports(args: argparse.Namespace) -> list[Any]:
    from hivemesh.telemetry.collector import Collector

    live = _reports_live(args)
    if live is not None:
        return live
    store = _open(args)
    try:
        return Collector(store).senders()
    finally:
        store.close()


@_guard
def _gaps(args: argparse.Namespace) -> int:
    rows = [(r.sender, lo, hi, hi - lo + 1) for r in _reports(args) for lo, hi in r.gaps]
    _emit(args, ["sender", "first_missing", "last_missing", "count"], rows)
    return 0


@_guard
def _senders(args: argparse.Namespace) -> int:
    rows = [
        (r.sender, r.stored, r.max_seq, sum(hi - lo + 1 for lo, hi in r.gaps),
         f"{r.pending[0]}-{r.pending[1]}" if r.pending else "", r.backlog, r.last_seen_ms)
        for r in _reports(args)
    ]  # fmt: skip
    _emit(
        args, ["sender", "stored", "max_seq", "missing", "pending", "backlog", "last_seen_ms"], rows
    )
    return 0
