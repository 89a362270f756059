"""The voter side of the quorum lease protocol (:mod:`hivemesh.core.lease_quorum`).

Theory of operation
-------------------
A voter keeps, per resource, a slot ``(max_token, token, holder, expiry_ms)``;
``expiry_ms`` is on the voter's own clock. It answers one request at a time
with one reply; it never sends anything on its own. A slot, as a table
(``live`` = holder set and ``now <= expiry``)::

    request             slot state                         -> new state / reply
    prep                any                                -> unchanged / max, holder, left, token
    acc(t, h, ttl)      (t, h) already live                -> unchanged / yes (duplicate)
    acc(t, h, ttl)      not live and t > max_token         -> (t, h, now+ttl), max=t / yes
    acc(t, h, ttl)      otherwise                          -> unchanged / no
    ren(t, h, ttl)      (t, h) live                        -> expiry=max(expiry, now+ttl) / yes
    ren(t, h, ttl)      otherwise                          -> unchanged / no
    rel(t, h) req [a]   (t, h) live [from attempt a], or released by (h, req) -> free / yes
    rel(t, h) rid       otherwise                          -> unchanged / no
    any write           quarantined (restored < max TTL ago) -> unchanged / no

Durability. What a voter must never forget is (a) that it accepted token
``t`` -- else after a crash it could accept ``t`` again for someone else, or
report a smaller ``max_token`` to a prepare, and tokens could repeat -- and
(b) the longest TTL it granted, which bounds how long it must refuse writes
after a restart (expiry times do not survive one: clocks restart). The
durable state is therefore ``(token bound per resource, longest TTL)``, read
by :meth:`Voter.durable` and :meth:`Voter.snapshot`; the runtime must have it
on disk before it sends any reply that follows a change of it.

*Token reserve.* Writing the exact ``max_token`` costs one disk sync per
acquire. With ``token_reserve = k`` the durable bound is raised, when an
accept goes past it, to ``t + k``: the next ``k`` acquires of that resource
change nothing durable. A voter restored from the bound ``B`` reports and
enforces ``max_token = B``, which is at least every token it ever accepted,
so the promise an accept made still holds after any crash; tokens just jump
by at most ``k`` after a restart (they are strictly increasing, never dense).

A restored voter quarantines itself: it reports every resource as held, and
accepts nothing, for ``quarantine_ms`` (the longest TTL it ever granted).

*Records.* The driver keeps the durable state in a log of records
(:mod:`hivemesh.stores.voterlog` does the file I/O). A record is ``u32
length, u32 crc32(payload), payload`` (little endian; :func:`pack_record`),
the payload msgpack ``[resource, bound, max_ttl_ms]`` (a change) or
``{"max_ttl_ms": .., "max_tokens": {..}}`` (a full snapshot). Reading stops
at the first zero length, bad checksum or torn record (:func:`unpack_records`:
a crash mid-write, never acknowledged). :class:`DurableBounds` folds records
into the state ``Voter(state=...)`` takes: the highest bound per resource and
the longest TTL.

Shape (aioquic-style): ``Voter.receive(msg, now_ms) -> reply``. Messages are
plain lists of ints and strs (msgpack-able). No I/O, clock or randomness here.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from hivemesh.core import codec
from hivemesh.errors import DecodeError, InvalidArgument

__all__ = [
    "ACCEPT",
    "PREPARE",
    "RECORD_HEAD",
    "RELEASE",
    "RENEW",
    "REPLY",
    "DurableBounds",
    "Voter",
    "check_int",
    "check_str",
    "pack_record",
    "unpack_records",
]

# Message kinds (first element of every message).
PREPARE, ACCEPT, RENEW, RELEASE = "prep", "acc", "ren", "rel"
#: The reply kind to each request kind.
REPLY = {PREPARE: "prep_r", ACCEPT: "acc_r", RENEW: "ren_r", RELEASE: "rel_r"}
_MAX_INT = 2**63 - 1


def check_int(x: object, lo: int = 0, hi: int = _MAX_INT) -> int:
    """``x`` if it is an int in ``[lo, hi]`` (not a bool), else DecodeError."""
    if isinstance(x, bool) or not isinstance(x, int) or not lo <= x <= hi:
        raise DecodeError(f"expected an int in [{lo}, {hi}], got {x!r}")
    return x


def check_str(x: object, max_len: int = 256) -> str:
    """``x`` if it is a str of at most ``max_len`` chars, else DecodeError."""
    if not isinstance(x, str) or len(x) > max_len:
        raise DecodeError(f"expected a str of at most {max_len} chars, got {x!r:.80}")
    return x


@dataclass(slots=True)
class _Slot:
    max_token: int = 0
    token: int = 0
    holder: str = ""
    expiry_ms: int = 0
    attempt: str = ""  # the acquire attempt that installed (token, holder)
    # (token, holder, request id) of the last applied release: its retransmits still
    # get "yes" after the slot moved on, so a release that worked is reported as such
    released_by: tuple[int, str, str] = (0, "", "")
    bound: int = 0  # the durable token bound: >= max_token (see "Token reserve")
    # an acquire attempt whose abort arrived before its accept (links reorder):
    # that accept is refused when it comes (kept in memory only, see _release)
    aborted: str = ""

    def live(self, now_ms: int) -> bool:
        return bool(self.holder) and now_ms <= self.expiry_ms


class Voter:
    """One voter's lease table. Feed it requests; it returns the reply to send back.

    ``token_reserve`` (default 0: the exact token is durable) -- see the
    module docs; every voter of a set may use a different value.
    """

    def __init__(
        self,
        voter_id: str,
        *,
        state: dict[str, Any] | None = None,
        now_ms: int = 0,
        token_reserve: int = 0,
    ) -> None:
        if isinstance(token_reserve, bool) or not isinstance(token_reserve, int):
            raise InvalidArgument(f"token_reserve must be an int, got {token_reserve!r}")
        if not 0 <= token_reserve <= 2**32:
            raise InvalidArgument(f"token_reserve={token_reserve} out of range [0, 2**32]")
        self.voter_id = voter_id
        self.token_reserve = token_reserve
        self._slots: dict[str, _Slot] = {}
        self._max_ttl_ms = 0
        self._quarantine_until_ms = -1
        #: counts of handled requests and refusals, by name
        self.counters: dict[str, int] = {}
        if state is not None:
            self._restore(state, now_ms)

    def _count(self, name: str) -> None:
        self.counters[name] = self.counters.get(name, 0) + 1

    def _restore(self, state: dict[str, Any], now_ms: int) -> None:
        try:
            self._max_ttl_ms = check_int(state["max_ttl_ms"])
            for resource, bound in sorted(state["max_tokens"].items()):
                b = check_int(bound)
                self._slots[check_str(resource)] = _Slot(max_token=b, bound=b)
        except (KeyError, AttributeError, TypeError) as e:
            raise InvalidArgument(f"bad voter state: {e!r}") from e
        except DecodeError as e:
            raise InvalidArgument(f"bad voter state: {e}") from e
        # Leases granted before the restart are invisible now: refuse for their TTL.
        self._quarantine_until_ms = now_ms + self._max_ttl_ms

    def snapshot(self) -> dict[str, Any]:
        """The durable state (msgpack-able): per resource the token bound, and
        the longest TTL. ``Voter(state=snapshot())`` is the voter after a restart."""
        return {
            "max_ttl_ms": self._max_ttl_ms,
            "max_tokens": {r: s.bound for r, s in sorted(self._slots.items())},
        }

    def durable(self, resource: str) -> tuple[int, int]:
        """``(token bound of resource, longest TTL granted)``: what must be on disk.

        Compare before and after :meth:`receive` to know whether a write
        changed durable state (persist it before sending the reply, and
        before any later reply).
        """
        slot = self._slots.get(resource)
        return (0 if slot is None else slot.bound), self._max_ttl_ms

    def receive(self, msg: Sequence[object], now_ms: int) -> list[object]:
        """Handle one request; return the reply. Raises DecodeError on garbage."""
        if not isinstance(msg, list | tuple) or len(msg) < 3:
            raise DecodeError("lease request must be a list [kind, rid, resource, ...]")
        kind, rid, resource = msg[0], check_int(msg[1]), check_str(msg[2])
        slot = self._slots.get(resource)
        if slot is None:
            slot = _Slot()
        quarantined = now_ms < self._quarantine_until_ms
        if kind == PREPARE:
            self._count("prepare")
            if quarantined:
                left = self._quarantine_until_ms - now_ms
                return [REPLY[PREPARE], rid, slot.max_token, "?", left, 0]
            if slot.live(now_ms):
                left = slot.expiry_ms - now_ms
                return [REPLY[PREPARE], rid, slot.max_token, slot.holder, left, slot.token]
            return [REPLY[PREPARE], rid, slot.max_token, "", 0, 0]
        if kind not in (ACCEPT, RENEW, RELEASE):
            raise DecodeError(f"unknown lease request kind {kind!r:.40}")
        token = check_int(msg[3] if len(msg) > 3 else None, 1)
        holder = check_str(msg[4] if len(msg) > 4 else None)
        if kind == RELEASE:
            return self._release(msg, rid, resource, slot, token, holder, now_ms)
        ttl_ms = check_int(msg[5] if len(msg) > 5 else None, 1, 2**40)
        if quarantined:
            self._count("quarantined")
            return [REPLY[str(kind)], rid, False]
        if kind == ACCEPT:
            attempt = check_str(msg[6] if len(msg) > 6 else "")
            if (slot.token, slot.holder, slot.attempt) == (token, holder, attempt) and holder:
                ok = True  # duplicate of an accept already applied: idempotent, no extension
            elif attempt and attempt == slot.aborted:
                ok = False  # its proposer gave it up before it got here
                self._count("accept_aborted")
            else:
                ok = token > slot.max_token and not slot.live(now_ms) and holder != ""
                if ok:
                    slot.max_token = slot.token = token
                    slot.holder, slot.expiry_ms = holder, now_ms + ttl_ms
                    slot.attempt = attempt
                    if token > slot.bound:
                        slot.bound = token + self.token_reserve
                    self._slots[resource] = slot
                    self._max_ttl_ms = max(self._max_ttl_ms, ttl_ms)
            self._count("accept_ok" if ok else "accept_refused")
            return [REPLY[ACCEPT], rid, ok]
        ok = slot.live(now_ms) and slot.token == token and slot.holder == holder
        if ok:
            slot.expiry_ms = max(slot.expiry_ms, now_ms + ttl_ms)
            self._max_ttl_ms = max(self._max_ttl_ms, ttl_ms)
        self._count("renew_ok" if ok else "renew_refused")
        return [REPLY[RENEW], rid, ok]

    def _release(
        self,
        msg: Sequence[object],
        rid: int,
        resource: str,
        slot: _Slot,
        token: int,
        holder: str,
        now_ms: int,
    ) -> list[object]:
        # A release changes nothing durable: a voter that acknowledges one and
        # then crashes restarts quarantined, refusing every write for the
        # longest TTL, which is stricter than remembering the release.
        req = check_str(msg[5] if len(msg) > 5 else "")
        attempt = check_str(msg[6] if len(msg) > 6 else "")  # set: an abort of that attempt only
        mine = (
            holder != ""
            and (slot.token, slot.holder) == (token, holder)
            and slot.live(now_ms)
            and attempt in ("", slot.attempt)
        )
        ok = mine or (req != "" and (token, holder, req) == slot.released_by)
        if mine:
            slot.holder, slot.expiry_ms, slot.released_by = "", 0, (token, holder, req)
            self._slots[resource] = slot
        elif attempt and token > slot.max_token:
            # An abort that overtook its accept: remember the attempt so the
            # accept is refused when it lands (else it would hold this voter
            # until it expires, for an acquire its caller saw fail). Memory
            # only: a voter that restarts is quarantined for the longest TTL.
            slot.aborted = attempt
            self._slots[resource] = slot
        self._count("release_ok" if ok else "release_refused")
        return [REPLY[RELEASE], rid, ok]


# -- durable records (module docs, *Records*) ------------------------------------------

#: A record's head: payload length, crc32 of the payload.
RECORD_HEAD = struct.Struct("<II")
_MAX_RECORD = 1 << 16


def pack_record(obj: Any) -> bytes:
    """One record holding ``obj`` (a change or a snapshot)."""
    payload = codec.pack(obj)
    return RECORD_HEAD.pack(len(payload), zlib.crc32(payload)) + payload


def unpack_records(data: bytes) -> Iterator[tuple[int, Any]]:
    """``(offset, decoded payload)`` of each record of the valid prefix of
    ``data``; a payload that does not decode raises :class:`DecodeError`."""
    pos, head = 0, RECORD_HEAD.size
    while pos + head <= len(data):
        length, crc = RECORD_HEAD.unpack_from(data, pos)
        if length == 0 or length > _MAX_RECORD or pos + head + length > len(data):
            return
        payload = data[pos + head : pos + head + length]
        if zlib.crc32(payload) != crc:
            return  # torn by a crash: never acknowledged
        yield pos, codec.unpack(payload)
        pos += head + length


@dataclass(slots=True)
class DurableBounds:
    """A voter's durable state folded from its records (module docs)."""

    max_ttl_ms: int = 0
    max_tokens: dict[str, int] = field(default_factory=dict)

    def change(self, resource: str, bound: int, max_ttl_ms: int) -> list[object]:
        """Fold one change in; returns its record's payload."""
        self.max_tokens[resource] = max(self.max_tokens.get(resource, 0), bound)
        self.max_ttl_ms = max(self.max_ttl_ms, max_ttl_ms)
        return [resource, bound, max_ttl_ms]

    def apply(self, rec: Any) -> None:
        """Fold one decoded record in (ValueError, TypeError, KeyError or
        AttributeError if it is not one)."""
        if isinstance(rec, dict):
            self.max_ttl_ms = int(rec["max_ttl_ms"])
            self.max_tokens = {str(r): int(t) for r, t in rec["max_tokens"].items()}
            return
        resource, bound, ttl = rec
        if type(resource) is not str or type(bound) is not int or type(ttl) is not int:
            raise ValueError("record must be [str, int, int]")
        self.change(resource, bound, ttl)

    def state(self) -> dict[str, Any]:
        """The state in the shape ``Voter(state=...)`` takes (a snapshot record)."""
        return {"max_ttl_ms": self.max_ttl_ms, "max_tokens": dict(sorted(self.max_tokens.items()))}
