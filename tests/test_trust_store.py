"""Trust store files and invite tokens (real Ed25519, real files)."""

from __future__ import annotations

import base64
import os
import stat
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hivemesh.core.codec import pack, unpack
from hivemesh.core.identity import Identity
from hivemesh.errors import (
    InvalidAddress,
    InvalidArgument,
    InviteBadSignature,
    InviteError,
    InviteExpired,
    InviteMalformed,
    InviteNonCanonical,
    InviteRevoked,
    InviteUnknown,
    InviteUsed,
    StoreCorrupt,
)
from hivemesh.trust import (
    INVITE_MEMORY_S,
    INVITE_PREFIX,
    MAX_INVITE_RECORDS,
    TrustStore,
    accept_invite,
    is_swarm_id,
    join_proof,
    make_invite,
)

ALICE = Identity.from_seed(b"a" * 32)
BOB = Identity.from_seed(b"b" * 32)
EVE = Identity.from_seed(b"e" * 32)
NONCE = bytes(range(16))
EPS = ["127.0.0.1:7001", "[::1]:7001"]


def test_invite_round_trip() -> None:
    token = make_invite(ALICE, EPS, 600, 1000, NONCE)
    assert token.startswith(INVITE_PREFIX) and len(token) < 300
    assert "=" not in token and "+" not in token and "/" not in token
    inv = accept_invite(token, 1599)
    assert (inv.inviter, inv.endpoints, inv.expires_s, inv.nonce) == (
        ALICE.address,
        tuple(EPS),
        1600,
        NONCE,
    )


def test_invite_expired() -> None:
    token = make_invite(ALICE, EPS, 600, 1000, NONCE)
    with pytest.raises(InviteExpired):
        accept_invite(token, 1600)


def _tamper(token: str, index: int, value: object) -> str:
    body = token[len(INVITE_PREFIX) :]
    obj = unpack(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    obj[index] = value
    return INVITE_PREFIX + base64.urlsafe_b64encode(pack(obj)).decode().rstrip("=")


@pytest.mark.parametrize(
    ("index", "value"),
    [(2, ["10.0.0.66:1"]), (3, 10**9), (4, bytes(16)), (1, EVE.public)],
)
def test_tampered_invite_fails_signature(index: int, value: object) -> None:
    token = make_invite(ALICE, EPS, 600, 1000, NONCE)
    with pytest.raises(InviteBadSignature):
        accept_invite(_tamper(token, index, value), 1000)


@pytest.mark.parametrize(
    "token",
    ["", "hello", INVITE_PREFIX, INVITE_PREFIX + "!!!", INVITE_PREFIX + "kQ", "hmi1" + "A" * 5000],
)
def test_malformed_invites(token: str) -> None:
    with pytest.raises(InviteMalformed):
        accept_invite(token, 0)


def test_malformed_fields() -> None:
    token = make_invite(ALICE, EPS, 600, 1000, NONCE)
    for index, value in [(2, "not a list"), (4, b"short"), (5, 7), (0, 2)]:
        with pytest.raises(InviteMalformed):
            accept_invite(_tamper(token, index, value), 1000)


def _body(token: str) -> bytes:
    body = token[len(INVITE_PREFIX) :]
    return base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))


def _token(raw: bytes) -> str:
    return INVITE_PREFIX + base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _token_with(chars: str) -> str:
    """A valid token whose base64 body contains one of ``chars`` (nonce search)."""
    for i in range(256):
        token = make_invite(ALICE, EPS, 600, 1000, bytes([i]) * 16)
        if any(c in token[len(INVITE_PREFIX) :] for c in chars):
            return token
    raise AssertionError("no such token")  # pragma: no cover


def _widen_first(raw: bytes, old: bytes, new: bytes) -> bytes:
    """``raw`` with its first ``old`` msgpack prefix re-encoded as the wider ``new``."""
    at = raw.index(old)
    return raw[:at] + new + raw[at + len(old) :]


