"""``hivemesh peers``: known members, their state, names and channels."""

from __future__ import annotations

import argparse
from typing import Any

from hivemesh.client.cli import add_common, run_command
from hivemesh.commands import Peers


def register(sub: Any) -> None:
    """Add the ``peers`` subcommand."""
    p = sub.add_parser("peers", help="list known members and channels")
    add_common(p)
    p.set_defaults(func=_run)


def _text(peers: list[dict[str, Any]]) -> str:
    if not peers:
        return "no peers known yet"
    lines = []
    for p in peers:
        ch = p["channel"]
        link = f"{ch['direction']} {ch['frames_in']}/{ch['frames_out']} frames" if ch else "-"
        names = ",".join(p["names"]) or "-"
        eps = ",".join(p["endpoints"]) or "-"
        path = p.get("path") or "-"  # direct TCP, direct UDP, punched, relayed via R
        rtt = f"{p['rtt_ms']:.1f}ms" if p.get("rtt_ms") is not None else "-"
        lines.append(
            f"{p['address'][:16]}  {p['state']:<8} {names:<20} {eps:<22} "
            f"{path:<24} {rtt:>8}  {link}"
        )
    return "\n".join(lines)


def _run(args: argparse.Namespace) -> int:
    return run_command(args, Peers(), _text)
