"""``kbatch backfill status``'s table (rich) and JSON."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.progress_bar import ProgressBar
from rich.table import Table

from consumer.jobs.records import JobStatus

__all__ = ["render_statuses", "status_json"]

_STYLE = {
    "pending": "yellow",
    "running": "cyan",
    "completed": "green",
    "failed": "red",
    "cancelled": "magenta",
}


def status_json(status: JobStatus) -> dict[str, Any]:
    """One job's status as a JSON object (``fraction`` added)."""
    return {**status.model_dump(mode="json"), "fraction": round(status.fraction, 4)}


def render_statuses(statuses: Sequence[JobStatus], console: Console) -> None:
    """A table of jobs: state, a progress bar while running, counts, members."""
    if not statuses:
        console.print("no jobs")
        return
    table = Table(title="backfill jobs")
    for name in ("job", "state", "progress", "done", "failed", "skipped", "members", "topics"):
        table.add_column(
            name,
            justify="right" if name in ("done", "failed", "skipped") else "left",
            no_wrap=name in ("job", "state", "progress"),
        )
    for s in statuses:
        progress: Any
        if s.state == "running":
            progress = ProgressBar(total=max(1, s.total_offsets), completed=s.finished_offsets,
                                   width=20)  # fmt: skip
        else:
            progress = f"{s.finished_offsets}/{s.total_offsets}"
        members = ", ".join(f"{m}:{state}" for m, state in s.members.items()) or "-"
        state = f"[{_STYLE[s.state]}]{s.state}[/]"
        if s.reason and s.state == "failed":
            state += f"\n[red]{s.reason}[/]"
        table.add_row(
            f"{s.job_id}\n{_when(s.created_at_s)}",
            state,
            progress,
            str(s.counts.done),
            str(s.counts.failed),
            str(s.counts.skipped),
            members,
            f"{s.source_topic} → {s.output_topic}",
        )
    console.print(table)


def _when(unix_s: float) -> str:
    return dt.datetime.fromtimestamp(unix_s, dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")
