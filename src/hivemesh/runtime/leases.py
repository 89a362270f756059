"""The daemon's side of the swarm's lease quorum: the voter log's I/O, a client.

Theory of operation
-------------------
Every daemon votes and any daemon proposes; the protocol and every decision
around it (who votes, when a reply may leave, the voter set, thrifty rounds,
fast acquire) are the Peer's (:mod:`hivemesh.core.lease_swarm`). This module
only carries out its lease effects and offers the quorum as a lease backend:

* :class:`VoterDisk` -- the voter's durable state in
  ``<data_dir>/lease_voter.log`` (:mod:`hivemesh.stores.voterlog`):
  :class:`~hivemesh.core.effects.LeaseLog` writes a record at once;
  :class:`~hivemesh.core.effects.LeaseSync` syncs once per event-loop turn
  (one ``fdatasync`` for every vote of that turn: the group commit) and then
  reports ``Peer.lease_synced``, which lets the held replies leave. A failed
  write or sync is reported too: the voter stops for good. The voter set the
  Peer fixed (:class:`~hivemesh.core.effects.SaveVoters`) is saved to
  ``<data_dir>/lease_voters.json`` and read again at the next start.
* :class:`DaemonLeaseBackend` -- a :class:`~hivemesh.leases.LeaseBackend`
  over the daemon's own quorum (in process), behind ``hivemesh.Node.leases``
  and the ``lease.*`` commands: each operation is one Peer command.
* The handlers of the ``lease.*`` commands (``on_acquire`` ...; listed in
  :mod:`hivemesh.runtime.handlers`): the requests arrive typed, resource,
  holder and TTL are checked by the lease layer's rules, and the node's lease
  backend does the work (the quorum, or in broker mode the broker's KV).

Claims (:class:`MeshClaims`, re-exported here) live in :mod:`hivemesh.runtime.claims`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hivemesh import commands as c
from hivemesh.core.lease_quorum import Outcome
from hivemesh.core.lease_swarm import KIND_VOTERS, TOKEN_RESERVE, LeaseSetup, VotersView
from hivemesh.errors import BackendUnavailable, ConfigError
from hivemesh.leases import (
    LeaseClient,
    LeaseInfo,
    validate_holder,
    validate_resource,
    validate_ttl_ms,
)
from hivemesh.leases.errors import LeaseContended
from hivemesh.runtime.claims import MeshClaims
from hivemesh.stores.private import write_private
from hivemesh.stores.voterlog import VoterLog

if TYPE_CHECKING:
    from hivemesh.runtime.daemon import Daemon

__all__ = [
    "KIND_VOTERS",
    "TOKEN_RESERVE",
    "DaemonLeaseBackend",
    "MeshClaims",
    "VoterDisk",
    "VotersView",
    "on_acquire",
    "on_release",
    "on_renew",
    "on_show",
    "outcome_of",
]

log = logging.getLogger("hivemesh.runtime.leases")

_VOTER_STATE = "lease_voter.log"
_VOTERS_FILE = "lease_voters.json"


class VoterDisk:
    """The lease voter's files in ``data_dir`` (module docs).

    ``synced(upto, error)`` is called after each sync (the daemon passes the
    Peer's ``lease_synced``, then flushes).
    """

    def __init__(self, data_dir: Path, *, synced: Callable[[int, str | None], None]) -> None:
        self.log = VoterLog(data_dir / _VOTER_STATE)
        self._voters_path = data_dir / _VOTERS_FILE
        self._upto = 0
        self._scheduled = False
        self._error: str | None = None
        self._closed = False
        self.synced = synced

    def open(self) -> LeaseSetup:
        """Read the voter's state and the saved voter set (what the Peer starts from)."""
        state = self.log.open()
        saved = None
        path = self._voters_path
        if path.exists():
            try:
                saved = tuple(sorted(json.loads(path.read_text())["voters"]))
            except (ValueError, KeyError, TypeError) as e:
                raise ConfigError(f"bad {path}: {e!r}") from e
        return LeaseSetup(voter_state=state, saved_voters=saved)

    def write(self, resource: str, bound: int, max_ttl_ms: int) -> None:
        """Write one change (synced by the next :meth:`sync_soon`)."""
        if self._error is not None or self._closed:
            return
        try:
            self.log.write(resource, bound, max_ttl_ms)
        except OSError as e:
            self._error = f"{type(e).__name__}: {e}"
            log.error("lease voter log %s failed, voter stopped: %s", self.log.path, e)

    def sync_soon(self, upto: int) -> None:
        """Sync once at the end of this event-loop turn, then report ``upto``."""
        self._upto = max(self._upto, upto)
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._sync)

    def _sync(self) -> None:
        self._scheduled = False
        if self._closed:
            return  # replies still waiting are dropped (never sent unsynced)
        if self._error is None:
            try:
                self.log.sync()
            except OSError as e:
                self._error = f"{type(e).__name__}: {e}"
                log.error("lease voter log %s failed, voter stopped: %s", self.log.path, e)
        self.synced(self._upto, self._error)

    def save_voters(self, voters: tuple[str, ...]) -> None:
        """Keep the voter set the node fixed for its next lives."""
        write_private(self._voters_path, json.dumps({"voters": list(voters)}).encode())

    def close(self) -> None:
        """Close the log; a sync still scheduled reports nothing."""
        self._closed = True
        self.log.close()


