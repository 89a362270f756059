"""The sans-IO parts of NAT traversal: relay messages, the relay's rules,
observed addresses, punch plans and retries."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hivemesh.errors import DecodeError, InvalidArgument
from hivemesh.transports.punch import (
    ObservedAddresses,
    PunchAsk,
    PunchSchedule,
    Upgrades,
    plan_punch,
)
from hivemesh.transports.relay_policy import (
    RELAY_CIRCUIT_BIT,
    Forward,
    RelayLimits,
    RelayTable,
    punch_candidates,
)
from hivemesh.transports.relay_wire import Kind, Message, Punch, data_frames, decode, encode


def test_every_message_round_trips() -> None:
    msgs = [
        Message(Kind.RESERVE),
        Message(Kind.RESERVED),
        Message(Kind.CONNECT, 7, text="hmabc"),
        Message(Kind.CONNECTED, 7),
        Message(Kind.INCOMING, 9, text="hmdef"),
        Message(Kind.DATA, 9, data=b"\x00\x01" * 100),
        Message(Kind.CLOSE, 9, text="normal"),
        Message(Kind.REFUSED, 0, text="reservations"),
        Message(Kind.OBSERVED, text="198.18.101.2:7420"),
        Message(Kind.PUNCH, 3, punch=Punch("hmabc", (("198.18.0.2", 1), ("1.2.3.4", 65535)))),
    ]
    for msg in msgs:
        assert decode(encode(msg)) == msg


@given(st.binary(max_size=300), st.integers(1, 64))
def test_data_frames_carry_the_bytes_in_order_in_bounded_chunks(data: bytes, chunk: int) -> None:
    msgs = [decode(f) for f in data_frames(7, data, chunk)]
    assert all(m.kind == Kind.DATA and m.circuit == 7 and 0 < len(m.data) <= chunk for m in msgs)
    assert b"".join(m.data for m in msgs) == data


@given(st.binary(max_size=200))
def test_garbage_never_crashes_the_decoder(data: bytes) -> None:
    with contextlib.suppress(DecodeError):
        decode(data)


def test_malformed_punches_are_refused() -> None:
    head = bytes([Kind.PUNCH]) + (1).to_bytes(4, "big")
    for body in (
        b"",
        b"\x05hm",
        b"\x02hm",
        b"\x02hm\x01\x03a:b",
        b"\x02hm\x00extra",
        b"\x02hm\x40",
    ):
        with pytest.raises(DecodeError):
            decode(head + body)


def test_relay_rules_count_every_refusal() -> None:
    t = RelayTable(RelayLimits(max_reservations=1, max_circuits_per_peer=1, max_data_bytes=10))
    assert t.reserve("b") is None
    assert t.reserve("x") == "reservations"
    code, circuit = t.connect("a", 1, "b")
    assert code is None and circuit is not None
    assert t.connect("a", 2, "b")[0] == "circuits_per_peer"
    assert t.connect("a", 3, "nobody")[0] == "no_reservation"
    assert t.connect("a", 1, "b")[0] == "bad_circuit"
    v = t.data("a", 1, 10, 0.0)
    assert v.refused is None and (v.peer, v.cid) == ("b", circuit.b_cid)
    assert t.data("b", circuit.b_cid, 5, 0.0).peer == "a"
    assert t.punch("a", 1, "m", 0, 0.0)[0] == "spoofed"
    assert t.punch("a", 99, "a", 0, 0.0)[0] == "foreign"
    assert t.punch("a", 1, "a", 9, 0.0)[0] == "candidates"
    assert t.punch("a", 1, "a", 1, 0.0) == (None, ("b", circuit.b_cid))
    assert t.punch("a", 1, "a", 1, 0.5)[0] == "punch_rate"
    v = t.data("a", 1, 11, 0.0)  # the circuit is gone, and its other leg is named
    assert v.refused == "oversize" and (v.peer, v.cid) == ("b", circuit.b_cid)
    assert t.data("b", circuit.b_cid, 1, 0.0).refused == "unknown_circuit"
    refused = {k: v for k, v in t.counters.items() if k.startswith("relay_refused_")}
    assert refused == {
        f"relay_refused_{c}": 1
        for c in (
            "reservations",
            "circuits_per_peer",
            "no_reservation",
            "bad_circuit",
            "spoofed",
            "foreign",
            "candidates",
            "punch_rate",
            "oversize",
            "unknown_circuit",
        )
    }
    with pytest.raises(InvalidArgument):
        RelayLimits(bytes_per_s=0)


def test_the_token_bucket_shapes_instead_of_dropping() -> None:
    t = RelayTable(RelayLimits(bytes_per_s=1000, burst_bytes=1000, max_data_bytes=1000))
    t.reserve("b")
    _, circuit = t.connect("a", 1, "b")
    assert circuit is not None
    assert t.data("a", 1, 1000, 0.0).delay_s == 0.0
    assert t.data("a", 1, 500, 0.0).delay_s == pytest.approx(0.5)
    assert t.data("a", 1, 500, 2.0).delay_s == 0.0  # refilled
    assert t.counters["relay_throttled"] == 1
    assert t.drop_peer("a") == [("b", circuit.b_cid)]
    assert t.data("b", circuit.b_cid, 1, 3.0).refused == "unknown_circuit"


def test_ids_a_node_picks_and_ids_the_relay_picks_never_collide() -> None:
    """A node that opens circuit 1 and is then offered one by the relay must
    see two ids (a collision made both ends route one circuit's bytes to the
    other, and the link to the peer went half-open)."""
    t = RelayTable()
    t.reserve("a")
    t.reserve("b")
    _, ab = t.connect("a", 1, "b")
    _, ba = t.connect("b", 1, "a")
    assert ab is not None and ba is not None
    assert ba.b_cid != 1 and ab.b_cid != 1 and ba.b_cid >= RELAY_CIRCUIT_BIT
    assert t.data("a", 1, 1, 0.0).peer == "b" and t.data("a", ba.b_cid, 1, 0.0).peer == "b"
    assert t.connect("a", RELAY_CIRCUIT_BIT | 5, "b")[0] == "bad_circuit"


def test_observed_addresses_need_agreement_and_spot_symmetric_nats() -> None:
    obs = ObservedAddresses(quorum=2, ttl_s=10)
    obs.report("r1", ("1.1.1.1", 5000), 0)
    assert obs.believed(0) == [] and obs.candidates(0) == [("1.1.1.1", 5000)]
    obs.report("r2", ("1.1.1.1", 5000), 1)
    assert obs.believed(1) == [("1.1.1.1", 5000)] and not obs.symmetric(1)
    obs.report("r3", ("1.1.1.1", 6001), 2)
    assert obs.symmetric(2)
    assert obs.believed(20) == []  # forgotten


def test_punch_plans_agree_on_roles_and_bound_candidates() -> None:
    cands = [("1.1.1.1", 1), ("1.1.1.1", 1), ("2.2.2.2", 0)] + [
        ("3.3.3.3", p) for p in range(1, 20)
    ]
    pa, pb = plan_punch("a", "b", cands), plan_punch("b", "a", cands)
    assert pa.dial and not pb.dial
    assert pa.candidates[0] == ("1.1.1.1", 1) and len(pa.candidates) == 8
    assert ("2.2.2.2", 0) not in pa.candidates


def test_punch_retries_back_off_and_reset() -> None:
    s = PunchSchedule(base_s=1, max_s=8)
    assert s.due("p", 0)
    s.started("p", 0)
    assert not s.due("p", 1) and s.due("p", 10)  # never reported back: retried
    assert s.failed("p", 1) == 1
    assert s.failed("p", 2) == 2
    assert s.failed("p", 4) == 4 and s.failed("p", 8) == 8 and s.failed("p", 16) == 8
    assert not s.due("p", 23) and s.due("p", 24)
    s.succeeded("p")
    assert s.due("p", 0)


def test_a_reserved_peer_whose_channel_is_gone_gets_no_circuit() -> None:
    t = RelayTable()
    assert t.reserve("b") is None
    assert t.connect("a", 1, "b", online=False) == ("no_reservation", None)
    assert t.counters["relay_circuits_opened"] == 0
    assert t.counters["relay_refused_no_reservation"] == 1


def test_punch_candidates_put_the_observed_address_first_and_are_bounded() -> None:
    mine, theirs = ("198.51.100.1", 4000), ("203.0.113.2", 5000)
    given = (("10.0.0.1", 4000), mine, ("10.0.0.2", 4000))
    forward, back = punch_candidates(mine, given, theirs, 2)
    assert forward == (mine, ("10.0.0.1", 4000)) and back == (theirs,)
    assert punch_candidates(None, given, None, 8) == (given, ())


def _sends(forward: Forward) -> list[tuple[str, Message]]:
    return list(forward.sends)


def test_the_relay_table_answers_every_frame_with_what_to_send() -> None:
    """The relay's whole protocol without sockets: channels up, RESERVE,
    CONNECT, DATA (shaped), PUNCH, CLOSE, garbage, a channel down."""
    t = RelayTable(RelayLimits(bytes_per_s=100, burst_bytes=100))
    a_at, b_at = ("198.51.100.1", 4000), ("203.0.113.2", 5000)
    observed = Message(Kind.OBSERVED, text="198.51.100.1:4000")
    assert _sends(t.link_up("a", a_at)) == [("a", observed)]
    assert _sends(t.link_up("b", b_at))[0][0] == "b"
    assert t.link_up("c", None) == Forward()  # relayed onwards: nothing observed
    rx = lambda peer, msg, now=0.0: _sends(t.receive(peer, encode(msg), now))  # noqa: E731
    assert rx("b", Message(Kind.RESERVE)) == [("b", Message(Kind.RESERVED))]
    assert rx("a", Message(Kind.CONNECT, 1, text="nobody")) == [
        ("a", Message(Kind.REFUSED, 1, text="no_reservation"))
    ]
    (incoming, connected) = rx("a", Message(Kind.CONNECT, 1, text="b"))
    b_cid = incoming[1].circuit
    assert incoming == ("b", Message(Kind.INCOMING, b_cid, text="a"))
    assert connected == ("a", Message(Kind.CONNECTED, 1))
    forward = t.receive("a", encode(Message(Kind.DATA, 1, data=b"x" * 150)), 0.0)
    assert forward.sends == (("b", Message(Kind.DATA, b_cid, data=b"x" * 150)),)
    assert forward.delay_s == pytest.approx(0.5)  # 50 bytes over the burst at 100 B/s
    punch = Punch("a", (("10.0.0.1", 1),))
    assert rx("a", Message(Kind.PUNCH, 1, punch=punch)) == [
        ("b", Message(Kind.PUNCH, b_cid, punch=Punch("a", (a_at, ("10.0.0.1", 1))))),
        ("a", Message(Kind.PUNCH, 1, punch=Punch("b", (b_at,)))),
    ]
    assert rx("a", Message(Kind.PUNCH, 1, punch=punch), 0.5) == [
        ("a", Message(Kind.REFUSED, 1, text="punch_rate"))
    ]
    assert rx("a", Message(Kind.CONNECTED, 1)) == []  # only a relay sends that
    assert t.receive("a", b"\xff", 0.0) == Forward()
    assert t.counters["relay_refused_unexpected"] == t.counters["relay_refused_malformed"] == 1
    assert rx("b", Message(Kind.CLOSE, b_cid, text="normal")) == [
        ("a", Message(Kind.CLOSE, 1, text="normal"))
    ]
    rx("a", Message(Kind.CONNECT, 2, text="b"))
    assert _sends(t.link_down("b")) == [("a", Message(Kind.CLOSE, 2, text="peer_gone"))]
    assert rx("a", Message(Kind.CONNECT, 3, text="b"))[0][1].text == "no_reservation"


def test_an_oversize_data_message_closes_both_legs() -> None:
    t = RelayTable(RelayLimits(max_data_bytes=4))
    t.link_up("a", None), t.link_up("b", None), t.reserve("b")
    _, circuit = t.connect("a", 1, "b")
    assert circuit is not None
    assert _sends(t.receive("a", encode(Message(Kind.DATA, 1, data=b"12345")), 0.0)) == [
        ("a", Message(Kind.CLOSE, 1, text="oversize")),
        ("b", Message(Kind.CLOSE, circuit.b_cid, text="oversize")),
    ]


def test_a_peers_new_relay_channel_ends_the_circuits_of_its_old_one() -> None:
    """The replaced channel's circuits end as if it had closed: their other
    legs hear CLOSE, the table forgets them (and the reservation made on it),
    each end is counted, and they no longer count against the peer's caps."""
    t = RelayTable(RelayLimits(max_circuits_per_peer=3))
    a_at, a_new = ("198.51.100.1", 4000), ("198.51.100.1", 4001)
    for peer, at in (("a", a_at), ("b", None), ("c", None)):
        t.link_up(peer, at), t.reserve(peer)
    rx = lambda peer, msg: _sends(t.receive(peer, encode(msg), 0.0))  # noqa: E731
    (to_b, _) = rx("a", Message(Kind.CONNECT, 1, text="b"))  # a's own circuit
    (to_a, _) = rx("c", Message(Kind.CONNECT, 1, text="a"))  # one to a
    b_cid, a_cid = to_b[1].circuit, to_a[1].circuit
    rx("b", Message(Kind.CONNECT, 2, text="c"))  # not a's: stays
    closed = t.counters["relay_circuits_closed"]
    assert _sends(t.link_up("a", a_new)) == [
        ("b", Message(Kind.CLOSE, b_cid, text="replaced")),
        ("c", Message(Kind.CLOSE, 1, text="replaced")),
        ("a", Message(Kind.OBSERVED, text="198.51.100.1:4001")),
    ]
    assert t.counters["relay_circuits_closed"] == closed + 2
    assert t.counters["relay_channels_replaced"] == 1
    assert t.circuit("a", 1) is t.circuit("b", b_cid) is t.circuit("a", a_cid) is None
    assert t.circuit("b", 2) is not None and t.online["a"] == a_new
    assert rx("b", Message(Kind.DATA, b_cid, data=b"x")) == [
        ("b", Message(Kind.CLOSE, b_cid, text="unknown_circuit"))
    ]
    assert rx("c", Message(Kind.CONNECT, 3, text="a"))[0][1].text == "no_reservation"
    t.reserve("a")  # the new channel reserves again
    assert rx("a", Message(Kind.CONNECT, 1, text="b"))[1] == ("a", Message(Kind.CONNECTED, 1))
    for _ in range(100):  # however often a comes back, its old circuits never fill its caps
        assert rx("a", Message(Kind.CONNECT, 2, text="c"))[1] == ("a", Message(Kind.CONNECTED, 2))
        assert rx("c", Message(Kind.CONNECT, 4, text="a"))[1] == ("c", Message(Kind.CONNECTED, 4))
        assert len(t.link_up("a", a_new).sends) == 3 + 1  # b's, c's two, OBSERVED
        t.reserve("a")
        assert rx("a", Message(Kind.CONNECT, 1, text="b"))[1] == ("a", Message(Kind.CONNECTED, 1))
    assert t.counters["relay_channels_replaced"] == 101
    assert t.counters["relay_circuits_closed"] == closed + 2 + 300


