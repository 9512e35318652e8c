"""``--from``/``--to`` parsing and per-partition range planning (pure, table-driven)."""

from __future__ import annotations

import pytest

from consumer.kafka.ranges import (
    AtOffsets,
    AtTime,
    Earliest,
    Latest,
    PartitionRange,
    RangeBound,
    RangeSpecError,
    Side,
    parse_bound,
    plan_partition,
)

# 2024-05-01T00:00:00Z in Unix epoch milliseconds.
MAY_1_MS = 1_714_521_600_000


@pytest.mark.parametrize(
    ("text", "side", "expected"),
    [
        ("earliest", "from", Earliest()),
        (" EARLIEST ", "from", Earliest()),
        ("now", "to", Latest()),
        ("latest", "to", Latest()),
        ("2024-05-01T00:00:00Z", "from", AtTime(MAY_1_MS)),
        ("2024-05-01T00:00:00+00:00", "to", AtTime(MAY_1_MS)),
        ("2024-05-01T02:00:00+02:00", "from", AtTime(MAY_1_MS)),
        ("2024-05-01T00:00:00.250Z", "from", AtTime(MAY_1_MS + 250)),
        ("1970-01-01T00:00:00Z", "from", AtTime(0)),
        ("0:100", "from", AtOffsets({0: 100})),
        ("0:100,1:250", "to", AtOffsets({0: 100, 1: 250})),
        (" 2 : 0 , 0 : 7 ", "from", AtOffsets({2: 0, 0: 7})),
    ],
)
def test_parse_bound_accepts(text: str, side: Side, expected: RangeBound) -> None:
    assert parse_bound(text, side) == expected


@pytest.mark.parametrize(
    ("text", "side", "message"),
    [
        ("now", "from", "neither 'earliest'"),  # a start at "now" reads nothing: refused
        ("earliest", "to", "neither 'now'"),
        ("yesterday", "from", "ISO-8601"),
        ("", "to", "ISO-8601"),
        ("2024-05-01T00:00:00", "from", "no time zone"),  # naive: ambiguous
        ("2024-05-01", "to", "no time zone"),
        ("1969-12-31T23:59:59Z", "from", "before 1970"),
        ("0:1,0:2", "from", "named twice"),
        ("0:-1", "from", "ISO-8601"),
        ("a:1", "to", "ISO-8601"),
        ("0:1,", "to", "ISO-8601"),
    ],
)
def test_parse_bound_rejects(text: str, side: Side, message: str) -> None:
    with pytest.raises(RangeSpecError, match=message):
        parse_bound(text, side)


def test_range_spec_error_is_a_value_error() -> None:
    # Settings validation turns ValueErrors into pydantic errors naming the field.
    assert issubclass(RangeSpecError, ValueError)


def _plan(
    start: int, end: int, log: tuple[int, int] = (0, 100), committed: int | None = None
) -> PartitionRange:
    return plan_partition(
        3, start_offset=start, end_offset=end, log_start=log[0], log_end=log[1],
        committed=committed,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("start", "end", "log", "committed", "expected"),
    [
        # (range_start, start, end, resumed_from)
        (0, 100, (0, 100), None, (0, 0, 100, None)),
        (10, 20, (0, 100), None, (10, 10, 20, None)),
        # clamped to the log: retention deleted the head, the end is past the log end
        (0, 500, (40, 100), None, (40, 40, 100, None)),
        (200, 300, (0, 100), None, (100, 100, 100, None)),
        # an end before the start: empty
        (50, 10, (0, 100), None, (50, 50, 50, None)),
        # resume: a committed offset inside [start, end] moves the start
        (10, 20, (0, 100), 15, (10, 15, 20, 15)),
        (10, 20, (0, 100), 10, (10, 10, 20, 10)),
        (10, 20, (0, 100), 20, (10, 20, 20, 20)),  # finished earlier: nothing left
        # a committed offset outside the range belongs to another range: ignored
        (10, 20, (0, 100), 9, (10, 10, 20, None)),
        (10, 20, (0, 100), 21, (10, 10, 20, None)),
        # an empty partition
        (0, 0, (0, 0), None, (0, 0, 0, None)),
        (0, 0, (0, 0), 0, (0, 0, 0, 0)),
    ],
)
def test_plan_partition(
    start: int,
    end: int,
    log: tuple[int, int],
    committed: int | None,
    expected: tuple[int, int, int, int | None],
) -> None:
    r = _plan(start, end, log, committed)
    assert (r.range_start, r.start, r.end, r.resumed_from) == expected
    assert r.partition == 3
    assert r.remaining == r.end - r.start
    assert r.done_before == r.start - r.range_start


def test_plan_partition_rejects_negative_offsets() -> None:
    with pytest.raises(ValueError, match="offsets must be >= 0"):
        _plan(-1, 10)
    with pytest.raises(ValueError, match="log_end=1 < log_start=5"):
        _plan(0, 10, (5, 1))


@pytest.mark.parametrize(
    ("committed", "completed", "kept"),
    [
        # resumed: offsets the earlier run finished inside (start, end) are kept
        (12, {13, 15, 19}, {13, 15, 19}),
        (12, {12, 20, 25}, set()),  # at the start or at/past the end: not ours
        # a committed offset outside the range: its metadata is another range's too
        (30, {31}, set()),
        (None, {13}, set()),
    ],
)
def test_plan_partition_keeps_the_completed_offsets_of_its_own_resume(
    committed: int | None, completed: set[int], kept: set[int]
) -> None:
    r = plan_partition(
        3, start_offset=10, end_offset=20, log_start=0, log_end=100, committed=committed,
        completed=frozenset(completed),
    )  # fmt: skip
    assert r.completed == kept
