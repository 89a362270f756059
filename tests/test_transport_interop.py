"""Interop over real sockets with an independent Noise implementation.

The other side uses the ``noiseprotocol`` package for all Noise work
(handshake, transport ciphers) and only this file's reading of the wire
format documented in :mod:`hivemesh.transports.session` and
:mod:`hivemesh.transports.noise`: u16 record lengths, a 113-byte identity
payload (version 2: key, boot id, signature over static key and boot id),
u32-length frames, ACCEPT/CLOSE control items. If our handshake or records
deviated from Noise_XX_25519_AESGCM_SHA256, these tests would fail. A peer
speaking the old 97-byte payload (version 1, no boot id) is refused with a
typed error in both roles.
"""

from __future__ import annotations

import asyncio
import random
import secrets
import struct
from collections.abc import Coroutine
from typing import Any

# A hard import: the independent implementation is a test dependency, never skipped.
import noise.connection as noise_connection
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from aiotest import eventually, read_to_eof
from hivemesh.core.identity import Identity, address_of
from hivemesh.errors import ConnectionClosed, UnsupportedHandshake
from hivemesh.transports import SecureChannel, TransportCounters, connect, serve

HOST = "127.0.0.1"
PROTOCOL = b"Noise_XX_25519_AESGCM_SHA256"
PROLOGUE = b"hivemesh/noise/1"
CONTEXT = b"hivemesh-noise-static-key:"
OURS = Identity.from_seed(b"o" * 32)
THEIRS = Identity.from_seed(b"t" * 32)


def run(coro: Coroutine[Any, Any, None], timeout_s: float = 30.0) -> None:
    async def bounded() -> None:
        async with asyncio.timeout(timeout_s):
            await coro

    asyncio.run(bounded())


