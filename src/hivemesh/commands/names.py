"""Commands on human names: claim one, list them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from hivemesh.commands._base import Command, Reply
from hivemesh.commands.node import WRITE_ERRORS

__all__ = ["NameClaim", "NameClaimReply", "Names"]


@dataclass(frozen=True, slots=True)
class NameClaimReply(Reply):
    """The name's owner after the claim (an earlier claim wins)."""

    name: str
    owner: str
    ours: bool


@dataclass(frozen=True, slots=True)
class NameClaim(Command):
    """Claim ``name`` for this node."""

    op: ClassVar[str] = "name.claim"
    reply: ClassVar[type[Reply]] = NameClaimReply
    errors: ClassVar[tuple[str, ...]] = (*WRITE_ERRORS, "invalid_name")
    name: str


@dataclass(frozen=True, slots=True)
class Names(Command):
    """Every claimed name and its owner's address (an object)."""

    op: ClassVar[str] = "names"
