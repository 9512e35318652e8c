"""``kbatch bench engine``: one model, the same real texts, the same arrivals, three strategies.

Strategies (all driven through the same :class:`~consumer.batching.engine.Engine`, tokenizer
and runner, so only batch formation differs):

- ``single``: one request at a time (``max_batch_size=1``, no wait);
- ``fixed``: batches of ``fixed_batch_size`` in arrival order, one queue, padded to the longest;
- ``bucketed``: the engine's token-length buckets with the configured budget and wait.

Two phases per strategy, identical for all three:

1. **backlog** — all ``n`` texts arrive at once (a consumer catching up, a backfill):
   ``seq_per_s``, ``tokens_per_s`` (real tokens) and ``padding_efficiency`` (real / padded).
   ``cpu_ms_per_seq``: process CPU time (every thread) per text — steadier than wall time
   on a shared machine, and it counts threads that spin. ``backlog_model_busy_fraction``: the
   backlog batches' summed model time / the backlog's wall time (baselines too: their batch
   time includes tokenizing the batch) — what is left, 1 − it, is time the model waited on
   the rest (tokenization, batch formation, the hand-off). The backlog runs in ``rounds``
   slices, interleaved across the strategies, so a noisy neighbour on a shared machine slows
   all three alike.
2. **paced** — Poisson arrivals at ``rate_per_s`` for ``seconds``: ``p50_ms``/``p99_ms`` from
   arrival to answer, and ``paced_model_busy_fraction`` (model time / phase length). Default
   rate: ``rate_fraction`` (0.5) × the ``single`` strategy's backlog throughput — a stream the
   one-at-a-time server sustains too, so the three latencies compare like for like (``fixed``
   is slower than ``single`` and shows it as a growing queue). Without ``single``: 0.25 × the
   bucketed backlog throughput.

   Why not a fraction of the bucketed backlog rate: that rate is measured with full batches; a
   moderate stream forms small ones, and on a CPU a small batch costs several times more per
   item (each forward reads all the weights once: MiniLM ≈ 14–20 ms for one short text,
   ≈ 5 ms per item in a full batch). At half the bucketed backlog rate the model is ≈ 90 %
   busy whatever the policy, and any server queues for many batch times there; the latency
   bound (max wait + two batch times) is a claim about a server below that knee.

Baselines, backlog only (the same texts, the same rounds, the same torch threads):

- ``plain_loop``: plain transformers, one text at a time (``AutoTokenizer`` + ``AutoModel``,
  mean pooling, normalise; no kbatch code: :mod:`consumer.model.baselines`) — what ``single``
  must match (``ratio_single_vs_plain_loop``);
- ``sorted_offline``: the whole backlog sorted by token length and cut greedily under the
  bucketed strategy's token budget and batch-size cap, plain transformers — the best an offline
  script can do with perfect knowledge (``ratio_bucketed_vs_sorted_offline``);
- ``runner_loop``: kbatch's tokenizer and :class:`~consumer.model.batch_runner.ModelRunner` on
  batches of one in a plain loop, no engine — ``single``'s per-batch model time must be within
  10 % of it (``ratio_single_batch_ms_vs_runner_loop``, backlog ``batch_ms_p50`` of each).
  It also runs the paced phase's arrivals in its plain loop (sleeping until each one):
  ``paced_batch_ms_p50`` against ``single``'s paced ``batch_ms_p50``
  (``ratio_single_paced_batch_ms_vs_runner_loop``) — the same idle gaps on both sides, so a
  batch that is slower after idle time is told apart from a batch slowed by the engine.

``--backend onnx`` runs the engine strategies and ``runner_loop`` on ONNX Runtime; the plain
baselines stay plain torch (what a user has without kbatch).

Texts: a seeded uniform sample of the VADER corpus (``producer_tools.corpus``: tweets, movie,
NYT and Amazon snippets, plus whole NYT/Amazon documents for the long tail).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from consumer.batching.config import BatchPolicyConfig
from consumer.batching.engine import Engine, WarmupMode
from consumer.batching.stats import EngineStats, NullStats
from consumer.batching.types import Batch, InferenceItem, ItemOutcome, TokenizedItem
from consumer.bench.e2e_report import token_stats
from consumer.bench.quality import load_candidate
from consumer.cpu.plan import budget_cores_whole
from consumer.model.baselines import BaselineRun, PlainModel, plain_loop, sorted_offline
from consumer.model.batch_runner import ModelRunner
from consumer.model.tokenize import HFTokenizer
from consumer.model.torch_backend import configure_threads, describe_runner

__all__ = ["EngineBenchOptions", "run_engine_bench"]

STRATEGIES = ("single", "fixed", "bucketed")
BASELINES = ("plain_loop", "sorted_offline", "runner_loop")
"""Backlog-only references (see the module docstring); any of them may join ``strategies``."""


@dataclass(frozen=True)
class EngineBenchOptions:
    """Options of ``kbatch bench engine`` (see the CLI for their help)."""

    model_dir: Path
    texts: Sequence[str]
    n: int = 1500
    seconds: float = 10.0
    rate_per_s: float | None = None
    rate_fraction: float = 0.5
    max_wait_ms: float = 10.0
    max_batch_tokens: int | None = None
    max_batch_size: int = 64
    fixed_batch_size: int = 32
    device: str | None = None
    autocast: str | None = None
    threads: int | None = None
    chunk: int = 256
    rounds: int = 1
    batch_overhead_tokens: int | None = None
    seed: int = 0
    strategies: tuple[str, ...] = STRATEGIES + BASELINES
    backend: str = "torch"
    quantize: str = "none"


def _percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    k = max(0, min(len(s) - 1, round(q / 100.0 * (len(s) - 1))))
    return s[k]


def poisson_arrivals(
    texts: Sequence[str], rate_per_s: float, seconds: float, seed: int
) -> list[tuple[float, str]]:
    """Seeded Poisson arrivals for a paced phase: ``(offset_s, text)`` pairs, offsets from the
    phase start in ``[0, seconds)``, texts drawn uniformly from ``texts``."""
    rng = random.Random(seed)
    paced: list[tuple[float, str]] = []
    t = rng.expovariate(rate_per_s)
    while t < seconds:
        paced.append((t, texts[rng.randrange(len(texts))]))
        t += rng.expovariate(rate_per_s)
    return paced


def _paced_rate(
    opts: EngineBenchOptions, strategies: dict[str, _Strategy]
) -> tuple[float, str | None]:
    """The paced phase's arrivals per second and what it is a fraction of (None: ``--rate``):
    ``rate_fraction`` of the single strategy's backlog throughput, or half that fraction of
    the bucketed one's when single does not run; at least 1/s."""
    if opts.rate_per_s:
        return opts.rate_per_s, None
    if "single" in strategies:
        base, fraction = strategies["single"], opts.rate_fraction
        basis = f"{opts.rate_fraction} x single backlog seq/s"
    else:
        base, fraction = strategies["bucketed"], opts.rate_fraction / 2
        basis = f"{opts.rate_fraction / 2} x bucketed backlog seq/s"
    return max(1.0, fraction * base.backlog_items / base.backlog_s), basis


