"""SWIM membership wired to channels, replication and the journal.

Theory of operation
-------------------
The protocol is :class:`hivemesh.core.membership.Membership` (probes,
indirect probes, suspicion, refutation, piggybacked peer exchange). Its
frames travel through the core node's outbox like every other frame. This
module turns its state changes into actions, after every input:

* ``up``        -- dial the member's endpoints (kept with backoff) and, if a
  channel is up, replicate with it (``node.add_peer``); a member that comes
  back from ``down`` gets a ``member.up`` journal event;
* ``suspect``   -- nothing yet (the member may refute);
* ``down``/``left`` -- stop replicating with it (``node.remove_peer``) and
  append ``member.down`` / ``member.left`` ``{"address", "incarnation",
  "observed_ms"}`` so views (claims, leases, health) can release its work
  deterministically from the journal. Dialling continues with backoff, which
  is how a restarted node is found again. On ``down``, a channel to it that
  carried nothing for a whole suspicion period is half-open and is dropped
  (:meth:`~hivemesh.runtime.connections.ConnectionManager.drop_if_silent`).
  (A node that restarts and dials us first does not wait for this: its new
  boot id replaces the half-open link at once, see
  :mod:`hivemesh.runtime.connections`.)

A new channel to an address membership does not know yet starts
``Membership.join`` through it (full-state exchange), so a bootstrap by
``host:port`` alone is enough to join.
"""

from __future__ import annotations

import logging
import random
from typing import TYPE_CHECKING, Any

from hivemesh.core.membership import Membership
from hivemesh.core.pex import MembershipConfig, MemberState

if TYPE_CHECKING:
    from hivemesh.runtime.daemon import Daemon

__all__ = ["MemberDriver", "membership_config"]

log = logging.getLogger("hivemesh.runtime.members")


def membership_config(
    probe_interval_ms: int, probe_timeout_ms: int, suspicion_mult: int
) -> MembershipConfig:
    """Scale memberlist's LAN shape to the configured probe interval."""
    return MembershipConfig(
        probe_interval_ms=probe_interval_ms,
        probe_timeout_ms=probe_timeout_ms,
        suspicion_mult=suspicion_mult,
        gossip_interval_ms=max(1, probe_interval_ms // 5),
        push_pull_interval_ms=probe_interval_ms * 30,
        join_timeout_ms=probe_interval_ms * 30,
    )


class MemberDriver:
    """Drives one daemon's membership (see module docs)."""

    def __init__(
        self, daemon: Daemon, endpoints: list[str], rng: random.Random, now_ms: int
    ) -> None:
        cfg = daemon.config
        self.daemon = daemon
        self.config = membership_config(
            cfg.probe_interval_ms, cfg.probe_timeout_ms, cfg.suspicion_mult
        )
        self.m = Membership(
            daemon.address,
            endpoints,
            rng,
            self.config,
            now_ms,
            daemon.node.send,
            admit=daemon.authorize,
        )
        self.m.attach(daemon.node)

    def state(self, address: str) -> MemberState | None:
        """The state of ``address`` (None if unknown)."""
        rec = self.m.member(address)
        return None if rec is None else rec.state

    def channel_up(self, peer: str, endpoints: list[str], now_ms: int) -> None:
        """A channel to ``peer`` opened: replicate, and join through it if new."""
        d = self.daemon
        if self.m.member(peer) is None:
            self.m.join(peer, endpoints, now_ms)
        if self.state(peer) not in (MemberState.DOWN, MemberState.LEFT):
            d.node.add_peer(peer)
            d.node.sync_with(peer)

    def after_input(self, now_ms: int) -> None:
        """Act on membership changes (see module docs)."""
        d = self.daemon
        for ch in self.m.changes():
            log.info(
                "member %s %s -> %s (incarnation %d)",
                ch.address[:12],
                ch.previous.value if ch.previous else "new",
                ch.state.value,
                ch.incarnation,
            )
            if ch.state is MemberState.UP:
                d.learn(ch.address, list(ch.endpoints))
                if ch.address in d.conns.links:
                    d.node.add_peer(ch.address)
                if ch.previous is MemberState.DOWN:
                    d.record("member.up", ch.address, ch.incarnation, now_ms)
            elif ch.state in (MemberState.DOWN, MemberState.LEFT):
                d.node.remove_peer(ch.address)
                if ch.state is MemberState.DOWN:
                    cfg = self.config
                    d.conns.drop_if_silent(
                        ch.address, cfg.suspicion_mult * cfg.probe_interval_ms / 1000
                    )
                d.record(f"member.{ch.state.value}", ch.address, ch.incarnation, now_ms)
            d.counters[f"member_{ch.state.value}"] += 1

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """``address -> {state, incarnation, since_ms, endpoints}``."""
        return {
            m.address: {
                "state": m.state.value,
                "incarnation": m.incarnation,
                "since_ms": m.since_ms,
                "endpoints": list(m.endpoints),
            }
            for m in self.m.members()
        }

    def detection_bound_ms(self) -> int:
        """Worst case from a crash until every live member marks it down."""
        live = sum(1 for m in self.m.members() if m.state in (MemberState.UP, MemberState.SUSPECT))
        return self.config.detection_bound_ms(live + 1)
