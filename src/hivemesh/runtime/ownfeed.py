"""The control ops of the own feed's write gate: ``feed.status`` and
``feed.accept_loss``.

The core decides (:mod:`hivemesh.core.ownfeed`: the mark, the gate, the
recovery) and the :class:`~hivemesh.core.peer.Peer` acts on its changes (it
logs every change of state, and runs the appends of a new life once the
feed takes writes). ``feed.accept_loss`` is the operator's documented way on
when no peer can supply the missing part; it needs ``confirm: true`` and is
logged as a warning and counted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hivemesh.core.peer_commands import AcceptFeedLoss
from hivemesh.errors import InvalidArgument
from hivemesh.runtime.control import register_op

if TYPE_CHECKING:
    from hivemesh.runtime.daemon import Daemon

__all__ = ["register"]


async def _feed_status(d: Daemon, args: dict[str, Any]) -> Any:
    return {**d.node.feed_gate.status(), "deferred": d.node.deferred}


async def _feed_accept_loss(d: Daemon, args: dict[str, Any]) -> Any:
    if args.get("confirm") is not True:
        raise InvalidArgument("feed.accept_loss needs confirm=true (see `hivemesh feed --help`)")
    lost = await d.call(AcceptFeedLoss())
    return {**lost, "own_feed": d.node.feed_gate.status()}


def register() -> None:
    """Add the ``feed.*`` ops to the control socket's table (idempotent)."""
    register_op("feed.status", _feed_status)
    register_op("feed.accept_loss", _feed_accept_loss)
