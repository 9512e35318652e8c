"""The Kafka security flags of the client commands (``kbatch request``, ``load``, ``topics``):
the fields of :class:`consumer.kafka.config.KafkaClientSettings`, defined once, as flags and
``KBATCH_*`` variables exactly as ``kbatch serve`` has them (secrets from the environment
only: ``KBATCH_SASL_PASSWORD`` or ``--sasl-password-file``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click
from pydantic import ValidationError

from consumer.cli.options import settings_options
from consumer.config import COMMAND_CONFIG, SettingsBase, load_settings
from consumer.kafka.config import KafkaClientSettings

F = TypeVar("F", bound=Callable[..., Any])

SECURITY_FIELDS: frozenset[str] = frozenset(KafkaClientSettings.model_fields) - {
    "bootstrap",
    "kafka_client",
}
"""The security fields (``bootstrap`` comes with the topic options; the client tools run on
aiokafka, the light install's client, so ``kafka_client`` is not theirs)."""


class ClientCommandSettings(KafkaClientSettings, SettingsBase):
    """:class:`KafkaClientSettings` with the ``KBATCH_*`` environment as a source."""

    model_config = COMMAND_CONFIG


def security_options(func: F) -> F:
    """Add one flag per non-secret security field; the callback gets them as keyword arguments
    (pass them to :func:`client_settings`)."""
    options = settings_options(
        ClientCommandSettings, exclude=frozenset({"bootstrap", "kafka_client"})
    )
    params: list[click.Parameter] = getattr(func, "__click_params__", [])
    params.extend(reversed(options))  # click reverses decorator-added parameters
    func.__click_params__ = params  # type: ignore[attr-defined]
    return func


def client_settings(bootstrap: str, flags: dict[str, Any]) -> KafkaClientSettings:
    """The client's Kafka settings from ``--bootstrap``, the security flags in ``flags`` and the
    ``KBATCH_*`` environment (flag > environment > default).

    Raises:
        click.UsageError: an invalid value or combination (one line per problem).
    """
    given = {k: v for k, v in flags.items() if k in SECURITY_FIELDS}
    try:
        settings = load_settings(ClientCommandSettings, bootstrap=bootstrap, **given)
    except ValidationError as err:
        from consumer.cli.options import explain

        raise click.UsageError(explain(ClientCommandSettings, err, given)) from None
    return KafkaClientSettings.model_validate(
        {name: getattr(settings, name) for name in KafkaClientSettings.model_fields}
    )


def client_kafka_options(bootstrap: str, flags: dict[str, Any]) -> dict[str, Any]:
    """aiokafka's security keyword arguments from :func:`client_settings`.

    Raises:
        click.UsageError: an invalid value or combination.
        click.ClickException: an unreadable CA, key or password file.
    """
    from consumer.kafka.client_config import security_kwargs
    from consumer.kafka.errors import KafkaSecurityError

    try:
        return security_kwargs(client_settings(bootstrap, flags))
    except KafkaSecurityError as err:
        raise click.ClickException(str(err)) from None
