"""One msgpack packer per run, instead of one per frame.

``msgpack.packb(obj)`` builds a new :class:`msgpack.Packer` on every call,
with a 256 KiB buffer allocated and freed each time; the core packs every
frame and event through it (:func:`hivemesh.core.codec.pack`), and a
simulated run packs hundreds of thousands of them. Inside
:func:`shared_packer` the calls with the core's options (``use_bin_type``,
the default) go to one packer kept for the block, which resets after each
object (``autoreset``) and on an error: the same bytes and the same
exceptions. Calls with any other options go to msgpack as before.

A shared packer is not thread-safe, which is why the core does not keep
one (the daemon packs on worker threads too); a simulated run is one
thread, and campaigns run seeds in worker processes. Like
:func:`hivemesh.sim.memo.verification_memo`, the block puts the library's
function back on exit.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import msgpack

__all__ = ["shared_packer"]


@contextmanager
def shared_packer() -> Iterator[None]:
    """``msgpack.packb`` with the default options packs through one packer
    until the block exits."""
    real = msgpack.packb
    pack = msgpack.Packer(use_bin_type=True).pack

    def packb(o: Any, **kwargs: Any) -> bytes:
        if not kwargs or kwargs == {"use_bin_type": True}:
            out: bytes = pack(o)
            return out
        return real(o, **kwargs)  # type: ignore[no-any-return]

    msgpack.packb = packb
    try:
        yield
    finally:
        msgpack.packb = real
