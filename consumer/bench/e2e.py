"""``kbatch bench e2e``: the same model and the same N texts through the consumers below.

Variants (:data:`~consumer.bench.e2e_report.VARIANTS`):

- ``naive`` — the consumer a user writes without kbatch: an aiokafka loop that decodes each
  record with msgpack, embeds it alone with plain transformers (tokenizer + model + mean
  pooling, :mod:`consumer.model.baselines`) and commits after each poll
  (:mod:`consumer.bench.e2e_workers`, its own process): the honest "before" picture;
- ``kbatch`` — a real ``kbatch serve`` process with the model;
- ``kbatch_confluent`` — the same with ``--kafka-client confluent`` (confluent-kafka);
- ``kbatch_eos`` — the same with ``--exactly-once`` (a transaction per request partition and
  commit interval); its replies are read ``read_committed``, so they count when their
  transaction commits (the cost of exactly-once, latency included); ``kbatch_eos_confluent``
  the same on confluent-kafka;
- ``kbatch_onnx`` — the same with ``--backend onnx`` (ONNX Runtime; the export is cached, and
  the start-up quality gate runs before it is ready);
- ``kbatch_bf16`` — the same with ``--dtype bfloat16`` (torch autocast in bf16: AMX or
  AVX512-BF16 on a CPU that has them; the start-up quality gate runs before it is ready);
- ``engine`` — the engine alone, no Kafka, in this process: the ``bucketed`` strategy of
  ``kbatch bench engine`` (:mod:`consumer.bench.engine_bench`), the ceiling;
- ``passthrough`` — ``kbatch serve --model noop``: the real pipeline with the model — its
  tokenizer and its network — replaced by no-ops (:data:`consumer.model.loader.NOOP_MODEL`): what is
  left is kbatch's own cost per record (decode, dedup, buckets, replies, commits);
  ``passthrough_confluent`` the same on confluent-kafka;
- ``passthrough_trace1``, ``passthrough_trace100`` — ``passthrough`` under ``--tracing``
  (docs/TRACING.md) at 1 % and 100 % head sampling, spans exported over OTLP/HTTP to a
  discarding endpoint in this process (:mod:`consumer.bench.otlp_sink`): the cost of tracing;
- ``raw_loop`` — a bare aiokafka consume→produce loop, no decode, no model
  (:mod:`consumer.bench.e2e_workers`, its own process);
- ``raw_tokenize`` — the host path around an accelerator written by hand on aiokafka: decode,
  one tokenizer call per poll, an embedding reply per record (its own process);
- ``raw_tokenize_confluent`` — the same on confluent-kafka (librdkafka), one thread owning the
  consumer and the producer (:mod:`consumer.bench.e2e_confluent`): with ``raw_tokenize``, what
  the Kafka client costs of that path (``cpu_ratio_*``,
  :func:`consumer.bench.e2e_report.cpu_ratios`).

Every process that runs a model uses ``threads`` torch intra-op threads (default 2; split
over the replicas of a ``--replicas N`` run).

**Replicas** (``replicas``, e.g. ``(1, 2)``): ``kbatch`` and ``passthrough`` run once per
replica count as ``kbatch serve --replicas N`` (report key ``<variant>_x<N>`` for N > 1); the
request topics of every Kafka variant then have ``max(replicas)`` partitions, so each count
sees the same topic layout.

**A simulated device** (``serve_model`` = ``sim:FIXED_MS,US_PER_TOKEN[,DIM]``): the ``kbatch``
variant serves it (MiniLM's tokenizer, a sleep per batch); ``model_dir`` is then MiniLM's
directory (token statistics). ``naive`` and ``engine`` run a real model and are not run.

**CPU and device figures** (:func:`consumer.bench.e2e_report.cpu_device_figures`): the CPU
seconds of the consumer's process tree (the supervisor and its replicas) between ``t0`` and
``t_end``, and for a simulated device the model seconds summed from ``/metrics``
(``kbatch_inference_seconds_sum``) over the same span (a real model on this machine shares the
CPU with the rest, so its time is no device's).
``backend`` (``--backend``, default torch) is what ``kbatch`` and ``engine`` run;
``kbatch_onnx`` always runs onnx, ``naive`` plain torch.

**Throughput** (``seq_per_s``), per Kafka variant, on fresh topics (one partition each) and a
fresh consumer group:

1. the N requests are produced to the request topic inside one open Kafka transaction, and
   every send is acknowledged — before the consumer process even starts;
2. the consumer process starts and becomes ready (owns its partition; model loaded and warmed
   up); it reads with ``isolation_level=read_committed``, so it sees none of them yet;
3. ``t0`` = the monotonic time at which the benchmark asks the broker to commit that
   transaction: all N requests become readable at once, to a consumer that is already polling
   (this is its first poll that can return them);
4. ``t_end`` = the monotonic time at which the benchmark's reply reader has received a reply
   for the N-th distinct request key (a record is readable only once the broker has appended,
   i.e. acknowledged, it);
5. ``drain_s = t_end - t0`` and ``seq_per_s = N / drain_s``; ``first_reply_ms`` is the time
   from ``t0`` to the first reply.

For ``engine`` the N texts are submitted at once, a poll chunk (256) at a time, and
``drain_s`` runs to the last answer (``kbatch bench engine``'s backlog phase).

**Latency** (``p50_ms``, ``p99_ms``): an open-loop Poisson run at ``latency_rate_per_s`` =
``load_fraction`` (0.7) × the variant's own ``seq_per_s`` (capped at
``max_latency_rate_per_s``: the load generator shares the machine's cores and must not become
what is measured), ``latency_s`` seconds after ``latency_warmup_s`` of warm-up. For the Kafka
variants this is :func:`producer_tools.load.run_load` against the same process and topics:
latency = reply received − the request's *scheduled* send time. For ``engine``: answer −
arrival in the engine (``kbatch bench engine``'s paced phase), so no Kafka hop is included.

**Frontier** (``latency_fractions``, ``latency_rates``): after the main latency phase, one more
open-loop phase per fraction of the variant's own drain rate and per absolute rate, against the
same process (``frontier`` in its row: p50/p99, batch size, per-stage times); the engine runs
its paced phase at the same points. **Stages** (``stages_ms`` of each Kafka row and point):
where a request's time went, :func:`producer_tools.report.stage_times_ms`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from consumer.bench.e2e_report import (
    REPLICATED,
    SERVED,
    TRACED,
    VARIANTS,
    cpu_device_figures,
    cpu_ratios,
    frontier_points,
    frontier_row,
    latency_rate,
    prefill_records,
    ratios,
    replica_ratios,
    seq_per_s,
    token_stats,
    variant_key,
    with_thread_shares,
)
from consumer.bench.otlp_sink import otlp_sink
from consumer.kafka.admin import create_topics, delete_topics
from schemas.headers import STATUS, last_value

__all__ = ["E2EBenchOptions", "E2EError", "run_e2e_bench"]

ENGINE_CHUNK = 256
"""Items per ``Engine.submit`` in the engine variant's backlog (``kbatch bench engine``'s)."""


class E2EError(RuntimeError):
    """A variant could not be measured (a process died, a drain timed out)."""


@dataclass(frozen=True)
class E2EBenchOptions:
    """Options of ``kbatch bench e2e`` (see the CLI for each one's help).

    ``model_dir`` is the model every variant runs (``passthrough`` uses the packaged MiniLM's
    tokenizer whatever it is); ``texts`` the N request texts, in order.
    """

    model_dir: Path
    texts: Sequence[str]
    serve_model: str | None = None
    """What the ``kbatch`` variant serves (default ``model_dir``; a ``sim:`` spec)."""
    replicas: tuple[int, ...] = (1,)
    bootstrap: str = "127.0.0.1:9092"
    latency_s: float = 10.0
    latency_warmup_s: float = 2.0
    load_fraction: float = 0.7
    latency_fractions: tuple[float, ...] = ()
    """The frontier: more open-loop phases, each at this fraction of the variant's own drain
    rate (capped like the main one); :func:`~consumer.bench.e2e_report.frontier_points`."""
    latency_rates: tuple[float, ...] = ()
    """The frontier at absolute rates (requests/s) every variant is offered alike (e.g. up to
    naive's drain rate, to compare at the same load)."""
    max_latency_rate_per_s: float | None = 600.0
    threads: int | None = None
    """Torch intra-op threads of every process (None, ``--threads auto``: each one's own
    default: ``kbatch serve``'s CPU budget plan, torch's default for ``naive``, the whole
    budget for ``engine``)."""
    serve_prefix: tuple[str, ...] = ()
    """A command that runs ``kbatch serve`` (e.g. ``scripts/cgroup_run.sh kbatch-1cpu``,
    ``taskset -c 1``): the serve process and only it runs under it."""
    max_wait_ms: float = 10.0
    target_p99_ms: float | None = None
    """``--target-p99-ms`` of the kbatch variants and the engine (None: not set)."""
    variants: tuple[str, ...] = VARIANTS
    seed: int = 0
    backend: str = "torch"
    log_dir: Path | None = None
    ready_timeout_s: float = 240.0
    drain_timeout_s: float = 900.0
    request_timeout_s: float = 30.0


Say = Callable[[str], None]


# ---- processes ------------------------------------------------------------------------------


class _Process:
    """One consumer process (``kbatch serve`` or an e2e worker) with its log file."""

    def __init__(
        self,
        name: str,
        args: list[str],
        log_path: Path,
        ready: Callable[[], bool],
        env: Mapping[str, str] | None = None,
    ):
        self.name = name
        self.args = args
        self.env = env  # added to this process's environment
        self.log_path = log_path
        self._ready = ready
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            env = None if self.env is None else {**os.environ, **self.env}
            self.proc = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT, env=env)

    def cpu_s(self) -> float:
        """User + system CPU seconds of the process and its live children (replicas)."""
        import psutil

        assert self.proc is not None
        total = 0.0
        try:
            root = psutil.Process(self.proc.pid)
            for p in (root, *root.children(recursive=True)):
                with contextlib.suppress(psutil.Error):
                    times = p.cpu_times()
                    total += times.user + times.system
        except psutil.Error:
            pass
        return total

    def _check_alive(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise E2EError(
                f"{self.name} exited with {self.proc.returncode}; log {self.log_path}:\n"
                + self.log_tail()
            )

    async def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            self._check_alive()
            if await asyncio.to_thread(self._ready):
                return
            if time.monotonic() > deadline:
                raise E2EError(f"{self.name} not ready after {timeout_s:g} s: {self.log_tail()}")
            await asyncio.sleep(0.1)

    async def stop(self) -> None:
        """SIGTERM, up to 30 s to exit, then SIGKILL. Idempotent."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            await asyncio.to_thread(self.proc.wait, 30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            await asyncio.to_thread(self.proc.wait, 10)

    def log_tail(self, n: int = 30) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])


@dataclass(frozen=True)
class _Topics:
    request: str
    reply: str
    dlq: str
    group: str

    def args(self, bootstrap: str) -> list[str]:
        """The broker and topic flags both ``kbatch serve`` and the bench workers take."""
        return [
            "--bootstrap", bootstrap,
            "--request-topic", self.request,
            "--reply-topic", self.reply,
            "--dlq-topic", self.dlq,
            "--group-id", self.group,
        ]  # fmt: skip


SIM_BATCH_ARGS = ("--max-batch-tokens", "16384", "--max-batch-size", "256")
"""Batch limits of ``kbatch serve`` on a simulated device: a GPU's (the CPU defaults, 2048 padded
tokens and 64 items, would make a GPU wait on launch overhead)."""


def _serve_process(
    name: str,
    model: str,
    topics: _Topics,
    opts: E2EBenchOptions,
    log_dir: Path,
    replicas: int,
    extra: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> tuple[_Process, str]:
    from producer_tools.demo import free_port, http_ok

    port = free_port()
    args = [
        *opts.serve_prefix,
        sys.executable, "-c", "from consumer.cli import main; main()", "serve",
        *topics.args(opts.bootstrap),
        "--model", model,
        "--task", "embed",
        "--max-wait-ms", str(opts.max_wait_ms),
        "--metrics-port", str(port),
        "--replicas", str(replicas),
        *(("--torch-threads", str(max(1, opts.threads // replicas))) if opts.threads else ()),
        *(SIM_BATCH_ARGS if model.startswith("sim:") else ()),
        *(("--target-p99-ms", str(opts.target_p99_ms)) if opts.target_p99_ms else ()),
        *extra,
    ]  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    proc = _Process(name, args, log_dir / f"{name}.log", lambda: http_ok(f"{base}/readyz"), env)
    return proc, f"{base}/metrics"


def _worker_process(name: str, topics: _Topics, opts: E2EBenchOptions, log_dir: Path) -> _Process:
    ready_file = log_dir / f"{name}.ready"
    ready_file.unlink(missing_ok=True)
    args = [
        sys.executable, "-m", "consumer.bench.e2e_workers", name,
        *topics.args(opts.bootstrap),
        "--ready-file", str(ready_file),
        "--model", str(opts.model_dir),
        *(("--threads", str(opts.threads)) if opts.threads else ()),
    ]  # fmt: skip
    return _Process(name, args, log_dir / f"{name}.log", ready_file.exists)


# ---- the drain ------------------------------------------------------------------------------


class _HeldBacklog:
    """N request records produced inside one transaction that stays open until
    :meth:`release`: produced (and acknowledged) before the clock starts, invisible to
    ``read_committed`` consumers until then."""

    def __init__(self, bootstrap: str) -> None:
        self._producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            transactional_id=f"kbatch-bench-e2e-{uuid.uuid4().hex[:10]}",
            enable_idempotence=True,
            acks="all",
            linger_ms=5,
            transaction_timeout_ms=600_000,
        )

    async def fill(self, topic: str, records: Sequence[tuple[bytes, bytes, Any]]) -> None:
        await self._producer.start()
        await self._producer.begin_transaction()
        acks = [
            await self._producer.send(topic, value, key=key, headers=headers)
            for key, value, headers in records
        ]
        await asyncio.gather(*acks)

    async def release(self) -> float:
        """Commit the transaction; the monotonic time of the commit request (``t0``)."""
        t0 = time.monotonic()
        await self._producer.commit_transaction()
        return t0

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self._producer.stop()


class _ReplyCounter:
    """Reads the reply topic from its beginning; notes when the first and the N-th distinct
    expected key arrived (monotonic seconds) and the ``kbatch-status`` of each."""

    def __init__(
        self, bootstrap: str, topic: str, keys: set[bytes], read_committed: bool = False
    ) -> None:
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed" if read_committed else "read_uncommitted",
        )
        self._topic = topic
        self._expected = keys
        self._seen: set[bytes] = set()
        self.statuses: Counter[str] = Counter()
        self.first_s: float | None = None
        self.done_s: float | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self._consumer.start()
        tps = [TopicPartition(self._topic, 0)]  # the benchmark's topics have one partition
        self._consumer.assign(tps)
        await self._consumer.seek_to_beginning(*tps)
        self._task = asyncio.create_task(self._read(), name="bench-reply-counter")

    async def _read(self) -> None:
        while len(self._seen) < len(self._expected):
            batches = await self._consumer.getmany(timeout_ms=100, max_records=10_000)
            now = time.monotonic()
            for records in batches.values():
                for r in records:
                    if r.key in self._expected and r.key not in self._seen:
                        self._seen.add(r.key)
                        status = last_value(r.headers, STATUS) or b"?"
                        self.statuses[status.decode(errors="replace")] += 1
            if self._seen and self.first_s is None:
                self.first_s = now
        self.done_s = time.monotonic()

    @property
    def seen(self) -> int:
        return len(self._seen)

    async def wait(self, timeout_s: float) -> float:
        """The monotonic time the N-th reply arrived; raises :class:`E2EError` on timeout."""
        assert self._task is not None
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout_s)
        except TimeoutError:
            raise E2EError(
                f"only {self.seen}/{len(self._expected)} replies after {timeout_s:g} s"
            ) from None
        except Exception as exc:
            raise E2EError(f"reply reader failed: {exc!r}") from exc
        assert self.done_s is not None
        return self.done_s

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        with contextlib.suppress(Exception):
            await self._consumer.stop()


async def _latency_phase(
    opts: E2EBenchOptions,
    topics: _Topics,
    rate_per_s: float,
    metrics_url: str | None,
    read_committed: bool = False,
) -> dict[str, Any]:
    from producer_tools.load import LoadOptions, run_load

    run = await run_load(
        LoadOptions(
            bootstrap=opts.bootstrap,
            request_topic=topics.request,
            reply_topic=topics.reply,
            texts=list(opts.texts),
            pattern="poisson",
            rate_per_s=rate_per_s,
            duration_s=opts.latency_s,
            warmup_s=opts.latency_warmup_s,
            seed=opts.seed,
            timeout_s=opts.request_timeout_s,
            metrics_url=metrics_url,
            probe_timeout_s=opts.request_timeout_s,
            client_options={"read_committed": True} if read_committed else {},
        ),
        progress=False,
    )
    summary: dict[str, Any] = run.report["summary"]
    summary["sent_total"] = len(run.schedule) + 1  # the schedule, warm-up included, and the probe
    return summary


def _model_seconds(metrics_url: str | None) -> float | None:
    """``kbatch_inference_seconds_sum`` of a ``kbatch serve`` (its replicas summed), None when
    there is no endpoint or no such sample."""
    from producer_tools.load import metric_sums

    name = "kbatch_inference_seconds_sum"
    return None if metrics_url is None else (metric_sums(metrics_url, (name,), 5) or {}).get(name)


def _thread_cpu(metrics_url: str | None) -> dict[str, float] | None:
    """``kbatch_thread_cpu_seconds_total`` of a ``kbatch serve`` by ``thread`` (its role), None
    when there is no endpoint or no such metric (a raw loop; not Linux)."""
    from producer_tools.load import metric_by_label

    if metrics_url is None:
        return None
    return metric_by_label(metrics_url, "kbatch_thread_cpu_seconds_total", "thread", 5) or None


async def _kafka_variant(
    name: str, opts: E2EBenchOptions, log_dir: Path, say: Say, replicas: int = 1
) -> dict[str, Any]:
    key = variant_key(name, replicas)
    tag = f"bench.e2e.{key}.{uuid.uuid4().hex[:8]}"
    topics = _Topics(f"{tag}.requests", f"{tag}.replies", f"{tag}.dlq", f"{tag}.group")
    texts = list(opts.texts)
    n = len(texts)
    await create_topics(opts.bootstrap, [topics.request], partitions=max(opts.replicas))
    await create_topics(opts.bootstrap, [topics.reply, topics.dlq], partitions=1)
    spans = contextlib.ExitStack()  # the traced variants' OTLP endpoint
    if name in SERVED:
        model, extra, env = _serve_args(name, opts, spans)
        proc, metrics_url = _serve_process(key, model, topics, opts, log_dir, replicas, extra, env)
    else:
        proc, metrics_url, model = _worker_process(name, topics, opts, log_dir), None, None
    records = prefill_records(texts, topics.reply, f"{tag}-drain")
    backlog = _HeldBacklog(opts.bootstrap)
    committed = name.startswith("kbatch_eos")  # its replies count once their transaction committed
    counter = _ReplyCounter(opts.bootstrap, topics.reply, {k for k, _, _ in records}, committed)
    try:
        say(f"{key}: producing {n} requests (held in an open transaction)")
        await backlog.fill(topics.request, records)
        proc.start()
        await proc.wait_ready(opts.ready_timeout_s)
        await counter.start()
        say(f"{key}: ready; releasing the backlog")
        model_s0 = await asyncio.to_thread(_model_seconds, metrics_url)
        cpu_s0 = proc.cpu_s()
        t0 = await backlog.release()
        t_end = await counter.wait(opts.drain_timeout_s)
        cpu_s = proc.cpu_s() - cpu_s0
        model_s1 = await asyncio.to_thread(_model_seconds, metrics_url)
        drain_s = t_end - t0
        tput = seq_per_s(n, drain_s)
        model_s = None if model_s0 is None or model_s1 is None else model_s1 - model_s0
        if not (model or "").startswith("sim:"):
            model_s = None  # device figures only for a simulated device: the rest share the CPU
        figures = cpu_device_figures(n, drain_s, cpu_s, replicas, model_s)
        rate = latency_rate(tput, opts.load_fraction, opts.max_latency_rate_per_s)
        say(f"{key}: {tput} seq/s, {figures}; latency phase at {rate}/s for {opts.latency_s:g} s")
        summary = await _latency_phase(opts, topics, rate, metrics_url, committed)
        lat = summary["latency_ms"]
        frontier: list[dict[str, Any]] = []
        for label, point_rate in frontier_points(tput, opts):
            say(f"{key}: frontier {label} at {point_rate}/s")
            phase_cpu_s0 = proc.cpu_s()
            threads0 = await asyncio.to_thread(_thread_cpu, metrics_url)
            point = await _latency_phase(opts, topics, point_rate, metrics_url, committed)
            phase_cpu_s = proc.cpu_s() - phase_cpu_s0
            threads1 = await asyncio.to_thread(_thread_cpu, metrics_url)
            row = frontier_row(label, point_rate, point, phase_cpu_s, point["sent_total"])
            frontier.append(with_thread_shares(row, threads0, threads1))
        return {
            "seq_per_s": tput,
            "p50_ms": lat["p50"],
            "p99_ms": lat["p99"],
            "drain_s": round(drain_s, 3),
            "first_reply_ms": round(((counter.first_s or t_end) - t0) * 1000.0, 1),
            "drain_statuses": dict(counter.statuses),
            "latency_rate_per_s": rate,
            "latency_rate_capped": rate < round(opts.load_fraction * tput, 1),
            "latency_requests": summary["scheduled"],
            "latency_ok": summary["ok"],
            "latency_timeouts": summary["timeouts"],
            "latency_send_lag_ms_p99": summary["send_lag_ms"]["p99"],
            "latency_batch_size_mean": summary["batch_size_mean"],
            "stages_ms": summary["stages_ms"],
            "frontier": frontier,
            "replicas": replicas,
            **figures,
        }
    finally:
        await counter.close()
        await backlog.close()
        await proc.stop()
        spans.close()
        await delete_topics(opts.bootstrap, [topics.request, topics.reply, topics.dlq])


def _serve_args(
    name: str, opts: E2EBenchOptions, spans: contextlib.ExitStack
) -> tuple[str, tuple[str, ...], dict[str, str] | None]:
    """A served variant's ``--model``, its extra ``kbatch serve`` flags and environment (a
    traced variant: an OTLP sink entered on ``spans``, closed with the variant)."""
    noop = name.startswith("passthrough") or name in TRACED
    model = "noop" if noop else (opts.serve_model or str(opts.model_dir))
    backend = "onnx" if name == "kbatch_onnx" else opts.backend
    extra: tuple[str, ...] = ("--backend", backend) if not noop else ()
    env: dict[str, str] | None = None
    if name.startswith("kbatch_eos"):
        extra = (*extra, "--exactly-once")
    if name.endswith("_confluent"):
        extra = (*extra, "--kafka-client", "confluent")
    if name == "kbatch_bf16":
        extra = (*extra, "--dtype", "bfloat16")
    if name in TRACED:
        extra = (*extra, "--tracing")
        env = _tracing_env(spans.enter_context(otlp_sink()).endpoint, TRACED[name])
    return model, extra, env


def _tracing_env(endpoint: str, ratio: float) -> dict[str, str]:
    """The ``OTEL_*`` variables of a traced variant: head sampling at ``ratio`` (the requests
    carry no ``traceparent``, so each is a root), exported to ``endpoint``."""
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": str(ratio),
        "OTEL_SERVICE_NAME": "kbatch-bench",
    }


# ---- the engine alone -----------------------------------------------------------------------


async def _engine_variant(opts: E2EBenchOptions, say: Say) -> dict[str, Any]:
    """``kbatch bench engine``'s ``bucketed`` strategy: backlog of the N texts, then Poisson
    arrivals at ``load_fraction`` × its backlog throughput (capped like the others)."""
    from consumer.bench.engine_bench import (
        EngineBenchOptions,
        _configs,
        _Strategy,
        poisson_arrivals,
    )
    from consumer.cpu.plan import budget_cores_whole
    from consumer.model.loader import load_runner
    from consumer.model.tokenize import HFTokenizer
    from consumer.model.torch_backend import configure_threads, describe_runner

    texts = list(opts.texts)
    threads = configure_threads(opts.threads or budget_cores_whole())
    runner = load_runner(opts.model_dir, backend=opts.backend, threads=threads)  # type: ignore[arg-type]
    tokenizer = HFTokenizer(opts.model_dir, max_length=runner.max_length)
    cuda = str(describe_runner(runner).get("device", "")).startswith("cuda")
    eopts = EngineBenchOptions(
        model_dir=opts.model_dir, texts=texts, n=len(texts), max_wait_ms=opts.max_wait_ms
    )
    config = _configs(eopts, runner.max_length, cuda)["bucketed"]
    if opts.target_p99_ms is not None:
        config = config.model_copy(update={"target_p99_ms": opts.target_p99_ms})
    strategy = _Strategy(runner, tokenizer, config, "all" if cuda else "largest")
    await strategy.engine.start()
    try:
        say("engine: backlog")
        await strategy.backlog(texts, ENGINE_CHUNK)
        tput = seq_per_s(strategy.backlog_items, strategy.backlog_s)
        rate = latency_rate(tput, opts.load_fraction, opts.max_latency_rate_per_s)
        say(f"engine: {tput} seq/s; paced phase at {rate}/s for {opts.latency_s:g} s")
        paced = poisson_arrivals(texts, rate, opts.latency_s, opts.seed + 1)
        row = await strategy.paced(paced)
        frontier: list[dict[str, Any]] = []
        for label, point_rate in frontier_points(tput, opts):
            say(f"engine: frontier {label} at {point_rate}/s")
            arrivals = poisson_arrivals(texts, point_rate, opts.latency_s, opts.seed + 1)
            point = await strategy.paced(arrivals)
            frontier.append(
                {
                    "point": label,
                    "rate_per_s": point_rate,
                    "p50_ms": point["p50_ms"],
                    "p99_ms": point["p99_ms"],
                    "requests": len(arrivals),
                    "batch_size_mean": point["paced_mean_batch_size"],
                }
            )
    finally:
        await strategy.engine.stop()
    return {
        "seq_per_s": tput,
        "p50_ms": row["p50_ms"],
        "p99_ms": row["p99_ms"],
        "drain_s": round(strategy.backlog_s, 3),
        "first_reply_ms": None,
        "latency_rate_per_s": rate,
        "latency_rate_capped": rate < round(opts.load_fraction * tput, 1),
        "latency_requests": len(paced),
        "padding_efficiency": row["padding_efficiency"],
        "backlog_mean_batch_size": row["backlog_mean_batch_size"],
        "latency_batch_size_mean": row["paced_mean_batch_size"],
        "frontier": frontier,
    }


# ---- the run --------------------------------------------------------------------------------


async def run_e2e_bench(opts: E2EBenchOptions, say: Say = lambda _msg: None) -> dict[str, Any]:
    """Measure every variant in ``opts.variants`` (in :data:`VARIANTS` order); the JSON-able
    report: one object per variant (``seq_per_s``, ``p50_ms``, ``p99_ms`` and details), the
    three ratios (None when a side was not run) and ``setup``.

    Raises:
        ValueError: an unknown variant, no texts, a replica count below 1, or naive/engine
            with a simulated model.
        E2EError: a variant's process died or its drain did not finish in time.
    """
    unknown = set(opts.variants) - set(VARIANTS)
    if unknown:
        raise ValueError(f"unknown variants {sorted(unknown)}; known: {VARIANTS}")
    if not opts.texts:
        raise ValueError("no texts")
    if not opts.replicas or min(opts.replicas) < 1:
        raise ValueError(f"replicas must be counts >= 1, got {opts.replicas}")
    if opts.serve_model is not None and {"naive", "engine"} & set(opts.variants):
        raise ValueError(f"--model {opts.serve_model}: naive and engine need a model directory")
    from consumer.model.tokenize import HFTokenizer

    tmp: tempfile.TemporaryDirectory[str] | None = None
    if opts.log_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="kbatch-bench-e2e-")
        log_dir = Path(tmp.name)
    else:
        log_dir = opts.log_dir
        log_dir.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {}
    started = time.monotonic()
    load_start = [round(x, 2) for x in os.getloadavg()]
    try:
        for name in VARIANTS:
            if name not in opts.variants:
                continue
            if name == "engine":
                report[name] = await _engine_variant(opts, say)
            elif name in REPLICATED:
                for n in opts.replicas:
                    row = await _kafka_variant(name, opts, log_dir, say, n)
                    report[variant_key(name, n)] = row
            else:
                report[name] = await _kafka_variant(name, opts, log_dir, say)
    finally:
        if tmp is not None:
            tmp.cleanup()
    report.update(ratios(report))
    report.update(cpu_ratios(report))
    report.update(replica_ratios(report, opts.replicas))
    report["setup"] = {
        "model": opts.serve_model or str(opts.model_dir),
        "texts": len(opts.texts),
        **token_stats(len(ids) for ids in HFTokenizer(opts.model_dir).encode(list(opts.texts))),
        "torch_threads": opts.threads or "auto",
        "backend": opts.backend,
        "max_wait_ms": opts.max_wait_ms,
        "target_p99_ms": opts.target_p99_ms,
        "load_fraction": opts.load_fraction,
        "latency_fractions": list(opts.latency_fractions),
        "latency_rates": list(opts.latency_rates),
        "max_latency_rate_per_s": opts.max_latency_rate_per_s,
        "latency_s": opts.latency_s,
        "latency_warmup_s": opts.latency_warmup_s,
        "partitions": max(opts.replicas),
        "replicas": list(opts.replicas),
        "cpu_count": os.cpu_count(),
        "bootstrap": opts.bootstrap,
        "wall_s": round(time.monotonic() - started, 1),
        "loadavg_1_5_15_start": load_start,
        "loadavg_1_5_15_end": [round(x, 2) for x in os.getloadavg()],
        "log_dir": str(opts.log_dir) if opts.log_dir else None,
    }
    return report
