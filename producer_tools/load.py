"""The open-loop load generator behind ``kbatch load``.

A run, in order:

1. build the arrival schedule (:mod:`producer_tools.arrivals`) — every send time is fixed
   before the first send, so a slow server shows up as latency, never as a lower send rate;
2. start one :class:`~producer_tools.client.RequestReplyClient` and, unless disabled, send one
   probe request to make sure a server answers (left out of the statistics);
3. at each scheduled time start the request as its own task — a send never awaits an earlier
   reply; each request waits for its reply at most ``timeout_s``;
4. when ``metrics_url`` is given, read the server's token counters at every segment boundary
   and at the end (padding efficiency per step);
5. wait for every outstanding reply (or its timeout), then build the report
   (:mod:`producer_tools.report`) and, on request, the plots (:mod:`producer_tools.plots`).

Keys are ``<run id>-<index>``, unique per request, so the server computes each one.
"""

from __future__ import annotations

import asyncio
import signal
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

from producer_tools import arrivals
from producer_tools.client import ClientError, RequestReplyClient, RequestTimeoutError
from producer_tools.report import KneeRule, Outcome, RunLog, build_report
from producer_tools.tracing import new_trace_headers
from schemas.codec import Encoding

__all__ = ["LoadError", "LoadOptions", "LoadRun", "build_schedule", "run_load"]

Pattern = Literal["constant", "poisson", "step", "pulse"]
PATTERNS: tuple[Pattern, ...] = ("constant", "poisson", "step", "pulse")

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
"""What stops a run early with the report of what it sent (exit 130 and 143)."""

DEFAULT_DURATION_S = 20.0
"""Length of a constant, Poisson or pulse run given neither a duration nor a count."""


class LoadError(RuntimeError):
    """The run could not start (no server answers the probe, bad options)."""


@dataclass(frozen=True)
class LoadOptions:
    """Everything a run needs; see ``kbatch load --help`` for each option's meaning."""

    bootstrap: str
    request_topic: str
    reply_topic: str
    texts: Sequence[str]
    pattern: Pattern = "constant"
    rate_per_s: float = 20.0
    duration_s: float | None = None
    count: int | None = None
    rates_per_s: Sequence[float] | None = None
    steps: int = 5
    step_s: float = 10.0
    burst_factor: float = 5.0
    burst_s: float = 2.0
    burst_every_s: float = 10.0
    first_burst_s: float | None = None
    after_s: float | None = None
    poisson: bool = False
    warmup_s: float = 2.0
    seed: int = 0
    timeout_s: float = 30.0
    deadline_after_ms: int | None = None
    task: Literal["embed", "classify"] | None = None
    encoding: Encoding = Encoding.MSGPACK
    metrics_url: str | None = None
    probe: bool = True
    probe_timeout_s: float = 30.0
    knee_p99_factor: float = 3.0
    knee_p99_ms: float | None = None
    traceparent: bool = False
    client_options: dict[str, Any] = field(default_factory=dict)

    @property
    def after_window_s(self) -> float:
        """Pulse: the window after each burst reported as "after burst" (default 2 × burst)."""
        return self.after_s if self.after_s is not None else 2 * self.burst_s


