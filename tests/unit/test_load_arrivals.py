"""Arrival schedules of ``kbatch load``: rates, bursts, steps, warm-up, counts (seeded, pure)."""

from __future__ import annotations

import numpy as np
import pytest

from producer_tools import arrivals
from producer_tools.arrivals import (
    Segment,
    arrival_times,
    constant_profile,
    pulse_profile,
    step_profile,
    with_warmup,
)
from producer_tools.load import LoadOptions, build_schedule


def test_constant_is_evenly_spaced_from_zero() -> None:
    s = arrival_times(constant_profile(50, 4))
    assert len(s) == 200
    assert s.times_s[0] == 0.0
    np.testing.assert_allclose(np.diff(s.times_s), 0.02)
    assert s.end_s == 4


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_poisson_rate_within_3_percent_and_exponential_gaps(seed: int) -> None:
    s = arrival_times(constant_profile(100, 200), poisson=True, rng=np.random.default_rng(seed))
    assert abs(len(s) / 200 - 100) / 100 < 0.03
    gaps = np.diff(s.times_s)
    assert abs(gaps.mean() - 0.01) / 0.01 < 0.03
    assert abs(gaps.std() / gaps.mean() - 1.0) < 0.05  # exponential: CV = 1
    assert np.all(gaps >= 0) and s.times_s[-1] < 200


def test_poisson_is_reproducible_from_its_seed() -> None:
    a = arrival_times(constant_profile(30, 10), poisson=True, rng=np.random.default_rng(7))
    b = arrival_times(constant_profile(30, 10), poisson=True, rng=np.random.default_rng(7))
    c = arrival_times(constant_profile(30, 10), poisson=True, rng=np.random.default_rng(8))
    np.testing.assert_array_equal(a.times_s, b.times_s)
    assert len(a) != len(c) or not np.array_equal(a.times_s, c.times_s)


def test_step_sweep_has_each_rate_in_its_step() -> None:
    s = arrival_times(step_profile([5, 10, 20, 40], 2.0))
    counts = np.bincount(s.segment_index, minlength=4)
    assert counts.tolist() == [10, 20, 40, 80]
    for k, seg in enumerate(s.segments):
        t = s.times_s[s.segment_index == k]
        assert np.all((t >= seg.start_s) & (t < seg.end_s))
        np.testing.assert_allclose(np.diff(t), 1 / seg.rate_per_s)


def test_pulse_profile_places_bursts_where_stated() -> None:
    segs = pulse_profile(10, 30, burst_factor=5, burst_s=2, period_s=10)
    assert [(s.phase, s.start_s, s.end_s, s.rate_per_s) for s in segs] == [
        ("base", 0, 5, 10),
        ("burst", 5, 7, 50),
        ("base", 7, 15, 10),
        ("burst", 15, 17, 50),
        ("base", 17, 25, 10),
        ("burst", 25, 27, 50),
        ("base", 27, 30, 10),
    ]
    s = arrival_times(segs)
    t = s.times_s
    for start in (5, 15, 25):
        assert ((t >= start) & (t < start + 2)).sum() == 100  # 5 x 10/s for 2 s
        assert ((t >= start - 2) & (t < start)).sum() == 20  # base before
    assert len(s) == 3 * 100 + 24 * 10


def test_pulse_poisson_bursts_within_tolerance() -> None:
    segs = pulse_profile(20, 100, burst_factor=4, burst_s=5, period_s=20)
    s = arrival_times(segs, poisson=True, rng=np.random.default_rng(3))
    burst = np.array([g.phase == "burst" for g in s.segments])[s.segment_index]
    burst_s = sum(g.duration_s for g in s.segments if g.phase == "burst")
    base_s = 100 - burst_s
    assert abs(burst.sum() / burst_s - 80) / 80 < 0.1
    assert abs((~burst).sum() / base_s - 20) / 20 < 0.1


