"""A secure channel over any byte stream: the TCP transport's handshake,
records, trust rules, counters and frame limits, reused as they are.

:func:`secure_dial` and :func:`secure_accept` take a connected
``StreamReader``/``StreamWriter`` (a QUIC stream or a relayed circuit made
into one by :mod:`hivemesh.transports.pipe`), run the Noise XX handshake of
:mod:`hivemesh.transports.noise` under one deadline and return a
:class:`~hivemesh.transports.channel.SecureChannel` whose :attr:`path` says
how its bytes travel. Failures are typed, counted in ``counters`` and close
the stream. The identity, the trust check (``authorize``) and the
``expect_address`` check are exactly the TCP transport's: whoever carries
the bytes (a QUIC peer, a relay) learns and can change nothing.
"""

from __future__ import annotations

import asyncio
import secrets

from hivemesh.core.identity import Identity
from hivemesh.errors import DeadlineExceeded, HivemeshError
from hivemesh.transports.channel import Authorize, ChannelOptions, SecureChannel
from hivemesh.transports.noise import RandomBytes, SecureHandshake, StaticCredentials
from hivemesh.transports.stats import TransportCounters
from hivemesh.transports.tcp import PROCESS_BOOT_ID, open_channel, run_handshake

__all__ = ["secure_accept", "secure_dial"]


async def _secure(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    hs: SecureHandshake,
    *,
    options: ChannelOptions,
    counters: TransportCounters,
    timeout_s: float,
    path: str,
) -> SecureChannel:
    try:
        try:
            async with asyncio.timeout(timeout_s):
                session, frames = await run_handshake(reader, writer, hs, options)
        except TimeoutError:
            raise DeadlineExceeded(f"handshake over {path} not finished in {timeout_s}s") from None
    except HivemeshError as exc:
        counters.record_error(exc)
        writer.close()
        raise
    except BaseException:
        writer.close()
        raise
    return open_channel(reader, writer, session, hs, options, counters, frames, path)


async def secure_dial(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    identity: Identity,
    *,
    authorize: Authorize,
    path: str,
    expect_address: str | None = None,
    timeout_s: float = 5.0,
    random_bytes: RandomBytes = secrets.token_bytes,
    options: ChannelOptions | None = None,
    counters: TransportCounters | None = None,
    boot_id: bytes | None = None,
) -> SecureChannel:
    """Run the handshake as initiator over a connected stream (see module docs)."""
    creds = StaticCredentials.generate(
        identity, random_bytes, boot_id=PROCESS_BOOT_ID if boot_id is None else boot_id
    )
    hs = SecureHandshake(
        creds,
        initiator=True,
        random_bytes=random_bytes,
        authorize=authorize,
        expect_address=expect_address,
    )
    return await _secure(
        reader,
        writer,
        hs,
        options=options or ChannelOptions(),
        counters=counters if counters is not None else TransportCounters(),
        timeout_s=timeout_s,
        path=path,
    )


async def secure_accept(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    credentials: StaticCredentials,
    *,
    authorize: Authorize,
    path: str,
    random_bytes: RandomBytes = secrets.token_bytes,
    options: ChannelOptions | None = None,
    counters: TransportCounters | None = None,
) -> SecureChannel:
    """Run the handshake as responder over a connected stream (see module docs);
    the deadline is ``options.handshake_timeout_s``."""
    opts = options or ChannelOptions()
    hs = SecureHandshake(
        credentials, initiator=False, random_bytes=random_bytes, authorize=authorize
    )
    return await _secure(
        reader,
        writer,
        hs,
        options=opts,
        counters=counters if counters is not None else TransportCounters(),
        timeout_s=opts.handshake_timeout_s,
        path=path,
    )