def build_schedule(opts: LoadOptions) -> arrivals.Schedule:
    """The run's arrival schedule (warm-up first). Raises ``ValueError`` for bad options."""
    extend = False
    if opts.count is not None and opts.count < 1:
        raise ValueError(f"count must be >= 1, got {opts.count}")
    if opts.pattern in ("constant", "poisson"):
        duration = opts.duration_s
        if duration is None:
            if opts.count is not None:
                duration, extend = opts.count / opts.rate_per_s, True
            else:
                duration = DEFAULT_DURATION_S
        profile = arrivals.constant_profile(opts.rate_per_s, duration)
    elif opts.pattern == "step":
        rates = list(opts.rates_per_s or [opts.rate_per_s * (i + 1) for i in range(opts.steps)])
        step_s = opts.step_s if opts.duration_s is None else opts.duration_s / len(rates)
        profile = arrivals.step_profile(rates, step_s)
    elif opts.pattern == "pulse":
        profile = arrivals.pulse_profile(
            opts.rate_per_s,
            opts.duration_s or DEFAULT_DURATION_S,
            burst_factor=opts.burst_factor,
            burst_s=opts.burst_s,
            period_s=opts.burst_every_s,
            first_burst_s=opts.first_burst_s,
        )
    else:
        raise ValueError(f"unknown pattern {opts.pattern!r}; known: {PATTERNS}")
    profile = arrivals.with_warmup(profile, opts.warmup_s)
    max_count = None
    if opts.count is not None:
        warm = [s for s in profile if s.phase == "warmup"]
        n_warm = round(warm[0].rate_per_s * warm[0].duration_s) if warm else 0
        max_count = opts.count + n_warm
    return arrivals.arrival_times(
        profile,
        poisson=opts.pattern == "poisson" or opts.poisson,
        rng=np.random.default_rng(opts.seed),
        max_count=max_count,
        extend=extend,
    )


@dataclass
class LoadRun:
    """A finished run: the schedule followed, every request's fate, and the report."""

    schedule: arrivals.Schedule
    log: RunLog
    report: dict[str, Any]
    interrupted: bool = False
    """Stopped by Ctrl-C (SIGINT) or SIGTERM: schedule, log and report cover what was sent until
    then (``report["interrupted"]["signal"]`` says which)."""


def metric_sums(
    url: str, names: Collection[str], timeout_s: float = 2.0
) -> dict[str, float] | None:
    """Each of ``names`` present on the Prometheus text page at ``url`` (a ``kbatch serve``
    ``/metrics``) → the sum of its samples; None when the page cannot be fetched."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            body = resp.read().decode()
    except (OSError, urllib.error.URLError):
        return None
    sums: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(body):
            for sample in family.samples:
                if sample.name in names:
                    sums[sample.name] = sums.get(sample.name, 0.0) + float(sample.value)
    except ValueError:  # not a Prometheus text page (a /healthz, an HTML error page)
        return None
    return sums


def metric_by_label(
    url: str, name: str, label: str, timeout_s: float = 2.0
) -> dict[str, float] | None:
    """The samples of ``name`` on the Prometheus text page at ``url``, summed per value of
    ``label`` (e.g. ``kbatch_thread_cpu_seconds_total`` by ``thread``); None when the page
    cannot be fetched or read."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            body = resp.read().decode()
    except (OSError, urllib.error.URLError):
        return None
    sums: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(body):
            for sample in family.samples:
                if sample.name == name and label in sample.labels:
                    key = sample.labels[label]
                    sums[key] = sums.get(key, 0.0) + float(sample.value)
    except ValueError:
        return None
    return sums


TOKEN_COUNTERS = ("kbatch_tokens_real_total", "kbatch_tokens_padded_total")


def metrics_url_problem(url: str, timeout_s: float = 5.0) -> str | None:
    """Why ``kbatch load --metrics-url`` cannot read batch size and padding efficiency from
    ``url`` (it cannot be fetched, is not a Prometheus page, or has no kbatch token counters);
    None when it can. Checked once before the run, so a wrong URL is one line, not figures
    silently missing from the report."""
    got = metric_sums(url, TOKEN_COUNTERS, timeout_s)
    if got is None:
        return f"cannot read a Prometheus page at {url} (a kbatch serve's /metrics)"
    if len(got) != len(TOKEN_COUNTERS):
        return f"{url} has no kbatch token counters: is it a kbatch serve's /metrics?"
    return None


def _read_token_counters(url: str) -> tuple[float, float] | None:
    """(real, padded) from ``kbatch_tokens_real_total``/``kbatch_tokens_padded_total``."""
    got = metric_sums(url, TOKEN_COUNTERS)
    if got is None or len(got) != len(TOKEN_COUNTERS):
        return None
    real, padded = TOKEN_COUNTERS
    return got[real], got[padded]


