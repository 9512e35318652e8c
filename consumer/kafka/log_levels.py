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
error (an ACL denial, a TLS failure) stays an ERROR, and so do kbatch's own error lines.
Kafka's Java client logs the unknown topic at WARN too (``Error while fetching metadata
… UNKNOWN_TOPIC_OR_PARTITION``); a topic that stays missing (``serve --no-create-topics``
before the topic is made) is still a WARNING a minute. Measured on the three-node cluster,
one node SIGKILLed for 20 s under a producer and a consumer: 273 ERROR and 82 WARNING lines
from aiokafka before, 0 ERROR and 2–3 WARNING lines after (``tests/chaos/test_cluster_faults.py``).

aiokafka's ``Unable to update metadata from [1]`` (:data:`OUTAGE_LINES`: no broker answered a
metadata request at all) is retried too, every ``retry_backoff_ms``, and each failure was an
ERROR: with the only broker SIGKILLed for 17 s and restarted, a serve wrote it 884 times in the
~33 s until the broker answered again, and now one WARNING (kbatch f593dfd and after,
2026-12-03, this project's 2-vCPU machine, ``tests/integration/test_serve_faults.py -k
only_broker``). It is an outage, not a fault of one
request: a WARNING when it begins, a WARNING a minute while it lasts, and one ERROR once it has
lasted :data:`OUTAGE_ERROR_AFTER_S` (the cluster has not served for a minute: an operator's
matter), the line then naming how long; an outage ends when its line has not come for
``repeat_after_s`` (aiokafka does not log the next successful update).

:func:`quiet_retriable_errors` installs one filter on each logger of :data:`NOISY_LOGGERS` (a
filter on a parent logger would not see its children's records); idempotent. The
coordinator's lines appear on a single broker too, the rest when a cluster node is down.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from aiokafka.errors import UnknownTopicOrPartitionError

__all__ = [
    "COORDINATOR_LOGGER",
    "NOISY_LOGGERS",
    "OUTAGE_ERROR_AFTER_S",
    "OUTAGE_LINES",
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

OUTAGE_LINES: Final = frozenset({"Unable to update metadata from %s"})
"""aiokafka's lines (message templates; aiokafka 0.14's client) that say no broker answered:
one outage per line whatever its arguments (the node ids, shuffled on each try)."""

OUTAGE_ERROR_AFTER_S: Final = 60.0
"""An outage line is one ERROR once the outage has lasted this many seconds."""

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
    ``repeat_after_s``, else DEBUG; an outage line (:data:`OUTAGE_LINES`) the same, plus one
    ERROR once the outage has lasted ``outage_error_after_s``.

    Args:
        clock: Monotonic seconds (``time.monotonic``; a fake clock in tests).
        repeat_after_s: Seconds after a WARNING before the same line (message template, error
            class, other arguments) is a WARNING again; the repeats in between become DEBUG
            and pass only when the logger has DEBUG enabled; also how long an outage line may
            stay away before its next one begins a new outage.
        outage_error_after_s: Seconds of an outage (:data:`OUTAGE_LINES`) before its one ERROR.
    """

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        repeat_after_s: float = REPEAT_AFTER_S,
        outage_error_after_s: float = OUTAGE_ERROR_AFTER_S,
    ) -> None:
        super().__init__()
        self._clock = clock
        self._repeat_after_s = repeat_after_s
        self._outage_error_after_s = outage_error_after_s
        self._warned_s: dict[tuple[str, type[BaseException], str], float] = {}
        self._outages: dict[str, _Outage] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno not in (logging.ERROR, logging.WARNING):
            return True
        if str(record.msg) in OUTAGE_LINES:
            return self._outage(record)
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
        return _relevel(record, level)

    def _outage(self, record: logging.LogRecord) -> bool:
        """An :data:`OUTAGE_LINES` record: WARNING at the start and once a minute, one ERROR
        once the outage has lasted ``outage_error_after_s``, DEBUG in between."""
        now_s = self._clock()
        outage = self._outages.get(str(record.msg))
        if outage is None or now_s - outage.last_s >= self._repeat_after_s:  # a new outage
            outage = self._outages[str(record.msg)] = _Outage(since_s=now_s, last_s=now_s)
        outage.last_s = now_s
        lasted_s = now_s - outage.since_s
        if not outage.errored and lasted_s >= self._outage_error_after_s:
            outage.errored, outage.warned_s = True, now_s
            level = logging.ERROR
        elif outage.warned_s is None or now_s - outage.warned_s >= self._repeat_after_s:
            outage.warned_s = now_s
            level = logging.WARNING
        else:
            level = logging.DEBUG
        if level > logging.DEBUG and lasted_s > 0:
            args = record.args if isinstance(record.args, tuple) else ()
            record.msg, record.args = f"{record.msg} (for %.0f s)", (*args, lasted_s)
        return _relevel(record, level)


@dataclass(slots=True)
class _Outage:
    """One outage line's run: since and last seen (monotonic s), last WARNING, ERROR said."""

    since_s: float
    last_s: float
    warned_s: float | None = None
    errored: bool = False


def _relevel(record: logging.LogRecord, level: int) -> bool:
    """Give ``record`` ``level``; whether its logger lets that level through."""
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
