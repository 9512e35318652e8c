"""``kbatch broker start | stop | status``: the local single-node Kafka for development."""

from __future__ import annotations

from typing import Annotated

import typer

from consumer.broker.local import DEFAULT_PORT, BrokerError, LocalBroker

broker_app = typer.Typer(help="Run a local single-node Apache Kafka (KRaft) on 127.0.0.1.", no_args_is_help=True)

PortOption = Annotated[int, typer.Option("--port", help="Broker port; the controller listens on port + 1.")]


def _fail(err: BrokerError) -> None:
    typer.echo(f"kbatch broker: {err}", err=True)
    raise typer.Exit(2)


@broker_app.command()
def start(
    port: PortOption = DEFAULT_PORT,
    fresh: Annotated[bool, typer.Option("--fresh", help="Stop it and wipe its data first.")] = False,
) -> None:
    """Start the broker (idempotent); print its bootstrap address once it answers."""
    try:
        typer.echo(LocalBroker(port=port).start(fresh=fresh))
    except BrokerError as err:
        _fail(err)


@broker_app.command()
def stop(port: PortOption = DEFAULT_PORT) -> None:
    """Stop the broker cleanly; its data stays (use `start --fresh` to wipe it)."""
    stopped = LocalBroker(port=port).stop()
    typer.echo("stopped" if stopped else "not running")


@broker_app.command()
def status(port: PortOption = DEFAULT_PORT) -> None:
    """Exit 0 when the broker answers a metadata request, 1 otherwise."""
    broker = LocalBroker(port=port)
    if broker.status():
        typer.echo(f"running at {broker.bootstrap}")
        return
    typer.echo(f"not answering at {broker.bootstrap}", err=True)
    raise typer.Exit(1)
