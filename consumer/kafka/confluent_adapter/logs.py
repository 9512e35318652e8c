"""librdkafka's log lines and retried errors on Python loggers, retried noise quietened: the
one log rule of every confluent-kafka client kbatch makes.

Loggers: each client logs to ``kbatch.librdkafka.<role>`` (:func:`librdkafka_logger`:
``source``, ``range``, ``sink``, ``txn-group``, ``verdicts``), children of
:data:`LOGGER_PREFIX`; the adapter's own lines use the module loggers
(``consumer.kafka.confluent_adapter.<module>``), as the rest of kbatch does.

librdkafka logs through the ``logger=`` object given to a client (confluent-kafka calls
``logger.log(level, "%s [%s] %s", facility, client name, text)`` from inside ``poll`` or
``consume``, on the polling thread), with syslog levels mapped to Python's (0-2 CRITICAL,
3 ERROR, 4 WARNING, 5-6 INFO, 7 DEBUG). Without one it writes to stderr.

A broker that is down makes librdkafka log, for every reconnect attempt (every
``reconnect.backoff.ms``, up to ``reconnect.backoff.max.ms``), a line that it then simply
retries: ``FAIL`` (``Connect to ipv4#… failed: Connection refused``), ``REQTMOUT`` (requests
timed out), and ``GETPID``/``TXNCOORD`` while a just-started broker loads its coordinator. As
for aiokafka (:mod:`consumer.kafka.log_levels`), :class:`LibrdkafkaLogFilter` makes such a
line (:data:`RETRIED_FACILITIES`) one WARNING a minute, the repeats DEBUG; any other ERROR
or WARNING line keeps its level, also once a minute, the repeats DEBUG. A line is its
facility and its text without digits (the backoff and the ages in it change on each try), so
a second broker going down is a WARNING of its own at once. librdkafka's own ``FATAL`` line
is INFO: ``error_cb`` has the error too, and the client raises it or logs it as an ERROR
(:func:`error_callback`).

An ``error_cb`` error librdkafka retries (all brokers down, a transport error) is a WARNING
once a minute per error and text pattern, the repeats DEBUG (:func:`log_retried_error`).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from typing import Final

__all__ = [
    "LIBRDKAFKA_FORMAT",
    "LOGGER_PREFIX",
    "RETRIED_FACILITIES",
    "LibrdkafkaLogFilter",
    "RepeatLimiter",
    "error_callback",
    "librdkafka_logger",
    "log_retried_error",
]

LOGGER_PREFIX: Final = "kbatch.librdkafka"
"""Parent of every librdkafka client's logger (``kbatch.librdkafka.<role>``)."""

LIBRDKAFKA_FORMAT: Final = "%s [%s] %s"
"""The format confluent-kafka passes to ``logger.log`` (facility, client name, text)."""

REPEAT_AFTER_S: Final = 60.0
"""The same line is shown at its level again after this many seconds; DEBUG in between (as
:data:`consumer.kafka.log_levels.REPEAT_AFTER_S`)."""

MAX_LINES: Final = 1024
"""Most lines remembered; beyond, the memory starts afresh (a line may show once more)."""

RETRIED_FACILITIES: Final = frozenset(
    {"FAIL", "REQTMOUT", "GETPID", "TXNCOORD", "COORDFAIL", "BROKERFAIL", "METADATA", "ERROR"}
)
"""librdkafka log facilities whose ERROR/WARNING lines report a fault librdkafka retries on
its own (a broker unreachable, a request timed out, a coordinator not ready): a WARNING at
most, never an ERROR, whatever librdkafka's level."""

_THREAD = re.compile(r"^\[thrd:[^\]]*\]: ")
_DIGITS = re.compile(r"\d+")
_AFTER = re.compile(r" \(after \d+ms in state \w+\)")


