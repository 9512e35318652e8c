"""``kbatch broker start | stop | status``: the local Kafka for development (one node, or a
KRaft cluster with ``--nodes``)."""

from __future__ import annotations

import click
from rich_click import RichGroup

from consumer.broker.cluster import MAX_NODES, LocalCluster, status_at, stop_at
from consumer.broker.local import DEFAULT_PORT, KAFKA_VERSION, BrokerError, LocalBroker
from consumer.cli.options import flag, option

port_option = option(
    "--port",
    type=int,
    default=DEFAULT_PORT,
    envvar="KBATCH_BROKER_PORT",
    help="Broker port; the controller listens on port + 1 (env KBATCH_BROKER_PORT). With "
    "--secure: 9094 unless --port is given (KBATCH_BROKER_PORT is the plain broker's).",
)


@click.group(
    "broker",
    cls=RichGroup,
    help="Run a local Apache Kafka (KRaft) on 127.0.0.1: one node, or a cluster (--nodes).",
)
def broker_group() -> None:
    """The local development broker."""


def _fail(err: BrokerError) -> None:
    click.echo(f"kbatch broker: {err}", err=True)
    raise SystemExit(2)


@broker_group.command()
@port_option
@flag("--fresh", help="Stop it and wipe its data first.")
@option(
    "--kafka-version",
    default=KAFKA_VERSION,
    help="Apache Kafka release to run (4.x, or 3.9.x for the previous line).",
)
@option(
    "--nodes",
    type=click.IntRange(1, MAX_NODES),
    default=1,
    help="Nodes: above 1, a KRaft cluster on ports PORT.. (docs/CLUSTER.md), topics "
    "replicated 3 times with min.insync.replicas 2.",
)
@flag(
    "--secure",
    help="TLS, SCRAM and mutual TLS with ACLs, on port 9094 unless --port is given "
    "(docs/SECURITY.md).",
)
@click.pass_context
def start(
    ctx: click.Context, port: int, fresh: bool, kafka_version: str, nodes: int, secure: bool
) -> None:
    """Start the broker (idempotent); print its bootstrap address once it answers."""
    try:
        if secure and nodes > 1:
            raise click.UsageError("--secure runs one node; --nodes above 1 is a plain cluster")
        if secure:
            from consumer.cli.broker_secure import start_secure

            start_secure(ctx, port, fresh, kafka_version)
            return
        if nodes > 1:
            cluster = LocalCluster(port=port, nodes=nodes, kafka_version=kafka_version)
            click.echo(cluster.start(fresh=fresh))
            return
        click.echo(LocalBroker(port=port, kafka_version=kafka_version).start(fresh=fresh))
    except BrokerError as err:
        _fail(err)


@broker_group.command()
@port_option
def stop(port: int) -> None:
    """Stop the broker cleanly; its data stays (use `start --fresh` to wipe it)."""
    stopped = stop_at(port)
    click.echo("stopped" if stopped else "not running")


@broker_group.command()
@port_option
def status(port: int) -> None:
    """Exit 0 when the broker answers a metadata request, 1 otherwise."""
    answering, line = status_at(port)
    if answering:
        click.echo(line)
        return
    click.echo(line, err=True)
    raise SystemExit(1)


def _register_secure() -> None:
    from consumer.cli.broker_secure import env

    broker_group.add_command(env)


_register_secure()