class NoisePeer:
    """The far side, written against the wire spec with ``noiseprotocol`` crypto.

    ``version=1`` speaks the old payload (no boot id), to check it is refused.
    """

    def __init__(self, identity: Identity, *, initiator: bool, version: int = 2) -> None:
        self.identity = identity
        static = secrets.token_bytes(32)
        static_pub = (
            X25519PrivateKey.from_private_bytes(static)
            .public_key()
            .public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        )
        self.boot_id = secrets.token_bytes(16)
        if version == 1:
            self.payload = b"\x01" + identity.public + identity.sign(CONTEXT + static_pub)
        else:
            signed = CONTEXT + static_pub + self.boot_id
            self.payload = b"\x02" + identity.public + self.boot_id + identity.sign(signed)
        self.conn = noise_connection.NoiseConnection.from_name(PROTOCOL)
        if initiator:
            self.conn.set_as_initiator()
        else:
            self.conn.set_as_responder()
        self.conn.set_prologue(PROLOGUE)
        self.conn.set_keypair_from_private_bytes(noise_connection.Keypair.STATIC, static)
        self.conn.start_handshake()
        self.peer_address: str | None = None
        self.peer_boot_id: bytes | None = None
        self._plain = b""

    def _check_peer(self, hs: Any, payload: bytes) -> None:
        rs = hs.rs.public_bytes
        assert len(payload) == 113 and payload[0] == 2
        pub, boot_id, sig = payload[1:33], payload[33:49], payload[49:]
        Ed25519PublicKey.from_public_bytes(pub).verify(sig, CONTEXT + rs + boot_id)  # or raises
        self.peer_address = address_of(pub)
        self.peer_boot_id = boot_id

    @staticmethod
    async def read_record(reader: asyncio.StreamReader) -> bytes:
        (size,) = struct.unpack(">H", await reader.readexactly(2))
        return await reader.readexactly(size)

    @staticmethod
    def record(message: bytes) -> bytes:
        return struct.pack(">H", len(message)) + bytes(message)

    async def handshake_as_initiator(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        writer.write(self.record(self.conn.write_message(b"")))
        hs = self.conn.noise_protocol.handshake_state
        self._check_peer(hs, bytes(self.conn.read_message(await self.read_record(reader))))
        writer.write(self.record(self.conn.write_message(self.payload)))
        assert self.conn.handshake_finished
        assert await self.read_item(reader) == ("control", b"\x01")  # ACCEPT

    async def handshake_as_responder(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        assert self.conn.read_message(await self.read_record(reader)) == b""
        writer.write(self.record(self.conn.write_message(self.payload)))
        hs = self.conn.noise_protocol.handshake_state  # dropped by the library once done
        self._check_peer(hs, bytes(self.conn.read_message(await self.read_record(reader))))
        assert self.conn.handshake_finished
        writer.write(self.record(self.conn.encrypt(struct.pack(">I", (1 << 24) | 1) + b"\x01")))

    def seal_frames(self, frames: list[bytes]) -> bytes:
        stream = b"".join(struct.pack(">I", len(f)) + f for f in frames)
        out = b""
        for i in range(0, len(stream), 65535 - 16):
            out += self.record(self.conn.encrypt(stream[i : i + 65535 - 16]))
        return out

    async def read_item(self, reader: asyncio.StreamReader) -> tuple[str, bytes]:
        while True:
            if len(self._plain) >= 4:
                (header,) = struct.unpack(">I", self._plain[:4])
                kind, size = header >> 24, header & 0xFFFFFF
                if len(self._plain) >= 4 + size:
                    body, self._plain = self._plain[4 : 4 + size], self._plain[4 + size :]
                    return ("data" if kind == 0 else "control", body)
            self._plain += bytes(self.conn.decrypt(await self.read_record(reader)))


def _frames(seed: int) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(rng.randrange(0, 2000)) for _ in range(200)] + [rng.randbytes(300_000)]


def test_noiseprotocol_client_talks_to_our_listener() -> None:
    async def main() -> None:
        async def echo(ch: SecureChannel) -> None:
            try:
                while True:
                    await ch.send(await ch.recv())
            except ConnectionClosed:
                pass

        boot = b"\x42" * 16
        listener = await serve(
            HOST, 0, OURS, authorize=lambda a: True, on_channel=echo, boot_id=boot
        )
        async with listener:
            reader, writer = await asyncio.open_connection(HOST, listener.port)
            peer = NoisePeer(THEIRS, initiator=True)
            await peer.handshake_as_initiator(reader, writer)
            assert peer.peer_address == OURS.address
            assert peer.peer_boot_id == boot
            frames = _frames(1)
            writer.write(peer.seal_frames(frames))
            for f in frames:
                assert await peer.read_item(reader) == ("data", f)
            (ch,) = listener.channels()
            assert ch.peer_address == THEIRS.address
            assert ch.peer_boot_id == peer.boot_id
            assert ch.handshake_hash == peer.conn.get_handshake_hash()
            writer.close()

    run(main())


def test_our_dialler_talks_to_a_noiseprotocol_server() -> None:
    async def main() -> None:
        done: asyncio.Future[list[bytes]] = asyncio.get_running_loop().create_future()

        boot = b"\x17" * 16
        far: list[NoisePeer] = []

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            peer = NoisePeer(THEIRS, initiator=False)
            far.append(peer)
            try:
                await peer.handshake_as_responder(reader, writer)
                assert peer.peer_address == OURS.address
                assert peer.peer_boot_id == boot
                got = []
                for _ in range(len(_frames(2))):
                    kind, body = await peer.read_item(reader)
                    assert kind == "data"
                    got.append(body)
                writer.write(peer.seal_frames([g[::-1] for g in got]))
                await writer.drain()
                done.set_result(got)
            except Exception as exc:  # surface server-side failures in the test
                done.set_exception(exc)

        server = await asyncio.start_server(handle, HOST, 0)
        async with server:
            port = server.sockets[0].getsockname()[1]
            ch = await connect(
                HOST,
                port,
                OURS,
                authorize=lambda a: True,
                expect_address=THEIRS.address,
                boot_id=boot,
            )
            assert ch.peer_boot_id == far[0].boot_id
            frames = _frames(2)
            for f in frames:
                await ch.send(f)
            assert await done == frames
            for f in frames:
                assert await ch.recv() == f[::-1]
            ch.close()

    run(main())


def test_frames_sent_together_with_accept_are_delivered() -> None:
    """The responder may send data right behind ACCEPT, even in the same TCP segment."""

    async def main() -> None:
        frames = _frames(3)

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            peer = NoisePeer(THEIRS, initiator=False)
            assert peer.conn.read_message(await peer.read_record(reader)) == b""
            writer.write(peer.record(peer.conn.write_message(peer.payload)))
            hs = peer.conn.noise_protocol.handshake_state
            peer._check_peer(hs, bytes(peer.conn.read_message(await peer.read_record(reader))))
            accept = struct.pack(">I", (1 << 24) | 1) + b"\x01"
            stream = accept + b"".join(struct.pack(">I", len(f)) + f for f in frames[:50])
            writer.write(peer.record(peer.conn.encrypt(stream)) + peer.seal_frames(frames[50:]))
            await writer.drain()
            await reader.read()  # until the client hangs up

        server = await asyncio.start_server(handle, HOST, 0)
        async with server:
            port = server.sockets[0].getsockname()[1]
            ch = await connect(HOST, port, OURS, authorize=lambda a: True)
            for f in frames:
                assert await ch.recv() == f
            ch.close()

    run(main())


def test_a_version_1_dialler_is_refused_by_our_listener_with_a_typed_error() -> None:
    async def main() -> None:
        async def never(ch: SecureChannel) -> None:
            raise AssertionError("a version-1 peer must not get a channel")

        counters = TransportCounters()
        listener = await serve(
            HOST, 0, OURS, authorize=lambda a: True, on_channel=never, counters=counters
        )
        async with listener:
            reader, writer = await asyncio.open_connection(HOST, listener.port)
            peer = NoisePeer(THEIRS, initiator=True, version=1)
            writer.write(peer.record(peer.conn.write_message(b"")))
            m2 = await peer.read_record(reader)  # ours, of the new size: an old peer would stop
            assert len(m2) == 32 + 48 + 113 + 16
            peer.conn.read_message(m2)
            writer.write(peer.record(peer.conn.write_message(peer.payload)))  # 97-byte payload
            assert await read_to_eof(reader) == b""  # closed, nothing sent
            writer.close()
            await eventually(
                lambda: counters.snapshot().get("errors.handshake_version") == 1, "counted"
            )
            assert listener.channels() == []

    run(main())


def test_our_dialler_refuses_a_version_1_listener_with_a_typed_error() -> None:
    async def main() -> None:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            peer = NoisePeer(THEIRS, initiator=False, version=1)
            assert peer.conn.read_message(await peer.read_record(reader)) == b""
            writer.write(peer.record(peer.conn.write_message(peer.payload)))
            await reader.read()  # until the dialler hangs up

        server = await asyncio.start_server(handle, HOST, 0)
        async with server:
            port = server.sockets[0].getsockname()[1]
            counters = TransportCounters()
            with pytest.raises(UnsupportedHandshake, match="version 1"):
                await connect(HOST, port, OURS, authorize=lambda a: True, counters=counters)
            assert counters.snapshot().get("errors.handshake_version") == 1

    run(main())