def test_one_punch_at_a_time_per_peer_and_none_beside_a_direct_link() -> None:
    s = PunchSchedule(base_s=1, max_s=8)
    assert s.may_start("p", 0, direct=False) and not s.may_start("p", 0, direct=True)
    s.started("p", 0)  # asked the peer: not again until it answers or in_flight_s passes
    assert not s.may_start("p", 1, direct=False) and s.may_answer("p", direct=False)
    s.begin("p")  # the punch runs: the peer's own offer is not answered twice
    assert not s.may_answer("p", direct=False) and not s.may_start("p", 99, direct=False)
    s.ended("p", False, 2)
    assert s.may_answer("p", direct=False) and not s.may_start("p", 2.5, direct=False)
    assert s.may_start("p", 3, direct=False)  # one failure: due after base_s
    s.begin("p")
    s.ended("p", True, 4)
    assert s.may_start("p", 4, direct=False)  # a success starts over


def test_upgrades_ask_when_due_and_forget_a_closed_circuit() -> None:
    up = Upgrades("hma", schedule=PunchSchedule(base_s=5, in_flight_s=10))
    up.observed.report("relay", ("1.2.3.4", 7000), 0.0)
    up.relayed("hmb", "relay", 3)
    up.relayed("hmc", "relay", 4)
    assert up.peers() == ["hmb", "hmc"] and up.counters.get("relayed_opened") == 2
    always: Callable[[str, int], bool] = lambda relay, cid: True  # noqa: E731
    asked = up.ask("hmb", 0.0, direct=False, open_=always)
    assert asked == PunchAsk("relay", 3, (("1.2.3.4", 7000),))
    assert up.ask("hmb", 9.0, direct=False, open_=always) is None  # one in flight
    assert up.ask("hmb", 10.0, direct=True, open_=always) is None  # a direct link: none
    assert up.ask("hmb", 10.0, direct=False, open_=always) is not None  # in flight too long
    assert up.ask("hmc", 0.0, direct=False, open_=lambda relay, cid: False) is None
    assert up.peers() == ["hmb"]  # its circuit closed: forgotten
    assert up.counters.get("punch_requested") == 2


