"""The link rule (hivemesh.core.links): which channel becomes a peer's link.

Pure and table-driven: each row is (the open link, the newcomer) -> verdict.
"""

from __future__ import annotations

import pytest

from hivemesh.core.links import (
    MAX_LIVES,
    Adoption,
    Handover,
    Held,
    Link,
    Lives,
    New,
    Old,
    Rank,
    State,
    Verdict,
    channel_rank,
)

PEER = "peer-address"
OLD, NEW, NEWER = b"\x01" * 16, b"\x02" * 16, b"\x03" * 16
BEST, WORSE = (0, b"\x10"), (1, b"\x00")


def test_no_link_adopts_any_life() -> None:
    lives = Lives()
    assert lives.judge(PEER, OLD, WORSE, None) is Verdict.ADOPT
    assert lives.lives(PEER) == (OLD,)


@pytest.mark.parametrize(
    ("link_rank", "new_rank", "verdict"),
    [
        (WORSE, BEST, Verdict.SWITCH),
        (BEST, WORSE, Verdict.KEEP),
        (BEST, (0, b"\xff"), Verdict.KEEP),
    ],
)
def test_the_same_boot_id_twice_is_a_dial_race_decided_by_rank(
    link_rank: tuple[int, bytes], new_rank: tuple[int, bytes], verdict: Verdict
) -> None:
    lives = Lives()
    lives.judge(PEER, OLD, link_rank, None)
    assert lives.judge(PEER, OLD, new_rank, Link(OLD, link_rank)) is verdict
    assert lives.lives(PEER) == (OLD,)


@pytest.mark.parametrize("new_rank", [BEST, WORSE])
def test_a_new_boot_id_replaces_the_link_whatever_its_rank(new_rank: tuple[int, bytes]) -> None:
    lives = Lives()
    lives.judge(PEER, OLD, BEST, None)
    assert lives.judge(PEER, NEW, new_rank, Link(OLD, BEST)) is Verdict.RESTART
    assert lives.lives(PEER) == (OLD, NEW)


def test_an_old_boot_id_after_a_newer_one_is_refused_and_never_replaces_it() -> None:
    lives = Lives()
    lives.judge(PEER, OLD, BEST, None)
    assert lives.judge(PEER, NEW, WORSE, Link(OLD, BEST)) is Verdict.RESTART
    # a dial of the old life, delayed past the restart, even with the best rank
    for rank in (BEST, (0, b""), WORSE):
        assert lives.judge(PEER, OLD, rank, Link(NEW, WORSE)) is Verdict.STALE
    assert lives.lives(PEER) == (OLD, NEW)  # the order is kept
    # and a third life replaces the second
    assert lives.judge(PEER, NEWER, WORSE, Link(NEW, WORSE)) is Verdict.RESTART
    assert lives.judge(PEER, NEW, BEST, Link(NEWER, WORSE)) is Verdict.STALE


def test_a_later_life_replaces_an_earlier_one_adopted_while_no_link_was_up() -> None:
    """With no link up any life is adopted (never a lock-out); a later life
    then still replaces it, since the order is the order first seen."""
    lives = Lives()
    lives.judge(PEER, OLD, BEST, None)
    lives.judge(PEER, NEW, BEST, Link(OLD, BEST))
    assert lives.judge(PEER, OLD, BEST, None) is Verdict.ADOPT  # the link had ended
    assert lives.judge(PEER, NEW, WORSE, Link(OLD, BEST)) is Verdict.RESTART


def test_a_never_seen_life_is_taken_as_the_newest() -> None:
    """The documented limit: a delayed dial from a life never seen counts as new."""
    lives = Lives()
    lives.judge(PEER, NEW, BEST, None)
    assert lives.judge(PEER, OLD, WORSE, Link(NEW, BEST)) is Verdict.RESTART
    assert lives.judge(PEER, NEW, BEST, Link(OLD, WORSE)) is Verdict.STALE


def test_peers_are_independent_and_memory_is_bounded() -> None:
    lives = Lives(max_peers=3)
    for i in range(10):
        lives.judge(f"p{i}", OLD, BEST, None)
    assert len(lives) == 3
    assert lives.lives("p0") == () and lives.lives("p9") == (OLD,)
    # a peer whose link's life was forgotten: any other life is newer
    assert lives.judge("p0", NEW, WORSE, Link(OLD, BEST)) is Verdict.RESTART
    many = Lives()
    boots = [bytes([i]) * 16 for i in range(MAX_LIVES + 4)]
    for boot in boots:
        many.judge(PEER, boot, BEST, None)
    assert many.lives(PEER) == tuple(boots[-MAX_LIVES:])
    many.forget(PEER)
    assert many.lives(PEER) == ()


