"""``kbatch serve``: every :class:`consumer.config.ServeSettings` field is a flag."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import click
from pydantic import ValidationError

from consumer.cli.options import settings_options
from consumer.config import ServeSettings, load_settings


def _serve(config: Path | None, **flags: Any) -> None:
    try:
        settings = load_settings(ServeSettings, config, **flags)
    except (ValidationError, FileNotFoundError) as err:
        raise click.UsageError(str(err)) from err
    from consumer.app import serve

    sys.exit(asyncio.run(serve(settings)))


serve_command = click.Command(
    name="serve",
    callback=_serve,
    params=[
        click.Option(
            ["--config", "config"],
            type=click.Path(path_type=Path),
            default=None,
            help="YAML file of settings (flags and KBATCH_* variables win over it).",
        ),
        *settings_options(ServeSettings),
    ],
    help="Consume requests, run batched inference, publish keyed replies.",
)
