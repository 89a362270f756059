"""Commands the Peer answers from its own views (hivemesh.core.answers): one
Peer, no sockets, no daemon; every reply is typed and decided by the Peer."""

from __future__ import annotations

import random
from typing import Any

from hivemesh.commands import Record
from hivemesh.commands import context as ctx
from hivemesh.commands.coordination import Claim, ClaimShow
from hivemesh.commands.names import NameClaim, Names
from hivemesh.commands.node import FeedStatus
from hivemesh.commands.peer import CommitContext
from hivemesh.core.answers import export_pending, peer_counters, peer_status
from hivemesh.core.effects import Reply, Send
from hivemesh.core.identity import Identity
from hivemesh.core.ownfeed import Mark, MemoryMarkStore
from hivemesh.core.peer import Peer, PeerConfig
from hivemesh.core.store import MemoryStore

ME = Identity.from_seed(b"\x07" * 32)
NOW = 1_000_000


def _peer() -> Peer:
    peer = Peer(
        ME,
        MemoryStore(),
        random.Random(0),
        now_ms=NOW,
        config=PeerConfig(),
        marks=MemoryMarkStore(Mark()),
    )
    peer.rehydrate([], NOW)
    peer.start(["10.0.0.1:7000"], NOW)
    peer.effects()
    return peer


def _ask(peer: Peer, cmd: Any) -> Any:
    rid = peer.command(cmd, NOW)
    replies = [e for e in peer.effects() if isinstance(e, Reply) and e.rid == rid]
    assert len(replies) == 1
    if replies[0].error is not None:
        raise replies[0].error
    return replies[0].value


def test_context_writes_are_appended_and_read_back() -> None:
    p = _peer()
    seq0 = p.node.journal.head(ME.public).seq
    r = _ask(p, ctx.CtxSet(key="goal", value="ship it", context="t"))
    assert r == ctx.CtxSetReply(context="t", key="goal", events=1, seq=seq0 + 1)
    assert _ask(p, ctx.CtxGet(context="t", key="goal")) == Record(
        {"key": "goal", "found": True, "value": "ship it"}
    )
    assert _ask(p, ctx.CtxGet(context="t", key="nope")).data["found"] is False
    assert _ask(p, ctx.CtxAppend(list="log", values=("a", "b"), context="t")).length == 2
    assert _ask(p, ctx.CtxIncr(counter="n", by=2.0, context="t")).value == 2.0
    added = _ask(p, ctx.CtxAdd(set="s", elements=("x", "y"), context="t"))
    assert sorted(added.members) == ["x", "y"]
    removed = _ask(p, ctx.CtxRemove(set="s", elements=("x",), context="t"))
    assert removed.members == ["y"]
    assert _ask(p, ctx.CtxMembers(set="s", context="t")).members == ["y"]
    assert _ask(p, ctx.CtxContexts()).data["contexts"] == {"t": 4}
    assert p.node.journal.head(ME.public).seq == seq0 + 5  # one event per write


def test_a_write_through_the_view_is_committed_with_the_items_the_driver_exported() -> None:
    p = _peer()
    p.context.context("t")["k"] = 1  # hivemesh.Node's handles write into the view
    items = export_pending(p.context)
    assert len(items) == 1 and export_pending(p.context) == ()
    assert _ask(p, CommitContext(items)) == 1
    assert _ask(p, CommitContext(())) == 0


def test_names_feed_and_claims_are_answered_from_the_views() -> None:
    p = _peer()
    assert _ask(p, NameClaim("alpha")).owner == ME.address
    assert _ask(p, Names()).data["alpha"] == ME.address
    assert _ask(p, FeedStatus()).data["deferred"] == 0
    _ask(p, Claim("job-1"))
    snap = _ask(p, ClaimShow()).data
    assert snap["resources"]["job-1"]["winner"] == ME.address
    one = _ask(p, ClaimShow(resource="job-1")).data
    assert one["resource"] == "job-1" and one["live"] == 1
    assert _ask(p, ClaimShow(resource="other")) == Record(
        {"resource": "other", "winner": None, "live": 0}
    )


def test_answers_send_nothing_by_themselves() -> None:
    p = _peer()
    p.command(ctx.CtxGet(), NOW)
    assert not any(isinstance(e, Send) for e in p.effects())
    assert Peer.answers(ctx.CtxGet) and Peer.answers(Claim) and not Peer.answers(int)


def test_the_peers_part_of_status_needs_no_driver() -> None:
    p = _peer()
    _ask(p, ctx.CtxSet(key="k", value=1))
    st = peer_status(p)
    assert st["address"] == ME.address
    assert st["journal"]["own_seq"] == p.node.journal.head(ME.public).seq >= 1
    assert st["journal"]["version_vector"] == {ME.address: st["journal"]["own_seq"]}
    assert st["members"] == p.members_snapshot() and st["blobs"] == {"known": 0, "fetching": 0}
    counters = peer_counters(p)
    assert counters["name_takeovers_refused"] == 0 and counters["claim_takeovers_refused"] == 0
