"""Broker mode: the same swarm over NATS JetStream or Redis Streams.

The broker carries bytes; integrity stays end to end. Parts:

* :mod:`hivemesh.mesh.engine` -- the broker interface and ``--mesh`` URLs;
* :mod:`hivemesh.mesh.nats_engine`, :mod:`hivemesh.mesh.redis_engine` -- its engines;
* :mod:`hivemesh.mesh.envelope` -- signed node-to-node envelopes (sans-IO);
* :mod:`hivemesh.mesh.links` -- the connection manager's interface over a broker;
* :mod:`hivemesh.mesh.feedlog` -- the journal's push half on the broker's log.

See docs/broker.md.
"""

from hivemesh.mesh.engine import BrokerEngine as BrokerEngine
from hivemesh.mesh.engine import MeshOptions as MeshOptions
from hivemesh.mesh.engine import parse_mesh_url as parse_mesh_url
from hivemesh.mesh.feedlog import FeedLog as FeedLog
from hivemesh.mesh.links import BrokerLinks as BrokerLinks

__all__ = [
    "BrokerEngine",
    "BrokerLinks",
    "FeedLog",
    "MeshOptions",
    "open_engine",
    "parse_mesh_url",
]


def open_engine(options: MeshOptions) -> BrokerEngine:
    """The engine for ``options.engine`` (imports its client library only then)."""
    from hivemesh.extras import missing

    try:
        if options.engine == "redis":
            from hivemesh.mesh.redis_engine import RedisEngine

            return RedisEngine(options)
        from hivemesh.mesh.nats_engine import NatsEngine

        return NatsEngine(options)
    except ModuleNotFoundError as exc:
        raise missing(exc, f"broker mode on {options.engine}") from None
