"""The STUN Binding client's codec and transaction (hivemesh.transports.stun), sans-IO."""

from __future__ import annotations

import contextlib
import pathlib
import struct
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hivemesh.config import load_config
from hivemesh.errors import ConfigError, InvalidArgument, StunMalformed, StunMismatch
from hivemesh.transports.stun import (
    BINDING_ERROR,
    BINDING_REQUEST,
    BINDING_SUCCESS,
    FINGERPRINT,
    MAGIC_COOKIE,
    MAPPED_ADDRESS,
    MAX_MESSAGE,
    XOR_MAPPED_ADDRESS,
    BindingTransaction,
    Transactions,
    binding_request,
    decode,
    encode,
    encode_address,
    is_stun,
    parse_binding_response,
)

TXID = bytes(range(1, 13))

# RFC 5769, 2.2: "Sample IPv4 Response" (SOFTWARE, XOR-MAPPED-ADDRESS,
# MESSAGE-INTEGRITY, FINGERPRINT), mapped address 192.0.2.1:32853.
RFC5769_TXID = bytes.fromhex("b7e7a701bc34d686fa87dfae")
RFC5769_IPV4 = bytes.fromhex(
    "0101003c2112a442b7e7a701bc34d686fa87dfae"
    "8022000b7465737420766563746f7220"
    "002000080001a147e112a643"
    "000800142b91f599fd9e90c38c7489f92af9ba53f06be7d7"
    "80280004c07d4c96"
)


def _success(*attrs: tuple[int, bytes], txid: bytes = TXID, fingerprint: bool = True) -> bytes:
    return encode(BINDING_SUCCESS, txid, attrs, fingerprint=fingerprint)


def test_the_rfc5769_ipv4_response_decodes() -> None:
    assert is_stun(RFC5769_IPV4)
    assert parse_binding_response(RFC5769_IPV4, RFC5769_TXID) == ("192.0.2.1", 32853)


def test_a_binding_request_is_20_bytes_and_a_fingerprint() -> None:
    req = binding_request(TXID)
    assert len(req) == 28 and is_stun(req)
    msg_type, length, cookie = struct.unpack_from("!HHI", req)
    assert (msg_type, length, cookie) == (BINDING_REQUEST, 8, MAGIC_COOKIE)
    assert req[8:20] == TXID
    msg = decode(req)  # its FINGERPRINT verifies
    assert [t for t, _ in msg.attributes] == [FINGERPRINT]
    assert binding_request(TXID, fingerprint=False) == req[:2] + b"\0\0" + req[4:20]
    with pytest.raises(InvalidArgument):
        binding_request(b"short")


@pytest.mark.parametrize(
    ("host", "port"), [("203.0.113.7", 40001), ("2001:db8::1", 3478), ("10.0.0.1", 65535)]
)
def test_xor_and_plain_mapped_addresses_round_trip(host: str, port: int) -> None:
    xored = _success((XOR_MAPPED_ADDRESS, encode_address(XOR_MAPPED_ADDRESS, host, port, TXID)))
    assert parse_binding_response(xored, TXID) == (host, port)
    plain = _success((MAPPED_ADDRESS, encode_address(MAPPED_ADDRESS, host, port, TXID)))
    assert parse_binding_response(plain, TXID) == (host, port)


def test_xor_mapped_wins_over_mapped_and_unknown_optional_attributes_pass() -> None:
    msg = _success(
        (0x8022, b"some server"),  # SOFTWARE: comprehension-optional
        (MAPPED_ADDRESS, encode_address(MAPPED_ADDRESS, "10.0.0.9", 9, TXID)),
        (0x0005, b"\0\x01\x00\x09\x0a\x00\x00\x09"),  # RFC 3489 CHANGED-ADDRESS: ignored
        (XOR_MAPPED_ADDRESS, encode_address(XOR_MAPPED_ADDRESS, "198.51.100.2", 7420, TXID)),
    )
    assert parse_binding_response(msg, TXID) == ("198.51.100.2", 7420)


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"", "shorter"),
        (binding_request(TXID)[:19], "shorter"),
        (b"\x40" + binding_request(TXID)[1:], "leading bits"),
        (binding_request(TXID)[:4] + b"\0\0\0\0" + binding_request(TXID)[8:], "cookie"),
        (binding_request(TXID) + b"\0\0\0\0", "does not fit"),  # length says 8, 12 follow
        (struct.pack("!HHI", BINDING_SUCCESS, 2, MAGIC_COOKIE) + TXID + b"ab", "does not fit"),
        (encode(BINDING_SUCCESS, TXID, ((0x8022, b"ab"),))[:-1], "does not fit"),
        (bytes(20 + MAX_MESSAGE), "over"),
    ],
)
def test_broken_framing_is_malformed(data: bytes, why: str) -> None:
    with pytest.raises(StunMalformed, match=why):
        decode(data)


