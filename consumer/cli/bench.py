"""``kbatch bench …``: benchmarks as commands with JSON output (never timed unit tests).

The CLI is plain click (Typer was dropped: its vendored click cannot host the generated
``serve`` options). Add a benchmark with ``@bench_group.command("name")``.
"""

from __future__ import annotations

import click


@click.group("bench", help="Benchmarks (JSON output with --json).")
def bench_group() -> None:
    """Benchmarks as commands."""