def _non_canonical_tokens() -> dict[str, str]:
    token = make_invite(ALICE, EPS, 600, 1000, NONCE)
    body = token[len(INVITE_PREFIX) :]
    raw = _body(token)
    assert raw[:2] == b"\x96\x01"  # [1, ...] as fixarray + positive fixint
    # a token whose body does not fill its last base64 character (needs padding)
    ragged = make_invite(ALICE, [*EPS, "h:1"], 600, 1000, NONCE)
    ragged_body = ragged[len(INVITE_PREFIX) :]
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    unused = {2: 0b1111, 3: 0b11}[len(ragged_body) % 4]
    last = alphabet[alphabet.index(ragged_body[-1]) | unused]
    std = _token_with("-_")
    ep = EPS[0].encode()
    return {
        "padding": ragged + "=" * (-len(ragged_body) % 4),
        "standard alphabet": std.replace("-", "+").replace("_", "/"),
        "unused bits": ragged[:-1] + last,
        "uint8 for a fixint": _token(b"\x96\xcc\x01" + raw[2:]),
        "str8 for a fixstr": _token(
            _widen_first(raw, bytes([0xA0 | len(ep)]) + ep, bytes([0xD9, len(ep)]) + ep)
        ),
        "bin16 for a bin8": _token(_widen_first(raw, b"\xc4\x10" + NONCE, b"\xc5\x00\x10" + NONCE)),
        "array16 for a fixarray": _token(b"\xdc\x00\x06" + raw[1:]),
        "trailing bytes": _token(raw + b"\x00"),
        "whitespace around": f" {token}\n",
        "whitespace inside": token[:20] + " " + token[20:],
        "upper-case prefix": token.upper()[:4] + body,
        "other case in the body": INVITE_PREFIX + body.swapcase(),
    }


@pytest.mark.parametrize("name", sorted(_non_canonical_tokens()))
def test_only_the_canonical_encoding_of_a_token_is_accepted(name: str) -> None:
    """Another spelling of a valid token is refused with a typed error."""
    canonical = make_invite(ALICE, EPS, 600, 1000, NONCE)
    assert accept_invite(canonical, 1000).nonce == NONCE
    variant = _non_canonical_tokens()[name]
    assert variant != canonical
    with pytest.raises(InviteMalformed) as info:  # InviteNonCanonical is one
        accept_invite(variant, 1000)
    assert info.value.code in ("invite_noncanonical", "invite_malformed", "invite_bad_signature")


@pytest.mark.parametrize(
    "name",
    [
        "padding",
        "standard alphabet",
        "unused bits",
        "uint8 for a fixint",
        "str8 for a fixstr",
        "bin16 for a bin8",
        "array16 for a fixarray",
        "whitespace around",
        "whitespace inside",
    ],
)
def test_a_decodable_other_encoding_is_named_non_canonical(name: str) -> None:
    """These decode to the very same signed invite, so only the encoding check
    can refuse them (a signature check cannot)."""
    with pytest.raises(InviteNonCanonical):
        accept_invite(_non_canonical_tokens()[name], 1000)


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.text(max_size=300),
        st.binary(max_size=200).map(_token),
        st.text(
            alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_=+/ "
        ).map(lambda t: INVITE_PREFIX + t),
    )
)
def test_garbage_tokens_only_raise_invite_errors(token: str) -> None:
    with pytest.raises(InviteError):
        accept_invite(token, 1000)


def test_make_invite_arguments() -> None:
    with pytest.raises(InvalidArgument):
        make_invite(ALICE, EPS, 600, 0, b"short")
    with pytest.raises(InvalidArgument):
        make_invite(ALICE, EPS, 0, 0, NONCE)
    with pytest.raises(InvalidArgument):
        make_invite(ALICE, ["no-port"], 10, 0, NONCE)


def test_store_is_private_and_atomic(tmp_path: Path) -> None:
    store = TrustStore(tmp_path)
    assert not store.is_trusted(BOB.address)
    store.add(BOB.address, 5)
    assert store.is_trusted(BOB.address)
    mode = stat.S_IMODE(os.stat(tmp_path / "trust.json").st_mode)
    assert mode == 0o600
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
    assert TrustStore(tmp_path).trusted() == [BOB.address]
    with pytest.raises(InvalidAddress):
        store.add("hmbogus", 5)


