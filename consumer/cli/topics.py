"""``kbatch topics create``: create topics where the broker does not create them on first use.

Brokers without ``auto.create.topics.enable`` (``kbatch broker`` is one; most production
clusters are) need a client's own reply topic created before the first request names it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import click
from rich_click import RichGroup

from consumer.cli.client_security import client_settings, security_options
from consumer.cli.request import topic_options
from consumer.kafka.admin import ensure_topics
from consumer.kafka.client_config import security_kwargs
from consumer.kafka.errors import KafkaUnavailableError, TopicCreationError


@click.group(
    "topics", cls=RichGroup, help="Create the topics a client needs (e.g. its own reply topic)."
)
def topics_group() -> None:
    """Topic administration for development and small deployments."""


@topics_group.command("create")
@click.argument("names", nargs=-1, required=True)
@click.option(
    "--partitions", type=click.IntRange(min=1), default=1, show_default=True, help="Partitions."
)
@click.option(
    "--replication-factor",
    type=click.IntRange(min=1),
    default=None,
    help="Replicas of each topic [default: the cluster's default.replication.factor, else "
    "min(3, brokers)]; fewer than 3 is warned about.",
)
@topic_options
@security_options
def create(
    names: tuple[str, ...],
    partitions: int,
    replication_factor: int | None,
    bootstrap: str,
    request_topic: str,
    reply_topic: str,
    **security: Any,
) -> None:
    """Create NAMES unless they exist (existing topics are left as they are); prints one line
    per topic once the broker's metadata lists the new ones (at most 10 s), so a client
    started next finds them. Exit 1 when no broker answers or the broker refuses."""
    del request_topic, reply_topic  # shared options; only --bootstrap matters here
    kafka = client_settings(bootstrap, security)
    try:
        created = asyncio.run(
            ensure_topics(
                bootstrap,
                dict.fromkeys(names, partitions),
                replication_factor,
                security_kwargs(kafka),
            )
        )
    except (KafkaUnavailableError, TopicCreationError) as err:
        click.echo(f"kbatch topics: {err}", err=True)
        raise SystemExit(1) from err
    for name in names:
        click.echo(f"{name}: {'created' if name in created else 'exists'}")