def _bucketed_bounds(
    b: dict[str, Any], max_wait_ms: float, cuda_info: dict[str, Any]
) -> dict[str, Any]:
    """The bucketed strategy's p99 against its bound, and (on CUDA, ``cuda_info``:
    :func:`describe_runner`'s) its model TFLOP/s and MFU.

    The bound: max wait + two batch times (the batch running when an item's bucket flushes,
    then its own). As a worst case it takes the longest batch of the paced phase; the
    stricter variant takes the p99 batch time instead.
    """
    bound = max_wait_ms + 2 * b["batch_ms_max"]
    strict = max_wait_ms + 2 * b["batch_ms_p99"]
    out = {
        "bucketed_p99_bound_ms": round(bound, 1),
        "bucketed_p99_within_bound": bool(b["p99_ms"] <= bound),
        "bucketed_p99_bound_p99_batch_ms": round(strict, 1),
        "bucketed_p99_within_bound_p99_batch": bool(b["p99_ms"] <= strict),
    }
    if cuda_info.get("params_non_embedding") and cuda_info.get("peak_tflops_bf16"):
        achieved = b["padded_tokens_per_s"] * 2 * cuda_info["params_non_embedding"] / 1e12
        out["bucketed_model_tflops"] = round(achieved, 3)
        out["bucketed_mfu_vs_bf16_peak"] = round(achieved / cuda_info["peak_tflops_bf16"], 5)
    return out


