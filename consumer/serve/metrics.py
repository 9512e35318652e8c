"""Every metric of ``kbatch serve`` in one place (prometheus-client, prefix ``kbatch_``).

Served with ``/healthz`` and ``/readyz`` by :class:`HealthServer` on ``--metrics-port``,
bound to 127.0.0.1 unless ``--metrics-host`` says otherwise. Under ``kbatch serve --replicas N``
the values live in prometheus-client's multiprocess files and the supervisor serves them summed
for the host (each gauge's ``multiprocess_mode`` says how it combines). Durations are seconds (the
Prometheus convention); the names say so.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from consumer.batching.types import Lane
from consumer.cpu.threads import ThreadCpu, name_os_thread
from consumer.serve.lag_seconds import LagSeconds

_LATENCY_BUCKETS_S = (1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_MultiprocessMode = Literal["livesum", "livemax", "livemin", "liveall", "livemostrecent"]
"""How the supervisor combines a gauge over the replicas (prometheus-client's names)."""

_BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512)
_EFFICIENCY_BUCKETS = (0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.92, 0.94, 0.96, 0.98, 1.0)


class Metrics:
    """The service's metrics on their own registry (one per process, or per test)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._declare_records()
        self._declare_batches()
        self._declare_partitions()
        self._declare_process()
        self._refreshed_s = 0.0
        # bytes of accelerator memory in use now: serve sets the loaded model's probe
        self.device_memory: Callable[[], int] = lambda: 0

    def _declare_records(self) -> None:
        """Requests taken in and how each was answered (replies, dead letters, shortcuts)."""
        self.records_consumed = self._counter(
            "kbatch_records_consumed_total", "Request records taken from Kafka.", ["topic"]
        )
        self.replies = self._counter(
            "kbatch_replies_total", "Replies acknowledged by the broker, by status.", ["status"]
        )
        self.lane_replies = self._counter(
            "kbatch_lane_replies_total",
            "Replies acknowledged by the broker, by lane (the request's priority: live or "
            "bulk) and status; kbatch_replies_total is their sum over lanes.",
            ["lane", "status"],
        )
        self._reply_children: dict[tuple[str, str], _ReplyCount] = {}
        self.dead_letters = self._counter(
            "kbatch_dead_letters_total", "Dead letters acknowledged, by error code.", ["code"]
        )
        self.dead_letters_failed = self._counter(
            "kbatch_dead_letters_failed_total",
            "Bad records whose dead letter the broker refused even cut down (logged with "
            "their offset; the record was still completed so its partition moves on).",
            ["code"],
        )
        self.skipped_completed = self._counter(
            "kbatch_records_skipped_completed_total",
            "Request records skipped on intake because a previous owner of their partition "
            "answered them (its commit metadata said so): neither computed nor answered again.",
        )
        self.dedup_hits = self._counter(
            "kbatch_dedup_hits_total", "Requests answered from another copy of the same key."
        )
        self.key_reused = self._counter(
            "kbatch_idempotency_key_reused_total",
            "Requests answered idempotency_key_reused: their key was in flight or answered "
            "within the dedup window for another input (contract 1.4).",
        )
        self.trace_headers_ignored = self._counter(
            "kbatch_trace_headers_ignored_total",
            "Request trace headers (traceparent, tracestate) ignored under --tracing: "
            "repeated, oversized, encoding (not ASCII), invalid; the request is served "
            "without them (docs/TRACING.md).",
            ["reason"],
        )
        self.expired = self._counter(
            "kbatch_expired_total", "Requests answered expired, never computed."
        )
        self.failed_items = self._counter(
            "kbatch_inference_failed_total", "Requests answered inference_failed."
        )

    def _declare_batches(self) -> None:
        """The model's batches: sizes, tokens, padding, waits and times."""
        self.oom_splits = self._counter(
            "kbatch_oom_splits_total", "Batches split in half after a failure."
        )
        self.batch_size = self._histogram(
            "kbatch_batch_size",
            "Requests per batch run, by lane (live or bulk; a batch never mixes lanes).",
            ["lane"],
            buckets=_BATCH_SIZE_BUCKETS,
        )
        self.tokens_real = self._counter(
            "kbatch_tokens_real_total", "Real (non-padding) tokens computed."
        )
        self.tokens_padded = self._counter(
            "kbatch_tokens_padded_total", "Padded tokens computed (padded_len × batch size)."
        )
        self.padding_efficiency = self._histogram(
            "kbatch_padding_efficiency",
            "Real / padded tokens per batch.",
            buckets=_EFFICIENCY_BUCKETS,
        )
        self.queue_wait = self._histogram(
            "kbatch_queue_wait_seconds",
            "Time a request waited in its bucket, by lane (live or bulk).",
            ["lane"],
            buckets=_LATENCY_BUCKETS_S,
        )
        self.inference_time = self._histogram(
            "kbatch_inference_seconds", "Model time of one batch.", buckets=_LATENCY_BUCKETS_S
        )
        self.end_to_end = self._histogram(
            "kbatch_end_to_end_seconds",
            "Record timestamp to reply acknowledged (includes producer→broker time).",
            buckets=_LATENCY_BUCKETS_S,
        )

    def _declare_partitions(self) -> None:
        """Per partition and member: commits, in-flight work, backpressure, lag, rebalances."""
        self.commit_metadata_truncated = self._counter(
            "kbatch_commit_metadata_truncated_total",
            "Partition commits whose finished-offset metadata did not fit the broker's "
            "offset.metadata.max.bytes; the lowest offsets were kept, the rest are recomputed "
            "after a crash.",
        )
        self.transaction_recoveries = self._counter(
            "kbatch_transaction_recoveries_total",
            "--exactly-once: partitions whose transaction failed without a fence (reason: "
            "unknown_outcome, unacknowledged_send, aborted) and were recovered in place: new "
            "producer, rewound to the committed offset, computed again.",
            ["reason"],
        )
        self.commit_time = self._histogram(
            "kbatch_commit_seconds", "Latency of one offset commit.", buckets=_LATENCY_BUCKETS_S
        )
        self.in_flight_records = self._gauge(
            "kbatch_in_flight_records", "Records taken in and not yet answered."
        )
        self.in_flight_tokens = self._gauge(
            "kbatch_in_flight_tokens", "Tokens of the records in flight."
        )
        self.pauses = self._counter(
            "kbatch_pauses_total", "Partitions paused by backpressure (each pause counted)."
        )
        self.paused_partitions = self._gauge(
            "kbatch_paused_partitions", "Partitions paused by backpressure."
        )
        self.assigned_partitions = self._gauge(
            "kbatch_assigned_partitions",
            "Partitions assigned to this member (with replicas: to this host's members).",
        )
        # replicas: a partition's owner wrote last (a revoked owner's series goes stale)
        self.lag = self._gauge(
            "kbatch_consumer_lag",
            "Records not yet committed per assigned partition: log end offset minus the "
            "committed offset (or, before the first commit, the offset reading started from).",
            ["topic", "partition"],
            mode="livemostrecent",
        )
        self.rebalances = self._counter(
            "kbatch_rebalances_total", "Partition revocations and assignments.", ["kind"]
        )

    def _declare_process(self) -> None:
        """This process: engine health, accelerator memory and use, drain time, CPU plan."""
        self.engine_healthy = self._gauge(
            "kbatch_engine_healthy",
            "1 unless a batch overran the watchdog (with replicas: of every replica).",
            mode="livemin",
        )
        self.gpu_memory = self._gauge(
            "kbatch_gpu_memory_bytes",
            "CUDA memory allocated by torch (0 on CPU; with replicas: their sum).",
        )
        self.model_busy = BusyWindow()
        self.model_busy_ratio = self._gauge(
            "kbatch_model_busy_ratio",
            f"Fraction of the last {self.model_busy.window_s:g} s of wall time the model ran "
            "batches (the accelerator-utilisation proxy; also on CPU; with replicas: one "
            "series per replica process, its pid in /readyz).",
            mode="liveall",
        )
        self.model_busy_ratio.set_function(self.model_busy.ratio)
        self.lag_windows = LagSeconds()
        self.lag_seconds = self._gauge(
            "kbatch_lag_seconds",
            "Seconds to answer this member's backlog at its recent answer rate: the sum of "
            "kbatch_consumer_lag over the offsets answered and committed per second in the "
            f"last {self.lag_windows.window_s:g} s, over its partitions (0 without a backlog; "
            f"{self.lag_windows.cap_s:g} when the window answered nothing). The group's value, "
            "the autoscaling signal, is the recording rule kbatch:lag_seconds "
            "(docs/CLUSTER.md §KEDA); with replicas: the slowest replica's.",
            mode="livemax",
        )
        self.partition_lag_seconds = self._gauge(
            "kbatch_partition_lag_seconds",
            "kbatch_lag_seconds of one assigned partition: its lag over its own answer rate "
            f"(the last {self.lag_windows.window_s:g} s; {self.lag_windows.cap_s:g} when it "
            "answered nothing there: just assigned, paused or stuck).",
            ["topic", "partition"],
            mode="livemostrecent",
        )
        self.cpu_budget = self._gauge(
            "kbatch_cpu_budget_cores",
            "Cores this process may use: the smallest of its affinity set, the cgroup CPU "
            "quota (rounded up) and --cpu-budget (docs/CPU.md; with replicas: the sum of "
            "their shares, the host's budget).",
        )
        self.threads = self._gauge(
            "kbatch_threads",
            "Threads of each pool sized from the CPU budget: torch (intra-op, also ONNX "
            "Runtime's), torch_interop, tokenizer (the Rust tokenizer's Rayon pool), event_loop "
            "(with replicas: summed over them).",
            ["pool"],
        )
        self.thread_cpu = ThreadCpu()
        self.thread_cpu_seconds = self._counter(
            "kbatch_thread_cpu_seconds_total",
            "CPU seconds (user + system) spent by this process's threads of each role: "
            "event_loop, kafka_consumer (the confluent-kafka consumer's owner thread), "
            "librdkafka (its own threads), tokenizer, model, collate, http, jobs, other "
            "(torch's pools, blocking calls); read from /proc once a second (Linux only; with "
            "replicas: summed over them).",
            ["thread"],
        )

    def _counter(self, name: str, help_text: str, labels: Sequence[str] = ()) -> Counter:
        return Counter(name, help_text, labels, registry=self.registry)

    def _gauge(
        self,
        name: str,
        help_text: str,
        labels: Sequence[str] = (),
        mode: _MultiprocessMode = "livesum",
    ) -> Gauge:
        """``mode``: how the supervisor combines the replicas' values (prometheus-client's
        ``multiprocess_mode``); a sum over the host unless the metric says otherwise."""
        return Gauge(name, help_text, labels, registry=self.registry, multiprocess_mode=mode)

    def _histogram(
        self, name: str, help_text: str, labels: Sequence[str] = (), *, buckets: Sequence[float]
    ) -> Histogram:
        return Histogram(name, help_text, labels, buckets=buckets, registry=self.registry)

    def show_cpu_plan(self, budget_cores: float, pools: Mapping[str, int]) -> None:
        """Publish this process's CPU budget (cores) and its pools' thread counts
        (:meth:`consumer.cpu.plan.ThreadPlan.pools`)."""
        self.cpu_budget.set(budget_cores)
        for pool, n in pools.items():
            self.threads.labels(pool=pool).set(n)

    def refresh(self, now_s: float) -> None:
        """Write the computed gauges' current values (``kbatch_model_busy_ratio``,
        ``kbatch_gpu_memory_bytes``) to their stored value and count the threads' CPU
        (``kbatch_thread_cpu_seconds_total``), at most once a second of ``now_s`` (monotonic
        seconds).

        A gauge computed at scrape time (``set_function``) is read from this process's registry;
        under ``kbatch serve --replicas`` the host's ``/metrics`` reads the multiprocess files
        instead, which only a ``set`` updates: :class:`HealthServer` calls this on every beat.
        """
        if now_s - self._refreshed_s >= 1.0:
            self._refreshed_s = now_s
            self.model_busy_ratio.set(self.model_busy.ratio())
            self.gpu_memory.set(self.device_memory())
            for role, seconds in self.thread_cpu.sample().items():
                self.thread_cpu_seconds.labels(role).inc(seconds)

    def show_lag(self, now_s: float, lags: Mapping[tuple[str, int], tuple[int, int]]) -> None:
        """Publish one lag refresh: ``lags`` maps each assigned ``(topic, partition)`` to
        ``(lag base offset, lag in records)`` (:meth:`consumer.serve.rebalance.Rebalancer.
        refresh_lag`); ``now_s`` is monotonic seconds. Sets ``kbatch_consumer_lag``,
        ``kbatch_partition_lag_seconds`` and ``kbatch_lag_seconds``."""
        for (topic, partition), (base, lag) in lags.items():
            self.lag.labels(topic, str(partition)).set(lag)
            seconds = self.lag_windows.observe(now_s, (topic, partition), base, lag)
            self.partition_lag_seconds.labels(topic, str(partition)).set(seconds)
        self.lag_seconds.set(self.lag_windows.total())

    def forget_partition(self, tp: tuple[str, int]) -> None:
        """Remove the per-partition series of ``(topic, partition)`` (after a revoke)."""
        with contextlib.suppress(KeyError), warnings.catch_warnings():
            # multiprocess mode (kbatch serve --replicas) cannot remove a series; its value
            # stays in the file and the new owner's newer value wins (livemostrecent)
            warnings.simplefilter("ignore", UserWarning)
            self.lag.remove(tp[0], str(tp[1]))
            self.partition_lag_seconds.remove(tp[0], str(tp[1]))
        self.lag_windows.forget(tp)

    def reply_status(self, status: str, lane: Lane = "live") -> _ReplyCount:
        """The ``kbatch_replies_total`` child of ``status`` and the ``kbatch_lane_replies_total``
        child of ``(lane, status)``, counted together (cached: this is per record)."""
        child = self._reply_children.get((status, lane))
        if child is None:
            child = self._reply_children[(status, lane)] = _ReplyCount(
                self.replies.labels(status), self.lane_replies.labels(lane, status)
            )
        return child

    def render(self) -> bytes:
        """The text exposition of every metric."""
        return generate_latest(self.registry)


