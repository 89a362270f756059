"""The daemon's handlers of the lease and claim commands (``lease.*``, ``claim.*``).

The requests arrive typed and checked (:mod:`hivemesh.commands.coordination`);
resource, holder and TTL are checked here by the lease layer's own rules.
The work is done by :mod:`hivemesh.runtime.leases` (quorum) and
:mod:`hivemesh.runtime.claims` (journal claims). :mod:`hivemesh.runtime.handlers`
lists these handlers in the daemon's table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hivemesh import commands as c
from hivemesh.commands import Record
from hivemesh.leases import validate_holder, validate_resource, validate_ttl_ms

if TYPE_CHECKING:
    from hivemesh.runtime.daemon import Daemon

__all__ = [
    "acquire",
    "claim",
    "claim_done",
    "claim_release",
    "claim_show",
    "claim_wait",
    "release",
    "renew",
    "show",
    "voters",
]


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


async def claim(d: Daemon, req: c.Claim) -> c.ClaimReply:
    """``claim``: register this node's claim (the Peer's command)."""
    reply: c.ClaimReply = await d.call(req)
    return reply


async def claim_wait(d: Daemon, req: c.ClaimWait) -> c.ClaimWaitReply:
    """``claim.wait``: the winner once decided (the Peer's command)."""
    reply: c.ClaimWaitReply = await d.call(req)
    return reply


async def claim_release(d: Daemon, req: c.ClaimRelease) -> c.ClaimReleaseReply:
    """``claim.release``: release this node's live claims (the Peer's command)."""
    reply: c.ClaimReleaseReply = await d.call(req)
    return reply


async def claim_done(d: Daemon, req: c.ClaimDone) -> c.ClaimDoneReply:
    """``claim.done``: report the work finished (the Peer's command)."""
    reply: c.ClaimDoneReply = await d.call(req)
    return reply


async def claim_show(d: Daemon, req: c.ClaimShow) -> Record:
    """``claim.show``: one resource's claim state, or all of them."""
    snap = d.claims.snapshot()
    if req.resource is not None:
        r = req.resource
        return Record({"resource": r, **snap["resources"].get(r, {"winner": None, "live": 0})})
    return Record(snap)
