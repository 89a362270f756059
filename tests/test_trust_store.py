"""Trust store files and invite tokens (real Ed25519, real files)."""

from __future__ import annotations

import base64
import os
import stat
from pathlib import Path

import pytest

from hivemesh.core.codec import pack, unpack
from hivemesh.core.identity import Identity
from hivemesh.errors import (
    InvalidAddress,
    InvalidArgument,
    InviteBadSignature,
    InviteError,
    InviteExpired,
    InviteMalformed,
    InviteUsed,
    StoreCorrupt,
)
from hivemesh.trust import INVITE_PREFIX, TrustStore, accept_invite, join_proof, make_invite

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


def test_join_flow_trusts_both_ways(tmp_path: Path) -> None:
    alice = TrustStore(tmp_path / "alice")
    bob = TrustStore(tmp_path / "bob")
    token = alice.issue_invite(ALICE, EPS, 600, 1000)
    assert alice.pending_invites(1000) == 1
    invite = bob.accept(token, 1001)
    assert bob.is_trusted(ALICE.address) and invite.endpoints == tuple(EPS)
    proof = join_proof(invite, BOB.address)
    assert not alice.is_trusted(BOB.address)
    alice.redeem(BOB.address, proof, 1002)
    assert alice.is_trusted(BOB.address) and alice.pending_invites(1002) == 0
    # Single use: a second redemption (say by Eve with Bob's stolen proof) fails.
    with pytest.raises(InviteUsed):
        alice.redeem(BOB.address, proof, 1003)


def test_proof_is_bound_to_the_joiner_and_expires(tmp_path: Path) -> None:
    alice = TrustStore(tmp_path)
    token = alice.issue_invite(ALICE, EPS, 600, 1000)
    invite = accept_invite(token, 1000)
    with pytest.raises(InviteUsed):  # Bob's proof presented by Eve's connection
        alice.redeem(EVE.address, join_proof(invite, BOB.address), 1001)
    with pytest.raises(InviteUsed):  # expired
        alice.redeem(BOB.address, join_proof(invite, BOB.address), 1600)
    assert not alice.is_trusted(BOB.address) and not alice.is_trusted(EVE.address)


def test_revoked_cannot_redeem(tmp_path: Path) -> None:
    alice = TrustStore(tmp_path)
    token = alice.issue_invite(ALICE, EPS, 600, 1000)
    alice.revoke(EVE.address, 1000)
    with pytest.raises(InviteError):
        alice.redeem(EVE.address, join_proof(accept_invite(token, 1000), EVE.address), 1001)
    assert alice.pending_invites(1001) == 1


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
