"""Secure channels over real sockets on 127.0.0.1: the happy path and every refusal."""

from __future__ import annotations

import asyncio
import random
import socket
import struct
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from aiotest import eventually, read_to_eof, run
from hivemesh.core.codec import MAX_FRAME_BYTES
from hivemesh.core.identity import Identity
from hivemesh.errors import (
    BadRecord,
    ConnectionClosed,
    DeadlineExceeded,
    FrameTooLarge,
    InvalidAddress,
    InvalidArgument,
    PeerBusy,
    PeerIdentityMismatch,
    PeerUnreachable,
    UnknownPeer,
    WouldBlock,
)
from hivemesh.transports import (
    ChannelOptions,
    Listener,
    SecureChannel,
    TransportCounters,
    connect,
    serve,
)
from hivemesh.transports.noise import MESSAGE_BYTES

HOST = "127.0.0.1"
A = Identity.from_seed(b"a" * 32)
B = Identity.from_seed(b"b" * 32)
C = Identity.from_seed(b"c" * 32)


def trust_all(address: str) -> bool:
    return True


async def echo(channel: SecureChannel) -> None:
    """Server handler: send every frame back reversed until the channel ends."""
    try:
        while True:
            await channel.send((await channel.recv())[::-1])
    except ConnectionClosed:
        pass


async def start(
    identity: Identity = B,
    on_channel: Callable[[SecureChannel], Awaitable[None]] = echo,
    authorize: Callable[[str], bool] = trust_all,
    **kw: Any,
) -> Listener:
    return await serve(HOST, 0, identity, authorize=authorize, on_channel=on_channel, **kw)


def test_many_frames_both_directions_including_a_3_mib_frame() -> None:
    async def main() -> None:
        async with await start() as listener:
            ch = await connect(
                HOST, listener.port, A, authorize=trust_all, expect_address=B.address
            )
            assert ch.peer_address == B.address
            rng = random.Random(3)
            frames = [rng.randbytes(rng.randrange(0, 600)) for _ in range(3000)]
            frames.insert(1500, rng.randbytes(3 * 1024 * 1024))
            frames.append(b"m" * MAX_FRAME_BYTES)

            async def produce() -> None:
                for f in frames:
                    await ch.send(f)

            producer = asyncio.create_task(produce())
            for f in frames:
                assert await ch.recv() == f[::-1]
            await producer
            (server_ch,) = listener.channels()
            assert server_ch.peer_address == A.address
            assert server_ch.handshake_hash == ch.handshake_hash
            stats = ch.statistics()
            assert stats.frames_out == stats.frames_in == len(frames)
            assert stats.frames_dropped == 0 and not stats.errors
            await ch.aclose()
            await eventually(lambda: server_ch.is_closed, "server sees the clean close")
            assert isinstance(server_ch.close_reason, ConnectionClosed)
            snap = listener.counters.snapshot()
            assert snap["frames_in"] == len(frames) and snap["frames_dropped"] == 0
            assert snap["handshakes_ok"] == 1
            assert not any(k.startswith("errors.") for k in snap)

    run(main())


def test_recv_batch_and_recv_nowait() -> None:
    async def main() -> None:
        async with await start() as listener:
            ch = await connect(HOST, listener.port, A, authorize=trust_all)
            with pytest.raises(WouldBlock):
                ch.recv_nowait()
            for i in range(100):
                ch.send_nowait(b"%d" % i)
            got: list[bytes] = []
            while len(got) < 100:
                got += await ch.recv_batch(30)
            assert got == [(b"%d" % i)[::-1] for i in range(100)]
            ch.close()

    run(main())


def test_send_nowait_writes_at_once_when_idle_and_keeps_order_with_the_queue() -> None:
    async def main() -> None:
        async with await start() as listener:
            ch = await connect(HOST, listener.port, A, authorize=trust_all)
            await ch.wait_sent(5)  # the writer is idle, nothing queued
            ch.send_nowait(b"first")
            assert ch.statistics().frames_out == 1  # written within this step
            for i in range(50):  # written at once while the socket takes them, then queued
                ch.send_nowait(b"q%d" % i)
                ch.send_nowait(b"n%d" % i)
            got: list[bytes] = []
            while len(got) < 101:
                got += await ch.recv_batch(64)
            expect = [b"first"] + [f for i in range(50) for f in (b"q%d" % i, b"n%d" % i)]
            assert got == [f[::-1] for f in expect]
            ch.close()
            with pytest.raises(ConnectionClosed):
                ch.send_nowait(b"late")

    run(main())


