"""Who this node lets in: the trust store and invite tokens.

Theory of operation
-------------------
Nodes are private by default: a node talks only to addresses in its
:class:`TrustStore` (``trust.json`` in the data dir, mode 0600, written
atomically under an advisory lock so the CLI and a running daemon can share
it) and to the members of its swarms (below). ``trust revoke`` moves an
address to the revoked set, which wins over everything: the runtime drops
the connection, calls ``node.remove_peer`` and ``membership.forget``, and
the node's journal ``trusted`` hook refuses the address's new events. A
running daemon sees CLI edits because every read checks the file's identity
(inode, size, mtime) and reloads when it changed.

**Invites.** ``hivemesh invite`` prints a token::

    "hmi1" + base64url(msgpack([1, inviter_pub, endpoints, expires_s, nonce, sig]))

where ``sig`` is the inviter's Ed25519 signature over
``msgpack(["hivemesh/invite/v1", inviter_pub, endpoints, expires_s, nonce])``
and ``nonce`` is 16 secret random bytes. The inviter records the nonce in its
store (:meth:`TrustStore.issue_invite`): single use, until ``expires_s``.

A token has exactly one encoding: base64url without padding (``A-Z a-z 0-9
- _`` only, unused bits zero) of msgpack in its minimal form, with nothing
before, inside or after it. :func:`accept_invite` decodes strictly, encodes
the result again and refuses anything that does not come back byte for byte
(:class:`~hivemesh.errors.InviteNonCanonical`): other padding or alphabet,
wider integers or strings than needed, trailing bytes, whitespace, another
case. So a token's text is its identity, in logs and wherever it is compared.

**The join flow** (``hivemesh join TOKEN``):

1. The joiner checks the token (:func:`accept_invite`: signature, expiry,
   form), trusts the inviter's address and dials the endpoints in it
   (:meth:`TrustStore.accept`). The transport proves the inviter's identity
   (the address *is* the key), so a token cannot send the joiner elsewhere.
2. In its handshake payload the joiner sends ``join_proof(invite, joiner)``
   = ``blake2b(key=nonce, "hivemesh/join/v1" || inviter_pub || joiner_pub)``.
   It proves possession of the token without revealing the nonce and is
   bound to both identities, so it is useless to anyone else.
3. The inviter, facing an authenticated but untrusted peer that presents a
   proof, calls :meth:`TrustStore.redeem`: if the proof matches an
   unexpired, unused invite, the invite is marked used by that joiner and
   the joiner's address is trusted. Otherwise it names the cause --
   :class:`~hivemesh.errors.InviteUsed`, :class:`~hivemesh.errors.InviteExpired`,
   :class:`~hivemesh.errors.InviteUnknown` (not an invite of ours),
   :class:`~hivemesh.errors.InviteRevoked` -- and the runtime closes the
   channel with that code, so the joiner learns why. Used and expired
   invites are remembered for :data:`INVITE_MEMORY_S` (at most
   :data:`MAX_INVITE_RECORDS`) for exactly that.
4. The joiner trusts the inviter once it is admitted (the runtime's
   ``RT_JOINED``); membership then runs
   :meth:`~hivemesh.core.membership.Membership.join` with the inviter as
   seed, and peer exchange introduces the others.

**Swarms.** Trust is per node, but a node also records the swarms it
belongs to (:meth:`TrustStore.swarms`): the one it founds at its first
invite (a random 16-byte id), and each it joins (:meth:`TrustStore.join_swarm`).
Every invite brings the joiner into one of them (:meth:`TrustStore.issue_invite`,
``swarm``), which :meth:`TrustStore.redeem` returns. The runtime publishes
admissions as swarm-scoped ``trust.add`` journal events and admits the members
of its own swarms only (:mod:`hivemesh.core.views.trust`).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import re
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hivemesh.core.codec import pack, unpack
from hivemesh.core.identity import Identity, address_of, public_key_of, verify
from hivemesh.core.pex import check_endpoints
from hivemesh.core.views.trust import is_swarm_id
from hivemesh.errors import (
    DecodeError,
    InvalidArgument,
    InviteBadSignature,
    InviteExpired,
    InviteMalformed,
    InviteNonCanonical,
    InviteRevoked,
    InviteUnknown,
    InviteUsed,
    StoreCorrupt,
)

__all__ = [
    "INVITE_MEMORY_S",
    "INVITE_PREFIX",
    "MAX_INVITE_RECORDS",
    "Invite",
    "TrustStore",
    "accept_invite",
    "is_swarm_id",
    "join_proof",
    "make_invite",
]

INVITE_PREFIX = "hmi1"
_INVITE_DOMAIN = "hivemesh/invite/v1"
_PROOF_DOMAIN = b"hivemesh/join/v1"
_NONCE_BYTES = 16
_MAX_TOKEN_CHARS = 4096
_SIG_BYTES = 64
_BASE64URL = re.compile(r"[A-Za-z0-9_-]*")
_FILE = "trust.json"
#: How long an expired or used invite is remembered, to tell a late joiner why.
INVITE_MEMORY_S = 7 * 86400
#: Invite records kept at most (the oldest are forgotten first).
MAX_INVITE_RECORDS = 1024


@dataclass(frozen=True, slots=True)
class Invite:
    """A verified invite: who invites, where to dial them, until when."""

    inviter: str
    endpoints: tuple[str, ...]
    expires_s: int
    nonce: bytes


def _signed_part(pub: bytes, endpoints: list[str], expires_s: int, nonce: bytes) -> bytes:
    return pack([_INVITE_DOMAIN, pub, endpoints, expires_s, nonce])


def make_invite(
    identity: Identity, endpoints: list[str], ttl_s: int, now_s: int, nonce: bytes
) -> str:
    """A signed invite token for ``identity`` reachable at ``endpoints``."""
    if len(nonce) != _NONCE_BYTES:
        raise InvalidArgument(f"invite nonce must be {_NONCE_BYTES} bytes")
    if ttl_s <= 0:
        raise InvalidArgument("invite ttl_s must be > 0")
    try:
        eps = list(check_endpoints(list(endpoints)))
    except DecodeError as exc:
        raise InvalidArgument(str(exc)) from None
    expires_s = int(now_s) + int(ttl_s)
    sig = identity.sign(_signed_part(identity.public, eps, expires_s, nonce))
    raw = pack([1, identity.public, eps, expires_s, nonce, sig])
    return INVITE_PREFIX + _b64(raw)


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def _decode_token(token: str) -> Any:
    """The token's msgpack value, if ``token`` is in its one canonical form."""
    if type(token) is not str or not token.strip().startswith(INVITE_PREFIX):
        raise InviteMalformed(f"an invite starts with {INVITE_PREFIX!r}")
    if token != token.strip():
        raise InviteNonCanonical("an invite has no whitespace around it")
    if len(token) > _MAX_TOKEN_CHARS:
        raise InviteMalformed(f"an invite is at most {_MAX_TOKEN_CHARS} characters")
    body = token[len(INVITE_PREFIX) :]
    if not _BASE64URL.fullmatch(body):
        raise InviteNonCanonical("an invite is base64url (A-Z a-z 0-9 - _) without padding")
    try:
        raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        obj = unpack(raw, limit=_MAX_TOKEN_CHARS)
    except (ValueError, DecodeError) as exc:
        raise InviteMalformed(f"invite is not base64url msgpack: {exc}") from None
    if _b64(raw) != body:
        raise InviteNonCanonical("invite base64 has non-zero unused bits")
    try:
        again = pack(obj)
    except ValueError:  # pragma: no cover - unpack only returns packable values
        again = b""
    if again != raw:
        raise InviteNonCanonical("invite msgpack is not in its minimal encoding")
    return obj


