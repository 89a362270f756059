"""Commands the Peer answers from its own views, at once (sans-IO).

Theory of operation
-------------------
Part of the :class:`~hivemesh.core.peer.Peer`'s one command table: the
commands whose reply is decided by the Peer's state alone -- shared-context
reads and writes, the names, the own feed's state, the claims -- so every
driver (the daemon, the simulator, ``hivemesh.Node``) gets the same answer
from the same inputs, and no driver assembles one itself. Each handler takes
``(peer, command, now_ms)`` and returns the reply, which the Peer queues as
its :class:`~hivemesh.core.effects.Reply` (an error raised as a
:class:`~hivemesh.errors.HivemeshError` becomes the Reply's error).

Context writes go to the Peer's :class:`~hivemesh.core.views.context.ContextView`
and are appended to the own feed in one batch (:func:`commit_context`). A
driver that writes into the view itself (``hivemesh.Node``'s context
handles) exports the writes (:func:`export_pending`) and hands them over in
:class:`~hivemesh.commands.peer.CommitContext`, so a recorded trace carries
them. A write the feed did not take (a full disk, a feed still recovering) stays
pending in the view and goes out with the next commit that succeeds.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from hivemesh.commands import context as ctx
from hivemesh.commands._base import Record
from hivemesh.commands.coordination import ClaimShow
from hivemesh.commands.names import Names
from hivemesh.commands.node import FeedStatus
from hivemesh.commands.peer import CommitContext
from hivemesh.core.identity import address_of

if TYPE_CHECKING:
    from hivemesh.core.journal import Journal
    from hivemesh.core.peer import Peer
    from hivemesh.core.views.context import ContextView

__all__ = [
    "ANSWERS",
    "claims_snapshot",
    "commit_context",
    "commit_items",
    "dropped_total",
    "export_pending",
    "journal_heads",
    "peer_counters",
    "peer_status",
]


def export_pending(view: ContextView) -> tuple[tuple[str, Any], ...]:
    """The context's pending local writes, as ``(kind, body)`` items to append."""
    items = []
    while (upd := view.pending_update()) is not None:
        items.append(upd)
    return tuple(items)


def commit_items(peer: Peer, items: tuple[tuple[str, Any], ...], now_ms: int) -> int:
    """Append exported context writes to the own feed in one batch; returns
    how many. On failure the writes the feed did not take go back to
    pending (module docs) and the error propagates."""
    if items:
        journal, me = peer.node.journal, peer.identity.public
        before = journal.head(me).seq
        try:
            peer.node.append_many(list(items), now_ms)
        except BaseException:
            peer.context.unexport(list(items[journal.head(me).seq - before :]))
            raise
    return len(items)


def commit_context(peer: Peer, now_ms: int) -> int:
    """Append the context's pending local writes to the own feed (module docs)."""
    return commit_items(peer, export_pending(peer.context), now_ms)


def claims_snapshot(peer: Peer) -> dict[str, Any]:
    """Per resource: winner and done_by (addresses), live claim count;
    duplicate executions (resource -> extra runs); and backdated claims
    that did not win (:meth:`~hivemesh.core.claims.ClaimsView.takeovers`)."""
    view = peer.claims
    res: dict[str, dict[str, Any]] = {}
    for r, row in view.snapshot().items():
        w, done = row["winner"], row["done_by"]
        res[r] = {
            "winner": None if w is None else address_of(bytes.fromhex(str(w))),
            "done_by": [address_of(bytes.fromhex(a)) for a in done],  # type: ignore[attr-defined]
            "live": row["live"],
        }
    takeovers = [
        {"resource": r, "claimant": address_of(c.author), "owner": address_of(w.author)}
        for r, c, w in view.takeovers()
    ]
    return {"resources": res, "duplicates": view.duplicates(), "takeovers": takeovers}


def peer_counters(peer: Peer) -> Counter[str]:
    """Every counter of the Peer's parts, in one flat map: replication,
    deferrals, membership (``membership_*``), direct messages (``direct_*``),
    refused takeovers and each view's rejections (``view_rejected_<code>``)."""
    node = peer.node
    counters: Counter[str] = Counter()
    counters.update(node.counters)
    counters.update(node.deferrals.counters)
    counters["name_takeovers_refused"] = len(peer.names.takeovers())
    counters["claim_takeovers_refused"] = len(peer.claims.takeovers())
    counters.update({f"membership_{k}": v for k, v in peer.membership.counters.items()})
    counters.update({f"direct_{k}": v for k, v in peer.direct.counters.items()})
    counters.update({f"direct_{k}": v for k, v in peer.mailbox.counters.items()})
    views = (peer.context, peer.names, peer.endpoints, peer.blob_index, peer.trust_view)
    for view in (*views, peer.registers):
        for code, n in view.rejected.items():
            counters[f"view_rejected_{code}"] += n
    return counters


def journal_heads(journal: Journal) -> dict[str, dict[str, Any]]:
    """Every feed's head: ``{address: {"seq", "hash"}}``, the hash of the
    feed's last event (hex) -- equal on two nodes exactly when they hold the
    same history of that feed."""
    heads = journal.heads
    return {address_of(a): {"seq": h.seq, "hash": h.hash.hex()} for a, h in sorted(heads.items())}


def dropped_total(counters: Mapping[str, int], transport: Mapping[str, int]) -> int:
    """Lost work, summed: every counter of dropped (``dropped_*``, a
    subscriber's ``subscriber_dropped``) or undelivered work, and the
    transport's ``frames_dropped``."""
    lost = sum(v for k, v in counters.items() if "dropped" in k or "undelivered" in k)
    return lost + transport.get("frames_dropped", 0)