def test_a_burst_is_cut_at_the_end_of_the_run() -> None:
    segs = pulse_profile(10, 6, burst_factor=2, burst_s=2, period_s=10, first_burst_s=5)
    assert segs[-1] == Segment(5, 6, 20, "burst", 0)


def test_warmup_is_prepended_and_excluded_from_measured() -> None:
    segs = with_warmup(step_profile([10, 20], 1.0), 0.5)
    assert segs[0] == Segment(0.0, 0.5, 10, "warmup")
    assert segs[1].start_s == 0.5 and segs[-1].end_s == 2.5
    s = arrival_times(segs)
    assert int((~s.measured).sum()) == 5
    assert int(s.measured.sum()) == 30


def test_max_count_truncates_and_shortens_the_run() -> None:
    s = arrival_times(constant_profile(10, 100), max_count=5)
    assert len(s) == 5 and s.end_s == pytest.approx(0.5)


def test_count_bounded_poisson_extends_to_the_count() -> None:
    s = arrival_times(
        constant_profile(10, 1),
        poisson=True,
        rng=np.random.default_rng(0),
        max_count=500,
        extend=True,
    )
    assert len(s) == 500
    assert s.end_s > s.times_s[-1] and s.end_s == pytest.approx(50, rel=0.15)


def test_rate_change_takes_effect_at_the_boundary() -> None:
    s = arrival_times([Segment(0, 1.05, 10, "step", 0), Segment(1.05, 2, 100, "step", 1)])
    # Λ(1.05) = 10.5: the 11th arrival (Λ = 11) comes 0.5/100 s after the boundary.
    assert s.times_s[11] == pytest.approx(1.055)
    assert s.segment_index[10] == 0 and s.segment_index[11] == 1


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: constant_profile(0, 1), "rate_per_s"),
        (lambda: constant_profile(5, float("inf")), "duration_s"),
        (lambda: step_profile([], 1), "at least one rate"),
        (lambda: step_profile([1, -2], 1), "every step rate"),
        (lambda: pulse_profile(1, 10, burst_factor=2, burst_s=5, period_s=5), "shorter"),
        (
            lambda: pulse_profile(1, 10, burst_factor=2, burst_s=1, period_s=5, first_burst_s=10),
            "first_burst_s",
        ),
        (lambda: with_warmup(constant_profile(1, 1), -1), "warmup_s"),
        (lambda: arrival_times([Segment(0, 1, 1, "a"), Segment(2, 3, 1, "b")]), "contiguous"),
        (lambda: arrival_times(constant_profile(1, 1), extend=True), "max_count"),
    ],
)
def test_invalid_profiles_raise(call: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()  # type: ignore[operator]


def _opts(**kw: object) -> LoadOptions:
    return LoadOptions(bootstrap="x", request_topic="r", reply_topic="p", texts=["t"], **kw)  # type: ignore[arg-type]


def test_build_schedule_count_for_constant_adds_the_warmup_on_top() -> None:
    s = build_schedule(_opts(pattern="constant", rate_per_s=20, count=50, warmup_s=1))
    assert int(s.measured.sum()) == 50 and len(s) == 70
    assert s.segments[-1].end_s == pytest.approx(1 + 50 / 20)


def test_build_schedule_step_defaults_to_linear_multiples() -> None:
    s = build_schedule(_opts(pattern="step", rate_per_s=4, steps=3, step_s=2, warmup_s=0))
    assert [g.rate_per_s for g in s.segments] == [4, 8, 12]
    s = build_schedule(_opts(pattern="step", rates_per_s=[1, 2], duration_s=10, warmup_s=0))
    assert [g.duration_s for g in s.segments] == [5, 5]


def test_build_schedule_pulse_warmup_runs_at_the_base_rate() -> None:
    s = build_schedule(_opts(pattern="pulse", rate_per_s=10, duration_s=20, warmup_s=2))
    assert s.segments[0] == arrivals.Segment(0, 2, 10, "warmup")
    assert [g.label for g in s.segments[1:]] == ["base", "burst 1", "base", "burst 2", "base"]