def accept_invite(token: str, now_s: int) -> Invite:
    """Verify an invite token in its canonical form (module docs).

    Raises :class:`InviteMalformed` (:class:`InviteNonCanonical` for another
    encoding of a well-formed token), :class:`InviteBadSignature` or
    :class:`InviteExpired`.
    """
    obj = _decode_token(token)
    if type(obj) is not list or len(obj) != 6 or obj[0] != 1:
        raise InviteMalformed("invite must be [1, key, endpoints, expires, nonce, sig]")
    _, pub, eps, expires_s, nonce, sig = obj
    if type(pub) is not bytes or len(pub) != 32:
        raise InviteMalformed("invite key has the wrong form")
    if type(sig) is not bytes or len(sig) != _SIG_BYTES:
        raise InviteMalformed("invite signature has the wrong form")
    if type(nonce) is not bytes or len(nonce) != _NONCE_BYTES or type(expires_s) is not int:
        raise InviteMalformed("invite nonce or expiry has the wrong form")
    try:
        endpoints = check_endpoints(eps)
    except DecodeError as exc:
        raise InviteMalformed(str(exc)) from None
    if not verify(pub, sig, _signed_part(pub, list(endpoints), expires_s, nonce)):
        raise InviteBadSignature("invite signature does not verify")
    if now_s >= expires_s:
        raise InviteExpired(f"invite expired {now_s - expires_s} s ago")
    return Invite(address_of(pub), endpoints, expires_s, nonce)


