"""Invite-only swarms on real processes: invite, join, refusals."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from hivemesh.runtime.swarm import LocalSwarm, wait_until

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
    a.client.call("invite", ttl_s=600)  # keeps a admitting unknown peers on probation
    c.client.call("join", token=token)  # replays b's (used) token
    wait_until(
        lambda: a.client.status()["counters"].get("join_refused", 0) >= 1,
        10,
        what="a refuses the replayed token",
    )
    assert swarm.member_state("a", "c") is None
    assert c.address not in a.client.call("trust.list")["trusted"]
