"""Deterministic cluster simulator over the sans-IO core.

One seed decides every delay, loss, duplication, reordering, partition,
crash, restart and clock skew; the same seed replays the same run exactly
(see :func:`hivemesh.sim.cluster.run_seed`).
"""
