"""``hivemesh status``: the local node's journal, members, counters and drops."""

from __future__ import annotations

import argparse
from typing import Any

from hivemesh.client.cli import add_common, run_command
from hivemesh.commands import Status


def register(sub: Any) -> None:
    """Add the ``status`` subcommand."""
    p = sub.add_parser("status", help="show the local node's state and counters")
    p.add_argument(
        "--heads",
        action="store_true",
        help="list every feed's head: seq and hash of its last event",
    )
    add_common(p)
    p.set_defaults(func=_run)


def _text(st: dict[str, Any]) -> str:
    j = st["journal"]
    if "rehydrating" in st:  # starting: only the replay's progress exists yet
        r = st["rehydrating"]
        return (
            f"node      {st['address']}\n"
            f"starting  rebuilding views: {r['done']} of {r['total']} stored events replayed"
        )
    lines = [
        f"node      {st['address']}" + (f"  ({', '.join(st['names'])})" if st["names"] else ""),
        f"listen    {st['listen']}   uptime {st['uptime_s']:.0f}s",
        f"journal   {j['events']} events in {j['feeds']} feeds (own seq {j['own_seq']})",
        _own_feed(st.get("own_feed")),
        f"peers     {st['peers_connected']} connected",
    ]
    states: dict[str, int] = {}
    for m in st["members"].values():
        states[m["state"]] = states.get(m["state"], 0) + 1
    if states:
        lines.append(
            "members   "
            + ", ".join(f"{n} {s}" for s, n in sorted(states.items()))
            + f"   (a crash is detected within {st['detection_bound_ms'] / 1000:.1f}s)"
        )
    lines.append(f"inbox     {st['inbox']} messages   blobs {st['blobs']['known']} known")
    paths = st.get("paths")
    if paths:  # UDP/QUIC, relays, punching (runtime.paths)
        relays = ", ".join(
            f"{a[:12]} {'up' if up else 'down'}" for a, up in paths["relays"].items()
        )
        lines.append(
            f"udp       port {paths['udp_port']}   relays: {relays or 'none'}"
            f"   observed: {', '.join(paths['observed']) or '-'}"
            + (" (symmetric NAT)" if paths.get("symmetric") else "")
            + ("   relay role on" if paths["relay"] is not None else "")
        )
        lines.extend(  # STUN answers, beside the observed address they vote for
            f"stun      {server} sees us as {row['mapped']}"
            if "mapped" in row
            else f"stun      {server}: {row['error']}"
            for server, row in paths.get("stun", {}).items()
        )
        lines.extend(
            f"path      {e['peer'][:12]} {e['from']} -> {e['to']}"
            for e in paths["path_events"][-5:]
        )
    lines.append(f"dropped   {st['dropped_total']} (every drop is counted below)")
    for addr, row in sorted(st.get("clock_ahead", {}).items()):  # whose clock is wrong
        waiting = row.get("waiting_from_seq")
        lines.append(
            f"clock     {addr} stamped {row['deferred_batches']} batch(es) past the clock bound"
            + (f"; its #{waiting} on waits" if waiting is not None else "")
        )
    for t in st.get("name_takeovers", []):
        lines.append(
            f"names     {t['claimant']} backdated a claim on {t['name']} (owner {t['owner']})"
        )
    counters = st["counters"]
    if counters:
        lines.append("counters")
        lines.extend(f"  {k:<36} {v}" for k, v in sorted(counters.items()))
    return "\n".join(lines)


def _heads_text(st: dict[str, Any]) -> str:
    heads = st["journal"].get("heads", {})
    rows = [f"{addr}  #{h['seq']:<8} {h['hash']}" for addr, h in sorted(heads.items())]
    return "\n".join(rows) or "no feeds"


def _own_feed(own: dict[str, Any] | None) -> str:
    if not own:
        return "own feed  (not reported)"
    if own["state"] == "writable":
        return f"own feed  writable (mark #{own['mark']})"
    return f"own feed  {own['state'].upper()}: writes refused -- {own['reason']}"


def _run(args: argparse.Namespace) -> int:
    return run_command(args, Status(), _text if not args.heads else _heads_text)