def test_frames_sent_in_one_loop_turn_after_the_first_leave_together() -> None:
    """An idle channel writes the first frame of a turn at once; the rest of
    that turn's frames queue behind it and go out in one write next turn."""

    async def main() -> None:
        async with await start() as listener:
            ch = await connect(HOST, listener.port, A, authorize=trust_all)
            await ch.wait_sent(5)
            for i in range(20):
                ch.send_nowait(b"f%d" % i)
            stats = ch.statistics()
            assert stats.frames_out == 1 and stats.send_queue_frames == 19
            got: list[bytes] = []
            while len(got) < 20:
                got += await ch.recv_batch(64)
            assert got == [(b"f%d" % i)[::-1] for i in range(20)]
            ch.send_nowait(b"next turn")  # a new turn: written at once again
            assert ch.statistics().frames_out == 21
            ch.close()

    run(main())


def test_unknown_peer_is_refused_and_counted() -> None:
    async def main() -> None:
        async with await start(authorize=lambda a: a == C.address) as listener:
            with pytest.raises(UnknownPeer, match="does not trust"):
                await connect(HOST, listener.port, A, authorize=trust_all)
            await eventually(
                lambda: listener.counters.get("errors.unknown_peer") == 1, "refusal counted"
            )
            assert listener.channels() == []
            # the listener keeps serving trusted peers
            ch = await connect(HOST, listener.port, C, authorize=trust_all)
            ch.send_nowait(b"abc")
            assert await ch.recv() == b"cba"
            ch.close()

    run(main())


def test_dialler_refuses_an_untrusted_server() -> None:
    async def main() -> None:
        counters = TransportCounters()
        async with await start() as listener:
            with pytest.raises(UnknownPeer, match="not trusted"):
                await connect(
                    HOST, listener.port, A, authorize=lambda a: a != B.address, counters=counters
                )
            assert counters.get("errors.unknown_peer") == 1
            await eventually(
                lambda: listener.counters.get("errors.handshake_failed") == 1,
                "server saw the aborted handshake",
            )

    run(main())


def test_man_in_the_middle_key_is_detected() -> None:
    async def main() -> None:
        # We dial expecting A's address, but the server at that port holds key B.
        async with await start(identity=B) as listener:
            with pytest.raises(PeerIdentityMismatch, match="man in the middle"):
                await connect(HOST, listener.port, C, authorize=trust_all, expect_address=A.address)
            assert listener.channels() == []

    run(main())


def test_revoked_peer_is_closed_and_then_refused() -> None:
    async def main() -> None:
        trusted = {A.address}
        async with await start(authorize=lambda a: a in trusted) as listener:
            ch = await connect(HOST, listener.port, A, authorize=trust_all)
            ch.send_nowait(b"before")
            assert await ch.recv() == b"erofeb"
            trusted.clear()
            assert listener.revalidate() == 1
            with pytest.raises(ConnectionClosed) as info:
                await ch.recv()
            assert isinstance(info.value.__cause__, UnknownPeer)
            assert isinstance(ch.close_reason, UnknownPeer)
            with pytest.raises(ConnectionClosed):
                await ch.send(b"after")
            with pytest.raises(UnknownPeer):
                await connect(HOST, listener.port, A, authorize=trust_all)
            await eventually(
                lambda: listener.counters.get("errors.unknown_peer") == 2, "both refusals counted"
            )

    run(main())


