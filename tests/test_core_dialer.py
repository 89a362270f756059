"""The dial schedule (hivemesh.core.dialer): every rule of its table, no sockets."""

from __future__ import annotations

import random

import pytest

from hivemesh.core.dialer import (
    Dialer,
    DialPolicy,
    Fallback,
    Outcome,
    Routes,
    parse_endpoint,
    path_changes,
    routes,
)
from hivemesh.errors import ConfigError

A, B, ME = "hmA", "hmB", "hmME"
EP = ("10.0.0.1", 7420)
EP2 = ("10.0.0.2", 7420)
POLICY = DialPolicy(reconnect_min_ms=100, reconnect_max_ms=1000, handover_ms=3000, refused_mult=6)


class _Mid(random.Random):
    """``random()`` is always 0.5: the jitter factor is exactly 1."""

    def random(self) -> float:
        return 0.5


def _dialer() -> Dialer:
    return Dialer(ME, POLICY, _Mid())


def test_a_wanted_endpoint_is_due_at_once_and_never_twice_in_flight() -> None:
    d = _dialer()
    d.want(*EP, A, 0)
    assert d.next_deadline() == 0
    assert d.due(0) == [EP]
    assert d.due(0) == []  # in flight
    assert d.next_deadline() is None
    assert d.targets()[0]["attempts"] == 1


def test_own_address_is_never_wanted_and_an_own_endpoint_is_dropped() -> None:
    d = _dialer()
    d.want(*EP, ME, 0)
    assert d.targets() == []
    d.want(*EP, None, 0)  # a bootstrap endpoint that turns out to be us
    d.due(0)
    d.dialled(EP, Outcome.SELF, 5)
    assert d.targets() == []
    d.want(*EP2, None, 0)
    d.due(0)
    d.dialled(EP2, Outcome.OPENED, 5, peer=ME)  # or the handshake says so
    assert d.targets() == []


def test_failed_dials_back_off_doubling_up_to_the_maximum() -> None:
    d = _dialer()
    d.want(*EP, A, 0)
    now, pauses = 0, []
    for _ in range(6):
        assert d.due(now) == [EP]
        d.dialled(EP, Outcome.FAILED, now, error="OSError: refused")
        due = d.next_deadline()
        assert due is not None
        pauses.append(due - now)
        assert d.due(due - 1) == []  # not before its time
        now = due
    assert pauses == [100, 200, 400, 800, 1000, 1000]
    assert d.targets()[0]["last_error"] == "OSError: refused"


def test_a_refusal_backs_off_longer_and_marks_every_endpoint_of_the_address() -> None:
    d = _dialer()
    d.want(*EP, A, 0)
    d.want(*EP2, A, 0)
    assert d.refused(A, "unknown_peer", "UnknownPeer: no", EP) is True
    assert d.refused(A, "unknown_peer", "UnknownPeer: no", EP) is False  # logged once
    assert [t["refused"] for t in d.targets()] == ["unknown_peer", "unknown_peer"]
    d.due(0)
    now = 0
    for _ in range(8):
        d.dialled(EP, Outcome.REFUSED, now)
        due = d.next_deadline()
        assert due is not None
        now = due
        d.due(now)
    t = d.target(EP)
    assert t is not None and t.delay_ms == 6000  # refused_mult * reconnect_max_ms
    d.dialled(EP, Outcome.OPENED, now, peer=A)  # a channel clears the refusal
    assert d.target(EP) is not None and d.target(EP).refused is None  # type: ignore[union-attr]


def test_a_wrong_node_refusal_marks_that_endpoint_only() -> None:
    d = _dialer()
    d.want(*EP, A, 0)
    d.want(*EP2, A, 0)
    d.refused(A, "identity_mismatch", "PeerIdentityMismatch", EP, wrong_node=True)
    assert [t["refused"] for t in d.targets()] == ["identity_mismatch", None]


def test_no_dials_while_linked_and_a_long_lived_link_is_redialled_at_once() -> None:
    d = _dialer()
    d.want(*EP, A, 0)
    d.due(0)
    d.dialled(EP, Outcome.FAILED, 0)
    d.due(100)
    d.linked(A)
    d.dialled(EP, Outcome.OPENED, 150, peer=A)
    assert d.next_deadline() is None
    d.want(*EP, A, 200)  # wanting it again changes nothing while linked
    assert d.next_deadline() is None
    d.unlinked(A, 60_000, 60_150)  # it lived a minute: redial now, delay reset
    assert d.next_deadline() == 60_150
    assert d.target(EP).delay_ms == 100  # type: ignore[union-attr]


def test_a_flapping_link_backs_off() -> None:
    d = _dialer()
    d.want(*EP, A, 0)
    d.due(0)
    d.linked(A)
    d.dialled(EP, Outcome.OPENED, 10, peer=A)
    d.unlinked(A, 500, 510)  # lived less than 2 * reconnect_max_ms
    assert d.next_deadline() == 610
    d.due(610)
    d.linked(A)
    d.dialled(EP, Outcome.OPENED, 620, peer=A)
    d.unlinked(A, 100, 720)
    assert d.next_deadline() == 920


def test_a_channel_that_does_not_become_the_link_backs_off() -> None:
    d = _dialer()
    d.want(*EP, None, 0)
    d.due(0)
    d.dialled(EP, Outcome.OPENED, 10, peer=A)  # closed at once: never linked
    assert d.target(EP).address == A  # type: ignore[union-attr]  # learnt from the handshake
    assert d.next_deadline() == 110


