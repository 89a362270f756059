"""A refused join says why, on real processes and through the real CLI.

Default-configured ``hivemesh up`` daemons (private: invite trust); the
joiner runs ``hivemesh join`` as a subprocess. For a used, an expired and a
foreign invite the command must end promptly with a distinct non-zero exit
code and the cause on stderr (or in the ``--json`` error), the inviter must
have closed the channel with that cause as its CLOSE code, and the joiner's
daemon must stop dialling the inviter instead of redialling forever.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from hivemesh.client.swarm import LocalSwarm, NodeProc, wait_until
from hivemesh.stores.keyfile import load_identity
from hivemesh.trust import make_invite

PROMPT_S = 10.0  # a refusal must not wait for the 30 s join deadline


@pytest.fixture(scope="module")
def swarm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSwarm]:
    with LocalSwarm(tmp_path_factory.mktemp("join"), trust_mode=None) as s:
        a, b, _, _, _ = s.start_many(["a", "b", "c", "d", "e"], bootstrap=[])
        b.client.call("join", token=a.client.call("invite")["token"], timeout_s=20)  # a member
        yield s


def _join(swarm: LocalSwarm, node: NodeProc, token: str, *flags: str) -> tuple[Any, float]:
    cmd = [sys.executable, "-m", "hivemesh", "join", "--data-dir", str(node.data_dir), token]
    t = time.monotonic()
    out = subprocess.run([*cmd, *flags], env=swarm.env, capture_output=True, text=True, timeout=60)
    return out, time.monotonic() - t


def _counter(node: NodeProc, name: str) -> int:
    return int(node.client.status()["counters"].get(name, 0))


def _forged_token(inviter: NodeProc, endpoint: str, ttl_s: int, now_s: int) -> str:
    """A token signed with the inviter's own key that its store never issued."""
    identity = load_identity(inviter.data_dir)
    return make_invite(identity, [endpoint], ttl_s, now_s, secrets.token_bytes(16))


def _assert_refused(
    swarm: LocalSwarm, inviter: NodeProc, joiner: NodeProc, token: str, code: str, rc: int
) -> None:
    before = _counter(inviter, f"join_refused_{code}")
    out, took = _join(swarm, joiner, token)
    assert out.returncode == rc, out.stdout + out.stderr
    assert took < PROMPT_S, f"took {took:.1f} s"
    assert f"[{code}]" in out.stderr and "refused the join" in out.stderr, out.stderr
    # the inviter closed the channel naming the cause, and the joiner got that CLOSE
    assert _counter(inviter, f"join_refused_{code}") == before + 1
    assert _counter(joiner, f"channel_closed_{code}") >= 1
    last = joiner.client.status()["trust"]["joins"][-1]
    assert last["inviter"] == inviter.address and last["code"] == code and not last["ok"]
    # ... and stopped dialling the inviter
    assert not any(
        t["address"] == inviter.address for t in joiner.client.status()["trust"]["refused_by"]
    )
    assert inviter.address not in joiner.client.status()["trust"]["joining"]
    assert swarm.member_state("a", joiner.label) is None


def test_a_join_and_then_a_used_invite(swarm: LocalSwarm) -> None:
    a, c, e = swarm.nodes["a"], swarm.nodes["c"], swarm.nodes["e"]
    token = a.client.call("invite", ttl_s=600)["token"]
    out, took = _join(swarm, e, token, "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    joined = json.loads(out.stdout)
    assert joined["inviter"] == a.address and took < PROMPT_S
    wait_until(lambda: swarm.member_state("a", "e") == "up", 10, what="a sees e up")
    out, _ = _join(swarm, e, token)  # e again, with the token it used: fine
    assert out.returncode == 0, out.stdout + out.stderr
    _assert_refused(swarm, a, c, token, "invite_used", 12)

    # the --json shape of a refusal
    out, _ = _join(swarm, c, token, "--json")
    assert out.returncode == 12
    err = json.loads(out.stdout)["error"]
    assert err["type"] == "InviteUsed" and err["code"] == "invite_used"
    assert a.address[:12] in err["message"]


def test_an_expired_invite(swarm: LocalSwarm) -> None:
    a, c = swarm.nodes["a"], swarm.nodes["c"]
    token = a.client.call("invite", ttl_s=1)["token"]
    expires_s = a.client.call("invite", ttl_s=1)["expires_s"]
    wait_until(lambda: time.time() > expires_s + 0.5, 5, what="the invite expires")
    _assert_refused(swarm, a, c, token, "invite_expired", 11)  # the inviter's clock decides

    # a member of a's swarm with that token: refused just as promptly, on the
    # channel it keeps (RT_JOIN_REFUSED, not a CLOSE)
    b = swarm.nodes["b"]
    out, took = _join(swarm, b, token)
    assert out.returncode == 11 and took < PROMPT_S, out.stdout + out.stderr
    assert "the invite expired" in out.stderr
    assert swarm.member_state("a", "b") == "up" and swarm.member_state("b", "a") == "up"

    # long expired: refused on the joiner already, same exit code
    old = _forged_token(a, a.endpoint, 60, int(time.time()) - 3600)
    out, took = _join(swarm, c, old, "--json")
    assert out.returncode == 11 and took < PROMPT_S
    assert json.loads(out.stdout)["error"]["code"] == "invite_expired"


def test_a_foreign_invite(swarm: LocalSwarm) -> None:
    a, c = swarm.nodes["a"], swarm.nodes["c"]
    a.client.call("invite", ttl_s=600)  # a holds invites: it hears c out
    token = _forged_token(a, a.endpoint, 600, int(time.time()))
    _assert_refused(swarm, a, c, token, "invite_unknown", 13)


def test_an_inviter_that_refuses_in_the_handshake_and_a_wrong_endpoint(
    swarm: LocalSwarm,
) -> None:
    c, d = swarm.nodes["c"], swarm.nodes["d"]
    # d never issued an invite: it refuses unknown nodes in the handshake
    out, took = _join(swarm, c, _forged_token(d, d.endpoint, 600, int(time.time())))
    assert out.returncode == 14 and took < PROMPT_S, out.stdout + out.stderr
    assert "[unknown_peer]" in out.stderr
    # a token whose endpoint is another node's: that node cannot prove the inviter's key
    out, took = _join(swarm, c, _forged_token(d, swarm.nodes["a"].endpoint, 600, int(time.time())))
    assert out.returncode == 15 and took < PROMPT_S, out.stdout + out.stderr
    assert "[identity_mismatch]" in out.stderr
    assert not any(t["address"] == d.address for t in c.client.status()["trust"]["refused_by"])


def test_a_malformed_token_and_no_answer(
    swarm: LocalSwarm, tmp_path_factory: pytest.TempPathFactory
) -> None:
    c = swarm.nodes["c"]
    out, _ = _join(swarm, c, "hmi1not-a-token")
    assert out.returncode == 10 and "[invite_" in out.stderr
    # an endpoint where nobody listens: the join gives up at its deadline, says so
    token = _forged_token(swarm.nodes["d"], "127.0.0.1:9", 600, int(time.time()))
    out, took = _join(swarm, c, token, "--timeout-s", "2")
    assert out.returncode == 16 and "[deadline_exceeded]" in out.stderr, out.stderr
    assert took < PROMPT_S