def test_attribute_bounds_fingerprint_and_order_are_checked() -> None:
    def framed(body: bytes) -> bytes:
        return struct.pack("!HHI", BINDING_SUCCESS, len(body), MAGIC_COOKIE) + TXID + body

    with pytest.raises(StunMalformed, match="runs past"):
        decode(framed(struct.pack("!HH", 0x8022, 9) + b"12345678"))
    good = _success((0x8022, b"x"))
    with pytest.raises(StunMalformed, match="FINGERPRINT does not match"):
        decode(good[:-1] + bytes([good[-1] ^ 1]))
    # a valid FINGERPRINT (over a header whose length counts what follows), then more
    soft = struct.pack("!HH", 0x8022, 4) + b"abcd"
    head = struct.pack("!HHI", BINDING_SUCCESS, 8 + 8 + 4, MAGIC_COOKIE) + TXID + soft
    crc = (zlib.crc32(head) ^ 0x5354554E) & 0xFFFFFFFF
    with pytest.raises(StunMalformed, match="after FINGERPRINT"):
        decode(head + struct.pack("!HHI", FINGERPRINT, 4, crc) + struct.pack("!HH", 0x8022, 0))
    with pytest.raises(StunMalformed, match="4 bytes"):
        decode(framed(struct.pack("!HH", FINGERPRINT, 8) + bytes(8)))


def test_bad_addresses_are_malformed() -> None:
    for value in (
        b"\0\x01\x12",  # truncated
        b"\0\x03\x00\x01" + bytes(4),  # family 3
        b"\0\x01\x00\x01" + bytes(16),  # IPv4 with 16 bytes
        b"\0\x02\x00\x01" + bytes(4),  # IPv6 with 4 bytes
        b"\0\x01\x00\x00" + bytes([10, 0, 0, 1]),  # port 0
    ):
        with pytest.raises(StunMalformed):
            parse_binding_response(_success((MAPPED_ADDRESS, value)), TXID)


def test_answers_that_are_not_ours_are_mismatches() -> None:
    addr = (XOR_MAPPED_ADDRESS, encode_address(XOR_MAPPED_ADDRESS, "192.0.2.1", 1, TXID))
    with pytest.raises(StunMismatch, match="another transaction"):
        parse_binding_response(_success(addr), bytes(12))
    with pytest.raises(StunMismatch, match="no Binding success"):
        parse_binding_response(encode(BINDING_REQUEST, TXID, (addr,)), TXID)
    refused = encode(BINDING_ERROR, TXID, ((0x0009, b"\0\0\x04\x00Bad Request"),))
    with pytest.raises(StunMismatch, match="refused: 400 Bad Request"):
        parse_binding_response(refused, TXID)
    with pytest.raises(StunMismatch, match="without a mapped address"):
        parse_binding_response(_success((0x8022, b"x")), TXID)
    with pytest.raises(StunMismatch, match="comprehension-required"):
        parse_binding_response(_success(addr, (0x0042, b"????")), TXID)


def test_a_transaction_retransmits_with_backoff_then_times_out() -> None:
    tx = BindingTransaction(TXID, 100.0, rto_s=0.5, max_sends=4, timeout_s=5.0)
    sent_at = []
    now = 100.0
    while not tx.done:
        if tx.datagrams_to_send(now):
            sent_at.append(now)
        tx.handle_timer(now)
        wake = tx.next_deadline()
        assert wake is None or wake >= now
        now = wake if wake is not None else now
    assert sent_at == [100.0, 100.5, 101.5, 103.5]
    assert tx.timed_out and tx.mapped is None and now == 105.0
    assert tx.next_deadline() is None and tx.datagrams_to_send(200.0) == []


