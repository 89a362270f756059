"""The relay client's circuits, sans-IO (hivemesh.transports.relay_circuits)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hivemesh.transports.relay_circuits import ClientCircuits, Event, Happened
from hivemesh.transports.relay_wire import (
    DATA_CHUNK_BYTES,
    Kind,
    Message,
    Punch,
    decode,
    encode,
)

ME, BOB, EVE = "a" * 52, "b" * 52, "e" * 52


def sent(c: ClientCircuits) -> list[Message]:
    out = []
    while (item := c.take()) is not None:
        out.append(decode(item[1]))
    return out


def test_open_connect_data_and_close_go_out_in_order() -> None:
    c = ClientCircuits(ME)
    cid = c.open(BOB)
    assert c.receive(encode(Message(Kind.CONNECTED, cid))) == Event(Happened.CONNECTED, cid)
    c.send(cid, b"x" * (DATA_CHUNK_BYTES + 1))
    assert c.buffered(cid) == DATA_CHUNK_BYTES + 1 + 2 * 5  # two DATA frames, 5-byte heads
    assert c.close(cid) and not c.close(cid)  # a second close is nothing
    c.send(cid, b"late")  # after the close: dropped
    kinds = [(m.kind, m.circuit, len(m.data)) for m in sent(c)]
    assert kinds == [
        (Kind.CONNECT, cid, 0),
        (Kind.DATA, cid, DATA_CHUNK_BYTES),
        (Kind.DATA, cid, 1),
        (Kind.CLOSE, cid, 0),
    ]
    assert c.circuit_of(BOB) is None


def test_buffered_shrinks_as_frames_are_taken() -> None:
    c = ClientCircuits(ME)
    cid = c.open(BOB)
    c.take()  # CONNECT
    c.send(cid, b"abc")
    assert c.buffered(cid) == 8
    assert c.take() == (cid, encode(Message(Kind.DATA, cid, data=b"abc")))
    assert c.buffered(cid) == 0


def test_data_only_for_a_connected_circuit() -> None:
    c = ClientCircuits(ME)
    cid = c.open(BOB)
    assert c.receive(encode(Message(Kind.DATA, cid, data=b"early"))) is None
    assert c.receive(encode(Message(Kind.DATA, 99, data=b"stray"))) is None
    assert c.counters.get("relay_data_unknown_circuit") == 2
    c.receive(encode(Message(Kind.CONNECTED, cid)))
    got = c.receive(encode(Message(Kind.DATA, cid, data=b"ok")))
    assert got == Event(Happened.DATA, cid, data=b"ok")


def test_the_relays_close_drops_the_circuits_queued_data() -> None:
    c = ClientCircuits(ME)
    incoming = c.receive(encode(Message(Kind.INCOMING, 1 << 31 | 7, text=BOB)))
    assert incoming == Event(Happened.INCOMING, 1 << 31 | 7, text=BOB)
    cid = incoming.cid
    assert c.circuit_of(BOB) == cid
    assert c.accepted(cid, BOB) and not c.accepted(cid, EVE)
    assert c.counters.get("relay_source_mismatch") == 1
    c.send(cid, b"never")
    c.reserve()
    ended = c.receive(encode(Message(Kind.CLOSE, cid, text="peer_gone")))
    assert ended == Event(Happened.ENDED, cid, text="peer_gone")
    assert [m.kind for m in sent(c)] == [Kind.RESERVE]
    assert not c.is_open(cid) and not c.close(cid)  # no CLOSE back for it
    assert not c.accepted(cid, BOB)  # ended before its handshake did: no mismatch
    assert c.counters.get("relay_source_mismatch") == 1


def test_reservation_refusals_and_observed_addresses() -> None:
    c = ClientCircuits(ME)
    assert c.receive(encode(Message(Kind.RESERVED))) == Event(Happened.RESERVED)
    assert c.reserved
    c.receive(encode(Message(Kind.REFUSED, text="reservations")))
    assert not c.reserved and c.counters.get("relay_refused_reservations") == 1
    got = c.receive(encode(Message(Kind.OBSERVED, text="1.2.3.4:5")))
    assert got == Event(Happened.OBSERVED, addr=("1.2.3.4", 5))
    assert c.receive(encode(Message(Kind.OBSERVED, text="nonsense"))) is None
    assert c.receive(b"\x63garbage") is None
    assert c.counters.get("relay_malformed") == 2
    cid = c.open(BOB)
    refused = c.receive(encode(Message(Kind.REFUSED, cid, text="no_reservation")))
    assert refused == Event(Happened.REFUSED, cid, text="no_reservation")
    assert c.counters.get("relay_refused_no_reservation") == 1


def test_a_punch_must_come_from_the_circuits_other_end() -> None:
    c = ClientCircuits(ME)
    cid = c.open(BOB)
    c.receive(encode(Message(Kind.CONNECTED, cid)))
    cands = (("10.0.0.1", 4000),)
    spoofed = encode(Message(Kind.PUNCH, cid, punch=Punch(EVE, cands)))
    assert c.receive(spoofed) is None
    assert c.counters.get("punch_refused_spoofed") == 1
    fair = c.receive(encode(Message(Kind.PUNCH, cid, punch=Punch(BOB, cands))))
    assert fair == Event(Happened.PUNCH, cid, BOB, candidates=cands)
    assert c.receive(encode(Message(Kind.PUNCH, 42, punch=Punch(BOB, cands)))) is None
    assert c.counters.get("relay_unexpected") == 1
    c.take()
    c.punch(cid, cands)
    (msg,) = sent(c)
    assert msg.kind == Kind.PUNCH and msg.punch == Punch(ME, cands)


def test_the_channels_end_ends_every_circuit_and_the_reservation() -> None:
    c = ClientCircuits(ME)
    c.receive(encode(Message(Kind.RESERVED)))
    one, two = c.open(BOB), c.open(EVE)
    c.send(one, b"x")
    assert c.channel_ended() == [one, two]
    assert not c.reserved and c.take() is None and c.circuit_of(BOB) is None
    assert c.open(BOB) == two + 1  # ids are never reused on this client


@given(st.lists(st.binary(max_size=80), max_size=20))
def test_any_frames_from_the_relay_never_raise_and_data_needs_a_connected_circuit(
    frames: list[bytes],
) -> None:
    c = ClientCircuits(ME)
    c.open(BOB)
    for frame in frames:
        event = c.receive(frame)
        if event is not None and event.what in (Happened.DATA, Happened.PUNCH):
            assert c.is_open(event.cid)
    c.channel_ended()
    assert c.take() is None
