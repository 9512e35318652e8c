"""Load-report math: percentiles, rates, batch figures, the knee of a sweep, burst recovery."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from producer_tools.arrivals import arrival_times, constant_profile, pulse_profile, step_profile
from producer_tools.report import (
    Outcome,
    RunLog,
    build_report,
    error_rate,
    find_knee,
    knee_line,
    latency_summary,
)


def test_latency_summary_matches_linear_interpolation() -> None:
    s = latency_summary(np.arange(1, 101, dtype=float))
    assert s == {"count": 100, "mean": 50.5, "p50": 50.5, "p95": 95.05, "p99": 99.01, "max": 100}


def test_latency_summary_ignores_nan_and_handles_empty() -> None:
    assert latency_summary([np.nan, 3.0])["p99"] == 3.0
    assert latency_summary([]) == {
        "count": 0, "mean": None, "p50": None, "p95": None, "p99": None, "max": None,
    }  # fmt: skip


def _answer_all(log: RunLog, latency_s: Any, *, batch: int = 4, padded: int = 16) -> RunLog:
    log.sent_s[:] = log.intended_s
    log.received_s[:] = log.intended_s + latency_s
    log.outcome[:] = Outcome.OK
    log.batch_size[:] = batch
    log.padded_len[:] = padded
    log.queue_ms[:] = 1.0
    log.infer_ms[:] = np.arange(log.intended_s.size) // batch  # one value per batch
    return log


def test_constant_run_rates_latency_and_batches() -> None:
    sched = arrival_times(constant_profile(50, 4))
    log = _answer_all(RunLog.empty(sched.times_s), 0.010)
    r = build_report(log, sched, pattern="constant", boundary_tokens=[(0, 0), (900, 1000)])
    s = r["summary"]
    assert s["offered_rate_per_s"] == 50 and s["achieved_send_rate_per_s"] == 50
    assert s["reply_throughput_per_s"] == pytest.approx(50, rel=0.01)
    assert s["latency_ms"]["p50"] == pytest.approx(10) and s["latency_ms"]["max"] == pytest.approx(
        10
    )
    assert s["ok"] == 200 and s["timeouts"] == 0
    assert s["batch_size_mean"] == 4 and s["batches"] == 50 and s["padded_len_mean"] == 16
    assert s["padding_efficiency"] == 0.9
    assert r["phases"] == [s]


def test_a_lagging_sender_shows_a_lower_achieved_rate() -> None:
    sched = arrival_times(constant_profile(100, 2))
    log = _answer_all(RunLog.empty(sched.times_s), 0.001)
    log.sent_s[:] = log.intended_s * 2  # sends spread over twice the time
    s = build_report(log, sched, pattern="constant")["summary"]
    assert s["offered_rate_per_s"] == 100
    assert s["achieved_send_rate_per_s"] == pytest.approx(50, rel=0.02)
    assert s["send_lag_ms"]["max"] == pytest.approx(1990)


def test_outcomes_are_counted_and_latency_only_over_replies() -> None:
    sched = arrival_times(constant_profile(10, 1))
    log = _answer_all(RunLog.empty(sched.times_s), 0.005)
    log.outcome[0] = Outcome.ERROR
    log.outcome[1] = Outcome.EXPIRED
    log.outcome[2] = Outcome.TIMEOUT
    log.received_s[2] = np.nan
    log.outcome[3] = Outcome.SEND_FAILED
    log.received_s[3] = np.nan
    s = build_report(log, sched, pattern="constant")["summary"]
    assert (s["ok"], s["errors"], s["expired"], s["timeouts"], s["send_failures"]) == (
        6,
        1,
        1,
        1,
        1,
    )
    assert s["answered"] == 8 and s["latency_ms"]["count"] == 8
    assert error_rate(s) == pytest.approx(3 / 10)  # error + timeout + send failure; not expired


def test_error_rate_of_an_empty_window_is_zero() -> None:
    assert error_rate({"scheduled": 0, "timeouts": 0, "errors": 0, "send_failures": 0}) == 0.0


def _step_rows(offered: list[float], thr: list[float], p99: list[float]) -> list[dict[str, Any]]:
    return [
        {"offered_rate_per_s": o, "reply_throughput_per_s": t, "timeouts": 0,
         "latency_ms": {"p99": p}}
        for o, t, p in zip(offered, thr, p99, strict=True)
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("thr", "knee", "saturated"),
    [
        ([10, 20, 40, 80], 4, None),  # kept up everywhere
        ([10, 20, 33, 34], 2, 3),  # 33 < 0.9 x 40
        ([10, 20, 36, 40], 3, 4),  # 36 = 0.9 x 40 still keeps up
        ([5, 20, 40, 80], None, 1),  # saturated from the start
    ],
)
def test_find_knee(thr: list[float], knee: int | None, saturated: int | None) -> None:
    k = find_knee(_step_rows([10, 20, 40, 80], thr, [10, 12, 50, 900]))
    assert k["knee_step"] == knee and k["first_saturated_step"] == saturated
    assert k["max_throughput_per_s"] == max(thr)
    assert k["p99_growth"] == 90


@pytest.mark.parametrize(
    ("thr", "words"),
    [
        ([10, 20, 40, 80], "knee: step 4 at 80/s offered (80 replies/s, p99 900 ms); no step "),
        ([5, 20, 40, 80], "knee: none (even the first step saturated the server); first "),
        ([10, 20, 33, 34], "knee: step 2 at 20/s offered (20 replies/s, p99 12 ms); first "),
    ],
)
def test_the_knee_line_says_none_in_words(thr: list[float], words: str) -> None:
    """Regression: the report read "first saturated step None" after a sweep that kept up."""
    line = knee_line(find_knee(_step_rows([10, 20, 40, 80], thr, [10, 12, 50, 900])))
    assert line.startswith(words) and "None" not in line


def test_step_report_has_a_row_per_step_and_finds_the_knee() -> None:
    sched = arrival_times(step_profile([10, 20, 40], 5))
    log = RunLog.empty(sched.times_s)
    # A server that does 25/s: replies leave one every 40 ms in send order, at the earliest.
    rx = np.empty(len(sched))
    free = 0.0
    for i, t in enumerate(sched.times_s):
        free = max(free, t) + 0.04
        rx[i] = free
    log = _answer_all(log, rx - sched.times_s)
    r = build_report(log, sched, pattern="step")
    rows = r["phases"]
    assert [row["name"] for row in rows] == ["step 1 @ 10/s", "step 2 @ 20/s", "step 3 @ 40/s"]
    assert [row["offered_rate_per_s"] for row in rows] == [10, 20, 40]
    assert rows[2]["reply_throughput_per_s"] == pytest.approx(25, rel=0.05)
    assert r["knee"]["knee_step"] == 2 and r["knee"]["first_saturated_step"] == 3
    assert rows[2]["latency_ms"]["p99"] > 10 * rows[1]["latency_ms"]["p99"]


def test_pulse_report_during_after_and_recovery() -> None:
    sched = arrival_times(pulse_profile(10, 20, burst_factor=5, burst_s=2, period_s=10))
    lat = np.full(len(sched), 0.010)
    t = sched.times_s
    lat[(t >= 5) & (t < 7)] = 0.200  # the burst queues
    lat[(t >= 7) & (t < 8)] = 0.100  # and drains within 1 s
    log = _answer_all(RunLog.empty(t), lat)
    r = build_report(log, sched, pattern="pulse", after_s=4)
    assert [p["name"] for p in r["phases"]] == ["base", "burst", "after burst"]
    assert r["baseline_p99_ms"] == pytest.approx(10)
    b1 = r["bursts"][0]
    assert b1["p99_during_ms"] == pytest.approx(200)
    assert b1["p99_after_ms"] == pytest.approx(100)
    assert b1["recovery_s"] == pytest.approx(0.9)  # the last slow send is at 7.9 s
    assert r["bursts"][1]["recovery_s"] == 0.0


def test_stages_split_each_request_latency() -> None:
    from producer_tools.report import STAGES, stage_times_ms

    sched = arrival_times(constant_profile(50, 2))
    log = RunLog.empty(sched.times_s)
    n = log.intended_s.size
    log.sent_s[:] = log.intended_s + 0.002  # 2 ms send lag
    log.queue_ms[:] = 30.0
    log.infer_ms[:] = 20.0
    log.reply_ts_s[:] = log.sent_s + 0.005 + 0.050  # 5 ms intake, then queue + forward
    log.received_s[:] = log.reply_ts_s + 0.004  # 4 ms back to the client
    log.outcome[:] = Outcome.OK
    log.batch_size[:] = 4
    times = stage_times_ms(log)
    assert tuple(times) == STAGES
    total = sum(times[s] for s in STAGES)
    np.testing.assert_allclose(total, log.latency_ms)  # the stages add up to the latency
    s = build_report(log, sched, pattern="constant")["summary"]["stages_ms"]
    expected = {"send_lag": 2.0, "intake": 5.0, "queue": 30.0, "forward": 20.0, "reply": 4.0}
    for stage, ms in expected.items():
        assert s[stage]["p50"] == pytest.approx(ms, abs=1e-6), stage
    assert n == 100


def test_stages_are_unknown_without_a_reply_timestamp() -> None:
    sched = arrival_times(constant_profile(50, 1))
    log = _answer_all(RunLog.empty(sched.times_s), 0.010)
    stages = build_report(log, sched, pattern="constant")["summary"]["stages_ms"]
    assert stages["intake"]["p50"] is None and stages["reply"]["p99"] is None
    assert stages["queue"]["p50"] == 1.0
