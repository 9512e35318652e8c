"""Statistics of a load run: latency percentiles, rates, batch figures, knee and bursts. Pure.

Inputs are a :class:`RunLog` (one row per request, numpy columns; times in seconds from the
run's start on the monotonic clock) and the :class:`~producer_tools.arrivals.Schedule` it
followed. Definitions used throughout:

- **latency**: reply arrival minus the request's *scheduled* send time. Measuring from the
  schedule, not from the actual send, keeps a late sender from hiding server delay
  (coordinated omission); the send lag itself is reported separately (``send_lag_ms``).
- **offered rate**: scheduled requests of a window / its length.
- **achieved send rate**: requests actually sent / (window length + growth of the send lag
  across the window) — equal to the offered rate when the generator keeps pace.
- **reply throughput**: replies *received* inside the window / its length (what the server
  delivered while that load was offered); over the whole run, measured replies / (time to the
  last reply).
- **batch size**: the replies' ``timing.batch_size``, per request (request-weighted) and per
  distinct batch (replies sharing ``batch_size``, ``padded_len`` and ``infer_ms``).
- **padding efficiency**: real / padded tokens from the server's ``kbatch_tokens_*_total``
  counters when a metrics URL was given (the reply carries no real-token count).
- **stages** (``stages_ms``, ok replies with timing): where one request's time went, from the
  client's clocks, the reply record's timestamp and the reply's ``timing`` (no extra wire
  field): ``send_lag`` (scheduled → sent by the generator), ``intake`` (sent → the server took
  it: client producer, broker, fetch, poll, decode; = reply handed − sent − forward −
  ``queue``, so it also holds the few µs from forward end to the reply's hand-off),
  ``queue`` (``timing.queue_ms``: taken → its batch's forward starts: tokenize, bucket wait,
  device busy), ``forward`` (``timing.infer_ms``), ``reply`` (reply handed to the server's
  producer → read by the client: linger, broker ack, fetch, decode). Server and client share
  the machine's wall clock; the reply timestamp has 1 ms resolution.
- **knee** (step sweeps): the last step before the first saturated one: a step saturates when
  its reply throughput falls below 0.9 × its offered rate, it timed requests out, or its p99
  exceeds 3 × the first step's p99 (or an optional bound in ms); :class:`KneeRule`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import numpy as np
import numpy.typing as npt

from producer_tools.arrivals import Schedule

__all__ = [
    "STAGES",
    "KneeRule",
    "Outcome",
    "RunLog",
    "build_report",
    "burst_stats",
    "error_rate",
    "find_knee",
    "knee_line",
    "latency_summary",
    "print_report",
    "report_console",
    "stage_summary",
    "stage_times_ms",
]

Interval = tuple[float, float]


class Outcome(IntEnum):
    """What became of one request (stored as int8 in :attr:`RunLog.outcome`)."""

    PENDING = -1
    OK = 0
    ERROR = 1
    EXPIRED = 2
    TIMEOUT = 3
    SEND_FAILED = 4


@dataclass
class RunLog:
    """One row per scheduled request (index = position in the schedule).

    ``intended_s``/``sent_s``/``received_s``: seconds from the run start (``nan`` when it did
    not happen); ``queue_ms``/``infer_ms``: the reply's timing (``nan`` without one);
    ``batch_size``/``padded_len``: 0 without timing. ``reply_ts_s``: the reply record's Kafka
    timestamp (the server's producer clock when it took the reply: "handed to the producer"),
    in the same seconds-from-start frame (``nan`` without a reply; 1 ms resolution).
    """

    intended_s: npt.NDArray[np.float64]
    sent_s: npt.NDArray[np.float64]
    received_s: npt.NDArray[np.float64]
    outcome: npt.NDArray[np.int8]
    batch_size: npt.NDArray[np.int32]
    padded_len: npt.NDArray[np.int32]
    queue_ms: npt.NDArray[np.float64]
    infer_ms: npt.NDArray[np.float64]
    dedup: npt.NDArray[np.bool_]
    reply_ts_s: npt.NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))

    def __post_init__(self) -> None:
        if self.reply_ts_s.size != self.intended_s.size:
            self.reply_ts_s = np.full(self.intended_s.size, np.nan)

    @classmethod
    def empty(cls, intended_s: npt.NDArray[np.float64]) -> RunLog:
        n = intended_s.size
        return cls(
            intended_s=intended_s.astype(np.float64),
            sent_s=np.full(n, np.nan),
            received_s=np.full(n, np.nan),
            outcome=np.full(n, Outcome.PENDING, dtype=np.int8),
            batch_size=np.zeros(n, dtype=np.int32),
            padded_len=np.zeros(n, dtype=np.int32),
            queue_ms=np.full(n, np.nan),
            infer_ms=np.full(n, np.nan),
            dedup=np.zeros(n, dtype=bool),
        )

    @property
    def latency_ms(self) -> npt.NDArray[np.float64]:
        """Scheduled send → reply, ms (``nan`` without a reply)."""
        return (self.received_s - self.intended_s) * 1000.0

    @property
    def answered(self) -> npt.NDArray[np.bool_]:
        """A reply arrived (ok, error or expired)."""
        return np.isin(self.outcome, (Outcome.OK, Outcome.ERROR, Outcome.EXPIRED))


def latency_summary(values_ms: npt.ArrayLike) -> dict[str, float | int | None]:
    """``count``, ``mean``, ``p50``, ``p95``, ``p99``, ``max`` of the finite values (ms).

    Percentiles interpolate linearly between order statistics (numpy's default); an empty
    input gives ``count: 0`` and ``None`` for the rest.
    """
    arr = np.asarray(values_ms, dtype=np.float64)
    arr = arr[np.isfinite(arr)]
    if arr.size == 0:
        return {"count": 0, "mean": None, "p50": None, "p95": None, "p99": None, "max": None}
    p50, p95, p99 = np.percentile(arr, [50, 95, 99])
    return {
        "count": int(arr.size),
        "mean": _r(arr.mean()),
        "p50": _r(p50),
        "p95": _r(p95),
        "p99": _r(p99),
        "max": _r(arr.max()),
    }


def _r(x: float | np.floating[Any], nd: int = 3) -> float:
    return round(float(x), nd)


def _in_intervals(times: npt.NDArray[np.float64], intervals: Sequence[Interval]) -> Any:
    mask = np.zeros(times.shape, dtype=bool)
    for lo, hi in intervals:
        mask |= (times >= lo) & (times < hi)
    return mask


def _subtract(intervals: Sequence[Interval], cut: Sequence[Interval]) -> list[Interval]:
    out = list(intervals)
    for c_lo, c_hi in cut:
        nxt: list[Interval] = []
        for lo, hi in out:
            if c_hi <= lo or c_lo >= hi:
                nxt.append((lo, hi))
                continue
            if lo < c_lo:
                nxt.append((lo, c_lo))
            if c_hi < hi:
                nxt.append((c_hi, hi))
        out = nxt
    return out


def window_stats(
    log: RunLog,
    rows: npt.NDArray[np.bool_],
    intervals: Sequence[Interval],
    name: str,
    tokens: tuple[float, float] | None = None,
) -> dict[str, Any]:
    """Rates, outcomes, latency and batch figures of the requests ``rows`` scheduled inside
    ``intervals`` (seconds from the start; their total length is the window).

    ``tokens`` = (real, padded) token deltas of the window from the server's metrics.
    """
    window_s = float(sum(hi - lo for lo, hi in intervals))
    n_sched = int(rows.sum())
    sent = rows & np.isfinite(log.sent_s)
    n_sent = int(sent.sum())
    lag_s = (log.sent_s - log.intended_s)[sent]
    growth_s = float(max(0.0, lag_s[-1] - lag_s[0])) if lag_s.size >= 2 else 0.0
    received_in = _in_intervals(log.received_s, intervals)
    ok = rows & (log.outcome == Outcome.OK)
    timed = ok & (log.batch_size > 0)
    batch_keys = {
        (int(b), int(p), float(i))
        for b, p, i in zip(
            log.batch_size[timed], log.padded_len[timed], log.infer_ms[timed], strict=True
        )
    }
    per_batch = [b for b, _, _ in batch_keys]
    queue = latency_summary(log.queue_ms[timed])
    out: dict[str, Any] = {
        "name": name,
        "window_s": _r(window_s),
        "offered_rate_per_s": _r(n_sched / window_s) if window_s > 0 else None,
        "achieved_send_rate_per_s": (_r(n_sent / (window_s + growth_s)) if window_s > 0 else None),
        "reply_throughput_per_s": _r(received_in.sum() / window_s) if window_s > 0 else None,
        "scheduled": n_sched,
        "sent": n_sent,
        "answered": int((rows & log.answered).sum()),
        "ok": int(ok.sum()),
        "errors": int((rows & (log.outcome == Outcome.ERROR)).sum()),
        "expired": int((rows & (log.outcome == Outcome.EXPIRED)).sum()),
        "timeouts": int((rows & (log.outcome == Outcome.TIMEOUT)).sum()),
        "send_failures": int((rows & (log.outcome == Outcome.SEND_FAILED)).sum()),
        "dedup": int((rows & log.dedup).sum()),
        "latency_ms": latency_summary(log.latency_ms[rows & log.answered]),
        "send_lag_ms": latency_summary(lag_s * 1000.0),
        "batch_size_mean": _r(log.batch_size[timed].mean(), 2) if timed.any() else None,
        "batch_size_per_batch_mean": _r(float(np.mean(per_batch)), 2) if per_batch else None,
        "batches": len(batch_keys),
        "padded_len_mean": _r(log.padded_len[timed].mean(), 1) if timed.any() else None,
        "queue_ms_p50": queue["p50"],
        "queue_ms_p99": queue["p99"],
        "infer_ms_mean": _r(np.nanmean(log.infer_ms[timed])) if timed.any() else None,
        "padding_efficiency": (
            _r(tokens[0] / tokens[1], 4) if tokens is not None and tokens[1] > 0 else None
        ),
        "stages_ms": stage_summary(log, timed),
    }
    return out


STAGES: tuple[str, ...] = ("send_lag", "intake", "queue", "forward", "reply")
"""The stages of one request, in order (module docstring, **stages**)."""


def stage_times_ms(log: RunLog) -> dict[str, npt.NDArray[np.float64]]:
    """Each stage's milliseconds per request (:data:`STAGES`; ``nan`` where unknown)."""
    handed = log.reply_ts_s
    return {
        "send_lag": (log.sent_s - log.intended_s) * 1000.0,
        "intake": (handed - log.sent_s) * 1000.0 - log.queue_ms - log.infer_ms,
        "queue": log.queue_ms,
        "forward": log.infer_ms,
        "reply": (log.received_s - handed) * 1000.0,
    }


def stage_summary(log: RunLog, rows: npt.NDArray[np.bool_]) -> dict[str, dict[str, float | None]]:
    """``{stage: {"p50", "p99", "mean"}}`` in ms over ``rows`` (:func:`stage_times_ms`)."""
    out: dict[str, dict[str, float | None]] = {}
    for name, values in stage_times_ms(log).items():
        s = latency_summary(values[rows])
        out[name] = {"p50": s["p50"], "p99": s["p99"], "mean": s["mean"]}
    return out


def error_rate(summary: dict[str, Any]) -> float:
    """Failed measured requests / scheduled ones, in [0, 1] (0 for an empty window).

    Failed: timeouts, error replies and send failures. Replies marked ``expired`` (a deadline
    the caller chose with ``--deadline-after-ms``) are answers, not failures.
    """
    failed = summary["timeouts"] + summary["errors"] + summary["send_failures"]
    return float(failed / summary["scheduled"]) if summary["scheduled"] else 0.0


@dataclass(frozen=True)
class KneeRule:
    """When a step of a rate sweep counts as saturated (:func:`find_knee`).

    A step saturates when any of these holds:

    - its reply throughput is below ``keep_up_ratio`` × its offered rate (the server no longer
      keeps up), or it timed requests out;
    - its p99 latency is above ``p99_factor`` × the first step's p99 (the queue grows before
      the throughput shows it: at the first step the server is far from saturation, so its p99
      is the service time plus batching wait; 3 ×: an M/M/1 queue's mean latency at 2/3
      utilisation, past which it climbs steeply);
    - its p99 is above ``p99_bound_ms``, when set (a latency budget).
    """

    keep_up_ratio: float = 0.9
    p99_factor: float = 3.0
    p99_bound_ms: float | None = None

    def text(self) -> str:
        """The rule in words, as the report prints it."""
        bound = "" if self.p99_bound_ms is None else f" or > {self.p99_bound_ms:g} ms"
        return (
            f"a step saturates when its replies/s < {self.keep_up_ratio:g} x offered, it "
            f"timed requests out, or its p99 > {self.p99_factor:g} x the first step's{bound}"
        )

    def saturation(self, step: dict[str, Any], first_p99_ms: float | None) -> str | None:
        """Why ``step`` (a row of :func:`window_stats`) is saturated, in words; None if not."""
        offered = step.get("offered_rate_per_s") or 0.0
        thr = step.get("reply_throughput_per_s") or 0.0
        if thr < self.keep_up_ratio * offered:
            return f"{thr:g} replies/s < {self.keep_up_ratio:g} x {offered:g}/s offered"
        if step.get("timeouts", 0) > 0:
            return f"{step['timeouts']} timeouts"
        p99 = step["latency_ms"]["p99"]
        if p99 is None:
            return None
        if self.p99_bound_ms is not None and p99 > self.p99_bound_ms:
            return f"p99 {p99:g} ms > {self.p99_bound_ms:g} ms"
        if first_p99_ms is not None and p99 > self.p99_factor * first_p99_ms:
            return f"p99 {p99:g} ms > {self.p99_factor:g} x the first step's {first_p99_ms:g} ms"
        return None


def find_knee(steps: Sequence[dict[str, Any]], rule: KneeRule | None = None) -> dict[str, Any]:
    """The knee of a rate sweep (rows of :func:`window_stats`, in offered-rate order).

    The knee is the last step before the first saturated one (:class:`KneeRule`): up to it
    the server keeps up at a steady latency; past it throughput flattens or p99 climbs.
    Returns the knee's step (1-based)/offered rate/throughput/p99 (``None`` when even the
    first step saturated), the first saturated step and why (``None`` when none did), the
    highest throughput seen, the p99 growth from the first step to the last and the rule.
    """
    rule = rule or KneeRule()
    knee: int | None = None
    saturated: int | None = None
    reason: str | None = None
    first_p99 = steps[0]["latency_ms"]["p99"] if steps else None
    for i, s in enumerate(steps):
        reason = rule.saturation(s, first_p99)
        if reason is not None:
            saturated = i
            break
        knee = i
    p99s = [s["latency_ms"]["p99"] for s in steps if s["latency_ms"]["p99"] is not None]
    thr_all = [s.get("reply_throughput_per_s") or 0.0 for s in steps]
    return {
        "rule": rule.text(),
        "knee_step": None if knee is None else knee + 1,
        "knee_offered_rate_per_s": None if knee is None else steps[knee]["offered_rate_per_s"],
        "knee_throughput_per_s": None if knee is None else steps[knee]["reply_throughput_per_s"],
        "knee_p99_ms": None if knee is None else steps[knee]["latency_ms"]["p99"],
        "first_saturated_step": None if saturated is None else saturated + 1,
        "saturated_because": reason,
        "max_throughput_per_s": _r(max(thr_all)) if thr_all else None,
        "p99_growth": _r(p99s[-1] / p99s[0], 2) if len(p99s) >= 2 and p99s[0] > 0 else None,
    }


def burst_stats(
    log: RunLog, schedule: Schedule, after_s: float, recovery_factor: float = 2.0
) -> dict[str, Any]:
    """Per burst of a pulse run: p99 before (the base load ahead of the first burst), during,
    and in the ``after_s`` after it, and the recovery time.

    Recovery: seconds from the burst's end to the scheduled send of the last request before
    the next burst whose latency still exceeded ``recovery_factor × baseline p99`` (0 when
    none did; the rest of the run when the run ended first). ``baseline`` is the p99 of
    the base requests ahead of the first burst (warm-up excluded).
    """
    segs = schedule.segments
    bursts = [s for s in segs if s.phase == "burst"]
    lat = log.latency_ms
    ans = log.answered
    first_burst_start = bursts[0].start_s if bursts else schedule.end_s
    base_before = [(s.start_s, min(s.end_s, first_burst_start)) for s in segs if s.phase == "base"]
    base_before = [(lo, hi) for lo, hi in base_before if hi > lo]
    before = _in_intervals(log.intended_s, base_before) & ans
    baseline = latency_summary(lat[before])
    threshold = None if baseline["p99"] is None else recovery_factor * float(baseline["p99"])
    rows: list[dict[str, Any]] = []
    for i, b in enumerate(bursts):
        nxt = bursts[i + 1].start_s if i + 1 < len(bursts) else schedule.end_s
        during = _in_intervals(log.intended_s, [(b.start_s, b.end_s)]) & ans
        after_end = min(b.end_s + after_s, nxt)
        after = _in_intervals(log.intended_s, [(b.end_s, after_end)]) & ans
        until_next = _in_intervals(log.intended_s, [(b.end_s, nxt)])
        recovery: float | None = None
        if threshold is not None:
            slow = until_next & ((lat > threshold) | ~ans)
            recovery = _r(float(log.intended_s[slow].max()) - b.end_s, 3) if slow.any() else 0.0
        rows.append(
            {
                "burst": i + 1,
                "start_s": _r(b.start_s),
                "end_s": _r(b.end_s),
                "rate_per_s": b.rate_per_s,
                "p99_during_ms": latency_summary(lat[during])["p99"],
                "max_during_ms": latency_summary(lat[during])["max"],
                "p99_after_ms": latency_summary(lat[after])["p99"],
                "after_window_s": _r(after_end - b.end_s),
                "recovery_s": recovery,
            }
        )
    return {
        "baseline_p99_ms": baseline["p99"],
        "recovery_threshold_ms": None if threshold is None else _r(threshold),
        "bursts": rows,
    }


def build_report(
    log: RunLog,
    schedule: Schedule,
    *,
    pattern: str,
    after_s: float = 0.0,
    boundary_tokens: Sequence[tuple[float, float] | None] | None = None,
    knee_rule: KneeRule | None = None,
) -> dict[str, Any]:
    """The whole report of a run: ``summary`` over the measured (non-warm-up) requests,
    ``phases`` (one row per step; base/burst/after for a pulse), and ``knee`` (step) or
    ``bursts`` (pulse).

    ``boundary_tokens``: cumulative (real, padded) server token counters read at each segment
    boundary (``len(segments) + 1`` entries, ``None`` where unread), for padding efficiency.
    """
    segs = schedule.segments
    measured_segs = [s for s in segs if s.phase != "warmup"]
    start_s = measured_segs[0].start_s if measured_segs else 0.0
    measured = schedule.measured
    answered_measured = measured & log.answered
    last_rx = float(np.nanmax(log.received_s[answered_measured])) if answered_measured.any() else 0
    overall_end = max(schedule.end_s, last_rx)
    first_measured = segs.index(measured_segs[0]) if measured_segs else 0

    def tok(i: int, j: int) -> tuple[float, float] | None:
        if boundary_tokens is None or boundary_tokens[i] is None or boundary_tokens[j] is None:
            return None
        a, b = boundary_tokens[i], boundary_tokens[j]
        assert a is not None and b is not None
        return (b[0] - a[0], b[1] - a[1])

    summary = window_stats(
        log, measured, [(start_s, schedule.end_s)], "all", tok(first_measured, len(segs))
    )
    summary["reply_throughput_per_s"] = (
        _r(answered_measured.sum() / (overall_end - start_s)) if overall_end > start_s else None
    )
    summary["duration_s"] = _r(overall_end - start_s)

    report: dict[str, Any] = {"pattern": pattern, "summary": summary, "phases": []}
    if pattern == "step":
        for k, s in enumerate(segs):
            if s.phase != "step":
                continue
            rows = schedule.segment_index == k
            row = window_stats(log, rows, [(s.start_s, s.end_s)], s.label, tok(k, k + 1))
            row["rate_per_s"] = s.rate_per_s
            report["phases"].append(row)
        report["knee"] = find_knee(report["phases"], knee_rule)
    elif pattern == "pulse":
        bursts = [(s.start_s, s.end_s) for s in segs if s.phase == "burst"]
        starts = [lo for lo, _ in bursts[1:]] + [schedule.end_s]
        afters = [(hi, min(hi + after_s, nxt)) for (_, hi), nxt in zip(bursts, starts, strict=True)]
        base = _subtract([(s.start_s, s.end_s) for s in segs if s.phase == "base"], afters)
        for name, intervals in (("base", base), ("burst", bursts), ("after burst", afters)):
            intervals = [(lo, hi) for lo, hi in intervals if hi > lo]
            if intervals:
                rows = _in_intervals(log.intended_s, intervals) & measured
                report["phases"].append(window_stats(log, rows, intervals, name))
        report.update(burst_stats(log, schedule, after_s))
    else:
        report["phases"].append(summary)
    return report


# ---- printing --------------------------------------------------------------------------------


def report_console(*, min_width: int = 132) -> Any:
    """A ``rich`` console for reports: the terminal's width, or ``min_width`` columns when
    stdout is not a terminal (rich would otherwise cut wide tables to 80 columns)."""
    from rich.console import Console

    console = Console()
    return console if console.is_terminal else Console(width=min_width)


def _or_dash(value: object) -> str:
    """A figure as printed, ``-`` when unknown (e.g. no ``--metrics-url`` to read it from)."""
    return "-" if value is None else str(value)


def knee_line(k: dict[str, Any]) -> str:
    """The report's one line about :func:`find_knee`'s result ``k``, in words where a step is
    ``None`` (never "first saturated step None")."""
    knee = (
        f"step {k['knee_step']} at {k['knee_offered_rate_per_s']}/s offered "
        f"({k['knee_throughput_per_s']} replies/s, p99 {k['knee_p99_ms']} ms)"
        if k["knee_step"] is not None
        else "none (even the first step saturated the server)"
    )
    saturated = k["first_saturated_step"]
    return (
        f"knee: {knee}; "
        + (
            "no step saturated"
            if saturated is None
            else f"first saturated step {saturated} ({k['saturated_because']})"
        )
        + f"; max throughput {k['max_throughput_per_s']}/s; p99 grew {k['p99_growth']}x "
        f"({k['rule']})"
    )


def print_report(report: dict[str, Any], console: Any) -> None:
    """Print ``report`` as rich tables on ``console`` (a :class:`rich.console.Console`)."""
    from rich.table import Table

    s = report["summary"]
    lat = s["latency_ms"]
    console.print(
        f"[bold]kbatch load[/] {report['pattern']}: {s['scheduled']} scheduled, {s['sent']} "
        f"sent, {s['answered']} answered ({s['ok']} ok, {s['errors']} errors, {s['expired']} "
        f"expired, {s['timeouts']} timeouts, {s['send_failures']} send failures) in "
        f"{s['duration_s']} s"
    )
    console.print(
        f"offered {s['offered_rate_per_s']}/s, sent {s['achieved_send_rate_per_s']}/s, replies "
        f"{s['reply_throughput_per_s']}/s; latency ms p50 {lat['p50']} p95 {lat['p95']} "
        f"p99 {lat['p99']} max {lat['max']}; batch size {s['batch_size_mean']} (per batch "
        f"{s['batch_size_per_batch_mean']}), padded len {s['padded_len_mean']}, padding "
        f"efficiency {_or_dash(s['padding_efficiency'])}"
    )
    if report["pattern"] in ("step", "pulse"):
        table = Table(title=f"per {'step' if report['pattern'] == 'step' else 'phase'}")
        cols = [
            ("phase", "name"),
            ("offered/s", "offered_rate_per_s"),
            ("sent/s", "achieved_send_rate_per_s"),
            ("replies/s", "reply_throughput_per_s"),
            ("p50 ms", ("latency_ms", "p50")),
            ("p95 ms", ("latency_ms", "p95")),
            ("p99 ms", ("latency_ms", "p99")),
            ("max ms", ("latency_ms", "max")),
            ("err", "errors"),
            ("exp", "expired"),
            ("t/o", "timeouts"),
            ("batch", "batch_size_mean"),
            ("pad eff", "padding_efficiency"),
        ]
        for title, _ in cols:
            table.add_column(title, justify="left" if title == "phase" else "right")
        for row in report["phases"]:
            cells = []
            for _, key in cols:
                v = row[key[0]][key[1]] if isinstance(key, tuple) else row[key]
                cells.append(_or_dash(v))
            table.add_row(*cells)
        console.print(table)
    if "knee" in report:
        console.print(knee_line(report["knee"]))
    if "bursts" in report:
        console.print(f"baseline p99 {report['baseline_p99_ms']} ms")
        for b in report["bursts"]:
            console.print(
                f"burst {b['burst']} [{b['start_s']}, {b['end_s']}) s at {b['rate_per_s']}/s: "
                f"p99 during {b['p99_during_ms']} ms, after {b['p99_after_ms']} ms "
                f"(next {b['after_window_s']} s), recovered in {b['recovery_s']} s"
            )
    for t in report.get("slowest_traces", []):  # kbatch load --traceparent
        console.print(f"slow request {t['latency_ms']} ms: trace {t['trace_id']}")
    for path in report.get("plots", []):
        console.print(f"plot: {path}")
