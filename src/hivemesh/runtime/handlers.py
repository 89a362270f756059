"""The daemon's one handler per command of :data:`hivemesh.commands.COMMANDS`.

:func:`execute` runs a typed request against a daemon and returns its typed
reply; the control socket (:mod:`hivemesh.runtime.control`) and
:class:`hivemesh.Node` both call it, so a command behaves the same through
every face. :data:`HANDLERS` is built explicitly below; a test checks that
it covers the table exactly. Streaming commands (``ctx.watch``,
``events.watch``) have a handler in :data:`STREAMS` that yields events.

Handlers of applications live with them and are named here: lease and
lease ops in :mod:`hivemesh.runtime.leases`, telemetry's through the
daemon's applications (:mod:`hivemesh.runtime.apps`), and the
planner's in :mod:`hivemesh.roles.meshops`, imported on a node's first plan
command (a node that never plans never loads the planner).
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from hivemesh import commands as c
from hivemesh.commands import COMMANDS, Command, Record, Reply, jsonable
from hivemesh.core.event import Event
from hivemesh.core.identity import address_of
from hivemesh.core.peer import Peer
from hivemesh.errors import DeadlineExceeded, LocalProtocolError, UnknownCommand
from hivemesh.runtime import leases

if TYPE_CHECKING:
    from hivemesh.runtime.daemon import Daemon

__all__ = ["HANDLERS", "STREAMS", "event_json", "execute", "open_stream"]

log = logging.getLogger("hivemesh.runtime.handlers")

Handler = Callable[["Daemon", Any], Awaitable[Reply]]
StreamHandler = Callable[["Daemon", Any], AsyncIterator[dict[str, Any]]]


def event_json(ev: Event) -> dict[str, Any]:
    """An event as plain JSON data."""
    return {
        "author": address_of(ev.author),
        "seq": ev.seq,
        "hlc": ev.hlc,
        "kind": ev.kind,
        "id": ev.id.hex(),
        "body": jsonable(ev.body),
    }


# -- the node ------------------------------------------------------------------------


async def _by_peer(d: Daemon, req: Command) -> Reply:
    """A command the Peer answers from its own state (:mod:`hivemesh.core.answers`,
    :meth:`hivemesh.core.peer.Peer.command`): the daemon only carries it there
    (a plain answer, such as ``lease.voters``' figures, is a :class:`Record`)."""
    reply = await d.call(req)
    return reply if isinstance(reply, Reply) else Record(reply)


async def _status(d: Daemon, req: c.Status) -> Record:
    return Record(d.status())


async def _peers(d: Daemon, req: c.Peers) -> Record:
    return Record(d.peers())


async def _stop(d: Daemon, req: c.Stop) -> c.StopReply:
    asyncio.get_running_loop().call_soon(d.request_stop)
    return c.StopReply(stopping=True)


async def _feed_accept_loss(d: Daemon, req: c.FeedAcceptLoss) -> Record:
    lost = await d.call(req)  # the Peer logs it as a warning
    return Record({**lost, "own_feed": d.node.feed_gate.status()})


async def _append(d: Daemon, req: c.Append) -> c.EventReply:
    return c.EventReply(**event_json(await d.append(req.kind, req.body)))


# -- names and trust -----------------------------------------------------------------


async def _revoke(d: Daemon, req: c.TrustRevoke) -> c.TrustRevokeReply:
    addr = d.check_address(req.address)
    await d.revoke(addr)
    return c.TrustRevokeReply(revoked=addr)


async def _admit(d: Daemon, req: c.TrustAdmit) -> c.TrustAdmitReply:
    addr = d.check_address(req.address)
    d.admit(addr)
    return c.TrustAdmitReply(trusted=addr)


async def _trust_list(d: Daemon, req: c.TrustList) -> c.TrustListReply:
    t = d.trust
    return c.TrustListReply(
        mode=d.config.trust_mode, trusted=t.trusted(), revoked=t.revoked(), swarms=t.swarms()
    )


async def _invite(d: Daemon, req: c.Invite) -> c.InviteReply:
    return c.InviteReply(**d.invite(req.ttl_s, req.swarm))


async def _join(d: Daemon, req: c.Join) -> c.JoinReply:
    # answers before this request's own deadline (timeout_s + 1 s, else control_timeout_s)
    timeout_s = req.timeout_s or max(1.0, d.config.control_timeout_s - 1.0)
    return c.JoinReply(**await d.join(req.token, timeout_s=timeout_s))


# -- direct messages -----------------------------------------------------------------


async def _send(d: Daemon, req: c.Send) -> Record:
    return Record(await d.send_direct(req.to, req.data, timeout_s=req.timeout_s))


async def _inbox(d: Daemon, req: c.Inbox) -> Record:
    return Record(d.inbox(req.limit, remove=req.remove))


async def _ping(d: Daemon, req: c.Ping) -> c.PingReply:
    return c.PingReply(**await d.ping(req.address, timeout_s=req.timeout_s))


# -- applications (hivemesh.runtime.apps: their commands live with them) -------------


async def _by_app(d: Daemon, req: Command) -> Reply:
    return await d.app_command(req)


# -- the planner (an application: its handlers live with it) -----------------------------


def _planner(name: str) -> Handler:
    async def handle(d: Daemon, req: Command) -> Reply:
        meshops = importlib.import_module("hivemesh.roles.meshops")
        result: Reply = await getattr(meshops, name)(d, req)
        return result

    handle.__name__ = name
    return handle


# -- the audit (hivemesh.audit.ops, imported on a node's first audit command) --------


async def _audit_inbox(d: Daemon, req: c.AuditInbox) -> Record:
    ops = importlib.import_module("hivemesh.audit.ops")
    return Record({"questions": ops.questions(ops.audit_view(d), include_answered=req.all)})


async def _audit_answer(d: Daemon, req: c.AuditAnswer) -> Record:
    ops = importlib.import_module("hivemesh.audit.ops")
    return Record(await ops.answer(d, req.id, req.text))


async def _audit_status(d: Daemon, req: c.AuditStatus) -> Record:
    ops = importlib.import_module("hivemesh.audit.ops")
    return Record(ops.status(ops.audit_view(d)))


async def _audit_export(d: Daemon, req: c.AuditExport) -> Record:
    ops = importlib.import_module("hivemesh.audit.ops")
    return Record(ops.export(ops.audit_view(d), req.audit))


# -- streams -------------------------------------------------------------------------


async def _ctx_watch(d: Daemon, req: c.CtxWatch) -> AsyncIterator[dict[str, Any]]:
    await d.rehydration.wait()  # the views are complete
    sub = d.subscribe(["ctx.update"])
    try:
        snap = d.context_view.snapshot().get(req.context, {})
        yield {"context": req.context, "state": jsonable(snap)}
        while True:
            ev = await sub.queue.get()
            if not isinstance(ev.body, dict) or ev.body.get("c") != req.context:
                continue
            snap = d.context_view.snapshot().get(req.context, {})
            yield {"context": req.context, "author": address_of(ev.author), "state": jsonable(snap)}
    finally:
        d.unsubscribe(sub)


async def _events_watch(d: Daemon, req: c.EventsWatch) -> AsyncIterator[dict[str, Any]]:
    await d.rehydration.wait()  # the views are complete
    sub = d.subscribe(req.kinds)
    try:
        while True:
            yield event_json(await sub.queue.get())
    finally:
        d.unsubscribe(sub)


#: The driver's own handlers: what needs its parts (status, stop, trust file,
#: invites, applications) or, for leases, the broker mode's backend.
_DRIVER: Mapping[type[Command], Handler] = {
    c.Append: _append,
    c.AuditAnswer: _audit_answer,
    c.AuditExport: _audit_export,
    c.AuditInbox: _audit_inbox,
    c.AuditStatus: _audit_status,
    c.FeedAcceptLoss: _feed_accept_loss,
    c.Inbox: _inbox,
    c.Invite: _invite,
    c.Join: _join,
    c.LeaseAcquire: leases.on_acquire,
    c.LeaseRelease: leases.on_release,
    c.LeaseRenew: leases.on_renew,
    c.LeaseShow: leases.on_show,
    c.MetricsQuery: _by_app,
    c.MetricsRecord: _by_app,
    c.MetricsSend: _by_app,
    c.Peers: _peers,
    c.Ping: _ping,
    c.PlanCancel: _planner("handle_cancel"),
    c.PlanGoal: _planner("handle_goal"),
    c.PlanShow: _planner("handle_show"),
    c.Send: _send,
    c.Status: _status,
    c.Stop: _stop,
    c.TrustAdmit: _admit,
    c.TrustList: _trust_list,
    c.TrustRevoke: _revoke,
}

#: The handler of every request-reply command: the Peer's command table
#: (:meth:`hivemesh.core.peer.Peer.answers`) routes a command to the Peer
#: unless the driver answers it itself.
HANDLERS: Mapping[type[Command], Handler] = {
    **{cls: _by_peer for cls in COMMANDS.values() if Peer.answers(cls)},
    **_DRIVER,
}

#: The handler of every streaming command.
STREAMS: Mapping[type[Command], StreamHandler] = {
    c.CtxWatch: _ctx_watch,
    c.EventsWatch: _events_watch,
}


async def execute(d: Daemon, req: Command) -> Reply:
    """Run ``req`` on ``d`` and return its typed reply (errors propagate typed).

    Every command runs under a deadline: its own ``timeout_s`` (or
    ``wait_s``) plus a second, else the daemon's ``control_timeout_s``;
    past it, :class:`~hivemesh.errors.DeadlineExceeded`.
    """
    handler = HANDLERS.get(type(req))
    if handler is None:
        raise UnknownCommand(f"{req.op!r} is not a request-reply command")
    own = req.deadline_s()
    timeout = d.config.control_timeout_s if own is None else own + 1.0
    try:
        async with asyncio.timeout(timeout):  # no extra task per request (wait_for's)
            if req.op != "status":  # the rest needs complete views (runtime.rehydration)
                await d.rehydration.wait()
            reply = await handler(d, req)
    except TimeoutError:
        raise DeadlineExceeded(f"{req.op} did not finish in {timeout:.1f}s") from None
    if not isinstance(reply, type(req).reply):  # a bug: the handler broke the contract
        raise LocalProtocolError(f"{req.op}: handler answered {type(reply).__name__}")
    return reply


def open_stream(d: Daemon, req: Command) -> AsyncIterator[dict[str, Any]]:
    """The events of a streaming command ``req`` (closed by the caller)."""
    handler = STREAMS.get(type(req))
    if handler is None:
        raise UnknownCommand(f"{req.op!r} is not a streaming command")
    return handler(d, req)
