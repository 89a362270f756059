"""Commands of the price audit (:mod:`hivemesh.audit`): the operator's
inbox of escalated questions, answers, progress and the export a report is
built from. Each node answers them from its own journal."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from hivemesh.commands._base import Command
from hivemesh.errors import InvalidArgument

__all__ = ["AuditAnswer", "AuditExport", "AuditInbox", "AuditStatus"]

#: Longest answer text accepted.
MAX_ANSWER_CHARS = 2000


@dataclass(frozen=True, slots=True)
class AuditInbox(Command):
    """Questions agents escalated to a human, oldest first (``all``: the
    answered ones too): ``{"questions": [{id, audit, shop, question, reason,
    asked_by, answer}]}``."""

    op: ClassVar[str] = "audit.inbox"
    all: bool = False


@dataclass(frozen=True, slots=True)
class AuditAnswer(Command):
    """Answer question ``id`` (appended to the journal; every agent sees
    it): ``{"answered": id, "seq": n}``."""

    op: ClassVar[str] = "audit.answer"
    errors: ClassVar[tuple[str, ...]] = ("unknown_escalation",)
    id: str = ""
    text: str = ""

    def check(self) -> None:
        """A non-empty id; 1..2000 characters of text."""
        if not self.id:
            raise InvalidArgument("the question id must be a non-empty string")
        if not self.text.strip() or len(self.text) > MAX_ANSWER_CHARS:
            raise InvalidArgument(f"the answer must be 1..{MAX_ANSWER_CHARS} characters of text")


@dataclass(frozen=True, slots=True)
class AuditStatus(Command):
    """The latest audit's progress (shops, batches, done, open questions)."""

    op: ClassVar[str] = "audit.status"


@dataclass(frozen=True, slots=True)
class AuditExport(Command):
    """One audit as plain data (the latest unless ``audit`` names one)."""

    op: ClassVar[str] = "audit.export"
    audit: str | None = None
