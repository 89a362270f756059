"""The sans-IO, deterministic heart of hivemesh.

Nothing in this package opens sockets, starts threads, reads the clock or draws
global randomness: time (``now_ms``), randomness (a ``random.Random``) and
storage (a :class:`~hivemesh.core.store.FeedStore`) are passed in. That is what
lets :mod:`hivemesh.sim` replay any fault schedule exactly from a seed.
"""
