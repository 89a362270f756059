"""Record a :class:`~hivemesh.core.peer.Peer`'s inputs and effects; replay them.

Theory of operation
-------------------
A Peer is a function of its inputs: same construction, same inputs in the
same order, same effects. A :class:`Trace` handed to the Peer
(``Peer(..., trace=Trace(seed))``) records every input method with its
arguments (``receive``, ``link_up``, ``command``, ``settle``,
``handle_timer``, ...) and every :meth:`Peer.effects` call with what it
returned; it also keeps what the Peer was built with (time, config, trust
file content, the own feed's mark). :func:`replay` builds a fresh Peer from
those, the same identity, a store holding what the traced one's held at
construction (an empty :class:`~hivemesh.core.store.MemoryStore` for a node
that started on a new data dir) and ``random.Random(trace.seed)``, feeds it
the recorded inputs in order, and compares every ``effects()`` result with
the recorded one. An empty list of differences means the driver that made
the trace (the asyncio daemon, the simulator) and the replaying one wired
the same machine: nothing the driver did outside the Peer's inputs changed
what the Peer decided.

:func:`feed` is that replay's one loop, over anything that takes the Peer's
inputs under the Peer's method names and drains with ``effects()``: the Peer
itself (:func:`replay`), or a driver's wiring of it, such as the simulator's
:class:`~hivemesh.sim.peer_adapter.PeerAdapter`, so a trace recorded by the
daemon also checks that the simulator hands every input to the Peer as the
daemon does.

A trace holds every frame and stored event, so it grows with the run; it is
for tests and for replaying a bug, not for production.
"""

from __future__ import annotations

from copy import deepcopy
from dataclasses import dataclass, field
from random import Random
from typing import Any, Protocol

from hivemesh.core.effects import Effect
from hivemesh.core.identity import Identity
from hivemesh.core.ownfeed import Mark, MemoryMarkStore
from hivemesh.core.store import FeedStore

__all__ = ["Driven", "Step", "Trace", "feed", "replay"]

#: The Peer's input methods a trace may name (anything else is refused on replay).
INPUTS = frozenset(
    {
        "rehydrate",
        "start",
        "receive",
        "receive_many",
        "link_up",
        "link_down",
        "admit_channel",
        "redeemed",
        "join_refused",
        "trust_changed",
        "settle",
        "handle_timer",
        "command",
        "inbox_room",
        "persisted",
        "handled",
        "lease_synced",
        "effects",
    }
)


@dataclass(frozen=True, slots=True)
class Step:
    """One call on the Peer: an input with its arguments, or an ``effects``
    drain with what it returned."""

    method: str
    args: tuple[Any, ...] = ()
    effects: tuple[Effect, ...] = ()


@dataclass(slots=True)
class Trace:
    """The recorded life of one Peer (``seed``: its ``random.Random`` seed)."""

    seed: int
    steps: list[Step] = field(default_factory=list)
    #: what the Peer was built with: now_ms, PeerConfig, TrustFile, its
    #: mark store's content (None: it had no mark store), its LeaseSetup
    setup: tuple[Any, ...] = ()

    def begin(
        self,
        now_ms: int,
        config: Any,
        trust: Any,
        marks: tuple[Mark | None] | None,
        leases: Any = None,
    ) -> None:
        """Record the Peer's construction (the Peer calls this)."""
        self.setup = (now_ms, config, trust, marks, leases)

    def record(self, method: str, *args: Any) -> None:
        """Record one input (the Peer calls this)."""
        self.steps.append(Step(method, args))

    def drained(self, effects: list[Effect]) -> None:
        """Record one ``effects()`` result (the Peer calls this), as it is
        now: a copy, since a driver may change what it was handed (the
        daemon adds ``rtt_ms`` to a direct send's reply value)."""
        self.steps.append(Step("effects", (), tuple(deepcopy(effects))))

    def inputs(self) -> int:
        """How many inputs (not drains) were recorded."""
        return sum(1 for s in self.steps if s.method != "effects")


class Driven(Protocol):
    """What :func:`feed` drives: the Peer's input methods (looked up by the
    names in :data:`INPUTS`) and its drain."""

    def effects(self) -> list[Effect]:
        """What to do, in order (drains)."""
        ...


def feed(machine: Driven, steps: list[Step]) -> list[str]:
    """Give ``machine`` the recorded inputs in order, calling its method of
    each input's name; at every recorded drain, drain it and compare. The
    differences found (empty: the same effects at every drain; at most 10)."""
    diffs: list[str] = []
    for n, step in enumerate(steps):
        if step.method not in INPUTS:
            raise ValueError(f"step {n}: {step.method!r} is not a Peer input")
        if step.method == "effects":
            got = tuple(machine.effects())
            if got != step.effects:
                diffs.append(_describe(n, step.effects, got))
                if len(diffs) >= 10:
                    break
            continue
        getattr(machine, step.method)(*step.args)
    return diffs


def replay(trace: Trace, identity: Identity, store: FeedStore) -> list[str]:
    """Build a fresh Peer as the traced one was (module docs), feed it the
    trace; the differences found (empty: the same effects at every drain)."""
    from hivemesh.core.peer import Peer  # the Peer imports this module

    now_ms, config, trust, marks, leases = trace.setup
    peer = Peer(
        identity,
        store,
        Random(trace.seed),
        now_ms=now_ms,
        config=config,
        trust=trust,
        marks=None if marks is None else MemoryMarkStore(marks[0]),
        leases=leases,
    )
    return feed(peer, trace.steps)


def _describe(n: int, want: tuple[Effect, ...], got: tuple[Effect, ...]) -> str:
    for i, (w, g) in enumerate(zip(want, got, strict=False)):
        if w != g:
            return f"step {n}, effect {i}: recorded {w!r:.300}, replayed {g!r:.300}"
    return f"step {n}: recorded {len(want)} effects, replayed {len(got)}"
