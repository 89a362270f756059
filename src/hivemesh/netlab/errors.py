"""The network lab's errors (subclasses of :class:`hivemesh.errors.LocalProtocolError`).

::

    LocalProtocolError
    └── NetlabError              a lab operation failed
        ├── NetlabUnavailable    namespaces cannot be made here (not root, no ip/nft)
        └── NetlabCommandFailed  an ip/nft/conntrack command exited non-zero or timed out

They are the test environment's faults, never a peer's: a test that meets
:class:`NetlabUnavailable` skips with its message as the reason.
"""

from __future__ import annotations

from hivemesh.errors import LocalProtocolError

__all__ = ["NetlabCommandFailed", "NetlabError", "NetlabUnavailable"]


class NetlabError(LocalProtocolError):
    """A network-lab operation failed."""

    code = "netlab_error"


class NetlabUnavailable(NetlabError):
    """Network namespaces cannot be created here; the message says why."""

    code = "netlab_unavailable"


class NetlabCommandFailed(NetlabError):
    """A lab command (``ip``, ``nft``, ``conntrack``) failed or overran its deadline."""

    code = "netlab_command_failed"