class RepeatLimiter:
    """Says whether a line (any hashable key) is shown now: once per ``repeat_after_s``.

    Args:
        clock: monotonic seconds (``time.monotonic``; a fake clock in tests).
        repeat_after_s: seconds before the same key is shown again.
    """

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
        if len(self._shown_s) >= MAX_LINES:
            self._shown_s.clear()
        self._shown_s[key] = now_s
        return True


def _pattern(text: str) -> str:
    return _DIGITS.sub("#", _AFTER.sub("", text))[:200]


class LibrdkafkaLogFilter(logging.Filter):
    """The rule of the module docstring on librdkafka's records (``msg`` is
    :data:`LIBRDKAFKA_FORMAT`); other records pass unchanged. Strips librdkafka's
    ``[thrd:…]:`` prefix from the text.

    Args:
        clock: monotonic seconds (a fake clock in tests).
        repeat_after_s: seconds after a line is shown before it is shown again.
    """

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, repeat_after_s: float = REPEAT_AFTER_S
    ) -> None:
        super().__init__()
        self._limiter = RepeatLimiter(clock, repeat_after_s)

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if record.msg != LIBRDKAFKA_FORMAT or not isinstance(args, tuple) or len(args) != 3:
            return True
        facility, text = str(args[0]), _THREAD.sub("", str(args[2]))
        record.args = (facility, args[1], text)
        level = record.levelno
        if level < logging.WARNING:
            return True
        if facility == "FATAL":  # error_cb has it too: raised or logged as an ERROR there
            level = logging.INFO
        else:
            if facility in RETRIED_FACILITIES:
                level = logging.WARNING
            if not self._limiter.show((record.name, facility, _pattern(text))):
                level = logging.DEBUG
        record.levelno, record.levelname = level, logging.getLevelName(level)
        return logging.getLogger(record.name).isEnabledFor(level)


_filter = LibrdkafkaLogFilter()


def librdkafka_logger(role: str) -> logging.Logger:
    """The logger ``kbatch.librdkafka.<role>`` for a librdkafka client's ``logger=``, with the
    one shared :class:`LibrdkafkaLogFilter` installed (once)."""
    logger = logging.getLogger(f"{LOGGER_PREFIX}.{role}")
    if _filter not in logger.filters:
        logger.addFilter(_filter)
    return logger


def log_retried_error(logger: logging.Logger, err: object, limiter: RepeatLimiter) -> None:
    """An ``error_cb`` error librdkafka retries itself: ``Kafka client: <text> (<name>,
    retried)``, a WARNING once a minute (one ``limiter`` per client) per error code and text
    pattern, else DEBUG."""
    text_of = getattr(err, "str", None)
    text = _AFTER.sub("", text_of() if callable(text_of) else str(err))
    name_of = getattr(err, "name", None)
    name = name_of() if callable(name_of) else type(err).__name__
    code_of = getattr(err, "code", None)
    key = (code_of() if callable(code_of) else name, _pattern(text))
    level = logging.WARNING if limiter.show(key) else logging.DEBUG
    if logger.isEnabledFor(level):
        logger.log(level, "Kafka client: %s (%s, retried)", text, name)


def error_callback(
    logger: logging.Logger, on_fatal: Callable[[object], None] | None = None
) -> Callable[[object], None]:
    """librdkafka's ``error_cb`` (called inside ``poll``) of a client that raises nothing
    itself: a fatal error (``err.fatal()``: the client is unusable, e.g. a fenced or failed
    idempotent producer) is an ERROR line and is handed to ``on_fatal``; any other (all
    brokers down, a transport error, which librdkafka retries) :func:`log_retried_error`."""
    limiter = RepeatLimiter()

    def report(err: object) -> None:
        if bool(getattr(err, "fatal", lambda: False)()):
            text = getattr(err, "str", lambda: str(err))()
            name = getattr(err, "name", lambda: type(err).__name__)()
            logger.error("Kafka client failed for good: %s (%s)", text, name)
            if on_fatal is not None:
                on_fatal(err)
        else:
            log_retried_error(logger, err, limiter)

    return report
