"""``hivemesh ctx get|set|append|incr|watch|add|remove|members``: shared
context replicated over the swarm.

``append`` adds JSON values (plain text if not JSON) to the list NAME;
``incr`` adds a number (default 1, may be negative) to the counter NAME.

``add``/``remove``/``members`` work on a context's sets: the add-wins
observed-remove set called NAME by default (an add concurrent with a remove of
the same element wins), or the grow-only set called NAME with ``--grow-only``
(no remove).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from hivemesh.client.cli import add_common, data_dir_of, emit_error, run_command
from hivemesh.commands import CtxAdd, CtxAppend, CtxGet, CtxIncr, CtxMembers, CtxRemove, CtxSet
from hivemesh.commands.wire import decode
from hivemesh.errors import HivemeshError, InputTooDeep, InvalidArgument, InvalidEncoding


def register(sub: Any) -> None:
    """Add the ``ctx`` subcommand."""
    p = sub.add_parser("ctx", help="read, write and watch shared context")
    add_common(p)
    csub = p.add_subparsers(dest="ctx_cmd", metavar="ACTION", required=True)
    g = csub.add_parser("get", help="print a context or one key")
    g.add_argument("key", nargs="?")
    g.add_argument("--context", "-c", default="default")
    add_common(g)
    g.set_defaults(func=_get)
    s = csub.add_parser("set", help="set KEY to a JSON VALUE (plain text if not JSON)")
    s.add_argument("key")
    s.add_argument("value")
    s.add_argument("--context", "-c", default="default")
    add_common(s)
    s.set_defaults(func=_set)
    ap = csub.add_parser("append", help="append JSON VALUEs to the list NAME")
    ap.add_argument("list", metavar="NAME")
    ap.add_argument("values", metavar="VALUE", nargs="+")
    ap.add_argument("--context", "-c", default="default")
    add_common(ap)
    ap.set_defaults(func=_append)
    inc = csub.add_parser("incr", help="add BY (default 1) to the counter NAME")
    inc.add_argument("counter", metavar="NAME")
    inc.add_argument("by", metavar="BY", nargs="?", type=float, default=1.0)
    inc.add_argument("--context", "-c", default="default")
    add_common(inc)
    inc.set_defaults(func=_incr)
    a = csub.add_parser("add", help="add ELEMENTs to the set NAME")
    a.add_argument("set", metavar="NAME")
    a.add_argument("elements", metavar="ELEMENT", nargs="+")
    _set_options(a, grow_only=True)
    a.set_defaults(func=_add)
    r = csub.add_parser("remove", help="remove ELEMENTs from the add-wins set NAME")
    r.add_argument("set", metavar="NAME")
    r.add_argument("elements", metavar="ELEMENT", nargs="+")
    _set_options(r, grow_only=False)
    r.set_defaults(func=_remove)
    m = csub.add_parser("members", help="print the members of the set NAME")
    m.add_argument("set", metavar="NAME")
    _set_options(m, grow_only=True)
    m.set_defaults(func=_members)
    w = csub.add_parser("watch", help="print the context every time it changes")
    w.add_argument("--context", "-c", default="default")
    w.add_argument("--idle-timeout-s", type=float, help="stop after this long without changes")
    add_common(w)
    w.set_defaults(func=_watch)


def _set_options(p: argparse.ArgumentParser, *, grow_only: bool) -> None:
    p.add_argument("--context", "-c", default="default")
    if grow_only:
        p.add_argument(
            "--grow-only", action="store_true", help="the grow-only set (default: add-wins set)"
        )
    add_common(p)


def _members_text(r: dict[str, Any]) -> str:
    return "\n".join(r["members"]) if r["members"] else "(empty)"


def _add(args: argparse.Namespace) -> int:
    request = CtxAdd(
        set=args.set, elements=tuple(args.elements), context=args.context, grow_only=args.grow_only
    )
    return run_command(args, request, _members_text)


def _remove(args: argparse.Namespace) -> int:
    request = CtxRemove(set=args.set, elements=tuple(args.elements), context=args.context)
    return run_command(args, request, _members_text)


def _members(args: argparse.Namespace) -> int:
    request = CtxMembers(set=args.set, context=args.context, grow_only=args.grow_only)
    return run_command(args, request, _members_text)


def _get(args: argparse.Namespace) -> int:
    if args.key is None:
        return run_command(
            args,
            CtxGet(context=args.context),
            lambda r: json.dumps(r, indent=2, sort_keys=True),
        )
    return run_command(
        args,
        CtxGet(context=args.context, key=args.key),
        lambda r: json.dumps(r["value"]) if r["found"] else f"{r['key']}: not set",
    )


def _value(text: str) -> Any:
    """``text`` as JSON, or as plain text if it is not JSON (JSON we refuse raises)."""
    try:
        return decode(text, what="VALUE")
    except (InputTooDeep, InvalidEncoding):  # JSON we refuse, not plain text
        raise
    except InvalidArgument:
        return text  # not JSON: plain text (checked when it is sent)


def _append(args: argparse.Namespace) -> int:
    try:
        values = tuple(_value(v) for v in args.values)
    except HivemeshError as exc:
        return emit_error(args, exc)
    request = CtxAppend(list=args.list, values=values, context=args.context)
    return run_command(args, request, lambda r: f"{args.list}: {r['length']} items")


def _incr(args: argparse.Namespace) -> int:
    request = CtxIncr(counter=args.counter, by=args.by, context=args.context)
    return run_command(args, request, lambda r: f"{args.counter} = {r['value']:g}")


def _set(args: argparse.Namespace) -> int:
    try:
        value = _value(args.value)
    except HivemeshError as exc:
        return emit_error(args, exc)
    return run_command(
        args,
        CtxSet(key=args.key, value=value, context=args.context),
        lambda r: f"set {r['context']}/{r['key']} (own seq {r['seq']})",
    )


def _watch(args: argparse.Namespace) -> int:
    from hivemesh.client.blocking import Client

    client = Client(data_dir_of(args))
    try:
        for ev in client.stream(
            "ctx.watch", idle_timeout_s=args.idle_timeout_s, context=args.context
        ):
            if args.json:
                print(json.dumps(ev, sort_keys=True), flush=True)
            else:
                who = ev.get("author", "")[:12] or "now"
                print(
                    f"[{who}] {json.dumps(ev['state'].get('kv', {}), sort_keys=True)}", flush=True
                )
    except HivemeshError as exc:
        return emit_error(args, exc)
    except KeyboardInterrupt:
        return 0
    return 0
