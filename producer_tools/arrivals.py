"""Open-loop arrival schedules: when each request of a load run is sent. Pure, no I/O.

A load is a **rate profile** — consecutive :class:`Segment`\\ s, each with a constant
``rate_per_s`` — turned into send times before the run starts (open loop: a slow server shows
as latency, never as a lower send rate). Arrivals are placed in the profile's cumulative
intensity ``Λ(t) = ∫ rate``: deterministically at ``Λ = 0, 1, 2, …`` (evenly spaced; the first
at ``t = 0``), or as a Poisson process (unit-mean exponential gaps in ``Λ``, drawn from a
seeded :class:`numpy.random.Generator`, so a run is reproducible from its seed). Mapping back
through ``Λ⁻¹`` makes a rate change take effect exactly at its segment boundary.

Profiles: :func:`constant_profile`, :func:`step_profile` (a rate sweep),
:func:`pulse_profile` (a base rate with ``burst_factor``× bursts), each optionally behind a
warm-up (:func:`with_warmup`) that is sent but left out of the statistics.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = [
    "Schedule",
    "Segment",
    "arrival_times",
    "constant_profile",
    "pulse_profile",
    "step_profile",
    "with_warmup",
]


@dataclass(frozen=True, slots=True)
class Segment:
    """``[start_s, end_s)`` at ``rate_per_s``; ``phase`` names it in reports (``"warmup"``,
    ``"constant"``, ``"step"``, ``"base"``, ``"burst"``); ``index`` numbers steps and bursts."""

    start_s: float
    end_s: float
    rate_per_s: float
    phase: str
    index: int = 0

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def label(self) -> str:
        """A short human name: ``step 3 @ 40/s``, ``burst 2``, ``base``."""
        if self.phase == "step":
            return f"step {self.index + 1} @ {self.rate_per_s:g}/s"
        if self.phase == "burst":
            return f"burst {self.index + 1}"
        return self.phase


@dataclass(frozen=True)
class Schedule:
    """Send times in seconds from the run's start (sorted, float64) and each one's segment."""

    times_s: npt.NDArray[np.float64]
    segment_index: npt.NDArray[np.int64]
    segments: tuple[Segment, ...]

    def __len__(self) -> int:
        return int(self.times_s.size)

    @property
    def end_s(self) -> float:
        """End of the last segment (the schedule's nominal length)."""
        return self.segments[-1].end_s

    @property
    def measured(self) -> npt.NDArray[np.bool_]:
        """Per arrival: True unless it belongs to a warm-up segment."""
        warm = np.array([s.phase == "warmup" for s in self.segments], dtype=bool)
        return ~warm[self.segment_index]


def _check_rate(rate_per_s: float, what: str = "rate_per_s") -> None:
    if not (math.isfinite(rate_per_s) and rate_per_s > 0):
        raise ValueError(f"{what} must be a finite number > 0, got {rate_per_s}")


def _check_duration(duration_s: float, what: str) -> None:
    if not (math.isfinite(duration_s) and duration_s > 0):
        raise ValueError(f"{what} must be a finite number > 0, got {duration_s}")


def constant_profile(rate_per_s: float, duration_s: float) -> list[Segment]:
    """One segment at ``rate_per_s`` for ``duration_s``. Raises ``ValueError`` when either
    is not a finite positive number."""
    _check_rate(rate_per_s)
    _check_duration(duration_s, "duration_s")
    return [Segment(0.0, duration_s, rate_per_s, "constant")]


def step_profile(rates_per_s: Sequence[float], step_s: float) -> list[Segment]:
    """A sweep: one ``step_s`` segment per rate, in the order given.

    Raises ``ValueError`` for no rates, a rate that is not > 0, or ``step_s`` not > 0.
    """
    if not rates_per_s:
        raise ValueError("a step profile needs at least one rate")
    _check_duration(step_s, "step_s")
    for r in rates_per_s:
        _check_rate(r, "every step rate")
    return [Segment(i * step_s, (i + 1) * step_s, r, "step", i) for i, r in enumerate(rates_per_s)]


def pulse_profile(
    base_rate_per_s: float,
    duration_s: float,
    *,
    burst_factor: float,
    burst_s: float,
    period_s: float,
    first_burst_s: float | None = None,
) -> list[Segment]:
    """``base_rate_per_s`` with bursts of ``burst_factor × base`` lasting ``burst_s``, one
    every ``period_s`` starting at ``first_burst_s`` (default ``period_s / 2``), for
    ``duration_s`` in all. A burst that would run past the end is cut there.

    Raises ``ValueError`` for a non-positive rate, duration, burst length or factor, a
    ``burst_s`` not shorter than ``period_s``, or a first burst outside the run.
    """
    _check_rate(base_rate_per_s, "base_rate_per_s")
    _check_duration(duration_s, "duration_s")
    _check_duration(burst_s, "burst_s")
    _check_duration(period_s, "period_s")
    _check_rate(burst_factor, "burst_factor")
    if burst_s >= period_s:
        raise ValueError(f"burst_s={burst_s} must be shorter than period_s={period_s}")
    first = period_s / 2 if first_burst_s is None else first_burst_s
    if not (0 <= first < duration_s):
        raise ValueError(f"first_burst_s={first} must lie in [0, duration_s={duration_s})")
    segments: list[Segment] = []
    t, n = 0.0, 0
    burst_start = first
    while t < duration_s:
        if burst_start > t:
            end = min(burst_start, duration_s)
            segments.append(Segment(t, end, base_rate_per_s, "base", n))
            t = end
            continue
        end = min(burst_start + burst_s, duration_s)
        segments.append(Segment(t, end, base_rate_per_s * burst_factor, "burst", n))
        t, n = end, n + 1
        burst_start += period_s
    return segments


def with_warmup(
    segments: Sequence[Segment], warmup_s: float, rate_per_s: float | None = None
) -> list[Segment]:
    """Prepend a ``warmup_s`` segment (default rate: the first segment's) and shift the rest.

    ``warmup_s == 0`` returns the segments unchanged. Raises ``ValueError`` for a negative
    ``warmup_s`` or an empty profile.
    """
    if warmup_s < 0 or not math.isfinite(warmup_s):
        raise ValueError(f"warmup_s must be a finite number >= 0, got {warmup_s}")
    if not segments:
        raise ValueError("empty profile")
    if warmup_s == 0:
        return list(segments)
    rate = segments[0].rate_per_s if rate_per_s is None else rate_per_s
    _check_rate(rate)
    shifted = [
        Segment(s.start_s + warmup_s, s.end_s + warmup_s, s.rate_per_s, s.phase, s.index)
        for s in segments
    ]
    return [Segment(0.0, warmup_s, rate, "warmup"), *shifted]


def arrival_times(
    segments: Sequence[Segment],
    *,
    poisson: bool = False,
    rng: np.random.Generator | None = None,
    max_count: int | None = None,
    extend: bool = False,
) -> Schedule:
    """Send times for a rate profile (see the module docstring for the placement rule).

    Args:
        segments: Contiguous segments starting at 0 (as the ``*_profile`` helpers make them).
        poisson: Exponential gaps instead of even spacing.
        rng: Random source for ``poisson`` (default: seed 0).
        max_count: Keep at most this many arrivals.
        extend: With ``max_count``: continue past the profile's end at the last segment's
            rate until ``max_count`` arrivals exist (a run bounded by count, not duration);
            the last segment's ``end_s`` is moved to cover them.

    Raises:
        ValueError: non-contiguous segments, a non-positive rate, ``max_count < 0`` or
            ``extend`` without ``max_count``.
    """
    if not segments:
        raise ValueError("empty profile")
    if max_count is not None and max_count < 0:
        raise ValueError(f"max_count must be >= 0, got {max_count}")
    if extend and max_count is None:
        raise ValueError("extend needs max_count")
    for prev, nxt in itertools.pairwise(segments):
        if not math.isclose(prev.end_s, nxt.start_s, abs_tol=1e-9):
            raise ValueError(f"segments are not contiguous at {prev.end_s} / {nxt.start_s}")
    for s in segments:
        _check_rate(s.rate_per_s, f"rate of segment {s.label}")
        if not s.end_s > s.start_s:
            raise ValueError(f"segment {s.label} is empty: [{s.start_s}, {s.end_s})")
    bounds_t = np.array([segments[0].start_s, *(s.end_s for s in segments)], dtype=np.float64)
    rates = np.array([s.rate_per_s for s in segments], dtype=np.float64)
    bounds_lam = np.concatenate([[0.0], np.cumsum(rates * np.diff(bounds_t))])
    lam_total = float(bounds_lam[-1])
    limit = math.inf if extend else lam_total

    if poisson:
        gen = rng if rng is not None else np.random.default_rng(0)
        chunk = max(16, int((max_count if extend and max_count else lam_total) * 1.2) + 16)
        points = np.cumsum(gen.exponential(1.0, size=chunk))
        target_n = max_count if extend and max_count is not None else None
        while (target_n is not None and points.size < target_n) or (
            target_n is None and points[-1] < limit
        ):
            more = points[-1] + np.cumsum(gen.exponential(1.0, size=chunk))
            points = np.concatenate([points, more])
        lam = points[points < limit]
    else:
        n = max_count if extend and max_count is not None else math.ceil(lam_total - 1e-9)
        lam = np.arange(n, dtype=np.float64)
        lam = lam[lam < limit]
    if max_count is not None:
        lam = lam[:max_count]

    inside = lam < lam_total
    times = np.empty_like(lam)
    times[inside] = np.interp(lam[inside], bounds_lam, bounds_t)
    times[~inside] = bounds_t[-1] + (lam[~inside] - lam_total) / rates[-1]
    seg_idx = np.minimum(
        np.searchsorted(bounds_t[1:], times, side="right"), len(segments) - 1
    ).astype(np.int64)

    out_segments = list(segments)
    if max_count is not None and times.size == max_count and times.size:
        # Bounded by count: the run ends one gap after its last arrival, wherever that is.
        last_i = int(seg_idx[-1])
        last = out_segments[last_i]
        end = float(times[-1]) + 1.0 / last.rate_per_s
        if extend or end < last.end_s:
            out_segments = [
                *out_segments[:last_i],
                Segment(last.start_s, end, last.rate_per_s, last.phase, last.index),
            ]
    return Schedule(times_s=times, segment_index=seg_idx, segments=tuple(out_segments))
