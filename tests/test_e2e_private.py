"""Private by default, on real processes: a stranger gets nothing.

The node under attack is a real ``hivemesh up`` daemon started with *no*
trust setting at all (no flag, no ``HIVEMESH_TRUST_MODE``, no config file):
whatever it does is the product's default. The strangers are authenticated
nodes nobody invited: another default-configured daemon that bootstraps
from it, and this test process speaking the real protocol over the real
transport with its own Ed25519 identity.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from hivemesh.client.swarm import LocalSwarm, NodeProc, wait_until
from hivemesh.core.frames import FrameType, decode_frame, encode_frame
from hivemesh.core.identity import Identity, public_key_of
from hivemesh.errors import HivemeshError, UnknownPeer
from hivemesh.transports import connect


def _refused_dials(node: NodeProc) -> int:
    counters = node.client.status()["counters"]
    return int(counters.get("dial_failed_unknown_peer", 0))


def _vv(node: NodeProc) -> dict[str, int]:
    vv: dict[str, int] = node.client.status()["journal"]["version_vector"]
    return vv


async def _pull_everything(target: NodeProc, me: Identity) -> list[int]:
    """Dial ``target`` as ``me`` and ask for its whole feed; the frame types we got."""
    ch = await connect(
        "127.0.0.1",
        target.port,
        me,
        expect_address=target.address,
        authorize=lambda _addr: True,
        timeout_s=5.0,
    )
    got: list[int] = []
    try:
        pub = public_key_of(target.address)
        ch.send_nowait(encode_frame(FrameType.HAVE, {}, True))
        ch.send_nowait(encode_frame(FrameType.WANT, [[pub, 1, 1000]]))
        async with asyncio.timeout(15):  # the node must hang up on us
            while True:
                got.append(decode_frame(await ch.recv())[0])
    except HivemeshError:
        pass
    finally:
        ch.close()
    return got


def test_a_stranger_gets_nothing_from_a_default_node(tmp_path: Path) -> None:
    with LocalSwarm(tmp_path, trust_mode=None) as swarm:  # the product's defaults
        a = swarm.start("a")
        a.client.ctx_set("default", "secret", "the plan")
        assert _vv(a)[a.address] >= 1

        # A default-configured daemon nobody invited bootstraps from a.
        stranger = swarm.start("stranger", bootstrap=[a.endpoint])
        wait_until(lambda: _refused_dials(stranger) >= 2, 15, what="a refuses the stranger twice")
        assert a.address not in _vv(stranger)
        assert stranger.address not in a.client.status()["members"]
        assert a.address not in stranger.client.status()["members"]
        assert a.client.status()["peers_connected"] == 0
        # the stranger says so: in status, and once (not per redial) in its log
        refused = stranger.client.status()["trust"]["refused_by"]
        assert [(t["endpoint"], t["refused"]) for t in refused] == [(a.endpoint, "unknown_peer")]
        log = (stranger.data_dir / "daemon.log").read_text()
        assert log.count("turned this node away") == 1, log

        # The protocol itself: an authenticated identity asks for a's whole feed.
        mallory = Identity.from_seed(bytes([42]) * 32)
        with pytest.raises(UnknownPeer):
            asyncio.run(_pull_everything(a, mallory))
        assert mallory.address not in _vv(a)
        assert not stranger.client.ctx_get("default", "secret")["found"]
        assert int(a.client.status()["counters"].get("events_served", 0)) == 0


def test_a_stranger_on_probation_gets_nothing_and_is_cut_off(tmp_path: Path) -> None:
    """A node holding invites hears unknown peers out (a joiner must present its
    proof first); a stranger that asks for anything else is closed at once."""
    with LocalSwarm(tmp_path, trust_mode=None) as swarm:
        a = swarm.start("a")
        a.client.ctx_set("default", "secret", "the plan")
        a.client.call("invite", ttl_s=600)
        mallory = Identity.from_seed(bytes([43]) * 32)
        got = asyncio.run(_pull_everything(a, mallory))  # returns when a hangs up
        assert got == []
        counters = a.client.status()["counters"]
        assert counters.get("probation_violation", 0) == 1
        assert int(counters.get("events_served", 0)) == 0
        assert mallory.address not in a.client.status()["members"]
