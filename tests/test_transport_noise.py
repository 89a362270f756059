"""Sans-IO tests of the Noise XX handshake, identity binding and record/frame session.

The handshake is checked byte-for-byte against an independent implementation
(the ``noiseprotocol`` package) with the same keys, in both roles.
"""

from __future__ import annotations

import random
import warnings

# A hard import: the independent implementation is a test dependency, never skipped.
import noise.connection as noise_connection
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hivemesh.core.codec import MAX_FRAME_BYTES
from hivemesh.core.identity import Identity
from hivemesh.errors import (
    BadRecord,
    DecodeError,
    FrameTooLarge,
    HandshakeError,
    InvalidArgument,
    LocalProtocolError,
    PeerIdentityMismatch,
    RemoteProtocolError,
    UnknownPeer,
    UnsupportedHandshake,
)
from hivemesh.transports.noise import (
    BOOT_ID_BYTES,
    IDENTITY_PAYLOAD_BYTES,
    MESSAGE_BYTES,
    PROLOGUE,
    PROTOCOL_NAME,
    STATIC_KEY_CONTEXT,
    HandshakeState,
    SecureHandshake,
    StaticCredentials,
)
from hivemesh.transports.session import MAX_RECORD_PLAINTEXT, FrameSession


def _rng_bytes(seed: str):  # type: ignore[no-untyped-def]
    rng = random.Random(seed)
    return rng.randbytes


def _theirs(*, initiator: bool, static: bytes, ephemeral: bytes):  # type: ignore[no-untyped-def]
    conn = noise_connection.NoiseConnection.from_name(PROTOCOL_NAME)
    if initiator:
        conn.set_as_initiator()
    else:
        conn.set_as_responder()
    conn.set_prologue(PROLOGUE)
    conn.set_keypair_from_private_bytes(noise_connection.Keypair.STATIC, static)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "ephemeral set: testing only" -- that is what this is
        conn.set_keypair_from_private_bytes(noise_connection.Keypair.EPHEMERAL, ephemeral)
        conn.start_handshake()
    return conn


@pytest.mark.parametrize("we_initiate", [True, False])
def test_xx_matches_noiseprotocol_byte_for_byte(we_initiate: bool) -> None:
    rb = _rng_bytes(f"xx/{we_initiate}")
    s_ours, e_ours, s_theirs, e_theirs = rb(32), rb(32), rb(32), rb(32)
    ours = HandshakeState(
        initiator=we_initiate, static_private=s_ours, random_bytes=lambda n: e_ours
    )
    theirs = _theirs(initiator=not we_initiate, static=s_theirs, ephemeral=e_theirs)
    # Run both sides; every message one side writes, the other must read.
    writers = [ours, theirs] if we_initiate else [theirs, ours]
    payloads = [b"", b"payload two", b"payload three"]
    for i, payload in enumerate(payloads):
        writer, reader = writers[i % 2], writers[(i + 1) % 2]
        msg = bytes(writer.write_message(payload))
        assert bytes(reader.read_message(msg)) == payload
    assert ours.complete and theirs.handshake_finished
    assert ours.handshake_hash == theirs.get_handshake_hash()
    send, recv = ours.split()
    for i in range(50):
        data = random.Random(i).randbytes(i * 37)
        assert theirs.decrypt(send.encrypt_with_ad(None, data)) == data
        assert recv.decrypt_with_ad(None, theirs.encrypt(data)) == data


def test_xx_messages_are_identical_to_noiseprotocol_given_the_same_keys() -> None:
    rb = _rng_bytes("identical")
    si, ei, sr, er = rb(32), rb(32), rb(32), rb(32)
    ours_i = HandshakeState(initiator=True, static_private=si, random_bytes=lambda n: ei)
    ours_r = HandshakeState(initiator=False, static_private=sr, random_bytes=lambda n: er)
    th_i = _theirs(initiator=True, static=si, ephemeral=ei)
    th_r = _theirs(initiator=False, static=sr, ephemeral=er)
    m1 = ours_i.write_message(b"")
    assert m1 == bytes(th_i.write_message(b""))
    ours_r.read_message(m1)
    th_r.read_message(m1)
    m2 = ours_r.write_message(b"x")
    assert m2 == bytes(th_r.write_message(b"x"))
    ours_i.read_message(m2)
    th_i.read_message(m2)
    m3 = ours_i.write_message(b"y")
    assert m3 == bytes(th_i.write_message(b"y"))


