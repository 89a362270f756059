"""Identity signing (libsodium) agrees with an independent Ed25519 (OpenSSL)."""

from __future__ import annotations

from cryptography.exceptions import InvalidSignature
from hypothesis import given, settings
from hypothesis import strategies as st

from hivemesh.core.identity import Identity, verify


@settings(max_examples=50, deadline=None)
@given(seed=st.binary(min_size=32, max_size=32), message=st.binary(max_size=300))
def test_signatures_match_openssl_and_verify_both_ways(seed: bytes, message: bytes) -> None:
    ident = Identity.from_seed(seed)
    sig = ident.sign(message)
    assert sig == ident.private_key.sign(message)  # Ed25519 is deterministic
    ident.private_key.public_key().verify(sig, message)  # OpenSSL accepts ours
    assert verify(ident.public, sig, message)


@settings(max_examples=50, deadline=None)
@given(seed=st.binary(min_size=32, max_size=32), message=st.binary(min_size=1, max_size=100),
       flip=st.integers(min_value=0, max_value=8 * 64 - 1))  # fmt: skip
def test_a_flipped_signature_bit_is_refused(seed: bytes, message: bytes, flip: int) -> None:
    ident = Identity.from_seed(seed)
    sig = bytearray(ident.sign(message))
    sig[flip // 8] ^= 1 << (flip % 8)
    assert not verify(ident.public, bytes(sig), message)
    try:
        ident.private_key.public_key().verify(bytes(sig), message)
        openssl_ok = True
    except InvalidSignature:
        openssl_ok = False
    assert not openssl_ok


def test_malformed_inputs_are_refused_not_raised() -> None:
    ident = Identity.from_seed(b"\x07" * 32)
    sig = ident.sign(b"m")
    assert not verify(ident.public, sig[:63], b"m")
    assert not verify(ident.public[:31], sig, b"m")
    assert not verify(b"\x00" * 32, sig, b"m")  # a small-order key
