"""The audit demo's live display: rich progress bars per batch, then a summary.

:class:`AuditConsole` is what ``hivemesh demo`` shows: one bar per published
batch (shops done of its size), a line per notable event (the operator's
answers, the killed executor), and at the end the report's path, a summary
table and the telemetry summary the metrics collector returned.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from hivemesh.audit.demo import AuditRun

__all__ = ["AuditConsole"]


class AuditConsole:
    """Live progress and the final summary (see the module docs)."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console()
        self.bars = Progress(
            TextColumn("{task.description:<12}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[note]}"),
            TimeElapsedColumn(),
            console=self.console,
        )
        self._tasks: dict[str, Any] = {}
        self._all: Any = None

    def __enter__(self) -> AuditConsole:
        self.bars.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.bars.stop()

    def say(self, line: str) -> None:
        """One narrated event."""
        self.bars.console.print(f"[dim]·[/dim] {line}")

    def progress(self, p: dict[str, Any]) -> None:
        """Update the bars from the driver's progress record."""
        if self._all is None:
            self._all = self.bars.add_task("all shops", total=p["shops"], note="")
        note = f"{p['calls']} tool calls, {p['takeovers']} takeovers"
        self.bars.update(self._all, completed=p["done"], note=note)
        for n, (done, total) in sorted(p["batches"].items(), key=lambda kv: int(kv[0])):
            task = self._tasks.get(n)
            if task is None:
                task = self._tasks[n] = self.bars.add_task(
                    f"batch {int(n) + 1}", total=total, note=""
                )
            self.bars.update(task, completed=done)

    def summary(self, run: AuditRun) -> None:
        """The report's path, the summary table and the telemetry summary."""
        c = self.console
        if run.error:
            c.print(f"[red]the audit failed:[/red] {run.error}")
        s = run.summary
        if s:
            took = f"{run.audit_seconds:.1f} s ({run.seconds:.1f} s with start-up)"
            t = Table(title=f"audit {s['audit']}: {took}")
            t.add_column("what")
            t.add_column("value", justify="right")
            rows = [
                ("shops audited", f"{s['shops_done']}/{s['shops']}"),
                ("products", str(s["products"])),
                (
                    "prices equal to the ground truth",
                    "all" if not s["mismatches"] else f"{s['mismatches']} wrong",
                ),
                ("tool calls", str(s["tool_calls"])),
                ("errors", ", ".join(f"{k} {v}" for k, v in s["errors"].items()) or "none"),
                (
                    "corrections",
                    ", ".join(f"{k} {v}" for k, v in s["corrections"].items()) or "none",
                ),
                ("escalations (answered)", str(s["escalations"])),
                ("takeovers", str(s["takeovers"])),
            ]
            if run.killed:
                rows.append(("killed", f"{run.killed['executor']} during {run.killed['shop']}"))
            for row in rows:
                t.add_row(*row)
            c.print(t)
        tel = run.telemetry
        if isinstance(tel, dict) and tel.get("rows"):
            tt = Table(title="telemetry (metrics-collector): tools")
            cols = ["tool", "records", "failures", "p50_ms", "p99_ms"]
            for col in cols:
                tt.add_column(col, justify="left" if col == "tool" else "right")
            idx = [tel["columns"].index(col) for col in cols]
            for row in tel["rows"]:
                tt.add_row(*(str(row[i]) for i in idx))
            c.print(tt)
        if run.report_paths:
            c.print(f"report: {run.report_paths['markdown']} (+ .csv, .json)")
        c.print(
            "[green]audit complete: every price checked[/green]"
            if run.ok
            else "[red]audit FAILED[/red]"
        )
