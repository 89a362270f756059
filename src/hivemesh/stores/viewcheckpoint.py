"""View checkpoints: a restart replays only the journal's tail into the views.

Theory of operation
-------------------
Rebuilding the views from the whole journal at every start costs time in
proportion to the history, and most of it is loro importing context updates
(:mod:`hivemesh.core.views.context`). A *view checkpoint* is a file beside
the store (``<store>-views``) holding the views' state and the journal
version it covers:

* ``heads``: ``(author, seq, event hash)`` of every feed the views had taken
  when the checkpoint was written;
* ``views``: each checkpointed view's state (today the context view:
  :meth:`~hivemesh.core.views.ContextView.checkpoint`); the other views are
  cheap reducers and replay the whole journal.

**Never trusted over the journal.** The file is
``MAGIC || blake2b-256(payload) || payload`` (msgpack), replaced atomically
with mode 0600 (:func:`~hivemesh.stores.private.write_private`). :func:`load`
refuses it with :class:`~hivemesh.errors.ViewCheckpointInvalid`, a reason and
no side effect, when the checksum or the format is wrong, when it was written
by another node (key), or when it is not a prefix of the store: for every
author it names, the store must hold that seq and the event stored there
must hash to the recorded value (the hash chain then vouches for everything
before it). A store restored from an older backup, a journal replaced or
rewritten, a file copied from another data dir: each fails one of these
checks. The caller logs the reason, counts it and replays everything. The
journal itself is still verified in full at every start
(:func:`~hivemesh.stores.replay.verify_causal`): a checkpoint saves view
work, never verification.

**When it is written.** The daemon writes one after rehydration when the
replayed tail was long (:data:`TAIL_EVENTS`), and at a clean stop, after the
store took every batch and every attested run settled (a run whose
signature failed may have reached the views without reaching the store:
then no checkpoint is written). A crash leaves the previous checkpoint,
which is still a prefix of the journal: the next start replays a longer
tail.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

from hivemesh.core.event import event_hash
from hivemesh.core.store import FeedStore
from hivemesh.errors import StoreError, ViewCheckpointInvalid
from hivemesh.stores.private import write_private

__all__ = [
    "FORMAT",
    "MAGIC",
    "SUFFIX",
    "TAIL_EVENTS",
    "Checkpoint",
    "checkpoint_path",
    "load",
    "save",
]

#: First bytes of a view checkpoint file.
MAGIC = b"hivemesh-views\n"
#: Version of the payload's layout.
FORMAT = 1
#: Appended to the store's file name.
SUFFIX = "-views"
#: Context events imported at rehydration past which a new checkpoint is written.
TAIL_EVENTS = 2_000
_SUM = 32


def checkpoint_path(store_path: str | os.PathLike[str]) -> Path:
    """Where the view checkpoint of the store at ``store_path`` lives."""
    return Path(f"{os.fspath(store_path)}{SUFFIX}")


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A loaded, checked checkpoint: per-author seqs it covers, views' states."""

    covered: dict[bytes, int]
    views: dict[str, Any]
    size: int


def save(
    path: str | os.PathLike[str],
    node: bytes,
    heads: dict[bytes, tuple[int, bytes]],
    views: dict[str, Any],
) -> int:
    """Write a checkpoint of ``views`` covering ``heads`` (``author -> (seq,
    event hash)``) for the node with key ``node``; returns its size in bytes."""
    payload = msgpack.packb(
        {
            "format": FORMAT,
            "node": node,
            "heads": [[a, s, h] for a, (s, h) in sorted(heads.items())],
            "views": views,
        },
        use_bin_type=True,
    )
    data = MAGIC + hashlib.blake2b(payload, digest_size=_SUM).digest() + payload
    write_private(path, data)
    return len(data)


def load(path: str | os.PathLike[str], node: bytes, store: FeedStore) -> Checkpoint | None:
    """The checkpoint at ``path`` if it belongs to node ``node`` and is a
    prefix of ``store``; ``None`` if there is none. Raises
    :class:`~hivemesh.errors.ViewCheckpointInvalid` saying why it cannot be
    used (see the module docs)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ViewCheckpointInvalid(f"unreadable: {exc}") from None
    start = len(MAGIC) + _SUM
    if not data.startswith(MAGIC) or len(data) < start:
        raise ViewCheckpointInvalid("not a view checkpoint (magic)", "format")
    payload = data[start:]
    if hashlib.blake2b(payload, digest_size=_SUM).digest() != data[len(MAGIC) : start]:
        raise ViewCheckpointInvalid("checksum mismatch (torn or altered)", "checksum")
    try:
        doc = msgpack.unpackb(payload, raw=False, strict_map_key=False)
        fmt, owner, heads, views = doc["format"], doc["node"], doc["heads"], doc["views"]
        covered = {bytes(a): int(s) for a, s, _h in heads}
        hashes = {bytes(a): bytes(h) for a, _s, h in heads}
    except Exception as exc:  # msgpack raises many types; the checksum passed
        raise ViewCheckpointInvalid(f"malformed payload: {exc}", "format") from None
    if fmt != FORMAT or not isinstance(views, dict):
        raise ViewCheckpointInvalid(f"format {fmt!r}, expected {FORMAT}", "format")
    if owner != node:
        raise ViewCheckpointInvalid("written by another node", "node")
    for author in sorted(covered):
        seq = covered[author]
        if seq < 1:
            raise ViewCheckpointInvalid("covers an empty feed", "journal")
        try:
            raws = store.read_range(author, seq, seq)
        except StoreError as exc:
            raise ViewCheckpointInvalid(f"store read failed: {exc}", "store") from None
        if len(raws) != 1:
            raise ViewCheckpointInvalid(
                f"the journal lacks an event it covers (seq {seq})", "journal"
            )
        if event_hash(raws[0]) != hashes[author]:
            raise ViewCheckpointInvalid(f"the journal holds another event at seq {seq}", "journal")
    return Checkpoint(covered=covered, views=views, size=len(data))
