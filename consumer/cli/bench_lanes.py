"""``kbatch bench lanes``: live latency alone and beside a backfill job
(:mod:`consumer.bench.lanes`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich_click import RichCommand

from consumer.batching.config import BatchPolicyConfig
from consumer.cli.bench_inputs import (
    bench_model,
    bootstrap_option,
    progress_printer,
    sample_texts,
    texts_option,
)
from consumer.cli.extras import require_serve_extra
from consumer.cli.options import (
    CommaList,
    OutputDir,
    group_option,
    json_option,
    option,
    seed_option,
)
from consumer.model.settings import ModelSettings

__all__ = ["lanes_command"]


@click.command("lanes", cls=RichCommand)
@click.option(
    "--model",
    "model_name",
    default=None,
    help="Model directory (default: the packaged all-MiniLM-L6-v2) or a simulated device "
    "sim:FIXED_MS,US_PER_TOKEN[,DIM].",
)
@texts_option
@option(
    "--n",
    type=click.IntRange(min=1),
    default=3000,
    help="Texts of the drain (and the pool the live requests and the job draw from).",
)
@option(
    "--fractions",
    type=CommaList(float),
    default="0.3,0.6",
    help="Live rates as fractions of the measured drain rate.",
)
@option("--latency-s", type=float, default=20.0, help="Each phase.")
@option("--latency-warmup-s", type=float, default=3.0, help="Warm-up.")
@option(
    "--max-latency-rate",
    type=float,
    default=600.0,
    help="Cap of the live rate (the load generator shares the machine).",
)
@group_option(ModelSettings, "torch_threads", default=2, aliases=("--threads",))
@group_option(BatchPolicyConfig, "max_wait_ms")
@bootstrap_option
@seed_option("Sampling and arrivals seed.")
@option(
    "--log-dir",
    type=OutputDir(),
    help="Keep serve's log here (default: a temporary directory).",
)
@json_option
def lanes_command(
    model_name: str | None,
    texts_file: Path | None,
    n: int,
    fractions: list[float],
    max_latency_rate: float,
    torch_threads: int,
    as_json: bool,
    **opts: Any,
) -> None:
    """Live p50/p99 at --fractions of the drain rate, alone and with a backfill job running in
    the same serve, and the job's throughput, each compared with its bound: p99 with the job
    at most 1.25 × p99 alone + one batch's time; the job's rate at least 0.8 × (drain rate −
    live rate)."""
    require_serve_extra()
    import asyncio
    import json

    from consumer.bench.e2e import E2EBenchOptions, E2EError
    from consumer.bench.lanes import LanesBenchOptions, run_lanes_bench

    if not fractions or any(not 0 < f < 1 for f in fractions):
        raise click.BadParameter("fractions in (0, 1), e.g. 0.3,0.6", param_hint="--fractions")
    model, sim = bench_model(model_name)
    e2e = E2EBenchOptions(
        model_dir=model,
        texts=sample_texts(texts_file, n, opts["seed"]),
        serve_model=model_name if sim else None,
        max_latency_rate_per_s=max_latency_rate,
        threads=torch_threads,
        **opts,
    )
    say = progress_printer("bench lanes")
    try:
        report = asyncio.run(run_lanes_bench(LanesBenchOptions(e2e, tuple(fractions)), say))
    except E2EError as err:
        raise click.ClickException(str(err)) from err
    if as_json:
        click.echo(json.dumps(report))
        return
    _print(report)


def _print(report: dict[str, object]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"bench lanes (drain {report['drain_seq_per_s']} seq/s)")
    for name in ("load", "rate/s", "p50 alone", "p99 alone", "p50 job", "p99 job",
                 "p99 goal", "job seq/s", "job goal"):  # fmt: skip
        table.add_column(name, justify="right")
    cases = report["cases"]
    assert isinstance(cases, dict)
    for fraction, c in cases.items():
        table.add_row(
            fraction,
            str(c["rate_per_s"]),
            str(c["alone"]["p50_ms"]),
            str(c["alone"]["p99_ms"]),
            str(c["with_job"]["p50_ms"]),
            str(c["with_job"]["p99_ms"]),
            f"{c['p99_goal_ms']} {'ok' if c['p99_ok'] else 'MISSED'}",
            str(c["job_seq_per_s"]),
            f"{c['job_goal_seq_per_s']} {'ok' if c['job_ok'] else 'MISSED'}",
        )
    Console().print(table)
