"""PNG plots of a load run (matplotlib, Agg backend: no display needed).

- ``<prefix>_latency_over_time.png``: each request's latency at its scheduled send time (log
  scale), a per-second p99 line, bursts shaded, step boundaries marked, timeouts on top;
- ``<prefix>_latency_cdf.png``: latency CDF per phase (step, or base/burst/after burst);
- ``<prefix>_throughput_over_time.png``: offered, sent and replied per whole second (a last,
  partial second is left out: its count would read as a fall in throughput);
- ``<prefix>_throughput_vs_offered.png`` (step sweeps): reply throughput and p99 against the
  offered rate, the knee marked.

Millisecond axes are logarithmic with plain labels (``20``, ``50``, ``100``, ``1,000``) on a
1-2-5 sequence, minor ticks unlabelled (:func:`plain_log_axis`). Each ``*_figure`` function
returns its :class:`~matplotlib.figure.Figure` (tests read its lines and tick labels);
:func:`write_plots` saves and closes them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import itertools
import math

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.axis import Axis
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter

from producer_tools.arrivals import Schedule
from producer_tools.report import Outcome, RunLog

__all__ = [
    "latency_cdf_figure",
    "latency_over_time_figure",
    "plain_log_axis",
    "save_png",
    "throughput_over_time_figure",
    "throughput_vs_offered_figure",
    "write_plots",
]

_SIZE_IN = (8.0, 4.2)
_DPI = 100


def save_png(fig: Any, path: Path, dpi: float | str = "figure") -> Path:
    """Write ``fig`` as a PNG at ``path`` (its folder made if missing; ``dpi`` default: the
    figure's) and close it; returns ``path``."""
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def _plain(value: float, _pos: object = None) -> str:
    """A tick label without exponents: ``0.5``, ``20``, ``1,000``."""
    return f"{value:,.0f}" if value >= 1 else f"{value:g}"


def plain_log_axis(axis: Axis, lo: float, hi: float) -> None:
    """Label a log-scale ``axis`` spanning ``[lo, hi]`` (data units, > 0) with plain numbers.

    Major ticks on 1-2-5 × 10^k inside the span (1-2-3-5-7 when that gives fewer than three;
    only powers of ten when it gives more than nine), labelled as :func:`_plain` writes them;
    minor ticks stay, unlabelled (matplotlib's default labels them ``3×10¹`` and they overlap).
    """
    lo, hi = max(lo, 1e-9), max(hi, lo * 1.01)
    ticks: list[float] = []
    for mantissas in ((1, 2, 5), (1, 2, 3, 5, 7), (1, 1.5, 2, 3, 4, 5, 6, 7, 8, 9)):
        ticks = [
            m * 10.0**k
            for k in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
            for m in mantissas
            if lo <= m * 10.0**k <= hi
        ]
        if len(ticks) >= 3:
            break
    if len(ticks) > 9:
        ticks = [t for t in ticks if math.log10(t).is_integer()]
    axis.set_major_locator(FixedLocator(ticks))
    axis.set_major_formatter(FuncFormatter(_plain))
    axis.set_minor_locator(LogLocator(subs="auto"))
    axis.set_minor_formatter(NullFormatter())


def _span(values: np.ndarray[Any, Any]) -> tuple[float, float]:
    """The positive finite range of ``values`` (``(1, 10)`` when there is none)."""
    v = values[np.isfinite(values) & (values > 0)]
    return (float(v.min()), float(v.max())) if v.size else (1.0, 10.0)


def _mark_segments(ax: Axes, schedule: Schedule) -> None:
    labelled = False
    for s in schedule.segments:
        if s.phase == "burst":
            ax.axvspan(
                s.start_s,
                s.end_s,
                color="tab:red",
                alpha=0.12,
                label=None if labelled else "burst",
            )
            labelled = True
        elif s.phase == "warmup":
            ax.axvspan(s.start_s, s.end_s, color="grey", alpha=0.15, label="warm-up")
        elif s.phase == "step" and s.index > 0:
            ax.axvline(s.start_s, color="grey", lw=0.8, ls="--")
        if s.phase == "step":
            ax.annotate(
                f"{s.rate_per_s:g}/s",
                ((s.start_s + s.end_s) / 2, 1.0),
                xycoords=("data", "axes fraction"),
                ha="center",
                va="bottom",
                fontsize=7,
            )


def _per_second(times: np.ndarray[Any, Any], end_s: float) -> tuple[np.ndarray[Any, Any], Any]:
    """Counts of ``times`` per whole second in ``[0, end_s]`` (bin centres, counts); a last
    second that ``end_s`` cuts short is left out."""
    edges = np.arange(0.0, math.floor(end_s + 1e-9) + 1.0, 1.0)
    if edges.size < 2:
        return np.empty(0), np.empty(0, dtype=np.int64)
    counts, _ = np.histogram(times[np.isfinite(times)], bins=edges)
    return edges[:-1] + 0.5, counts


def latency_over_time_figure(log: RunLog, schedule: Schedule, title: str) -> Figure:
    """Each request's latency (ms, log) at its scheduled send time, p99 per second."""
    fig, ax = plt.subplots(figsize=_SIZE_IN, dpi=_DPI)
    lat = log.latency_ms
    ans = log.answered
    ax.scatter(log.intended_s[ans], lat[ans], s=5, alpha=0.5, lw=0, label="request")
    edges = np.arange(0.0, np.ceil(schedule.end_s) + 1.0, 1.0)
    centers, p99 = [], []
    for lo, hi in itertools.pairwise(edges):
        sel = ans & (log.intended_s >= lo) & (log.intended_s < hi)
        if sel.sum() >= 5:
            centers.append((lo + hi) / 2)
            p99.append(float(np.percentile(lat[sel], 99)))
    if centers:
        ax.plot(centers, p99, color="black", lw=1.2, label="p99 per second")
    timed_out = log.outcome == Outcome.TIMEOUT
    if timed_out.any():
        top = float(np.nanmax(lat[ans])) * 1.5 if ans.any() else 1000.0
        ax.scatter(
            log.intended_s[timed_out],
            np.full(int(timed_out.sum()), top),
            marker="x",
            color="tab:red",
            s=10,
            label="timeout",
        )
    _mark_segments(ax, schedule)
    ax.set_yscale("log")
    lo, hi = _span(lat[ans])
    plain_log_axis(ax.yaxis, lo, hi * (1.5 if timed_out.any() else 1.0))
    ax.set_xlabel("scheduled send time (s)")
    ax.set_ylabel("latency send→reply (ms)")
    ax.set_title(title, fontsize=10, pad=14)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="upper left", fontsize=7)
    return fig


