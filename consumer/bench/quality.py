"""``kbatch bench quality``: how far a backend/precision answers from torch fp32 (and, for embed
models, from sentence-transformers' own ``encode``) on real texts, and its speed beside it.

The same texts (a seeded VADER sample) are scored by torch fp32 (the reference) and by the
candidate (``--backend``, ``--quantize``; on a GPU ``--device cuda --dtype bfloat16``) in the
same **mixed-length batches**: consecutive texts of the sample, ``batch_size`` at a time, each
padded to its longest — the case a wrong export gets wrong. Figures
(:class:`consumer.model.quality.QualityReport`): embed — min/mean cosine; classify — label
agreement and max ``|Δscore|``. ``passes_gate`` applies the start-up gate's thresholds (0.999
for fp32 paths, 0.99 for int8/bf16/fp16) to every comparison.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from consumer.cpu.plan import budget_cores_whole
from consumer.model.batch_runner import ModelRunner
from consumer.model.loader import load_runner
from consumer.model.quality import compare_results, min_cosine_required, score_texts
from consumer.model.tokenize import HFTokenizer
from consumer.model.torch_backend import configure_threads

__all__ = ["QualityBenchOptions", "load_candidate", "run_quality_bench"]


class CandidateOptions(Protocol):
    """The flags that choose a benchmark's model path (``--backend``, ``--quantize``,
    ``--dtype`` → ``autocast``, ``--device``): read-only, as frozen dataclasses have them."""

    @property
    def model_dir(self) -> Path: ...
    @property
    def device(self) -> str | None: ...
    @property
    def autocast(self) -> str | None: ...
    @property
    def backend(self) -> str: ...
    @property
    def quantize(self) -> str: ...


def load_candidate(opts: CandidateOptions, threads: int) -> ModelRunner:
    """The runner of ``opts``' backend and precision (ONNX Runtime: ``threads`` intra-op).

    Raises:
        ValueError: a combination :func:`consumer.model.settings.check_backend` refuses.
    """
    return load_runner(
        opts.model_dir,
        device=opts.device,
        autocast=opts.autocast,  # type: ignore[arg-type]  # the CLI's choices
        backend=opts.backend,  # type: ignore[arg-type]
        quantize=opts.quantize,  # type: ignore[arg-type]
        threads=threads,
    )


@dataclass(frozen=True)
class QualityBenchOptions:
    """Options of ``kbatch bench quality`` (see the CLI for their help)."""

    model_dir: Path
    texts: Sequence[str]
    backend: str = "onnx"
    quantize: str = "none"
    batch_size: int = 16
    threads: int | None = None
    sentence_transformers: bool = True
    device: str = "cpu"
    autocast: str | None = None


def run_quality_bench(opts: QualityBenchOptions) -> dict[str, Any]:
    """Run the comparison; returns the JSON-able report (see the module docstring).

    Raises ``ValueError`` for no texts or an impossible backend/quantize pair.
    """
    if not opts.texts:
        raise ValueError("no texts")
    threads = configure_threads(opts.threads or budget_cores_whole())
    texts = list(opts.texts)
    reference = load_runner(opts.model_dir, device=opts.device, trace=False)  # eager fp32
    candidate = load_candidate(opts, threads)
    tokenizer = HFTokenizer(opts.model_dir, max_length=reference.max_length)
    timed: dict[str, float] = {}
    results = {}
    for name, runner in (("torch_fp32", reference), ("candidate", candidate)):
        score_texts(runner, tokenizer, texts[: opts.batch_size], opts.batch_size)  # warm-up
        t0 = time.perf_counter()
        results[name] = score_texts(runner, tokenizer, texts, opts.batch_size)
        timed[name] = time.perf_counter() - t0
    need = min_cosine_required(opts.quantize != "none" or opts.autocast is not None)
    report: dict[str, Any] = {
        "vs_torch_fp32": compare_results(results["torch_fp32"], results["candidate"]).as_dict()
    }
    if reference.task == "embed" and opts.sentence_transformers:
        from consumer.model.baselines import sentence_transformers_encode

        st = [{"embedding": row.tolist()} for row in sentence_transformers_encode(
            opts.model_dir, texts, opts.batch_size)]  # fmt: skip
        report["vs_sentence_transformers"] = compare_results(st, results["candidate"]).as_dict()
        report["torch_fp32_vs_sentence_transformers"] = compare_results(
            st, results["torch_fp32"]
        ).as_dict()
    checked = [v for k, v in report.items() if k.startswith("vs_")]
    report["min_cosine_required"] = need
    report["passes_gate"] = all(
        r["min_cosine"] >= need and r.get("label_agreement") in (None, 1.0) for r in checked
    )
    report["candidate_seq_per_s"] = round(len(texts) / timed["candidate"], 1)
    report["torch_fp32_seq_per_s"] = round(len(texts) / timed["torch_fp32"], 1)
    report["ratio_candidate_vs_torch_fp32"] = round(timed["torch_fp32"] / timed["candidate"], 2)
    report["setup"] = {
        "model": str(opts.model_dir),
        "task": reference.task,
        "backend": opts.backend,
        "quantize": opts.quantize,
        "device": opts.device,
        "autocast": opts.autocast,
        "texts": len(texts),
        "batch_size": opts.batch_size,
        "threads": threads,
        "loadavg_1_5_15_end": [round(x, 2) for x in os.getloadavg()],
    }
    return report
