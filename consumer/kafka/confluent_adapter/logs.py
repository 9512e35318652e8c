"""librdkafka's log lines and error callbacks on Python loggers, retried noise quietened.

librdkafka logs through the ``logger=`` object given to a client (confluent-kafka calls
``logger.log(level, "%s [%s] %s", facility, client name, text)`` from inside ``poll``, on the
polling thread), with syslog levels mapped to Python's. Without one it writes to stderr.

A broker that is down makes librdkafka log, for every reconnect attempt (every
``reconnect.backoff.ms``, up to ``reconnect.backoff.max.ms``), a line that it then simply
retries: ``FAIL`` (``Connect to ipv4#… failed: Connection refused``), ``REQTMOUT`` (requests
timed out), and ``GETPID``/``TXNCOORD`` while a just-started broker loads its coordinator. As
for aiokafka (:mod:`consumer.kafka.log_levels`), such a line is one WARNING a minute (the
repeats DEBUG); any other ERROR stays an ERROR. A line is its facility and its text without
digits (the backoff and the ages in it change on each try), so a second broker going down is
a WARNING of its own at once.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from typing import Final

from consumer.kafka.log_levels import MAX_LINES, REPEAT_AFTER_S

__all__ = ["RETRIED_FACILITIES", "LibrdkafkaLogFilter", "error_callback", "librdkafka_logger"]

LOGGER_PREFIX: Final = "kbatch.librdkafka"
"""Parent of every librdkafka client's logger (``kbatch.librdkafka.<client name>``)."""

RETRIED_FACILITIES: Final = frozenset(
    {"FAIL", "REQTMOUT", "GETPID", "TXNCOORD", "COORDFAIL", "BROKERFAIL", "METADATA", "CLIENT"}
)
"""librdkafka log facilities whose ERROR/WARNING lines report a fault librdkafka retries on
its own (a broker unreachable, a request timed out, a coordinator not ready); ``CLIENT`` is
what :func:`error_callback` logs for an error that is not fatal."""

_DIGITS = re.compile(r"\d+")


class LibrdkafkaLogFilter(logging.Filter):
    """A librdkafka ERROR or WARNING of a :data:`RETRIED_FACILITIES` facility: a WARNING once
    per line per ``repeat_after_s`` seconds, the repeats DEBUG.

    Args:
        clock: monotonic seconds (a fake clock in tests).
        repeat_after_s: seconds after a WARNING before the same line is one again.
    """

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, repeat_after_s: float = REPEAT_AFTER_S
    ) -> None:
        super().__init__()
        self._clock = clock
        self._repeat_after_s = repeat_after_s
        self._warned_s: dict[str, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno not in (logging.ERROR, logging.WARNING):
            return True
        args = record.args if isinstance(record.args, tuple) else ()
        facility = str(args[0]) if args else ""
        if facility not in RETRIED_FACILITIES:
            return True
        text = str(args[2]) if len(args) > 2 else str(record.msg)
        line = f"{facility}|{_DIGITS.sub('#', text)[:200]}"
        now_s = self._clock()
        last_s = self._warned_s.get(line)
        if last_s is None or now_s - last_s >= self._repeat_after_s:
            if len(self._warned_s) >= MAX_LINES:
                self._warned_s.clear()
            self._warned_s[line] = now_s
            level = logging.WARNING
        else:
            level = logging.DEBUG
        record.levelno, record.levelname = level, logging.getLevelName(level)
        return logging.getLogger(record.name).isEnabledFor(level)


_filter = LibrdkafkaLogFilter()


def librdkafka_logger(name: str) -> logging.Logger:
    """The logger ``kbatch.librdkafka.<name>`` for a librdkafka client's ``logger=``, with the
    one shared :class:`LibrdkafkaLogFilter` installed (once)."""
    logger = logging.getLogger(f"{LOGGER_PREFIX}.{name}")
    if _filter not in logger.filters:
        logger.addFilter(_filter)
    return logger


def error_callback(
    logger: logging.Logger, on_fatal: Callable[[object], None] | None = None
) -> Callable[[object], None]:
    """librdkafka's ``error_cb`` (called inside ``poll``): a fatal error (``err.fatal()``: the
    client is unusable, e.g. a fenced or failed idempotent producer) is an ERROR line (facility
    ``FATAL``) and is handed to ``on_fatal``; any other (all brokers down, a transport error,
    which librdkafka retries) a rate-limited WARNING (facility ``CLIENT``): the error's text and
    its code's name."""

    def report(err: object) -> None:
        fatal = bool(getattr(err, "fatal", lambda: False)())
        text = getattr(err, "str", lambda: str(err))()
        name = getattr(err, "name", lambda: "")()
        if fatal:
            logger.error("%s [%s] %s", "FATAL", logger.name, f"{text} ({name})")
            if on_fatal is not None:
                on_fatal(err)
        else:
            logger.warning("%s [%s] %s", "CLIENT", logger.name, f"{text} ({name}, retried)")

    return report