def test_oversize_frame_from_peer_is_rejected_and_counted() -> None:
    async def main() -> None:
        received: list[SecureChannel] = []

        async def keep(ch: SecureChannel) -> None:
            received.append(ch)

        async with await start(on_channel=keep) as listener:
            big = ChannelOptions(max_frame_bytes=MAX_FRAME_BYTES + 1024)
            ch = await connect(HOST, listener.port, A, authorize=trust_all, options=big)
            await ch.send(b"ok")
            await ch.send(b"z" * (MAX_FRAME_BYTES + 1))
            await eventually(lambda: bool(received) and received[0].is_closed, "server closes")
            server_ch = received[0]
            assert isinstance(server_ch.close_reason, FrameTooLarge)
            assert await server_ch.recv() == b"ok"  # intact frames before the fault survive
            with pytest.raises(ConnectionClosed):
                await server_ch.recv()
            assert listener.counters.get("errors.oversize") == 1
            await eventually(lambda: ch.is_closed, "sender learns why")
            assert "oversize" in str(ch.close_reason)
            # locally, the normal limit refuses before anything is sent
            ch2 = await connect(HOST, listener.port, A, authorize=trust_all)
            with pytest.raises(InvalidArgument):
                ch2.send_nowait(b"z" * (MAX_FRAME_BYTES + 1))
            ch2.close()

    run(main())


async def _raw_exchange(port: int, data: bytes) -> bytes:
    """Send raw bytes to the port and return everything until EOF (deadline 5 s)."""
    reader, writer = await asyncio.open_connection(HOST, port)
    writer.write(data)
    await writer.drain()
    out = await read_to_eof(reader)
    writer.close()
    return out


def test_garbage_on_the_port_is_a_counted_handshake_error() -> None:
    async def main() -> None:
        async with await start() as listener:
            http = b"GET / HTTP/1.1\r\nHost: hivemesh\r\n\r\n"
            assert await _raw_exchange(listener.port, http) == b""
            rng = random.Random(11)
            # a plausible message 1 (any 32 bytes are a key), then a garbage message 3
            reader, writer = await asyncio.open_connection(HOST, listener.port)
            writer.write(b"\x00\x20" + rng.randbytes(32))
            assert len(await reader.readexactly(2 + MESSAGE_BYTES[1])) == 2 + MESSAGE_BYTES[1]
            writer.write(struct.pack(">H", MESSAGE_BYTES[2]) + rng.randbytes(MESSAGE_BYTES[2]))
            assert await read_to_eof(reader) == b""
            writer.close()
            await eventually(
                lambda: listener.counters.get("errors.handshake_failed") == 2, "both counted"
            )
            ch = await connect(HOST, listener.port, A, authorize=trust_all)
            ch.send_nowait(b"still serving")
            assert await ch.recv() == b"gnivres llits"
            ch.close()

    run(main())


def test_silent_client_hits_the_handshake_deadline() -> None:
    async def main() -> None:
        opts = ChannelOptions(handshake_timeout_s=0.2)
        async with await start(options=opts) as listener:
            reader, writer = await asyncio.open_connection(HOST, listener.port)
            assert await read_to_eof(reader) == b""  # the server hung up on us
            writer.close()
            assert listener.counters.get("errors.deadline_exceeded") == 1

    run(main())


