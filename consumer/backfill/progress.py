"""How far a backfill is: a rich progress bar (a terminal) or a periodic log line (anything
else), and the final summary table.

One bar per job: records finished of the records in the range, records/s (rich's speed
estimate over the last 30 s) and the ETA. Everything is written to stderr; stdout is left for
``--json``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from consumer.backfill.summary import BackfillSummary

__all__ = ["LogProgress", "NullProgress", "ProgressSink", "RichProgress", "render_summary"]

log = logging.getLogger("kbatch.backfill")


class ProgressSink(Protocol):
    """What the job reports progress to (records, not offsets)."""

    def begin(self, total_records: int, description: str) -> None:
        """The job starts with ``total_records`` to finish (an upper bound: compaction)."""

    def advance(self, n_records: int) -> None:
        """``n_records`` more finished (acknowledged by the broker)."""

    def end(self) -> None:
        """The job stopped (finished or not)."""


class NullProgress:
    """Reports nothing."""

    def begin(self, total_records: int, description: str) -> None:
        """Nothing."""

    def advance(self, n_records: int) -> None:
        """Nothing."""

    def end(self) -> None:
        """Nothing."""


class _RateColumn(ProgressColumn):
    """``1234.5 rec/s`` from rich's speed estimate."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text("-- rec/s" if speed is None else f"{speed:,.1f} rec/s", style="cyan")


class RichProgress:
    """A rich progress bar on stderr (refreshed 4 times a second from rich's own thread)."""

    def __init__(self, console: Console | None = None) -> None:
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            _RateColumn(),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=console or Console(stderr=True),
            refresh_per_second=4,
        )
        self._task: TaskID | None = None

    def begin(self, total_records: int, description: str) -> None:
        """Show the bar."""
        self._progress.start()
        self._task = self._progress.add_task(description, total=total_records)

    def advance(self, n_records: int) -> None:
        """Move the bar."""
        if self._task is not None:
            self._progress.advance(self._task, n_records)

    def end(self) -> None:
        """Draw the last state and release the terminal."""
        self._progress.stop()


class LogProgress:
    """A log line every ``interval_s`` seconds: done/total, records/s since start, ETA.

    Args:
        interval_s: seconds between lines.
        clock: monotonic seconds.
    """

    def __init__(
        self, interval_s: float = 10.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._interval_s = interval_s
        self._clock = clock
        self._total = 0
        self._done = 0
        self._t0 = 0.0
        self._next = 0.0
        self._description = ""

    def begin(self, total_records: int, description: str) -> None:
        """Start counting."""
        self._total, self._description = total_records, description
        self._t0 = self._clock()
        self._next = self._t0 + self._interval_s

    def advance(self, n_records: int) -> None:
        """Count; log when the interval has passed."""
        self._done += n_records
        now = self._clock()
        if now >= self._next:
            self._next = now + self._interval_s
            self._log(now)

    def end(self) -> None:
        """Log the last state."""
        self._log(self._clock())

    def _log(self, now: float) -> None:
        elapsed_s = max(now - self._t0, 1e-9)
        rate = self._done / elapsed_s
        left = max(0, self._total - self._done)
        eta = f"{left / rate:.0f} s" if rate > 0 else "?"
        log.info(
            "%s: %d/%d records, %.1f records/s, ETA %s",
            self._description,
            self._done,
            self._total,
            rate,
            eta,
        )


def render_summary(summary: BackfillSummary, console: Console | None = None) -> None:
    """Print the final summary: totals, throughput, and one row per partition."""
    console = console or Console(stderr=True)
    state = "[green]complete" if summary.complete else "[red]incomplete"
    table = Table(title=f"kbatch backfill {summary.source_topic} → {summary.output_topic}: {state}")
    table.add_column("partition", justify="right")
    table.add_column("range", justify="right")
    table.add_column("resumed from", justify="right")
    table.add_column("read", justify="right")
    table.add_column("reached end")
    for p in summary.partitions:
        table.add_row(
            str(p.partition),
            f"[{p.range_start}, {p.end})",
            "-" if p.resumed_from is None else str(p.resumed_from),
            str(p.records_read),
            "yes" if p.reached_end else "[red]no",
        )
    console.print(table)
    console.print(
        f"records {summary.records_read} read, {summary.ok} ok, {summary.error_replies} error "
        f"replies, {summary.dead_lettered} dead-lettered, {summary.undelivered} undelivered, "
        f"{summary.skipped_completed} skipped (written by an earlier run); "
        f"{summary.elapsed_s:.1f} s, {summary.records_per_s:,.1f} records/s "
        f"({summary.batches} batches of {summary.mean_batch_size} on average, padding "
        f"efficiency {summary.padding_efficiency:.3f}; group {summary.group_id})"
    )
