"""PNG plots of a load run (matplotlib, Agg backend: no display needed).

- ``<prefix>_latency_over_time.png``: each request's latency at its scheduled send time (log
  scale), a per-second p99 line, bursts shaded, step boundaries marked, timeouts on top;
- ``<prefix>_latency_cdf.png``: latency CDF per phase (step, or base/burst/after burst);
- ``<prefix>_throughput_over_time.png``: offered, sent and replied per second;
- ``<prefix>_throughput_vs_offered.png`` (step sweeps): reply throughput and p99 against the
  offered rate, the knee marked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import itertools

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes

from producer_tools.arrivals import Schedule
from producer_tools.report import Outcome, RunLog

__all__ = ["save_png", "write_plots"]

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
    edges = np.arange(0.0, np.ceil(end_s) + 1.0, 1.0)
    counts, _ = np.histogram(times[np.isfinite(times)], bins=edges)
    return edges[:-1] + 0.5, counts


def _latency_over_time(log: RunLog, schedule: Schedule, path: Path, title: str) -> None:
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
    ax.set_xlabel("scheduled send time (s)")
    ax.set_ylabel("latency send→reply (ms)")
    ax.set_title(title, fontsize=10, pad=14)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="upper left", fontsize=7)
    save_png(fig, path)


def _latency_cdf(log: RunLog, report: dict[str, Any], schedule: Schedule, path: Path) -> None:
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
    ax.set_xlabel("latency send→reply (ms)")
    ax.set_ylabel("fraction of requests")
    ax.set_title("latency CDF", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    save_png(fig, path)


def _throughput_over_time(log: RunLog, schedule: Schedule, path: Path) -> None:
    fig, ax = plt.subplots(figsize=_SIZE_IN, dpi=_DPI)
    end = max(schedule.end_s, float(np.nanmax(log.received_s)) if log.answered.any() else 0)
    x, offered = _per_second(log.intended_s, end)
    _, sent = _per_second(log.sent_s, end)
    _, replied = _per_second(np.where(log.answered, log.received_s, np.nan), end)
    ax.plot(x, offered, label="offered", color="grey", ls="--")
    ax.plot(x, sent, label="sent", color="tab:blue")
    ax.plot(x, replied, label="replies", color="tab:green")
    _mark_segments(ax, schedule)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("requests per second")
    ax.set_title("throughput over time", fontsize=10, pad=14)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    save_png(fig, path)


def _throughput_vs_offered(report: dict[str, Any], path: Path) -> None:
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
    save_png(fig, path)


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
    _latency_over_time(log, schedule, paths[0], title)
    _latency_cdf(log, report, schedule, paths[1])
    _throughput_over_time(log, schedule, paths[2])
    if report["pattern"] == "step" and report["phases"]:
        paths.append(out_dir / f"{prefix}_throughput_vs_offered.png")
        _throughput_vs_offered(report, paths[-1])
    return paths
