"""``kbatch bench lanes``: live latency alone and beside a backfill job, in one serve process.

One ``kbatch serve`` (its model, or a simulated device) with a jobs topic of the bench's own:

1. **drain**: N requests held in an open transaction are released at once to the ready serve
   (the e2e bench's drain, :mod:`consumer.bench.e2e`): ``drain_seq_per_s``;
2. for each ``fraction`` (default 0.3 and 0.6) of that drain rate, an open-loop Poisson phase of
   live requests (:func:`producer_tools.load.run_load`, the e2e bench's latency phase):
   **alone**, then **with a job**: a backfill job (``kbatch backfill submit``'s code, the job's
   source topic filled with enough texts to outlast the phase) is submitted, runs in the same
   serve's bulk lane, and the same phase is measured again; the job is then cancelled.

Reported per fraction: live p50/p99 alone and with the job, the job's throughput during the
phase (its output topic's end offsets at the phase's start and end, over the phase's wall time)
and the lanes' goals: ``p99_with_job ≤ 1.25 × p99_alone + one batch's time`` (one batch's
time: the serve's mean ``kbatch_inference_seconds`` during the phase) and
``job_seq_per_s ≥ 0.8 × (drain_seq_per_s − live rate)``. Without the engine's lane
scheduling the job would compete with live requests like any other items: the goals show
what the lanes give.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from consumer.bench.e2e import (
    E2EBenchOptions,
    E2EError,
    Say,
    _HeldBacklog,
    _latency_phase,
    _ReplyCounter,
    _serve_process,
    _Topics,
)
from consumer.bench.e2e_report import prefill_records, seq_per_s
from consumer.kafka.admin import create_topics, delete_topics

__all__ = ["LanesBenchOptions", "lanes_goals", "run_lanes_bench"]

P99_FACTOR = 1.25
JOB_SHARE = 0.8


@dataclass(frozen=True)
class LanesBenchOptions:
    """Options of ``kbatch bench lanes``: the e2e bench's (model, texts, phases) and its own."""

    e2e: E2EBenchOptions
    fractions: tuple[float, ...] = (0.3, 0.6)
    job_margin_s: float = 15.0
    """The job's source holds ``drain × (warm-up + phase + margin)`` records: it outlasts the
    phase even if the job had the whole device."""
    max_job_records: int = 300_000
    job_partitions: int = 2
    extra_serve_args: tuple[str, ...] = field(default_factory=tuple)


def lanes_goals(
    *,
    drain_seq_per_s: float,
    rate_per_s: float,
    p99_alone_ms: float,
    p99_with_job_ms: float,
    batch_ms: float,
    job_seq_per_s: float,
) -> dict[str, Any]:
    """The lanes' goals at one fraction and how the run compares (pure).

    ``p99_goal_ms = 1.25 × p99_alone_ms + batch_ms``; ``job_goal_seq_per_s = 0.8 × (drain −
    rate)``; each ``*_ratio`` is measured / goal (p99: ≤ 1 meets it; job: ≥ 1 meets it).
    """
    p99_goal = P99_FACTOR * p99_alone_ms + batch_ms
    job_goal = JOB_SHARE * max(0.0, drain_seq_per_s - rate_per_s)
    return {
        "p99_goal_ms": round(p99_goal, 1),
        "p99_ratio": round(p99_with_job_ms / p99_goal, 3) if p99_goal > 0 else None,
        "p99_ok": p99_with_job_ms <= p99_goal,
        "job_goal_seq_per_s": round(job_goal, 1),
        "job_ratio": round(job_seq_per_s / job_goal, 3) if job_goal > 0 else None,
        "job_ok": job_seq_per_s >= job_goal,
    }


_SUM, _COUNT = "kbatch_inference_seconds_sum", "kbatch_inference_seconds_count"


def _inference(metrics_url: str) -> tuple[float, float]:
    """``kbatch_inference_seconds`` sum and count from serve's /metrics (0 when unread)."""
    from producer_tools.load import metric_sums

    got = metric_sums(metrics_url, (_SUM, _COUNT), 5) or {}
    return got.get(_SUM, 0.0), got.get(_COUNT, 0.0)


async def _end_offsets(bootstrap: str, topic: str, partitions: int) -> int:
    probe = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await probe.start()
    try:
        ends = await probe.end_offsets([TopicPartition(topic, p) for p in range(partitions)])
        return int(sum(ends.values()))
    finally:
        await probe.stop()


