"""``kbatch request``: see its --help. (Owned by the request work; registered in consumer/cli/__init__.py.)"""

from __future__ import annotations

import click


@click.command("request")
def request_command() -> None:
    """Not built yet."""
    raise click.ClickException("kbatch request is not built yet")
