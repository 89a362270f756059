"""The ``lab`` fixture for tests on Linux network namespaces (hivemesh.netlab):
skips with the reason where namespaces cannot be made (shown by ``-ra``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from hivemesh.netlab import Lab, unavailable_reason

__all__ = ["lab", "require_netlab"]


def require_netlab() -> None:
    """Skip the calling test, with the reason, where namespaces cannot be made."""
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"network namespaces unavailable: {reason}")


@pytest.fixture
def lab() -> Iterator[Lab]:
    """A fresh lab, removed after the test whatever happens."""
    require_netlab()
    with Lab() as built:
        yield built
