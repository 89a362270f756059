"""``hivemesh bench cli``: wall time of ``hivemesh status`` against a running daemon.

One node process is started (``hivemesh up``); then ``python -m hivemesh
status --data-dir D`` and the baseline ``python -c pass`` (the same
interpreter, the same environment) are run ``--runs`` times each,
interleaved, so a busy machine slows both alike. Reported: the median wall
time of each, their ratio, the CLI's own cost (status minus the bare
interpreter), and the same for the CPU time of the process (user + system),
which a loaded machine inflates less than wall time. The goal is a
``status`` within 100 ms of wall time. A last ``status`` under ``python -X
importtime`` tells where the time goes: the import time of hivemesh's own
modules and of the rest beyond the bare interpreter's.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import hivemesh
from hivemesh.bench import BenchResult, Metric
from hivemesh.client.swarm import LocalSwarm

DESCRIPTION = "wall time of `hivemesh status` against a running daemon vs `python -c pass`"

#: The goal: a CLI command that talks to the daemon returns within this.
GOAL_MS = 100.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options for this benchmark."""
    parser.add_argument("--runs", type=int, default=15, help="runs of each command (default 15)")
    parser.add_argument(
        "--max-s", type=float, default=120.0, help="stop measuring after this long (default 120)"
    )


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _wall_ms(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU time (ms) of one run of ``argv`` (one child at a time)."""
    cpu0, t0 = _cpu_s(), time.perf_counter()
    out = subprocess.run(argv, env=env, capture_output=True, timeout=60)
    ms = (time.perf_counter() - t0) * 1000
    if out.returncode != 0:
        raise RuntimeError(f"{argv[1:]} exited {out.returncode}: {out.stderr[-500:]!r}")
    return ms, (_cpu_s() - cpu0) * 1000


def _import_ms(argv: list[str], env: dict[str, str]) -> dict[str, float]:
    """Self import times (ms) under ``-X importtime``: hivemesh's and the rest."""
    out = subprocess.run(
        [argv[0], "-X", "importtime", *argv[1:]], env=env, capture_output=True, text=True
    )
    totals = {"hivemesh": 0.0, "other": 0.0}
    for line in out.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, _cum, name = line[len("import time:") :].split("|")
        key = "hivemesh" if name.strip().startswith("hivemesh") else "other"
        totals[key] += int(self_us) / 1000
    return totals


def run(args: argparse.Namespace) -> BenchResult:
    """Run the benchmark."""
    with tempfile.TemporaryDirectory(prefix="hm-bench-cli-") as root, LocalSwarm(root) as swarm:
        node = swarm.start("a")
        env = dict(swarm.env)
        env["PYTHONPATH"] = str(Path(hivemesh.__file__).resolve().parent.parent)
        status = [sys.executable, "-m", "hivemesh", "status", "--data-dir", str(node.data_dir)]
        bare = [sys.executable, "-c", "pass"]
        ours: list[float] = []
        base: list[float] = []
        ours_cpu: list[float] = []
        base_cpu: list[float] = []
        deadline = time.monotonic() + args.max_s
        _wall_ms(status, env)  # warm the file cache and the bytecode
        while len(ours) < args.runs and time.monotonic() < deadline:
            for argv, wall, cpu in ((bare, base, base_cpu), (status, ours, ours_cpu)):
                ms, cpu_ms = _wall_ms(argv, env)
                wall.append(ms)
                cpu.append(cpu_ms)
        imports = _import_ms(status, env)
        bare_imports = _import_ms(bare, env)
    status_ms, pass_ms = statistics.median(ours), statistics.median(base)
    result = BenchResult("cli")
    result.metrics.append(
        Metric(
            "hivemesh status wall time (median)",
            status_ms,
            pass_ms,
            "ms",
            baseline_name="python -c pass",
            higher_is_better=False,
            goal=f"<= {GOAL_MS:.0f} ms",
            goal_met=status_ms <= GOAL_MS,
        )
    )
    result.metrics.append(
        Metric(
            "hivemesh status CPU time (median)",
            statistics.median(ours_cpu),
            statistics.median(base_cpu),
            "ms",
            baseline_name="python -c pass",
            higher_is_better=False,
        )
    )
    result.details.update(
        runs=len(ours),
        status_ms_min=round(min(ours), 1),
        status_ms_max=round(max(ours), 1),
        pass_ms_min=round(min(base), 1),
        cli_cost_ms=round(status_ms - pass_ms, 1),
        hivemesh_import_ms=round(imports["hivemesh"], 1),
        other_import_ms_beyond_bare=round(imports["other"] - bare_imports["other"], 1),
        load_average=[round(x, 2) for x in os.getloadavg()],
    )
    return result
