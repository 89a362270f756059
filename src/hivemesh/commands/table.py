"""The one table of commands: wire name -> typed request class.

Built here, explicitly, from the command modules; importing it registers
nothing anywhere. Every face -- the control socket, the ``hivemesh`` CLI,
:class:`hivemesh.Node`, and later the MCP server, dashboard and HTTP --
looks commands up here.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from hivemesh.commands._base import Command
from hivemesh.commands.audit import AuditAnswer, AuditExport, AuditInbox, AuditStatus
from hivemesh.commands.context import (
    CtxAdd,
    CtxAppend,
    CtxContexts,
    CtxGet,
    CtxIncr,
    CtxMembers,
    CtxRemove,
    CtxSet,
    CtxWatch,
)
from hivemesh.commands.coordination import (
    Claim,
    ClaimDone,
    ClaimRelease,
    ClaimShow,
    ClaimWait,
    LeaseAcquire,
    LeaseRelease,
    LeaseRenew,
    LeaseShow,
    LeaseVoters,
)
from hivemesh.commands.messages import Inbox, Ping, Send
from hivemesh.commands.metrics import MetricsQuery, MetricsRecord, MetricsSend
from hivemesh.commands.names import NameClaim, Names
from hivemesh.commands.node import (
    Append,
    EventsWatch,
    FeedAcceptLoss,
    FeedStatus,
    Peers,
    Status,
    Stop,
)
from hivemesh.commands.plan import PlanCancel, PlanGoal, PlanShow
from hivemesh.commands.sync import SyncMajority
from hivemesh.commands.trust import Invite, Join, TrustAdmit, TrustList, TrustRevoke
from hivemesh.errors import UnknownCommand

__all__ = ["COMMANDS", "command_class"]

_ALL: tuple[type[Command], ...] = (
    Append,
    AuditAnswer,
    AuditExport,
    AuditInbox,
    AuditStatus,
    Claim,
    ClaimDone,
    ClaimRelease,
    ClaimShow,
    ClaimWait,
    CtxAdd,
    CtxAppend,
    CtxContexts,
    CtxGet,
    CtxIncr,
    CtxMembers,
    CtxRemove,
    CtxSet,
    CtxWatch,
    EventsWatch,
    FeedAcceptLoss,
    FeedStatus,
    Inbox,
    Invite,
    Join,
    LeaseAcquire,
    LeaseRelease,
    LeaseRenew,
    LeaseShow,
    LeaseVoters,
    MetricsQuery,
    MetricsRecord,
    MetricsSend,
    NameClaim,
    Names,
    Peers,
    Ping,
    PlanCancel,
    PlanGoal,
    PlanShow,
    Send,
    Status,
    Stop,
    SyncMajority,
    TrustAdmit,
    TrustList,
    TrustRevoke,
)

#: Every command by its wire name.
COMMANDS: Mapping[str, type[Command]] = MappingProxyType({c.op: c for c in _ALL})


def command_class(op: object) -> type[Command]:
    """The command named ``op``; :class:`~hivemesh.errors.UnknownCommand` if none."""
    cls = COMMANDS.get(op) if isinstance(op, str) else None
    if cls is None:
        raise UnknownCommand(f"unknown command {op!r:.80}; known: {', '.join(sorted(COMMANDS))}")
    return cls
