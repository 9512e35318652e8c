"""``kbatch backfill``: see its --help. (Owned by the backfill work; registered in consumer/cli/__init__.py.)"""

from __future__ import annotations

import click


@click.command("backfill")
def backfill_command() -> None:
    """Not built yet."""
    raise click.ClickException("kbatch backfill is not built yet")
