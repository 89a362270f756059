"""What every ``bench fanout`` worker shares: the message shape and its receipts.

Standard library only, so the py-libp2p worker (run by a separate venv's
interpreter, without hivemesh installed) can import it as a plain module
from this directory.

A benchmark message is a small dict ``{"p": publisher, "ph": phase, "i": n,
"t": send_time_ns, "pad": "..."}``: the same fields for every system (an
event body for hivemesh, JSON bytes for NATS and gossipsub). Workers and the
parent speak JSON lines: one request ``{"op": ..., ...}`` on stdin, one
reply object on stdout.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "MAX_MESSAGES",
    "PAD",
    "Handler",
    "Receipts",
    "Send",
    "body",
    "burst",
    "decode",
    "encode",
    "paced",
    "paced_due",
    "serve_stdio",
]

#: ``send(phase, first, stop, t_ns)``: publish messages ``first..stop-1`` of
#: ``phase``, all stamped ``t_ns`` (one append, or one publish each).
Send = Callable[[str, int, int, int], Awaitable[None]]

#: An asyncio worker's handler for one op: request dict in, reply fields out.
Handler = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]

#: Largest message number a worker accepts (bounds its receipt bitmaps).
MAX_MESSAGES = 10_000_000

#: Filler so a message is the size of a small agent event (~120 bytes).
PAD = "x" * 64


def body(publisher: int, phase: str, i: int, t_ns: int) -> dict[str, Any]:
    """The message for number ``i`` of ``phase`` sent by ``publisher`` at ``t_ns``."""
    return {"p": publisher, "ph": phase, "i": i, "t": t_ns, "pad": PAD}


def encode(msg: dict[str, Any]) -> bytes:
    """JSON bytes of a message (NATS and gossipsub payloads)."""
    return json.dumps(msg, separators=(",", ":")).encode()


def decode(data: bytes) -> Any:
    """Parse a payload made by :func:`encode` (anything else raises ``ValueError``)."""
    return json.loads(data)


def paced_due(elapsed_s: float, rate: float, total: int) -> int:
    """How many of ``total`` messages are due ``elapsed_s`` into a ``rate``/s run."""
    return min(total, int(elapsed_s * rate) + 1)


async def burst(
    req: dict[str, Any], send: Send, sleep: Callable[[float], Awaitable[None]]
) -> dict[str, Any]:
    """The ``publish`` op: ``req["n"]`` messages as fast as possible, in
    batches of ``req["batch"]``, yielding (``sleep(0)``) between batches."""
    n, batch, phase = int(req["n"]), int(req["batch"]), str(req["phase"])
    t0 = time.time_ns()
    i = 0
    while i < n:
        k = min(batch, n - i)
        await send(phase, i, i + k, time.time_ns())
        await sleep(0)
        i += k
    return {"sent": n, "t0_ns": t0, "t1_ns": time.time_ns()}


async def paced(
    req: dict[str, Any],
    send: Send,
    sleep: Callable[[float], Awaitable[None]],
    clock: Callable[[], float],
) -> dict[str, Any]:
    """The ``pace`` op: ``req["n"]`` messages at ``req["rate"]``/s; each due
    tick sends what is due (normally one message) stamped with the send time."""
    rate, total, phase = float(req["rate"]), int(req["n"]), str(req["phase"])
    start = clock()
    t0 = time.time_ns()
    i = 0
    while i < total:
        due = paced_due(clock() - start, rate, total)
        if due <= i:
            await sleep(max(0.0, start + i / rate - clock()))
            continue
        await send(phase, i, due, time.time_ns())
        i = due
    return {"sent": total, "t0_ns": t0, "t1_ns": time.time_ns()}


@dataclass
class _Phase:
    seen: dict[int, bytearray] = field(default_factory=dict)  # publisher -> bitmap of i
    count: int = 0
    duplicates: int = 0
    first_ns: int = 0
    last_ns: int = 0
    latency_us: list[int] = field(default_factory=list)


class Receipts:
    """Messages a worker received from *other* publishers, per phase.

    Counts distinct ``(publisher, i)`` pairs (a byte per ``i``, so loss and
    duplicates are exact and cheap), the first and last arrival times, and,
    for ``lat*`` phases, one latency sample per message (arrival minus the
    send time in the body; sender and receiver share the machine's clock).
    """

    def __init__(self, me: int) -> None:
        self.me = me
        self.phases: dict[str, _Phase] = {}
        self.malformed = 0

    def record(self, msg: Any, now_ns: int | None = None) -> None:
        """Note one received message (malformed ones are counted)."""
        try:
            p, ph, i, t = msg["p"], msg["ph"], msg["i"], msg["t"]
        except (KeyError, TypeError, IndexError):
            self.malformed += 1
            return
        if (
            type(p) is not int
            or type(i) is not int
            or type(t) is not int
            or type(ph) is not str
            or not 0 <= i < MAX_MESSAGES
        ):
            self.malformed += 1
            return
        if p == self.me:
            return
        now = time.time_ns() if now_ns is None else now_ns
        phase = self.phases.get(ph)
        if phase is None:
            phase = self.phases[ph] = _Phase(first_ns=now)
        bits = phase.seen.get(p)
        if bits is None:
            bits = phase.seen[p] = bytearray()
        if i >= len(bits):
            bits.extend(bytes(max(i + 1 - len(bits), len(bits))))
        if bits[i]:
            phase.duplicates += 1
            return
        bits[i] = 1
        phase.count += 1
        phase.last_ns = now
        if ph[:3] == "lat":
            phase.latency_us.append((now - t) // 1000)

    def report(self, phase: str, *, samples: bool = True) -> dict[str, Any]:
        """A JSON-ready summary of ``phase`` (zeros if nothing arrived).

        ``samples=False`` leaves out the latency list (cheap polling).
        """
        ph = self.phases.get(phase) or _Phase()
        return {
            "count": ph.count,
            "duplicates": ph.duplicates,
            "first_ns": ph.first_ns,
            "last_ns": ph.last_ns,
            "latency_us": ph.latency_us if samples else [],
            "malformed": self.malformed,
        }


def reply(obj: dict[str, Any]) -> None:
    """Write one JSON line to the parent."""
    sys.stdout.write(json.dumps(obj, separators=(",", ":")) + "\n")
    sys.stdout.flush()


async def serve_stdio(handlers: dict[str, Handler], hello: dict[str, Any]) -> None:
    """Answer the parent's requests (asyncio workers) until ``stop`` or EOF.

    Requests run one at a time; a handler error becomes ``{"ok": false}``
    (the worker keeps serving). EOF on stdin means the parent is gone.
    """
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 20)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    reply({"ok": True, **hello})
    while line := await reader.readline():
        try:
            req = json.loads(line)
            op = req["op"]
            if op == "stop":
                reply({"ok": True})
                return
            result = await handlers[op](req)
        except Exception as exc:  # reported to the parent, which fails the run
            reply({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
            continue
        reply({"ok": True, **result})
