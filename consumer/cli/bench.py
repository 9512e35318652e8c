"""``kbatch bench …``: benchmarks as commands with JSON output (never timed unit tests)."""

from __future__ import annotations

import typer

bench_app = typer.Typer(help="Benchmarks (JSON output with --json).", no_args_is_help=True)