def test_upgrades_answer_an_offer_once_and_back_off_after_a_failure() -> None:
    up = Upgrades("hma", schedule=PunchSchedule(base_s=5))
    cands = (("1.2.3.4", 7000), ("1.2.3.4", 7000), ("5.6.7.8", 0))
    plan = up.answer("hmb", cands, 0.0, direct=False)
    assert plan is not None and plan.dial and plan.candidates == (("1.2.3.4", 7000),)
    assert up.answer("hmb", cands, 0.1, direct=False) is None  # one runs already
    assert up.answer("hmc", cands, 0.1, direct=True) is None  # a direct link
    assert up.counters.get("punch_skipped") == 2
    up.ended("hmb", False, 1.0)
    assert up.counters.get("punch_failed") == 1 and not up.schedule.due("hmb", 5.9)
    assert up.answer("hma0", (), 1.0, direct=False) is None  # nothing to punch towards
    assert up.counters.get("punch_no_candidates") == 1 and not up.schedule.due("hma0", 5.9)
    waiting = up.answer("hm0", cands, 2.0, direct=False)
    assert waiting is not None and not waiting.dial  # the larger address waits
    up.ended("hm0", True, 3.0)
    assert up.counters.get("punch_ok") == 1 and up.counters.get("punch_started") == 2


