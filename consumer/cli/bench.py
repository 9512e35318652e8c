"""``kbatch bench …``: benchmarks as commands with JSON output (never timed unit tests).

The CLI is plain click (Typer was dropped: its vendored click cannot host the generated
``serve`` options). Add a benchmark with ``@bench_group.command("name")``.

Model and batching flags come from the settings groups ``kbatch serve`` takes them from
(:class:`consumer.model.settings.ModelSettings`,
:class:`consumer.batching.config.BatchPolicyConfig`, through
:func:`consumer.cli.options.group_option`): the same names, types, bounds and descriptions,
with the benchmarks' own defaults; ``--threads`` still works for ``--torch-threads``.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich_click import RichGroup

from consumer.batching.config import BatchPolicyConfig
from consumer.bench.e2e_report import VARIANTS
from consumer.cli.bench_inputs import (
    bench_model,
    bootstrap_option,
    model_option,
    progress_printer,
    sample_texts,
    texts_option,
)
from consumer.cli.extras import require_serve_extra
from consumer.cli.options import (
    CommaList,
    OutputDir,
    flag,
    group_option,
    json_option,
    option,
    seed_option,
)
from consumer.model.settings import DTYPE_AUTOCAST, ModelSettings, check_backend

backend_option = group_option(ModelSettings, "backend")
quantize_option = group_option(ModelSettings, "quantize")
dtype_option = group_option(ModelSettings, "dtype")


def _threads_option(default: int | None) -> Callable[[Any], Any]:
    return group_option(ModelSettings, "torch_threads", default=default, aliases=("--threads",))


class ThreadsParam(click.ParamType):  # type: ignore[type-arg]  # generic only from click 8.2
    """``--threads`` of ``kbatch bench e2e``: a positive int, or ``auto`` (None: each process
    chooses, as ``kbatch serve`` does from its CPU budget)."""

    name = "N|auto"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value is None or isinstance(value, int):
            return value
        if str(value).strip().lower() == "auto":
            return None
        try:
            n = int(value)
        except ValueError:
            self.fail(f"{value!r} is neither a positive integer nor 'auto'", param, ctx)
        if n < 1:
            self.fail(f"{n} is not >= 1 (or 'auto')", param, ctx)
        return n


def _check_backend(backend: str, quantize: str, device: str, dtype: str) -> None:
    """The model package's backend rules, as a usage error (exit 2)."""
    try:
        check_backend(backend=backend, quantize=quantize, device=device, dtype=dtype)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--backend/--quantize/--dtype") from err


@click.group("bench", cls=RichGroup, help="Benchmarks (JSON output with --json).")
def bench_group() -> None:
    """Benchmarks as commands."""


@bench_group.command("engine")
@model_option
@texts_option
@option("--n", type=click.IntRange(min=1), default=1500, help="Texts in the backlog phase.")
@option(
    "--seconds",
    type=click.FloatRange(min=0.1),
    default=10.0,
    help="Length of the paced (latency) phase.",
)
@option(
    "--rate",
    type=click.FloatRange(min=0.1),
    help="Paced arrivals per second (default: --rate-fraction × the single strategy's "
    "backlog throughput).",
)
@option(
    "--rate-fraction",
    type=click.FloatRange(min=0.01, max=4.0),
    default=0.5,
    help="Paced rate as a fraction of the single strategy's backlog throughput (without "
    "single: half this fraction of the bucketed one).",
)
@group_option(BatchPolicyConfig, "max_wait_ms", note="The fixed strategy's too.")
@group_option(BatchPolicyConfig, "max_batch_tokens", default=None, note="Bucketed.")
@group_option(BatchPolicyConfig, "max_batch_size", note="Bucketed.")
@option(
    "--fixed-batch-size",
    type=click.IntRange(min=1),
    default=32,
    help="The fixed strategy's batch size.",
)
@group_option(ModelSettings, "device")
@dtype_option
@_threads_option(None)
@option(
    "--rounds",
    type=click.IntRange(min=1),
    default=1,
    help="Backlog slices, interleaved across the strategies (3 on a shared, noisy machine).",
)
@group_option(
    BatchPolicyConfig, "batch_overhead_tokens", default=None, note="Bucketed; default: serve's."
)
@option(
    "--strategies",
    type=CommaList(str),
    default="single,fixed,bucketed,plain_loop,sorted_offline,runner_loop",
    help="Comma-separated subset of the engine strategies single,fixed,bucketed (bucketed is "
    "always run) and the baselines plain_loop,sorted_offline,runner_loop.",
)
@backend_option
@quantize_option
@seed_option("Sampling seed.")
@json_option
def engine(
    model: Path | None,
    texts_file: Path | None,
    rate: float | None,
    device: str,
    dtype: str,
    torch_threads: int | None,
    strategies: list[str],
    as_json: bool,
    **opts: Any,
) -> None:
    """Single vs fixed vs bucketed batching on real texts (and the plain-transformers
    baselines): throughput, padding, latency."""
    require_serve_extra()
    import asyncio
    import json

    from consumer.bench.engine_bench import EngineBenchOptions, run_engine_bench
    from consumer.model.loader import packaged_model_dir

    _check_backend(opts["backend"], opts["quantize"], device, dtype)
    bench_opts = EngineBenchOptions(
        model_dir=model or packaged_model_dir(),
        texts=sample_texts(texts_file, opts["n"], opts["seed"], distinct=True),
        rate_per_s=rate,
        device=None if device == "auto" else device,
        autocast=DTYPE_AUTOCAST[dtype],
        threads=torch_threads,
        strategies=tuple(dict.fromkeys(("bucketed", *strategies))),
        **opts,
    )
    try:
        report = asyncio.run(run_engine_bench(bench_opts))
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--strategies") from exc
    if as_json:
        click.echo(json.dumps(report))
        return
    _print_engine_table(report)


