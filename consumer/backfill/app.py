"""Wiring of ``kbatch backfill``: build the parts, resolve the range, run, summarise, exit.

Start, each part entered on an exit stack (:class:`consumer.lifecycle.Lifecycle`): source
(range fixed now) → model → engine (warm-up) → sink → job. Stop: the job finishes what it read
and commits, then the sink, the engine and the source close in reverse, all within one shutdown
deadline of ``drain_timeout_s``.

Exit codes: :data:`EXIT_COMPLETE` (0) only when every partition reached its end and not every
record read was dead-lettered; :data:`EXIT_STOPPED` (3) when a signal stopped the job first
(progress committed: rerun the same command to continue); :data:`EXIT_INCOMPLETE` (1) otherwise
(an undeliverable dead letter, a failed final commit, a broker error, nothing scored).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

from consumer.backfill.config import BackfillSettings
from consumer.backfill.job import BackfillJob
from consumer.backfill.progress import LogProgress, ProgressSink, RichProgress, render_summary
from consumer.backfill.summary import BackfillSummary
from consumer.batching.engine import Engine
from consumer.batching.stats import EngineStats
from consumer.config import project
from consumer.finish.checkpoint import DeliveryMode
from consumer.kafka.admin import ensure_topics, live_group_members
from consumer.kafka.aiokafka_errors import map_kafka_errors
from consumer.kafka.client_config import security_kwargs
from consumer.kafka.config import KafkaClientSettings, SinkSettings
from consumer.kafka.errors import KafkaUnavailableError, RangeSourceError, TopicCreationError
from consumer.kafka.ranges import PartitionRange
from consumer.kafka.transport import RangeReader, range_reader
from consumer.lifecycle import Lifecycle, stop_on_signals, unless_stopped_now
from consumer.model.loader import load_model
from consumer.model.windows import fan_out_for
from consumer.options import admit_options
from consumer.replies.builder import ReplyBuilder
from consumer.replies.task_options import NEW_TASKS, check_task_options
from schemas.models import ModelInfo

if TYPE_CHECKING:
    from consumer.tracing.wiring import BackfillTracing

__all__ = [
    "EXIT_COMPLETE",
    "EXIT_INCOMPLETE",
    "EXIT_STOPPED",
    "ensure_output_topics",
    "run_backfill",
]

log = logging.getLogger("kbatch.backfill")

EXIT_COMPLETE = 0
EXIT_INCOMPLETE = 1
EXIT_STOPPED = 3
EXIT_STOPPED_NOW = 130
"""A second Ctrl-C abandoned the drain (128 + SIGINT); a rerun resumes from the last commit."""


def _progress(settings: BackfillSettings) -> ProgressSink:
    show = settings.progress if settings.progress is not None else sys.stderr.isatty()
    return RichProgress() if show else LogProgress()


async def run_backfill(settings: BackfillSettings, *, json_summary: bool = False) -> int:
    """Run one job to its end (or a SIGTERM/SIGINT); prints the summary (stderr, and one JSON
    object on stdout with ``json_summary``); returns the process exit code.

    The output topic (as many partitions as the source) and the dead-letter topic (1) are
    created when missing, as ``kbatch serve`` creates its topics.

    Raises:
        RangeSourceError: the source topic does not exist, the broker cannot be reached, or
            a missing output/dead-letter topic could not be created.
        RangeSpecError: a ``P:OFFSET`` bound names a partition the topic does not have.
        FileNotFoundError: the model directory does not exist.
        consumer.options.OptionError: an embed option this model cannot honour.
    """
    logging.basicConfig(
        level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    log.info("effective config: %s", json.dumps(settings.redacted(), default=str))
    tracing = None
    if settings.tracing:  # TracingUnavailableError without kbatch[otel]
        from consumer.tracing.wiring import open_backfill_tracing

        tracing = open_backfill_tracing(topic=settings.source_topic, task=settings.task)

    client = project(KafkaClientSettings, settings)
    security_kwargs(client)  # an unreadable CA, key or password file: KafkaSecurityError now
    await refuse_live_group(client, settings.effective_group_id)
    source = range_reader(client, topic=settings.source_topic, group_id=settings.effective_group_id)
    mode = DeliveryMode.build(
        client,
        project(SinkSettings, settings),
        exactly_once=settings.exactly_once,
        default_topic=settings.output_topic,
        group_id=settings.effective_group_id,
    )
    now = asyncio.Event()  # a second Ctrl-C: abandon the drain
    stop = stop_on_signals(now)
    loop = asyncio.get_running_loop()

    async with contextlib.AsyncExitStack() as stack:
        life = Lifecycle(stack, settings.drain_timeout_s, loop.time)
        # Built already: stopped on every way out, also when the source cannot start (an
        # unstopped producer prints aiokafka's "Unclosed AIOKafkaProducer" at exit).
        life.enter("producers", mode.sink.stop)  # --exactly-once: opened by the read-back
        await source.start()
        life.enter("source", source.stop)
        plan = await _resolve(settings, source, mode)
        await ensure_output_topics(settings, len(plan))
        job = await _start_job(settings, source, mode, plan, life, tracing)
        _, summary = await unless_stopped_now(job.run(stop, life.drain_deadline), now)
        if summary is None:  # abandoned: a second Ctrl-C
            log.warning(
                "stopping now (second Ctrl-C): what was not committed is read again by a rerun"
            )
    if summary is None:
        return EXIT_STOPPED_NOW
    if tracing is not None:
        await tracing.finish(summary.complete, "" if summary.complete else "incomplete")
    render_summary(summary)
    if json_summary:
        sys.stdout.write(json.dumps(summary.to_json()) + "\n")
        sys.stdout.flush()
    return exit_code(summary, settings.dead_letter_topic)


def exit_code(summary: BackfillSummary, dlq_topic: str) -> int:
    """The exit code of a run that ended with ``summary`` (module docstring). A run that read
    records and dead-lettered every one of them scored nothing: :data:`EXIT_INCOMPLETE`, with
    one ERROR line (the commonest cause: settings that do not fit the topic, e.g. a topic of
    msgpack or JSON maps read without ``--text-field``)."""
    if summary.stopped and not summary.complete:
        return EXIT_STOPPED
    if summary.dead_lettered and not (summary.ok or summary.error_replies):
        log.error(
            "every record read was dead-lettered (%d to %s), none scored: their "
            "kbatch.error.message header says why (a topic of JSON or msgpack maps needs "
            "--text-field)",
            summary.dead_lettered,
            dlq_topic,
        )
        return EXIT_INCOMPLETE
    return EXIT_COMPLETE if summary.complete else EXIT_INCOMPLETE


async def refuse_live_group(client: KafkaClientSettings, group_id: str) -> None:
    """Stop before anything starts when ``group_id`` has live members: a running kbatch serve
    (``KBATCH_GROUP_ID``/``--group-id`` set to serve's group) or another consumer. A backfill
    commits under its group without joining it, and the broker refuses every such commit while
    the group has members (``UNKNOWN_MEMBER_ID``): the run would end incomplete and a rerun
    would score everything again. Backfill jobs are refused serve's group the same way
    (:func:`consumer.jobs.spec.conflict`).

    Raises:
        RangeSourceError: the group has members, or it could not be described.
    """
    with map_kafka_errors(RangeSourceError, f"describing the consumer group {group_id!r}"):
        members = await live_group_members(client, group_id)
    if members:
        raise RangeSourceError(
            f"the consumer group {group_id!r} has {members} live member(s) (a running kbatch "
            "serve?): a backfill commits under a group of its own; give another --group-id "
            "(KBATCH_BACKFILL_GROUP_ID), or none for the derived one"
        )


async def _resolve(
    settings: BackfillSettings, source: RangeReader, mode: DeliveryMode
) -> dict[int, PartitionRange]:
    """Fix the range (:meth:`RangeReader.resolve`) once the committed offsets are final:
    ``--exactly-once`` opens every partition's producer first (fences a zombie)."""
    topic = settings.source_topic
    tps = [(topic, p) for p in await source.partitions()]
    plan = await mode.read_back(tps, lambda: source.resolve(settings.from_bound, settings.to_bound))
    for r in plan.values():
        log.info(
            "partition %d: range [%d, %d), reading from %d%s",
            r.partition,
            r.range_start,
            r.end,
            r.start,
            f" (resumed: group {settings.effective_group_id})"
            if r.resumed_from is not None
            else "",
        )
    return plan


async def _start_job(
    settings: BackfillSettings,
    source: RangeReader,
    mode: DeliveryMode,
    plan: Mapping[int, PartitionRange],
    life: Lifecycle,
    tracing: BackfillTracing | None,
) -> BackfillJob:
    """The job over ``plan``; the model, the engine (warmed up) and the producer started,
    unless the range is empty (nothing loaded then)."""
    sink = mode.sink
    if sum(r.remaining for r in plan.values()) == 0:
        log.info("nothing to read in the range")
        return BackfillJob(
            settings, source, sink, ReplyBuilder(_no_model(), settings.dead_letter_topic)
        )
    stats = EngineStats(keep=1)
    model = load_model(settings, stats, max_length=settings.max_length, truncate=settings.truncate)
    # OptionError: a bad flag
    check_task_options(settings, model.profile.task)
    if model.profile.task not in NEW_TASKS:
        admit_options(settings.embed_options, model.profile)
    cuda = model.device.startswith("cuda")
    policy = settings.batch_policy(cuda=cuda)
    if policy.max_batch_tokens < model.runner.max_length:
        policy = policy.model_copy(update={"max_batch_tokens": model.runner.max_length})
    engine = Engine(
        model.runner,
        model.tokenizer,
        policy,
        stats=stats,
        batch_timeout_s=settings.batch_timeout_s,
        warmup="all" if cuda else "largest",
        on_batch_run=tracing.batches if tracing is not None else None,
    )
    # rerank: each (query, document) pair is one engine item; token-classify: each
    # window of a long text (contract 1.3). The fan-out gathers them.
    fanout = fan_out_for(
        settings.task,
        model.tokenizer,
        engine,
        stride=settings.window_stride,
        max_windows=settings.max_windows,
    )
    job = BackfillJob(
        settings,
        source,
        sink,
        ReplyBuilder(model.info, settings.dead_letter_topic, model.profile),
        _progress(settings),
        engine=engine if fanout is None else fanout,
        stats=stats,
        transactions=mode.transactions,
        trace=tracing.trace if tracing is not None else None,
    )
    for name, part in (("engine", engine), ("producer", sink)):
        await part.start()
        life.enter(name, part.stop)
    return job


async def ensure_output_topics(settings: BackfillSettings, partitions: int) -> None:
    """Create the output topic (``partitions``, as many as the source) and the dead-letter
    topic (1) when missing, as ``kbatch serve`` creates its topics (the cluster's default
    replication, :func:`consumer.kafka.admin.ensure_topics`).

    Raises:
        RangeSourceError: no broker answered, or the broker refused to create them.
    """
    try:  # replicas: the cluster's default; logs what it created, warns when too few
        await ensure_topics(
            settings.bootstrap,
            {settings.output_topic: partitions, settings.dead_letter_topic: 1},
            security=security_kwargs(settings),
        )
    except (KafkaUnavailableError, TopicCreationError) as err:
        raise RangeSourceError(str(err)) from err


def _no_model() -> ModelInfo:
    return ModelInfo(name="(not loaded)", revision=None)