# -- identity binding -------------------------------------------------------------

A = Identity.from_seed(b"A" * 32)
B = Identity.from_seed(b"B" * 32)
C = Identity.from_seed(b"C" * 32)


def _pair(
    client: Identity = A,
    server: Identity = B,
    *,
    expect: str | None = None,
    client_trusts: object = None,
    server_trusts: object = None,
) -> tuple[SecureHandshake, SecureHandshake]:
    rb = _rng_bytes(f"{client.address}/{server.address}")
    c = SecureHandshake(
        StaticCredentials.generate(client, rb),
        initiator=True,
        random_bytes=rb,
        authorize=client_trusts or (lambda a: True),  # type: ignore[arg-type]
        expect_address=expect,
    )
    s = SecureHandshake(
        StaticCredentials.generate(server, rb),
        initiator=False,
        random_bytes=rb,
        authorize=server_trusts or (lambda a: True),  # type: ignore[arg-type]
    )
    return c, s


def test_handshake_binds_both_identities_and_message_sizes() -> None:
    c, s = _pair(expect=B.address)
    m1 = c.initiate()
    m2 = s.receive(m1)
    assert m2 is not None
    m3 = c.receive(m2)
    assert m3 is not None and s.receive(m3) is None
    assert [len(m1), len(m2), len(m3)] == list(MESSAGE_BYTES)
    assert c.complete and s.complete
    assert c.result().peer_address == B.address and s.result().peer_address == A.address
    assert c.result().handshake_hash == s.result().handshake_hash
    rc, rs = c.result(), s.result()
    assert rs.recv.decrypt_with_ad(None, rc.send.encrypt_with_ad(None, b"hi")) == b"hi"


def test_expect_address_mismatch_is_detected_before_revealing_ourselves() -> None:
    c, s = _pair(expect=C.address)  # we dial C, but B answers
    m2 = s.receive(c.initiate())
    assert m2 is not None
    with pytest.raises(PeerIdentityMismatch):
        c.receive(m2)
    assert c.peer_address == B.address and not c.complete
    with pytest.raises(LocalProtocolError):  # a failed handshake is dead
        c.receive(m2)


def test_untrusted_responder_and_untrusted_initiator() -> None:
    c, s = _pair(client_trusts=lambda a: a != B.address)
    m2 = s.receive(c.initiate())
    assert m2 is not None
    with pytest.raises(UnknownPeer):
        c.receive(m2)
    c, s = _pair(server_trusts=lambda a: a != A.address)
    m2 = s.receive(c.initiate())
    assert m2 is not None
    m3 = c.receive(m2)
    assert m3 is not None
    with pytest.raises(UnknownPeer):
        s.receive(m3)
    assert not s.complete
    assert s.result().peer_address == A.address  # keys exist to send the refusal


def test_static_key_signed_by_another_identity_is_rejected() -> None:
    rb = _rng_bytes("forged")
    good = StaticCredentials.generate(A, rb)
    # Claim A's identity but sign our own static key with C: the signature
    # does not cover this static key under A.
    forged = StaticCredentials(
        A,
        good.static_private,
        good.static_public,
        bytes([2])
        + A.public
        + good.boot_id
        + C.sign(STATIC_KEY_CONTEXT + good.static_public + good.boot_id),
    )
    c = SecureHandshake(forged, initiator=True, random_bytes=rb, authorize=lambda a: True)
    s = SecureHandshake(
        StaticCredentials.generate(B, rb),
        initiator=False,
        random_bytes=rb,
        authorize=lambda a: True,
    )
    m2 = s.receive(c.initiate())
    assert m2 is not None
    m3 = c.receive(m2)
    assert m3 is not None
    with pytest.raises(HandshakeError, match="signature"):
        s.receive(m3)