class _Runner:
    def __init__(self, opts: LoadOptions, schedule: arrivals.Schedule, progress: bool) -> None:
        self.opts = opts
        self.schedule = schedule
        self.log = RunLog.empty(schedule.times_s)
        self.run_id = uuid.uuid4().hex[:8]
        self.t0 = 0.0
        # time.time() − time.monotonic(): reply timestamps (wall ms) into the run's frame.
        self.wall_minus_mono_s = time.time() - time.monotonic()
        self.sent = 0
        self.done = 0
        self.first_error: str | None = None
        self.tokens: list[tuple[float, float] | None] = [None] * (len(schedule.segments) + 1)
        self.progress = progress
        self.trace_ids: dict[int, str] = {}  # --traceparent: request index → its trace id
        self.stopped_at_s: float | None = None  # Ctrl-C: seconds from the start, when
        self.stopped_by: int | None = None  # the signal that stopped the run (SIGINT, SIGTERM)
        self._stop = asyncio.Event()

    async def one(self, client: RequestReplyClient, i: int) -> None:
        opts, log = self.opts, self.log
        deadline_ms = (
            int(time.time() * 1000) + opts.deadline_after_ms
            if opts.deadline_after_ms is not None
            else None
        )
        trace_headers: list[tuple[str, bytes]] = []
        if opts.traceparent:  # a trace of its own per request, named in the report
            self.trace_ids[i], trace_headers = new_trace_headers()
        log.sent_s[i] = time.monotonic() - self.t0
        self.sent += 1
        try:
            env = await client.request(
                opts.texts[i % len(opts.texts)],
                f"{self.run_id}-{i}",
                timeout_s=opts.timeout_s,
                deadline_ms=deadline_ms,
                task=opts.task,
                encoding=opts.encoding,
                trace_headers=trace_headers,
            )
        except RequestTimeoutError:
            log.outcome[i] = Outcome.TIMEOUT
        except ClientError as exc:
            log.outcome[i] = Outcome.SEND_FAILED
            self.first_error = self.first_error or repr(exc)
        else:
            reply = env.reply
            log.received_s[i] = env.received_s - self.t0
            log.reply_ts_s[i] = env.record.timestamp_ms / 1000.0 - self.wall_minus_mono_s - self.t0
            log.outcome[i] = Outcome[reply.status.upper()]  # OK, ERROR or EXPIRED
            log.dedup[i] = reply.dedup
            if reply.timing is not None:
                log.batch_size[i] = reply.timing.batch_size
                log.padded_len[i] = reply.timing.padded_len
                log.queue_ms[i] = reply.timing.queue_ms
                log.infer_ms[i] = reply.timing.infer_ms
            if reply.error is not None and self.first_error is None:
                self.first_error = f"{reply.error.code}: {reply.error.message}"
        finally:
            self.done += 1

    async def sample_tokens(self) -> None:
        url = self.opts.metrics_url
        assert url is not None
        for k, seg in enumerate(self.schedule.segments):
            await asyncio.sleep(max(0.0, self.t0 + seg.start_s - time.monotonic()))
            self.tokens[k] = await asyncio.to_thread(_read_token_counters, url)

    async def run(self) -> None:
        opts = self.opts
        async with RequestReplyClient(
            bootstrap=opts.bootstrap,
            request_topic=opts.request_topic,
            reply_topic=opts.reply_topic,
            encoding=opts.encoding,
            **opts.client_options,
        ) as client:
            if opts.probe:
                try:
                    await client.request(
                        opts.texts[0],
                        f"{self.run_id}-probe",
                        timeout_s=opts.probe_timeout_s,
                        task=opts.task,
                    )
                except RequestTimeoutError as exc:
                    raise LoadError(f"the probe request got no reply: {exc}") from exc
            with self._progress() as tick:
                self.t0 = time.monotonic() + 0.05
                self.wall_minus_mono_s = time.time() - time.monotonic()
                sampler = asyncio.create_task(self.sample_tokens()) if opts.metrics_url else None
                ticker = asyncio.create_task(self._tick(tick))
                tasks: list[asyncio.Task[None]] = []
                times = self.schedule.times_s
                i, n = 0, len(times)
                with self._stop_on_signal():
                    while i < n and not self._stop.is_set():
                        delay = self.t0 + times[i] - time.monotonic()
                        if delay > 0 and await self._stopped_within(delay):
                            break
                        now_rel = time.monotonic() - self.t0
                        while i < n and times[i] <= now_rel:  # all due: no sleep between
                            tasks.append(asyncio.create_task(self.one(client, i)))
                            i += 1
                    await self._finish(tasks)
                if sampler is not None:
                    sampler.cancel()
                    await asyncio.gather(sampler, return_exceptions=True)
                    self.tokens[-1] = await asyncio.to_thread(
                        _read_token_counters, opts.metrics_url or ""
                    )
                ticker.cancel()
                await asyncio.gather(ticker, return_exceptions=True)
                tick()

    @contextmanager
    def _stop_on_signal(self) -> Iterator[None]:
        """While sending and waiting for replies, SIGINT (Ctrl-C) or SIGTERM (``timeout``, a
        script's ``kill``) stops the run (no more sends, the requests in flight abandoned)
        instead of raising ``KeyboardInterrupt`` or ending the process: the report covers what
        was sent (:func:`cut_run`)."""
        loop = asyncio.get_running_loop()

        def stop(signum: int) -> None:
            if self.stopped_at_s is None:
                self.stopped_at_s = time.monotonic() - self.t0
                self.stopped_by = signum
            self._stop.set()

        for signum in STOP_SIGNALS:
            loop.add_signal_handler(signum, stop, signum)
        try:
            yield
        finally:
            for signum in STOP_SIGNALS:
                loop.remove_signal_handler(signum)

    async def _stopped_within(self, delay_s: float) -> bool:
        """Wait ``delay_s``; True when a stop came first."""
        try:
            await asyncio.wait_for(self._stop.wait(), delay_s)
        except TimeoutError:
            return False
        return True

    async def _finish(self, tasks: list[asyncio.Task[None]]) -> None:
        """Wait for the requests in flight, or, after a stop, cancel them (left unanswered)."""
        waiting = asyncio.gather(*tasks, return_exceptions=True)  # a cancel is a result too
        stopping = asyncio.create_task(self._stop.wait())
        either: list[asyncio.Future[Any]] = [waiting, stopping]
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if not waiting.done():
            for task in tasks:
                task.cancel()
        await waiting

    @contextmanager
    def _progress(self) -> Iterator[Callable[[], None]]:
        """A progress bar on stderr (none without ``progress``); yields its refresh."""
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        if not self.progress:
            yield lambda: None
            return
        total = len(self.schedule)
        n_warm = total - int(self.schedule.measured.sum())
        warm_note = f" ({n_warm} warm-up)" if n_warm else ""
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=False,
        ) as bar:
            task_id = bar.add_task(f"kbatch load {self.opts.pattern}", total=total, status="")

            def tick() -> None:
                ok = int((self.log.outcome == Outcome.OK).sum())
                lost = int((self.log.outcome == Outcome.TIMEOUT).sum())
                bar.update(
                    task_id,
                    completed=self.done,
                    status=f"sent {self.sent}/{total}{warm_note} in flight "
                    f"{self.sent - self.done} "
                    f"ok {ok} timeouts {lost}",
                )

            yield tick

    async def _tick(self, tick: Callable[[], None]) -> None:
        while True:
            tick()
            await asyncio.sleep(0.25)


