"""``kbatch bench windows``: what a long document costs in windows (contract 1.3).

One document of ``n`` windows against ``n`` separate requests of one window each (the
document's own windows as texts), through the real path (fan-out, engine buckets and batches,
the model): the model time (sum of the batches' ``infer_ms``, milliseconds) and the padding
efficiency (real ÷ padded tokens) of each, the median over ``repeats`` runs (the two cases
take turns going first: the first batch after a pause runs slower on a busy CPU). The
goal: the document within 1.1× the separate requests in both.

Tasks: ``embed`` (``chunking`` at the model's maximum, no overlap: the chunks and the separate
texts are the same sequences) and ``token-classify`` (the tokenizer's overflow windows with
``stride``; the separate texts are each window's characters).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from consumer.batching.config import BatchPolicyConfig
from consumer.batching.engine import Engine
from consumer.batching.stats import EngineStats
from consumer.batching.types import ChunkPlan, InferenceItem, ItemOutcome
from consumer.model.loader import load_runner
from consumer.model.tokenize import HFTokenizer
from consumer.model.windows import ChunkWindows, TokenWindows, fan_out_for

__all__ = ["WindowsBenchOptions", "run_windows_bench"]

SENTENCES = (
    "Kafka keeps every partition as an ordered, replicated log of records.",
    "Sarah Connor met John in Los Angeles on a rainy Tuesday in 1984.",
    "Consumers commit offsets to the __consumer_offsets topic after processing.",
    "Zürich, Москва and 東京 host brokers that replicate naïve café data.",
)


@dataclass(frozen=True)
class WindowsBenchOptions:
    """Args of :func:`run_windows_bench`: the model directory, its task (``embed`` or
    ``token-classify``), ``windows`` per document, the token-classify ``stride`` (None: the
    default), ``repeats``, the device and the batch policy."""

    model_dir: Path
    task: Literal["embed", "token-classify"] = "embed"
    windows: int = 10
    stride: int | None = None
    repeats: int = 5
    device: str = "cpu"
    policy: BatchPolicyConfig = field(default_factory=lambda: BatchPolicyConfig(max_wait_ms=2.0))


def _document(tokenizer: HFTokenizer, options: WindowsBenchOptions) -> tuple[str, list[str]]:
    """A text of exactly ``windows`` windows and each window's characters."""
    words: list[str] = []
    item = InferenceItem(0, "", chunking=ChunkPlan(None, 0))
    splitter: Any = (
        TokenWindows(tokenizer, stride=options.stride, max_windows=4 * options.windows)
        if options.task == "token-classify"
        else ChunkWindows(tokenizer, max_windows=4 * options.windows)
    )
    parts: list[InferenceItem] = []
    for i in range(100_000):
        words.append(SENTENCES[i % len(SENTENCES)])
        (split,) = splitter.split([InferenceItem(0, " ".join(words), chunking=item.chunking)])
        if isinstance(split, list) and len(split) > options.windows:
            words.pop()
            break
        parts = split if isinstance(split, list) else parts
    text = " ".join(words)
    spans: list[str] = []
    for part in parts:
        window = part.window
        assert window is not None
        if window.alignment is not None:  # token-classify: the window's tokens' characters
            ends = [(a, b) for a, b in window.alignment.offsets if b > a]
            spans.append(text[ends[0][0] : ends[-1][1]])
        else:
            spans.append(text[window.start : window.end])
    return text, spans


async def _one_run(
    engine: Engine, fanout: Any, items: Sequence[InferenceItem], stats: EngineStats
) -> tuple[float, int, int]:
    """(model ms, real tokens, padded tokens) of computing ``items`` once."""
    before = (stats.batches, stats.real_tokens, stats.padded_tokens)
    await fanout.submit(list(items))
    assert await engine.drain(timeout_s=600)
    batches = stats.batches - before[0]
    infer = sum(list(stats.infer_ms)[-batches:]) if batches else 0.0
    return infer, stats.real_tokens - before[1], stats.padded_tokens - before[2]


async def run_windows_bench(options: WindowsBenchOptions) -> dict[str, Any]:
    """Run the bench (see the module docstring); a JSON-ready report.

    Raises:
        ValueError: a task other than ``embed`` or ``token-classify``.
    """
    if options.task not in ("embed", "token-classify"):
        raise ValueError(f"bench windows runs embed or token-classify, not {options.task}")
    stats = EngineStats(keep=100_000)
    runner = load_runner(options.model_dir, task=options.task, device=options.device, stats=stats)
    tokenizer = HFTokenizer(
        options.model_dir, max_length=runner.max_length, alignment=options.task == "token-classify"
    )
    text, spans = _document(tokenizer, options)
    outcomes: list[ItemOutcome] = []
    engine = Engine(runner, tokenizer, options.policy, stats=stats, warmup="largest")
    fanout = fan_out_for(options.task, tokenizer, engine, outcomes.extend, stride=options.stride)
    assert fanout is not None
    plan = ChunkPlan(None, 0) if options.task == "embed" else None
    ids = iter(range(10**9))

    def items(texts: Sequence[str]) -> list[InferenceItem]:
        now = time.monotonic()
        return [InferenceItem(next(ids), t, arrival_s=now, windows=True, chunking=plan)
                for t in texts]  # fmt: skip

    runs: dict[str, list[tuple[float, int, int]]] = {"document": [], "separate": []}
    await engine.start()
    try:
        cases = {"document": [text], "separate": spans}
        for repeat in range(options.repeats):  # each case first every other time
            for case in sorted(cases, reverse=repeat % 2 == 1):
                runs[case].append(await _one_run(engine, fanout, items(cases[case]), stats))
    finally:
        await engine.stop()
    assert all(o.status == "ok" for o in outcomes), [o.error_message for o in outcomes][:3]
    report: dict[str, Any] = {
        "task": options.task, "windows": len(spans), "device": options.device,
        "max_length": runner.max_length, "repeats": options.repeats,
    }  # fmt: skip
    for case, values in runs.items():
        real, padded = sum(v[1] for v in values), sum(v[2] for v in values)
        report[case] = {
            "model_ms_median": round(statistics.median(v[0] for v in values), 3),
            "padding_efficiency": round(real / padded, 4) if padded else None,
            "real_tokens_per_run": real // len(values),
        }
    doc, sep = report["document"], report["separate"]
    report["model_ms_ratio"] = round(doc["model_ms_median"] / sep["model_ms_median"], 3)
    report["padding_ratio"] = round(sep["padding_efficiency"] / doc["padding_efficiency"], 3)
    report["within_1_1x"] = report["model_ms_ratio"] <= 1.1 and report["padding_ratio"] <= 1.1
    return report


def main(options: WindowsBenchOptions) -> dict[str, Any]:
    """:func:`run_windows_bench` in a fresh event loop."""
    return asyncio.run(run_windows_bench(options))
