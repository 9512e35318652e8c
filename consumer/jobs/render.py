"""``kbatch backfill status``'s table (rich) and JSON."""

from __future__ import annotations

import datetime as dt
import functools
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
    """One job's status as a JSON object, with ``processed`` (records), ``fraction`` (the
    headline: :attr:`JobStatus.progress`) and ``committed_fraction`` (where a restart
    resumes: :attr:`JobStatus.fraction`) added."""
    return {
        **status.model_dump(mode="json"),
        "processed": status.processed,
        "fraction": round(status.progress, 4),
        "committed_fraction": round(status.fraction, 4),
    }


def render_statuses(statuses: Sequence[JobStatus], console: Console) -> None:
    """One block per job: its id on a line of its own, its state and records processed of the
    range (with a progress bar while running, on a terminal; a completed job: the whole range),
    then its counts, committed offsets (until completed), topics, members and creation time on
    lines of their own; no number highlighting.

    The headline counts records processed (``done + failed + skipped``), not committed offsets:
    a partition commits only up to its lowest unanswered offset, so the committed share trails
    the work done (``running 12/8000`` beside ``done 2660`` read as stuck to a new user).

    Blocks, not one wide table: a table of eight columns did not fit 80 columns (rich cut the
    counts to ``3…``) and lost its headers when piped. Every line here is
    short, so nothing is cut at any width.
    """
    if not statuses:
        console.print("no jobs")
        return
    for i, s in enumerate(statuses):
        if i:
            console.print()
        say = functools.partial(console.print, highlight=False, soft_wrap=True)
        say(f"[bold]{s.job_id}[/]")  # alone on its line: never cut, it is what cancel takes
        state = f"  [{_STYLE[s.state]}]{s.state}[/]"
        done = s.total_offsets if s.state == "completed" else min(s.processed, s.total_offsets)
        fraction = f"{done}/{s.total_offsets} records ({100.0 * s.progress:.1f} %)"
        if s.state == "running" and console.is_terminal:  # piped, a bar is blank spaces
            head = Table.grid(padding=(0, 1))
            bar = ProgressBar(total=max(1, s.total_offsets), completed=done, width=20)
            head.add_row(state, bar, fraction)
            console.print(head, highlight=False)
        else:
            say(f"{state} {fraction}")
        if s.reason and s.state == "failed":
            say(f"  [red]{s.reason}[/]")
        c = s.counts
        say(f"  done {c.done} · failed {c.failed} · skipped {c.skipped}")
        if s.state != "completed":
            say(
                f"  committed {s.finished_offsets}/{s.total_offsets} offsets "
                f"({100.0 * s.fraction:.1f} %; a restart resumes there)"
            )
        say(f"  {s.source_topic} → {s.output_topic}")
        idle = "none yet" if s.state in ("pending", "running") else "none"  # ended: no more
        members = ", ".join(f"{m} {m_state}" for m, m_state in s.members.items()) or idle
        say(f"  members: {members}")
        say(f"  created {_when(s.created_at_s)}")


def _when(unix_s: float) -> str:
    return dt.datetime.fromtimestamp(unix_s, dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")
