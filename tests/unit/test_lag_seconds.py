"""kbatch_lag_seconds / kbatch_partition_lag_seconds: lag over the recent answer rate, per
partition and for the member (fake clock values: monotonic seconds passed in)."""

from __future__ import annotations

import pytest

from consumer.serve.lag_seconds import LagSeconds
from consumer.serve.metrics import Metrics

A, B = ("req", 0), ("req", 1)


@pytest.mark.parametrize(
    ("samples", "expected_s"),
    [
        # (now_s, lag base offset, lag records) per refresh → the last refresh's lag seconds
        ([(0.0, 0, 0)], 0.0),  # no backlog: 0, whatever the rate
        ([(0.0, 0, 100)], 3600.0),  # a backlog, one sample: no rate yet → the cap
        ([(0.0, 0, 100), (5.0, 0, 120)], 3600.0),  # nothing answered in the window → the cap
        ([(0.0, 0, 500), (10.0, 100, 500)], 50.0),  # 10 answered/s, 500 behind
        ([(0.0, 0, 500), (10.0, 100, 0)], 0.0),  # caught up
        ([(0.0, 0, 10**9), (1.0, 1, 10**9)], 3600.0),  # longer than the cap → the cap
        # the window is 60 s: the sample at 0 leaves it once one at >= 10 s is older than 60 s
        ([(0.0, 0, 500), (10.0, 100, 500), (70.0, 700, 500), (80.0, 1300, 600)], 600 / 17.1428571),
        # rewound (a recovered transaction): the window restarts, so no negative rate
        ([(0.0, 500, 100), (10.0, 600, 100), (11.0, 400, 100)], 3600.0),
    ],
)
def test_lag_seconds_of_one_partition(
    samples: list[tuple[float, int, int]], expected_s: float
) -> None:
    windows = LagSeconds(window_s=60.0, cap_s=3600.0)
    for now_s, base, lag in samples:
        seconds = windows.observe(now_s, A, base, lag)
    assert seconds == pytest.approx(expected_s, rel=1e-4)
    assert windows.partition(A) == seconds


def test_the_members_value_is_the_summed_lag_over_the_summed_rate() -> None:
    windows = LagSeconds(window_s=60.0)
    windows.observe(0.0, A, 0, 300)
    windows.observe(0.0, B, 0, 100)
    windows.observe(10.0, A, 200, 300)  # 20 answered/s: 15 s for A alone
    windows.observe(10.0, B, 0, 100)  # stuck: the cap for B alone
    assert windows.partition(A) == pytest.approx(15.0)
    assert windows.partition(B) == windows.cap_s
    assert windows.total() == pytest.approx(400 / 20)  # the member still answers 20/s
    windows.forget(A)  # A moved away: its rate and lag leave the member's value
    assert windows.total() == windows.cap_s


def test_the_gauges_follow_each_refresh_and_a_moved_partition_leaves() -> None:
    m = Metrics()
    m.show_lag(0.0, {A: (0, 300), B: (0, 100)})
    m.show_lag(2.0, {A: (40, 300), B: (0, 100)})  # A: 40 answered in 2 s
    value = m.registry.get_sample_value
    assert value("kbatch_consumer_lag", {"topic": "req", "partition": "0"}) == 300
    assert value("kbatch_partition_lag_seconds", {"topic": "req", "partition": "0"}) == 15.0
    assert value("kbatch_partition_lag_seconds", {"topic": "req", "partition": "1"}) == 86_400
    assert value("kbatch_lag_seconds") == pytest.approx(400 / 20)
    m.forget_partition(B)
    assert value("kbatch_partition_lag_seconds", {"topic": "req", "partition": "1"}) is None
    m.show_lag(4.0, {A: (80, 300)})
    assert value("kbatch_lag_seconds") == pytest.approx(300 / 20)