def _print_engine_table(report: dict[str, Any]) -> None:
    from rich.table import Table

    from producer_tools.report import report_console

    table = Table(title="kbatch bench engine")
    cols = ("seq_per_s", "tokens_per_s", "padding_efficiency", "p50_ms", "p99_ms")
    table.add_column("strategy")
    for c in cols:
        table.add_column(c, justify="right")
    names = ("single", "fixed", "bucketed", "plain_loop", "sorted_offline", "runner_loop")
    for name in names:
        row = report.get(name)
        if isinstance(row, dict):
            table.add_row(name, *(str(row.get(c, "–")) for c in cols))
    console = report_console()
    console.print(table)
    for key, value in report.items():
        if key not in (*names, "setup"):
            console.print(f"{key}: {value}")
    console.print(f"setup: {report.get('setup')}")


@bench_group.command("quality")
@model_option
@texts_option
@backend_option
@quantize_option
@option("--n", type=click.IntRange(min=1), default=400, help="Texts compared.")
@option(
    "--batch-size", type=click.IntRange(min=1), default=16, help="Texts per mixed-length batch."
)
@_threads_option(None)
@group_option(ModelSettings, "device", default="cpu")
@dtype_option
@flag(
    "--no-sentence-transformers",
    help="Skip the comparison with sentence-transformers' encode (embed models).",
)
@seed_option("Sampling seed.")
@json_option
def quality(
    model: Path | None,
    texts_file: Path | None,
    n: int,
    torch_threads: int | None,
    dtype: str,
    no_sentence_transformers: bool,
    seed: int,
    as_json: bool,
    **opts: Any,
) -> None:
    """A backend/precision against torch fp32 (and sentence-transformers) on real texts in
    mixed-length batches: min/mean cosine, label agreement, max |Δscore|; exit 1 when it
    fails the start-up gate's thresholds."""
    require_serve_extra()
    import json

    from consumer.bench.quality import QualityBenchOptions, run_quality_bench
    from consumer.model.loader import packaged_model_dir

    _check_backend(opts["backend"], opts["quantize"], opts["device"], dtype)
    report = run_quality_bench(
        QualityBenchOptions(
            model_dir=model or packaged_model_dir(),
            texts=sample_texts(texts_file, n, seed, distinct=True),
            threads=torch_threads,
            sentence_transformers=not no_sentence_transformers,
            autocast=DTYPE_AUTOCAST[dtype],
            **opts,
        )
    )
    if as_json:
        click.echo(json.dumps(report))
    else:
        from producer_tools.report import report_console

        console = report_console()
        for key, value in report.items():
            console.print(f"{key}: {value}")
    if not report["passes_gate"]:
        raise SystemExit(1)


