"""Who may reach a face served over HTTP (the MCP server, the A2A server).

A face binds to a loopback address unless a token is configured
(:func:`check_binding`); with a token, :class:`BearerGate` requires
``Authorization: Bearer <token>`` on every HTTP request (compared in
constant time), answers 401 otherwise and counts the refusal in the face's
counters (``refused_http_unauthorized``).
"""

from __future__ import annotations

import hmac
import ipaddress
from typing import Any

from hivemesh.errors import ConfigError

__all__ = ["BearerGate", "check_binding", "is_loopback"]


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback IP addresses."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_binding(host: str, token: str | None) -> None:
    """Refuse (:class:`~hivemesh.errors.ConfigError`) a non-loopback address without a token."""
    if not is_loopback(host) and not token:
        raise ConfigError(
            f"refusing to serve on {host}: off localhost a token is required (--token)"
        )


class BearerGate:
    """ASGI middleware: HTTP requests must carry ``Authorization: Bearer <token>``."""

    def __init__(self, app: Any, token: str, counters: Any) -> None:
        self.app = app
        self._expected = f"Bearer {token}".encode()
        self.counters = counters

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """Pass authorised requests (and lifespan events) through; answer 401 otherwise."""
        if scope.get("type") == "http":
            got = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(got, self._expected):
                self.counters["refused_http_unauthorized"] += 1
                body = b'{"error": "unauthorized: a bearer token is required"}'
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"www-authenticate", b"Bearer"),
                            (b"content-length", str(len(body)).encode()),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)