def test_a_transaction_survives_garbage_and_ends_on_its_answer() -> None:
    tx = BindingTransaction(TXID, 0.0)
    assert tx.datagrams_to_send(0.0) == [tx.request]
    assert tx.datagrams_to_send(0.1) == []  # not yet due
    for bad, err in ((b"junk", StunMalformed), (_success(), StunMismatch)):
        with pytest.raises(err):
            tx.receive(bad)
        assert not tx.done
    answer = _success(
        (XOR_MAPPED_ADDRESS, encode_address(XOR_MAPPED_ADDRESS, "203.0.113.9", 4242, TXID))
    )
    assert tx.receive(answer) == ("203.0.113.9", 4242)
    assert tx.done and tx.mapped == ("203.0.113.9", 4242)
    with pytest.raises(StunMismatch, match="finished"):
        tx.receive(answer)


def test_transactions_match_an_answer_by_id_and_server_and_know_late_ones() -> None:
    txs, server = Transactions(late=1), ("198.51.100.7", 3478)
    tx = BindingTransaction(TXID, 0.0)
    txs.open(tx, server)
    answer = _success(
        (XOR_MAPPED_ADDRESS, encode_address(XOR_MAPPED_ADDRESS, "203.0.113.9", 4242, TXID))
    )
    other = _success(txid=bytes(12))
    with pytest.raises(StunMismatch, match="answers nothing"):
        txs.receive(other, server)
    with pytest.raises(StunMismatch, match="not the server"):
        txs.receive(answer, ("198.51.100.8", 3478))
    assert not tx.done
    assert txs.receive(answer, server) is tx and tx.mapped == ("203.0.113.9", 4242)
    txs.close(tx)
    assert txs.receive(answer, server) is None  # late: a retransmission's answer
    second = BindingTransaction(bytes(12), 0.0)
    txs.open(second, server)
    txs.close(second)  # pushes the first out of the late window
    with pytest.raises(StunMismatch, match="answers nothing"):
        txs.receive(answer, server)


@given(st.binary(max_size=300))
def test_garbage_gives_only_typed_errors(data: bytes) -> None:
    with contextlib.suppress(StunMalformed, StunMismatch):
        parse_binding_response(data, TXID)
    with contextlib.suppress(StunMalformed, StunMismatch):  # behind a valid header
        parse_binding_response(binding_request(TXID, fingerprint=False)[:20] + data, TXID)


@given(
    st.lists(st.tuples(st.integers(0, 0xFFFF), st.binary(max_size=40)), max_size=6),
    st.booleans(),
    st.integers(0, 0x3FFF),
    st.data(),
)
def test_framed_garbage_and_mutations_give_only_typed_errors(
    attrs: list[tuple[int, bytes]], fingerprint: bool, msg_type: int, data: st.DataObject
) -> None:
    """Well-framed messages with random attributes, then random byte flips."""
    msg = encode(msg_type, TXID, tuple(attrs), fingerprint=fingerprint)
    flips = data.draw(st.lists(st.tuples(st.integers(0, len(msg) - 1), st.integers(1, 255))))
    mutated = bytearray(msg)
    for i, x in flips:
        mutated[i] ^= x
    for candidate in (msg, bytes(mutated)):
        try:
            host, port = parse_binding_response(candidate, TXID)
        except (StunMalformed, StunMismatch):
            continue
        assert 0 < port < 65536 and host


def test_the_stun_setting_is_empty_by_default_and_checked(tmp_path: pathlib.Path) -> None:
    assert load_config(tmp_path, environ={}).stun == ()
    cfg = load_config(tmp_path, environ={"HIVEMESH_STUN": "stun.example:3478, 192.0.2.1:19302"})
    assert cfg.stun == ("stun.example:3478", "192.0.2.1:19302")
    (tmp_path / "config.toml").write_text('[network]\nstun = ["[2001:db8::1]:3478"]\n')
    assert load_config(tmp_path, environ={}).stun == ("[2001:db8::1]:3478",)
    for bad in ("no-port", "host:0", ",".join(f"h{i}:3478" for i in range(9))):
        with pytest.raises(ConfigError):
            load_config(tmp_path, environ={"HIVEMESH_STUN": bad})