@bench_group.command("encoding")
@option("--dims", type=CommaList(int), default="384,1024", help="Embedding dimensions to measure.")
@option("--n", type=click.IntRange(min=1), default=2000, help="Replies per round.")
@option("--rounds", type=click.IntRange(min=1), default=5, help="Best of this many.")
@flag("--json", "as_json", help="Print the report as one JSON object.")
def encoding(dims: list[int], n: int, rounds: int, as_json: bool) -> None:
    """Bytes and µs per reply of each encoding_format (float, f32le, f16le, binary) through
    the serving path's reply builder and codec, msgpack and JSON."""
    import json

    from consumer.bench.encoding_bench import run_encoding_bench

    report = run_encoding_bench(tuple(dims), n=n, rounds=rounds)
    if as_json:
        click.echo(json.dumps(report))
        return
    for encoding_name in ("msgpack", "json"):
        for dim, rows in report[encoding_name].items():
            for fmt, row in rows.items():
                click.echo(
                    f"{encoding_name:8} dim {dim:>5} {fmt:7} {row['bytes_per_reply']:>7} B "
                    f"{row['us_per_reply']:>8.2f} µs {row['bytes_per_s'] / 1e6:>8.1f} MB/s"
                )


@bench_group.command("e2e")
@option(
    "--model",
    "model_name",
    help="Model directory (default: the packaged all-MiniLM-L6-v2) or a simulated device "
    "sim:FIXED_MS,US_PER_TOKEN[,DIM] (kbatch serves it; default variants then "
    "kbatch,passthrough,raw_loop,raw_tokenize,raw_tokenize_confluent).",
)
@texts_option
@option(
    "--n",
    type=click.IntRange(min=1),
    default=3000,
    help="Requests pre-filled for each variant's throughput drain (the same N texts for all).",
)
@option(
    "--latency-s",
    type=click.FloatRange(min=0.1),
    default=10.0,
    help="Measured length of each variant's open-loop latency phase.",
)
@option(
    "--latency-warmup-s",
    type=click.FloatRange(min=0.0),
    default=2.0,
    help="Warm-up before each latency phase (sent, not measured; Kafka variants).",
)
@option(
    "--load-fraction",
    type=click.FloatRange(min=0.0, max=1.0, min_open=True),
    default=0.7,
    help="Latency phase rate as a fraction of the variant's measured throughput.",
)
@click.option(
    "--latency-fractions",
    type=CommaList(float),
    default="",
    help="The latency-throughput frontier: one more open-loop phase per fraction of each "
    "variant's drain rate, e.g. 0.3,0.5,0.7,0.9 (plotted to bench_e2e_frontier.png).",
)
@click.option(
    "--latency-rates",
    type=CommaList(float),
    default="",
    help="Frontier phases at these absolute rates (req/s), the same for every variant, e.g. "
    "up to naive's drain rate.",
)
@option(
    "--max-latency-rate",
    type=click.FloatRange(min=0.0, min_open=True),
    default=600.0,
    help="Cap of the latency phase rate (req/s): the load generator shares the cores.",
)
@option(
    "--torch-threads",
    "--threads",
    "torch_threads",
    type=ThreadsParam(),
    default="auto",
    help="Torch intra-op threads of every process, or 'auto': each process's own default "
    "(kbatch serve's CPU budget plan, docs/CPU.md; torch's default for naive).",
)
@click.option(
    "--serve-prefix",
    default="",
    help="Run each kbatch serve under this command, e.g. 'scripts/cgroup_run.sh kbatch-1cpu 1 "
    "--' (a 1-CPU cgroup) or 'taskset -c 1'; the broker, the load client and the baselines "
    "do not.",
)
@group_option(BatchPolicyConfig, "max_wait_ms", note="Of kbatch, passthrough and engine.")
@group_option(BatchPolicyConfig, "target_p99_ms", note="Of the kbatch variants and the engine.")
@backend_option
@option(
    "--variants",
    type=CommaList(str),
    default=",".join(VARIANTS),
    help="Comma-separated subset of the variants to run.",
)
@option(
    "--replicas",
    type=CommaList(int),
    default="1",
    help="Replica counts of the kbatch and passthrough variants (kbatch serve --replicas N), "
    "e.g. 1,2: each runs once per count, reported as <variant>_x<N> with "
    "ratio_<variant>_x<N>_vs_x1.",
)
@bootstrap_option
@seed_option("Sampling and arrivals seed.")
@option(
    "--plots-dir",
    type=OutputDir(),
    help="Write bench_e2e.png (and bench_e2e_frontier.png with a frontier) here; default: no plot.",
)
@flag("--no-plots", help="Write no plot, even with --plots-dir.")
@option(
    "--log-dir",
    type=OutputDir(),
    help="Keep the consumer processes' logs here (default: a temporary directory).",
)
@json_option
def e2e(
    model_name: str | None,
    texts_file: Path | None,
    n: int,
    latency_fractions: list[float],
    latency_rates: list[float],
    max_latency_rate: float,
    torch_threads: int | None,
    serve_prefix: str,
    variants: list[str],
    replicas: list[int],
    plots_dir: Path | None,
    no_plots: bool,
    as_json: bool,
    **opts: Any,
) -> None:
    """naive vs kbatch (and its eos, onnx, bf16 forms) vs engine vs passthrough vs the raw
    loops (raw_loop; raw_tokenize: consume, tokenize, reply on aiokafka;
    raw_tokenize_confluent: the same on confluent-kafka), through a real broker.

    Throughput drains N pre-filled requests per variant; latency comes from an open-loop run
    at --load-fraction of each variant's throughput; each --latency-fractions/--latency-rates
    point also reports the consumer's cpu_ms_per_request (its processes' CPU over the phase
    per request sent), and cpu_ratio_* compares kbatch's with each raw tokenize loop's at
    each --latency-rates point (docs/CPU.md).
    """
    require_serve_extra()
    import asyncio
    import json

    from consumer.bench.e2e import E2EBenchOptions, E2EError, run_e2e_bench
    from consumer.bench.e2e_report import plot_e2e, plot_frontier, print_e2e_table

    _check_e2e_lists(variants, latency_fractions, latency_rates, replicas)
    model, sim = bench_model(model_name)
    if sim:
        variants = _simulated_variants(variants)
    bench_opts = E2EBenchOptions(
        model_dir=model,
        texts=sample_texts(texts_file, n, opts["seed"]),
        serve_model=model_name if sim else None,
        replicas=tuple(dict.fromkeys(replicas)),
        latency_fractions=tuple(latency_fractions),
        latency_rates=tuple(latency_rates),
        max_latency_rate_per_s=max_latency_rate,
        threads=torch_threads,
        serve_prefix=tuple(shlex.split(serve_prefix)),
        variants=tuple(variants),
        **opts,
    )
    try:
        report = asyncio.run(run_e2e_bench(bench_opts, progress_printer("bench e2e")))
    except E2EError as err:
        raise click.ClickException(str(err)) from err
    if plots_dir is not None and not no_plots:
        report["plots"] = [str(plot_e2e(report, plots_dir))]
        frontier_png = plot_frontier(report, plots_dir)
        if frontier_png is not None:
            report["plots"].append(str(frontier_png))
    if as_json:
        click.echo(json.dumps(report))
        return
    from producer_tools.report import report_console

    print_e2e_table(report, report_console())


