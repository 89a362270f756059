"""``python -m hivemesh.netlab cleanup``: remove the namespaces of labs whose
owner process has ended (after a crash); ``list``: show every lab namespace."""

from __future__ import annotations

import sys

from hivemesh.netlab._run import unavailable_reason
from hivemesh.netlab.cleanup import cleanup_stale, lab_namespaces


def main(argv: list[str]) -> int:
    """Run the ``cleanup`` or ``list`` subcommand; return the exit status."""
    if argv not in (["cleanup"], ["list"]):
        print("usage: python -m hivemesh.netlab {cleanup|list}", file=sys.stderr)
        return 2
    reason = unavailable_reason()
    if reason is not None:
        print(f"netlab unavailable: {reason}", file=sys.stderr)
        return 1
    if argv == ["list"]:
        for name in lab_namespaces():
            print(name)
        return 0
    gone = cleanup_stale()
    print(f"removed {len(gone)} stale lab namespace(s)")
    for name in gone:
        print(f"  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