def outcome_of(value: Any) -> Outcome:
    """The Peer's reply to a lease command; BackendUnavailable if no
    majority answered in time."""
    if not isinstance(value, Outcome):  # pragma: no cover - a bug in the Peer
        raise BackendUnavailable(f"lease: unexpected reply {value!r:.80}")
    if value.status == "unknown":
        what = type(value.op).__name__.lower()
        raise BackendUnavailable(f"lease {what}: no majority answered in time")
    return value


class DaemonLeaseBackend:
    """A :class:`~hivemesh.leases.LeaseBackend` over the daemon's own quorum (in process)."""

    def __init__(self, daemon: Daemon) -> None:
        self._d = daemon

    @property
    def url(self) -> str:
        """``mesh://`` and this node's data dir."""
        return f"mesh://{self._d.config.data_dir}"

    async def _run(self, cmd: Any) -> Outcome:
        if not self._d.running:
            raise BackendUnavailable(f"{cmd.op}: the node is not running")
        return outcome_of(await self._d.call(cmd))

    async def acquire(
        self, resource: str, holder: str, ttl_ms: int, *, timeout_s: float
    ) -> int | None:
        """Two-phase majority acquire; the token or None if held."""
        ev = await self._run(c.LeaseAcquire(resource, holder, ttl_ms, timeout_s))
        if ev.status == "fail" and ev.partial:
            raise LeaseContended(f"{resource!r}: lost a race after reaching some voters")
        return ev.token if ev.status == "ok" else None

    async def renew(
        self, resource: str, holder: str, token: int, ttl_ms: int, *, timeout_s: float
    ) -> bool:
        """Majority renew."""
        ev = await self._run(c.LeaseRenew(resource, holder, token, ttl_ms, timeout_s))
        return ev.status == "ok"

    async def release(self, resource: str, holder: str, token: int, *, timeout_s: float) -> bool:
        """Majority release (a partial one counts: some voters did let go)."""
        ev = await self._run(c.LeaseRelease(resource, holder, token, timeout_s))
        return ev.status == "ok" or ev.partial

    async def show(self, resource: str, *, timeout_s: float) -> LeaseInfo | None:
        """Majority read of the current holder."""
        ev = await self._run(c.LeaseShow(resource, timeout_s))
        if not ev.holder or ev.token is None:
            return None
        return LeaseInfo(resource, ev.holder, ev.token, max(0, ev.remaining_ms))

    async def aclose(self) -> None:
        """Nothing to close (the daemon owns the quorum)."""


def lease_client(daemon: Daemon) -> LeaseClient:
    """A LeaseClient over the daemon's quorum, holder id = its address."""
    return LeaseClient(DaemonLeaseBackend(daemon), daemon.address)


def _backend(d: Daemon) -> Any:
    return d.leases.backend  # the quorum, or in broker mode the broker's KV


async def on_acquire(d: Daemon, req: c.LeaseAcquire) -> c.LeaseAcquireReply:
    """``lease.acquire``: one majority round for a new fencing token."""
    r, h = validate_resource(req.resource), validate_holder(req.holder)
    ttl = validate_ttl_ms(req.ttl_ms)
    token = await _backend(d).acquire(r, h, ttl, timeout_s=req.timeout_s)
    return c.LeaseAcquireReply(token=token)


async def on_renew(d: Daemon, req: c.LeaseRenew) -> c.LeaseOkReply:
    """``lease.renew``: a majority renew of the holder's token."""
    r, h = validate_resource(req.resource), validate_holder(req.holder)
    ttl = validate_ttl_ms(req.ttl_ms)
    ok = await _backend(d).renew(r, h, req.token, ttl, timeout_s=req.timeout_s)
    return c.LeaseOkReply(ok=bool(ok))


async def on_release(d: Daemon, req: c.LeaseRelease) -> c.LeaseOkReply:
    """``lease.release``: a majority release of the holder's token."""
    r, h = validate_resource(req.resource), validate_holder(req.holder)
    ok = await _backend(d).release(r, h, req.token, timeout_s=req.timeout_s)
    return c.LeaseOkReply(ok=bool(ok))


async def on_show(d: Daemon, req: c.LeaseShow) -> c.LeaseShowReply:
    """``lease.show``: a majority read of the current holder."""
    info = await _backend(d).show(validate_resource(req.resource), timeout_s=req.timeout_s)
    if info is None:
        return c.LeaseShowReply(held=False)
    return c.LeaseShowReply(
        held=True,
        holder=info.holder,
        fencing_token=info.fencing_token,
        remaining_ms=info.remaining_ms,
    )