class _ReplyCount:
    """Counts replies of one status and lane in both reply counters."""

    __slots__ = ("_by_lane", "_total")

    def __init__(self, total: Counter, by_lane: Counter) -> None:
        self._total = total
        self._by_lane = by_lane

    def inc(self, amount: float = 1) -> None:
        self._total.inc(amount)
        self._by_lane.inc(amount)


class BusyWindow:
    """How much of a recent wall-clock window the model spent running batches.

    :meth:`add` takes each finished batch's model time; :meth:`ratio` is the busy time that
    falls inside the last ``window_s`` seconds over the window's length (the time since the
    first :meth:`add` while that is shorter), in [0, 1]. A batch still running is counted once
    it ends. Thread-safe: batches end on the model thread, scrapes read from the HTTP thread.

    Args:
        window_s: the window, seconds (60: a 15 s scrape sees a smoothed value).
        clock: monotonic seconds (a fake in tests).
    """

    def __init__(self, window_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        if window_s <= 0:
            raise ValueError(f"window_s must be positive, got {window_s}")
        self.window_s = window_s
        self._clock = clock
        self._since_s: float | None = None
        self._batches: deque[tuple[float, float]] = deque()  # (start_s, end_s), by end
        self._busy_s = 0.0  # the sum of end_s - start_s over _batches
        self._longest_s = 0.0  # the longest batch added
        self._lock = threading.Lock()

    def add(self, busy_s: float) -> None:
        """One batch that ran for ``busy_s`` seconds and ended now."""
        end = self._clock()
        with self._lock:
            if self._since_s is None:
                self._since_s = end - busy_s
            self._batches.append((end - busy_s, end))
            self._busy_s += busy_s
            self._longest_s = max(self._longest_s, busy_s)
            self._drop_before(end - self.window_s)

    def ratio(self) -> float:
        """Busy seconds in the window / the window's length (0.0 before the first batch).

        O(1) amortized, not O(batches in the window): a scrape holds the lock that the model
        thread's :meth:`add` waits for, and a busy device ends thousands of batches a minute.
        """
        now = self._clock()
        with self._lock:
            if self._since_s is None:
                return 0.0
            start = max(now - self.window_s, self._since_s)
            self._drop_before(start)
            busy = self._busy_s
            # Only a batch that ended within the longest batch's time of the window's start
            # can have begun before it: count those from the start.
            for begin, end in self._batches:
                if end > start + self._longest_s:
                    break
                if begin < start:
                    busy -= start - begin
            if self._batches and self._batches[-1][1] > now:  # a clock that stepped back
                busy = sum(min(e, now) - max(b, start) for b, e in self._batches)
        span = now - start
        return max(0.0, min(1.0, busy / span)) if span > 0 else 0.0

    def _drop_before(self, start_s: float) -> None:
        while self._batches and self._batches[0][1] <= start_s:
            begin, end = self._batches.popleft()
            self._busy_s -= end - begin
        if not self._batches:
            self._busy_s = 0.0  # no drift carried past an idle spell


ReadinessProbe = Callable[[], tuple[bool, dict[str, Any]]]
LivenessProbe = Callable[[], tuple[bool, dict[str, Any]]]


class Exposition(Protocol):
    """What :class:`HealthServer` serves on ``/metrics``: :class:`Metrics`, or the host-wide
    view of ``kbatch serve --replicas`` (:mod:`consumer.serve.replicas`)."""

    def render(self) -> bytes:
        """The text exposition."""
        ...

    def refresh(self, now_s: float) -> None:
        """Bring computed values up to date (called on every event-loop beat)."""
        ...


class _QuietServer(ThreadingHTTPServer):
    """An HTTP server that counts a client hanging up mid-answer (``BrokenPipeError``,
    ``ConnectionResetError``) instead of printing socketserver's traceback to stderr; other
    errors of a request keep socketserver's report."""

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        *,
        on_hangup: Callable[[], None],
    ) -> None:
        self._on_hangup = on_hangup
        super().__init__(address, handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):
            self._on_hangup()
            return
        super().handle_error(request, client_address)


