"""The typed commands of a node: one table that every face calls.

A command is a typed request (a frozen dataclass, :class:`Command`) with a
typed reply (:class:`Reply`), a stable wire name (``Command.op``) and the
error codes it may answer with (``Command.errors`` beside
:data:`COMMON_ERRORS`). :data:`COMMANDS` maps every wire name to its class;
the control socket validates a request into the typed request with
:meth:`Command.from_wire`, the daemon runs the command's one handler
(:mod:`hivemesh.runtime.handlers`), and the client decodes the answer with
``Command.reply.from_wire``::

    from hivemesh.commands import CtxSet
    reply = client.run(CtxSet(key="goal", value="ship it"))   # a CtxSetReply
    reply = await node.call(CtxSet(key="goal", value="ship it"))

This package imports the standard library and :mod:`hivemesh.errors` only,
and each name on first use (:mod:`hivemesh._lazy`): a client that runs one
command loads that command's module, not the whole table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hivemesh._lazy import lazy_exports

if TYPE_CHECKING:
    from hivemesh.commands._base import COMMON_ERRORS as COMMON_ERRORS
    from hivemesh.commands._base import Command as Command
    from hivemesh.commands._base import Record as Record
    from hivemesh.commands._base import Reply as Reply
    from hivemesh.commands._base import jsonable as jsonable
    from hivemesh.commands.audit import AuditAnswer as AuditAnswer
    from hivemesh.commands.audit import AuditExport as AuditExport
    from hivemesh.commands.audit import AuditInbox as AuditInbox
    from hivemesh.commands.audit import AuditStatus as AuditStatus
    from hivemesh.commands.context import CtxAdd as CtxAdd
    from hivemesh.commands.context import CtxAppend as CtxAppend
    from hivemesh.commands.context import CtxAppendReply as CtxAppendReply
    from hivemesh.commands.context import CtxContexts as CtxContexts
    from hivemesh.commands.context import CtxGet as CtxGet
    from hivemesh.commands.context import CtxIncr as CtxIncr
    from hivemesh.commands.context import CtxIncrReply as CtxIncrReply
    from hivemesh.commands.context import CtxMembers as CtxMembers
    from hivemesh.commands.context import CtxRemove as CtxRemove
    from hivemesh.commands.context import CtxSet as CtxSet
    from hivemesh.commands.context import CtxSetReply as CtxSetReply
    from hivemesh.commands.context import CtxWatch as CtxWatch
    from hivemesh.commands.context import MembersReply as MembersReply
    from hivemesh.commands.context import SetChangeReply as SetChangeReply
    from hivemesh.commands.coordination import Claim as Claim
    from hivemesh.commands.coordination import ClaimDone as ClaimDone
    from hivemesh.commands.coordination import ClaimDoneReply as ClaimDoneReply
    from hivemesh.commands.coordination import ClaimRelease as ClaimRelease
    from hivemesh.commands.coordination import ClaimReleaseReply as ClaimReleaseReply
    from hivemesh.commands.coordination import ClaimReply as ClaimReply
    from hivemesh.commands.coordination import ClaimShow as ClaimShow
    from hivemesh.commands.coordination import ClaimWait as ClaimWait
    from hivemesh.commands.coordination import ClaimWaitReply as ClaimWaitReply
    from hivemesh.commands.coordination import LeaseAcquire as LeaseAcquire
    from hivemesh.commands.coordination import LeaseAcquireReply as LeaseAcquireReply
    from hivemesh.commands.coordination import LeaseOkReply as LeaseOkReply
    from hivemesh.commands.coordination import LeaseRelease as LeaseRelease
    from hivemesh.commands.coordination import LeaseRenew as LeaseRenew
    from hivemesh.commands.coordination import LeaseShow as LeaseShow
    from hivemesh.commands.coordination import LeaseShowReply as LeaseShowReply
    from hivemesh.commands.coordination import LeaseVoters as LeaseVoters
    from hivemesh.commands.messages import Inbox as Inbox
    from hivemesh.commands.messages import Ping as Ping
    from hivemesh.commands.messages import PingReply as PingReply
    from hivemesh.commands.messages import Send as Send
    from hivemesh.commands.metrics import MetricsQuery as MetricsQuery
    from hivemesh.commands.metrics import MetricsRecord as MetricsRecord
    from hivemesh.commands.metrics import MetricsRecordReply as MetricsRecordReply
    from hivemesh.commands.metrics import MetricsSend as MetricsSend
    from hivemesh.commands.metrics import MetricsSendReply as MetricsSendReply
    from hivemesh.commands.names import NameClaim as NameClaim
    from hivemesh.commands.names import NameClaimReply as NameClaimReply
    from hivemesh.commands.names import Names as Names
    from hivemesh.commands.node import Append as Append
    from hivemesh.commands.node import EventReply as EventReply
    from hivemesh.commands.node import EventsWatch as EventsWatch
    from hivemesh.commands.node import FeedAcceptLoss as FeedAcceptLoss
    from hivemesh.commands.node import FeedStatus as FeedStatus
    from hivemesh.commands.node import Peers as Peers
    from hivemesh.commands.node import Status as Status
    from hivemesh.commands.node import Stop as Stop
    from hivemesh.commands.node import StopReply as StopReply
    from hivemesh.commands.plan import PlanCancel as PlanCancel
    from hivemesh.commands.plan import PlanCancelReply as PlanCancelReply
    from hivemesh.commands.plan import PlanGoal as PlanGoal
    from hivemesh.commands.plan import PlanGoalReply as PlanGoalReply
    from hivemesh.commands.plan import PlanShow as PlanShow
    from hivemesh.commands.sync import SyncMajority as SyncMajority
    from hivemesh.commands.sync import SyncMajorityReply as SyncMajorityReply
    from hivemesh.commands.table import COMMANDS as COMMANDS
    from hivemesh.commands.table import command_class as command_class
    from hivemesh.commands.trust import Invite as Invite
    from hivemesh.commands.trust import InviteReply as InviteReply
    from hivemesh.commands.trust import Join as Join
    from hivemesh.commands.trust import JoinReply as JoinReply
    from hivemesh.commands.trust import TrustAdmit as TrustAdmit
    from hivemesh.commands.trust import TrustAdmitReply as TrustAdmitReply
    from hivemesh.commands.trust import TrustList as TrustList
    from hivemesh.commands.trust import TrustListReply as TrustListReply
    from hivemesh.commands.trust import TrustRevoke as TrustRevoke
    from hivemesh.commands.trust import TrustRevokeReply as TrustRevokeReply

__all__ = [
    "COMMANDS",
    "COMMON_ERRORS",
    "Append",
    "AuditAnswer",
    "AuditExport",
    "AuditInbox",
    "AuditStatus",
    "Claim",
    "ClaimDone",
    "ClaimDoneReply",
    "ClaimRelease",
    "ClaimReleaseReply",
    "ClaimReply",
    "ClaimShow",
    "ClaimWait",
    "ClaimWaitReply",
    "Command",
    "CtxAdd",
    "CtxAppend",
    "CtxAppendReply",
    "CtxContexts",
    "CtxGet",
    "CtxIncr",
    "CtxIncrReply",
    "CtxMembers",
    "CtxRemove",
    "CtxSet",
    "CtxSetReply",
    "CtxWatch",
    "EventReply",
    "EventsWatch",
    "FeedAcceptLoss",
    "FeedStatus",
    "Inbox",
    "Invite",
    "InviteReply",
    "Join",
    "JoinReply",
    "LeaseAcquire",
    "LeaseAcquireReply",
    "LeaseOkReply",
    "LeaseRelease",
    "LeaseRenew",
    "LeaseShow",
    "LeaseShowReply",
    "LeaseVoters",
    "MembersReply",
    "MetricsQuery",
    "MetricsRecord",
    "MetricsRecordReply",
    "MetricsSend",
    "MetricsSendReply",
    "NameClaim",
    "NameClaimReply",
    "Names",
    "Peers",
    "Ping",
    "PingReply",
    "PlanCancel",
    "PlanCancelReply",
    "PlanGoal",
    "PlanGoalReply",
    "PlanShow",
    "Record",
    "Reply",
    "Send",
    "SetChangeReply",
    "Status",
    "Stop",
    "StopReply",
    "SyncMajority",
    "SyncMajorityReply",
    "TrustAdmit",
    "TrustAdmitReply",
    "TrustList",
    "TrustListReply",
    "TrustRevoke",
    "TrustRevokeReply",
    "command_class",
    "jsonable",
]

_WHERE = {
    "COMMON_ERRORS": "hivemesh.commands._base",
    "Command": "hivemesh.commands._base",
    "Record": "hivemesh.commands._base",
    "Reply": "hivemesh.commands._base",
    "jsonable": "hivemesh.commands._base",
    "AuditAnswer": "hivemesh.commands.audit",
    "AuditExport": "hivemesh.commands.audit",
    "AuditInbox": "hivemesh.commands.audit",
    "AuditStatus": "hivemesh.commands.audit",
    "CtxAdd": "hivemesh.commands.context",
    "CtxAppend": "hivemesh.commands.context",
    "CtxAppendReply": "hivemesh.commands.context",
    "CtxIncr": "hivemesh.commands.context",
    "CtxIncrReply": "hivemesh.commands.context",
    "CtxContexts": "hivemesh.commands.context",
    "CtxGet": "hivemesh.commands.context",
    "CtxMembers": "hivemesh.commands.context",
    "CtxRemove": "hivemesh.commands.context",
    "CtxSet": "hivemesh.commands.context",
    "CtxSetReply": "hivemesh.commands.context",
    "CtxWatch": "hivemesh.commands.context",
    "MembersReply": "hivemesh.commands.context",
    "SetChangeReply": "hivemesh.commands.context",
    "Claim": "hivemesh.commands.coordination",
    "ClaimDone": "hivemesh.commands.coordination",
    "ClaimDoneReply": "hivemesh.commands.coordination",
    "ClaimRelease": "hivemesh.commands.coordination",
    "ClaimReleaseReply": "hivemesh.commands.coordination",
    "ClaimReply": "hivemesh.commands.coordination",
    "ClaimShow": "hivemesh.commands.coordination",
    "ClaimWait": "hivemesh.commands.coordination",
    "ClaimWaitReply": "hivemesh.commands.coordination",
    "LeaseAcquire": "hivemesh.commands.coordination",
    "LeaseAcquireReply": "hivemesh.commands.coordination",
    "LeaseOkReply": "hivemesh.commands.coordination",
    "LeaseRelease": "hivemesh.commands.coordination",
    "LeaseRenew": "hivemesh.commands.coordination",
    "LeaseShow": "hivemesh.commands.coordination",
    "LeaseShowReply": "hivemesh.commands.coordination",
    "LeaseVoters": "hivemesh.commands.coordination",
    "Inbox": "hivemesh.commands.messages",
    "Ping": "hivemesh.commands.messages",
    "PingReply": "hivemesh.commands.messages",
    "Send": "hivemesh.commands.messages",
    "MetricsQuery": "hivemesh.commands.metrics",
    "MetricsRecord": "hivemesh.commands.metrics",
    "MetricsRecordReply": "hivemesh.commands.metrics",
    "MetricsSend": "hivemesh.commands.metrics",
    "MetricsSendReply": "hivemesh.commands.metrics",
    "NameClaim": "hivemesh.commands.names",
    "NameClaimReply": "hivemesh.commands.names",
    "Names": "hivemesh.commands.names",
    "Append": "hivemesh.commands.node",
    "EventReply": "hivemesh.commands.node",
    "EventsWatch": "hivemesh.commands.node",
    "FeedAcceptLoss": "hivemesh.commands.node",
    "FeedStatus": "hivemesh.commands.node",
    "Peers": "hivemesh.commands.node",
    "Status": "hivemesh.commands.node",
    "Stop": "hivemesh.commands.node",
    "StopReply": "hivemesh.commands.node",
    "PlanCancel": "hivemesh.commands.plan",
    "PlanCancelReply": "hivemesh.commands.plan",
    "PlanGoal": "hivemesh.commands.plan",
    "PlanGoalReply": "hivemesh.commands.plan",
    "PlanShow": "hivemesh.commands.plan",
    "SyncMajority": "hivemesh.commands.sync",
    "SyncMajorityReply": "hivemesh.commands.sync",
    "COMMANDS": "hivemesh.commands.table",
    "command_class": "hivemesh.commands.table",
    "Invite": "hivemesh.commands.trust",
    "InviteReply": "hivemesh.commands.trust",
    "Join": "hivemesh.commands.trust",
    "JoinReply": "hivemesh.commands.trust",
    "TrustAdmit": "hivemesh.commands.trust",
    "TrustAdmitReply": "hivemesh.commands.trust",
    "TrustList": "hivemesh.commands.trust",
    "TrustListReply": "hivemesh.commands.trust",
    "TrustRevoke": "hivemesh.commands.trust",
    "TrustRevokeReply": "hivemesh.commands.trust",
}

__getattr__ = lazy_exports(__name__, _WHERE)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
