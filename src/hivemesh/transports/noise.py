"""Noise_XX_25519_AESGCM_SHA256 with identity-bound static keys, sans-IO.

Theory of operation
-------------------
This module implements the Noise Protocol Framework (revision 34) for exactly
one pattern, ``Noise_XX_25519_AESGCM_SHA256``, on top of ``cryptography``'s
X25519 and AES-GCM and the standard library's (OpenSSL-backed) SHA-256/HMAC.
Nothing here touches a socket, a clock or global randomness: bytes go in,
bytes come out, and the ephemeral/static key material comes from a
``random_bytes(n)`` callable the caller passes (``secrets.token_bytes`` in
production, a seeded source in tests).

XX gives mutual authentication and forward secrecy in three messages::

    -> e
    <- e, ee, s, es      payload: responder identity proof
    -> s, se             payload: initiator identity proof

Noise authenticates *static X25519 keys*; hivemesh nodes are *Ed25519
identities*. As libp2p's Noise handshake does, each side sends in its
(encrypted) handshake payload its Ed25519 public key and a signature by that
identity over ``b"hivemesh-noise-static-key:" + static_x25519_public +
boot_id``. The receiver checks the signature against the static key the
handshake just authenticated, so the channel is bound to
``address_of(identity_public)``.

The **boot id** is 16 random bytes drawn once per node start (one process
life; ``secrets`` in production). A peer whose boot id changed has restarted,
so a link still open to its previous life is half-open and can be replaced at
once (:mod:`hivemesh.runtime.connections`), without waiting for a failure
detector. The identity signs it together with the static key, and the payload
is part of the handshake transcript (its ciphertext is mixed into the
handshake hash), so it can be neither forged nor moved onto another session.

Payload layout, version 2 (113 bytes)::

    version (1, = 2) || ed25519_pub (32) || boot_id (16) || sig (64)

Message 1 carries no payload, so it is exactly 32 bytes; messages 2 and 3 have
fixed sizes too (:data:`MESSAGE_BYTES`), which lets a listener reject garbage
before doing any work. The one other size accepted is that of a version-1
payload (97 bytes, no boot id; hivemesh before boot ids): such a message is
authenticated as usual and then refused with
:class:`~hivemesh.errors.UnsupportedHandshake` naming the version, never
misparsed. The prologue is unchanged, so an old peer's messages still
authenticate and the refusal can say why.

Policy is checked inside the handshake, as early as possible: the initiator
checks the responder's address (``expect_address``) and trust
(``authorize``) *before* sending message 3, so it never reveals its own
identity to an impostor; the responder checks trust after message 3.

Guarantees: a completed handshake yields two :class:`CipherState` objects
(send, receive) whose keys only the two proven identities know; an
attacker who later steals either long-term key cannot decrypt recorded
traffic (the ``ee`` DH uses one-shot ephemerals). Failure modes:
:class:`~hivemesh.errors.HandshakeError` (malformed, bad crypto, bad
signature), :class:`~hivemesh.errors.UnsupportedHandshake` (an identity
payload of another version), :class:`~hivemesh.errors.PeerIdentityMismatch`
(a different identity than dialled), :class:`~hivemesh.errors.UnknownPeer` (valid but
untrusted) and :class:`~hivemesh.errors.SelfConnection` (the peer proved our
own identity: we dialled ourselves). A failed handshake object is dead:
every later call raises.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from hivemesh.core.identity import Identity, address_of, public_key_of, verify
from hivemesh.errors import (
    BadRecord,
    HandshakeError,
    HivemeshError,
    InvalidArgument,
    LocalProtocolError,
    PeerIdentityMismatch,
    SelfConnection,
    UnknownPeer,
    UnsupportedHandshake,
)

__all__ = [
    "ACCEPTED_MESSAGE_BYTES",
    "BOOT_ID_BYTES",
    "IDENTITY_PAYLOAD_BYTES",
    "MAX_MESSAGE_BYTES",
    "MESSAGE_BYTES",
    "PROLOGUE",
    "PROTOCOL_NAME",
    "STATIC_KEY_CONTEXT",
    "TAG_BYTES",
    "CipherState",
    "HandshakeResult",
    "HandshakeState",
    "RandomBytes",
    "SecureHandshake",
    "StaticCredentials",
]

PROTOCOL_NAME = b"Noise_XX_25519_AESGCM_SHA256"
#: Mixed into the handshake hash: both sides must speak this exact protocol version.
PROLOGUE = b"hivemesh/noise/1"
#: Noise's hard limit on one message (handshake or transport).
MAX_MESSAGE_BYTES = 65535
TAG_BYTES = 16
DH_BYTES = 32
HASH_BYTES = 32
#: Domain separation for the identity's signature over the Noise static key.
STATIC_KEY_CONTEXT = b"hivemesh-noise-static-key:"
#: Size of a boot id: random, drawn once per node start.
BOOT_ID_BYTES = 16
SIGNATURE_BYTES = 64
PAYLOAD_VERSION = 2
IDENTITY_PAYLOAD_BYTES = 1 + 32 + BOOT_ID_BYTES + SIGNATURE_BYTES
#: Payload sizes of versions this node recognises only to refuse them clearly.
LEGACY_PAYLOAD_BYTES = {1: 1 + 32 + SIGNATURE_BYTES}


def _message_sizes(payload_bytes: int) -> tuple[int, int, int]:
    return (
        DH_BYTES,
        DH_BYTES + (DH_BYTES + TAG_BYTES) + (payload_bytes + TAG_BYTES),
        (DH_BYTES + TAG_BYTES) + (payload_bytes + TAG_BYTES),
    )


#: Exact sizes of the three XX messages as hivemesh uses them.
MESSAGE_BYTES = _message_sizes(IDENTITY_PAYLOAD_BYTES)
#: Every size accepted for each message: ours first, then those of legacy
#: payload versions (read, authenticated, then refused by version).
ACCEPTED_MESSAGE_BYTES: tuple[tuple[int, ...], ...] = tuple(
    tuple(dict.fromkeys(sizes))
    for sizes in zip(
        MESSAGE_BYTES,
        *(_message_sizes(n) for _, n in sorted(LEGACY_PAYLOAD_BYTES.items())),
        strict=True,
    )
)
_MAX_NONCE = 2**64 - 1  # reserved by the spec; never used

#: A source of random bytes: ``random_bytes(n) -> n bytes``.
RandomBytes = Callable[[int], bytes]

#: The XX pattern as data: the tokens of each message, initiator first.
XX_PATTERN: tuple[tuple[str, ...], ...] = (("e",), ("e", "ee", "s", "es"), ("s", "se"))


def _hash(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def _hkdf2(chaining_key: bytes, ikm: bytes) -> tuple[bytes, bytes]:
    """Noise's HKDF with two outputs (HMAC-SHA256)."""
    temp = hmac.digest(chaining_key, ikm, "sha256")
    out1 = hmac.digest(temp, b"\x01", "sha256")
    out2 = hmac.digest(temp, out1 + b"\x02", "sha256")
    return out1, out2