async def _fill(bootstrap: str, topic: str, texts: Sequence[str], n: int, partitions: int) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=20)
    await producer.start()
    try:
        sends = []
        for i, text in zip(range(n), itertools.cycle(texts), strict=False):
            sends.append(
                await producer.send(
                    topic, text.encode(), key=f"b{i}".encode(), partition=i % partitions
                )
            )
        await asyncio.gather(*sends)
    finally:
        await producer.stop()


async def _drain(opts: E2EBenchOptions, topics: _Topics) -> float:
    """The e2e bench's drain: N requests released at once to the ready serve; seq/s."""
    texts = list(opts.texts)
    records = prefill_records(texts, topics.reply, f"lanes-drain-{uuid.uuid4().hex[:6]}")
    backlog = _HeldBacklog(opts.bootstrap)
    counter = _ReplyCounter(opts.bootstrap, topics.reply, {k for k, _, _ in records})
    try:
        await backlog.fill(topics.request, records)
        await counter.start()
        t0 = await backlog.release()
        t_end = await counter.wait(opts.drain_timeout_s)
        return seq_per_s(len(texts), t_end - t0)
    finally:
        await counter.close()
        await backlog.close()


async def _phase(
    opts: E2EBenchOptions, topics: _Topics, rate: float, metrics_url: str
) -> tuple[dict[str, Any], float]:
    """One latency phase; its summary and the serve's mean batch time (ms) during it."""
    s0, c0 = await asyncio.to_thread(_inference, metrics_url)
    summary = await _latency_phase(opts, topics, rate, metrics_url)
    s1, c1 = await asyncio.to_thread(_inference, metrics_url)
    batch_ms = (s1 - s0) / (c1 - c0) * 1000.0 if c1 > c0 else 0.0
    return summary, batch_ms


def _row(summary: dict[str, Any], batch_ms: float) -> dict[str, Any]:
    lat = summary["latency_ms"]
    return {
        "p50_ms": lat["p50"],
        "p99_ms": lat["p99"],
        "batch_ms": round(batch_ms, 1),
        "batch_size_mean": summary["batch_size_mean"],
        "ok": summary["ok"],
        "timeouts": summary["timeouts"],
    }


async def _with_job(
    lanes: LanesBenchOptions,
    topics: _Topics,
    jobs_topic: str,
    rate: float,
    drain: float,
    metrics_url: str,
    say: Say,
) -> tuple[dict[str, Any], float, dict[str, Any]]:
    """Submit a job, measure the phase beside it, cancel it; (summary, batch_ms, job figures)."""
    from consumer.config import project
    from consumer.jobs.client import cancel_job, job_statuses, submit_job
    from consumer.jobs.settings import SubmitSettings
    from consumer.kafka.config import KafkaClientSettings

    opts = lanes.e2e
    tag = f"bench.lanes.job.{uuid.uuid4().hex[:8]}"
    source, output = f"{tag}.source", f"{tag}.output"
    parts = lanes.job_partitions
    n = min(
        lanes.max_job_records,
        math.ceil(drain * (opts.latency_warmup_s + opts.latency_s + lanes.job_margin_s)),
    )
    await create_topics(opts.bootstrap, [source], partitions=parts)
    try:
        say(f"job: filling {source} with {n} records")
        await _fill(opts.bootstrap, source, opts.texts, n, parts)
        settings = SubmitSettings.model_validate(
            {
                "bootstrap": opts.bootstrap,
                "source_topic": source,
                "output_topic": output,
                "jobs_topic": jobs_topic,
            }
        )
        record = await submit_job(settings, jobs_topic)
        client = project(KafkaClientSettings, settings)
        deadline = time.monotonic() + 120
        while await _end_offsets(opts.bootstrap, output, parts) == 0:
            if time.monotonic() > deadline:
                raise E2EError(f"job {record.job_id} wrote nothing in 120 s")
            await asyncio.sleep(0.2)
        say(f"job {record.job_id} running; live phase at {rate}/s")
        out0, t0 = await _end_offsets(opts.bootstrap, output, parts), time.monotonic()
        summary, batch_ms = await _phase(opts, topics, rate, metrics_url)
        out1, t1 = await _end_offsets(opts.bootstrap, output, parts), time.monotonic()
        await cancel_job(client, jobs_topic, record.job_id)
        deadline = time.monotonic() + 30
        while True:  # the next phase starts once the job left the device
            (status,) = await job_statuses(client, jobs_topic, record.job_id)
            if all(state in ("stopped", "failed") for state in status.members.values()):
                break
            if time.monotonic() > deadline:
                raise E2EError(f"job {record.job_id} not stopped 30 s after its cancel")
            await asyncio.sleep(0.2)
        job = {
            "job_records": n,
            "job_written_in_phase": out1 - out0,
            "job_seq_per_s": round((out1 - out0) / (t1 - t0), 1),
            "job_reached_end": out1 >= n,
        }
        return summary, batch_ms, job
    finally:
        with contextlib.suppress(Exception):
            await delete_topics(opts.bootstrap, [source, output, f"{source}.dlq"])