def test_revoke_wins_and_other_processes_see_it(tmp_path: Path) -> None:
    daemon = TrustStore(tmp_path)
    cli = TrustStore(tmp_path)
    gen = daemon.poll()
    assert daemon.poll() == gen  # nothing changed
    cli.add(BOB.address, 1)
    assert daemon.poll() > gen
    assert daemon.is_trusted(BOB.address)  # picked up without restart
    assert daemon.trusts_author(BOB.public)
    cli.revoke(BOB.address, 2)
    assert not daemon.is_trusted(BOB.address)
    assert not daemon.trusts_author(BOB.public)
    assert daemon.revoked() == [BOB.address]
    cli.add(BOB.address, 3)  # explicit re-trust lifts it
    assert daemon.is_trusted(BOB.address) and daemon.revoked() == []


def test_join_flow_trusts_the_joiner_once(tmp_path: Path) -> None:
    alice = TrustStore(tmp_path / "alice")
    token = alice.issue_invite(ALICE, EPS, 600, 1000)
    assert alice.pending_invites(1000) == 1
    invite = accept_invite(token, 1001)
    assert invite.inviter == ALICE.address and invite.endpoints == tuple(EPS)
    proof = join_proof(invite, BOB.address)
    assert not alice.is_trusted(BOB.address)
    assert alice.redeem(BOB.address, proof, 1002)[0] is True
    assert alice.is_trusted(BOB.address) and alice.pending_invites(1002) == 0
    # Bob again (his admission was lost on the way): answered, nothing consumed,
    # and nothing written (a peer re-sending its proof cannot make us fsync)
    before = os.stat(tmp_path / "alice" / "trust.json")
    assert alice.redeem(BOB.address, proof, 1003)[0] is False
    after = os.stat(tmp_path / "alice" / "trust.json")
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    # Single use: Eve cannot use it, and learns why
    with pytest.raises(InviteUsed):
        alice.redeem(EVE.address, join_proof(invite, EVE.address), 1003)
    assert not alice.is_trusted(EVE.address)


def test_refusals_name_their_cause(tmp_path: Path) -> None:
    alice = TrustStore(tmp_path)
    invite = accept_invite(alice.issue_invite(ALICE, EPS, 600, 1000), 1000)
    with pytest.raises(InviteUnknown):  # Bob's proof presented by Eve's connection
        alice.redeem(EVE.address, join_proof(invite, BOB.address), 1001)
    with pytest.raises(InviteExpired):
        alice.redeem(BOB.address, join_proof(invite, BOB.address), 1600)
    foreign = accept_invite(make_invite(ALICE, EPS, 600, 1000, NONCE), 1000)  # never issued
    with pytest.raises(InviteUnknown):
        alice.redeem(BOB.address, join_proof(foreign, BOB.address), 1001)
    assert not alice.is_trusted(BOB.address) and not alice.is_trusted(EVE.address)
    assert alice.remembered_invites(1001) == 1
    assert alice.remembered_invites(1600 + INVITE_MEMORY_S) == 0  # forgotten, even unpruned


def test_used_and_expired_invites_are_remembered_for_a_while(tmp_path: Path) -> None:
    alice = TrustStore(tmp_path)
    invite = accept_invite(alice.issue_invite(ALICE, EPS, 600, 1000), 1000)
    alice.redeem(BOB.address, join_proof(invite, BOB.address), 1001)
    late = 1600 + INVITE_MEMORY_S - 1
    with pytest.raises(InviteUsed):  # still known as used, long after it expired
        alice.redeem(EVE.address, join_proof(invite, EVE.address), late)
    alice.issue_invite(ALICE, EPS, 600, late + 1)  # prunes the forgotten ones
    assert alice.remembered_invites(late + 2) == 1
    with pytest.raises(InviteUnknown):
        alice.redeem(EVE.address, join_proof(invite, EVE.address), late + 2)


