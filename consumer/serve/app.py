"""Wiring of ``kbatch serve``: build the parts, handle signals, shut down in order.

Start, each part entered on an exit stack (:class:`consumer.lifecycle.Lifecycle`): metrics
server → engine (warm-up of every bucket's worst-case shape) → producer → consumer.
Stop (SIGTERM/SIGINT): stop fetching → flush the buckets → finish running batches → send →
commit → leave the stack: close the consumer, the producer, the engine, the metrics server →
exit 0, all under one shutdown deadline of ``drain_timeout_s`` (the drain keeps
:data:`consumer.lifecycle.CLOSE_RESERVE_S` of it for the closes); what is unanswered then is
dropped, left uncommitted, and the exit is 3.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from consumer.batching.config import BatchPolicyConfig
from consumer.batching.engine import Engine
from consumer.batching.fanout import FanOutEngine
from consumer.config import ServeSettings, project
from consumer.deadline import Deadline
from consumer.finish.checkpoint import DeliveryMode, ProducerSink
from consumer.kafka.config import ConsumerGroupSettings, KafkaClientSettings, SinkSettings
from consumer.kafka.errors import (
    FencedInstanceError,
    KafkaSecurityError,
    KafkaUnavailableError,
    TopicCreationError,
    TransactionError,
)
from consumer.kafka.flow import FlowControl
from consumer.kafka.transport import GroupSource, client_description, group_source
from consumer.lifecycle import (
    STOP_NOW_HINT,
    Lifecycle,
    stop_on_signals,
    supervisor_pid,
    unless_stopped_now,
)
from consumer.model.loader import load_model
from consumer.model.windows import fan_out_for
from consumer.replies.builder import ReplyBuilder
from consumer.serve.assignment_watch import watch_first_assignment
from consumer.serve.metrics import HealthServer, Metrics, PrometheusStats
from consumer.serve.pipeline import Pipeline
from consumer.serve.supervisor_watch import watch_supervisor
from consumer.serve.topics import prepare_topics
from consumer.serve.wedge import EXIT_ENGINE_WEDGED, WEDGED_DRAIN_S, WedgeWatch, watch_engine
from consumer.tracing.provider import TracingUnavailableError

if TYPE_CHECKING:
    from consumer.tracing.wiring import ServeTracing

log = logging.getLogger("kbatch")

EXIT_DRAIN_DEADLINE = 3
"""``kbatch serve``'s exit status when SIGTERM/SIGINT's drain ran out of ``drain_timeout_s``
with records unanswered (nothing is lost: they are uncommitted and re-read after a restart);
0 is a clean drain, 1 a start-up failure."""

EXIT_STOPPED_NOW = 130
"""``kbatch serve``'s exit status after a second Ctrl-C abandoned the drain (128 + SIGINT):
what was unanswered stays uncommitted, re-read after a restart."""


GC_THRESHOLDS = (10_000, 10, 100)
"""``gc.set_threshold`` of a serving process (CPython's default is ``(700, 10, 10)``).

A backlog keeps thousands of records in flight, each with a few dozen tracked objects (records,
items, outcomes, futures), and the dedup window keeps every answer for ``dedup_ttl_s``: most
survive the young generations and reach the old one, where the default third threshold ran a
full collection every ~70,000 allocations (a ``kbatch bench e2e`` passthrough run of 30,000
records: ≈ 10 full collections of 30-120 ms each and ≈ 1,400 young ones, 0.9-1.0 s of CPU). A
young generation of 10,000 and a tenth as many full collections halve that (0.5 s, ≈ 15 µs per
record less); cycles are still collected, later."""


def freeze_startup_heap() -> int:
    """Put every object alive now out of the garbage collector's reach and set the serving
    thresholds (:data:`GC_THRESHOLDS`); returns how many objects were frozen.

    After start-up the heap holds ~250,000 tracked objects (torch, transformers, the
    tokenizer); a full collection walks them all (~160 ms on this project's 2-vCPU machine,
    holding the GIL) and the per-record objects trigger one every few thousand requests: an
    event-loop stall each time. Frozen objects are never collected (they live as long as the
    process anyway); what is allocated later is collected as usual.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    return gc.get_freeze_count()


@dataclass(frozen=True, slots=True)
class _Parts:
    """The parts of one ``kbatch serve``, built (each given its collaborators at construction),
    none started yet."""

    pipeline: Pipeline
    engine: Engine
    fanout: FanOutEngine | None
    source: GroupSource
    sink: ProducerSink
    replies: ReplyBuilder

    def readiness(self, metrics: Metrics) -> tuple[bool, dict[str, object]]:
        """``/ready``: assigned at least once, the engine warm and healthy, intake open."""
        pipeline, engine = self.pipeline, self.engine
        detail: dict[str, object] = {
            "assigned_partitions": len(pipeline.tracker.assigned),
            "engine_warm": engine.warm,
            "engine_healthy": engine.healthy,
        }
        metrics.engine_healthy.set(1 if engine.healthy else 0)
        if pipeline.intake_blocked is not None:
            detail["intake_blocked"] = pipeline.intake_blocked
        ready = (
            pipeline.assigned_once
            and bool(pipeline.tracker.assigned)
            and engine.warm
            and engine.healthy
            and pipeline.intake_blocked is None
        )
        return ready, detail


async def serve(settings: ServeSettings) -> int:
    """Run ``kbatch serve`` until SIGTERM/SIGINT; the process exit code (0 after a clean drain)."""
    logging.basicConfig(
        level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    log.info("effective config: %s", json.dumps(settings.redacted(), default=str))
    for warning in settings.warnings():
        log.warning("config: %s", warning)
    metrics = Metrics()
    built: list[_Parts] = []  # the readiness probe's parts, once built
    wedges: list[WedgeWatch] = []  # the engine's wedge watch, once built

    def readiness() -> tuple[bool, dict[str, object]]:
        return built[0].readiness(metrics) if built else (False, {"starting": True})

    def liveness() -> tuple[bool, dict[str, object]]:
        return wedges[0].liveness() if wedges else (True, {})

    try:  # first: a taken port is found before the model loads
        health = _bind_metrics_server(settings, metrics, readiness, liveness)
    except OSError as err:  # e.g. the port is taken by another serve
        log.error(
            "cannot serve metrics on %s:%d (%s): choose another --metrics-port "
            "(0: no metrics server)",
            settings.metrics_host,
            settings.metrics_port,
            err.strerror or err,
        )
        return 1
    loop = asyncio.get_running_loop()

    async with contextlib.AsyncExitStack() as stack:
        life = Lifecycle(stack, settings.drain_timeout_s, loop.time)
        if health is not None:  # bound, not yet serving: closed on every way out
            life.enter("metrics server", health.stop)
        try:
            await prepare_topics(settings)
            tracing = _open_tracing(settings, metrics)  # None unless --tracing
        except (KafkaUnavailableError, TopicCreationError, TracingUnavailableError) as err:
            log.error("%s", err)
            return 1
        if tracing is not None:  # stopped after the parts: the drain's spans are exported too
            life.enter("tracing", tracing.stop)
        parts = _build(settings, metrics, tracing)
        built.append(parts)
        wedge = WedgeWatch(settings.batch_timeout_s, parts.engine.running_batch_s)
        wedges.append(wedge)
        now: asyncio.Event | None = asyncio.Event()  # a second Ctrl-C: abandon the drain
        parent = supervisor_pid()  # set when this process is a replica of --replicas N
        # A replica gets a terminal's Ctrl-C twice, from the terminal and forwarded by its
        # supervisor: there a second SIGINT is not "stop now".
        if parent is not None:
            now = None
        stop = stop_on_signals(now)
        if parent is not None:
            stack.callback(asyncio.create_task(watch_supervisor(stop, parent)).cancel)
        beat = _no_beat  # --metrics-port 0
        if health is not None:  # liveness is answered during the warm-up
            health.start()
            log.info("metrics on http://%s:%d/metrics", settings.metrics_host, health.port)
            beat = health.beat
        if not await _start_parts(parts, life):
            return 1
        stack.callback(asyncio.create_task(watch_engine(stop, wedge)).cancel)
        if settings.run_jobs:
            jobs_engine = parts.engine if parts.fanout is None else parts.fanout
            tracer = tracing.tracer if tracing is not None else None
            flow, replies = parts.pipeline.flow, parts.replies
            await _start_jobs(settings, jobs_engine, flow, replies, stop, life, tracer)
        frozen = freeze_startup_heap()
        log.info(
            "serving %s (%s) from %s on %s",
            parts.replies.model.name,
            settings.task,
            settings.request_topic,
            client_description(settings.kafka_client),
        )
        log.debug("%d start-up objects frozen (out of the collector's reach)", frozen)
        assignment = watch_first_assignment(
            lambda: parts.pipeline.assigned_once,
            settings.effective_group_id,
            settings.session_timeout_ms,
            settings.group_protocol,
        )
        stack.callback(asyncio.create_task(assignment).cancel)
        failed, drained = await _run(parts.pipeline, stop, now, beat, life, wedge)
        if wedge.wedged:  # the partitions move at once; the engine's batch is not waited for
            parts.source.leave_group_on_stop()
            await parts.engine.stop(timeout_s=0.0)
    # Stopped: the start-up heap goes back to the collector so that it is finalised at exit
    # as usual (left frozen, triton's nanobind bindings print ~30 "leaked instance" lines).
    gc.unfreeze()
    if failed:
        return 1
    if wedge.check():  # also a drain (SIGTERM) that left a batch running past the bound
        log.warning("stopped (engine wedged): unanswered records go to the partitions' next owner")
        return EXIT_ENGINE_WEDGED
    if now is not None and now.is_set():
        return EXIT_STOPPED_NOW
    if drained:
        log.info("stopped (drained)")
        return 0
    log.warning("stopped (drain deadline passed): unanswered records are re-read after a restart")
    return EXIT_DRAIN_DEADLINE


def _build(settings: ServeSettings, metrics: Metrics, tracing: ServeTracing | None) -> _Parts:
    """Load the model and build the parts (:class:`_Parts`); nothing connects yet."""
    stats = PrometheusStats(metrics)
    model = load_model(settings, stats, max_length=settings.max_length, truncate=settings.truncate)
    metrics.show_cpu_plan(model.threads.share_cores, model.threads.pools())
    metrics.device_memory = model.device_memory_bytes
    runner, tokenizer, model_info, device = model.runner, model.tokenizer, model.info, model.device
    replies = ReplyBuilder(model_info, settings.dead_letter_topic, model.profile)
    engine = Engine(
        runner,
        tokenizer,
        project(BatchPolicyConfig, settings),
        stats=stats,
        batch_timeout_s=settings.batch_timeout_s,
        # Every bucket's worst case on a GPU (shows a too-large budget, builds kernels); on a
        # CPU the largest shape alone (all ~30 shapes cost ~8 s at start-up on 2 cores).
        warmup="all" if device.startswith("cuda") else "largest",
        on_batch_run=tracing.batches if tracing is not None else None,
    )
    # rerank: each (query, document) pair is one engine item; token-classify: each window of a
    # long text (contract 1.3). The fan-out gathers them.
    fanout = fan_out_for(
        settings.task,
        tokenizer,
        engine,
        stride=settings.window_stride,
        max_windows=settings.max_windows,
    )
    # The Kafka clients last: a Ctrl-C during the model load leaves none to close.
    client = project(KafkaClientSettings, settings)
    mode = DeliveryMode.build(  # --exactly-once: a producer per assigned request partition
        client,
        project(SinkSettings, settings),
        exactly_once=settings.exactly_once,
        default_topic=settings.reply_topic,
        group_id=settings.effective_group_id,
    )
    sink, transactions = mode.sink, mode.transactions
    pipeline = Pipeline(
        settings,
        sink,
        replies,
        metrics,
        source=lambda handler: group_source(
            client,
            project(ConsumerGroupSettings, settings),
            handler,
            group_id=settings.effective_group_id,
            topics=(settings.request_topic,),
            max_poll_records=settings.poll_max_records,
        ),
        engine=engine if fanout is None else fanout,
        transactions=transactions,
        tracing=tracing.requests if tracing is not None else None,
    )
    return _Parts(pipeline, engine, fanout, pipeline.source, sink, replies)


def _no_beat() -> None:
    """The heartbeat without a metrics server."""


def _bind_metrics_server(
    settings: ServeSettings,
    metrics: Metrics,
    ready: Callable[[], tuple[bool, dict[str, object]]],
    live: Callable[[], tuple[bool, dict[str, object]]],
) -> HealthServer | None:
    """Bind the metrics and health server's port (not serving yet: :meth:`HealthServer.start`);
    None with ``--metrics-port 0``.

    Raises:
        OSError: the port cannot be bound (taken, or not allowed).
    """
    if not settings.metrics_port:
        return None
    return HealthServer(metrics, ready, settings.metrics_host, settings.metrics_port, live=live)


async def _start_parts(parts: _Parts, life: Lifecycle) -> bool:
    """Start engine (warm-up), producer, consumer, each entered on ``life``; False when Kafka
    could not be reached or refused the login. On any failure the clients not started are
    closed (aiokafka prints "Unclosed AIOKafka…" for one that never is)."""
    started: list[object] = []
    try:
        for name, part in (
            ("engine", parts.engine),
            ("producer", parts.sink),
            ("consumer", parts.source),
        ):
            await part.start()
            started.append(part)
            life.enter(name, part.stop)
    except BaseException as err:  # also a failed warm-up: no client is left unclosed
        for unstarted in (parts.sink, parts.source):  # built, never started: close their clients
            if unstarted not in started:
                await unstarted.stop()
        if not isinstance(err, KafkaUnavailableError):  # KafkaSecurityError too: refused login
            raise
        log.error("%s", err)
        return False
    return True


async def _run(
    pipeline: Pipeline,
    stop: asyncio.Event,
    now: asyncio.Event | None,
    beat: Callable[[], None],
    life: Lifecycle,
    wedge: WedgeWatch,
) -> tuple[bool, bool]:
    """Serve until ``stop``, then drain (for at most :data:`WEDGED_DRAIN_S` when the engine is
    wedged: what the model owes is not waited for), unless ``now`` (a second Ctrl-C) abandons
    the drain; returns (failed, drained)."""
    try:
        await pipeline.run(stop, beat=beat)
    except (TransactionError, FencedInstanceError) as err:  # fenced: another owner
        log.error("%s; stopping", err)
        failed = True
    except KafkaSecurityError as err:  # the request topic or the group denied
        log.error("%s", err)
        failed = True
    else:
        failed = False
    finally:
        # The drain spends the shutdown deadline less the closes' reserve; leaving the
        # stack then stops consumer, producer, engine, metrics server within the rest.
        deadline = life.drain_deadline()
        if wedge.wedged:
            deadline = Deadline.after(min(WEDGED_DRAIN_S, deadline.remaining_s()), life.clock)
        tracker = pipeline.tracker
        log.info(  # a slow drain must not look like a hang
            "stopping: draining %d records in flight: answering them and committing their "
            "offsets (at most %.1f s of --drain-timeout-s %g; the rest is for closing the "
            "clients)%s",
            sum(tracker.pending(tp) for tp in tracker.assigned),
            deadline.remaining_s(),
            life.shutdown_timeout_s,
            "" if now is None else f"; {STOP_NOW_HINT}",
        )
        finish = pipeline.finish(None, deadline)
        drained_now: bool | None
        if now is None:
            finished, drained_now = True, await finish
        else:
            finished, drained_now = await unless_stopped_now(finish, now)
        drained = bool(finished and drained_now)
        if not finished:
            log.warning(
                "stopping now (second Ctrl-C): %d records unanswered, their offsets not "
                "committed: they are read again after a restart",
                sum(tracker.pending(tp) for tp in tracker.assigned),
            )
    return failed, drained


def _open_tracing(settings: ServeSettings, metrics: Metrics) -> ServeTracing | None:
    """``--tracing``: start OpenTelemetry (docs/TRACING.md); None when off.

    Raises:
        TracingUnavailableError: the ``kbatch[otel]`` extra is missing.
    """
    if not settings.tracing:
        return None
    from consumer.tracing.wiring import open_serve_tracing

    return open_serve_tracing(
        topic=settings.request_topic,
        task=settings.task,
        group=settings.effective_group_id,
        reply_topic=settings.reply_topic,
        ignored=lambda reason: metrics.trace_headers_ignored.labels(reason).inc(),
    )


async def _start_jobs(
    settings: ServeSettings,
    engine: Engine | FanOutEngine,
    flow: FlowControl,
    replies: ReplyBuilder,
    stop: asyncio.Event,
    life: Lifecycle,
    tracer: object | None = None,
) -> None:
    """Start the backfill job runner (docs/JOBS.md); a jobs topic that cannot be created or
    read leaves serve running without it (one error line)."""
    from consumer.jobs.runner import JobRunner
    from consumer.kafka.errors import KafkaLayerError

    jobs = JobRunner(settings, engine, replies, flow=flow, tracer=tracer)
    try:
        await jobs.start(stop)
    except KafkaLayerError as err:
        log.error("backfill jobs off: %s (--no-run-jobs to not try)", err)
        await jobs.stop()
        return
    life.enter("job runner", jobs.stop)
