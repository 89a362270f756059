"""Simulation options: one record for the network, one for the workload."""

from __future__ import annotations

from dataclasses import dataclass, field

from hivemesh.core.membership import MembershipConfig

__all__ = ["FaultOptions", "NetworkOptions", "SimOptions"]


@dataclass(frozen=True, slots=True)
class NetworkOptions:
    """The packet simulator (TigerBeetle style). Probabilities are per frame."""

    one_way_delay_mean_ms: int = 15
    one_way_delay_jitter_ms: int = 40
    packet_loss_probability: float = 0.05
    packet_replay_probability: float = 0.03
    bandwidth_bytes_per_ms: int = 0  # 0 = unlimited


@dataclass(frozen=True, slots=True)
class FaultOptions:
    """Faults injected during the active phase."""

    partition_probability: float = 0.3
    crash_probability: float = 0.3
    clock_skew_max_ms: int = 2_000
    forgeries: int = 4
    #: A crash after which the node restarts on an older backup of its store
    #: (or none: the store deleted); its mark, beside the key, survives.
    restore_probability: float = 0.0
    #: A node cut off by a partition crashes and its store loses its last own
    #: batches (a damaged append log); it restarts still cut off.
    log_damage_probability: float = 0.0
    #: Each node's store is backed up about this often (restore scenario).
    backup_interval_ms: int = 4_000
    #: How long into the heal phase an operator accepts a loss that no live
    #: replica can repair (``hivemesh feed accept-loss``).
    operator_delay_ms: int = 5_000
    #: A crash loses the store's write cache (replicated batches not yet
    #: synced by the group commit): see :mod:`hivemesh.sim.disk`.
    lost_fsync_probability: float = 0.0
    #: Of those, the share where the newest cached batch is torn part way.
    torn_write_probability: float = 0.5
    #: A node's clock steps forward or back (NTP step, VM restore).
    clock_jump_probability: float = 0.0
    #: The largest step; a node's total offset stays within twice the skew bound.
    clock_jump_max_ms: int = 3_000
    #: A node's process stops for a while (GC, VM freeze, SIGSTOP): input
    #: waits, timers wait, its clock runs on.
    pause_probability: float = 0.0


@dataclass(frozen=True, slots=True)
class SimOptions:
    """One run: ``nodes`` replicas, ``appends`` events, faults, then heal.

    With ``claim_tasks`` > 0 the nodes also compete for that many tasks with
    optimistic claims (:mod:`hivemesh.core.claims`); a crash is found by
    the Peers' own SWIM (timing: ``swim``), which appends ``member.down``.
    """

    nodes: int = 5
    appends: int = 60
    active_ms: int = 20_000
    heal_ms: int = 30_000
    claim_tasks: int = 0
    claim_settle_ms: int = 1_500
    sync_interval_ms: int = 500
    want_timeout_ms: int = 1_500
    #: The group commit: replicated batches are synced this long after they
    #: arrive (the daemon's ``commit_delay_ms``).
    commit_delay_ms: int = 100
    #: The Peers' SWIM timing (None: memberlist's LAN defaults).
    swim: MembershipConfig | None = None
    network: NetworkOptions = field(default_factory=NetworkOptions)
    faults: FaultOptions = field(default_factory=FaultOptions)
