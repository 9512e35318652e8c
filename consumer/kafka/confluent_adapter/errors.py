"""librdkafka's errors in the Kafka layer's terms (:mod:`consumer.kafka.errors`): the one
translation every confluent-kafka module uses. Its log lines: :mod:`.logs`.

A ``KafkaException`` raised by a call is mapped at the adapter edge by
:func:`map_confluent_errors`, as :func:`consumer.kafka.aiokafka_errors.map_kafka_errors` maps
aiokafka's: the same classes, the same message shapes (``f"{context}: {error}"``,
``f"{context}: the broker denies it: {denial}"``); only the text of the error itself is
librdkafka's (``UNKNOWN_TOPIC_OR_PART: Broker: Unknown topic or partition``).

librdkafka retries what it can on its own (a broker down, a request timed out) and reports
each failure to ``error_cb``. What it cannot retry is one of the layer's errors
(:func:`layer_error`, :func:`connect_failure`):

==============================================  =====================================
librdkafka error                                raised as
==============================================  =====================================
``FENCED_INSTANCE_ID`` (classic: another member  :class:`~consumer.kafka.errors.
took this static id), ``UNRELEASED_INSTANCE_ID``  FencedInstanceError`
(consumer protocol: the id is in use), ``_FENCED``
:data:`LOGIN_CODES` (a TLS check, the SASL      :class:`~consumer.kafka.errors.
login)                                          KafkaSecurityError` ``the broker at
                                                host:port refused the client: <cause>``
:data:`DENIAL_CODES` (the ACL denials)          :class:`~consumer.kafka.errors.
                                                KafkaSecurityError` ``<context>: the
                                                broker denies it: <denial>``
any other fatal error                           :class:`~consumer.kafka.errors.
                                                KafkaUnavailableError`
==============================================  =====================================

A refused connection is worded as :func:`consumer.kafka.client_config.start_client` words
aiokafka's (:func:`consumer.kafka.client_config.describe_connect_failure`), so an operator
reads the same line whichever ``--kafka-client`` is in use.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable, Iterator
from typing import Final

from confluent_kafka import KafkaError, KafkaException

from consumer.kafka.errors import (
    FencedInstanceError,
    KafkaLayerError,
    KafkaSecurityError,
    KafkaUnavailableError,
)

__all__ = [
    "DENIAL_CODES",
    "FENCED_CODES",
    "LOGIN_CODES",
    "SECURITY_CODES",
    "connect_failure",
    "connect_refusal",
    "describe",
    "kafka_error",
    "layer_error",
    "map_confluent_errors",
    "security_error",
]

FENCED_CODES: Final = frozenset(
    {KafkaError.FENCED_INSTANCE_ID, KafkaError.UNRELEASED_INSTANCE_ID, KafkaError._FENCED}
)
"""A static member whose ``group.instance.id`` another member holds."""

LOGIN_CODES: Final = frozenset(
    {
        KafkaError._SSL,
        KafkaError._AUTHENTICATION,
        KafkaError.SASL_AUTHENTICATION_FAILED,
        KafkaError.UNSUPPORTED_SASL_MECHANISM,
        KafkaError.ILLEGAL_SASL_STATE,
    }
)
"""The broker answered but refused the connection: a TLS check or the SASL login."""

DENIAL_CODES: Final = frozenset(
    {
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.GROUP_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    }
)
"""The broker's ACLs refuse an operation (reading a topic, joining the group, a transactional
id), as :data:`consumer.kafka.aiokafka_errors.DENIALS` for aiokafka."""

SECURITY_CODES: Final = LOGIN_CODES | DENIAL_CODES
"""Every code that is a :class:`KafkaSecurityError`: never retried."""

_ADDRESS = re.compile(r"^(?:\w+://)?(?P<address>[^/\s]+)/[^:\s]*: (?P<text>.*)$", re.DOTALL)
"""librdkafka's broker-thread messages: ``sasl_ssl://host:9093/bootstrap: <text>``."""
_AFTER = re.compile(r" \(after \d+ms in state \w+\)")


def kafka_error(err: BaseException | None) -> KafkaError | None:
    """The ``KafkaError`` a ``KafkaException`` carries (its first argument), else None."""
    if isinstance(err, KafkaException) and err.args and isinstance(err.args[0], KafkaError):
        return err.args[0]
    return None


def describe(err: KafkaError) -> str:
    """One line: ``UNKNOWN_TOPIC_OR_PART: Broker: Unknown topic or partition``."""
    return f"{err.name()}: {err.str()}"


