"""The node's trust list (``trust.json``): who may connect and write.

Two sets of addresses, persisted atomically (temp file, fsync, rename) with
mode 0600::

    {"version": 1, "trusted": ["hm..."], "revoked": ["hm..."]}

* In ``open`` trust mode any authenticated peer is admitted unless revoked.
* In ``invite`` mode only trusted addresses are admitted, and never revoked
  ones.

Revocation is checked at the handshake (the channel is refused), on live
channels (the daemon closes them) and at the journal gate (the core refuses
new events authored by a revoked address as ``untrusted_author``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from hivemesh.errors import ConfigError

__all__ = ["TrustList"]


class TrustList:
    """Trusted and revoked addresses, saved on every change."""

    def __init__(self, path: Path, trusted: set[str], revoked: set[str]) -> None:
        self.path = path
        self.trusted = trusted
        self.revoked = revoked

    @classmethod
    def load(cls, path: Path) -> TrustList:
        """Read ``path`` (an absent file is an empty list)."""
        if not path.exists():
            return cls(path, set(), set())
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
            trusted = {str(a) for a in doc.get("trusted", [])}
            revoked = {str(a) for a in doc.get("revoked", [])}
        except (ValueError, AttributeError, TypeError) as exc:
            raise ConfigError(f"{path}: not a valid trust list: {exc}") from None
        return cls(path, trusted, revoked)

    def admits(self, address: str, *, open_mode: bool) -> bool:
        """True if ``address`` may connect and author events."""
        if address in self.revoked:
            return False
        return open_mode or address in self.trusted

    def is_revoked(self, address: str) -> bool:
        """True if ``address`` was revoked."""
        return address in self.revoked

    def admit(self, address: str) -> None:
        """Trust ``address`` and lift a revocation."""
        self.trusted.add(address)
        self.revoked.discard(address)
        self.save()

    def revoke(self, address: str) -> None:
        """Revoke ``address``."""
        self.revoked.add(address)
        self.trusted.discard(address)
        self.save()

    def save(self) -> None:
        """Write the list atomically with mode 0600."""
        doc = {"version": 1, "trusted": sorted(self.trusted), "revoked": sorted(self.revoked)}
        tmp = self.path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
