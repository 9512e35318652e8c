"""aiokafka logs the errors it retries at ERROR (or WARNING), each time; kbatch shows each
such line once a minute, as a WARNING.

aiokafka logs, and then simply retries (every ``retry_backoff_ms``, 100 ms):

- its group coordinator (ERROR): ``Group Coordinator Request failed: [Error 15]
  GroupCoordinatorNotAvailableError`` while a just-started broker loads ``__consumer_offsets``
  or the coordinator moves, ``Heartbeat failed`` on ``NotCoordinatorError``;
- its client (logger ``aiokafka``, ERROR): ``Unable connect to node with id 2: …`` for every
  request routed to a broker that is down;
- its fetcher (ERROR): ``Failed fetch messages from 2: …``, ``Failed fetch offsets from 2: …``
  for the partitions that broker led until the controller moves their leadership;
- its cluster metadata (ERROR): ``Error fetching metadata for topic …: <error class>``, and
  ``Topic … not found in cluster metadata`` (UnknownTopicOrPartitionError, which the line
  does not pass) from a broker that has not yet learnt of a topic created a moment ago: a
  three-broker cluster's metadata reaches each broker asynchronously (CI run of stop 39);
- its producer's sender (WARNING): ``Got error produce response: …`` for every retried
  produce request.

With one broker of three down each member wrote 400–1,350 such ERROR lines per fault,
while the cluster still served: nothing an operator must fix, and docs/operations.md says an
ERROR line asks for one. :class:`RetriableErrorLogFilter` turns such a line — an ERROR or
WARNING whose arguments hold a retried error: a Kafka error (or error class) with
``retriable = True``, a ``ConnectionError`` or a ``TimeoutError`` (a broker that refuses or
never answers) — into one WARNING per line per ``repeat_after_s``, the repeats in between
DEBUG. A line is its message template, its error class and its other arguments (the node id,
the topic), so a second broker going down is a WARNING of its own at once. A non-retriable
error (an ACL denial, a TLS failure) stays an ERROR, and so does aiokafka's ``Unable to update
metadata`` (no broker answered at all: the cluster no longer serves) and kbatch's own error
lines. Kafka's Java client logs the unknown topic at WARN too (``Error while fetching metadata
… UNKNOWN_TOPIC_OR_PARTITION``); a topic that stays missing (``serve --no-create-topics``
before the topic is made) is still a WARNING a minute. Measured on the three-node cluster,
one node SIGKILLed for 20 s under a producer and a consumer: 273 ERROR and 82 WARNING lines
from aiokafka before, 0 ERROR and 2–3 WARNING lines after (``tests/chaos/test_cluster_faults.py``).

:func:`quiet_retriable_errors` installs one filter on each logger of :data:`NOISY_LOGGERS` (a
filter on a parent logger would not see its children's records); idempotent. The
coordinator's lines appear on a single broker too, the rest when a cluster node is down.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Final

from aiokafka.errors import UnknownTopicOrPartitionError

__all__ = [
    "COORDINATOR_LOGGER",
    "NOISY_LOGGERS",
    "RetriableErrorLogFilter",
    "quiet_retriable_errors",
]

COORDINATOR_LOGGER: Final = "aiokafka.consumer.group_coordinator"
"""The logger of aiokafka's group coordinator (``logging.getLogger(__name__)`` there)."""

NOISY_LOGGERS: Final = (
    COORDINATOR_LOGGER,
    "aiokafka",  # aiokafka/client.py logs through logging.getLogger("aiokafka")
    "aiokafka.consumer.fetcher",
    "aiokafka.cluster",
    "aiokafka.producer.sender",
)
"""aiokafka's loggers that log the errors they retry (aiokafka 0.14's sources)."""

REPEAT_AFTER_S: Final = 60.0
"""The same retriable line is a WARNING again after this many seconds (else DEBUG)."""

MAX_LINES: Final = 1024
"""Lines remembered; past it the memory starts again (at worst one WARNING more per line)."""

_RETRIED_OS_ERRORS = (ConnectionError, TimeoutError)
"""What aiokafka's client catches and retries from a connection attempt besides Kafka errors
(``asyncio.TimeoutError`` is ``TimeoutError``); a TLS failure (``ssl.SSLError``) is neither."""


IMPLIED_ERRORS: Final[dict[str, type[BaseException]]] = {
    "Topic %s not found in cluster metadata": UnknownTopicOrPartitionError,
}
"""aiokafka's lines (message templates) that name a retried error without passing it."""


def retried_error(value: object) -> type[BaseException] | None:
    """The class of ``value`` when it is an error aiokafka retries (see the module docstring),
    an instance or, as aiokafka's metadata lines pass it, a class; else None."""
    cls = value if isinstance(value, type) else type(value)
    if not issubclass(cls, BaseException):
        return None
    if getattr(cls, "retriable", False) is True or issubclass(cls, _RETRIED_OS_ERRORS):
        return cls
    return None


class RetriableErrorLogFilter(logging.Filter):
    """An ERROR or WARNING about a retried error: a WARNING once per line per
    ``repeat_after_s``, else DEBUG.

    Args:
        clock: Monotonic seconds (``time.monotonic``; a fake clock in tests).
        repeat_after_s: Seconds after a WARNING before the same line (message template, error
            class, other arguments) is a WARNING again; the repeats in between become DEBUG
            and pass only when the logger has DEBUG enabled.
    """

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, repeat_after_s: float = REPEAT_AFTER_S
    ) -> None:
        super().__init__()
        self._clock = clock
        self._repeat_after_s = repeat_after_s
        self._warned_s: dict[tuple[str, type[BaseException], str], float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno not in (logging.ERROR, logging.WARNING):
            return True
        args = record.args if isinstance(record.args, tuple) else ()
        error = next((cls for a in args if (cls := retried_error(a)) is not None), None)
        error = error or IMPLIED_ERRORS.get(str(record.msg))
        if error is None:
            return True
        others = "|".join(str(a)[:100] for a in args if retried_error(a) is None)
        line = (str(record.msg), error, others)
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


_installed: RetriableErrorLogFilter | None = None


def quiet_retriable_errors() -> RetriableErrorLogFilter:
    """Install the filter on each of :data:`NOISY_LOGGERS` once; the installed filter (one
    object: a line's repeats are counted across loggers the same)."""
    global _installed
    if _installed is None:
        _installed = RetriableErrorLogFilter()
        for name in NOISY_LOGGERS:
            logging.getLogger(name).addFilter(_installed)
    return _installed
