"""Applications in the daemon: the one interface they plug in through.

The daemon knows no application's modules (issue 12's layering rule). An
application is a class with the shape of :class:`App`, named in
:data:`APPS` as ``"module:Class"`` and built at start with the daemon as its
only argument; it uses the daemon's public methods and nothing private.
The daemon then:

* starts the applications, in :data:`APPS` order, once the node is up, and
  stops them in reverse order first thing at shutdown (:meth:`App.start`,
  :meth:`App.stop`; long-lived tasks go under ``daemon.supervisor``);
* shows :meth:`App.status` as the section :attr:`App.name` of ``hivemesh status``;
* runs the commands of :meth:`App.commands` (each a command type of
  :data:`hivemesh.commands.COMMANDS` and the handler of its typed request);
* hands a direct message to a name in :attr:`App.addressees` to
  :meth:`App.deliver` instead of the inbox.

Requests of a kind from other nodes are registered by the application
itself (``daemon.messaging.on_message(kind, handler)``). Faces that need an
application's own API get it by class: ``daemon.app(TelemetryApp)``.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from hivemesh.commands import Command, Reply
    from hivemesh.runtime.daemon import Daemon

__all__ = ["APPS", "App", "AppHandler", "load"]

#: The applications every daemon runs, in start order.
APPS = ("hivemesh.telemetry.app:TelemetryApp",)

#: The handler of one of an application's commands.
AppHandler = Callable[[Any], Awaitable["Reply"]]


class App(Protocol):
    """What the daemon calls of an application (see module docs)."""

    #: Its section of ``hivemesh status``.
    name: str
    #: Names whose direct messages :meth:`deliver` takes.
    addressees: frozenset[str]

    async def start(self) -> None:
        """Start (the node is up: links, store, views)."""

    async def stop(self) -> None:
        """Stop promptly; called once, before the node's links close."""

    def status(self) -> dict[str, Any]:
        """Its section of ``hivemesh status``."""

    def commands(self) -> Mapping[type[Command], AppHandler]:
        """The commands it answers, each with its handler."""

    async def deliver(self, to: str, data: Any, *, timeout_s: float) -> dict[str, Any]:
        """A direct message to one of :attr:`addressees`; the send's reply."""


def load(spec: str) -> Callable[[Daemon], App]:
    """The application class named ``"module:Class"``."""
    module, _, name = spec.partition(":")
    factory: Callable[[Daemon], App] = getattr(importlib.import_module(module), name)
    return factory
