"""kbatch_time_to_drain_seconds: backlog over the recent reply rate (fake clock values)."""

from __future__ import annotations

import pytest

from consumer.serve.metrics import DrainEstimate, Metrics


def test_no_backlog_drains_in_zero_seconds() -> None:
    assert DrainEstimate().observe(0.0, 0.0, 0.0) == 0.0


def test_a_backlog_with_no_reply_yet_reads_the_cap() -> None:
    d = DrainEstimate(cap_s=3600.0)
    assert d.observe(0.0, 0.0, 100.0) == 3600.0
    assert d.observe(5.0, 0.0, 100.0) == 3600.0  # stalled: scale up


def test_backlog_over_the_rate_of_the_window() -> None:
    d = DrainEstimate(window_s=60.0)
    d.observe(0.0, 0.0, 500.0)
    assert d.observe(10.0, 100.0, 500.0) == pytest.approx(50.0)  # 10 replies/s
    # The first sample leaves the window: the rate is that of the last 60 s only.
    d.observe(60.0, 200.0, 500.0)
    assert d.observe(70.0, 700.0, 500.0) == pytest.approx(500.0 / ((700 - 100) / 60))


def test_the_gauge_sums_every_partitions_lag() -> None:
    m = Metrics()
    m.lag.labels("t", "0").set(300)
    m.lag.labels("t", "1").set(100)
    m.refresh(1.0)
    m.reply_status("ok").inc(40)
    m.refresh(3.0)  # 40 replies in 2 s: 20/s
    assert m.registry.get_sample_value("kbatch_time_to_drain_seconds") == pytest.approx(20.0)