def test_a_superseded_dial_waits_for_the_handover_unless_the_link_comes() -> None:
    d = _dialer()
    d.want(*EP, A, 0)
    d.due(0)
    d.dialled(EP, Outcome.SUPERSEDED, 10)
    assert d.next_deadline() == 3010
    d.linked(A)  # the peer's better channel arrived
    assert d.next_deadline() is None


def test_forget_drops_every_endpoint_of_an_address_and_late_outcomes_are_ignored() -> None:
    d = _dialer()
    d.want(*EP, A, 0)
    d.want(*EP2, B, 0)
    d.due(0)
    assert d.forget(A) == [EP]
    d.dialled(EP, Outcome.FAILED, 5)  # the cancelled dial's outcome
    assert [t["endpoint"] for t in d.targets()] == ["10.0.0.2:7420"]


def test_same_inputs_same_outputs() -> None:
    def run(seed: int) -> list[int | None]:
        d = Dialer(ME, POLICY, random.Random(seed))
        out: list[int | None] = []
        for i in range(4):
            d.want("10.0.0.9", 7000 + i, f"hm{i}", 0)
        now = 0
        for _ in range(20):
            for ep in d.due(now):
                d.dialled(ep, Outcome.FAILED, now)
            nxt = d.next_deadline()
            out.append(nxt)
            now = nxt if nxt is not None else now + 1
        return out

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_fallback_tries_known_admitted_unlinked_peers_at_most_every_retry() -> None:
    f = Fallback(ME, retry_ms=5000)
    known = [B, A, ME, "hmC", A]
    admits = {A, B}.__contains__
    assert f.due(known, {B}, admits, 0) == [A]  # B linked, C not admitted, ME is us
    assert f.due(known, set(), admits, 4999) == [B]  # A tried 4999 ms ago
    assert f.due(known, set(), admits, 5000) == [A]


def test_path_changes_reports_new_changed_and_gone_links() -> None:
    before = {A: "direct TCP", B: "relayed via x"}
    now = {B: "punched", "hmC": "direct UDP"}
    assert path_changes(before, now) == [
        (A, "direct TCP", "none"),
        (B, "relayed via x", "punched"),
        ("hmC", "none", "direct UDP"),
    ]
    assert path_changes(now, now) == []


# -- STUN: when to ask which server -------------------------------------------


def test_stun_servers_are_all_asked_at_start_then_on_their_own_clocks() -> None:
    from hivemesh.core.dialer import StunSchedule

    sched = StunSchedule(["b:3478", "a:3478"], interval_ms=60_000, retry_ms=15_000)
    assert sched.due(0) == ["a:3478", "b:3478"]
    sched.asked("a:3478", True, 10)
    sched.asked("b:3478", False, 20)
    assert sched.due(14_000) == [] and sched.next_deadline() == 15_020
    assert sched.due(15_020) == ["b:3478"]
    sched.asked("b:3478", True, 15_020)
    assert sched.next_deadline() == 60_010 and sched.due(60_010) == ["a:3478"]
    sched.asked("c:3478", True, 0)  # not configured: ignored
    assert sched.due(10**9) == ["a:3478", "b:3478"]
    assert StunSchedule([]).next_deadline() is None


def test_how_a_dial_went_follows_from_its_error() -> None:
    from hivemesh.core.dialer import dial_outcome
    from hivemesh.errors import (
        ChannelSuperseded,
        DeadlineExceeded,
        InviteUsed,
        PeerIdentityMismatch,
        SelfConnection,
        UnknownPeer,
    )

    assert dial_outcome(SelfConnection("me")) == (Outcome.SELF, "dial_self_skipped")
    assert dial_outcome(ChannelSuperseded("x")) == (Outcome.SUPERSEDED, "dial_superseded")
    assert dial_outcome(UnknownPeer("x"))[0] is Outcome.REFUSED
    assert dial_outcome(InviteUsed("x"))[0] is Outcome.REFUSED
    assert dial_outcome(PeerIdentityMismatch("x"))[0] is Outcome.REFUSED
    assert dial_outcome(DeadlineExceeded("x")) == (Outcome.FAILED, "dial_failed_deadline_exceeded")
    assert dial_outcome(ConnectionRefusedError()) == (Outcome.FAILED, "dial_failed_dial_error")


def test_a_join_has_nowhere_left_when_every_endpoint_refused() -> None:
    from hivemesh.core.dialer import last_error, refused_everywhere

    rows = [
        {"address": "a", "refused": "unknown_peer", "last_error": None},
        {"address": "a", "refused": None, "last_error": "TimeoutError: "},
        {"address": "b", "refused": "invite_used", "last_error": "InviteUsed: used"},
    ]
    assert not refused_everywhere(rows, "a") and refused_everywhere(rows, "b")
    assert last_error(rows, "a") == "TimeoutError: " and last_error(rows, "c") is None


def test_endpoint_records_are_routed_by_transport_and_bad_ones_counted() -> None:
    got = routes(["10.0.0.1:7000", "udp:10.0.0.1:7000", "[::1]:1", "nohost", "udp:x:99999", "h:p"])
    assert got == Routes(tcp=(("10.0.0.1", 7000), ("::1", 1)), udp=(("10.0.0.1", 7000),), bad=3)
    assert routes([]) == Routes((), (), 0)


def test_parse_endpoint_refuses_what_is_not_host_and_port() -> None:
    assert parse_endpoint("[::1]:7420") == ("::1", 7420)
    for bad in ("7420", ":7420", "h:", "h:x", "h:65536", "h:-1"):
        with pytest.raises(ConfigError):
            parse_endpoint(bad)
