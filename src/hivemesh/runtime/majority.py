"""Majority barriers on the journal (the ``sync.majority`` command).

Theory of operation
-------------------
Every daemon serves the direct request ``journal.heads``: its journal's
version vector ``{author hex: last seq}``. A request may name one feed and
seq (``{"a": author_hex, "s": seq, "w": wait_ms}``): the answer is then
held back until this node holds that feed up to ``s``, or ``w`` ms passed,
so "do you have my write yet?" costs one round trip, not a polling loop.

:func:`sync_majority` runs the two barriers (their rules:
:class:`hivemesh.core.barrier.Barrier`) of
:class:`hivemesh.commands.SyncMajority` against the swarm's lease voters
(:meth:`hivemesh.core.lease_swarm.SwarmLeases.voters`: every proposer uses the
same set, so any two majorities of it intersect):

* *own_seq*: a majority (this node counts when it is a voter) holds our
  feed up to ``own_seq``;
* *pull*: a majority answered with its version vector, and this node then
  holds every feed at least as far as the largest answer (missing events
  arrive by push or anti-entropy; we wait for them), except feeds of
  authors this node does not trust (it would never accept them).

A write confirmed by the first barrier is therefore in the views of any
node after the second. Every request and the whole barrier have deadlines;
no majority in time raises :class:`~hivemesh.errors.BackendUnavailable`,
missing events that do not arrive in time :class:`~hivemesh.errors.DeadlineExceeded`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hivemesh.commands.coordination import LeaseVoters
from hivemesh.commands.sync import SyncMajority, SyncMajorityReply
from hivemesh.core.barrier import Barrier, author_hex, clean_vv
from hivemesh.errors import BackendUnavailable, DeadlineExceeded, HivemeshError, InvalidArgument

if TYPE_CHECKING:
    from hivemesh.runtime.daemon import Daemon

__all__ = ["HEADS_KIND", "serve_heads", "sync_majority"]

#: The direct-request kind every daemon answers with its version vector.
HEADS_KIND = "journal.heads"
_POLL_S = 0.01
_MAX_WAIT_MS = 2000


def _held(d: Daemon) -> Callable[[str], int]:
    journal = d.node.journal
    return lambda author_hex: journal.head(bytes.fromhex(author_hex)).seq


def serve_heads(d: Daemon) -> None:
    """Answer ``journal.heads`` requests on ``d`` (see module docs)."""

    async def on_heads(sender: str, body: Any) -> dict[str, Any]:
        if isinstance(body, dict) and author_hex(body.get("a")):
            seq, wait = body.get("s"), body.get("w")
            if isinstance(seq, int) and isinstance(wait, int):
                loop, held = asyncio.get_running_loop(), _held(d)
                until = loop.time() + min(max(wait, 0), _MAX_WAIT_MS) / 1000
                while held(body["a"]) < seq and loop.time() < until:
                    await asyncio.sleep(_POLL_S)
        return {"vv": {a.hex(): s for a, s in d.node.journal.version_vector().items()}}

    d.messaging.on_message(HEADS_KIND, on_heads)


async def _ask(d: Daemon, voter: str, b: Barrier, until: float) -> dict[str, int] | None:
    """The voter's version vector once it satisfies the own_seq barrier, or None."""
    loop = asyncio.get_running_loop()
    while (left := until - loop.time()) > 0.05:
        body: dict[str, Any] = {}
        if b.own_seq is not None:
            body = {"a": b.me_hex, "s": b.own_seq, "w": int(min(left - 0.05, 1.0) * 1000)}
        try:
            answer = await d.request(voter, HEADS_KIND, body, timeout_s=left)
        except HivemeshError:
            await asyncio.sleep(min(0.05, max(0.0, until - loop.time())))
            continue
        vv = clean_vv(answer)
        if vv is None or b.holds_own(vv):
            return vv  # None: an old node without the handler, it cannot answer
    return None


async def sync_majority(d: Daemon, req: SyncMajority) -> SyncMajorityReply:
    """Run the barriers of ``req`` on ``d`` (see module docs; the rules are
    :class:`hivemesh.core.barrier.Barrier`'s)."""
    loop = asyncio.get_running_loop()
    until = loop.time() + req.timeout_s
    own = d.node.journal.head(d.identity.public).seq
    if req.own_seq is not None and req.own_seq > own:
        raise InvalidArgument(f"sync.majority: own_seq {req.own_seq} is past our feed ({own})")
    voters = (await d.call(LeaseVoters()))["voters"]  # the Peer fixes the set
    b = Barrier(voters, d.address, d.identity.public.hex(), req.own_seq)
    tasks = {asyncio.ensure_future(_ask(d, v, b, until)): v for v in b.others}
    try:
        pending = set(tasks)
        while not b.reached and pending:
            done, pending = await asyncio.wait(
                pending, timeout=max(0.0, until - loop.time()), return_when=asyncio.FIRST_COMPLETED
            )
            if not done:
                break
            for t in done:
                if (vv := t.result()) is not None:
                    b.answer(tasks[t], vv)
    finally:
        for t in tasks:
            t.cancel()
    if not b.reached:
        raise BackendUnavailable(
            f"sync.majority: {len(b.answered)} of {len(b.voters)} voters answered "
            f"in {req.timeout_s}s (majority {b.majority})"
        )
    if req.pull:
        held, trusted = _held(d), d.node.journal.trusted
        while missing := b.missing(held, trusted):
            if loop.time() >= until:
                raise DeadlineExceeded(
                    f"sync.majority: {len(missing)} feeds still behind the majority"
                )
            await asyncio.sleep(_POLL_S)
    return SyncMajorityReply(voters=len(b.voters), majority=b.majority, answered=sorted(b.answered))