def join_proof(invite: Invite, joiner_address: str) -> bytes:
    """The joiner's proof of holding ``invite`` (sent in its handshake)."""
    msg = _PROOF_DOMAIN + public_key_of(invite.inviter) + public_key_of(joiner_address)
    return hashlib.blake2b(msg, key=invite.nonce, digest_size=32).digest()


class TrustStore:
    """Trusted and revoked addresses and issued invites, in ``data_dir/trust.json``."""

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        min_refresh_s: float = 0.0,
        on_load_error: Callable[[StoreCorrupt], None] | None = None,
    ) -> None:
        self.dir = Path(data_dir)
        self.path = self.dir / _FILE
        self._lock_path = self.dir / (_FILE + ".lock")
        self._stamp: tuple[int, int, int] | None = None
        self._data: dict[str, Any] = _empty()
        #: Bumped whenever the file is (re)loaded; see :meth:`poll`.
        self.generation = 0
        #: Queries look at the file at most this often (seconds); 0 = every
        #: query. :meth:`poll` and our own edits always look. A daemon on the
        #: hot path sets it (one ``stat`` per received frame otherwise).
        self.min_refresh_s = min_refresh_s
        #: If set, a file that no longer parses (a hand edit gone wrong) is
        #: reported here once per version of it, and the trust last read stays
        #: in force until the file parses again; if None, queries raise
        #: :class:`StoreCorrupt`. Edits (``add``, ``revoke``, ...) always raise:
        #: they never write over a file they cannot read.
        self.on_load_error = on_load_error
        self._checked_s = float("-inf")
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._refresh(force=True)

    # -- queries -------------------------------------------------------------------

    def poll(self) -> int:
        """Reload if the file changed (e.g. ``hivemesh trust revoke`` ran) and
        return :attr:`generation`; the runtime re-checks its peers when it moves."""
        self._refresh(force=True)
        return self.generation

    def is_trusted(self, address: str) -> bool:
        """True if ``address`` is trusted and not revoked."""
        self._refresh()
        return address in self._data["trusted"] and address not in self._data["revoked"]

    def is_revoked(self, address: str) -> bool:
        """True if ``address`` was revoked."""
        self._refresh()
        return address in self._data["revoked"]

    def trusts_author(self, public_key: bytes) -> bool:
        """``is_trusted`` by public key: the core node's ``trusted`` hook."""
        try:
            return self.is_trusted(address_of(public_key))
        except ValueError:
            return False

    def trusted(self) -> list[str]:
        """Trusted (not revoked) addresses, sorted."""
        self._refresh()
        revoked = self._data["revoked"]
        return sorted(a for a in self._data["trusted"] if a not in revoked)

    def revoked(self) -> list[str]:
        """Revoked addresses, sorted."""
        self._refresh()
        return sorted(self._data["revoked"])

    def swarms(self) -> list[str]:
        """The ids of the swarms this node belongs to, the home swarm first."""
        self._refresh()
        return _by_age(self._data["swarms"])

    # -- changes ---------------------------------------------------------------------

    def add(self, address: str, now_s: int, *, note: str = "") -> None:
        """Trust ``address`` (an explicit add also lifts a revocation)."""
        public_key_of(address)  # raises InvalidAddress
        with self._edit() as data:
            data["revoked"].pop(address, None)
            data["trusted"][address] = {"since_s": int(now_s), "note": note[:200]}

    def revoke(self, address: str, now_s: int) -> None:
        """Revoke ``address``: no longer trusted, and invites cannot re-admit it."""
        public_key_of(address)
        with self._edit() as data:
            data["trusted"].pop(address, None)
            data["revoked"][address] = {"since_s": int(now_s)}

    def home_swarm(self, now_s: int) -> str:
        """The swarm invites and ``trust add`` bring nodes into: the oldest one
        this node belongs to, founded now if it belongs to none."""
        with self._edit() as data:
            return _home(data, now_s)

    def join_swarm(self, swarm: str, via: str, now_s: int) -> None:
        """Record that this node joined ``swarm`` through the inviter ``via``."""
        if not is_swarm_id(swarm):
            raise InvalidArgument("a swarm id is 32 lower-case hex digits")
        with self._edit() as data:
            data["swarms"].setdefault(swarm, {"since_s": int(now_s), "via": via})

    def issue_invite(
        self,
        identity: Identity,
        endpoints: list[str],
        ttl_s: int,
        now_s: int,
        nonce: bytes | None = None,
        *,
        swarm: str | None = None,
    ) -> str:
        """Make a single-use invite token into ``swarm`` (default: the home
        swarm) and remember it (module docs)."""
        nonce = secrets.token_bytes(_NONCE_BYTES) if nonce is None else nonce
        token = make_invite(identity, endpoints, ttl_s, now_s, nonce)
        with self._edit() as data:
            if swarm is None:
                swarm = _home(data, now_s)
            elif swarm not in data["swarms"]:
                raise InvalidArgument(f"this node is not in swarm {swarm!r}")
            data["invites"][nonce.hex()] = {
                "inviter": identity.address,
                "expires_s": int(now_s) + int(ttl_s),
                "swarm": swarm,
            }
            _prune(data, now_s)
        return token

    def redeem(self, joiner_address: str, proof: bytes, now_s: int) -> tuple[bool, str]:
        """Inviter side: consume the invite ``proof`` matches and trust the joiner.

        Returns ``(new, swarm)``: the swarm the invite brings the joiner into,
        and whether it was redeemed now (False: this joiner had redeemed it
        before and its admission may not have reached it; it is trusted again
        unless revoked). Otherwise the cause is raised:
        :class:`InviteRevoked` (the joiner was revoked), :class:`InviteUsed`
        (another node used it), :class:`InviteExpired`, or
        :class:`InviteUnknown` (no invite of ours matches: foreign, forged,
        or forgotten after :data:`INVITE_MEMORY_S`).
        """
        joiner_pub = public_key_of(joiner_address)
        if type(proof) is not bytes:
            raise InviteUnknown("a join proof is bytes")
        self._refresh()
        _, seen = _matching(self._data["invites"], joiner_pub, proof)
        again = seen is not None and seen.get("used_by") == joiner_address
        if again and seen and seen.get("swarm") and self.is_trusted(joiner_address):
            return False, str(seen["swarm"])  # answered again: nothing to write
        with self._edit() as data:
            _prune(data, now_s)
            if joiner_address in data["revoked"]:
                raise InviteRevoked("the inviter revoked this node")
            nonce_hex, inv = _matching(data["invites"], joiner_pub, proof)
            if inv is None:
                raise InviteUnknown("no invite of the inviter matches (foreign or forgotten)")
            used_by = inv.get("used_by")
            swarm = str(inv.get("swarm") or _home(data, now_s))
            if used_by == joiner_address:
                data["trusted"].setdefault(
                    joiner_address, {"since_s": int(now_s), "note": "invited"}
                )
                return False, swarm
            if used_by is not None:
                raise InviteUsed("the invite was already used by another node")
            if inv["expires_s"] <= now_s:
                raise InviteExpired(f"the invite expired {now_s - inv['expires_s']} s ago")
            inv["used_by"], inv["used_s"] = joiner_address, int(now_s)
            data["invites"][nonce_hex] = inv
            data["trusted"][joiner_address] = {"since_s": int(now_s), "note": "invited"}
        return True, swarm

    def pending_invites(self, now_s: int) -> int:
        """How many issued invites are still redeemable."""
        self._refresh()
        return sum(
            1
            for v in self._data["invites"].values()
            if v["expires_s"] > now_s and v.get("used_by") is None
        )

    def remembered_invites(self, now_s: int) -> int:
        """Issued invites still on record: redeemable, used, or expired less
        than :data:`INVITE_MEMORY_S` ago (a node holding any hears joiners
        out, to tell them why it refuses)."""
        self._refresh()
        invites = self._data["invites"].values()
        return sum(1 for v in invites if v["expires_s"] + INVITE_MEMORY_S > now_s)

    # -- file handling -----------------------------------------------------------------

    def _refresh(self, *, force: bool = False, strict: bool = False) -> None:
        if self.min_refresh_s > 0:
            now = time.monotonic()
            if not force and now - self._checked_s < self.min_refresh_s:
                return
            self._checked_s = now
        try:
            st = self.path.stat()
        except FileNotFoundError:
            if self._stamp is not None:
                self.generation += 1
            self._stamp, self._data = None, _empty()
            return
        stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        if stamp != self._stamp:
            try:
                data = _load(self.path)
            except StoreCorrupt as exc:
                if strict or self.on_load_error is None:
                    raise
                self._stamp = stamp  # reported once; looked at again when it changes
                self.on_load_error(exc)
                return
            self._data = data
            self._stamp = stamp
            self.generation += 1

    @contextlib.contextmanager
    def _edit(self) -> Iterator[dict[str, Any]]:
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._stamp = None
            self._refresh(force=True, strict=True)
            data = json.loads(json.dumps(self._data))  # a private copy
            yield data
            _atomic_write(self.path, data)
            self._stamp = None
            self._refresh(force=True)
        finally:
            os.close(fd)  # closing releases the lock