def _raw_public(key: X25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _dh(private: X25519PrivateKey, public: bytes) -> bytes:
    try:
        return private.exchange(X25519PublicKey.from_public_bytes(public))
    except ValueError as exc:  # low-order point: all-zero shared secret
        raise HandshakeError(f"invalid X25519 public key from peer: {exc}") from None


class CipherState:
    """Noise CipherState: an AES-256-GCM key and a 64-bit message counter.

    Nonces are ``0x00000000 || n (64-bit big-endian)``. ``n`` advances on every
    successful message, so a replayed, reordered or dropped record fails
    authentication at the receiver (:class:`~hivemesh.errors.BadRecord`).
    """

    __slots__ = ("_aead", "n")

    def __init__(self, key: bytes | None = None) -> None:
        self._aead: AESGCM | None = None if key is None else AESGCM(key)
        self.n = 0

    @property
    def has_key(self) -> bool:
        """True once a key is set (before that, messages pass in clear)."""
        return self._aead is not None

    def _nonce(self) -> bytes:
        if self.n >= _MAX_NONCE:
            raise LocalProtocolError("Noise nonce exhausted; the connection must be replaced")
        return b"\x00\x00\x00\x00" + self.n.to_bytes(8, "big")

    def encrypt_with_ad(self, ad: bytes | None, plaintext: bytes | memoryview) -> bytes:
        """Encrypt and advance the counter (identity if no key yet)."""
        if self._aead is None:
            return bytes(plaintext)
        out = self._aead.encrypt(self._nonce(), plaintext, ad)
        self.n += 1
        return out

    def decrypt_with_ad(self, ad: bytes | None, ciphertext: bytes | memoryview) -> bytes:
        """Decrypt and advance the counter; :class:`BadRecord` if it does not authenticate."""
        if self._aead is None:
            return bytes(ciphertext)
        try:
            out = self._aead.decrypt(self._nonce(), ciphertext, ad)
        except InvalidTag:
            raise BadRecord(
                f"record {self.n} failed authentication (tampered, replayed, reordered or forged)"
            ) from None
        self.n += 1
        return out


class _SymmetricState:
    __slots__ = ("cipher", "ck", "h")

    def __init__(self) -> None:
        name = PROTOCOL_NAME
        self.h = name.ljust(HASH_BYTES, b"\x00") if len(name) <= HASH_BYTES else _hash(name)
        self.ck = self.h
        self.cipher = CipherState()

    def mix_key(self, ikm: bytes) -> None:
        self.ck, temp_k = _hkdf2(self.ck, ikm)
        self.cipher = CipherState(temp_k)

    def mix_hash(self, data: bytes) -> None:
        self.h = _hash(self.h + data)

    def encrypt_and_hash(self, plaintext: bytes) -> bytes:
        ct = self.cipher.encrypt_with_ad(self.h, plaintext)
        self.mix_hash(ct)
        return ct

    def decrypt_and_hash(self, ciphertext: bytes) -> bytes:
        pt = self.cipher.decrypt_with_ad(self.h, ciphertext)
        self.mix_hash(ciphertext)
        return pt

    def split(self) -> tuple[CipherState, CipherState]:
        k1, k2 = _hkdf2(self.ck, b"")
        return CipherState(k1), CipherState(k2)


class HandshakeState:
    """The bare Noise XX handshake (no identity semantics), per spec section 5.3.

    Call :meth:`write_message` / :meth:`read_message` alternately, starting
    with ``write_message`` on the initiator. After the third message
    :attr:`complete` is true and :meth:`split` gives ``(send, receive)``
    cipher states for this side.
    """

    def __init__(
        self,
        *,
        initiator: bool,
        static_private: bytes,
        random_bytes: RandomBytes,
        prologue: bytes = PROLOGUE,
    ) -> None:
        self.initiator = initiator
        self._s = X25519PrivateKey.from_private_bytes(static_private)
        self.static_public = _raw_public(self._s)
        self._random_bytes = random_bytes
        self._e: X25519PrivateKey | None = None
        self.remote_static: bytes | None = None
        self._re: bytes | None = None
        self._sym = _SymmetricState()
        self._sym.mix_hash(prologue)
        self._turn = 0
        self._ciphers: tuple[CipherState, CipherState] | None = None

    @property
    def complete(self) -> bool:
        """True after the last message was written or read."""
        return self._ciphers is not None

    @property
    def handshake_hash(self) -> bytes:
        """The transcript hash ``h`` (channel binding once complete)."""
        return self._sym.h

    @property
    def message_index(self) -> int:
        """How many handshake messages were written or read so far (0..3)."""
        return self._turn

    def _my_turn_to_write(self) -> bool:
        return (self._turn % 2 == 0) == self.initiator

    def _dh_token(self, token: str) -> bytes:
        e, s = self._e, self._s
        re, rs = self._re, self.remote_static
        if e is None or re is None:
            raise LocalProtocolError("DH before ephemeral keys are known")
        if token == "ee":
            return _dh(e, re)
        # es: initiator's e with responder's s; se: initiator's s with responder's e.
        mine_is_e = (token == "es") == self.initiator
        theirs = rs if (token == "es") == self.initiator else re
        if theirs is None:
            raise LocalProtocolError(f"DH {token} before the remote static key is known")
        return _dh(e if mine_is_e else s, theirs)

    def write_message(self, payload: bytes = b"") -> bytes:
        """Produce the next handshake message carrying ``payload``."""
        if self.complete or not self._my_turn_to_write():
            raise LocalProtocolError("not this side's turn to write a handshake message")
        if len(payload) > MAX_MESSAGE_BYTES - 2 * DH_BYTES - 2 * TAG_BYTES:
            raise InvalidArgument("handshake payload too large for one Noise message")
        out = bytearray()
        for token in XX_PATTERN[self._turn]:
            if token == "e":
                self._e = X25519PrivateKey.from_private_bytes(self._random_bytes(DH_BYTES))
                pub = _raw_public(self._e)
                out += pub
                self._sym.mix_hash(pub)
            elif token == "s":
                out += self._sym.encrypt_and_hash(self.static_public)
            else:
                self._sym.mix_key(self._dh_token(token))
        out += self._sym.encrypt_and_hash(payload)
        self._advance()
        return bytes(out)

    def read_message(self, message: bytes) -> bytes:
        """Consume the peer's next handshake message; return its payload.

        Raises :class:`HandshakeError` if the message is short or does not
        authenticate.
        """
        if self.complete or self._my_turn_to_write():
            raise LocalProtocolError("not this side's turn to read a handshake message")
        if len(message) > MAX_MESSAGE_BYTES:
            raise HandshakeError("handshake message over 65535 bytes")
        message = bytes(message)
        pos = 0
        try:
            for token in XX_PATTERN[self._turn]:
                if token == "e":
                    self._re = message[pos : pos + DH_BYTES]
                    if len(self._re) != DH_BYTES:
                        raise HandshakeError("handshake message truncated (ephemeral key)")
                    pos += DH_BYTES
                    self._sym.mix_hash(self._re)
                elif token == "s":
                    n = DH_BYTES + (TAG_BYTES if self._sym.cipher.has_key else 0)
                    chunk = message[pos : pos + n]
                    if len(chunk) != n:
                        raise HandshakeError("handshake message truncated (static key)")
                    pos += n
                    self.remote_static = self._sym.decrypt_and_hash(chunk)
                else:
                    self._sym.mix_key(self._dh_token(token))
            payload = self._sym.decrypt_and_hash(message[pos:])
        except BadRecord as exc:
            raise HandshakeError(f"handshake message failed authentication: {exc}") from None
        self._advance()
        return payload

    def _advance(self) -> None:
        self._turn += 1
        if self._turn == len(XX_PATTERN):
            c1, c2 = self._sym.split()
            self._ciphers = (c1, c2) if self.initiator else (c2, c1)

    def split(self) -> tuple[CipherState, CipherState]:
        """``(send, receive)`` cipher states for this side, once complete."""
        if self._ciphers is None:
            raise LocalProtocolError("handshake not complete")
        return self._ciphers


@dataclass(frozen=True)
class StaticCredentials:
    """A node's Noise static key, its boot id and its identity's signature over both.

    Generate once per process (or per listener) with :meth:`generate`; the
    signature is reused by every handshake.
    """

    identity: Identity
    static_private: bytes
    static_public: bytes
    payload: bytes
    boot_id: bytes = b""

    @classmethod
    def generate(
        cls, identity: Identity, random_bytes: RandomBytes, *, boot_id: bytes | None = None
    ) -> StaticCredentials:
        """A fresh static X25519 key signed by ``identity`` together with
        ``boot_id`` (:data:`BOOT_ID_BYTES` bytes; drawn from ``random_bytes``
        if not given -- pass the node's own to keep one per node start)."""
        priv = random_bytes(DH_BYTES)
        if boot_id is None:
            boot_id = random_bytes(BOOT_ID_BYTES)
        if len(priv) != DH_BYTES or len(boot_id) != BOOT_ID_BYTES:
            raise InvalidArgument("random_bytes returned the wrong length, or a bad boot id")
        pub = _raw_public(X25519PrivateKey.from_private_bytes(priv))
        sig = identity.sign(STATIC_KEY_CONTEXT + pub + boot_id)
        payload = bytes([PAYLOAD_VERSION]) + identity.public + boot_id + sig
        return cls(identity, priv, pub, payload, boot_id)


def verify_identity_payload(payload: bytes, remote_static: bytes) -> tuple[bytes, str, bytes]:
    """Check a peer's identity proof; return ``(ed25519_public, address, boot_id)``.

    Raises :class:`UnsupportedHandshake` for a payload of another version
    (a version-1 one is recognised by its size) and :class:`HandshakeError`
    on a wrong size or signature.
    """
    size = len(payload)
    version = payload[0] if payload else None
    if size != IDENTITY_PAYLOAD_BYTES or version != PAYLOAD_VERSION:
        known = {n: v for v, n in LEGACY_PAYLOAD_BYTES.items()}
        if size in known and version == known[size]:
            raise UnsupportedHandshake(
                f"the peer speaks identity payload version {version} (an older hivemesh, "
                f"without boot ids); this node speaks version {PAYLOAD_VERSION}: upgrade the peer"
            )
        if size == IDENTITY_PAYLOAD_BYTES:
            raise UnsupportedHandshake(
                f"unsupported identity payload version {version}; this node speaks "
                f"version {PAYLOAD_VERSION}"
            )
        raise HandshakeError(f"identity payload is {size} bytes, want {IDENTITY_PAYLOAD_BYTES}")
    pub = payload[1:33]
    boot_id = payload[33 : 33 + BOOT_ID_BYTES]
    sig = payload[33 + BOOT_ID_BYTES :]
    if not verify(pub, sig, STATIC_KEY_CONTEXT + remote_static + boot_id):
        raise HandshakeError(
            "peer's identity signature over its Noise static key and boot id is invalid"
        )
    return pub, address_of(pub), boot_id


@dataclass(frozen=True)
class HandshakeResult:
    """What a completed, verified handshake yields."""

    peer_public: bytes
    peer_address: str
    send: CipherState
    recv: CipherState
    handshake_hash: bytes
    #: The peer's boot id (new on every start of the peer).
    peer_boot_id: bytes = b""


class SecureHandshake:
    """XX handshake plus identity binding and trust policy, sans-IO.

    Initiator: ``m1 = hs.initiate()``; ``m3 = hs.receive(m2)``; done.
    Responder: ``m2 = hs.receive(m1)``; ``hs.receive(m3)`` returns ``None``; done.
    Then :meth:`result`. Messages are exactly :data:`MESSAGE_BYTES` long.
    """

    def __init__(
        self,
        credentials: StaticCredentials,
        *,
        initiator: bool,
        random_bytes: RandomBytes,
        authorize: Callable[[str], bool],
        expect_address: str | None = None,
        prologue: bytes = PROLOGUE,
    ) -> None:
        if expect_address is not None and not initiator:
            raise InvalidArgument("only the dialling side can expect an address")
        if expect_address is not None:
            public_key_of(expect_address)  # InvalidAddress unless well-formed
        self._creds = credentials
        self._hs = HandshakeState(
            initiator=initiator,
            static_private=credentials.static_private,
            random_bytes=random_bytes,
            prologue=prologue,
        )
        self.initiator = initiator
        self._authorize = authorize
        self._expect = expect_address
        self._result: HandshakeResult | None = None
        self._peer: tuple[bytes, str, bytes] | None = None
        self._failed: HivemeshError | None = None

    @property
    def complete(self) -> bool:
        """True once the handshake finished and the peer passed every check."""
        return self._result is not None and self._failed is None

    @property
    def next_message_bytes(self) -> int:
        """Exact size of the handshake message this side reads next."""
        i = self._hs.message_index
        return MESSAGE_BYTES[i] if i < len(MESSAGE_BYTES) else 0

    @property
    def next_message_sizes(self) -> tuple[int, ...]:
        """Every size accepted for the message this side reads next: ours,
        then a legacy version's (read only to be refused by its version)."""
        i = self._hs.message_index
        return ACCEPTED_MESSAGE_BYTES[i] if i < len(ACCEPTED_MESSAGE_BYTES) else ()

    def initiate(self) -> bytes:
        """Initiator only: message 1 (32 bytes, no payload)."""
        if not self.initiator:
            raise LocalProtocolError("the responder does not initiate")
        message = self._guard(lambda: self._hs.write_message(b""))
        assert message is not None
        return message

    def receive(self, message: bytes) -> bytes | None:
        """Consume the peer's handshake message; return our reply, if any."""
        return self._guard(lambda: self._receive(message))

    def _guard(self, step: Callable[[], bytes | None]) -> bytes | None:
        if self._failed is not None:
            raise LocalProtocolError(f"handshake already failed: {self._failed}")
        try:
            return step()
        except HivemeshError as exc:
            self._failed = exc
            raise

    def _receive(self, message: bytes) -> bytes | None:
        if len(message) not in self.next_message_sizes:
            raise HandshakeError(
                f"handshake message is {len(message)} bytes, want {self.next_message_bytes}"
            )
        payload = self._hs.read_message(message)
        if self._hs.message_index == 1:  # responder read message 1
            if payload:
                raise HandshakeError("message 1 must not carry a payload")
            return self._hs.write_message(self._creds.payload)
        assert self._hs.remote_static is not None
        pub, address, boot_id = verify_identity_payload(payload, self._hs.remote_static)
        self._peer = (pub, address, boot_id)
        if self.initiator:  # read message 2: check before revealing ourselves
            self._check_policy(address)
            reply = self._hs.write_message(self._creds.payload)
            self._finish()
            return reply
        self._finish()  # responder read message 3: keys exist even if refused
        self._check_policy(address)
        return None

    def _check_policy(self, address: str) -> None:
        if address == self._creds.identity.address:
            raise SelfConnection(f"the peer is this node itself ({address[:12]})")
        if self._expect is not None and address != self._expect:
            raise PeerIdentityMismatch(
                f"dialled {self._expect[:12]} but the peer proved {address[:12]} "
                "(man in the middle?)"
            )
        try:
            trusted = self._authorize(address)
        except Exception as exc:  # a broken policy fails closed
            raise UnknownPeer(f"trust check for {address[:12]} raised {exc!r}; refusing") from exc
        if not trusted:
            raise UnknownPeer(f"peer {address[:12]} is not trusted by this node")

    def _finish(self) -> None:
        assert self._peer is not None
        send, recv = self._hs.split()
        pub, address, boot_id = self._peer
        self._result = HandshakeResult(
            pub, address, send, recv, self._hs.handshake_hash, peer_boot_id=boot_id
        )

    @property
    def peer_address(self) -> str | None:
        """The peer's proven address (after message 2/3 verified), else ``None``."""
        return None if self._peer is None else self._peer[1]

    def result(self) -> HandshakeResult:
        """The session keys and peer identity.

        On the responder this is also available when the peer was refused
        (:class:`UnknownPeer`), so the refusal can be sent encrypted.
        """
        if self._result is None:
            raise LocalProtocolError("handshake not complete")
        return self._result