async def run_load(opts: LoadOptions, *, progress: bool = True) -> LoadRun:
    """Run the load described by ``opts``; the schedule, per-request log and report.

    Raises:
        LoadError: no reply to the probe request, or no texts.
        ValueError: invalid pattern parameters.
        ClientError: the client could not start (broker down, reply topic missing).
    """
    if not opts.texts:
        raise LoadError("no texts to send")
    schedule = build_schedule(opts)
    runner = _Runner(opts, schedule, progress)
    await runner.run()
    log = runner.log
    if runner.stopped_at_s is not None:  # Ctrl-C: the report of what was sent until then
        schedule, log = cut_run(schedule, log, runner.sent, runner.stopped_at_s)
    report = build_report(
        log,
        schedule,
        pattern=opts.pattern,
        after_s=opts.after_window_s,
        boundary_tokens=runner.tokens if opts.metrics_url else None,
        knee_rule=KneeRule(p99_factor=opts.knee_p99_factor, p99_bound_ms=opts.knee_p99_ms),
    )
    if runner.first_error is not None:
        report["first_error"] = runner.first_error
    if runner.stopped_at_s is not None:
        report["interrupted"] = {
            "at_s": round(runner.stopped_at_s, 3),
            "signal": signal.Signals(runner.stopped_by or signal.SIGINT).name,
            "sent": runner.sent,
            "scheduled": len(runner.schedule),
            "unanswered_in_flight": int((log.outcome == Outcome.PENDING).sum()),
        }
    if runner.trace_ids:
        report["slowest_traces"] = slowest_traces(log, runner.trace_ids, schedule.measured)
    report["setup"] = {
        "bootstrap": opts.bootstrap,
        "request_topic": opts.request_topic,
        "reply_topic": opts.reply_topic,
        "pattern": opts.pattern,
        "poisson_arrivals": opts.pattern == "poisson" or opts.poisson,
        "segments": [
            {
                "phase": s.phase,
                "start_s": round(s.start_s, 3),
                "end_s": round(s.end_s, 3),
                "rate_per_s": s.rate_per_s,
            }
            for s in schedule.segments
        ],
        "warmup_s": opts.warmup_s,
        "timeout_s": opts.timeout_s,
        "deadline_after_ms": opts.deadline_after_ms,
        "encoding": opts.encoding.value,
        "texts": len(opts.texts),
        "seed": opts.seed,
        "run_id": runner.run_id,
        "metrics_url": opts.metrics_url,
    }
    return LoadRun(
        schedule=schedule, log=log, report=report, interrupted=runner.stopped_at_s is not None
    )


