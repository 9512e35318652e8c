"""The ``kbatch`` console script: one Typer app, one sub-app or command per module."""

from __future__ import annotations

import typer

from consumer.cli.bench import bench_app
from consumer.cli.broker import broker_app

app = typer.Typer(
    name="kbatch",
    help="Kafka inference consumer: batched model serving over Kafka topics.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(broker_app, name="broker")
app.add_typer(bench_app, name="bench")


def main() -> None:
    """Entry point of the ``kbatch`` console script."""
    app()