def connect_refusal(err: KafkaError) -> tuple[str, str]:
    """``(address, text)`` of a TLS or SASL refusal (``err.code()`` in :data:`LOGIN_CODES`):
    the broker's ``host:port`` ("?" when the error does not name it) and one line naming the
    cause, as :func:`consumer.kafka.client_config.describe_connect_failure` words it."""
    raw = _AFTER.sub("", err.str())
    found = _ADDRESS.match(raw)
    address, reason = (found["address"], found["text"]) if found else ("?", raw)
    if err.code() == KafkaError._SSL:
        if "verify" in reason.lower():
            return address, f"TLS check of the broker's certificate failed: {reason}"
        return address, f"TLS handshake failed: {reason}"
    return address, f"SASL login refused: {reason}"


def security_error(err: KafkaError, context: str) -> KafkaSecurityError | None:
    """The :class:`KafkaSecurityError` for a code of :data:`SECURITY_CODES`, else None: a
    login refusal ``the broker at host:port refused the client: <cause>``
    (:func:`connect_refusal`), an ACL denial ``f"{context}: the broker denies it: <denial>"``."""
    code = err.code()
    if code in LOGIN_CODES:
        address, text = connect_refusal(err)
        return KafkaSecurityError(f"the broker at {address} refused the client: {text}")
    if code in DENIAL_CODES:
        return KafkaSecurityError(f"{context}: the broker denies it: {err.name()} ({err.str()})")
    return None


@contextlib.contextmanager
def map_confluent_errors(to: type[KafkaLayerError], context: str) -> Iterator[None]:
    """Raise ``to(f"{context}: {error}")`` from a ``KafkaException`` raised inside
    (:class:`KafkaSecurityError` for a code of :data:`SECURITY_CODES`: :func:`security_error`);
    the layer's own errors and everything else pass unchanged.

    Raises:
        KafkaLayerError: ``to``, or :class:`KafkaSecurityError`, for a ``KafkaException``.
    """
    try:
        yield
    except KafkaException as exc:
        err = kafka_error(exc)
        refused = security_error(err, context) if err is not None else None
        if refused is not None:
            raise refused from exc
        raise to(f"{context}: {describe(err) if err is not None else exc}") from exc


def connect_failure(errors: Iterable[KafkaError], context: str) -> KafkaUnavailableError:
    """The start-up error for the errors ``error_cb`` reported while no broker answered.

    A TLS or SASL failure or an ACL denial (the broker answered and refused) is a
    :class:`KafkaSecurityError` (:func:`security_error`); anything else a
    :class:`KafkaUnavailableError` ``f"{context}: <the last error's text>"`` (``context``
    alone when none was reported).
    """
    seen = list(errors)
    for err in seen:
        refused = security_error(err, context)
        if refused is not None:
            return refused
    transport = [e for e in seen if e.code() != KafkaError._ALL_BROKERS_DOWN] or seen
    if not transport:
        return KafkaUnavailableError(context)
    return KafkaUnavailableError(f"{context}: {_AFTER.sub('', transport[-1].str())}")


def layer_error(
    err: KafkaError, *, group_id: str, instance_id: str | None, topics: tuple[str, ...]
) -> KafkaLayerError | None:
    """The layer's error for an ``error_cb`` error of a group member when it must raise it
    (module docstring); None for an error librdkafka retries on its own (log it:
    :func:`consumer.kafka.confluent_adapter.logs.log_retried_error`)."""
    code = err.code()
    fatal = code == KafkaError._FATAL or err.fatal()
    # error_cb reports a fatal error as _FATAL, the cause only in its text (classic: "Static
    # consumer fenced by other consumer with same group.instance.id"; consumer protocol: "The
    # instance ID is still used by another member"): rd_kafka_fatal_error is not exposed.
    text = err.str().lower()
    if code in FENCED_CODES or (fatal and ("group.instance.id" in text or "instance id" in text)):
        remedy = "give every member its own id (the pod name; replicas add -<i>)"
        if code == KafkaError.UNRELEASED_INSTANCE_ID or "still used" in text:
            return FencedInstanceError(
                f"another member of group {group_id!r} already uses --group-instance-id "
                f"{instance_id!r}, so this one may not join: {remedy}"
            )
        return FencedInstanceError(
            f"another member of group {group_id!r} uses --group-instance-id {instance_id!r} "
            f"and took this one's place: {remedy}"
        )
    refused = security_error(err, f"reading {', '.join(topics)} as group {group_id}")
    if refused is not None:
        return refused
    if fatal:
        return KafkaUnavailableError(f"the Kafka client failed for good: {err.str()}")
    return None
