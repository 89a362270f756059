"""One Ed25519 verification per signature per run, however many replicas check it.

In a simulated cluster of ``n`` nodes every signed batch head is verified by
each of the ``n - 1`` replicas that receive it, again after every restart's
replay, and once more per replica by the checkers: the same pure function on
the same bytes. At 5 nodes that was about a third of a seed's CPU time, and
the share grows with ``n``.

:func:`verification_memo` remembers, for the duration of one run, every
``(signature + message, public key)`` that libsodium accepted, and answers a
repeat from memory. Only successes are remembered: a forged or damaged
signature is verified again each time it is offered, and is refused by
libsodium each time. The answer is the one libsodium would give (Ed25519
verification is deterministic), so the nodes under test behave exactly as
without the memo; the simulator only stops paying for the same answer twice.

Signatures made inside the block are remembered as they are made: every
batch head is signed in the run, so the first verification of an honest
signature is an answer known in advance. libsodium's ``crypto_sign`` output
always passes its ``crypto_sign_open`` under the signer's public key (the
last 32 bytes of its secret key): the signature's scalar is canonical, its
``R`` and the derived public key are of prime order. Anything else -- a
head signed by the wrong key, damaged bytes, another key offered -- is
another ``(signed, public key)`` pair, and goes to libsodium as before.

The memo replaces ``nacl.bindings.crypto_sign_open`` and
``nacl.bindings.crypto_sign`` (the libsodium calls behind
:func:`hivemesh.core.identity.verify` and
:meth:`~hivemesh.core.identity.Identity.sign`) inside the ``with`` block and
puts them back on exit. It is not thread-safe, and need not be: a simulated run
is one thread, and campaigns run seeds in worker processes.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import nacl.bindings

__all__ = ["verification_memo"]


@contextmanager
def verification_memo() -> Iterator[dict[tuple[bytes, bytes], bytes]]:
    """Memoise accepted Ed25519 verifications until the block exits; yields
    the memo (accepted ``(signed, public key)`` -> message) for counting."""
    real = nacl.bindings.crypto_sign_open
    real_sign = nacl.bindings.crypto_sign
    accepted: dict[tuple[bytes, bytes], bytes] = {}

    def crypto_sign_open(signed: bytes, pk: bytes) -> bytes:
        key = (signed, pk)
        message = accepted.get(key)
        if message is None:
            message = real(signed, pk)  # raises on a bad signature: not remembered
            accepted[key] = message
        return message

    def crypto_sign(message: bytes, sk: bytes) -> bytes:
        signed: bytes = real_sign(message, sk)
        accepted[signed, sk[32:]] = message  # sk is seed + public key
        return signed

    nacl.bindings.crypto_sign_open = crypto_sign_open
    nacl.bindings.crypto_sign = crypto_sign
    try:
        yield accepted
    finally:
        nacl.bindings.crypto_sign_open = real
        nacl.bindings.crypto_sign = real_sign
