"""hivemesh.transports: secure channels between nodes.

* :mod:`~hivemesh.transports.noise` -- sans-IO Noise XX handshake with
  Ed25519-bound static keys.
* :mod:`~hivemesh.transports.session` -- sans-IO encrypted records carrying
  length-prefixed frames.
* :mod:`~hivemesh.transports.stream_handshake` -- sans-IO handshake over a
  byte stream (framing, refusals, ACCEPT).
* :mod:`~hivemesh.transports.channel` / :mod:`~hivemesh.transports.tcp` --
  the asyncio TCP driver: :func:`connect`, :func:`serve`.
* sans-IO rules of the UDP paths: :mod:`~hivemesh.transports.quic_routes`,
  :mod:`~hivemesh.transports.quic_link`, :mod:`~hivemesh.transports.relay_policy`,
  :mod:`~hivemesh.transports.relay_circuits`, :mod:`~hivemesh.transports.punch`;
  their asyncio drivers: ``quic``, ``relay``, ``traversal``.
"""

from hivemesh.transports.channel import SecureChannel as SecureChannel
from hivemesh.transports.session import ChannelOptions as ChannelOptions
from hivemesh.transports.stats import ChannelStatistics as ChannelStatistics
from hivemesh.transports.stats import TransportCounters as TransportCounters
from hivemesh.transports.tcp import Listener as Listener
from hivemesh.transports.tcp import connect as connect
from hivemesh.transports.tcp import serve as serve

__all__ = [
    "ChannelOptions",
    "ChannelStatistics",
    "Listener",
    "SecureChannel",
    "TransportCounters",
    "connect",
    "serve",
]