async def run_lanes_bench(lanes: LanesBenchOptions, say: Say = lambda _m: None) -> dict[str, Any]:
    """The JSON-able report: ``drain_seq_per_s``, one object per fraction (``cases``) and
    ``setup``.

    Raises:
        ValueError: no texts, or a fraction outside (0, 1).
        E2EError: serve died, a drain or the job did not progress in time.
    """
    opts = lanes.e2e
    if not opts.texts:
        raise ValueError("no texts")
    if any(not 0 < f < 1 for f in lanes.fractions):
        raise ValueError(f"fractions in (0, 1), got {lanes.fractions}")
    tmp = tempfile.TemporaryDirectory(prefix="kbatch-bench-lanes-")
    log_dir = opts.log_dir or Path(tmp.name)
    log_dir.mkdir(parents=True, exist_ok=True)
    opts = replace(opts, log_dir=log_dir)
    tag = f"bench.lanes.{uuid.uuid4().hex[:8]}"
    topics = _Topics(f"{tag}.requests", f"{tag}.replies", f"{tag}.dlq", f"{tag}.group")
    jobs_topic = f"{tag}.jobs"
    await create_topics(opts.bootstrap, [topics.request, topics.reply, topics.dlq], partitions=1)
    model = opts.serve_model or str(opts.model_dir)
    extra = ("--jobs-topic", jobs_topic, *lanes.extra_serve_args)
    proc, metrics_url = _serve_process("serve", model, topics, opts, log_dir, 1, extra)
    started = time.monotonic()
    cases: dict[str, Any] = {}
    try:
        proc.start()
        await proc.wait_ready(opts.ready_timeout_s)
        say("serve ready; measuring the drain")
        drain = await _drain(opts, topics)
        say(f"drain: {drain} seq/s")
        for fraction in lanes.fractions:
            rate = round(fraction * drain, 1)
            if opts.max_latency_rate_per_s is not None:
                rate = min(rate, opts.max_latency_rate_per_s)
            say(f"{fraction:g}: live alone at {rate}/s")
            alone, batch_alone_ms = await _phase(opts, topics, rate, metrics_url)
            with_job, batch_ms, job = await _with_job(
                lanes, topics, jobs_topic, rate, drain, metrics_url, say
            )
            cases[f"{fraction:g}"] = {
                "rate_per_s": rate,
                "alone": _row(alone, batch_alone_ms),
                "with_job": _row(with_job, batch_ms),
                **job,
                **lanes_goals(
                    drain_seq_per_s=drain,
                    rate_per_s=rate,
                    p99_alone_ms=alone["latency_ms"]["p99"],
                    p99_with_job_ms=with_job["latency_ms"]["p99"],
                    batch_ms=batch_ms,
                    job_seq_per_s=job["job_seq_per_s"],
                ),
            }
    finally:
        await proc.stop()
        with contextlib.suppress(Exception):
            await delete_topics(
                opts.bootstrap, [topics.request, topics.reply, topics.dlq, jobs_topic]
            )
        tmp.cleanup()
    return {
        "drain_seq_per_s": drain,
        "cases": cases,
        "setup": {
            "model": model,
            "texts": len(opts.texts),
            "torch_threads": opts.threads,
            "max_wait_ms": opts.max_wait_ms,
            "latency_s": opts.latency_s,
            "latency_warmup_s": opts.latency_warmup_s,
            "fractions": list(lanes.fractions),
            "job_partitions": lanes.job_partitions,
            "wall_s": round(time.monotonic() - started, 1),
        },
    }
