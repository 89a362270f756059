"""Feed inputs to targets, count them, and classify every outcome.

:class:`Tally` is the one counter both drivers share: the hypothesis tests in
CI (``tests/test_fuzz_budget.py``) and ``hivemesh fuzz --budget N``, which
needs no hypothesis: it mutates each target's seed corpus with a seeded
:class:`random.Random` (bit flips, byte sets, truncation, insertion of
random or "interesting" bytes, splices of two corpus entries, and raw random
bytes), so a run is replayed by its seed.

Outcomes of one input: ``ok`` (accepted), ``typed`` (a
:class:`~hivemesh.errors.HivemeshError`) or ``untyped`` (anything else,
including :class:`~hivemesh.fuzz.targets.Untyped` verdicts). The first few
untyped inputs are kept (hex, exception) so a failure can be replayed.
"""

from __future__ import annotations

import math
import random
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from hivemesh.errors import HivemeshError
from hivemesh.fuzz.targets import Target

__all__ = ["Finding", "Tally", "feed_one", "mutate", "run_budget"]

#: untyped findings kept per target
KEEP_FINDINGS = 5
_INTERESTING = [
    b"\x00",
    b"\xff",
    b"\x7f",
    b"\x80",
    b"\xc1",
    b"\xdc\xff\xff",
    b"\xdf\xff\xff\xff\xff",
    b"\xcf" + b"\xff" * 8,
    b"\xd9\xff",
    b'"',
    b"{",
    b"[" * 64,
    b"\\u0000",
    b"\xed\xa0\x80",
]


@dataclass(frozen=True)
class Finding:
    """One input that ended in an untyped exception."""

    target: str
    input_hex: str
    error: str


@dataclass
class Tally:
    """Inputs and outcomes per target."""

    inputs: dict[str, int] = field(default_factory=dict)
    typed: dict[str, int] = field(default_factory=dict)
    untyped: dict[str, int] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def total_inputs(self) -> int:
        """Inputs fed to every target."""
        return sum(self.inputs.values())

    @property
    def total_untyped(self) -> int:
        """Untyped exceptions over every target."""
        return sum(self.untyped.values())

    def to_json(self) -> dict[str, Any]:
        """A JSON-able summary (the report of ``hivemesh fuzz --json``)."""
        names = sorted(self.inputs)
        return {
            "inputs": self.total_inputs,
            "untyped": self.total_untyped,
            "elapsed_s": round(self.elapsed_s, 2),
            "targets": {
                n: {
                    "inputs": self.inputs[n],
                    "typed": self.typed.get(n, 0),
                    "untyped": self.untyped.get(n, 0),
                }
                for n in names
            },
            "findings": [f.__dict__ for f in self.findings],
        }

    def table(self) -> str:
        """A plain-text table, one row per target and a total."""
        rows = [f"{'target':<20} {'inputs':>9} {'typed':>9} {'untyped':>8}"]
        for n in sorted(self.inputs):
            rows.append(
                f"{n:<20} {self.inputs[n]:>9} {self.typed.get(n, 0):>9} {self.untyped.get(n, 0):>8}"
            )
        rows.append(f"{'total':<20} {self.total_inputs:>9} {'':>9} {self.total_untyped:>8}")
        return "\n".join(rows)


def feed_one(target: Target, data: bytes, tally: Tally) -> str:
    """Feed ``data`` to ``target``; count and return the outcome."""
    name = target.name
    tally.inputs[name] = tally.inputs.get(name, 0) + 1
    try:
        target.feed(data)
    except HivemeshError:
        tally.typed[name] = tally.typed.get(name, 0) + 1
        return "typed"
    except Exception as exc:
        tally.untyped[name] = tally.untyped.get(name, 0) + 1
        if sum(f.target == name for f in tally.findings) < KEEP_FINDINGS:
            last = traceback.extract_tb(exc.__traceback__)[-1:]
            where = f" at {last[0].filename}:{last[0].lineno}" if last else ""
            tally.findings.append(
                Finding(name, data[:512].hex(), f"{type(exc).__name__}: {exc}"[:300] + where)
            )
        return "untyped"
    return "ok"


def mutate(rnd: random.Random, corpus: list[bytes], max_size: int) -> bytes:
    """One input derived from ``corpus`` (or fresh random bytes)."""
    pick = rnd.random()
    if pick < 0.08 or not corpus:
        return rnd.randbytes(rnd.randrange(0, min(max_size, 512)))
    data = bytearray(rnd.choice(corpus))
    for _ in range(rnd.choice((1, 1, 1, 2, 3, 5, 8))):
        op = rnd.randrange(7)
        pos = rnd.randrange(len(data) + 1)
        if op == 0 and data:  # flip one bit
            i = min(pos, len(data) - 1)
            data[i] ^= 1 << rnd.randrange(8)
        elif op == 1 and data:  # set a byte
            data[min(pos, len(data) - 1)] = rnd.randrange(256)
        elif op == 2:  # truncate
            del data[pos:]
        elif op == 3:  # insert interesting bytes
            data[pos:pos] = rnd.choice(_INTERESTING)
        elif op == 4:  # insert random bytes
            data[pos:pos] = rnd.randbytes(rnd.randrange(1, 16))
        elif op == 5 and data:  # delete a range
            del data[pos : pos + rnd.randrange(1, 16)]
        else:  # splice another corpus entry
            other = rnd.choice(corpus)
            cut = rnd.randrange(len(other) + 1)
            data[pos:] = other[cut:]
    return bytes(data[:max_size])


def run_budget(
    targets: list[Target], budget: int, *, seed: int = 0, time_limit_s: float | None = None
) -> Tally:
    """Feed ``budget`` inputs in total, shared by weight (each target gets at
    least its corpus), mutated from each target's corpus with
    ``random.Random(f"{seed}/{name}")``. Stops early at ``time_limit_s``."""
    tally = Tally()
    t0 = time.monotonic()
    weights = sum(t.weight for t in targets) or 1.0
    for target in targets:
        share = max(len(target.corpus), math.ceil(budget * target.weight / weights))
        rnd = random.Random(f"{seed}/{target.name}")
        for data in target.corpus:  # the valid inputs first: they must pass
            feed_one(target, data, tally)
        for i in range(share - len(target.corpus)):
            checked = i % 256 == 0 and time_limit_s is not None
            if checked and time.monotonic() - t0 > (time_limit_s or 0.0):
                break
            feed_one(target, mutate(rnd, target.corpus, target.max_size), tally)
    tally.elapsed_s = time.monotonic() - t0
    return tally
