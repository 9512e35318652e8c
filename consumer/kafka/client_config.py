"""aiokafka keyword arguments from :class:`consumer.kafka.config.KafkaClientSettings`:
security passes through unchanged."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiokafka.helpers import create_ssl_context

from consumer.kafka.config import KafkaClientSettings
from consumer.kafka.errors import KafkaUnavailableError, map_kafka_errors


def security_kwargs(settings: KafkaClientSettings) -> dict[str, Any]:
    """``security_protocol``, SASL and TLS settings as aiokafka client kwargs."""
    kwargs: dict[str, Any] = {"security_protocol": settings.security_protocol}
    if settings.sasl_mechanism is not None:
        kwargs["sasl_mechanism"] = settings.sasl_mechanism
    if settings.sasl_plain_username is not None:
        kwargs["sasl_plain_username"] = settings.sasl_plain_username
    if settings.sasl_plain_password is not None:
        kwargs["sasl_plain_password"] = settings.sasl_plain_password.get_secret_value()
    if settings.security_protocol in ("SSL", "SASL_SSL"):
        kwargs["ssl_context"] = create_ssl_context(
            cafile=str(settings.ssl_cafile) if settings.ssl_cafile else None,
            certfile=str(settings.ssl_certfile) if settings.ssl_certfile else None,
            keyfile=str(settings.ssl_keyfile) if settings.ssl_keyfile else None,
        )
    return kwargs


def client_kwargs(settings: KafkaClientSettings) -> dict[str, Any]:
    """``bootstrap_servers`` and :func:`security_kwargs`: what every aiokafka client takes."""
    return {"bootstrap_servers": settings.bootstrap, **security_kwargs(settings)}


async def start_client(
    start: Callable[[], Awaitable[object]], close: Callable[[], Awaitable[object]], context: str
) -> None:
    """Start an aiokafka client (``start``); when no broker answers, ``close`` it and raise.

    Raises:
        KafkaUnavailableError: ``f"{context}: {aiokafka's error}"``.
    """
    try:
        with map_kafka_errors(KafkaUnavailableError, context):
            await start()
    except KafkaUnavailableError:
        await close()
        raise
