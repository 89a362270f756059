"""What ``hivemesh status`` and ``hivemesh peers`` report, and event subscriptions.

``status`` is the Peer's own report (:func:`hivemesh.core.answers.peer_status`,
:func:`~hivemesh.core.answers.peer_counters`) with the driver's parts added:
every counter of every part of the node in one flat, sorted map (core
replication, channels, membership, direct messages, control socket, views'
rejections, transport), so nothing is dropped or
refused without a visible number; ``dropped_total`` sums every counter that
records lost work (:func:`~hivemesh.core.answers.dropped_total`).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from hivemesh.core.answers import dropped_total, journal_heads, peer_counters, peer_status
from hivemesh.core.event import Event
from hivemesh.core.links import path_words

if TYPE_CHECKING:
    from hivemesh.runtime.daemon import Daemon

__all__ = ["Subscription", "peers_of", "status_of"]

_SUBSCRIBER_QUEUE = 1024


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class Subscription:
    """A bounded queue of events of some kinds; overflow is counted."""

    def __init__(self, kinds: frozenset[str] | None, maxsize: int = _SUBSCRIBER_QUEUE) -> None:
        self.kinds = kinds
        self.queue: asyncio.Queue[Event] = asyncio.Queue(maxsize)
        self.dropped = 0

    def offer_many(self, events: tuple[Event, ...]) -> None:
        """Queue each of ``events`` of a subscribed kind (the daemon hands
        over a whole delivered batch); count those a full queue drops."""
        kinds, put = self.kinds, self.queue.put_nowait
        for ev in events:
            if kinds is None or ev.kind in kinds:
                try:
                    put(ev)
                except asyncio.QueueFull:
                    self.dropped += 1


def status_of(d: Daemon) -> dict[str, Any]:
    """Everything ``hivemesh status`` shows. While the daemon starts (its
    views being rebuilt) only what exists yet, with ``rehydrating: {done,
    total}`` (:mod:`hivemesh.runtime.rehydration`)."""
    j = d.node.journal
    if not d.rehydration.is_complete:
        return {
            "address": d.address,
            "data_dir": str(d.config.data_dir),
            "uptime_s": round((_now_ms() - d.started_ms) / 1000, 3),
            "rehydrating": d.rehydration.progress(),
            "journal": {"events": j.total_events, "feeds": len(j.heads), "heads": journal_heads(j)},
            "counters": dict(sorted(d.counters.items())),
        }
    counters = peer_counters(d.peer)
    counters.update(d.conns.counters)
    if d.feedlog is not None:  # broker mode: the journal log's counters
        counters.update(d.feedlog.counters)
    counters.update(d.counters)
    if d._mdns is not None:
        counters.update({f"mdns_{k}": v for k, v in d._mdns.counters.items()})
    counters["subscriber_dropped"] += sum(s.dropped for s in d._subs)
    transport = d.conns.transport_counters.snapshot()
    st = peer_status(d.peer)  # what the Peer decides; the driver's parts below
    st["journal"].update(
        rehydrated=d.rehydrated,
        # the last start's replay: time, view checkpoint, loro imports (tail)
        rehydration=d.rehydration.snapshot(),
        # our batches a crash left in the store's append log, committed at start
        log_recovered=d._store.log_recovered,
        log_torn_bytes=d._store.log_torn_bytes,
        log_orphaned=d._store.log_orphaned,
    )
    return {
        **st,
        "boot_id": d.conns.boot_id.hex(),
        "listen": f"{d.config.listen_endpoint()[0]}:{d.listen_port}",
        "data_dir": str(d.config.data_dir),
        "uptime_s": round((_now_ms() - d.started_ms) / 1000, 3),
        "peers_connected": len(d.conns.links),
        "trust": {"mode": d.config.trust_mode, **d.invites.status(_now_ms())},
        "inbox": d.messaging.inbox.count(),
        "counters": dict(sorted(counters.items())),
        # the supervised loops: running, failures, restarts (runtime.supervise)
        "tasks": d.supervisor.statistics(),
        "transport": transport,
        "dropped_total": dropped_total(counters, transport),
        # broker mode: the journal's log (runtime.broker); None peer to peer
        "mesh": None if d.feedlog is None else d.feedlog.statistics(),
        # UDP/QUIC, relays, hole punching and path changes (runtime.paths); None if off
        "paths": None if d.paths is None else d.paths.statistics(),
    }


def peers_of(d: Daemon) -> list[dict[str, Any]]:
    """Known members with their channel figures."""
    chans = d.conns.statistics()
    members = d.peer.members_snapshot()
    out = []
    for addr in sorted(set(members) | set(chans)):
        m = members.get(addr)
        out.append(
            {
                "address": addr,
                "names": d.names.names_of(addr),
                "state": m["state"] if m else "connecting",
                "endpoints": m["endpoints"] if m else d.endpoints.endpoints(addr),
                "channel": chans.get(addr),
                # direct TCP, direct UDP, punched, relayed via <relay>; RTT where measured
                "path": path_words(link.channel.path)
                if (link := d.conns.links.get(addr))
                else None,
                "rtt_ms": link.channel.rtt_ms if link else None,
                "revoked": d.trust.is_revoked(addr),
            }
        )
    return out
