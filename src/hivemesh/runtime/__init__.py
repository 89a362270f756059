"""hivemesh.runtime: the asyncio node daemon around the sans-IO core.

Modules
-------
* :mod:`~hivemesh.runtime.daemon` -- :class:`Daemon`: wiring, lifecycle
  and the pump (inputs in, effects carried out, group commit, one timer at
  the Peer's deadline) around the sans-IO :class:`~hivemesh.core.peer.Peer`,
  which decides.
* :mod:`~hivemesh.runtime.connections` -- one secure channel per peer: dial
  (when: :mod:`hivemesh.core.dialer`), accept, resolve simultaneous dials, bounded
  send queues with backpressure and counted drops.
* :mod:`~hivemesh.runtime.messaging` -- direct messages, the durable inbox,
  ping.
* :mod:`~hivemesh.runtime.invites` -- invite tokens and ``trust.json`` for
  the Peer's probation and joins (:mod:`hivemesh.core.joins`).
* :mod:`~hivemesh.runtime.leases` -- the lease voter's log on disk
  (:mod:`hivemesh.stores.voterlog`) and the quorum as a lease backend (the
  voter and proposer are the Peer's: :mod:`hivemesh.core.lease_swarm`).
* :mod:`~hivemesh.runtime.control` -- the JSON-lines control socket (its
  clients, the CLI's plumbing and local swarms of node processes are not
  the daemon's: :mod:`hivemesh.client`).
* :mod:`~hivemesh.runtime.status` -- what ``status`` and ``peers`` report.

Data dir layout
---------------
================  ===========================================================
node.key          Ed25519 identity (0600; :mod:`hivemesh.stores.keyfile`)
feed.mark         how far our own feed went (:mod:`hivemesh.stores.feedmark`)
store.db          the journal and blobs (SQLite WAL; :mod:`hivemesh.stores`)
store.db-appends  our own batches not yet committed to store.db (append log)
inbox.db          received direct messages (SQLite WAL)
trust.json        trusted and revoked addresses, invites (0600; :mod:`hivemesh.trust`)
config.toml       optional configuration (:mod:`hivemesh.config`)
ctl.sock          the control socket (0600), present while the daemon runs
daemon.lock       held (flock) by the running daemon: one daemon per data dir
================  ===========================================================

The data dir is 0700 and every file in it 0600, whatever the umask (also
the SQLite ``-wal``/``-shm`` files, the telemetry spool, lease state and the
collector's store); looser modes found at start are fixed and logged as a
warning (:mod:`hivemesh.stores.private`).
"""
