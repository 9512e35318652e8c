"""The ranges of ``kbatch backfill`` and backfill jobs, pure (no I/O, no Kafka client): both
adapters' range readers resolve and plan with them (:mod:`consumer.kafka.range_source`,
:mod:`consumer.kafka.confluent_adapter.range_source`).

:func:`parse_bound` turns ``--from``/``--to`` text into a :data:`RangeBound`;
:func:`bound_offsets` resolves one side against the offsets the broker gave;
:func:`plan_partition` turns resolved offsets and the group's committed offset into a
:class:`PartitionRange`. Table-tested without a broker.

Ranges are half-open, ``[start, end)`` per partition, in offsets:

==================  =====================================================================
bound               offset it resolves to
==================  =====================================================================
``earliest``        the partition's log start offset (``--from`` only)
``now``/``latest``  the end offset at start (the last stable offset: reads are
                    ``read_committed``) (``--to`` only)
ISO-8601 time       the first offset whose timestamp is at or after the time
                    (``offsets_for_times``, KIP-79); the log end when there is none. So
                    ``--from T1 --to T2`` reads records stamped in ``[T1, T2)`` when timestamps
                    grow with offsets (LogAppendTime, or producers with sane clocks).
``P:OFFSET,…``      that offset for partition ``P``; partitions not named take the default
                    (``earliest`` for ``--from``, ``now`` for ``--to``)
==================  =====================================================================

Resuming: the job commits under its own consumer group (manual assignment: no group
membership, no rebalance). A committed offset inside ``[start, end]`` moves the start there;
one outside the range (an older job's) is ignored. The offsets the earlier run finished above
its committed one (the commit's metadata) are skipped, not scored again. Offsets below the log
start (deleted by retention since) are clamped to it; ends above the log end to it.

Errors raised: :class:`RangeSpecError` (a ``ValueError``) for unparseable bounds or a partition
the topic does not have.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from consumer.kafka.errors import RangeSpecError

__all__ = [
    "AtOffsets",
    "AtTime",
    "Earliest",
    "Latest",
    "PartitionRange",
    "RangeBound",
    "RangeSpecError",
    "Side",
    "bound_offsets",
    "parse_bound",
    "plan_partition",
]

Side = Literal["from", "to"]
"""Which side of a range a bound is: ``--from`` or ``--to``."""


# ---- pure: bounds ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Earliest:
    """The log start offset of each partition."""


@dataclass(frozen=True, slots=True)
class Latest:
    """The end offset of each partition, taken once at start."""


@dataclass(frozen=True, slots=True)
class AtTime:
    """The first offset stamped at or after ``timestamp_ms`` (Unix epoch milliseconds)."""

    timestamp_ms: int


@dataclass(frozen=True, slots=True)
class AtOffsets:
    """Explicit offsets per partition; partitions not named take the side's default."""

    offsets: Mapping[int, int] = field(default_factory=dict)


RangeBound = Earliest | Latest | AtTime | AtOffsets
"""One side of a range, before it is resolved against the broker."""

_PARTITION_OFFSET = re.compile(r"\s*(\d+)\s*:\s*(\d+)\s*")


