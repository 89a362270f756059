"""Consent to membership, on real processes: one member of swarm A joins
swarm X, and A and X do not merge.

Swarm A grows by one invite per newcomer (a1 invites a2, a2 invites a3);
swarm X is x1 and x2. Then a2 joins X with x1's invite. a2 now belongs to
both; nobody else changed their mind: A's other nodes must not admit X's,
X's must not admit A's -- checked in their trust webs, their journals,
their channels and their membership -- and a2 must not hand A's journal to a
member of X that asks it for it (here: this test process, a real member of
X through a real invite, speaking the protocol over the real transport).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from hivemesh.client.swarm import LocalSwarm, NodeProc, wait_until
from hivemesh.core.frames import FrameType, decode_frame, encode_frame
from hivemesh.core.identity import Identity, public_key_of
from hivemesh.transports import SecureChannel, connect
from hivemesh.trust import accept_invite, join_proof

A = ["a1", "a2", "a3"]
X = ["x1", "x2"]


def _up(swarm: LocalSwarm, observer: str, subject: str) -> bool:
    return swarm.member_state(observer, subject) == "up"


def _vv(node: NodeProc) -> dict[str, int]:
    vv: dict[str, int] = node.client.status()["journal"]["version_vector"]
    return vv


def _join(inviter: NodeProc, joiner: NodeProc) -> None:
    token = inviter.client.call("invite", ttl_s=600)["token"]
    assert joiner.client.call("join", token=token, timeout_s=20)["inviter"] == inviter.address


def _found(node: NodeProc, key: str) -> bool:
    return bool(node.client.ctx_get("default", key)["found"])


@pytest.fixture(scope="module")
def swarm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSwarm]:
    with LocalSwarm(tmp_path_factory.mktemp("consent"), trust_mode=None) as s:
        s.start_many([*A, *X], bootstrap=[])
        yield s


@pytest.fixture(scope="module")
def formed(swarm: LocalSwarm) -> LocalSwarm:
    n = swarm.nodes
    _join(n["a1"], n["a2"])
    _join(n["a2"], n["a3"])  # a3 never met a1: it comes in through a2
    _join(n["x1"], n["x2"])
    n["a1"].client.ctx_set("default", "a-secret", "swarm A only")
    n["x1"].client.ctx_set("default", "x-secret", "swarm X only")
    wait_until(
        lambda: all(_up(swarm, p, q) for p in A for q in A if p != q),
        30,
        what="swarm A formed (a1 and a3 admit each other through a2's vouches)",
    )
    wait_until(lambda: all(_found(n[m], "a-secret") for m in A), 15, what="A shares")
    wait_until(lambda: _found(n["x2"], "x-secret"), 15, what="X shares")
    return swarm


def test_one_invite_per_newcomer_grows_a_swarm(formed: LocalSwarm) -> None:
    a1, a3 = formed.nodes["a1"], formed.nodes["a3"]
    assert a3.address in a1.client.status()["trust"]["admitted"]
    assert a1.address in a3.client.status()["trust"]["admitted"]
    (swarm_a,) = a1.client.status()["trust"]["swarms"]
    assert a3.client.status()["trust"]["swarms"][swarm_a] == sorted(
        formed.nodes[m].address for m in A
    )


async def _member_of_x_pulls_from_a2(x1: NodeProc, a2: NodeProc, a1: NodeProc) -> list[bytes]:
    """Join X through a real invite of x1, then ask a2 for a1's feed and a2's.

    Returns the authors of the EVENTS a2 sent. a2 serves the WANT's ranges in
    order, so its own feed arriving means a1's was refused, not late.
    """
    me = Identity.from_seed(bytes([77]) * 32)
    token = await asyncio.to_thread(x1.client.call, "invite", ttl_s=600)
    proof = join_proof(accept_invite(token["token"], 0), me.address)
    ch = await _dial(x1, me)
    ch.send_nowait(encode_frame(FrameType.RT_JOIN, proof))
    await _recv(ch, FrameType.RT_JOINED)

    def a2_admits_me() -> bool:
        return me.address in a2.client.status()["trust"]["admitted"]

    await asyncio.to_thread(wait_until, a2_admits_me, 15, what="a2 admits an X member")
    to_a2 = await _dial(a2, me)
    a1_pub, a2_pub = public_key_of(a1.address), public_key_of(a2.address)
    to_a2.send_nowait(encode_frame(FrameType.WANT, [[a1_pub, 1, 1000], [a2_pub, 1, 1]]))
    authors = []
    while True:
        fields = await _recv(to_a2, FrameType.EVENTS)
        authors.append(fields[0])
        if fields[0] == a2_pub:
            break
    ch.close()
    to_a2.close()
    return authors


async def _dial(node: NodeProc, me: Identity) -> SecureChannel:
    return await connect(
        "127.0.0.1",
        node.port,
        me,
        expect_address=node.address,
        authorize=lambda _a: True,
        timeout_s=5.0,
    )


async def _recv(ch: SecureChannel, ftype: int) -> list[Any]:
    async with asyncio.timeout(10):
        while True:
            got, fields = decode_frame(await ch.recv())
            if got == ftype:
                return fields


def test_a_member_joining_another_swarm_does_not_merge_them(formed: LocalSwarm) -> None:
    n = formed.nodes
    a1, a2, a3, x1, x2 = (n[m] for m in (*A, *X))
    _join(x1, a2)
    marker = a2.client.call("append", kind="app.note", body="a2 is in A and X")["seq"]
    # a2 belongs to both now: X admits it (x1's vouch), and it sees both swarms
    wait_until(
        lambda: _up(formed, "x2", "a2") and _up(formed, "a2", "x2") and _up(formed, "a2", "x1"),
        30,
        what="X admits a2",
    )
    wait_until(lambda: _found(a2, "x-secret"), 15, what="a2 replicates X")
    # every other node holds a2's feed past the join: it saw whatever a2 vouched
    wait_until(
        lambda: all(_vv(node).get(a2.address, 0) >= marker for node in (a1, a3, x1, x2)),
        15,
        what="everyone holds a2's feed past its join",
    )
    assert len(a2.client.status()["trust"]["swarms"]) == 2

    # a member of X asks the bridge for A's journal: refused
    authors = asyncio.run(_member_of_x_pulls_from_a2(x1, a2, a1))
    assert public_key_of(a1.address) not in authors
    assert a2.client.status()["counters"].get("want_not_shared", 0) >= 1

    a_side, x_side = (a1, a3), (x1, x2)
    for ours, theirs in ((a_side, x_side), (x_side, a_side)):
        for node in ours:
            st = node.client.status()
            for other in theirs:
                assert other.address not in st["trust"]["admitted"], (node.label, other.label)
                assert other.address not in st["journal"]["version_vector"]
                assert other.address not in st["members"]
                assert not any(
                    p["address"] == other.address and p["channel"] for p in node.client.peers()
                )
            # a2 never even offered them the other swarm's feeds
            assert st["counters"].get("untrusted_author", 0) == 0, node.label
    assert not _found(x1, "a-secret") and not _found(x2, "a-secret")
    assert not _found(a1, "x-secret") and not _found(a3, "x-secret")
    # and A still works as one swarm, X as another
    a3.client.ctx_set("default", "after", 1)
    wait_until(lambda: _found(a1, "after") and _found(a2, "after"), 10, what="A still replicates")
    assert not _found(x2, "after")