def latency_cdf_figure(log: RunLog, report: dict[str, Any], schedule: Schedule) -> Figure:
    """The latency CDF (ms, log) per phase: each step, or base and burst, or the whole run."""
    fig, ax = plt.subplots(figsize=_SIZE_IN, dpi=_DPI)
    lat = log.latency_ms
    groups: list[tuple[str, np.ndarray[Any, Any]]] = []
    if report["pattern"] == "step":
        for k, s in enumerate(schedule.segments):
            if s.phase == "step":
                sel = (schedule.segment_index == k) & log.answered
                groups.append((s.label, lat[sel]))
    elif report["pattern"] == "pulse":
        burst = np.array([s.phase == "burst" for s in schedule.segments])[schedule.segment_index]
        base = schedule.measured & ~burst
        groups = [("base", lat[base & log.answered]), ("burst", lat[burst & log.answered])]
    else:
        groups = [("all", lat[schedule.measured & log.answered])]
    for name, values in groups:
        values = np.sort(values[np.isfinite(values)])
        if values.size:
            ax.step(values, np.arange(1, values.size + 1) / values.size, where="post", label=name)
    for q in (0.5, 0.99):
        ax.axhline(q, color="grey", lw=0.6, ls=":")
    ax.set_xscale("log")
    plain_log_axis(ax.xaxis, *_span(np.concatenate([v for _, v in groups] or [np.empty(0)])))
    ax.set_xlabel("latency send→reply (ms)")
    ax.set_ylabel("fraction of requests")
    ax.set_title("latency CDF", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    return fig


def throughput_over_time_figure(log: RunLog, schedule: Schedule) -> Figure:
    """Offered and sent per second over the schedule, replies per second up to the last one:
    whole seconds only (a partial last second would read as a fall to 0)."""
    fig, ax = plt.subplots(figsize=_SIZE_IN, dpi=_DPI)
    replied_s = np.where(log.answered, log.received_s, np.nan)
    last_rx = float(np.nanmax(replied_s)) if log.answered.any() else 0.0
    x, offered = _per_second(log.intended_s, schedule.end_s)
    _, sent = _per_second(log.sent_s, schedule.end_s)
    x_rx, replied = _per_second(replied_s, max(schedule.end_s, last_rx))
    ax.plot(x, offered, label="offered", color="grey", ls="--")
    ax.plot(x, sent, label="sent", color="tab:blue")
    ax.plot(x_rx, replied, label="replies", color="tab:green")
    _mark_segments(ax, schedule)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("requests per second")
    ax.set_title("throughput over time", fontsize=10, pad=14)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    return fig


def throughput_vs_offered_figure(report: dict[str, Any]) -> Figure:
    """Reply throughput and p99 (ms, log) against each step's offered rate; the knee marked."""
    steps = report["phases"]
    offered = [s["offered_rate_per_s"] for s in steps]
    thr = [s["reply_throughput_per_s"] for s in steps]
    p99 = [s["latency_ms"]["p99"] for s in steps]
    fig, ax = plt.subplots(figsize=_SIZE_IN, dpi=_DPI)
    ax.plot(offered, offered, color="grey", ls=":", lw=0.8, label="throughput = offered")
    ax.plot(offered, thr, "o-", color="tab:green", label="reply throughput")
    ax.set_xlabel("offered rate (requests/s)")
    ax.set_ylabel("reply throughput (requests/s)", color="tab:green")
    ax2 = ax.twinx()
    ax2.plot(offered, p99, "s-", color="tab:red", label="p99 latency")
    ax2.set_yscale("log")
    plain_log_axis(ax2.yaxis, *_span(np.array([v for v in p99 if v is not None], dtype=float)))
    ax2.set_ylabel("p99 latency (ms)", color="tab:red")
    knee = report.get("knee", {})
    if knee.get("knee_offered_rate_per_s") is not None:
        ax.axvline(knee["knee_offered_rate_per_s"], color="black", ls="--", lw=0.8)
        ax.annotate(
            "knee",
            (knee["knee_offered_rate_per_s"], 0.02),
            xycoords=("data", "axes fraction"),
            fontsize=8,
            ha="right",
        )
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], fontsize=7, loc="upper left")
    ax.set_title("throughput and p99 against offered load", fontsize=10)
    ax.grid(True, alpha=0.3)
    return fig


def write_plots(
    log: RunLog, schedule: Schedule, report: dict[str, Any], out_dir: Path, prefix: str
) -> list[Path]:
    """Write the run's PNGs into ``out_dir`` (created when missing); their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [
        out_dir / f"{prefix}_latency_over_time.png",
        out_dir / f"{prefix}_latency_cdf.png",
        out_dir / f"{prefix}_throughput_over_time.png",
    ]
    s = report["summary"]["latency_ms"]
    title = (
        f"{report['pattern']}: latency (p50 {s['p50']} ms, p99 {s['p99']} ms, max {s['max']} ms)"
    )
    save_png(latency_over_time_figure(log, schedule, title), paths[0])
    save_png(latency_cdf_figure(log, report, schedule), paths[1])
    save_png(throughput_over_time_figure(log, schedule), paths[2])
    if report["pattern"] == "step" and report["phases"]:
        paths.append(out_dir / f"{prefix}_throughput_vs_offered.png")
        save_png(throughput_vs_offered_figure(report), paths[-1])
    return paths
