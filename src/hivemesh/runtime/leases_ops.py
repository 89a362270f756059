"""The daemon's handlers of the lease commands (``lease.*``).

The requests arrive typed and checked (:mod:`hivemesh.commands.coordination`);
resource, holder and TTL are checked here by the lease layer's own rules.
The work is done by the node's lease backend: the quorum of
:mod:`hivemesh.runtime.leases`, or in broker mode the broker's KV.
:mod:`hivemesh.runtime.handlers` lists these handlers in the daemon's table;
the claim commands (``claim.*``) are the Peer's own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hivemesh import commands as c
from hivemesh.commands import Record
from hivemesh.leases import validate_holder, validate_resource, validate_ttl_ms

if TYPE_CHECKING:
    from hivemesh.runtime.daemon import Daemon

__all__ = ["acquire", "release", "renew", "show", "voters"]


def _backend(d: Daemon) -> Any:
    return d.leases.backend  # the quorum, or in broker mode the broker's KV


async def acquire(d: Daemon, req: c.LeaseAcquire) -> c.LeaseAcquireReply:
    """``lease.acquire``: one majority round for a new fencing token."""
    r, h = validate_resource(req.resource), validate_holder(req.holder)
    ttl = validate_ttl_ms(req.ttl_ms)
    token = await _backend(d).acquire(r, h, ttl, timeout_s=req.timeout_s)
    return c.LeaseAcquireReply(token=token)


async def renew(d: Daemon, req: c.LeaseRenew) -> c.LeaseOkReply:
    """``lease.renew``: a majority renew of the holder's token."""
    r, h = validate_resource(req.resource), validate_holder(req.holder)
    ttl = validate_ttl_ms(req.ttl_ms)
    ok = await _backend(d).renew(r, h, req.token, ttl, timeout_s=req.timeout_s)
    return c.LeaseOkReply(ok=bool(ok))


async def release(d: Daemon, req: c.LeaseRelease) -> c.LeaseOkReply:
    """``lease.release``: a majority release of the holder's token."""
    r, h = validate_resource(req.resource), validate_holder(req.holder)
    ok = await _backend(d).release(r, h, req.token, timeout_s=req.timeout_s)
    return c.LeaseOkReply(ok=bool(ok))


async def show(d: Daemon, req: c.LeaseShow) -> c.LeaseShowReply:
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


async def voters(d: Daemon, req: c.LeaseVoters) -> Record:
    """``lease.voters``: the voters, the majority and the proposer's figures."""
    return Record(await d.call(req))  # the Peer fixes the set if it is not yet
