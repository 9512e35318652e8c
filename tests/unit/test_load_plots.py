"""The load report's plots: plain millisecond tick labels, no fall to 0 in a partial last
second (read from the figure objects; ``write_plots`` renders the same figures)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.axis import Axis

from producer_tools.arrivals import arrival_times, step_profile
from producer_tools.plots import (
    latency_cdf_figure,
    latency_over_time_figure,
    plain_log_axis,
    throughput_over_time_figure,
    throughput_vs_offered_figure,
    write_plots,
)
from producer_tools.report import Outcome, RunLog, build_report


def _step_run() -> tuple[RunLog, Any, dict[str, Any]]:
    """Four 5 s steps; latency 28-60 ms growing with the rate (one decade, where matplotlib
    labels minor ticks ``3×10¹``); the last reply 0.6 s after the schedule's end."""
    sched = arrival_times(step_profile([20, 40, 60, 80], 5))
    log = RunLog.empty(sched.times_s)
    rng = np.random.default_rng(7)
    step = np.minimum(sched.times_s // 5, 3)
    latency_s = (0.028 + 0.008 * step) * (1 + rng.random(len(sched)))
    latency_s[-1] = sched.end_s + 0.6 - sched.times_s[-1]
    log.sent_s[:] = sched.times_s
    log.received_s[:] = sched.times_s + latency_s
    log.outcome[:] = Outcome.OK
    return log, sched, build_report(log, sched, pattern="step")


def _labels(axis: Axis) -> tuple[list[str], list[str]]:
    """The (major, minor) tick label texts drawn on ``axis`` (empty ones left out)."""
    axis.figure.canvas.draw()
    major = [t.get_text() for t in axis.get_ticklabels(which="major") if t.get_text()]
    minor = [t.get_text() for t in axis.get_ticklabels(which="minor") if t.get_text()]
    return major, minor


def _plain_labels(major: list[str]) -> None:
    assert len(major) >= 3
    for text in major:
        assert "×" not in text and "^" not in text and "e" not in text.lower(), text
        float(text.replace(",", ""))  # a plain number


def test_the_cdf_has_plain_ms_labels_and_no_minor_labels() -> None:
    log, sched, report = _step_run()
    fig = latency_cdf_figure(log, report, sched)
    major, minor = _labels(fig.axes[0].xaxis)
    plt.close(fig)
    _plain_labels(major)
    assert minor == []  # matplotlib's default labels 3×10¹, 4×10¹ ... and they overlap
    assert major == ["50", "100", "200", "500"]  # 28 ms to the 0.6 s straggler


def test_the_latency_axes_of_the_other_plots_are_plain_too() -> None:
    log, sched, report = _step_run()
    for fig, axis in (
        (f := latency_over_time_figure(log, sched, "t"), f.axes[0].yaxis),
        (g := throughput_vs_offered_figure(report), g.axes[1].yaxis),
    ):
        major, minor = _labels(axis)
        plt.close(fig)
        _plain_labels(major)
        assert minor == []


@pytest.mark.parametrize(
    ("lo", "hi", "expected"),
    [
        (28.0, 120.0, [30, 50, 70, 100]),  # within a decade: 1-2-3-5-7
        (3.0, 900.0, [5, 10, 20, 50, 100, 200, 500]),  # 1-2-5
        (0.4, 40_000.0, [1, 10, 100, 1_000, 10_000]),  # many decades: powers of ten
    ],
)
def test_plain_log_ticks(lo: float, hi: float, expected: list[float]) -> None:
    fig, ax = plt.subplots()
    ax.set_xscale("log")
    plain_log_axis(ax.xaxis, lo, hi)
    assert list(ax.xaxis.get_major_locator()()) == pytest.approx(expected)
    assert ax.xaxis.get_major_formatter()(1000.0, 0) == "1,000"
    plt.close(fig)


def test_throughput_over_time_leaves_out_the_partial_last_second() -> None:
    log, sched, _ = _step_run()
    fig = throughput_over_time_figure(log, sched)
    lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
    plt.close(fig)
    for name in ("offered", "sent", "replies"):
        y = np.asarray(lines[name].get_ydata())
        assert y[-1] >= 70, (name, y[-3:])  # the last step runs at 80/s: no fall to 0
    x = np.asarray(lines["replies"].get_xdata())
    assert x[-1] + 0.5 <= sched.end_s + 0.6  # only whole seconds


def test_write_plots_renders_the_pngs(tmp_path: Path) -> None:
    log, sched, report = _step_run()
    paths = write_plots(log, sched, report, tmp_path, "step")
    assert [p.name for p in paths] == [
        "step_latency_over_time.png",
        "step_latency_cdf.png",
        "step_throughput_over_time.png",
        "step_throughput_vs_offered.png",
    ]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in paths)