def peer_status(peer: Peer) -> dict[str, Any]:
    """What the Peer decides of ``status``: its journal, own feed, clock
    deferrals, names, members and failure-detection bound, registers and
    blobs (the driver adds its channels, store, tasks and counters)."""
    node, j = peer.node, peer.node.journal
    return {
        "address": peer.address,
        "names": peer.names.names_of(peer.address),
        "journal": {
            "events": j.total_events,
            "feeds": len(j.heads),
            "own_seq": j.head(peer.identity.public).seq,
            "version_vector": {address_of(a): s for a, s in sorted(j.version_vector().items())},
            "heads": journal_heads(j),
        },
        # whether the node writes its own feed, and why not (hivemesh.core.ownfeed)
        "own_feed": {**node.feed_gate.status(), "deferred": node.deferred},
        # batches stamped beyond our clock bound, by author: held until plausible
        "clock_ahead": node.deferrals.snapshot(),
        # backdated name claims that did not take the name (core.views.names)
        "name_takeovers": peer.names.takeovers(),
        "members": peer.members_snapshot(),
        "detection_bound_ms": peer.detection_bound_ms(),
        # max-registers (``reg.max`` events: fencing tokens), key -> value
        "registers": peer.registers.snapshot(),
        "blobs": {
            "known": len(peer.blob_index.snapshot()["blobs"]),
            "fetching": len(peer.fetcher.active()),
        },
    }


def _commit(p: Peer, cmd: CommitContext, now_ms: int) -> Any:
    return commit_items(p, cmd.items, now_ms)


def _ctx_get(p: Peer, cmd: ctx.CtxGet, now_ms: int) -> Any:
    if cmd.key is None:
        return Record(p.context.snapshot().get(cmd.context, {}))
    c = p.context.context(cmd.context)
    return Record({"key": cmd.key, "found": cmd.key in c, "value": c.get(cmd.key)})


def _ctx_contexts(p: Peer, cmd: ctx.CtxContexts, now_ms: int) -> Any:
    snap = p.context.snapshot()  # {context: {kind: {name: value}}}
    keys = {name: sum(len(v) for v in snap[name].values()) for name in sorted(snap)}
    return Record({"contexts": keys})


def _ctx_set(p: Peer, cmd: ctx.CtxSet, now_ms: int) -> Any:
    p.context.context(cmd.context)[cmd.key] = cmd.value
    n = commit_context(p, now_ms)
    seq = p.node.journal.head(p.identity.public).seq
    return ctx.CtxSetReply(context=cmd.context, key=cmd.key, events=n, seq=seq)


def _ctx_append(p: Peer, cmd: ctx.CtxAppend, now_ms: int) -> Any:
    handle = p.context.context(cmd.context).list(cmd.list)
    for value in cmd.values:
        handle.append(value)
    return ctx.CtxAppendReply(length=len(handle), events=commit_context(p, now_ms))


def _ctx_incr(p: Peer, cmd: ctx.CtxIncr, now_ms: int) -> Any:
    handle = p.context.context(cmd.context).counter(cmd.counter)
    handle.add(int(cmd.by) if cmd.by.is_integer() else cmd.by)
    value = float(handle.value)
    return ctx.CtxIncrReply(value=value, events=commit_context(p, now_ms))


def _set(p: Peer, context: str, name: str, grow_only: bool) -> Any:
    c = p.context.context(context)
    return c.gset(name) if grow_only else c.orset(name)


def _ctx_add(p: Peer, cmd: ctx.CtxAdd, now_ms: int) -> Any:
    handle = _set(p, cmd.context, cmd.set, cmd.grow_only)
    for element in cmd.elements:
        handle.add(element)
    members = handle.members()
    return ctx.SetChangeReply(members=members, events=commit_context(p, now_ms))


def _ctx_remove(p: Peer, cmd: ctx.CtxRemove, now_ms: int) -> Any:
    handle = _set(p, cmd.context, cmd.set, False)
    for element in cmd.elements:
        handle.discard(element)
    members = handle.members()
    return ctx.SetChangeReply(members=members, events=commit_context(p, now_ms))


def _ctx_members(p: Peer, cmd: ctx.CtxMembers, now_ms: int) -> Any:
    return ctx.MembersReply(_set(p, cmd.context, cmd.set, cmd.grow_only).members())


def _names(p: Peer, cmd: Names, now_ms: int) -> Any:
    return Record(p.names.snapshot())


def _feed_status(p: Peer, cmd: FeedStatus, now_ms: int) -> Any:
    return Record({**p.node.feed_gate.status(), "deferred": p.node.deferred})


def _claim_show(p: Peer, cmd: ClaimShow, now_ms: int) -> Any:
    snap = claims_snapshot(p)
    if cmd.resource is None:
        return Record(snap)
    row = snap["resources"].get(cmd.resource, {"winner": None, "live": 0})
    return Record({"resource": cmd.resource, **row})


#: command type -> its answer (part of the Peer's one command table)
ANSWERS: dict[type, Callable[[Peer, Any, int], Any]] = {
    ClaimShow: _claim_show,
    CommitContext: _commit,
    ctx.CtxAdd: _ctx_add,
    ctx.CtxAppend: _ctx_append,
    ctx.CtxContexts: _ctx_contexts,
    ctx.CtxGet: _ctx_get,
    ctx.CtxIncr: _ctx_incr,
    ctx.CtxMembers: _ctx_members,
    ctx.CtxRemove: _ctx_remove,
    ctx.CtxSet: _ctx_set,
    FeedStatus: _feed_status,
    Names: _names,
}