def test_replayed_identity_payload_with_other_static_key_is_rejected() -> None:
    """A stolen (identity, signature) pair is useless with a different static key."""
    rb = _rng_bytes("stolen")
    victim = StaticCredentials.generate(A, rb)
    mine = StaticCredentials.generate(C, rb)
    thief = StaticCredentials(A, mine.static_private, mine.static_public, victim.payload)
    c = SecureHandshake(thief, initiator=True, random_bytes=rb, authorize=lambda a: True)
    s = SecureHandshake(
        StaticCredentials.generate(B, rb),
        initiator=False,
        random_bytes=rb,
        authorize=lambda a: True,
    )
    m2 = s.receive(c.initiate())
    assert m2 is not None
    m3 = c.receive(m2)
    assert m3 is not None
    with pytest.raises(HandshakeError):
        s.receive(m3)


@pytest.mark.parametrize("step", [0, 1, 2])
def test_tampered_or_resized_handshake_messages_fail_typed(step: int) -> None:
    for mutate in ("flip", "short", "long"):
        c, s = _pair()
        msgs = [c.initiate()]
        sides = [s, c, s]
        for i in range(step):
            reply = sides[i].receive(msgs[i])
            assert reply is not None
            msgs.append(reply)
        msg = bytearray(msgs[step])
        if mutate == "flip":
            msg[-1] ^= 1
        elif mutate == "short":
            msg = msg[:-1]
        else:
            msg += b"\0"
        if step == 0 and mutate == "flip":
            continue  # message 1 is a bare ephemeral key: any 32 bytes are one
        with pytest.raises(HandshakeError):
            sides[step].receive(bytes(msg))


# -- boot ids and payload versions ---------------------------------------------------


def _run(c: SecureHandshake, s: SecureHandshake) -> None:
    m2 = s.receive(c.initiate())
    assert m2 is not None
    m3 = c.receive(m2)
    assert m3 is not None
    assert s.receive(m3) is None


def _with_payload(creds: StaticCredentials, payload: bytes) -> StaticCredentials:
    return StaticCredentials(
        creds.identity, creds.static_private, creds.static_public, payload, creds.boot_id
    )


def _handshake(
    client: StaticCredentials, server: StaticCredentials
) -> tuple[SecureHandshake, SecureHandshake]:
    rb = _rng_bytes("hs")
    c = SecureHandshake(client, initiator=True, random_bytes=rb, authorize=lambda a: True)
    s = SecureHandshake(server, initiator=False, random_bytes=rb, authorize=lambda a: True)
    return c, s


def test_each_side_learns_the_boot_id_the_other_proved() -> None:
    rb = _rng_bytes("boot")
    boot_a, boot_b = b"\xaa" * BOOT_ID_BYTES, b"\xbb" * BOOT_ID_BYTES
    c, s = _handshake(
        StaticCredentials.generate(A, rb, boot_id=boot_a),
        StaticCredentials.generate(B, rb, boot_id=boot_b),
    )
    _run(c, s)
    assert c.result().peer_boot_id == boot_b and s.result().peer_boot_id == boot_a
    # version 2: version || ed25519 key || boot id || signature, and fixed message sizes
    assert IDENTITY_PAYLOAD_BYTES == 1 + 32 + 16 + 64
    assert list(MESSAGE_BYTES) == [32, 32 + 48 + 113 + 16, 48 + 113 + 16]
    # drawn from the injected randomness when not given
    fresh = StaticCredentials.generate(A, _rng_bytes("other"))
    assert len(fresh.boot_id) == BOOT_ID_BYTES and fresh.boot_id != boot_a
    with pytest.raises(InvalidArgument):
        StaticCredentials.generate(A, rb, boot_id=b"short")


@pytest.mark.parametrize("who", ["initiator", "responder"])
def test_a_boot_id_the_identity_did_not_sign_is_rejected(who: str) -> None:
    """The boot id is covered by the identity's signature: swapping it (to fake
    a restart, or to hide one) breaks the proof."""
    rb = _rng_bytes(f"swap/{who}")
    a, b = StaticCredentials.generate(A, rb), StaticCredentials.generate(B, rb)
    victim = a if who == "initiator" else b
    p = victim.payload
    swapped = _with_payload(victim, p[:33] + b"\x00" * BOOT_ID_BYTES + p[33 + BOOT_ID_BYTES :])
    c, s = _handshake(swapped, b) if who == "initiator" else _handshake(a, swapped)
    m2 = s.receive(c.initiate())
    assert m2 is not None
    if who == "responder":
        with pytest.raises(HandshakeError, match="signature"):
            c.receive(m2)
        return
    m3 = c.receive(m2)
    assert m3 is not None
    with pytest.raises(HandshakeError, match="signature"):
        s.receive(m3)


