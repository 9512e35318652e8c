"""confluent-kafka's errors as the Kafka layer's (:mod:`consumer.kafka.errors`), at the adapter
edge: :func:`map_confluent_errors` is :func:`consumer.kafka.errors.map_kafka_errors` for a
``KafkaException``, with the same classes and the same message shapes
(``f"{context}: {error}"``, ``f"{context}: the broker denies it: {denial}"``); only the text of
the error itself is librdkafka's (``UNKNOWN_TOPIC_OR_PART: Broker: Unknown topic or
partition``) instead of aiokafka's.

librdkafka reports a failed TLS check or SASL login not as an exception but through
``error_cb`` (served inside ``poll``/``consume``): :func:`connect_failure` turns the errors
collected there into the start-up error.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable, Iterator

from confluent_kafka import KafkaError, KafkaException

from consumer.kafka.errors import KafkaLayerError, KafkaSecurityError, KafkaUnavailableError

__all__ = [
    "DENIAL_CODES",
    "connect_failure",
    "describe",
    "kafka_error",
    "map_confluent_errors",
]

DENIAL_CODES: frozenset[int] = frozenset(
    {
        KafkaError._AUTHENTICATION,
        KafkaError._SSL,
        KafkaError.SASL_AUTHENTICATION_FAILED,
        KafkaError.UNSUPPORTED_SASL_MECHANISM,
        KafkaError.ILLEGAL_SASL_STATE,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.GROUP_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    }
)
"""librdkafka's codes for a refused TLS check or login, or an ACL denial
(:class:`KafkaSecurityError`), as :data:`consumer.kafka.errors.DENIALS` for aiokafka."""

_BROKER_PREFIX = re.compile(r"^(?:[a-z_]+://)?(?P<address>[^/\s]+)/[^:\s]*: (?P<text>.*)$", re.S)
"""librdkafka's broker-thread messages: ``sasl_ssl://host:9093/bootstrap: <text>``."""


def kafka_error(err: BaseException) -> KafkaError | None:
    """The ``KafkaError`` a ``KafkaException`` carries (its first argument), else None."""
    if isinstance(err, KafkaException) and err.args and isinstance(err.args[0], KafkaError):
        return err.args[0]
    return None


def describe(err: KafkaError) -> str:
    """One line: ``UNKNOWN_TOPIC_OR_PART: Broker: Unknown topic or partition``."""
    return f"{err.name()}: {err.str()}"


@contextlib.contextmanager
def map_confluent_errors(to: type[KafkaLayerError], context: str) -> Iterator[None]:
    """Raise ``to(f"{context}: {error}")`` from a ``KafkaException`` raised inside
    (:class:`KafkaSecurityError` for a code of :data:`DENIAL_CODES`); the layer's own errors and
    everything else pass unchanged.

    Raises:
        KafkaLayerError: ``to``, or :class:`KafkaSecurityError`, for a ``KafkaException``.
    """
    try:
        yield
    except KafkaException as exc:
        err = kafka_error(exc)
        if err is not None and err.code() in DENIAL_CODES:
            raise KafkaSecurityError(
                f"{context}: the broker denies it: {err.name()} ({err.str()})"
            ) from exc
        raise to(f"{context}: {describe(err) if err is not None else exc}") from exc


def raise_for(err: KafkaError) -> None:
    """Raise ``KafkaException(err)`` (a per-partition or per-topic error of a result), to be
    mapped by :func:`map_confluent_errors`."""
    raise KafkaException(err)


def connect_failure(errors: Iterable[KafkaError], context: str) -> KafkaUnavailableError:
    """The start-up error for the errors ``error_cb`` reported while no broker answered.

    A TLS or SASL failure (the broker answered and refused) is a :class:`KafkaSecurityError`
    ``the broker at host:port refused the client: <librdkafka's text>``; anything else a
    :class:`KafkaUnavailableError` ``f"{context}: <the last error's text>"`` (``context``
    alone when none was reported).
    """
    seen = list(errors)
    for err in seen:
        if err.code() in DENIAL_CODES:
            m = _BROKER_PREFIX.match(err.str())
            if m is None:
                return KafkaSecurityError(f"the broker refused the client: {err.str()}")
            return KafkaSecurityError(
                f"the broker at {m.group('address')} refused the client: {m.group('text')}"
            )
    transport = [e for e in seen if e.code() != KafkaError._ALL_BROKERS_DOWN] or seen
    if not transport:
        return KafkaUnavailableError(context)
    return KafkaUnavailableError(f"{context}: {transport[-1].str()}")
