"""Host limits a node sets for itself: open files, and handshake slots that fit in them."""

from __future__ import annotations

import resource
from collections.abc import Iterator

import pytest

from hivemesh.runtime.hostutil import OPEN_FILES_WANTED, handshake_slots, raise_open_files_limit


@pytest.fixture
def soft_256() -> Iterator[int]:
    old = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, old[1]))
    try:
        yield old[1]
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, old)


def test_handshake_slots_fit_in_the_open_files_limit(soft_256: int) -> None:
    assert handshake_slots() == 64
    assert handshake_slots(cap=32) == 32


def test_the_soft_limit_is_raised_toward_what_a_node_needs(soft_256: int) -> None:
    hard = soft_256
    want = OPEN_FILES_WANTED if hard == resource.RLIM_INFINITY else min(OPEN_FILES_WANTED, hard)
    assert raise_open_files_limit() == want
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == want
    assert raise_open_files_limit(wanted=100) == want  # never lowered
    assert handshake_slots() == min(512, want // 4)