def _empty() -> dict[str, Any]:
    return {"version": 1, "trusted": {}, "revoked": {}, "invites": {}, "swarms": {}}


def _by_age(swarms: dict[str, Any]) -> list[str]:
    return sorted(swarms, key=lambda s: (swarms[s]["since_s"], s))


def _home(data: dict[str, Any], now_s: int) -> str:
    """The home swarm of ``data``, founding one (a fresh random id) if needed."""
    if not data["swarms"]:
        data["swarms"][secrets.token_hex(16)] = {"since_s": int(now_s), "via": ""}
    return _by_age(data["swarms"])[0]


def _prune(data: dict[str, Any], now_s: int) -> None:
    """Forget invites :data:`INVITE_MEMORY_S` after they expired, and the oldest
    beyond :data:`MAX_INVITE_RECORDS`."""
    invites = data["invites"]
    for k in sorted(invites):
        if invites[k]["expires_s"] + INVITE_MEMORY_S <= now_s:
            del invites[k]
    extra = len(invites) - MAX_INVITE_RECORDS
    if extra > 0:
        for k in sorted(invites, key=lambda k: (invites[k]["expires_s"], k))[:extra]:
            del invites[k]


def _matching(
    invites: dict[str, Any], joiner_pub: bytes, proof: bytes
) -> tuple[str, dict[str, Any] | None]:
    """The invite record whose proof for ``joiner_pub`` is ``proof``."""
    for nonce_hex in sorted(invites):
        inv = invites[nonce_hex]
        msg = _PROOF_DOMAIN + public_key_of(inv["inviter"]) + joiner_pub
        want = hashlib.blake2b(msg, key=bytes.fromhex(nonce_hex), digest_size=32).digest()
        if hmac.compare_digest(want, proof):
            return nonce_hex, dict(inv)
    return "", None


def _load(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError) as exc:
        raise StoreCorrupt(f"{path}: unreadable trust store: {exc}") from None
    if type(data) is dict:
        data.setdefault("swarms", {})  # written before swarms existed
    if (
        type(data) is not dict
        or data.get("version") != 1
        or not all(type(data.get(k)) is dict for k in ("trusted", "revoked", "invites", "swarms"))
        or not all(is_swarm_id(s) and type(v) is dict for s, v in data["swarms"].items())
    ):
        raise StoreCorrupt(f"{path}: not a version-1 trust store")
    return data


def _atomic_write(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, json.dumps(data, indent=1, sort_keys=True).encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
