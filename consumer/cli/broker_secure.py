"""``kbatch broker start --secure`` and ``kbatch broker env``: the secured local broker's commands
(:mod:`consumer.broker.secure`), kept apart from the plain broker's."""

from __future__ import annotations

import shlex
from collections.abc import Mapping

import click
from rich_click import RichCommand

from consumer.broker.local import BrokerError
from consumer.broker.secure import SECURE_PORT, USERS, SecureBroker
from consumer.kafka.config import KafkaClientSettings

CLIENT_VARIABLES: tuple[str, ...] = tuple(
    f"KBATCH_{name.upper()}" for name in KafkaClientSettings.model_fields
)
"""Every ``KBATCH_*`` variable of a Kafka client's settings (``KafkaClientSettings``' fields,
prefixed as the commands read them: ``consumer.config.COMMAND_CONFIG``)."""


def env_lines(variables: Mapping[str, str]) -> list[str]:
    """The shell lines that leave exactly ``variables`` set among :data:`CLIENT_VARIABLES`:
    one ``unset`` of the client variables the chosen mode does not use (an earlier ``eval`` of
    the other mode left ``KBATCH_SASL_*`` or ``KBATCH_SSL_CERTFILE`` set, which the client
    would read together with these), then one ``export`` per variable, values shell-quoted."""
    stale = [name for name in CLIENT_VARIABLES if name not in variables]
    lines = [f"unset {' '.join(stale)}"] if stale else []
    return lines + [f"export {name}={shlex.quote(value)}" for name, value in variables.items()]


def _port(ctx: click.Context, port: int) -> int:
    """``--port`` when given as a flag, else :data:`SECURE_PORT`: ``KBATCH_BROKER_PORT`` names
    the plain broker's port, never the secured one's."""
    source = ctx.get_parameter_source("port")
    return port if source == click.core.ParameterSource.COMMANDLINE else SECURE_PORT


def start_secure(ctx: click.Context, port: int, fresh: bool, kafka_version: str) -> None:
    """Start the secured broker; print its SASL_SSL and mutual-TLS bootstrap addresses.

    Raises:
        BrokerError: see :meth:`consumer.broker.local.LocalBroker.start`.
    """
    broker = SecureBroker(port=_port(ctx, port), kafka_version=kafka_version)
    click.echo(broker.start(fresh=fresh))
    click.echo(f"mutual TLS: {broker.mtls_bootstrap}", err=True)
    click.echo(f'clients: eval "$(kbatch broker env --port {broker.port} --user kbatch)"', err=True)


@click.command("env", cls=RichCommand)
@click.option(
    "--port",
    type=int,
    default=SECURE_PORT,
    show_default=True,
    help="The secured broker's port (its SASL_SSL listener).",
)
@click.option(
    "--user",
    type=click.Choice(USERS),
    default="kbatch",
    show_default=True,
    help="Whose credentials (admin is a super user).",
)
@click.option("--mtls", is_flag=True, help="The user's certificate on the mutual-TLS listener.")
def env(port: int, user: str, mtls: bool) -> None:
    """Print the `export KBATCH_...` lines a client of the secured broker needs (password
    included: use `eval "$(kbatch broker env)"`, never a flag), after one `unset` of the other
    client variables (those of the mode not chosen)."""
    try:
        variables = SecureBroker(port=port).client_env(user, mtls=mtls)
    except BrokerError as err:
        click.echo(f"kbatch broker: {err}", err=True)
        raise SystemExit(2) from None
    for line in env_lines(variables):
        click.echo(line)