def _configs(opts: EngineBenchOptions, max_length: int, cuda: bool) -> dict[str, BatchPolicyConfig]:
    budget = opts.max_batch_tokens or (16384 if cuda else 2048)
    one_queue = (max_length,)
    return {
        "single": BatchPolicyConfig(
            max_batch_size=1,
            max_batch_tokens=max_length,
            max_wait_ms=0.0,
            bucket_edges=one_queue,
            adaptive_wait=False,
        ),
        "fixed": BatchPolicyConfig(
            max_batch_size=opts.fixed_batch_size,
            max_batch_tokens=opts.fixed_batch_size * max_length,
            max_wait_ms=opts.max_wait_ms,
            bucket_edges=one_queue,
            adaptive_wait=False,
        ),
        "bucketed": BatchPolicyConfig(
            max_batch_size=opts.max_batch_size,
            max_batch_tokens=max(budget, max_length),
            max_wait_ms=opts.max_wait_ms,
            batch_overhead_tokens=(
                BatchPolicyConfig.model_fields["batch_overhead_tokens"].default
                if opts.batch_overhead_tokens is None
                else opts.batch_overhead_tokens
            ),
        ),
    }


class _Collector:
    def __init__(self) -> None:
        self.done_at: dict[int, float] = {}
        self.outcomes: dict[int, ItemOutcome] = {}
        self.all_done = asyncio.Event()
        self.expect = 0

    def reset(self, expect: int) -> None:
        self.done_at.clear()
        self.outcomes.clear()
        self.all_done.clear()
        self.expect = expect

    def __call__(self, outcomes: list[ItemOutcome]) -> None:
        now = time.monotonic()
        for o in outcomes:
            self.done_at[o.item_id] = now
            self.outcomes[o.item_id] = o
        if len(self.outcomes) >= self.expect:
            self.all_done.set()


