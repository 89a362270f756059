"""The durable inbox (hivemesh.stores.inbox): blocking SQLite, no event loop."""

from __future__ import annotations

import os
import pathlib
import stat

import pytest

from hivemesh.core.direct import InboxMessage
from hivemesh.errors import StoreError
from hivemesh.stores.inbox import Inbox


def _msg(n: int, sender: str = "a") -> InboxMessage:
    return InboxMessage(sender, f"m{n}", {"n": n}, 1000 + n, "relay" if n % 2 else None)


def test_messages_are_kept_once_oldest_first_and_taken_out(tmp_path: pathlib.Path) -> None:
    removed: list[int] = []
    inbox = Inbox(tmp_path / "inbox.db", on_removed=lambda: removed.append(1))
    assert inbox.count() == 0 and inbox.list(10, remove=True) == [] and removed == []
    assert not (tmp_path / "inbox.db").exists()  # made when the first message is stored
    assert inbox.add([_msg(1), _msg(2)]) == 2
    assert stat.S_IMODE(os.stat(tmp_path / "inbox.db").st_mode) == 0o600
    inbox.add([_msg(2), _msg(3)])  # a retransmission of m2: stored once
    assert inbox.count() == 3
    first = inbox.list(2, remove=True)
    assert [(m["msg_id"], m["data"], m["relayed_by"]) for m in first] == [
        ("m1", {"n": 1}, "relay"),
        ("m2", {"n": 2}, None),
    ]
    assert removed == [1] and inbox.count() == 1
    inbox.close()
    reopened = Inbox(tmp_path / "inbox.db")  # it survives a restart
    assert [m["msg_id"] for m in reopened.list(10)] == ["m3"]
    reopened.close()


def test_a_failed_commit_stores_nothing_and_says_so(tmp_path: pathlib.Path) -> None:
    inbox = Inbox(tmp_path / "inbox.db")
    inbox.db.execute(  # the second insert fails, as on a full disk
        "CREATE TRIGGER full BEFORE INSERT ON inbox WHEN NEW.msg_id = 'm2'"
        " BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END"
    )
    with pytest.raises(StoreError, match="inbox write failed"):
        inbox.add([_msg(1), _msg(2)])
    assert inbox.count() == 0
    with pytest.raises(ValueError, match="cannot encode"):  # a bug: no transaction left open
        inbox.add([_msg(3), InboxMessage("a", "bad", object(), 0, None)])
    assert inbox.add([_msg(3)]) == 1
    inbox.close()
    nowhere = Inbox(tmp_path / "missing-dir" / "inbox.db")  # made at the first message:
    assert nowhere.count() == 0
    with pytest.raises(StoreError, match="cannot open the inbox"):  # which is not stored
        nowhere.add([_msg(1)])
    nowhere.close()
    (tmp_path / "bad.db").write_bytes(b"not a database" * 100)
    with pytest.raises(StoreError, match="cannot open the inbox"):  # one there is opened at once
        Inbox(tmp_path / "bad.db")