def cut_run(
    schedule: arrivals.Schedule, log: RunLog, sent: int, end_s: float
) -> tuple[arrivals.Schedule, RunLog]:
    """The run as if it had been planned to end at ``end_s`` (seconds from its start): the
    first ``sent`` requests (the schedule is sorted: those are the ones sent) and the segments
    begun by then, the last one ending at ``end_s``. Requests still in flight stay
    :attr:`Outcome.PENDING` (unanswered)."""
    segments = [seg for seg in schedule.segments if seg.start_s < end_s] or [schedule.segments[0]]
    last = segments[-1]
    segments[-1] = replace(last, end_s=max(last.start_s, min(last.end_s, end_s)))
    cut = arrivals.Schedule(
        times_s=schedule.times_s[:sent],
        segment_index=schedule.segment_index[:sent],
        segments=tuple(segments),
    )
    rows = {f.name: getattr(log, f.name)[:sent] for f in fields(log)}
    return cut, RunLog(**rows)


SLOWEST_TRACES = 5
"""``kbatch load --traceparent`` names this many of the slowest answered requests' traces."""


def slowest_traces(
    log: RunLog, trace_ids: dict[int, str], measured: np.ndarray[Any, np.dtype[np.bool_]]
) -> list[dict[str, Any]]:
    """The :data:`SLOWEST_TRACES` answered ``measured`` requests (the schedule's: not the
    warm-up, which the statistics leave out too) with the longest latency (scheduled send to
    reply), slowest first: ``{"trace_id", "latency_ms", "key_index"}`` — to look up in a
    tracing backend (docs/TRACING.md)."""
    latency_ms = (log.received_s - log.intended_s) * 1000.0
    answered = [i for i in trace_ids if measured[i] and not np.isnan(latency_ms[i])]
    answered.sort(key=lambda i: -latency_ms[i])
    return [
        {"trace_id": trace_ids[i], "latency_ms": round(float(latency_ms[i]), 1), "key_index": i}
        for i in answered[:SLOWEST_TRACES]
    ]


def write_plots(run: LoadRun, out_dir: Path, prefix: str) -> list[Path]:
    """The run's PNG plots (see :mod:`producer_tools.plots`); adds their paths to the report."""
    from producer_tools.plots import write_plots as _write

    paths = _write(run.log, run.schedule, run.report, out_dir, prefix)
    run.report["plots"] = [str(p) for p in paths]
    return paths
