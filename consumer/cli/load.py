"""``kbatch load``: see its --help. (Owned by the load work; registered in consumer/cli/__init__.py.)"""

from __future__ import annotations

import click


@click.command("load")
def load_command() -> None:
    """Not built yet."""
    raise click.ClickException("kbatch load is not built yet")
