"""``hivemesh metrics``: record a metric; query a local collector store (DuckDB).

``record NAME VALUE`` records one measurement on the node of ``--data-dir``
(any node, through its control socket): it is spooled there and sent to
the ``metrics-collector`` like every record the node makes. Its options
follow the record schema (:mod:`hivemesh.telemetry.schema`): ``--kind``,
``--unit``, ``--agent``, the GenAI attributes (``--model``, ``--provider``,
``--operation``, ``--tool``, ``--input-tokens``, ``--output-tokens``,
``--error-type``, ``--task-id``) and any ``--attr KEY=VALUE``. With
``--wait`` it returns only once the collector stored it (else it fails
saying why, and the record stays spooled).

Query subcommands: ``top [--by agent|model|tool] [--since 1h]``, ``failures``
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

from hivemesh.client.cli import add_common
from hivemesh.errors import HivemeshError, InvalidArgument
from hivemesh.telemetry.schema import (
    ATTR_ERROR_TYPE,
    ATTR_INPUT_TOKENS,
    ATTR_MODEL,
    ATTR_OPERATION,
    ATTR_OUTPUT_TOKENS,
    ATTR_PROVIDER,
    ATTR_TASK_ID,
    ATTR_TOOL,
    KINDS,
)

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
    p = sub.add_parser("metrics", help="record a metric; query the telemetry collector store")
    p.add_argument("--store", default=None, help="DuckDB file (default: %(default)s)")
    add_common(p)  # --data-dir: ask (or record on) the running node of this dir
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
        add_common(sp)
    _register_record(msub)


#: ``metrics record`` options that set a GenAI attribute.
_ATTR_OPTIONS = (
    ("model", ATTR_MODEL, str),
    ("provider", ATTR_PROVIDER, str),
    ("operation", ATTR_OPERATION, str),
    ("tool", ATTR_TOOL, str),
    ("input_tokens", ATTR_INPUT_TOKENS, int),
    ("output_tokens", ATTR_OUTPUT_TOKENS, int),
    ("error_type", ATTR_ERROR_TYPE, str),
    ("task_id", ATTR_TASK_ID, str),
)


def _register_record(msub: Any) -> None:
    r = msub.add_parser("record", help="record a metric on a node (sent to the collector)")
    r.add_argument("name", help="metric name, e.g. gen_ai.client.operation.duration")
    r.add_argument("value", type=float, help="the measurement (a duration in --unit)")
    r.add_argument(
        "--kind",
        choices=KINDS,
        default=None,
        help="default: llm_call with --model, tool_call with --tool, else gauge",
    )
    r.add_argument(
        "--unit",
        default=None,
        help="ms, s, 1, By, {token}... (default: ms for llm_call, tool_call, task and timer)",
    )
    r.add_argument("--agent", default=None, help="agent name (default: the node's name)")
    for opt, attr, typ in _ATTR_OPTIONS:
        r.add_argument(f"--{opt.replace('_', '-')}", type=typ, default=None, help=f"sets {attr}")
    r.add_argument(
        "--attr",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="another attribute (VALUE: a number, true/false or text); repeatable",
    )
    r.add_argument("--count", type=int, default=1, help="record it N times (load tests)")
    r.add_argument("--wait", action="store_true", help="return once the collector stored it")
    r.add_argument("--timeout-s", type=float, default=10.0, help="with --wait (default 10)")
    add_common(r)
    r.set_defaults(func=_record)  # fmt: skip


def _attr_value(text: str) -> Any:
    try:
        v = json.loads(text)
    except ValueError:
        return text
    return v if isinstance(v, (bool, int, float)) else text


def record_args(args: argparse.Namespace) -> dict[str, Any]:
    """The ``metrics.record`` control arguments of ``hivemesh metrics record``."""
    attrs: dict[str, Any] = {}
    for opt, attr, _ in _ATTR_OPTIONS:
        if getattr(args, opt) is not None:
            attrs[attr] = getattr(args, opt)
    for item in args.attr:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise InvalidArgument(f"--attr {item!r} must be KEY=VALUE")
        attrs[key] = _attr_value(value)
    kind = args.kind or ("llm_call" if args.model else "tool_call" if args.tool else "gauge")
    unit = args.unit
    if unit is None:
        unit = "ms" if kind in ("llm_call", "tool_call", "task", "timer") else ""
    out: dict[str, Any] = {"name": args.name, "value": args.value, "kind": kind, "unit": unit,
                           "attrs": attrs, "count": args.count}  # fmt: skip
    if args.agent is not None:
        out["agent"] = args.agent
    if args.wait:
        out["wait_s"] = args.timeout_s
    return out


def _record(args: argparse.Namespace) -> int:
    from hivemesh.client.blocking import Client
    from hivemesh.client.cli import data_dir_of, emit, emit_error
    from hivemesh.commands import MetricsRecord

    try:
        call = record_args(args)
        timeout_s = args.timeout_s + 5.0 if args.wait else 10.0
        request = MetricsRecord.from_wire(call)  # checked here as the daemon would
        got = Client(data_dir_of(args), timeout_s=timeout_s).run(request).to_wire()
    except HivemeshError as exc:
        return emit_error(args, exc)

    def text(r: dict[str, Any]) -> str:
        seqs = f"seq {r['first_seq']}" + (f"..{r['last_seq']}" if r["recorded"] > 1 else "")
        done = "stored by the collector" if r["stored"] else "spooled for the collector"
        return f"recorded {r['recorded']} ({seqs}); {done}"

    emit(args, got, text)
    return 0


def _live(args: argparse.Namespace, what: str, **kw: Any) -> Any:
    """Ask the running collector of ``--data-dir`` (None without ``--data-dir``)."""
    if not getattr(args, "data_dir", None):
        return None
    from hivemesh.client.blocking import Client
    from hivemesh.commands import MetricsQuery

    return Client(args.data_dir, timeout_s=30.0).run(MetricsQuery(what=what, **kw)).to_wire()


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
