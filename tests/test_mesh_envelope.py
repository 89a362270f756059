"""Broker mode's signed envelopes and ``--mesh`` URLs (sans-IO, no broker needed)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hivemesh.core.codec import pack, unpack
from hivemesh.core.identity import Identity
from hivemesh.errors import (
    BadSignature,
    BrokerMisrouted,
    ConfigError,
    DecodeError,
    RemoteProtocolError,
    StaleEnvelope,
    UnsupportedVersion,
)
from hivemesh.mesh import parse_mesh_url
from hivemesh.mesh.envelope import FRAMES, HELLO, TELEMETRY, open_envelope, seal_envelope

ALICE = Identity.from_seed(b"a" * 32)
BOB = Identity.from_seed(b"b" * 32)
CAROL = Identity.from_seed(b"c" * 32)
NOW = 1_800_000_000_000


def seal(**kw: object) -> bytes:
    args: dict[str, object] = {
        "identity": ALICE,
        "swarm": "team",
        "kind": FRAMES,
        "boot_id": b"life-1",
        "to": BOB.address,
        "ts_ms": NOW,
        "frames": [b"f1", b"f2"],
    }
    args.update(kw)
    return seal_envelope(**args)  # type: ignore[arg-type]


def test_round_trip_names_the_signer_and_keeps_the_frames() -> None:
    env = open_envelope(seal(), "team", BOB.address, NOW + 5)
    assert (env.sender, env.kind, env.boot_id, env.frames) == (
        ALICE.address,
        FRAMES,
        b"life-1",
        [b"f1", b"f2"],
    )
    hello = open_envelope(seal(kind=HELLO, to="", frames=[]), "team", CAROL.address, NOW)
    assert hello.to == "" and hello.kind == HELLO  # a broadcast opens anywhere


def test_moved_to_another_recipient_swarm_or_life_is_refused() -> None:
    with pytest.raises(BrokerMisrouted):
        open_envelope(seal(), "team", CAROL.address, NOW)
    with pytest.raises(BadSignature):
        open_envelope(seal(), "other-swarm", BOB.address, NOW)
    obj = unpack(seal())
    obj[3] = b"life-2"  # another boot id under the same signature
    with pytest.raises(BadSignature):
        open_envelope(pack(obj), "team", BOB.address, NOW)
    obj = unpack(seal())
    obj[2] = CAROL.public  # claims another sender
    with pytest.raises(BadSignature):
        open_envelope(pack(obj), "team", BOB.address, NOW)


def test_stale_envelopes_are_refused_but_queued_telemetry_is_not() -> None:
    with pytest.raises(StaleEnvelope):
        open_envelope(seal(ts_ms=NOW - 61_000), "team", BOB.address, NOW)
    with pytest.raises(StaleEnvelope):
        open_envelope(seal(ts_ms=NOW + 61_000), "team", BOB.address, NOW)
    old = seal(kind=TELEMETRY, to="", ts_ms=NOW - 3_600_000)
    env = open_envelope(old, "team", BOB.address, NOW, window_ms=10**15)
    assert env.kind == TELEMETRY


def test_wrong_shapes_are_typed() -> None:
    good = unpack(seal())
    with pytest.raises(UnsupportedVersion):
        open_envelope(pack([2, *good[1:]]), "team", BOB.address, NOW)
    for bad in (pack([1, 2]), pack({"x": 1}), pack([*good[:6], ["not bytes"], good[7]])):
        with pytest.raises(DecodeError):
            open_envelope(bad, "team", BOB.address, NOW)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_garbage_never_crashes_the_opener(data: bytes) -> None:
    with pytest.raises(RemoteProtocolError):
        open_envelope(data, "team", BOB.address, NOW)


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=0, max_value=200), st.integers(min_value=0, max_value=7))
def test_any_flipped_bit_is_refused(pos: int, bit: int) -> None:
    data = bytearray(seal())
    i = pos % len(data)
    data[i] ^= 1 << bit
    with pytest.raises(RemoteProtocolError):
        open_envelope(bytes(data), "team", BOB.address, NOW)


def test_mesh_urls() -> None:
    o = parse_mesh_url("nats://u:p@10.0.0.5:4223?swarm=team&max_age_s=60&max_msgs=100")
    assert (o.engine, o.host, o.port, o.swarm, o.username, o.password) == (
        "nats",
        "10.0.0.5",
        4223,
        "team",
        "u",
        "p",
    )
    assert (o.max_age_s, o.max_msgs, o.max_bytes) == (60.0, 100, 1 << 30)
    assert "p@" not in o.url  # no credentials in what status shows
    r = parse_mesh_url("rediss://h/3?swarm=x")
    assert (r.engine, r.tls, r.db, r.port, r.max_msgs) == ("redis", True, 3, 6379, 1_000_000)
    assert parse_mesh_url("tls://h").tls and parse_mesh_url("nats://h").swarm == "hivemesh"
    t = parse_mesh_url("tls://h?ca=/x/ca.pem&cert=/x/c.pem&key=/x/c.key")
    assert (t.tls, t.ca, t.cert, t.key) == (True, "/x/ca.pem", "/x/c.pem", "/x/c.key")
    for bad in (
        "tls://h?cert=/x/c.pem",
        "nats://h?ca=/x/ca.pem",
        "http://h",
        "nats://h?swarm=bad.name",
        "nats://h?nope=1",
        "nats://h:99999",
        "redis://h/x",
        "nats://h?max_msgs=0",
        "nats://h?timeout_s=-1",
        "nats://h?max_age_s=soon",
    ):
        with pytest.raises(ConfigError):
            parse_mesh_url(bad)
