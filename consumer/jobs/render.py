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
    """One block per job: its id, state, a progress bar while running (and always the finished
    offsets), then its counts, topics, members and creation time on lines of their own.

    Blocks, not one wide table: a table of eight columns did not fit 80 columns (rich cut the
    counts to ``3…``) and lost its headers when piped (a new-user trial). Every line here is
    short, so nothing is cut at any width.
    """
    if not statuses:
        console.print("no jobs")
        return
    for i, s in enumerate(statuses):
        if i:
            console.print()
        head = Table.grid(padding=(0, 1))
        state = f"[{_STYLE[s.state]}]{s.state}[/]"
        fraction = f"{s.finished_offsets}/{s.total_offsets} ({100.0 * s.fraction:.1f} %)"
        if s.state == "running":
            bar = ProgressBar(total=max(1, s.total_offsets), completed=s.finished_offsets,
                              width=20)  # fmt: skip
            head.add_row(f"[bold]{s.job_id}[/]", state, bar, fraction)
        else:
            head.add_row(f"[bold]{s.job_id}[/]", state, fraction)
        console.print(head)
        if s.reason and s.state == "failed":
            console.print(f"  [red]{s.reason}[/]", soft_wrap=True)
        c = s.counts
        console.print(f"  done {c.done} · failed {c.failed} · skipped {c.skipped}")
        console.print(f"  {s.source_topic} → {s.output_topic}", soft_wrap=True)
        members = ", ".join(f"{m} {m_state}" for m, m_state in s.members.items()) or "none yet"
        console.print(f"  members: {members}", soft_wrap=True)
        console.print(f"  created {_when(s.created_at_s)}")


def _when(unix_s: float) -> str:
    return dt.datetime.fromtimestamp(unix_s, dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")