class _Strategy:
    """One strategy's engine, kept across the interleaved backlog rounds and the paced phase."""

    def __init__(
        self,
        runner: ModelRunner,
        tokenizer: HFTokenizer,
        config: BatchPolicyConfig,
        warmup: WarmupMode,
    ) -> None:
        self.runner = runner
        self.stats = EngineStats()
        self.collect = _Collector()
        self.engine = Engine(
            runner, tokenizer, config, self.collect, stats=self.stats, warmup=warmup
        )
        self.backlog_s = 0.0
        self.backlog_cpu_s = 0.0
        self.backlog_items = 0
        self.failed = 0

    async def backlog(self, texts: Sequence[str], chunk: int) -> None:
        """Everything arrives at t0, submitted a poll chunk at a time; time to the last answer."""
        self.runner.stats = self.stats
        self.collect.reset(len(texts))
        t0 = time.monotonic()
        cpu0 = time.process_time()
        for start in range(0, len(texts), chunk):
            part = texts[start : start + chunk]
            await self.engine.submit(
                [InferenceItem(start + i, t, arrival_s=t0) for i, t in enumerate(part)]
            )
        await self.collect.all_done.wait()
        self.backlog_cpu_s += time.process_time() - cpu0
        self.backlog_s += max(self.collect.done_at.values()) - t0
        self.backlog_items += len(texts)
        self.failed += sum(1 for o in self.collect.outcomes.values() if o.status != "ok")

    async def paced(self, paced: list[tuple[float, str]]) -> dict[str, Any]:
        """Poisson arrivals, one record per submit; the backlog counters end here."""
        s = self.stats
        real, padded, batches = s.real_tokens, s.padded_tokens, s.batches
        self.runner.stats = s
        self.collect.reset(len(paced))
        t1 = time.monotonic()
        pending: set[asyncio.Task[list[int]]] = set()
        for i, (offset, text) in enumerate(paced):
            delay = t1 + offset - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(
                self.engine.submit([InferenceItem(i, text, arrival_s=t1 + offset)])
            )
            pending.add(task)
            task.add_done_callback(pending.discard)
        if paced:
            await self.collect.all_done.wait()
        latencies = [
            (self.collect.done_at[i] - (t1 + paced[i][0])) * 1000.0 for i in range(len(paced))
        ]
        paced_s = max(self.collect.done_at.values(), default=t1) - t1
        batch_ms = list(s.infer_ms)[batches:]
        backlog_ms = list(s.infer_ms)[:batches]
        paced_sizes = list(s.batch_sizes)[batches:]
        span = self.backlog_s
        return {
            "seq_per_s": round(self.backlog_items / span, 1),
            "tokens_per_s": round(real / span, 1),
            "padding_efficiency": round(real / padded, 4) if padded else 1.0,
            "p50_ms": round(_percentile(latencies, 50), 1),
            "p99_ms": round(_percentile(latencies, 99), 1),
            "backlog_s": round(span, 2),
            "cpu_ms_per_seq": round(1000.0 * self.backlog_cpu_s / self.backlog_items, 2),
            "backlog_batches": batches,
            "backlog_mean_batch_size": round(self.backlog_items / max(batches, 1), 1),
            "padded_tokens_per_s": round(padded / span, 1),
            "paced_mean_batch_size": (
                round(statistics.fmean(paced_sizes), 2) if paced_sizes else 0.0
            ),
            "paced_model_busy_fraction": (
                round(sum(batch_ms) / 1000.0 / paced_s, 3) if paced_s > 0 else 0.0
            ),
            "backlog_batch_ms_p50": round(_percentile(backlog_ms, 50), 2),
            "backlog_model_busy_fraction": round(sum(backlog_ms) / 1000.0 / span, 3),
            "batch_ms_p50": round(_percentile(batch_ms, 50), 1),
            "batch_ms_p99": round(_percentile(batch_ms, 99), 1),
            "batch_ms_max": round(max(batch_ms, default=float("nan")), 1),
            "failed": self.failed,
        }


def _runner_loop(runner: ModelRunner, tokenizer: HFTokenizer, texts: Sequence[str]) -> BaselineRun:
    """kbatch's tokenizer and runner on one text at a time, in a plain loop (no engine)."""
    runner.stats = NullStats()
    times: list[float] = []
    real = 0
    t0 = time.perf_counter()
    for i, text in enumerate(texts):
        (tok,) = tokenizer.tokenize([InferenceItem(i, text)])
        if not isinstance(tok, TokenizedItem):
            continue
        (run,) = runner.run(Batch([tok], tok.n_tokens, 0.0))
        times.append(run.infer_ms)
        real += tok.n_tokens
    return BaselineRun(len(texts), time.perf_counter() - t0, real, real, len(times), tuple(times))