class HealthServer:
    """``/metrics``, ``/healthz`` (the process is alive) and ``/readyz`` (ready to serve).

    Runs in a daemon thread so a busy event loop cannot hide the endpoints; the pipeline calls
    :meth:`beat` from its loop and ``/healthz`` fails (503) when no beat came for
    ``stale_after_s`` or when ``live`` says so (serve's: the engine is wedged,
    :mod:`consumer.serve.wedge`); its JSON body merges ``live``'s detail.
    """

    def __init__(
        self,
        metrics: Exposition,
        ready: ReadinessProbe,
        host: str = "127.0.0.1",
        port: int = 9400,
        stale_after_s: float = 30.0,
        live: LivenessProbe | None = None,
    ) -> None:
        self._metrics = metrics
        self._ready = ready
        self._live: LivenessProbe = live or (lambda: (True, {}))
        self._stale_after_s = stale_after_s
        self._last_beat = time.monotonic()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._send(200, server._metrics.render(), CONTENT_TYPE_LATEST)
                elif path == "/healthz":
                    age = time.monotonic() - server._last_beat
                    live, detail = server._live()
                    ok = age < server._stale_after_s and live
                    body: dict[str, Any] = {"alive": ok, "loop_beat_age_s": round(age, 3)}
                    body.update(detail)
                    self._send(200 if ok else 503, json.dumps(body).encode(), "application/json")
                elif path == "/readyz":
                    ok, detail = server._ready()
                    body = {"ready": ok, **detail}
                    self._send(200 if ok else 503, json.dumps(body).encode(), "application/json")
                else:
                    self._send(404, b"not found\n", "text/plain")

            def _send(self, code: int, body: bytes, content_type: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                return

        self.hangups = 0
        """Requests whose client hung up before the answer was written (a probe that timed
        out, a scraper that closed): not an error of kbatch's, so never a traceback."""
        self._httpd = _QuietServer((host, port), Handler, on_hangup=self._hung_up)
        self._thread = threading.Thread(target=self._serve, name="kbatch-http", daemon=True)

    def _serve(self) -> None:
        name_os_thread("kbatch-http")
        self._httpd.serve_forever()

    def _hung_up(self) -> None:
        self.hangups += 1

    @property
    def port(self) -> int:
        """The bound port (useful with port 0)."""
        return int(self._httpd.server_address[1])

    def start(self) -> None:
        """Serve in the background."""
        self._thread.start()

    def beat(self) -> None:
        """Record that the event loop is alive (called once per poll); refresh the computed
        gauges (:meth:`Metrics.refresh`)."""
        self._last_beat = now = time.monotonic()
        self._metrics.refresh(now)

    def stop(self) -> None:
        """Stop serving and close the socket (idempotent; a no-op before :meth:`start`)."""
        if self._thread.is_alive():
            self._httpd.shutdown()
            self._thread.join()
        self._httpd.server_close()


class PrometheusStats:
    """The engine's :class:`consumer.batching.stats.StatsSink`, recorded as Prometheus metrics."""

    def __init__(self, metrics: Metrics) -> None:
        self._m = metrics

    def on_batch(
        self,
        batch_size: int,
        real_tokens: int,
        padded_tokens: int,
        infer_ms: float,
        lane: Lane = "live",
    ) -> None:
        m = self._m
        m.batch_size.labels(lane).observe(batch_size)
        m.tokens_real.inc(real_tokens)
        m.tokens_padded.inc(padded_tokens)
        if padded_tokens:
            m.padding_efficiency.observe(real_tokens / padded_tokens)
        m.inference_time.observe(infer_ms / 1000)
        m.model_busy.add(infer_ms / 1000)

    def on_queue_wait(self, queue_ms: float, lane: Lane = "live") -> None:
        self._m.queue_wait.labels(lane).observe(queue_ms / 1000)

    def on_expired(self, n: int) -> None:
        self._m.expired.inc(n)

    def on_split(self) -> None:
        self._m.oom_splits.inc()

    def on_failed(self, n: int) -> None:
        self._m.failed_items.inc(n)

    def on_watchdog(self) -> None:
        self._m.engine_healthy.set(0)