def test_silent_server_hits_the_connect_deadline() -> None:
    async def main() -> None:
        async def silent(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            await r.read()

        server = await asyncio.start_server(silent, HOST, 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            with pytest.raises(DeadlineExceeded):
                await connect(HOST, port, A, authorize=trust_all, timeout_s=0.2)

    run(main())


def test_closed_port_is_unreachable() -> None:
    async def main() -> None:
        with socket.socket() as s:
            s.bind((HOST, 0))
            port = s.getsockname()[1]
        with pytest.raises(PeerUnreachable):
            await connect(HOST, port, A, authorize=trust_all)

    run(main())


# -- replay through a man-in-the-middle relay ------------------------------------------


class RecordRelay:
    """A TCP relay that parses client->server u16-length records and can replay one."""

    def __init__(self, target_port: int, replay_index: int, after_index: int) -> None:
        self.target_port = target_port
        self.replay_index = replay_index
        self.after_index = after_index
        self.records: list[bytes] = []
        self.replayed = asyncio.Event()
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._handle, HOST, 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _handle(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        sr, sw = await asyncio.open_connection(HOST, self.target_port)

        async def upstream() -> None:
            while True:
                try:
                    head = await cr.readexactly(2)
                    body = await cr.readexactly(int.from_bytes(head, "big"))
                except asyncio.IncompleteReadError:
                    sw.close()
                    return
                record = head + body
                self.records.append(record)
                sw.write(record)
                if len(self.records) - 1 == self.after_index:
                    sw.write(self.records[self.replay_index])  # the replay
                    self.replayed.set()
                await sw.drain()

        async def downstream() -> None:
            while data := await sr.read(65536):
                cw.write(data)
                await cw.drain()
            cw.close()

        await asyncio.gather(upstream(), downstream(), return_exceptions=True)


def test_replayed_record_is_rejected_and_never_delivered() -> None:
    async def main() -> None:
        delivered: list[bytes] = []
        server_channels: list[SecureChannel] = []

        async def collect(ch: SecureChannel) -> None:
            server_channels.append(ch)
            try:
                while True:
                    delivered.append(await ch.recv())
            except ConnectionClosed:
                pass

        async with await start(on_channel=collect) as listener:
            # records 0 and 1 are handshake messages 1 and 3; 2 and 3 carry frames
            relay = RecordRelay(listener.port, replay_index=2, after_index=3)
            port = await relay.start()
            ch = await connect(HOST, port, A, authorize=trust_all, expect_address=B.address)
            await ch.send(b"pay alice 10")
            await ch.wait_sent()
            await ch.send(b"pay bob 5")
            await ch.wait_sent()
            await relay.replayed.wait()
            await eventually(
                lambda: bool(server_channels) and server_channels[0].is_closed, "server closes"
            )
            assert isinstance(server_channels[0].close_reason, BadRecord)
            await eventually(lambda: len(delivered) == 2, "both genuine frames delivered")
            assert delivered == [b"pay alice 10", b"pay bob 5"]  # never twice
            assert listener.counters.get("errors.bad_record") == 1
            await eventually(lambda: ch.is_closed, "client learns of the failure")
            assert "bad_record" in str(ch.close_reason)
            assert relay.server is not None
            relay.server.close()

    run(main())


# -- backpressure ------------------------------------------------------------------------


def test_slow_reader_applies_backpressure_and_nothing_is_lost() -> None:
    async def main() -> None:
        release = asyncio.Event()
        delivered: list[bytes] = []
        server_opts = ChannelOptions(recv_queue_frames=8, recv_queue_bytes=64 * 1024)

        async def slow(ch: SecureChannel) -> None:
            await release.wait()
            try:
                while True:
                    delivered.append(await ch.recv())
            except ConnectionClosed:
                pass

        async with await start(on_channel=slow, options=server_opts) as listener:
            client_opts = ChannelOptions(send_queue_frames=16, send_queue_bytes=256 * 1024)
            ch = await connect(HOST, listener.port, A, authorize=trust_all, options=client_opts)
            frame_bytes = 64 * 1024
            sent = 0
            stuck = False
            for _ in range(4000):  # bounded: loopback buffers hold far less than 256 MiB
                frame = sent.to_bytes(4, "big") + b"\0" * (frame_bytes - 4)
                try:
                    ch.send_nowait(frame)
                except WouldBlock:
                    # Full right now; truly stuck only if it stays full while nobody reads.
                    try:
                        await ch.send(frame, timeout_s=0.2)
                    except DeadlineExceeded:
                        stuck = True  # that frame was not queued
                        break
                sent += 1
                await asyncio.sleep(0)  # let the writer move frames to the kernel
            assert stuck, "the sender never felt backpressure"
            waiting = asyncio.create_task(ch.send(sent.to_bytes(4, "big") + b"tail"))
            sent += 1
            release.set()
            await waiting
            await ch.wait_sent(timeout_s=10)
            await eventually(lambda: len(delivered) == sent, f"all {sent} frames delivered", 10)
            assert [int.from_bytes(f[:4], "big") for f in delivered] == list(range(sent))
            stats = ch.statistics()
            assert stats.send_would_block >= 1 and stats.send_waits >= 2
            assert stats.frames_dropped == 0
            await ch.aclose()

    run(main())


def test_frames_unsent_at_close_are_counted_as_dropped() -> None:
    async def main() -> None:
        release = asyncio.Event()

        async def stall(ch: SecureChannel) -> None:
            await release.wait()

        async with await start(on_channel=stall) as listener:
            opts = ChannelOptions(send_queue_frames=4)
            ch = await connect(HOST, listener.port, A, authorize=trust_all, options=opts)
            for _ in range(4000):
                try:
                    ch.send_nowait(b"\0" * 65536)
                except WouldBlock:
                    break
                await asyncio.sleep(0)
            pending = ch.statistics().send_queue_frames
            assert pending > 0
            ch.close()
            stats = ch.statistics()
            assert stats.frames_dropped == pending and stats.closed
            release.set()

    run(main())


def test_peer_that_never_reads_hits_the_write_stall_deadline() -> None:
    async def main() -> None:
        release = asyncio.Event()

        async def never_read(ch: SecureChannel) -> None:
            await release.wait()

        small = ChannelOptions(recv_queue_frames=2, recv_queue_bytes=65536)
        async with await start(on_channel=never_read, options=small) as listener:
            opts = ChannelOptions(write_stall_timeout_s=0.3)
            ch = await connect(HOST, listener.port, A, authorize=trust_all, options=opts)
            with pytest.raises(ConnectionClosed) as info:
                for _ in range(4000):  # bounded: far beyond loopback socket buffers
                    await ch.send(b"\0" * 65536)
            assert isinstance(info.value.__cause__, DeadlineExceeded)
            assert ch.statistics().errors == {"deadline_exceeded": 1}
            assert ch.statistics().frames_dropped > 0  # queued frames were counted, not hidden
            await asyncio.wait_for(ch.wait_closed(), 5)  # aborted, not stuck flushing
            release.set()

    run(main())


def test_a_raising_trust_policy_fails_closed() -> None:
    def broken(address: str) -> bool:
        raise RuntimeError("policy store offline")

    async def main() -> None:
        async with await start(authorize=broken) as listener:
            with pytest.raises(UnknownPeer):
                await connect(HOST, listener.port, A, authorize=trust_all)
            with pytest.raises(UnknownPeer, match="raised"):
                await connect(HOST, listener.port, A, authorize=broken)
            with pytest.raises(InvalidAddress):
                await connect(HOST, listener.port, A, authorize=trust_all, expect_address="hm123")

    run(main())


def test_many_concurrent_peers() -> None:
    peers = [Identity.from_seed(bytes([i]) * 32) for i in range(10, 30)]

    async def main() -> None:
        async with await start() as listener:

            async def one(identity: Identity) -> None:
                ch = await connect(HOST, listener.port, identity, authorize=trust_all)
                frames = [identity.public + b"%d" % i for i in range(300)]
                for f in frames:
                    await ch.send(f)
                for f in frames:
                    assert await ch.recv() == f[::-1]
                await ch.aclose()

            await asyncio.gather(*(one(p) for p in peers))
            await eventually(lambda: listener.channels() == [], "all channels closed")
            snap = listener.counters.snapshot()
            assert snap["handshakes_ok"] == len(peers)
            assert snap["frames_in"] == snap["frames_out"] == 300 * len(peers)
            assert snap["frames_dropped"] == 0

    run(main())


def test_closing_the_listener_closes_pending_handshakes() -> None:
    async def main() -> None:
        listener = await start()
        reader, writer = await asyncio.open_connection(HOST, listener.port)
        await eventually(lambda: listener.counters.get("connections_accepted") == 1, "accepted")
        listener.close()
        await listener.wait_closed()
        assert await read_to_eof(reader) == b""
        writer.close()

    run(main())


def test_unread_frames_at_local_close_are_counted_in_the_listener() -> None:
    async def main() -> None:
        held: list[SecureChannel] = []

        async def hold(ch: SecureChannel) -> None:
            held.append(ch)

        async with await start(on_channel=hold) as listener:
            ch = await connect(HOST, listener.port, A, authorize=trust_all)
            for i in range(5):
                ch.send_nowait(b"%d" % i)
            await eventually(
                lambda: bool(held) and held[0].statistics().recv_queue_frames == 5, "5 queued"
            )
            held[0].close()
            assert held[0].statistics().frames_dropped == 5
            assert listener.counters.get("frames_dropped") == 5
            await eventually(lambda: ch.is_closed, "client sees the close")
            ch.close()

    run(main())


def test_channel_cap_refuses_extra_connections_as_busy() -> None:
    async def main() -> None:
        async with await start(max_channels=1) as listener:
            first = await connect(HOST, listener.port, A, authorize=trust_all)
            with pytest.raises(PeerBusy, match="busy"):  # told why, not just closed
                await connect(HOST, listener.port, C, authorize=trust_all)
            assert listener.counters.get("refused_busy") == 1
            first.close()
            await eventually(lambda: listener.channels() == [], "slot freed")
            again = await connect(HOST, listener.port, C, authorize=trust_all)
            again.close()

    run(main())


def test_channel_options_are_validated() -> None:
    with pytest.raises(InvalidArgument):
        ChannelOptions(send_queue_frames=0)
    with pytest.raises(InvalidArgument):
        ChannelOptions(handshake_timeout_s=-1.0)


def _takeover(early: list[bytes], buffered_at_least: int) -> None:
    """A peer may send frames in the same segment as its last handshake
    message: they sit in the handshake's stream buffer when the channel takes
    the socket over, and must come out first, in order, and reading must go on
    (the stream reader pauses the socket when its buffer fills)."""
    import secrets

    from hivemesh.transports.noise import SecureHandshake, StaticCredentials
    from hivemesh.transports.session import ChannelOptions as Opts
    from hivemesh.transports.stats import TransportCounters
    from hivemesh.transports.streams import run_handshake as _handshake

    async def main() -> None:
        s1, s2 = socket.socketpair()
        r1, w1 = await asyncio.open_connection(sock=s1)
        r2, w2 = await asyncio.open_connection(sock=s2)
        creds_a = StaticCredentials.generate(A, secrets.token_bytes)
        creds_b = StaticCredentials.generate(B, secrets.token_bytes)
        hs_a = SecureHandshake(
            creds_a, initiator=True, random_bytes=secrets.token_bytes, authorize=trust_all
        )
        hs_b = SecureHandshake(
            creds_b, initiator=False, random_bytes=secrets.token_bytes, authorize=trust_all
        )
        opts = Opts()
        (sa, _), (sb, _) = await asyncio.gather(
            _handshake(r1, w1, hs_a, opts), _handshake(r2, w2, hs_b, opts)
        )
        w1.write(sa.encode_frames(early))
        await eventually(
            lambda: len(getattr(r2, "_buffer", b"")) >= buffered_at_least, "bytes buffered"
        )
        ch = SecureChannel(
            r2,
            w2,
            sb,
            peer_address=A.address,
            handshake_hash=b"",
            options=opts,
            counters=TransportCounters(),
            initial_frames=[b"with-accept"],
        )
        w1.write(sa.encode_frames([b"later"]))
        got = [await ch.recv() for _ in range(len(early) + 2)]
        assert got == [b"with-accept", *early, b"later"]
        w1.close()
        with pytest.raises(ConnectionClosed):
            await ch.recv()
        assert ch.is_closed

    run(main())


def test_bytes_buffered_past_the_handshake_are_delivered_first() -> None:
    _takeover([b"early-1", b"early-2"], 1)


def test_a_full_handshake_buffer_does_not_leave_the_socket_paused() -> None:
    _takeover([bytes([i]) * 60_000 for i in range(6)], 140_000)


def test_a_refusal_is_a_zero_length_mark_then_its_code_and_maps_to_a_typed_error() -> None:
    from hivemesh.errors import HandshakeError
    from hivemesh.transports.admission import BUSY, REFUSAL_MARK, encode_refusal, refusal_error

    assert encode_refusal(BUSY) == REFUSAL_MARK + b"\x04busy"
    assert len(encode_refusal("x" * 300)) == 2 + 1 + 255
    assert isinstance(refusal_error(BUSY), PeerBusy)
    err = refusal_error("maintenance")
    assert isinstance(err, HandshakeError) and "maintenance" in str(err)


def test_a_peer_close_code_becomes_its_typed_error_by_one_table() -> None:
    from hivemesh.errors import ChannelSuperseded, ConnectionClosed, InviteUsed, StaleBoot
    from hivemesh.transports.session import peer_close_error

    expected = {
        "unknown_peer": UnknownPeer,
        "invite_used": InviteUsed,
        "channel_superseded": ChannelSuperseded,
        "stale_boot": StaleBoot,
        "normal": ConnectionClosed,
    }
    assert {code: type(peer_close_error(code)) for code in expected} == expected
    other = peer_close_error("going_away")
    assert type(other) is ConnectionClosed and "going_away" in str(other)