def parse_bound(text: str, side: Side) -> RangeBound:
    """Parse one side of a range.

    ``--from``: ``earliest`` | ISO-8601 time with a zone (``2024-05-01T00:00:00Z``,
    ``…+02:00``) | ``P:OFFSET,…``. ``--to``: ``now`` (or ``latest``) | ISO-8601 time |
    ``P:OFFSET,…`` (the first offset *not* read).

    Raises:
        RangeSpecError: an unknown word, a time without a zone (ambiguous), a malformed or
            repeated ``P:OFFSET`` entry, or a negative number.
    """
    value = text.strip()
    word = value.lower()
    if side == "from" and word == "earliest":
        return Earliest()
    if side == "to" and word in ("now", "latest"):
        return Latest()
    if ":" in value and all(_PARTITION_OFFSET.fullmatch(p) for p in value.split(",")):
        offsets: dict[int, int] = {}
        for part in value.split(","):
            m = _PARTITION_OFFSET.fullmatch(part)
            assert m is not None
            partition, offset = int(m.group(1)), int(m.group(2))
            if partition in offsets:
                raise RangeSpecError(f"--{side} {text!r}: partition {partition} is named twice")
            offsets[partition] = offset
        return AtOffsets(offsets)
    try:
        moment = dt.datetime.fromisoformat(value)
    except ValueError:
        words = "earliest" if side == "from" else "now"
        raise RangeSpecError(
            f"--{side} {text!r} is neither {words!r}, an ISO-8601 time "
            "(2024-05-01T12:00:00Z) nor a P:OFFSET list (0:100,1:250)"
        ) from None
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise RangeSpecError(
            f"--{side} {text!r} has no time zone: add Z (UTC) or an offset such as +02:00"
        )
    timestamp_ms = (moment - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(milliseconds=1)
    if timestamp_ms < 0:
        raise RangeSpecError(f"--{side} {text!r} is before 1970 (Kafka timestamps are >= 0)")
    return AtTime(timestamp_ms)


def bound_offsets(
    bound: RangeBound,
    side: Side,
    topic: str,
    log_start: Mapping[int, int],
    log_end: Mapping[int, int],
    by_time: Mapping[int, int | None],
) -> dict[int, int]:
    """Partition → the offset one side's ``bound`` resolves to (pure): ``log_start`` /
    ``log_end`` per partition (their keys are the topic's partitions); ``by_time`` the first
    offset at or after an :class:`AtTime` bound's time (None: none, the log end).

    Raises:
        RangeSpecError: an :class:`AtOffsets` bound names a partition the topic does not have.
    """
    parts = sorted(log_start)
    default = log_start if side == "from" else log_end
    if isinstance(bound, Earliest):
        return {p: log_start[p] for p in parts}
    if isinstance(bound, Latest):
        return {p: log_end[p] for p in parts}
    if isinstance(bound, AtOffsets):
        unknown = sorted(set(bound.offsets) - set(parts))
        if unknown:
            raise RangeSpecError(
                f"--{side}: topic {topic!r} has no partition(s) {unknown} (it has {len(parts)})"
            )
        return {p: bound.offsets.get(p, default[p]) for p in parts}
    out: dict[int, int] = {}
    for p in parts:
        hit = by_time.get(p)
        out[p] = log_end[p] if hit is None else hit
    return out


# ---- pure: plan ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PartitionRange:
    """What one partition contributes to a job; offsets are half-open ``[start, end)``.

    Attributes:
        partition: the partition number.
        range_start: where the range begins (the ``--from`` bound, clamped to the log).
        start: where reading begins: ``range_start``, or the committed offset when resuming.
        end: the first offset not read (the ``--to`` bound, clamped to the log).
        resumed_from: the group's committed offset when it moved ``start``, else None.
        log_start / log_end: the partition's log start and end offsets at start.
        completed: offsets in ``[start, end)`` an earlier run finished above its committed
            offset (its commit metadata, :mod:`consumer.kafka.offset_metadata`): skipped.
    """

    partition: int
    range_start: int
    start: int
    end: int
    resumed_from: int | None
    log_start: int
    log_end: int
    completed: frozenset[int] = frozenset()

    @property
    def remaining(self) -> int:
        """Offsets left to read (an upper bound on records: compaction leaves gaps)."""
        return max(0, self.end - self.start)

    @property
    def done_before(self) -> int:
        """Offsets of the range finished by an earlier run (0 when not resumed)."""
        return max(0, min(self.start, self.end) - self.range_start)


def plan_partition(
    partition: int,
    *,
    start_offset: int,
    end_offset: int,
    log_start: int,
    log_end: int,
    committed: int | None,
    completed: frozenset[int] = frozenset(),
) -> PartitionRange:
    """The range of one partition from its resolved bounds (pure).

    ``start_offset``/``end_offset`` are the resolved ``--from``/``--to`` offsets; both are
    clamped to ``[log_start, log_end]`` and an end below the start makes the range empty. A
    ``committed`` offset in ``[start, end]`` (this group's earlier run of the same range) moves
    the start to it; outside that interval it belongs to another range and is ignored, and so
    are the ``completed`` offsets read with it (only those inside ``(start, end)`` are kept).

    Raises:
        ValueError: a negative offset, or ``log_end < log_start``.
    """
    if min(start_offset, end_offset, log_start, log_end) < 0:
        raise ValueError(
            f"partition {partition}: offsets must be >= 0 (start={start_offset}, "
            f"end={end_offset}, log_start={log_start}, log_end={log_end})"
        )
    if log_end < log_start:
        raise ValueError(f"partition {partition}: log_end={log_end} < log_start={log_start}")
    range_start = min(max(start_offset, log_start), log_end)
    end = max(min(end_offset, log_end), range_start)
    start = range_start
    resumed: int | None = None
    if committed is not None and range_start <= committed <= end:
        start = resumed = committed
    return PartitionRange(
        partition=partition,
        range_start=range_start,
        start=start,
        end=end,
        resumed_from=resumed,
        log_start=log_start,
        log_end=log_end,
        completed=frozenset(o for o in completed if start < o < end) if resumed else frozenset(),
    )
