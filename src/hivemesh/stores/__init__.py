"""Durable edges of a node: the SQLite journal store, verified replay, key file.

* :class:`SQLiteStore` -- the default :class:`~hivemesh.core.store.FeedStore`
  (one WAL-mode SQLite file per node).
* :func:`rehydrate` / :func:`verify_feeds` / :func:`verify_batches` -- replay a
  store with every hash chain and signature re-checked; :func:`verify_causal`
  the same in causal order (what a node's start-up replays).
* :func:`load_or_create_identity` -- the node's Ed25519 key file (mode 0600).
* :mod:`~hivemesh.stores.voterlog` -- the quorum lease voter's durable state,
  a preallocated record log synced with ``fdatasync``.
"""

from hivemesh.stores.keyfile import load_identity as load_identity
from hivemesh.stores.keyfile import load_or_create_identity as load_or_create_identity
from hivemesh.stores.replay import ReplayStats as ReplayStats
from hivemesh.stores.replay import rehydrate as rehydrate
from hivemesh.stores.replay import verify_batches as verify_batches
from hivemesh.stores.replay import verify_causal as verify_causal
from hivemesh.stores.replay import verify_feeds as verify_feeds
from hivemesh.stores.sqlite import SQLiteStore as SQLiteStore

__all__ = [
    "ReplayStats",
    "SQLiteStore",
    "load_identity",
    "load_or_create_identity",
    "rehydrate",
    "verify_batches",
    "verify_causal",
    "verify_feeds",
]