def _legacy(creds: StaticCredentials, identity: Identity) -> StaticCredentials:
    """The same key with a version-1 payload: ``1 || ed25519 || sig`` (97 bytes)."""
    sig = identity.sign(STATIC_KEY_CONTEXT + creds.static_public)
    return _with_payload(creds, bytes([1]) + identity.public + sig)


def test_a_version_1_responder_is_refused_by_version_not_misparsed() -> None:
    rb = _rng_bytes("old-responder")
    c, s = _handshake(
        StaticCredentials.generate(A, rb), _legacy(StaticCredentials.generate(B, rb), B)
    )
    m2 = s.receive(c.initiate())
    assert m2 is not None and len(m2) == MESSAGE_BYTES[1] - BOOT_ID_BYTES  # the old size
    with pytest.raises(UnsupportedHandshake, match="version 1") as info:
        c.receive(m2)  # before revealing who we are
    assert isinstance(info.value, HandshakeError) and isinstance(info.value, RemoteProtocolError)
    assert info.value.code == "handshake_version"
    assert not c.complete


def test_a_version_1_initiator_is_refused_by_version() -> None:
    rb = _rng_bytes("old-initiator")
    c, s = _handshake(
        _legacy(StaticCredentials.generate(A, rb), A), StaticCredentials.generate(B, rb)
    )
    m2 = s.receive(c.initiate())
    assert m2 is not None
    m3 = c.receive(m2)
    assert m3 is not None and len(m3) == MESSAGE_BYTES[2] - BOOT_ID_BYTES
    with pytest.raises(UnsupportedHandshake, match="version 1"):
        s.receive(m3)
    assert not s.complete


def test_an_unknown_payload_version_of_the_right_size_is_refused_by_version() -> None:
    rb = _rng_bytes("v3")
    b = StaticCredentials.generate(B, rb)
    c, s = _handshake(StaticCredentials.generate(A, rb), _with_payload(b, b"\x03" + b.payload[1:]))
    m2 = s.receive(c.initiate())
    assert m2 is not None
    with pytest.raises(UnsupportedHandshake, match="version 3"):
        c.receive(m2)


def test_other_message_sizes_are_refused_before_any_crypto() -> None:
    for size in (MESSAGE_BYTES[1] - 1, MESSAGE_BYTES[1] + 1, MESSAGE_BYTES[1] - 2 * BOOT_ID_BYTES):
        c, s = _pair()
        s.receive(c.initiate())
        with pytest.raises(HandshakeError, match="bytes, want"):
            c.receive(bytes(size))


def test_low_order_ephemeral_key_is_rejected() -> None:
    _, s = _pair()
    with pytest.raises(HandshakeError, match="X25519"):
        s.receive(bytes(32))  # the all-zero point: a DH with it yields no secret


def test_credentials_reject_short_randomness() -> None:
    with pytest.raises(InvalidArgument):
        StaticCredentials.generate(A, lambda n: b"\0" * (n - 1))


# -- record / frame session ---------------------------------------------------------


def _sessions(
    max_frame_bytes: int = MAX_FRAME_BYTES, *, client_max: int | None = None
) -> tuple[FrameSession, FrameSession]:
    c, s = _pair()
    m2 = s.receive(c.initiate())
    assert m2 is not None
    m3 = c.receive(m2)
    assert m3 is not None
    s.receive(m3)
    rc, rs = c.result(), s.result()
    client = FrameSession(
        rc.send, rc.recv, initiator=True, max_frame_bytes=client_max or max_frame_bytes
    )
    server = FrameSession(rs.send, rs.recv, initiator=False, max_frame_bytes=max_frame_bytes)
    client.receive_data(server.encode_accept())
    assert client.accepted and client.failure is None
    return client, server


def test_frames_of_all_sizes_round_trip_and_share_or_span_records() -> None:
    client, server = _sessions()
    rng = random.Random(7)
    frames = [rng.randbytes(n) for n in (0, 1, 200, 65_519, 65_520, 3 * 1024 * 1024, 5)]
    frames.append(b"x" * MAX_FRAME_BYTES)
    wire = client.encode_frames(frames)
    assert server.receive_data(wire) == frames
    assert server.failure is None
    small = [b"f%d" % i for i in range(1000)]
    before = client.records_out
    assert server.receive_data(client.encode_frames(small)) == small
    assert client.records_out == before + 1  # 1000 small frames, one record


