"""The control socket's JSON checks refuse every lone surrogate with a typed
error (found by the fuzz budget's MCP-tools target: a high surrogate made the
error message itself fail with a bare UnicodeEncodeError)."""

from __future__ import annotations

import pytest

from hivemesh.commands import wire as wirejson
from hivemesh.errors import InvalidEncoding


@pytest.mark.parametrize("bad", ["\ud800", "\udbff", "\udc80", "\udfff", "ok\ud800tail"])
def test_lone_surrogates_are_a_typed_error(bad: str) -> None:
    with pytest.raises(InvalidEncoding):
        wirejson.check({"args": {"key": bad}})
    with pytest.raises(InvalidEncoding):
        wirejson.check({bad: 1})


def test_valid_text_passes() -> None:
    wirejson.check({"k": ["é", "日本", "\U0001f600", {"nested": "ü"}]})
