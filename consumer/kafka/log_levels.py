"""aiokafka's group coordinator logs retriable errors at ERROR; kbatch shows them as a WARNING.

aiokafka's ``ensure_coordinator_known`` logs ``Group Coordinator Request failed: [Error 15]
GroupCoordinatorNotAvailableError`` at ERROR on every retry (every ``retry_backoff_ms``) while
a just-started broker loads ``__consumer_offsets`` or the coordinator moves, and then simply
retries; so does its heartbeat on ``NotCoordinatorError``. Nothing is wrong that an operator must
fix, so :class:`RetriableErrorLogFilter` lowers such a line (an ERROR whose arguments hold a
Kafka error with ``retriable = True``) to one WARNING per message and error class per
``repeat_after_s``, the repeats in between to DEBUG. A non-retriable error stays an ERROR.

:func:`quiet_retriable_errors` installs one filter on aiokafka's group-coordinator logger (a
filter on a parent logger would not see its records); idempotent. Found by a new-user trial.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Final

__all__ = ["COORDINATOR_LOGGER", "RetriableErrorLogFilter", "quiet_retriable_errors"]

COORDINATOR_LOGGER: Final = "aiokafka.consumer.group_coordinator"
"""The logger of aiokafka's group coordinator (``logging.getLogger(__name__)`` there)."""

REPEAT_AFTER_S: Final = 60.0
"""The same retriable line is a WARNING again after this many seconds (else DEBUG)."""


class RetriableErrorLogFilter(logging.Filter):
    """Lower an ERROR about a retriable Kafka error to WARNING, once per ``repeat_after_s``.

    Args:
        clock: Monotonic seconds (``time.monotonic``; a fake clock in tests).
        repeat_after_s: Seconds after a WARNING before the same line (message template and
            error class) is a WARNING again; the repeats in between become DEBUG and pass only
            when the logger has DEBUG enabled.
    """

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, repeat_after_s: float = REPEAT_AFTER_S
    ) -> None:
        super().__init__()
        self._clock = clock
        self._repeat_after_s = repeat_after_s
        self._warned_s: dict[tuple[str, type[BaseException]], float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.ERROR:
            return True
        args = record.args if isinstance(record.args, tuple) else ()
        error = next(
            (a for a in args if isinstance(a, BaseException) and getattr(a, "retriable", False)),
            None,
        )
        if error is None:
            return True
        now_s = self._clock()
        line = (str(record.msg), type(error))
        last_s = self._warned_s.get(line)
        if last_s is None or now_s - last_s >= self._repeat_after_s:
            self._warned_s[line] = now_s
            level = logging.WARNING
        else:
            level = logging.DEBUG
        record.levelno, record.levelname = level, logging.getLevelName(level)
        return logging.getLogger(record.name).isEnabledFor(level)


_installed: RetriableErrorLogFilter | None = None


def quiet_retriable_errors() -> RetriableErrorLogFilter:
    """Install the filter on aiokafka's group-coordinator logger once; the installed filter."""
    global _installed
    if _installed is None:
        _installed = RetriableErrorLogFilter()
        logging.getLogger(COORDINATOR_LOGGER).addFilter(_installed)
    return _installed