_FRAME = st.one_of(
    st.binary(max_size=300), st.integers(60_000, 140_000).map(lambda n: bytes([n % 251]) * n)
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_FRAME, max_size=30), st.data())
def test_any_split_of_the_wire_gives_the_same_frames(
    frames: list[bytes], data: st.DataObject
) -> None:
    client, server = _sessions()
    wire = client.encode_frames(frames) + client.encode_frames([b"tail" * 20_000])
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=12)))
    out: list[bytes] = []
    prev = 0
    for cut in [*cuts, len(wire)]:
        out += server.receive_data(wire[prev:cut])
        prev = cut
    assert out == [*frames, b"tail" * 20_000]
    assert server.failure is None


def test_replayed_record_fails_and_earlier_frames_survive() -> None:
    client, server = _sessions()
    r1 = client.encode_frames([b"one"])
    r2 = client.encode_frames([b"two"])
    assert server.receive_data(r1) == [b"one"]
    # the replay arrives glued to a legitimate record: the legit frame is kept
    assert server.receive_data(r2 + r1) == [b"two"]
    assert isinstance(server.failure, BadRecord)
    assert server.receive_data(client.encode_frames([b"three"])) == []  # sticky


def test_reordered_and_bit_flipped_records_fail() -> None:
    client, server = _sessions()
    client.encode_frames([b"one"])  # sent, but lost on the way
    r2 = client.encode_frames([b"two"])
    assert server.receive_data(r2) == []
    assert isinstance(server.failure, BadRecord)
    client, server = _sessions()
    rec = bytearray(client.encode_frames([b"payload"]))
    rec[5] ^= 0x40
    assert server.receive_data(bytes(rec)) == []
    assert isinstance(server.failure, BadRecord)


def test_oversize_frame_header_fails_before_the_body_arrives() -> None:
    client, server = _sessions(client_max=MAX_FRAME_BYTES + 10)
    wire = client.encode_frames([b"z" * (MAX_FRAME_BYTES + 1)])
    first_record = wire[: 2 + 65535]
    assert server.receive_data(first_record) == []
    assert isinstance(server.failure, FrameTooLarge)


def test_local_oversize_frame_is_refused() -> None:
    client, _ = _sessions()
    with pytest.raises(InvalidArgument):
        client.encode_frames([b"z" * (MAX_FRAME_BYTES + 1)])


def test_data_before_accept_and_unknown_items_are_decode_errors() -> None:
    c, s = _pair()
    m2 = s.receive(c.initiate())
    assert m2 is not None
    m3 = c.receive(m2)
    assert m3 is not None
    s.receive(m3)
    rc, rs = c.result(), s.result()
    client = FrameSession(rc.send, rc.recv, initiator=True)
    server = FrameSession(rs.send, rs.recv, initiator=False)
    assert client.receive_data(server.encode_frames([b"early"])) == []
    assert type(client.failure) is DecodeError


def test_close_item_carries_its_code() -> None:
    client, server = _sessions()
    wire = client.encode_frames([b"last"]) + client.encode_close("unknown_peer")
    assert server.receive_data(wire) == [b"last"]
    assert server.peer_close == "unknown_peer" and server.failure is None


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=2000))
def test_garbage_never_raises_from_receive_data(garbage: bytes) -> None:
    _, server = _sessions()
    assert server.receive_data(garbage) == []
    assert server.failure is None or isinstance(server.failure, (DecodeError, BadRecord))


def test_record_plaintext_limit_matches_noise() -> None:
    assert MAX_RECORD_PLAINTEXT + 16 == 65535


def test_encode_frame_is_encode_frames_of_one() -> None:
    client, server = _sessions()
    for frame in (b"", b"x", b"y" * 70_000, b"z" * MAX_FRAME_BYTES):
        assert server.receive_data(client.encode_frame(frame)) == [frame]
    with pytest.raises(InvalidArgument):
        client.encode_frame(b"z" * (MAX_FRAME_BYTES + 1))
    assert server.failure is None
