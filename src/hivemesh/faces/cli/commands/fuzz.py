"""``hivemesh fuzz``: feed mutated inputs to every decoder facing the network
or the user, and count them.

``hivemesh fuzz [--budget N] [--seed S] [--target NAME ...] [--time-limit-s T] [--json]``
prints one row per target (inputs, typed errors, untyped exceptions) and
exits 1 if any input ended in an untyped exception, listing those inputs in
hex. The same seed feeds the same inputs (:mod:`hivemesh.fuzz`); no traffic
leaves the process.
"""

from __future__ import annotations

import argparse
from typing import Any

from hivemesh.client.cli import add_common, emit, emit_error
from hivemesh.errors import HivemeshError


def register(sub: Any) -> None:
    """Add the ``fuzz`` subcommand."""
    from hivemesh.fuzz import target_names

    p = sub.add_parser(
        "fuzz",
        help="fuzz every network- and user-facing decoder with a budget of inputs",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--budget", type=int, default=100_000, help="inputs in total")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--target", action="append", choices=target_names(), help="only this target (repeatable)"
    )
    p.add_argument("--time-limit-s", type=float, default=None, help="stop feeding after")
    add_common(p)
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from hivemesh.fuzz import all_targets, run_budget

    try:
        targets = all_targets(args.target)
    except HivemeshError as exc:
        return emit_error(args, exc)
    tally = run_budget(targets, args.budget, seed=args.seed, time_limit_s=args.time_limit_s)
    report = tally.to_json() | {"seed": args.seed, "budget": args.budget}

    def text(_: Any) -> str:
        lines = [tally.table(), f"seed {args.seed}, {tally.elapsed_s:.1f} s"]
        lines += [f"UNTYPED {f.target}: {f.error}\n  input {f.input_hex}" for f in tally.findings]
        return "\n".join(lines)

    emit(args, report, text)
    return 1 if tally.total_untyped else 0