def test_invite_records_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert MAX_INVITE_RECORDS == 1024
    monkeypatch.setattr("hivemesh.trust.MAX_INVITE_RECORDS", 8)
    alice = TrustStore(tmp_path)
    for i in range(12):
        alice.issue_invite(ALICE, EPS, 600 + i, 1000, i.to_bytes(16, "big"))
    assert alice.remembered_invites(1000) == 8  # the 4 that expire first are forgotten
    last = accept_invite(alice.issue_invite(ALICE, EPS, 9999, 1000, bytes([255]) * 16), 1000)
    assert alice.redeem(BOB.address, join_proof(last, BOB.address), 1001)


def test_revoked_cannot_redeem(tmp_path: Path) -> None:
    alice = TrustStore(tmp_path)
    token = alice.issue_invite(ALICE, EPS, 600, 1000)
    alice.revoke(EVE.address, 1000)
    with pytest.raises(InviteRevoked):
        alice.redeem(EVE.address, join_proof(accept_invite(token, 1000), EVE.address), 1001)
    assert alice.pending_invites(1001) == 1


def test_swarms_founded_joined_and_named_in_invites(tmp_path: Path) -> None:
    alice = TrustStore(tmp_path / "alice")
    assert alice.swarms() == []
    token = alice.issue_invite(ALICE, EPS, 600, 1000)  # founds alice's home swarm
    (home,) = alice.swarms()
    assert is_swarm_id(home) and alice.home_swarm(1001) == home
    new, swarm = alice.redeem(BOB.address, join_proof(accept_invite(token, 1000), BOB.address), 1)
    assert new and swarm == home
    other = "0" * 32
    alice.join_swarm(other, EVE.address, 2000)  # alice joins Eve's swarm too
    assert alice.swarms() == [home, other]  # the home swarm stays first
    token = alice.issue_invite(ALICE, EPS, 600, 2000, swarm=other)
    eve_proof = join_proof(accept_invite(token, 2000), EVE.address)
    assert alice.redeem(EVE.address, eve_proof, 2001) == (True, other)
    with pytest.raises(InvalidArgument):
        alice.issue_invite(ALICE, EPS, 600, 2000, swarm="f" * 32)  # not alice's
    with pytest.raises(InvalidArgument):
        alice.join_swarm("not-an-id", EVE.address, 2000)


def test_a_trust_file_without_swarms_still_loads(tmp_path: Path) -> None:
    (tmp_path / "trust.json").write_text(
        '{"version": 1, "trusted": {}, "revoked": {}, "invites": {}}'
    )
    assert TrustStore(tmp_path).swarms() == []
    (tmp_path / "trust.json").write_text(
        '{"version": 1, "trusted": {}, "revoked": {}, "invites": {}, "swarms": {"x": {}}}'
    )
    with pytest.raises(StoreCorrupt):
        TrustStore(tmp_path)


def test_corrupt_file_is_a_typed_error(tmp_path: Path) -> None:
    (tmp_path / "trust.json").write_text("{not json")
    with pytest.raises(StoreCorrupt):
        TrustStore(tmp_path)
    (tmp_path / "trust.json").write_text('{"version": 2}')
    with pytest.raises(StoreCorrupt):
        TrustStore(tmp_path)


def test_throttled_queries_see_edits_after_poll(tmp_path: Path) -> None:
    """A daemon throttles the per-query stat; poll() (its timer) still looks."""
    daemon = TrustStore(tmp_path)
    daemon.min_refresh_s = 3600.0
    cli = TrustStore(tmp_path)
    assert not daemon.is_trusted(BOB.address)
    cli.add(BOB.address, 1)
    assert not daemon.is_trusted(BOB.address)  # not looked at the file yet
    daemon.poll()
    assert daemon.is_trusted(BOB.address)
    daemon.revoke(BOB.address, 2)  # our own edits are seen at once
    assert daemon.is_revoked(BOB.address)
