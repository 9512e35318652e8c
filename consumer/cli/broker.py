"""``kbatch broker start | stop | status``: the local single-node Kafka for development."""

from __future__ import annotations

import click

from consumer.broker.local import DEFAULT_PORT, KAFKA_VERSION, BrokerError, LocalBroker

port_option = click.option(
    "--port",
    type=int,
    default=DEFAULT_PORT,
    show_default=True,
    envvar="KBATCH_BROKER_PORT",
    help="Broker port; the controller listens on port + 1 (env KBATCH_BROKER_PORT).",
)


@click.group("broker", help="Run a local single-node Apache Kafka (KRaft) on 127.0.0.1.")
def broker_group() -> None:
    """The local development broker."""


def _fail(err: BrokerError) -> None:
    click.echo(f"kbatch broker: {err}", err=True)
    raise SystemExit(2)


@broker_group.command()
@port_option
@click.option("--fresh", is_flag=True, help="Stop it and wipe its data first.")
@click.option(
    "--kafka-version",
    default=KAFKA_VERSION,
    show_default=True,
    help="Apache Kafka release to run (4.x, or 3.9.x for the previous line).",
)
@click.option(
    "--secure",
    is_flag=True,
    help="TLS, SCRAM and mutual TLS with ACLs (default port 9093; docs/SECURITY.md).",
)
@click.pass_context
def start(ctx: click.Context, port: int, fresh: bool, kafka_version: str, secure: bool) -> None:
    """Start the broker (idempotent); print its bootstrap address once it answers."""
    try:
        if secure:
            from consumer.cli.broker_secure import start_secure

            start_secure(ctx, port, fresh, kafka_version)
            return
        click.echo(LocalBroker(port=port, kafka_version=kafka_version).start(fresh=fresh))
    except BrokerError as err:
        _fail(err)


@broker_group.command()
@port_option
def stop(port: int) -> None:
    """Stop the broker cleanly; its data stays (use `start --fresh` to wipe it)."""
    stopped = LocalBroker(port=port).stop()
    click.echo("stopped" if stopped else "not running")


@broker_group.command()
@port_option
def status(port: int) -> None:
    """Exit 0 when the broker answers a metadata request, 1 otherwise."""
    broker = LocalBroker(port=port)
    if broker.status():
        click.echo(f"running at {broker.bootstrap}")
        return
    click.echo(f"not answering at {broker.bootstrap}", err=True)
    raise SystemExit(1)


def _register_secure() -> None:
    from consumer.cli.broker_secure import env

    broker_group.add_command(env)


_register_secure()