def test_upgrades_reopen_an_ended_relay_every_revive_s() -> None:
    up = Upgrades("hma", revive_s=5.0)
    up.relay_added("r", 0.0)
    assert not up.revive("r", 4.9, up=False)  # its first start just ran
    assert up.revive("r", 5.0, up=False)
    assert not up.revive("r", 9.9, up=False)
    assert not up.revive("r", 20.0, up=True)  # up again: nothing to do
    assert up.revive("r", 20.1, up=False)
    assert up.revive("unknown", 0.0, up=False)  # never started: try at once


def test_a_waiting_punchs_candidates_are_expected_until_it_ends() -> None:
    """Only the punches running are expected: success, failure or cancel (all
    ``ended``) forget their candidates, so the endpoint's sources stay bounded."""
    up = Upgrades("hm5")
    at = lambda i: ("10.0.0.1", 1000 + i)  # noqa: E731
    plan = up.answer("hm1", (at(0),), 0.0, direct=False)  # the larger address waits
    assert plan is not None and not plan.dial
    assert at(0) in up.sources and at(1) not in up.sources and len(up.sources) == 1
    dials = up.answer("hm9", (at(1),), 0.0, direct=False)  # we dial: nothing to expect
    assert dials is not None and dials.dial and at(1) not in up.sources
    up.ended("hm9", True, 1.0)
    assert up.answer("hm2", (at(0), at(2)), 1.0, direct=False) is not None  # shares at(0)
    up.ended("hm1", True, 2.0)
    assert at(0) in up.sources and at(2) in up.sources  # still hm2's
    up.ended("hm2", False, 2.0)
    assert len(up.sources) == 0 and at(0) not in up.sources
    for i in range(1000):  # many punches, each ended one way or another
        peer = f"hm0{i:04d}"
        assert up.answer(peer, (at(i),), float(i), direct=False) is not None
        assert len(up.sources) == 1 and at(i) in up.sources
        up.ended(peer, i % 2 == 0, float(i))
    assert len(up.sources) == 0
