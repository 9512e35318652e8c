"""The ``kbatch`` console script: one click group, one sub-group or command per module."""

from __future__ import annotations

import click

from consumer.cli.backfill import backfill_command
from consumer.cli.bench import bench_group
from consumer.cli.broker import broker_group
from consumer.cli.demo import demo_command
from consumer.cli.load import load_command
from consumer.cli.request import request_command
from consumer.cli.serve import serve_command
from consumer.cli.topics import topics_group


@click.group("kbatch", context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="kbatch")
def cli() -> None:
    """Kafka inference consumer: batched model serving over Kafka topics."""


cli.add_command(broker_group)
cli.add_command(bench_group)
cli.add_command(serve_command)
cli.add_command(request_command)
cli.add_command(load_command)
cli.add_command(backfill_command)
cli.add_command(demo_command)
cli.add_command(topics_group)


def main() -> None:
    """Entry point of the ``kbatch`` console script."""
    cli()