def _check_e2e_lists(
    variants: list[str], fractions: list[float], rates: list[float], replicas: list[int]
) -> None:
    """The comma-separated flags of ``kbatch bench e2e``, as usage errors (exit 2)."""
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown or not variants:
        raise click.BadParameter(f"known variants: {','.join(VARIANTS)}", param_hint="--variants")
    if any(not 0 < f <= 1 for f in fractions):
        raise click.BadParameter("fractions in (0, 1]", param_hint="--latency-fractions")
    if any(not r > 0 for r in rates):
        raise click.BadParameter("rates > 0", param_hint="--latency-rates")
    if not replicas or min(replicas) < 1:
        raise click.BadParameter("replica counts >= 1, e.g. 1,2", param_hint="--replicas")


def _simulated_variants(variants: list[str]) -> list[str]:
    """The variants a simulated device (``--model sim:…``) runs: without ``--variants``, those
    that need no model directory.

    Raises:
        click.BadParameter: ``--variants`` names one that needs a model directory.
    """
    given = click.get_current_context().get_parameter_source("variants")
    if given is click.core.ParameterSource.DEFAULT:
        return [
            "kbatch",
            "kbatch_confluent",
            "passthrough",
            "passthrough_confluent",
            "raw_loop",
            "raw_tokenize",
            "raw_tokenize_confluent",
        ]
    if {"naive", "engine", "kbatch_onnx", "kbatch_bf16"} & set(variants):
        raise click.BadParameter(
            "naive, engine, kbatch_onnx and kbatch_bf16 need a model directory, not a "
            "simulated device",
            param_hint="--variants",
        )
    return variants


from consumer.cli.bench_lanes import lanes_command  # noqa: E402 (a command of its own module)

bench_group.add_command(lanes_command)
from consumer.cli.bench_windows import windows_command  # noqa: E402 (a command of its own module)

bench_group.add_command(windows_command)
