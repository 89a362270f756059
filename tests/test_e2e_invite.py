"""Invite-only swarms on real processes: invite, join, refusals."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from hivemesh.client.swarm import LocalSwarm, wait_until
from hivemesh.errors import InviteUsed

INVITE = ["--trust-mode", "invite"]


@pytest.fixture()
def swarm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSwarm]:
    with LocalSwarm(tmp_path_factory.mktemp("inv")) as s:
        yield s


def _up(swarm: LocalSwarm, observer: str, subject: str) -> bool:
    return swarm.member_state(observer, subject) == "up"


def test_join_with_an_invite_and_refuse_everyone_else(swarm: LocalSwarm) -> None:
    a = swarm.start("a", extra_args=INVITE)
    b = swarm.start("b", extra_args=INVITE)
    stranger = swarm.start("stranger", bootstrap=[a.endpoint], extra_args=INVITE)

    token = a.client.call("invite", ttl_s=600)["token"]
    joined = b.client.call("join", token=token)
    assert joined["inviter"] == a.address
    wait_until(lambda: _up(swarm, "a", "b") and _up(swarm, "b", "a"), 15, what="a and b joined")
    a.client.ctx_set("default", "secret-plan", 1)
    wait_until(
        lambda: b.client.ctx_get("default", "secret-plan")["found"], 10, what="b replicates a"
    )
    assert a.address in b.client.call("trust.list")["trusted"]
    assert b.address in a.client.call("trust.list")["trusted"]

    # The stranger, never invited, dialled a the whole time and got nowhere.
    assert swarm.member_state("a", "stranger") is None
    assert not stranger.client.status()["journal"]["version_vector"].get(a.address)
    dials = stranger.client.status()["counters"]
    assert sum(v for k, v in dials.items() if k.startswith("dial_failed")) >= 1


def test_a_used_token_is_refused_even_while_other_invites_are_open(swarm: LocalSwarm) -> None:
    a = swarm.start("a", extra_args=INVITE)
    b = swarm.start("b", extra_args=INVITE)
    c = swarm.start("c", extra_args=INVITE)
    token = a.client.call("invite", ttl_s=600)["token"]
    b.client.call("join", token=token)
    wait_until(lambda: _up(swarm, "a", "b"), 15, what="b joined")
    a.client.call("invite", ttl_s=600)
    with pytest.raises(InviteUsed):  # c replays b's (used) token, and is told so
        c.client.call("join", token=token)
    assert a.client.status()["counters"].get("join_refused_invite_used", 0) >= 1
    assert swarm.member_state("a", "c") is None
    assert c.address not in a.client.call("trust.list")["trusted"]


def test_invitees_of_one_node_trust_each_other_and_a_revocation_spreads(
    swarm: LocalSwarm,
) -> None:
    a = swarm.start("a", extra_args=INVITE)
    b = swarm.start("b", extra_args=INVITE)
    c = swarm.start("c", extra_args=INVITE)
    b.client.call("join", token=a.client.call("invite")["token"])
    c.client.call("join", token=a.client.call("invite")["token"])
    # b and c never met: a's vouches in the journal admit them to each other
    wait_until(
        lambda: _up(swarm, "b", "c") and _up(swarm, "c", "b"),
        20,
        what="b and c admit each other through a's vouches",
    )
    assert any(p["address"] == c.address and p["channel"] for p in b.client.peers())
    c.client.ctx_set("default", "from-c", 1)
    wait_until(lambda: b.client.ctx_get("default", "from-c")["found"], 10, what="c -> b")

    # a revokes c: b follows a's signed revocation, drops c, refuses its events
    a.client.revoke(c.address)
    wait_until(
        lambda: not any(p["address"] == c.address and p["channel"] for p in b.client.peers()),
        10,
        what="b disconnects c",
    )
    held = b.client.status()["journal"]["version_vector"][c.address]
    c.client.ctx_set("default", "after-revoke", 1)
    # b keeps syncing with a; c's new event must never be stored on b
    a_seq = a.client.ctx_set("default", "marker", 1)["seq"]
    wait_until(
        lambda: b.client.status()["journal"]["version_vector"][a.address] >= a_seq,
        10,
        what="b still replicates with a",
    )
    assert b.client.status()["journal"]["version_vector"][c.address] == held
    assert not b.client.ctx_get("default", "after-revoke")["found"]