class _Baselines:
    """The backlog-only references of ``names``, accumulated over the rounds."""

    def __init__(
        self,
        names: Sequence[str],
        opts: EngineBenchOptions,
        runner: ModelRunner,
        tokenizer: HFTokenizer,
        config: BatchPolicyConfig,
    ) -> None:
        self.names = [n for n in BASELINES if n in names]
        self.runner, self.tokenizer, self.config = runner, tokenizer, config
        plain = {"plain_loop", "sorted_offline"} & set(self.names)
        if plain and runner.task != "embed":
            raise ValueError(f"{sorted(plain)} need an embed model")
        self.plain = None
        if plain:  # on a GPU in the engine's dtype, as a user would cast it
            device = str(describe_runner(runner).get("device", "cpu"))
            self.plain = PlainModel(
                opts.model_dir, runner.max_length, device=device, dtype=opts.autocast
            )
        self.runs: dict[str, list[BaselineRun]] = {n: [] for n in self.names}
        self.cpu_s: dict[str, float] = dict.fromkeys(self.names, 0.0)

    def run(self, texts: Sequence[str]) -> None:
        """One backlog slice through every baseline (blocking: nothing else runs meanwhile)."""
        for name in self.names:
            cpu0 = time.process_time()
            if name == "runner_loop":
                result = _runner_loop(self.runner, self.tokenizer, texts)
            elif name == "plain_loop":
                assert self.plain is not None
                result = plain_loop(self.plain, texts)
            else:
                assert self.plain is not None
                result = sorted_offline(
                    self.plain,
                    texts,
                    max_batch_tokens=self.config.max_batch_tokens,
                    max_batch_size=self.config.max_batch_size,
                )
            self.runs[name].append(result)
            self.cpu_s[name] += time.process_time() - cpu0

    def paced(self, paced: list[tuple[float, str]]) -> list[float]:
        """``runner_loop`` at the paced phase's arrival times (a plain loop that sleeps until
        each arrival, then tokenizes and runs it): its per-batch ms, for comparison with
        ``single``'s ``batch_ms_p50`` after the same idle gaps. Empty without runner_loop."""
        if "runner_loop" not in self.names:
            return []
        self.runner.stats = NullStats()
        times: list[float] = []
        t1 = time.monotonic()
        for i, (offset, text) in enumerate(paced):
            delay = t1 + offset - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            (tok,) = self.tokenizer.tokenize([InferenceItem(i, text)])
            if isinstance(tok, TokenizedItem):
                (run,) = self.runner.run(Batch([tok], tok.n_tokens, 0.0))
                times.append(run.infer_ms)
        return times

    def report(self) -> dict[str, dict[str, Any]]:
        """Per baseline: ``seq_per_s``, ``tokens_per_s``, ``padding_efficiency``,
        ``backlog_s``, ``backlog_batches``, ``backlog_batch_ms_p50``/``_p99`` and
        ``backlog_model_busy_fraction`` (the batches' summed time / ``backlog_s``)."""
        out: dict[str, dict[str, Any]] = {}
        for name, runs in self.runs.items():
            span = sum(r.seconds for r in runs)
            real = sum(r.real_tokens for r in runs)
            padded = sum(r.padded_tokens for r in runs)
            ms = [m for r in runs for m in r.batch_ms]
            out[name] = {
                "seq_per_s": round(sum(r.texts for r in runs) / span, 1),
                "tokens_per_s": round(real / span, 1),
                "padding_efficiency": round(real / padded, 4) if padded else 1.0,
                "backlog_s": round(span, 2),
                "cpu_ms_per_seq": round(1000.0 * self.cpu_s[name] / sum(r.texts for r in runs), 2),
                "backlog_batches": sum(r.batches for r in runs),
                "backlog_batch_ms_p50": round(_percentile(ms, 50), 2),
                "backlog_batch_ms_p99": round(_percentile(ms, 99), 2),
                "backlog_model_busy_fraction": round(sum(ms) / 1000.0 / span, 3),
            }
        return out


RATIOS: tuple[tuple[str, str, str, str], ...] = (
    ("ratio_bucketed_vs_single", "bucketed", "single", "seq_per_s"),
    ("ratio_bucketed_vs_fixed", "bucketed", "fixed", "seq_per_s"),
    ("ratio_single_vs_plain_loop", "single", "plain_loop", "seq_per_s"),
    ("ratio_bucketed_vs_plain_loop", "bucketed", "plain_loop", "seq_per_s"),
    ("ratio_bucketed_vs_sorted_offline", "bucketed", "sorted_offline", "seq_per_s"),
    ("ratio_single_batch_ms_vs_runner_loop", "single", "runner_loop", "backlog_batch_ms_p50"),
)
_PACED_RATIO = "ratio_single_paced_batch_ms_vs_runner_loop"
"""``single``'s paced ``batch_ms_p50`` / ``runner_loop``'s ``paced_batch_ms_p50``: the model
time of a batch of one after the same idle gaps, inside the engine and in a plain loop."""
"""(report key, numerator, denominator, figure): each ratio present when both sides ran."""


def ratios(report: dict[str, Any]) -> dict[str, float]:
    """The :data:`RATIOS` whose two sides are in ``report``, rounded to 2 (3 for batch ms)."""
    out: dict[str, float] = {}
    for key, num, den, figure in RATIOS:
        a, b = report.get(num), report.get(den)
        if isinstance(a, dict) and isinstance(b, dict) and b.get(figure):
            out[key] = round(a[figure] / b[figure], 3 if "batch_ms" in key else 2)
    single, loop = report.get("single"), report.get("runner_loop")
    if isinstance(single, dict) and isinstance(loop, dict) and loop.get("paced_batch_ms_p50"):
        out[_PACED_RATIO] = round(single["batch_ms_p50"] / loop["paced_batch_ms_p50"], 3)
    return out