def test_channel_rank_prefers_the_smaller_dialler_then_the_handshake_hash() -> None:
    small, big = "a" * 8, "b" * 8
    by_small = channel_rank(small, big, small, b"\xff")
    by_big = channel_rank(big, small, big, b"\x00")
    assert by_small < by_big
    assert channel_rank(small, big, small, b"\x01") == channel_rank(big, small, small, b"\x01")


# -- adoption: the plan the driver carries out (module docs' second table) ----

OPEN_OLD = Link(OLD, BEST)


def _lives_with(boot_id: bytes = OLD) -> Lives:
    lives = Lives()
    lives.judge(PEER, boot_id, BEST, None)
    return lives


@pytest.mark.parametrize(
    ("link", "boot_id", "rank", "plan"),
    [
        (None, OLD, WORSE, Adoption(Verdict.ADOPT, New.LINK, up=True)),
        (
            OPEN_OLD,
            OLD,
            WORSE,
            Adoption(Verdict.KEEP, New.RETIRE, counters=("duplicate_channel_closed",)),
        ),
        (
            Link(OLD, WORSE),
            OLD,
            BEST,
            Adoption(Verdict.SWITCH, New.LINK, Old.RETIRE, counters=("channel_replaced",)),
        ),
        (
            OPEN_OLD,
            NEW,
            WORSE,
            Adoption(
                Verdict.RESTART,
                New.LINK,
                Old.RESTARTED,
                down=True,
                up=True,
                counters=("peer_restarted",),
            ),
        ),
        (
            Link(OLD, BEST, State.ENDED),
            NEW,
            WORSE,
            Adoption(
                Verdict.ADOPT,
                New.LINK,
                Old.RESTARTED,
                down=True,
                up=True,
                counters=("peer_restarted",),
            ),
        ),
        (
            Link(OLD, BEST, State.SUPERSEDED),
            OLD,
            WORSE,
            Adoption(Verdict.ADOPT, New.LINK, Old.HANDED_OVER, counters=("handover_completed",)),
        ),
        (
            Link(OLD, BEST, State.ENDED),
            OLD,
            WORSE,
            Adoption(Verdict.ADOPT, New.LINK, Old.ENDED, down=True, up=True),
        ),
    ],
)
def test_the_adoption_table(link: Link | None, boot_id: bytes, rank: Rank, plan: Adoption) -> None:
    assert _lives_with().adopt(PEER, boot_id, rank, link) == plan


def test_a_stale_newcomer_is_refused_and_the_link_stays() -> None:
    lives = _lives_with()
    lives.judge(PEER, NEW, BEST, Link(OLD, BEST))
    plan = lives.adopt(PEER, OLD, BEST, Link(NEW, WORSE))
    assert plan == Adoption(Verdict.STALE, New.REFUSE, counters=("stale_boot_refused",))


def test_a_newcomer_the_peer_already_retired_only_drains_and_is_not_judged() -> None:
    lives = Lives()
    plan = lives.adopt(PEER, OLD, BEST, None, sending=False)
    assert plan == Adoption(None, New.DRAIN, counters=("channel_ended_before_adopt",))
    assert lives.lives(PEER) == ()


def test_a_handover_moves_its_frames_to_the_winner_of_the_same_life() -> None:
    plan = _lives_with().adopt(PEER, OLD, WORSE, None, handover=OLD)
    assert (plan.new, plan.held, plan.down, plan.up) == (New.LINK, Held.MOVE, False, False)
    assert plan.counters == ("handover_completed",)


def test_a_handover_ended_by_a_new_life_drops_its_frames_and_reports_down_up() -> None:
    plan = _lives_with().adopt(PEER, NEW, WORSE, None, handover=OLD)
    assert (plan.new, plan.held, plan.down, plan.up) == (New.LINK, Held.DROP, True, True)
    assert plan.counters == ("peer_restarted",)


def test_a_handover_holds_frames_within_its_bounds() -> None:
    held = Handover(max_frames=2, max_bytes=5, boot_id=OLD, opened_mono=0.0)
    assert held.hold(b"abc") and not held.hold(b"abc") and held.hold(b"ab")
    assert not held.hold(b"")  # two frames already
    assert list(held.frames) == [b"abc", b"ab"] and held.nbytes == 5


def test_a_channels_path_in_words() -> None:
    from hivemesh.core.links import path_words

    relay = "hm" + "a" * 56
    assert path_words("tcp") == "direct TCP" and path_words("udp") == "direct UDP"
    assert path_words(f"relay:{relay}") == "relayed via hmaaaaaaaaaa"
    assert path_words("punched") == "punched"  # a path it has no words for: as given
