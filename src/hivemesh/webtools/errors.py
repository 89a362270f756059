"""The web tools' errors (subclasses of :mod:`hivemesh.errors` categories).

::

    TransportError
    └── FetchError                   a page could not be fetched (has .status)
        ├── FetchTimeout(FetchError, DeadlineExceeded)
        ├── CaptchaRequired          the page is a CAPTCHA challenge (switch route)
        └── AccessCodeRequired       the page needs a code only a human has
    DecodeError
    └── ExtractError                 a page that cannot be parsed or read
"""

from __future__ import annotations

from hivemesh.errors import DeadlineExceeded, DecodeError, TransportError

__all__ = [
    "AccessCodeRequired",
    "CaptchaRequired",
    "ExtractError",
    "FetchError",
    "FetchTimeout",
]


class FetchError(TransportError):
    """A page could not be fetched; ``status`` is the HTTP status if one came."""

    code = "fetch_failed"

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class FetchTimeout(FetchError, DeadlineExceeded):
    """Fetching a page passed its deadline."""

    code = "fetch_timeout"


class CaptchaRequired(FetchError):
    """The page is a CAPTCHA challenge on this route (another route may pass)."""

    code = "captcha_required"


class AccessCodeRequired(FetchError):
    """The page can only be read with an access code that a human has."""

    code = "access_code_required"


class ExtractError(DecodeError):
    """A page that cannot be parsed, or read the way it was asked to be."""

    code = "extract_failed"
