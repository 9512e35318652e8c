"""aiokafka's errors in the Kafka layer's terms (:mod:`consumer.kafka.errors`): the
translation of the aiokafka adapter and of the control-plane modules on aiokafka (admin, jobs
topic, client start), in one place, the most specific own class, chained with ``from``
(httpx's ``map_httpcore_exceptions``). librdkafka's: :mod:`consumer.kafka.confluent_adapter.errors`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from aiokafka.errors import (
    AuthenticationFailedError,
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    KafkaError,
    SaslAuthenticationFailed,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
    UnsupportedSaslMechanismError,
)

from consumer.kafka.errors import KafkaLayerError, KafkaSecurityError

__all__ = ["DENIALS", "describe_denial", "map_kafka_errors"]


DENIALS: tuple[type[KafkaError], ...] = (
    AuthenticationFailedError,
    SaslAuthenticationFailed,
    UnsupportedSaslMechanismError,
    TopicAuthorizationFailedError,
    GroupAuthorizationFailedError,
    ClusterAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
)
"""aiokafka's errors for a refused login or an ACL denial (:class:`KafkaSecurityError`)."""


def describe_denial(err: BaseException) -> str:
    """One line naming a denial: ``TOPIC_AUTHORIZATION_FAILED (the topic: kbatch.requests)``.

    aiokafka's authorization errors carry the topics or the group as their arguments."""
    name = getattr(err, "message", None) or type(err).__name__
    detail = ", ".join(str(a) for a in err.args if a) if err.args else ""
    return f"{name} ({detail})" if detail else str(name)


@contextlib.contextmanager
def map_kafka_errors(to: type[KafkaLayerError], context: str) -> Iterator[None]:
    """Raise ``to(f"{context}: {error}")`` from an aiokafka ``KafkaError`` raised inside
    (:class:`KafkaSecurityError` for a refused login or an ACL denial, :data:`DENIALS`); the
    layer's own errors and everything else pass unchanged.

    Raises:
        KafkaLayerError: ``to``, or :class:`KafkaSecurityError`, for an aiokafka error.
    """
    try:
        yield
    except DENIALS as err:
        denial = describe_denial(err)
        raise KafkaSecurityError(f"{context}: the broker denies it: {denial}") from err
    except KafkaError as err:
        raise to(f"{context}: {err}") from err