async def run_engine_bench(opts: EngineBenchOptions) -> dict[str, Any]:
    """Run the benchmark; returns the JSON-able report (see the module docstring).

    Raises ``ValueError`` for an unknown strategy or too few texts.
    """
    unknown = set(opts.strategies) - set(STRATEGIES) - set(BASELINES)
    if unknown or "bucketed" not in opts.strategies:
        raise ValueError(
            f"strategies must include 'bucketed' and be among {STRATEGIES + BASELINES}"
        )
    if not opts.texts:
        raise ValueError("no texts")
    threads = configure_threads(opts.threads or budget_cores_whole())
    runner = load_candidate(opts, threads)
    tokenizer = HFTokenizer(opts.model_dir, max_length=runner.max_length)
    info = describe_runner(runner)
    cuda = str(info.get("device", "")).startswith("cuda")
    texts = list(opts.texts)[: opts.n]
    configs = _configs(opts, runner.max_length, cuda)
    warmup: WarmupMode = "all" if cuda else "largest"

    # One engine per strategy (one shared runner); the warm-up runs once, up front.
    order = ["bucketed", *[n for n in opts.strategies if n in STRATEGIES and n != "bucketed"]]
    baselines = _Baselines(opts.strategies, opts, runner, tokenizer, configs["bucketed"])
    strategies = {
        n: _Strategy(runner, tokenizer, configs[n], warmup if n == "bucketed" else "none")
        for n in order
    }
    for n in order:
        await strategies[n].engine.start()
    report: dict[str, Any] = {}
    load_start = [round(x, 2) for x in os.getloadavg()]
    try:
        # Backlog rounds, interleaved: a noisy neighbour on a shared machine slows every
        # strategy alike instead of one of them.
        bounds = [round(i * len(texts) / opts.rounds) for i in range(opts.rounds + 1)]
        for lo, hi in itertools.pairwise(bounds):
            for n in order:
                await strategies[n].backlog(texts[lo:hi], opts.chunk)
            baselines.run(texts[lo:hi])
        # Paced phase: the same Poisson arrivals for every strategy, by default at half the
        # single strategy's throughput (see the module docstring).
        rate, rate_basis = _paced_rate(opts, strategies)
        paced = poisson_arrivals(texts, rate, opts.seconds, opts.seed + 1)
        for n in order:
            report[n] = await strategies[n].paced(paced)
        paced_ms = baselines.paced(paced)
    finally:
        for st in strategies.values():
            await st.engine.stop()

    report.update(baselines.report())
    if paced_ms:
        report["runner_loop"]["paced_batch_ms_p50"] = round(_percentile(paced_ms, 50), 2)
    report.update(ratios(report))
    report.update(_bucketed_bounds(report["bucketed"], opts.max_wait_ms, info if cuda else {}))
    report["setup"] = {
        "model": str(opts.model_dir),
        "texts": len(texts),
        **token_stats(len(ids) for ids in tokenizer.encode(texts)),
        "paced_rate_per_s": round(rate, 1),
        "paced_rate_basis": rate_basis,
        "paced_items": len(paced),
        "paced_seconds": opts.seconds,
        "max_wait_ms": opts.max_wait_ms,
        "bucketed_max_batch_tokens": configs["bucketed"].max_batch_tokens,
        "bucketed_max_batch_size": configs["bucketed"].max_batch_size,
        "bucketed_batch_overhead_tokens": configs["bucketed"].batch_overhead_tokens,
        "fixed_batch_size": opts.fixed_batch_size,
        "torch_threads": threads,
        "backend": opts.backend,
        "quantize": opts.quantize,
        "baselines": baselines.names,
        "loadavg_1_5_15_start": load_start,
        "loadavg_1_5_15_end": [round(x, 2) for x in os.getloadavg()],
        **info,
    }
    return report
