"""JSON for the control protocol, with limits: one place that says what is too much.

Both ends of the control socket (:mod:`hivemesh.runtime.control`, the
daemon; :mod:`hivemesh.client.blocking`, the CLI and tools) and the CLI's
JSON arguments go through :func:`decode` and :func:`encode`, so malformed
local input gets the same typed error wherever it enters:

* a request line longer than :data:`MAX_LINE_BYTES` ->
  :class:`~hivemesh.errors.InputTooLarge` (``too_large``);
* a value nested deeper than :data:`MAX_DEPTH` ->
  :class:`~hivemesh.errors.InputTooDeep` (``too_deep``) -- Python's JSON
  parser would otherwise raise ``RecursionError`` from deep inside;
* bytes that are not UTF-8, or text holding lone surrogates (what invalid
  UTF-8 in ``argv`` becomes in Python) ->
  :class:`~hivemesh.errors.InvalidEncoding` (``bad_encoding``);
* anything else that is not JSON -> :class:`~hivemesh.errors.InvalidArgument`.

Nothing here raises anything else.
"""

from __future__ import annotations

import json
from typing import Any

from hivemesh.errors import InputTooDeep, InputTooLarge, InvalidArgument, InvalidEncoding

__all__ = ["MAX_DEPTH", "MAX_LINE_BYTES", "check", "decode", "encode"]

#: Longest request or response line on the control socket (bytes, newline included).
MAX_LINE_BYTES = 1024 * 1024
#: Deepest nesting of arrays and objects in a request (the request object is
#: level 1, its ``args`` level 2; shared context accepts values 32 deep).
MAX_DEPTH = 64


def check(obj: Any, *, what: str = "value") -> None:
    """Raise unless ``obj`` is JSON data at most :data:`MAX_DEPTH` deep in valid text.

    Errors name where the fault is (``request field args.key``)."""
    stack: list[tuple[Any, int, tuple[str, ...]]] = [(obj, 1, ())]
    while stack:
        value, depth, path = stack.pop()
        if isinstance(value, str):
            _check_text(value, _where(what, path))
        elif isinstance(value, (dict, list, tuple)):
            if depth > MAX_DEPTH:
                raise InputTooDeep(f"{what} is nested more than {MAX_DEPTH} levels deep")
            if isinstance(value, dict):
                for key, item in value.items():
                    if not isinstance(key, str):
                        raise InvalidArgument(f"{_where(what, path)} has a non-string key")
                    _check_text(key, f"a key in {_where(what, path)}")
                    stack.append((item, depth + 1, (*path, key)))
            else:
                stack.extend((item, depth + 1, path) for item in value)


def _where(what: str, path: tuple[str, ...]) -> str:
    return f"{what} field {'.'.join(path)}" if path else what


def _check_text(text: str, what: str) -> None:
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = text[exc.start : exc.end].encode("utf-8", "backslashreplace")
        raise InvalidEncoding(
            f"{what} is not valid UTF-8 (bytes {bad!r:.40} at character {exc.start})"
        ) from None


def decode(data: bytes | str, *, what: str = "request") -> Any:
    """Parse one JSON document within the limits above."""
    if isinstance(data, bytes):
        if len(data) > MAX_LINE_BYTES:
            raise InputTooLarge(f"{what} of {len(data)} bytes is over {MAX_LINE_BYTES}")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidEncoding(
                f"{what} is not valid UTF-8 (byte {data[exc.start]:#04x} at {exc.start})"
            ) from None
    else:
        text = data
        _check_text(text, what)
    try:
        obj = json.loads(text)
    except RecursionError:
        raise InputTooDeep(f"{what} is nested more than {MAX_DEPTH} levels deep") from None
    except ValueError as exc:
        raise InvalidArgument(f"{what} is not JSON: {exc}") from None
    check(obj, what=what)
    return obj


def encode(obj: Any, *, what: str = "request") -> bytes:
    """``obj`` as one compact JSON line (newline included) within the limits above."""
    check(obj, what=what)
    try:
        line = json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"{what} cannot be sent as JSON: {exc}") from None
    if len(line) + 1 > MAX_LINE_BYTES:
        raise InputTooLarge(
            f"{what} of {len(line) + 1} bytes is over the control socket's {MAX_LINE_BYTES}"
        )
    return line + b"\n"
