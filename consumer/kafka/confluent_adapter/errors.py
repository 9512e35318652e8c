"""librdkafka's errors in the Kafka layer's terms (:mod:`consumer.kafka.errors`), and its log
lines in the Python logger ``consumer.kafka.confluent_adapter``.

librdkafka retries what it can on its own (a broker down, a request timed out) and reports
each failure to ``error_cb`` and to its log, many times a second while a broker is down. The
rule of the aiokafka side (:mod:`consumer.kafka.log_levels`) holds here too: a retried error
is a WARNING at most once a minute per line, the repeats DEBUG. What librdkafka cannot retry
becomes one of the layer's errors, raised once by the source (:func:`layer_error`):

==============================================  =====================================
librdkafka error                                raised as
==============================================  =====================================
``FENCED_INSTANCE_ID`` (classic: another member  :class:`~consumer.kafka.errors.
took this static id), ``UNRELEASED_INSTANCE_ID``  FencedInstanceError`
(consumer protocol: the id is in use), ``_FENCED``
``_SSL``, ``_AUTHENTICATION``,                  :class:`~consumer.kafka.errors.
``SASL_AUTHENTICATION_FAILED``, the ACL denials  KafkaSecurityError`
(``TOPIC_``/``GROUP_``/``CLUSTER_AUTHORIZATION_
FAILED``)
any other fatal error                           :class:`~consumer.kafka.errors.
                                                KafkaUnavailableError`
==============================================  =====================================
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from typing import Final

from confluent_kafka import KafkaError

from consumer.kafka.errors import (
    FencedInstanceError,
    KafkaLayerError,
    KafkaSecurityError,
    KafkaUnavailableError,
)

__all__ = ["LibrdkafkaLog", "RepeatLimiter", "connect_refusal", "layer_error"]

log = logging.getLogger("consumer.kafka.confluent_adapter")

FENCED_CODES: Final = frozenset(
    {KafkaError.FENCED_INSTANCE_ID, KafkaError.UNRELEASED_INSTANCE_ID, KafkaError._FENCED}
)
"""A static member whose ``group.instance.id`` another member holds."""

LOGIN_CODES: Final = frozenset(
    {KafkaError._SSL, KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED}
)
"""The broker answered but refused the connection: a TLS check or the SASL login."""

DENIAL_CODES: Final = frozenset(
    {
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.GROUP_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    }
)
"""The broker's ACLs refuse reading a topic or joining the group."""

REPEAT_AFTER_S: Final = 60.0
"""The same line is a WARNING (or ERROR) again after this many seconds; DEBUG in between."""

RETRIED_FACILITIES: Final = frozenset({"FAIL", "REQTMOUT", "BROKERFAIL", "ERROR"})
"""librdkafka log facilities of failures it retries by itself (a connection refused or cut,
a request timed out): a WARNING at most, never an ERROR, whatever librdkafka's level."""

_ADDRESS = re.compile(r"^(?:\w+://)?(?P<address>[^/\s]+)/[^:\s]*: (?P<text>.*)$", re.DOTALL)
_THREAD = re.compile(r"^\[thrd:[^\]]*\]: ")
_NUMBERS = re.compile(r"\d+")
_AFTER = re.compile(r" \(after \d+ms in state \w+\)")


class RepeatLimiter:
    """Says whether a line (any hashable key) is shown now: once per ``repeat_after_s``.

    Args:
        clock: monotonic seconds (``time.monotonic``; a fake clock in tests).
        repeat_after_s: seconds before the same key is shown again.
    """

    MAX_KEYS: Final = 1024

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, repeat_after_s: float = REPEAT_AFTER_S
    ) -> None:
        self._clock = clock
        self._repeat_after_s = repeat_after_s
        self._shown_s: dict[object, float] = {}

    def show(self, key: object) -> bool:
        now_s = self._clock()
        last_s = self._shown_s.get(key)
        if last_s is not None and now_s - last_s < self._repeat_after_s:
            return False
        if len(self._shown_s) >= self.MAX_KEYS:
            self._shown_s.clear()
        self._shown_s[key] = now_s
        return True


class LibrdkafkaLog:
    """librdkafka's ``logger``: confluent-kafka calls ``log(level, "%s [%s] %s", facility,
    client name, text)`` on the polling thread, ``level`` a Python level mapped from syslog's
    (0-2 CRITICAL, 3 ERROR, 4 WARNING, 5-6 INFO, 7 DEBUG).

    A WARNING or ERROR line is shown once per :data:`REPEAT_AFTER_S` (its facility and its
    text with the numbers masked), the repeats DEBUG; a line of :data:`RETRIED_FACILITIES` is
    at most a WARNING. INFO and DEBUG lines pass unchanged.
    """

    def __init__(self, logger: logging.Logger = log, limiter: RepeatLimiter | None = None) -> None:
        self._logger = logger
        self._limiter = limiter or RepeatLimiter()

    def log(self, level: int, fmt: str, *args: object) -> None:
        facility = str(args[0]) if args else ""
        text = _THREAD.sub("", str(args[2])) if len(args) >= 3 else fmt % args
        if facility == "FATAL":  # error_cb has it too: the source raises it (layer_error)
            level = logging.INFO
        elif level >= logging.WARNING:
            if facility in RETRIED_FACILITIES:
                level = logging.WARNING
            key = (facility, _NUMBERS.sub("N", _AFTER.sub("", text))[:160])
            if not self._limiter.show(key):
                level = logging.DEBUG
        if self._logger.isEnabledFor(level):
            self._logger.log(level, "librdkafka %s: %s", facility, text)

    def error(self, err: KafkaError) -> None:
        """An ``error_cb`` error librdkafka retries itself (the source raises the others):
        a WARNING once a minute per error and text pattern, else DEBUG."""
        text = _AFTER.sub("", err.str())
        key = (err.code(), _NUMBERS.sub("N", text)[:160])
        level = logging.WARNING if self._limiter.show(key) else logging.DEBUG
        if self._logger.isEnabledFor(level):
            self._logger.log(level, "Kafka client: %s (%s, retried)", text, err.name())


def connect_refusal(err: KafkaError) -> tuple[str, str]:
    """``(address, text)`` of a TLS or SASL refusal (``err.code()`` in :data:`LOGIN_CODES`):
    the broker's ``host:port`` ("?" when the error does not name it) and one line naming the
    cause, as :func:`consumer.kafka.client_config.describe_connect_failure` words it."""
    raw = _AFTER.sub("", err.str())
    found = _ADDRESS.match(raw)
    address, reason = (found["address"], found["text"]) if found else ("?", raw)
    if err.code() == KafkaError._SSL:
        if "certificate verify failed" in reason or "verify" in reason.lower():
            return address, f"TLS check of the broker's certificate failed: {reason}"
        return address, f"TLS handshake failed: {reason}"
    return address, f"SASL login refused: {reason}"


def layer_error(
    err: KafkaError, *, group_id: str, instance_id: str | None, topics: tuple[str, ...]
) -> KafkaLayerError | None:
    """The layer's error for ``err`` when the source must raise it (module docstring); None
    for an error librdkafka retries on its own (log it: :meth:`LibrdkafkaLog.error`)."""
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
    if code in LOGIN_CODES:
        address, text = connect_refusal(err)
        return KafkaSecurityError(f"the broker at {address} refused the client: {text}")
    if code in DENIAL_CODES:
        return KafkaSecurityError(
            f"reading {', '.join(topics)} as group {group_id}: the broker denies it: "
            f"{err.name()} ({err.str()})"
        )
    if fatal:
        return KafkaUnavailableError(f"the Kafka client failed for good: {err.str()}")
    return None
