"""The LLM providers' errors (subclasses of :mod:`hivemesh.errors` categories).

::

    LLMNotConfigured(ConfigError)             no endpoint/model configured
    LLMError(TransportError)                  any LLM call failure
    ├── LLMTimeout(LLMError, DeadlineExceeded)
    ├── LLMUnavailable                        connection refused/reset
    ├── LLMHTTPError                          non-2xx answer (has .status)
    └── LLMBadOutput(LLMError, RemoteProtocolError)  malformed or off-schema reply
"""

from __future__ import annotations

from hivemesh.errors import ConfigError, DeadlineExceeded, RemoteProtocolError, TransportError

__all__ = [
    "LLMBadOutput",
    "LLMError",
    "LLMHTTPError",
    "LLMNotConfigured",
    "LLMTimeout",
    "LLMUnavailable",
]


class LLMNotConfigured(ConfigError):
    """No LLM endpoint or model is configured (flags, config or environment)."""

    code = "llm_not_configured"


class LLMError(TransportError):
    """A call to a language model failed (after any retries)."""

    code = "llm_error"


class LLMTimeout(LLMError, DeadlineExceeded):
    """A language-model call did not finish before its deadline."""

    code = "llm_timeout"


class LLMUnavailable(LLMError):
    """The language-model endpoint could not be reached (refused, reset, DNS)."""

    code = "llm_unavailable"


class LLMHTTPError(LLMError):
    """The endpoint answered with a non-2xx status (see :attr:`status`)."""

    code = "llm_http_error"

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class LLMBadOutput(LLMError, RemoteProtocolError):
    """The model's reply is malformed or does not match the requested JSON schema."""

    code = "llm_bad_output"
