"""The chaos history checker: lost, duplicate, G1a, unseen and latency from small histories."""

from __future__ import annotations

import math

import pytest

from tests.chaos.history import History, quantile


def history(acked: dict[bytes, float]) -> History:
    h = History()
    for key, at in acked.items():
        h.acked(key, at)
    return h


def test_a_clean_run_has_nothing_to_report() -> None:
    h = history({b"a": 1.0, b"b": 2.0})
    h.seen(b"a", 0, 0, 1.5)
    h.seen(b"b", 0, 1, 2.25)
    h.final([(b"a", 0, 0), (b"b", 0, 1)])
    v = h.check()
    assert v.summary() == {
        "acked": 2,
        "lost": 0,
        "duplicates": 0,
        "g1a": 0,
        "unseen": 0,
        "latency_p50_s": 0.25,
        "latency_p99_s": 0.5,
        "latency_max_s": 0.5,
    }


def test_an_acked_request_without_a_final_reply_is_lost_and_an_unacked_one_is_not() -> None:
    h = history({b"a": 1.0, b"b": 1.0})
    h.seen(b"a", 0, 0, 2.0)
    h.seen(b"x", 0, 1, 2.0)  # sent, its ack never came: answered, and that is fine
    h.final([(b"a", 0, 0), (b"x", 0, 1)])
    v = h.check()
    assert v.lost == {b"b"}
    assert v.unseen == frozenset()


def test_two_reply_records_for_one_key_are_a_duplicate_but_one_record_read_twice_is_not() -> None:
    h = history({b"a": 1.0, b"b": 1.0})
    h.seen(b"a", 0, 0, 2.0)
    h.seen(b"a", 0, 0, 3.0)  # the live reader re-read after a reconnect: same record
    h.seen(b"b", 0, 1, 2.0)
    h.final([(b"a", 0, 0), (b"b", 0, 1), (b"b", 1, 7), (b"b", 1, 9)])
    v = h.check()
    assert v.duplicates == {b"b": 3}
    assert v.summary()["duplicates"] == 2
    assert v.latency_max_s == 1.0  # from the first sighting


def test_a_live_reply_from_an_aborted_transaction_is_g1a() -> None:
    h = history({b"a": 1.0})
    h.seen(b"a", 0, 0, 2.0)  # the aborted attempt, seen by a broken read_committed reader
    h.seen(b"a", 0, 2, 3.0)
    h.final([(b"a", 0, 2)])
    h.aborted([(0, 0), (0, 1)])
    v = h.check()
    assert v.g1a == {(0, 0)}
    assert not v.lost and not v.duplicates


def test_a_final_reply_the_live_reader_never_saw_is_unseen() -> None:
    h = history({b"a": 1.0})
    h.final([(b"a", 0, 0)])
    v = h.check()
    assert v.unseen == {b"a"}
    assert not v.lost
    assert math.isnan(v.latency_p99_s)


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [([], 0.5, math.nan), ([3.0], 0.99, 3.0), ([1, 2, 3, 4], 0.5, 2), ([*range(1, 101)], 0.99, 99)],
)
def test_quantile_by_nearest_rank(values: list[float], q: float, expected: float) -> None:
    got = quantile(values, q)
    assert (math.isnan(got) and math.isnan(expected)) or got == expected
